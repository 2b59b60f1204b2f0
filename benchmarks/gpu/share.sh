#!/usr/bin/env bash
# What N runs at once cost on one GPU: WRN-DEPTH-1 (FORM=looped or unrolled blocks; SkipInit), batch 64, 2 epochs of STEPS
# each, evaluated on 640 held-out images, as N train.py processes at once for each N in NS; prints each
# process's epoch times (Keras' verbose=2 line: the second epoch has no compilation). For a lent GPU:
#   device run: command "SKIP_INSTALL= bash benchmarks/gpu/share.sh", carry [".gpu"]
# (FORM=unrolled: no while loop, a far longer compilation; not measured on a GPU yet), or on a CPU: SKIP_INSTALL=1 PY=python DEPTH=10 NS="1 2" bash benchmarks/gpu/share.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpu_share}"
mkdir -p "$OUT"
PY="${PY:-python3}"
if [ -z "${SKIP_INSTALL:-}" ]; then
  "$PY" -m pip install --quiet --no-index --find-links .gpu/wheels keras absl-py h5py matplotlib protobuf > /dev/null 2>&1 \
    && "$PY" -m pip install --quiet --no-index --find-links .gpu/wheels --no-deps tensorboard > /dev/null 2>&1
fi
export PYTHONPATH="$PWD" KERAS_BACKEND=jax JAX_DEFAULT_MATMUL_PRECISION=highest XLA_PYTHON_CLIENT_PREALLOCATE=false
START=$SECONDS
for n in ${NS:-1 6}; do
  pids=()
  for i in $(seq "$n"); do
    "$PY" train.py --model=wrn --depth="${DEPTH:-1000}" --width=1 --normalization=skipinit "--$([ "${FORM:-looped}" = looped ] || echo no)loop_blocks" \
      --dataset=fashion_mnist --manual_dir="$PWD/.gpu/fashion-mnist" --train_examples=9600 --validation_examples=640 \
      --epochs=2 --steps_per_epoch="${STEPS:-20}" --batch_size=64 --learning_rate=0.0078125 --seed="$i" --verbose=2 \
      --model_dir="/tmp/share_${FORM:-looped}_${n}_$i" > "$OUT/share_${n}_$i.txt" 2>&1 & pids+=($!)
  done
  [ "$n" -gt 1 ] && sleep 60 && command -v nvidia-smi > /dev/null \
    && nvidia-smi --query-compute-apps=pid,used_memory --format=csv >> "$OUT/share.txt"
  wait "${pids[@]}"
  echo "[$((SECONDS - START)) s] ${FORM:-looped}, $n at once: $(grep -h -o '[0-9.]*m\?s/step' "$OUT"/share_"${n}"_*.txt | tr '\n' ' ')" \
    | tee -a "$OUT/share.txt"
done
