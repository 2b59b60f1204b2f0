"""The papers' depth experiments, run through `training.train`.

Two protocols, one runner; a preset fills in the paper's settings:

- ``--preset=skipinit_table1`` (SkipInit §2.3, Table 1; App. D, Table 3): for
  each (method, depth) cell, train at every learning rate of a log2 grid with
  n seeds; at each learning rate take the mean and std of the best k of the n
  test accuracies (a diverged or at-chance run counts as failed); the cell
  reports the learning rate with the highest mean. With ``--extend_grid`` a
  cell whose best learning rate sits at the edge of the grid gets the next
  one beyond it, until the optimum is interior or reaches the paper's range
  2^-10..2^2; a cell where every run failed is extended downwards. The
  training cross-entropy table selects the lowest losses the same way.
- ``--preset=fixup_fig3`` (Fixup §4.1, Fig. 3): one epoch at the fixed
  learning rate 0.1 for each (method, depth) and n seeds; the mean and std of
  the test accuracy over all seeds and how many runs trained (beat chance).

    python -m keras_skipinit.sweep --preset=fixup_fig3 --out=docs/fixup_fig3
    python -m keras_skipinit.sweep --preset=fixup_fig3_cifar_resnet --out=docs/fixup_fig3/cifar_resnet
    python -m keras_skipinit.sweep --preset=skipinit_table1 --out=docs/skipinit_table1

Every run's results.json is one line of ``runs.jsonl`` under --out, and
each run keeps its model_dir under --runs_dir, so an interrupted sweep
resumes where it stopped (a run cut off midway resumes from its checkpoint).

``--executor=ray`` runs each run as a Ray task (a local Ray instance, or the
cluster at --ray_address / RAY_ADDRESS) with --cpus_per_run/--gpus_per_run:
all runs that do not wait on another's result go out at once (a round), and
the next round is decided from their results by the same `pending_runs`.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from keras_skipinit import executors
from keras_skipinit import machine as machine_lib
from keras_skipinit.applications import MODELS

# label, training.Config overrides
METHODS = {
    "batchnorm": ("Batch Normalization", dict(normalization="batchnorm")),
    "skipinit_one": ("SkipInit (alpha = 1)", dict(normalization="skipinit", alpha_init="one")),
    "skipinit_inv_sqrt_d": ("SkipInit (alpha = 1/sqrt(d))", dict(normalization="skipinit", alpha_init="inv_sqrt_depth")),
    "skipinit": ("SkipInit (alpha = 0)", dict(normalization="skipinit", alpha_init="zero")),
    "sqrt2": ("Divide residual block by sqrt(2)", dict(normalization="sqrt2")),
    "none": ("No normalization, no scaling", dict(normalization="none")),
    "fixup": ("Fixup", dict(normalization="fixup")),
    # The Fixup authors' exact CIFAR network: their stem keeps PyTorch's default init (cifar_resnet only).
    "fixup_torch_stem": ("Fixup, stem at PyTorch's default init", dict(normalization="fixup", stem_init="pytorch_default")),
    "lsuv": ("LSUV, no normalization", dict(normalization="none", lsuv=True)),
    "regularized_skipinit": ("Regularized SkipInit", dict(normalization="regularized_skipinit")),
    "nf": ("NF-ResNet", dict(normalization="nf")),
}
# SkipInit Table 1 (CIFAR-10, WRN-n-2, 200 epochs, best 5 of 7): test accuracy %.
PAPER_TABLE1 = {("batchnorm", 16): 93.5, ("batchnorm", 100): 94.7, ("skipinit_one", 16): 93.0,
                ("skipinit_inv_sqrt_d", 16): 93.0, ("skipinit_inv_sqrt_d", 100): 94.2, ("skipinit", 16): 93.3,
                ("skipinit", 100): 94.2, ("sqrt2", 16): 92.4, ("sqrt2", 100): 88.9}
PAPER_LOG2_RANGE = (-10, 2)  # SkipInit §2.3: learning rates 2^-10 .. 2^2

PRESETS = {
    # Budget arithmetic: docs/skipinit_table1/README.md.
    "skipinit_table1": dict(
        protocol="table1", depths="16,100", width=1,
        methods="batchnorm,skipinit_one,skipinit_inv_sqrt_d,skipinit,sqrt2,none",
        log2_lrs="-4,-3,-2", seeds=3, best_k=2, extend_grid=True, epochs=1, schedule="cifar",
        batch_size=64, train_examples=9600, dataset="fashion_mnist", bn_momentum=0.9,
    ),
    # Budget arithmetic: docs/fixup_fig3/README.md.
    "fixup_fig3": dict(
        protocol="depth", depths="16,52,100", width=1, methods="batchnorm,fixup,skipinit,sqrt2,none,lsuv",
        lrs="0.1", seeds=3, best_k=3, extend_grid=False, epochs=1, schedule="constant", batch_size=128,
        train_examples=32000, dataset="fashion_mnist", bn_momentum=0.9,
    ),
    # Fig. 3 with one epoch of all 60,000 images (468 updates, near CIFAR-10's 390), on both architectures:
    # the Fixup authors' CIFAR ResNet and WRN-n-1. Budget: docs/fixup_fig3/README.md.
    "fixup_fig3_cifar_resnet": dict(
        protocol="depth", model="cifar_resnet", depths="20,56,110", methods="batchnorm,fixup,skipinit,sqrt2,fixup_torch_stem",
        lrs="0.1", seeds=3, best_k=3, extend_grid=False, epochs=1, schedule="constant", batch_size=128,
        dataset="fashion_mnist", bn_momentum=0.9,
    ),
    "fixup_fig3_wrn_full_epoch": dict(
        protocol="depth", depths="16,52,100", width=1, methods="batchnorm,fixup,skipinit,sqrt2",
        lrs="0.1", seeds=3, best_k=3, extend_grid=False, epochs=1, schedule="constant", batch_size=128,
        dataset="fashion_mnist", bn_momentum=0.9,
    ),
    # Converged Table 1, protocol and budget: docs/skipinit_table1_converged/README.md.
    # Step 1, E: BatchNorm's validation curve at a constant learning rate.
    "table1_converged_epochs": dict(
        protocol="depth", depths="16", width=1, methods="batchnorm", log2_lrs="-2", seeds=1, best_k=1,
        extend_grid=False, epochs=20, schedule="constant", batch_size=128, dataset="fashion_mnist", bn_momentum=0.9,
        validation_examples=5000, mixed_precision="auto",
    ),
    # Step 2: WRN-16-1, six methods; rate chosen on the validation split, then 3 seeds on all training images.
    # The papers' headline methods first: if the budget runs out, the cells cut are the last ones.
    "table1_converged": dict(
        protocol="converged", depths="16", width=1,
        methods="batchnorm,skipinit,fixup,regularized_skipinit,sqrt2,nf",
        centre_log2_lrs="batchnorm=-2,skipinit=-4,regularized_skipinit=-4,fixup=-3,nf=-2,sqrt2=-6",
        seeds=1, best_k=1, extend_grid=True, final_seeds=3, epochs=12, schedule="cifar", batch_size=128,
        dataset="fashion_mnist", bn_momentum=0.9, validation_examples=5000, mixed_precision="auto",
    ),
    # Step 3, the deep row: WRN-100-1 (unrolled: as fast per step as looped here, benchmarks/README.md) at the
    # rates step 2 chose at depth 16 (no selection at depth 100), 2 seeds, step 2's training settings.
    "table1_converged_deep": dict(
        protocol="converged", depths="100", width=1, methods="batchnorm,skipinit",
        chosen_log2_lrs="batchnorm=-4,skipinit=-5", seeds=1, best_k=1, extend_grid=False, final_seeds=2,
        epochs=12, schedule="cifar", batch_size=128, dataset="fashion_mnist", bn_momentum=0.9,
        validation_examples=5000, mixed_precision="auto",
    ),
}
NOT_RUN = "not run"
SELECT, FINAL = "select", "final"  # converged protocol: runs that choose the lr, runs reported on the test set


def _lr_key(lr):
    return float(f"{lr:.6g}")


def lr_label(lr):
    log2 = math.log2(lr)  # tolerant: summaries key learning rates to 6 digits (`_lr_key`)
    return f"2^{int(round(log2))}" if abs(log2 - round(log2)) < 1e-5 else f"{lr:g}"


# --- summaries ---------------------------------------------------------------------------


def summarize(runs, best_k, chance, key="test_top1", lower_is_better=False):
    """Per learning rate: mean and std of the best k of n values of `key`.

    A diverged run, or (for accuracy) one at or below `chance`, is failed;
    a learning rate where one of the best k failed is failed. Returns the best
    learning rate's row (None if every one failed) and all rows.
    """
    by_lr = {}
    for run in runs:
        value = run.get(key) if run["status"] == "completed" else None
        if value is not None and not lower_is_better and value <= chance:
            value = None
        by_lr.setdefault(_lr_key(run["lr"]), []).append(value)
    worst = math.inf if lower_is_better else -math.inf
    rows = []
    for lr, values in sorted(by_lr.items()):
        ranked = sorted((v if v is not None else worst for v in values), reverse=not lower_is_better)[:best_k]
        failed = not ranked or any(not math.isfinite(v) for v in ranked)
        rows.append({
            "lr": lr,
            "runs": len(values),
            "failed": sum(v is None for v in values),
            "mean": None if failed else float(np.mean(ranked)),
            "std": None if failed else float(np.std(ranked)),
        })
    scored = [r for r in rows if r["mean"] is not None]
    pick = min if lower_is_better else max
    return (pick(scored, key=lambda r: r["mean"]) if scored else None), rows


def grid_edge(best, rows):
    """Where a cell's best learning rate sits in the grid it was tried on:
    'interior', 'edge' (a better one may lie beyond) or 'paper bound'
    (2^-10 or 2^2, the ends of the paper's range)."""
    lrs = sorted(r["lr"] for r in rows)
    if lrs[0] < best["lr"] < lrs[-1]:
        return "interior"
    return "paper bound" if round(math.log2(best["lr"])) in PAPER_LOG2_RANGE else "edge"


def next_log2_lr(best, rows):
    """The learning rate that --extend_grid tries next for a cell, or None."""
    log2s = sorted(round(math.log2(r["lr"])) for r in rows)
    low, high = PAPER_LOG2_RANGE
    if best is None:  # everything failed: smaller learning rates first
        return log2s[0] - 1 if log2s[0] > low else None
    at = round(math.log2(best["lr"]))
    if at == log2s[0] and at > low:
        return at - 1
    if at == log2s[-1] and at < high:
        return at + 1
    return None


def _cell(best, fmt):
    if best == NOT_RUN:
        return NOT_RUN
    if best is None:
        return "—"
    return f"{fmt(best['mean'])} ± {fmt(best['std'])} ({lr_label(best['lr'])})"


def table1_tables(runs, args):
    """SkipInit Table 1 (test accuracy) and App. D Table 3 (training loss),
    and a per-cell account of the learning-rate grid."""
    acc_lines = ["| method | " + " | ".join(f"depth {d}: test acc. % (lr)" for d in args.depths) + " |"]
    ce_lines = ["| method | " + " | ".join(f"depth {d}: train cross-entropy (lr)" for d in args.depths) + " |"]
    acc_lines.append("|---|" + "---|" * len(args.depths))
    ce_lines.append(acc_lines[1])
    grid = ["| method | depth | learning rates tried | best (acc.) | optimum | failed runs / runs |", "|---|---|---|---|---|---|"]
    details = {}
    for key in args.methods:
        accs, ces = [], []
        for depth in args.depths:
            subset = [r for r in runs if r["method"] == key and r["depth"] == depth]
            if not subset:
                accs.append(NOT_RUN), ces.append(NOT_RUN)
                continue
            best, rows = summarize(subset, args.best_k, args.chance)
            best_ce, ce_rows = summarize(subset, args.best_k, args.chance, "train_cross_entropy", lower_is_better=True)
            if best is None:
                best_ce = None  # no run trained: no training loss to report (as in the paper)
            accs.append(_cell(best, lambda v: f"{100 * v:.1f}"))
            ces.append(_cell(best_ce, lambda v: f"{v:.3f}"))
            tried = sorted(r["lr"] for r in rows)
            where = grid_edge(best, rows) if best else "all failed"
            grid.append(
                f"| {METHODS[key][0]} | {depth} | {lr_label(tried[0])} .. {lr_label(tried[-1])} ({len(tried)}) | "
                f"{lr_label(best['lr']) if best else '—'} | {where} | {sum(r['failed'] for r in rows)} / {len(subset)} |"
            )
            details[f"{key}/depth{depth}"] = {"test_top1": rows, "train_cross_entropy": ce_rows, "optimum": where}
        acc_lines.append(f"| {METHODS[key][0]} | " + " | ".join(accs) + " |")
        ce_lines.append(f"| {METHODS[key][0]} | " + " | ".join(ces) + " |")
    return "\n".join(acc_lines), "\n".join(ce_lines), "\n".join(grid), details


def depth_table(runs, args):
    """Fixup Fig. 3 as a table: mean ± std test accuracy over all seeds, and
    how many runs trained (beat chance)."""
    lines = ["| method | " + " | ".join(f"depth {d}" for d in args.depths) + " |", "|---|" + "---|" * len(args.depths)]
    details = {}
    for key in args.methods:
        cells = []
        for depth in args.depths:
            subset = [r for r in runs if r["method"] == key and r["depth"] == depth]
            if not subset:
                cells.append(NOT_RUN)
                continue
            accs = [r["test_top1"] if r["status"] == "completed" else args.chance_level for r in subset]
            trained = sum(r["status"] == "completed" and r["test_top1"] > args.chance for r in subset)
            diverged = sum(r["status"] == "diverged" for r in subset)
            cells.append(f"{100 * np.mean(accs):.1f} ± {100 * np.std(accs):.1f} ({trained}/{len(subset)} trained"
                         + (f", {diverged} diverged" if diverged else "") + ")")
            details[f"{key}/depth{depth}"] = {"mean": float(np.mean(accs)), "std": float(np.std(accs)),
                                              "trained": trained, "diverged": diverged, "runs": len(subset),
                                              "test_top1": [r["test_top1"] for r in subset]}
        lines.append(f"| {METHODS[key][0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines), details


# --- running -------------------------------------------------------------------------


def _config(args, key, depth, lr, seed, phase=SELECT):
    """A run's training.Config. Runs that choose the learning rate evaluate on
    --validation_examples held out of the training set; final runs train on
    all of it and evaluate on the test set."""
    from keras_skipinit import training

    overrides = dict(METHODS[key][1])
    if overrides["normalization"] in ("batchnorm", "ghost_batchnorm") and args.bn_momentum is not None:
        overrides["bn_momentum"] = args.bn_momentum
    return training.Config(
        model=args.model, depth=depth, width=args.width, learning_rate=lr, epochs=args.epochs, schedule=args.schedule,
        batch_size=args.batch_size, steps_per_epoch=args.steps_per_epoch, dataset=args.dataset,
        data_dir=args.data_dir, train_examples=args.train_examples, seed=seed, verbose=0,
        validation_examples=args.validation_examples if phase == SELECT else None,
        mixed_precision=resolve_precision(args.mixed_precision), xla=args.xla, loop_blocks=args.loop_blocks,
        model_dir=os.path.join(args.runs_dir, f"{key}_d{depth}_lr{lr:.6g}_s{seed}" + ("_final" if phase == FINAL else "")),
        **overrides,
    )


def resolve_precision(mixed_precision):
    """--mixed_precision=auto: bfloat16 where this CPU has bfloat16
    instructions (1.14-1.42x faster than float32 there), float32 elsewhere
    (emulated bfloat16 ran at 0.17x); benchmarks/README.md. Each run records
    the precision it used (results.json config)."""
    if mixed_precision != "auto":
        return mixed_precision
    return "bfloat16" if machine_lib.cpu_has_native_bfloat16() else "none"


def _ident(key, depth, lr, seed, phase=SELECT):
    return key, depth, _lr_key(lr), seed, phase


def _load_runs(path, repair=False):
    """The runs recorded in runs.jsonl, keyed by (method, depth, lr, seed).

    A last line that is not whole JSON is what a kill mid-write leaves: it is
    dropped with a warning (and, with `repair`, cut from the file so that the
    next result starts on a line of its own), and its run runs again. A bad
    line anywhere else is a one-line ValueError naming the file and line."""
    runs = {}
    if not os.path.exists(path):
        return runs
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    offset = 0
    for number, raw in enumerate(lines, 1):
        if raw.strip():
            try:
                run = json.loads(raw)
                ident = _ident(run["method"], run["depth"], run["lr"], run["seed"], run.get("phase", SELECT))
            except (ValueError, KeyError, TypeError) as e:
                if number - 1 != last:
                    raise ValueError(f"{path}, line {number}: not a sweep result ({type(e).__name__}: {e}); "
                                     "mend or delete that line") from None
                print(f"Warning: {path}, line {number} is incomplete (a sweep killed while writing it); "
                      "dropped, its run runs again.", file=sys.stderr)
                if repair:
                    with open(path, "r+b") as f:
                        f.truncate(offset)
                break
            runs[ident] = run
        offset += len(raw) + 1
    return runs


def _append_run(path, run):
    """One whole line per result: a single write, flushed to disk before the
    sweep moves on (a kill leaves at most an incomplete last line)."""
    with open(path, "ab") as f:
        f.write((json.dumps(_strict(run)) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


def pending_runs(args, done):
    """The runs that can start now, in the sweep's order: per cell (depth,
    then method, as given), the missing seeds of its grid (the base grid and
    the points an earlier extension added), else the next point of
    --extend_grid, else its final seeds at the best learning rate. A cell's
    later runs wait for the results of its earlier ones. Every decision of
    the protocol is made here, from the results in `done` alone, so an
    interrupted sweep resumes exactly, and an executor that runs a whole
    round at once (all cells' pending runs) makes the same decisions."""
    pending = []
    for depth in args.depths:
        for key in args.methods:
            pending += _cell_pending(args, done, key, depth)
    return pending


def _cell_pending(args, done, key, depth):
    def missing(lrs, seeds, phase=SELECT):
        return [(key, depth, lr, seed, phase) for lr in lrs for seed in range(seeds)
                if _ident(key, depth, lr, seed, phase) not in done]

    if key in args.chosen_log2_lrs:  # no selection: the final runs at the given rate
        return missing([2.0 ** args.chosen_log2_lrs[key]], args.final_seeds, FINAL)
    base = base_lrs(args, key)
    keyed = {_lr_key(lr) for lr in base}
    selection = _selection(done.values(), key, depth)
    added = sorted({r["lr"] for r in selection if _lr_key(r["lr"]) not in keyed}) if args.extend_grid else []
    todo = missing(base + added, args.seeds)
    if todo:
        return todo
    best, rows = summarize(selection, args.best_k, args.chance)
    if args.extend_grid:
        step = next_log2_lr(best, rows)
        if step is not None:
            return missing([2.0**step], args.seeds)
    if args.final_seeds and best:
        return missing([best["lr"]], args.final_seeds, FINAL)
    return []


def run_sweep(args):
    """Runs the sweep: every run `pending_runs` allows goes to the executor
    (--executor: this process, one run at a time; or Ray tasks, all at once),
    and each result is recorded here as it comes back (one writer), before
    the pending runs are decided again."""
    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.out, "runs.jsonl")
    done = _load_runs(log_path, repair=True)
    others = sorted({r.get("model", "wrn") for r in done.values()} - {args.model})
    if others:
        raise ValueError(f"{log_path} holds runs of --model={others[0]}, not --model={args.model}: "
                         "give this sweep an --out of its own")
    _check_cells(args)
    executor = _executor(args)
    cells = {(key, depth) for depth in args.depths for key in args.methods}
    done_before = sum((r["method"], r["depth"]) in cells for r in done.values())
    start, new, in_flight = time.time(), 0, {}
    try:
        while True:
            pending = [ident for ident in pending_runs(args, done) if ident not in in_flight]
            for ident in pending[: executor.capacity - len(in_flight)]:
                in_flight[ident] = _config(args, *ident)
                executor.submit(ident, in_flight[ident])
            if not in_flight:
                break
            ident, outcome = executor.wait()
            run = _record(args, ident, in_flight.pop(ident), outcome)
            _append_run(log_path, run)
            done[_ident(*ident)] = run
            new += 1
            running, queued = executor.in_flight()
            finished, left = done_before + new, _runs_left(args, done)
            eta = (time.time() - start) / new * left  # this sweep's throughput so far
            acc = "—" if run["test_top1"] is None else f"{100 * run['test_top1']:.1f}%"
            busy = f"{running} running, {queued} queued; " if args.executor != "sequential" else ""
            print(f"[{finished}/{finished + left}] {_run_label(ident)}: {run['status']}, {run['eval_split']} {acc}, "
                  f"{run['wall_time_s']:.0f} s; {busy}about {eta / 60:.0f} min left", flush=True)
    except executors.RunFailed as e:
        raise ValueError(f"run {_run_label(e.ident)}: {e}") from None
    finally:
        executor.close()
    return list(done.values())


def _check_cells(args):
    """Refuses, before any run, a method that train.py would refuse on this
    model (e.g. nf on a post-activation network): not hours into the sweep."""
    from keras_skipinit import training

    for key in args.methods:
        for depth in args.depths:
            try:
                training.validate(_config(args, key, depth, args.lrs[0], 0))
            except ValueError as e:
                raise ValueError(f"--methods={key} at depth {depth} with --model={args.model}: {e}") from None


def _run_label(ident):
    key, depth, lr, seed, phase = ident
    return f"{key} depth {depth} lr {lr_label(lr)} seed {seed}" + (" (final)" if phase == FINAL else "")


def _executor(args):
    if args.executor == "sequential":
        return executors.make("sequential")
    # Ray workers may run elsewhere: model_dirs and data by absolute path (on storage every node reads).
    args.runs_dir = os.path.abspath(args.runs_dir)
    args.data_dir = args.data_dir and os.path.abspath(args.data_dir)
    return executors.make("ray", address=args.ray_address, cpus_per_run=args.cpus_per_run,
                          gpus_per_run=args.gpus_per_run, max_retries=args.max_retries)


def _record(args, ident, config, outcome):
    """The runs.jsonl line of a finished run."""
    key, depth, lr, seed, phase = ident
    result = outcome["result"]
    results = {k: v for k, v in result.items() if k != "chief"}
    # Paths relative to --out: no machine's directories in committed results.
    results["config"] = {**results["config"], "model_dir": os.path.relpath(results["config"]["model_dir"], args.out)}
    return {"model": args.model, "method": key, "depth": depth, "width": args.width, "lr": lr, "log2_lr": math.log2(lr),
            "seed": seed, "phase": phase, "status": result["status"], "test_top1": result["test_top1"],
            "eval_split": result.get("eval_split", "test"), "train_cross_entropy": result["train_cross_entropy"],
            "curve": outcome["curve"], "wall_time_s": result["wall_time_s"], "machine": outcome["machine"],
            "results": results}


def _runs_left(args, done):
    """Runs still to come as far as known now: the pending ones, and the
    final seeds of cells still choosing their rate (a grid extension adds
    more when it happens)."""
    left = 0
    for depth in args.depths:
        for key in args.methods:
            cell = _cell_pending(args, done, key, depth)
            left += len(cell)
            if args.final_seeds and cell and cell[0][4] == SELECT:
                left += args.final_seeds
    return left


def base_lrs(args, key):
    """A cell's first grid: --lrs, or the octaves either side of the method's
    --centre_log2_lrs entry."""
    if key in args.centre_log2_lrs:
        centre = args.centre_log2_lrs[key]
        return [2.0**k for k in (centre - 1, centre, centre + 1)]
    return list(args.lrs)


def _selection(runs, key, depth):
    return [r for r in runs if r["method"] == key and r["depth"] == depth and r.get("phase", SELECT) == SELECT]


def _strict(value):
    from keras_skipinit import run_dir

    return run_dir.strict_json(value)


# --- reporting ---------------------------------------------------------------------------


def converged_table(runs, args):
    """Converged Table 1: per cell, the learning rate chosen on the
    validation split and the test accuracy of the final runs at it (mean ±
    std over all seeds), beside the paper's CIFAR-10 figure."""
    lines = ["| method | depth | lr chosen (validation acc. % per lr, best k of n) | test acc. % (final runs) "
             "| paper, CIFAR-10 WRN-n-2 | precision (selection; final) |", "|---|---|---|---|---|---|"]
    details = {}
    for key in args.methods:
        for depth in args.depths:
            selection = _selection(runs, key, depth)
            final = [r for r in runs if r["method"] == key and r["depth"] == depth and r.get("phase") == FINAL]
            if not selection and not final:
                continue
            best, rows = summarize(selection, args.best_k, args.chance) if selection else (None, [])
            tried = ", ".join(f"{lr_label(r['lr'])}: " + ("—" if r["mean"] is None else f"{100 * r['mean']:.1f}")
                              for r in rows)
            accs = [r["test_top1"] if r["status"] == "completed" else args.chance_level for r in final]
            trained = sum(r["status"] == "completed" and r["test_top1"] > args.chance for r in final)
            test = (f"{100 * np.mean(accs):.1f} ± {100 * np.std(accs):.1f} ({trained}/{len(final)} trained)"
                    if final else NOT_RUN)
            paper = PAPER_TABLE1.get((key, depth))
            if not selection:
                chosen = f"{lr_label(final[0]['lr'])} (given, --chosen_log2_lrs)"
            else:
                chosen = (f"{lr_label(best['lr'])} ({grid_edge(best, rows)})" if best else "— (all failed)") + f"; {tried}"
            lines.append(f"| {METHODS[key][0]} | {depth} | {chosen} | {test} | "
                         f"{'—' if paper is None else f'{paper:.1f}'} | "
                         f"{_precisions(selection) or '—'}; {_precisions(final) or '—'} |")
            details[f"{key}/depth{depth}"] = {"validation_top1": rows, "lr": final[0]["lr"] if final else best and best["lr"],
                                              "test_top1": [r["test_top1"] for r in final],
                                              "mean": float(np.mean(accs)) if final else None,
                                              "std": float(np.std(accs)) if final else None, "paper": paper}
    return "\n".join(lines), details


def _precisions(runs):
    """The precisions `runs` trained in, e.g. 'bfloat16 x2, float32 x1'."""
    counts = {}
    for run in runs:
        precision = run.get("results", {}).get("config", {}).get("mixed_precision", "none")  # train.py's values
        name = "float32" if precision == "none" else precision
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))


def report(runs, args):
    runs = [r for r in runs if r["method"] in args.methods and r["depth"] in args.depths]
    if args.protocol == "converged":
        table, details = converged_table(runs, args)
        text = (f"{arch(args)}, {args.epochs} epochs; learning rate chosen on {args.validation_examples} "
                f"training images held out (best {args.best_k} of {args.seeds} per lr), then {args.final_seeds} "
                f"seeds on the full training set, test accuracy mean ± std\n\n{table}\n")
        _plot_curves([r for r in runs if r.get("phase") == FINAL], args, "test")
    elif args.protocol == "table1":
        accuracy, cross_entropy, grid, details = table1_tables(runs, args)
        text = (f"Test accuracy, best {args.best_k} of {args.seeds} (—: every run failed)\n\n{accuracy}\n\n"
                f"Training cross-entropy (no L2 term), best {args.best_k} of {args.seeds}\n\n{cross_entropy}\n\n"
                f"Learning-rate grid per cell\n\n{grid}\n")
        _plot_table1(details, args)
    else:
        table, details = depth_table(runs, args)
        split = "validation" if args.validation_examples else "test"
        text = f"{split.capitalize()} accuracy after {args.epochs} epoch(s), mean ± std over {args.seeds} seeds\n\n{table}\n"
        _plot_depth(details, args)
        if args.epochs > 1:
            _plot_curves(runs, args, split)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    seconds = sum(r["wall_time_s"] or 0 for r in runs)
    command = " ".join(a for a in args.argv if a != "--report_only")  # the command that runs (or resumes) it
    summary = {"command": "python -m keras_skipinit.sweep " + command, "settings": _settings(args),
               "machines": sorted({r.get("machine", "?") for r in runs}), "runs": len(runs),
               "run_time_s": seconds, "cells": details}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(_strict(summary), f, indent=1)
    return text


def arch(args, depth="n"):
    """The architecture's name for tables and plots, e.g. WRN-16-1, ResNet-20."""
    if args.model == "wrn":
        return f"WRN-{depth}-{args.width}"
    return f"ResNet-{depth}" + {"resnet_v1": " V1", "resnet_v2": " V2", "cifar_resnet": " (CIFAR)"}[args.model]


def _settings(args):
    return {k: v for k, v in vars(args).items() if k not in ("argv", "out", "runs_dir")}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_table1(details, args):
    plt = _plt()
    fig, axes = plt.subplots(2, len(args.depths), figsize=(5 * len(args.depths), 7), sharex="col", squeeze=False)
    for col, depth in enumerate(args.depths):
        acc_ax, ce_ax = axes[0][col], axes[1][col]
        acc_ax.axhline(100 * args.chance_level, color="gray", lw=0.8, ls="--")
        for i, key in enumerate(args.methods):
            cell = details.get(f"{key}/depth{depth}")
            if not cell:
                continue
            color, rows = f"C{i}", cell["test_top1"]
            xs = [math.log2(r["lr"]) for r in rows]
            acc_ax.plot(xs, [100 * r["mean"] if r["mean"] is not None else np.nan for r in rows], "o-", color=color,
                        label=METHODS[key][0])
            failed = [x + 0.06 * (i - len(args.methods) / 2) for x, r in zip(xs, rows) if r["mean"] is None]
            acc_ax.plot(failed, [100 * args.chance_level] * len(failed), "x", color=color, ms=7, mew=2)
            ce = cell["train_cross_entropy"]
            ce_ax.plot([math.log2(r["lr"]) for r in ce], [r["mean"] if r["mean"] is not None else np.nan for r in ce],
                       "o-", color=color)
        acc_ax.set_title(f"{arch(args, depth)} (x: failed)")
        ce_ax.set_xlabel("log2 learning rate")
        ce_ax.set_yscale("log")
        for ax in (acc_ax, ce_ax):
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"test accuracy %, best {args.best_k} of {args.seeds}")
    axes[1][0].set_ylabel("training cross-entropy")
    from matplotlib.lines import Line2D  # every method, also those not (yet) drawn in the last column

    handles = [Line2D([], [], color=f"C{i}", marker="o", label=METHODS[key][0]) for i, key in enumerate(args.methods)]
    axes[0][-1].legend(handles=handles, fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "sweep.png"), dpi=110)
    plt.close(fig)


