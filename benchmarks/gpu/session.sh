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
#   STEPS=mechanism: mechanism.txt, mechanism_runs.jsonl (docs/mechanism: App. D.2's variants, deep_* folders
#                   at depth 1000, mid_* at 100); MECH_S seconds, the sweeps at once
#   STEPS=budget:   budget.txt, budget_runs.jsonl (docs/budget: SkipInit and BatchNorm at 600 updates, depth
#                   100, one sweep per method, both at once, BUDGET_PROCESSES runs each at a time; BUDGET_DEPTHS,
#                   BUDGET_EPOCHS, BUDGET_GRIDS for the other cells); BUDGET_S seconds; at 2,400 updates
#                   (BUDGET_EPOCHS=16) the rates are chosen on held-out images, then budget_final.txt,
#                   budget_final_runs.jsonl: the final seeds at the chosen rates (BUDGET_FINAL_S seconds; BUDGET_FLAGS: more sweep flags on every line, e.g. a
#                   dry run's --train_examples=320 --validation_examples=128). Append the returned lines to
#                   docs/budget/updates<N>_depth<D>/runs.jsonl (N = 150 x epochs; budget_final_runs.jsonl holds
#                   budget_runs.jsonl's): a later call starts each sweep from that file
# Stop the CPU sweeps of those folders first (so that no cell runs twice); afterwards append each returned
# runs.jsonl's new lines to its folder here and resume them.
# LOOP_BLOCKS=0: the sweeps' nets unrolled (same function; see benchmarks/gpu/share.sh for which form is faster).
# Dry run on a CPU (a venv of ".[jax]", no install): SKIP_INSTALL=1 PY=python SWEEP_S=60 bash benchmarks/gpu/session.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpu_session}"
mkdir -p "$OUT"
PY="${PY:-python3}"
START=$SECONDS
log() { echo "[$((SECONDS - START)) s] $*" | tee -a "$OUT/session.txt"; }

if [ -z "${SKIP_INSTALL:-}" ]; then
  { "$PY" -m pip install --quiet --no-index --find-links .gpu/wheels keras absl-py h5py matplotlib protobuf \
    && "$PY" -m pip install --quiet --no-index --find-links .gpu/wheels --no-deps tensorboard; } \
    >> "$OUT/session.txt" 2>&1 || { log "pip install from .gpu/wheels failed"; exit 1; }
fi
export PYTHONPATH="$PWD" KERAS_BACKEND=jax JAX_DEFAULT_MATMUL_PRECISION=highest
# Runs of one rate share their compiled train step (another seed: the same program; another rate is
# another program, its rate a constant in it): a depth-1000 run compiles once a rate, not once a seed.
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}"
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

