#!/usr/bin/env bash
# What a deep run's update costs on one GPU, alone and shared: WRN-DEPTH-1 (SkipInit), batch 64, 2 epochs of
# STEPS updates each, evaluated on 640 held-out images, for each block form in FORMS (looped: a while loop
# per group; unrolled: no loop, a longer compilation) and each N in NS as N train.py processes at once.
# Prints each process's epoch times (Keras' verbose=2 line: the second epoch has no compilation).
#   lent GPU:  device run: command "FORMS='looped unrolled' NS=1 bash benchmarks/gpu/share.sh", carry [".gpu"]
#              (after prepare.sh here); 2026-11-30, looped: 153 ms an update alone, 0.80-0.90 s with six at once
#   CPU check: SKIP_INSTALL=1 PY=python DEPTH=10 NS="1 2" bash benchmarks/gpu/share.sh
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
for form in ${FORMS:-looped}; do
  for n in ${NS:-1 6}; do
    pids=()
    for i in $(seq "$n"); do
      "$PY" train.py --model=wrn --depth="${DEPTH:-1000}" --width=1 --normalization=skipinit \
        "--$([ "$form" = looped ] || echo no)loop_blocks" --dataset=fashion_mnist --manual_dir="$PWD/.gpu/fashion-mnist" \
        --train_examples=9600 --validation_examples=640 --epochs=2 --steps_per_epoch="${STEPS:-20}" --batch_size=64 \
        --learning_rate=0.0078125 --seed="$i" --verbose=2 --model_dir="/tmp/share_${form}_${n}_$i" \
        > "$OUT/share_${form}_${n}_$i.txt" 2>&1 & pids+=($!)
    done
    wait "${pids[@]}"
    echo "[$((SECONDS - START)) s] $form, $n at once: $(grep -h -o '[0-9.]*m\?s/step' "$OUT"/share_"${form}_${n}"_*.txt \
      | tr '\n' ' ')" | tee -a "$OUT/share.txt"
  done
done