def _plot_curves(runs, args, split):
    """curves.png: evaluation accuracy after each epoch, per method and depth,
    mean over seeds with a band of ± one std."""
    cells = {}
    for run in runs:
        if run.get("curve"):
            cells.setdefault((run["method"], run["depth"]), []).append(run["curve"])
    if not cells:
        return
    plt = _plt()
    fig, axes = plt.subplots(1, len(args.depths), figsize=(6 * len(args.depths), 4.2), squeeze=False)
    for ax, depth in zip(axes[0], args.depths):
        for i, key in enumerate(args.methods):
            curves = cells.get((key, depth))
            if not curves:
                continue
            n = min(len(c) for c in curves)  # a run still in progress has fewer epochs
            values = 100 * np.array([c[:n] for c in curves])
            epochs = np.arange(1, n + 1)
            mean, std = values.mean(0), values.std(0)
            ax.plot(epochs, mean, color=f"C{i}", label=f"{METHODS[key][0]} ({len(curves)} seed{'s' * (len(curves) > 1)})")
            ax.fill_between(epochs, mean - std, mean + std, color=f"C{i}", alpha=0.2)
        ax.set_title(f"{arch(args, depth)}, {args.dataset}")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("epoch")
        ax.set_ylabel(f"{split} accuracy %")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        low = [100 * min(c) for (k, d), cs in cells.items() if d == depth for c in cs]
        if low:
            ax.set_ylim(max(min(low) - 2, 100 * args.chance_level - 2), 100)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "curves.png"), dpi=110)
    plt.close(fig)