# Sweeps at once on the one GPU (a dozen share it): one per "FOLDER FROM ARGS..." line read from stdin, each
# in /tmp/$1/FOLDER, started from the runs.jsonl FROM where it exists (the runs an earlier call returned: not
# run again), for at most AT_ONCE_S seconds; every 30 s (the call may be cut) and at the end their runs.jsonl
# lines are gathered into $OUT/$1_runs.jsonl, and their last output lines into $OUT/$1.txt.
at_once() {
  local name=$1 dir=/tmp/$1 folder from args pids=()
  rm -rf "$dir" && mkdir -p "$dir"
  export XLA_PYTHON_CLIENT_PREALLOCATE=false  # the processes share the GPU's memory
  while read -r folder from args; do
    mkdir -p "$dir/$folder" && { [ ! -f "$from" ] || cp "$from" "$dir/$folder/runs.jsonl"; }
    # LOOP_BLOCKS=0: unrolled blocks (the same function, tested; no while loop on the GPU, a longer compilation)
    # shellcheck disable=SC2086  # args: several flags
    timeout -k 30 "${AT_ONCE_S:-420}" "$PY" -m keras_skipinit.sweep $args "--$([ "${LOOP_BLOCKS:-1}" = 1 ] || echo no-)loop_blocks" \
      --checkpoint_steps=1000 \
      --manual_dir="$FM" --out="$dir/$folder" > "$dir/$folder.txt" 2>&1 < /dev/null & pids+=($!)
  done
  gather() {  # each run once (the folders of one cell start from the same file)
    cat "$dir"/*/runs.jsonl 2> /dev/null | awk '!seen[$0]++' > "$OUT/${name}_runs.jsonl"
    log "$name: $(wc -l < "$OUT/${name}_runs.jsonl") runs recorded"
  }
  while sleep 30 && kill -0 "${pids[@]}" 2> /dev/null; do
    gather
  done
  wait "${pids[@]}"
  gather
  tail -n 4 "$dir"/*.txt > "$OUT/$name.txt" 2>&1
}

step_mechanism() {  # issue 63: App. D.2's variants at depths 1000 and 100 (docs/mechanism)
  local m r
  {
    for m in ${MECH_METHODS:-bn_sqrt2 bn_block_end}; do
      for r in ${MECH_LOG2_LRS:--6 -4 -2 0}; do
        echo "deep_${m}_$r - --preset=skipinit_table1 --depths=${MECH_DEEP:-1000} --methods=$m --log2_lrs=$r" \
          "--no-extend_grid --seeds=2 --best_k=2"
      done
    done
    # bn_head_only overflows float32 from block ~310 at depth 1000 (docs/mechanism): one rate shows it
    echo "deep_bn_head_only_-6 - --preset=skipinit_table1 --depths=${MECH_DEEP:-1000} --methods=bn_head_only" \
      "--log2_lrs=-6 --no-extend_grid --seeds=2 --best_k=2"
    # depth 100: each variant's grid from around its depth-16 optimum (docs/mechanism/table1), extended
    for m in bn_sqrt2:-5,-4,-3 bn_block_end:-4,-3,-2 bn_head_only:-7,-6,-5; do
      echo "mid_${m%%:*} - --preset=skipinit_table1 --depths=${MECH_MID:-100} --methods=${m%%:*} --log2_lrs=${m#*:}"
    done
  } | AT_ONCE_S="${MECH_S:-420}" at_once mechanism
}

step_budget() {  # issue 62, item 1: the optimum against the budget (docs/budget) beyond depth 16
  # 600 updates (BUDGET_EPOCHS=4): --preset=budget, chosen on the test set as at depth 16. 2,400 (16):
  # --preset=budget_long, chosen on 5,000 held-out images: the rates' sweeps choose only (--final_seeds=0),
  # then one sweep per method over their merged runs runs its final seeds (BUDGET_FINAL_SEEDS) at the
  # chosen rate (seeds 3 on: the preset's --final_seed_start, new draws), for BUDGET_FINAL_S seconds (both
  # phases within one call: BUDGET_S defaults to 400 then).
  # A run cut by a call's end starts over in the next (a fresh machine), and the GPU time-slices between
  # processes (2026-11-30, WRN-1000-1 looped, batch 64: 153 ms an update alone, 0.80-0.90 s each with six at
  # once: 1.1x the throughput): runs at once only finish later together. A depth-1000 run of 600 updates is
  # ~2-2.5 min alone (its 4 test evaluations included), of 2,400 ~7-9 min (depth 100: not measured alone).
  # So few at a time (BUDGET_PROCESSES, default 1 a method: two runs at once), rates in their order, and
  # evaluations in batches of 1,000 (of 64: 157 launches of the whole net an evaluation; not measured there).
  local d e m r seeds=${BUDGET_SEEDS:-3} grids=${BUDGET_GRIDS:-skipinit:-7,-6,-5,-4 batchnorm:-5,-3,-1,1}
  local select_s=540 each="--executor=processes --processes=${BUDGET_PROCESSES:-1} --eval_batch_size=1000 ${BUDGET_FLAGS:-}"
  preset() { if [ "$1" -ge 16 ]; then echo budget_long; else echo budget; fi; }
  for e in ${BUDGET_EPOCHS:-4}; do [ "$(preset "$e")" = budget ] || select_s=400; done
  for d in ${BUDGET_DEPTHS:-100}; do  # 1000: BUDGET_DEPTHS=1000 (2 seeds there: BUDGET_SEEDS=2)
    for e in ${BUDGET_EPOCHS:-4}; do  # 4: 600 updates of batch 64 over 9,600 images; 16: 2,400
      # one sweep per method (both at once), BUDGET_PROCESSES of its runs at a time, each a fresh process:
      # rates around each method's 150-update optimum and edge, seeds of a rate in turn (best 2 of 3)
      for m in $grids; do
        echo "d${d}_e${e}_${m%%:*} docs/budget/updates$((e * 150))_depth$d/runs.jsonl --preset=$(preset "$e")" \
          "--depths=$d --epochs=$e --methods=${m%%:*} --log2_lrs=${m#*:} --centre_log2_lrs= --no-extend_grid" \
          "--seeds=$seeds --best_k=$((seeds < 2 ? seeds : 2)) --final_seeds=0 $each"
      done
    done
  done | AT_ONCE_S="${BUDGET_S:-$select_s}" at_once budget
  for d in ${BUDGET_DEPTHS:-100}; do
    for e in ${BUDGET_EPOCHS:-4}; do
      [ "$(preset "$e")" = budget_long ] || continue
      cat "docs/budget/updates$((e * 150))_depth$d/runs.jsonl" /tmp/budget/d"${d}_e${e}"_*/runs.jsonl 2> /dev/null \
        | awk '!seen[$0]++' > "/tmp/budget_d${d}_e$e.jsonl"
      for m in $grids; do
        echo "final_d${d}_e${e}_${m%%:*} /tmp/budget_d${d}_e$e.jsonl --preset=budget_long --depths=$d --epochs=$e" \
          "--methods=${m%%:*} --log2_lrs=${m#*:} --centre_log2_lrs= --seeds=$seeds --best_k=$((seeds < 2 ? seeds : 2))" \
          "--final_seeds=${BUDGET_FINAL_SEEDS:-3} $each"
      done
    done
  done | { read -r line || exit 0; { echo "$line"; cat; } | AT_ONCE_S="${BUDGET_FINAL_S:-120}" at_once budget_final; }
}

for step in ${STEPS:-train fit edge table1}; do
  "step_$step"
done
log "done"
