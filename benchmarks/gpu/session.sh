#!/usr/bin/env bash
# One lent GPU session (JAX + CUDA, Python 3.12, no TensorFlow, no network), about 9.5 minutes:
#   device run: command "bash benchmarks/gpu/session.sh", carry [".gpu"], timeout_s 600
# after `bash benchmarks/gpu/prepare.sh` here. Writes into $OUT (what comes back):
#   session.txt     the machine, versions, each step's exit status and time
#   train.txt, train_results.json   (issue 44.5) train.py end to end on Fashion-MNIST (9,600 images, 3 epochs)
#   fit_speed.json  (issue 44.5) WRN-16-1 training img/s through fit, fed by numpy_data, batch 128
#   sweep.txt, depth1000_runs.jsonl (issue 42) stability-edge cells at depth 1000 (looped blocks, float32
#                   convolutions at full precision), appended to docs/stability_edge/depth1000/runs.jsonl as
#                   committed; SWEEP_S seconds, resumed by the sweep itself next time
#   table1.txt, table1_depth1000_runs.jsonl (issue 42.4) Table 1's depth-1000 grid extensions (BatchNorm,
#                   SkipInit), after the edge runs are merged into docs/skipinit_table1/depth1000/runs.jsonl
#                   (the same settings: they count there); TABLE1_S seconds
# Stop the CPU sweeps of those folders first (so that no cell runs twice); afterwards append each returned
# runs.jsonl's new lines to its folder here and resume them.
# Dry run on a CPU (a venv of ".[jax]", no install): SKIP_INSTALL=1 PY=python SWEEP_S=60 bash benchmarks/gpu/session.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpu_session}"
mkdir -p "$OUT"
PY="${PY:-python3}"
START=$SECONDS
log() { echo "[$((SECONDS - START)) s] $*" | tee -a "$OUT/session.txt"; }

if [ -z "${SKIP_INSTALL:-}" ]; then
  "$PY" -m pip install --quiet --no-index --find-links .gpu/wheels keras absl-py tensorboard h5py matplotlib \
    >> "$OUT/session.txt" 2>&1 || { log "pip install from .gpu/wheels failed"; exit 1; }
fi
export PYTHONPATH="$PWD" KERAS_BACKEND=jax JAX_DEFAULT_MATMUL_PRECISION=highest
FM="$PWD/.gpu/fashion-mnist"
"$PY" -c "import jax, keras, keras_skipinit, keras_skipinit.training, keras_skipinit.sweep; print('jax', jax.__version__, jax.devices(), 'keras', keras.__version__)" \
  >> "$OUT/session.txt" 2>&1 || { log "imports failed"; exit 1; }
command -v nvidia-smi > /dev/null && nvidia-smi -L >> "$OUT/session.txt" 2>&1
log "setup done"

timeout "${TRAIN_S:-120}" "$PY" train.py --dataset=fashion_mnist --manual_dir="$FM" --train_examples=9600 --epochs=3 \
  --batch_size=128 --model_dir=/tmp/gpu_train > "$OUT/train.txt" 2>&1
log "train.py: exit $?"
cp /tmp/gpu_train/results.json "$OUT/train_results.json" 2> /dev/null

timeout "${FIT_S:-90}" "$PY" benchmarks/input_pipeline.py --child=numpy --manual_dir="$FM" --steps=60 --batch=128 \
  > "$OUT/fit_speed.json" 2>> "$OUT/session.txt"
log "fit speed: exit $? $(tail -1 "$OUT/fit_speed.json")"

timeout "${SWEEP_S:-210}" "$PY" -m keras_skipinit.sweep --preset=stability_edge_deep --out=docs/stability_edge/depth1000 \
  --depths="${DEPTHS:-1000}" --methods="${METHODS:-batchnorm,sqrt2,fixup}" --loop_blocks --manual_dir="$FM" > "$OUT/sweep.txt" 2>&1
log "sweep: exit $? (124/143: stopped by its time limit, as planned)"
cp docs/stability_edge/depth1000/runs.jsonl "$OUT/depth1000_runs.jsonl" 2> /dev/null

T1=docs/skipinit_table1/depth1000
awk '!seen[$0]++' "$T1/runs.jsonl" docs/stability_edge/depth1000/runs.jsonl > "$T1/runs.merged" && mv "$T1/runs.merged" "$T1/runs.jsonl"
timeout "${TABLE1_S:-120}" "$PY" -m keras_skipinit.sweep --preset=skipinit_table1_deep --out="$T1" \
  --depths="${DEPTHS:-1000}" --methods=batchnorm,skipinit --loop_blocks --manual_dir="$FM" > "$OUT/table1.txt" 2>&1
log "table 1 at depth 1000: exit $? (124/143: stopped by its time limit, as planned)"
cp "$T1/runs.jsonl" "$OUT/table1_depth1000_runs.jsonl" 2> /dev/null
log "done"