def _plot_depth(details, args):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.axhline(100 * args.chance_level, color="gray", lw=0.8, ls="--", label="chance")
    for i, key in enumerate(args.methods):
        points = [(d, details[f"{key}/depth{d}"]) for d in args.depths if f"{key}/depth{d}" in details]
        if not points:
            continue
        xs = np.array([d for d, _ in points], float) * (1 + 0.02 * (i - len(args.methods) / 2))
        ax.errorbar(xs, [100 * c["mean"] for _, c in points], yerr=[100 * c["std"] for _, c in points], marker="o",
                    capsize=3, color=f"C{i}", label=METHODS[key][0])
        for x, (_, c) in zip(xs, points):
            ax.scatter([x] * len(c["test_top1"]), [100 * (a if a is not None else args.chance_level) for a in c["test_top1"]],
                       s=8, color=f"C{i}", alpha=0.4)
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(args.depths, [str(d) for d in args.depths])
    ax.set_xlabel(f"depth ({arch(args)} layers)")
    ax.set_ylabel(f"{'validation' if args.validation_examples else 'test'} accuracy % after {args.epochs} epoch(s)")
    ax.set_title(f"{args.dataset}: lr {', '.join(lr_label(lr) for lr in args.lrs)}, {args.seeds} seeds (dots: runs)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "sweep.png"), dpi=110)
    plt.close(fig)


# --- command line ---------------------------------------------------------------------------


def _ints(text):
    return [int(v) for v in text.split(",")]


def _floats(text):
    return [float(v) for v in text.split(",")]


def parse_args(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m keras_skipinit.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), help="the paper's settings; other flags override them")
    parser.add_argument("--protocol", choices=("table1", "depth", "converged"), default="table1",
                        help="converged: choose each cell's lr on --validation_examples, then --final_seeds runs")
    parser.add_argument("--model", choices=MODELS, default="wrn",
                        help="architecture (train.py's --model); one model per --out")
    parser.add_argument("--depths", type=_ints, default=[16, 100])
    parser.add_argument("--width", type=int, default=1, help="WRN widening factor (WRN only)")
    parser.add_argument("--methods", default="batchnorm,skipinit_one,skipinit_inv_sqrt_d,skipinit,sqrt2,none")
    parser.add_argument("--log2_lrs", type=_ints, default=None, help="learning rates 2^k (e.g. -6,-4,-2)")
    parser.add_argument("--lrs", type=_floats, default=None, help="learning rates as values (e.g. 0.1)")
    parser.add_argument("--extend_grid", action=argparse.BooleanOptionalAction, default=False,
                        help="extend each cell's grid until its optimum is interior (within 2^-10..2^2)")
    parser.add_argument("--seeds", type=int, default=3, help="runs per learning rate (n)")
    parser.add_argument("--best_k", type=int, default=2, help="best k of n averaged (paper: 5 of 7)")
    parser.add_argument("--chance", type=float, default=0.11,
                        help="accuracy at or below this is a failed run (default: within 1 point of 10-class chance)")
    parser.add_argument("--chance_level", type=float, default=0.1, help="chance accuracy, drawn in the plots")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--schedule", default="cifar")
    parser.add_argument("--steps_per_epoch", type=int, default=None)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--train_examples", type=int, default=None)
    parser.add_argument("--validation_examples", type=int, default=None,
                        help="runs that choose the lr evaluate on the last N training images, not the test set")
    parser.add_argument("--final_seeds", type=int, default=0,
                        help="then train this many seeds at each cell's best lr on all training images (test set)")
    parser.add_argument("--centre_log2_lrs", default="",
                        help="per-method grid centre, e.g. batchnorm=-3,skipinit=-5: that method tries 2^(c-1..c+1)")
    parser.add_argument("--chosen_log2_lrs", default="",
                        help="converged protocol: method=k,... skips that method's selection and runs its final seeds at 2^k")
    parser.add_argument("--mixed_precision", choices=("none", "float16", "bfloat16", "auto"), default="none",
                        help="auto: bfloat16 on a CPU with bfloat16 instructions, else float32 (none)")
    parser.add_argument("--xla", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--loop_blocks", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--bn_momentum", type=float, default=None, help="for the BN methods (PyTorch's default: 0.9)")
    parser.add_argument("--dataset", default="mnist_embedded")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--out", default="runs/sweep", help="runs.jsonl, table.md, summary.json, sweep.png")
    parser.add_argument("--runs_dir", default=None, help="model_dir of each run (default: runs/sweeps/<out's name>)")
    parser.add_argument("--report_only", action="store_true", help="write the tables and plot from runs.jsonl")
    parser.add_argument("--executor", choices=("sequential", "ray"), default="sequential",
                        help="sequential: each run in this process in turn; ray: each run a Ray task (pip install -e \".[ray]\")")
    parser.add_argument("--ray_address", default=None,
                        help="a Ray cluster's address (ray start --head prints it); default: RAY_ADDRESS, else the "
                             "cluster `ray start` started on this machine, else a new local instance; local: always a new one")
    parser.add_argument("--cpus_per_run", type=float, default=1, help="Ray resources of each run")
    parser.add_argument("--gpus_per_run", type=float, default=0, help="Ray resources of each run (GPUs: --cpus_per_run too)")
    parser.add_argument("--max_retries", type=int, default=3,
                        help="Ray: times a run whose worker died is retried (it resumes from its checkpoint)")
    preset = parser.parse_known_args(argv)[0].preset
    if preset:
        parser.set_defaults(**PRESETS[preset])
    args = parser.parse_args(argv)
    args.argv = argv
    for name in ("depths",):
        if isinstance(getattr(args, name), str):
            setattr(args, name, _ints(getattr(args, name)))
    for name, parse in (("log2_lrs", _ints), ("lrs", _floats)):
        if isinstance(getattr(args, name), str):
            setattr(args, name, parse(getattr(args, name)))
    if args.lrs is None:
        args.lrs = [2.0**k for k in (args.log2_lrs or [-4, -3, -2])]
    args.methods = args.methods.split(",")
    for name in ("centre_log2_lrs", "chosen_log2_lrs"):
        text = getattr(args, name)
        try:
            setattr(args, name, {k: int(v) for k, v in (item.split("=") for item in text.split(",") if item)})
        except ValueError:
            parser.error(f"--{name}: expected method=integer,..., got {text!r}")
    unknown = [m for m in [*args.methods, *args.centre_log2_lrs, *args.chosen_log2_lrs] if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; choose from {sorted(METHODS)}")
    if not 1 <= args.best_k <= args.seeds:
        parser.error("--best_k must be between 1 and --seeds")
    if args.protocol == "converged" and not (args.validation_examples and args.final_seeds):
        parser.error("--protocol=converged needs --validation_examples and --final_seeds")
    if args.extend_grid and any(abs(math.log2(lr) - round(math.log2(lr))) > 1e-9 for lr in args.lrs):
        parser.error("--extend_grid needs a log2 grid (--log2_lrs)")
    args.runs_dir = args.runs_dir or os.path.join("runs", "sweeps", os.path.basename(os.path.normpath(args.out)))
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.report_only:
            runs = list(_load_runs(os.path.join(args.out, "runs.jsonl")).values())
            if not runs:
                raise ValueError(f"no runs in {args.out} (no {os.path.join(args.out, 'runs.jsonl')} with results): "
                                 "run the sweep without --report_only first")
        else:
            runs = run_sweep(args)
    except ValueError as e:
        print(f"python -m keras_skipinit.sweep: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(report(runs, args))


if __name__ == "__main__":
    main()
