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

step_train() {
  timeout "${TRAIN_S:-120}" "$PY" train.py --dataset=fashion_mnist --manual_dir="$FM" --train_examples=9600 --epochs=3 \
    --batch_size=128 --model_dir=/tmp/gpu_train > "$OUT/train.txt" 2>&1
  log "train.py: exit $?"
  cp /tmp/gpu_train/results.json "$OUT/train_results.json" 2> /dev/null
}

step_fit() {
  timeout "${FIT_S:-90}" "$PY" benchmarks/input_pipeline.py --child=numpy --manual_dir="$FM" --steps=60 --batch=128 \
    > "$OUT/fit_speed.json" 2>> "$OUT/session.txt"
  log "fit speed: exit $? $(tail -1 "$OUT/fit_speed.json")"
}

step_edge() {
  timeout "${SWEEP_S:-210}" "$PY" -m keras_skipinit.sweep --preset=stability_edge_deep --out=docs/stability_edge/depth1000 \
    --depths="${DEPTHS:-1000}" --methods="${METHODS:-batchnorm,sqrt2,fixup}" --loop_blocks --manual_dir="$FM" > "$OUT/sweep.txt" 2>&1
  log "sweep: exit $? (124/143: stopped by its time limit, as planned)"
  cp docs/stability_edge/depth1000/runs.jsonl "$OUT/depth1000_runs.jsonl" 2> /dev/null
}

step_table1() {
  T1=docs/skipinit_table1/depth1000
  awk '!seen[$0]++' "$T1/runs.jsonl" docs/stability_edge/depth1000/runs.jsonl > "$T1/runs.merged" && mv "$T1/runs.merged" "$T1/runs.jsonl"
  timeout "${TABLE1_S:-120}" "$PY" -m keras_skipinit.sweep --preset=skipinit_table1_deep --out="$T1" \
    --depths="${DEPTHS:-1000}" --methods=batchnorm,skipinit --loop_blocks --manual_dir="$FM" > "$OUT/table1.txt" 2>&1
  log "table 1 at depth 1000: exit $? (124/143: stopped by its time limit, as planned)"
  cp "$T1/runs.jsonl" "$OUT/table1_depth1000_runs.jsonl" 2> /dev/null
}

step_mechanism() {  # issue 63: every sweep in the background at once, one folder each, then their runs
  local m r pids=() dir=/tmp/mechanism
  rm -rf "$dir" && mkdir -p "$dir"
  export XLA_PYTHON_CLIENT_PREALLOCATE=false  # a dozen processes share the GPU's memory
  for m in ${MECH_METHODS:-bn_sqrt2 bn_block_end}; do
    for r in ${MECH_LOG2_LRS:--6 -4 -2 0}; do
      timeout -k 30 "${MECH_S:-420}" "$PY" -m keras_skipinit.sweep --preset=skipinit_table1 --depths="${MECH_DEEP:-1000}" \
        --methods="$m" --log2_lrs="$r" --no-extend_grid --seeds=2 --best_k=2 --loop_blocks --checkpoint_steps=1000 \
        --manual_dir="$FM" --out="$dir/deep_${m}_$r" > "$dir/deep_${m}_$r.txt" 2>&1 & pids+=($!)
    done
  done
  # bn_head_only overflows float32 from block ~310 at depth 1000 (docs/mechanism): one rate shows it
  timeout -k 30 "${MECH_S:-420}" "$PY" -m keras_skipinit.sweep --preset=skipinit_table1 --depths="${MECH_DEEP:-1000}" \
    --methods=bn_head_only --log2_lrs=-6 --no-extend_grid --seeds=2 --best_k=2 --loop_blocks --checkpoint_steps=1000 \
    --manual_dir="$FM" --out="$dir/deep_bn_head_only_-6" > "$dir/deep_bn_head_only_-6.txt" 2>&1 & pids+=($!)
  # depth 100: each variant's grid from around its depth-16 optimum (docs/mechanism/table1), extended
  for m in bn_sqrt2:-5,-4,-3 bn_block_end:-4,-3,-2 bn_head_only:-7,-6,-5; do
    timeout -k 30 "${MECH_S:-420}" "$PY" -m keras_skipinit.sweep --preset=skipinit_table1 --depths="${MECH_MID:-100}" \
      --methods="${m%%:*}" --log2_lrs="${m#*:}" --loop_blocks --checkpoint_steps=1000 --manual_dir="$FM" \
      --out="$dir/mid_${m%%:*}" > "$dir/mid_${m%%:*}.txt" 2>&1 & pids+=($!)
  done
  while sleep 30 && kill -0 "${pids[@]}" 2> /dev/null; do  # progress, and the runs so far if the call is cut
    cat "$dir"/deep_*/runs.jsonl > "$OUT/mechanism_depth1000_runs.jsonl" 2> /dev/null
    log "mechanism: $(cat "$dir"/*/runs.jsonl 2> /dev/null | wc -l) runs recorded"
  done
  wait "${pids[@]}"
  cat "$dir"/deep_*/runs.jsonl > "$OUT/mechanism_depth1000_runs.jsonl" 2> /dev/null
  cat "$dir"/mid_*/runs.jsonl > "$OUT/mechanism_depth100_runs.jsonl" 2> /dev/null
  tail -n 4 "$dir"/*.txt > "$OUT/mechanism.txt" 2>&1
  log "mechanism: $(cat "$dir"/*/runs.jsonl 2> /dev/null | wc -l) runs recorded"
}

for step in ${STEPS:-train fit edge table1}; do
  "step_$step"
done
log "done"
