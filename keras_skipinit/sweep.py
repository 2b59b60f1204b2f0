"""Learning-rate sweeps with the papers' protocol (SkipInit §2.3, Table 1).

For each (method, depth) cell: train at every learning rate of a log2 grid
with n seeds; at each learning rate take the mean and std of the best k of
the n test accuracies (a diverged run counts as failed, below any
accuracy); the cell reports the learning rate with the highest mean. A cell
where every run at every learning rate failed or stayed at chance is "—",
as in the paper.

    python -m keras_skipinit.sweep --depths=16,100 --methods=batchnorm,skipinit \
        --log2_lrs=-4,-3,-2 --seeds=2 --best_k=1 --epochs=3 --out=docs/table1_cpu

Every finished run is kept in ``runs.jsonl`` under --out, so an interrupted
sweep resumes without repeating runs.
"""

import argparse
import json
import math
import os

import numpy as np

# Table 1 of SkipInit: (label, normalization, alpha_init)
METHODS = {
    "batchnorm": ("Batch Normalization", "batchnorm", None),
    "skipinit_one": ("SkipInit (alpha = 1)", "skipinit", "one"),
    "skipinit_inv_sqrt_d": ("SkipInit (alpha = 1/sqrt(d))", "skipinit", "inv_sqrt_depth"),
    "skipinit": ("SkipInit (alpha = 0)", "skipinit", "zero"),
    "sqrt2": ("Divide residual block by sqrt(2)", "sqrt2", None),
    "none": ("No normalization, no scaling", "none", None),
    "fixup": ("Fixup", "fixup", None),
}


def summarize(runs, best_k, chance):
    """Per learning rate: mean/std of the best k of n test accuracies.

    `runs`: dicts with 'log2_lr', 'seed', 'status', 'test_top1'. A diverged
    run counts as accuracy `None` (failed). Returns the best learning rate's
    summary and all of them; the cell failed if no run beat chance.
    """
    by_lr = {}
    for run in runs:
        acc = run["test_top1"] if run["status"] == "completed" else None
        by_lr.setdefault(run["log2_lr"], []).append(acc)
    rows = []
    for log2_lr, accs in sorted(by_lr.items()):
        ranked = sorted((a if a is not None else -math.inf for a in accs), reverse=True)[:best_k]
        finite = [a for a in ranked if math.isfinite(a)]
        failed = len(finite) < len(ranked) or not finite or max(finite) <= chance
        rows.append(
            {
                "log2_lr": log2_lr,
                "runs": len(accs),
                "diverged": sum(a is None for a in accs),
                "mean": float(np.mean(finite)) if finite and not failed else None,
                "std": float(np.std(finite)) if finite and not failed else None,
            }
        )
    scored = [r for r in rows if r["mean"] is not None]
    best = max(scored, key=lambda r: r["mean"]) if scored else None
    return best, rows


NOT_RUN = "not run"


def format_table(cells, depths, methods):
    """A markdown table shaped like SkipInit Table 1 ("—": every run failed)."""
    lines = ["| method | " + " | ".join(f"depth {d}: test acc. (lr)" for d in depths) + " |",
             "|---|" + "---|" * len(depths)]
    for key in methods:
        entries = []
        for depth in depths:
            best = cells.get((key, depth), NOT_RUN)
            if best == NOT_RUN:
                entries.append(NOT_RUN)
            elif best is None:
                entries.append("—")
            else:
                entries.append(f"{100 * best['mean']:.1f} ± {100 * best['std']:.1f} (2^{best['log2_lr']})")
        lines.append(f"| {METHODS[key][0]} | " + " | ".join(entries) + " |")
    return "\n".join(lines)


def run_sweep(args):
    from keras_skipinit import training

    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.out, "runs.jsonl")
    done = {}
    if os.path.exists(log_path):
        with open(log_path) as f:
            for line in f:
                run = json.loads(line)
                done[(run["method"], run["depth"], run["log2_lr"], run["seed"])] = run
    for depth in args.depths:
        for key in args.methods:
            _, normalization, alpha = METHODS[key]
            for log2_lr in args.log2_lrs:
                for seed in range(args.seeds):
                    ident = (key, depth, log2_lr, seed)
                    if ident in done:
                        continue
                    config = training.Config(
                        depth=depth, width=args.width, normalization=normalization, alpha_init=alpha,
                        learning_rate=2.0**log2_lr, epochs=args.epochs, batch_size=args.batch_size,
                        steps_per_epoch=args.steps_per_epoch, dataset=args.dataset, seed=seed, verbose=0,
                        model_dir=os.path.join(args.runs_dir or os.path.join(args.out, "runs"),
                                               f"{key}_d{depth}_lr{log2_lr}_s{seed}"),
                    )
                    result = training.train(config)
                    run = {"method": key, "depth": depth, "log2_lr": log2_lr, "seed": seed,
                           "status": result["status"], "test_top1": result["test_top1"],
                           "train_cross_entropy": result["train_cross_entropy"],
                           "wall_time_s": result["wall_time_s"]}
                    print(json.dumps(run), flush=True)
                    with open(log_path, "a") as f:
                        f.write(json.dumps(run) + "\n")
                    done[ident] = run
    return list(done.values())


def report(runs, args):
    cells, details = {}, {}
    for depth in args.depths:
        for key in args.methods:
            subset = [r for r in runs if r["method"] == key and r["depth"] == depth]
            best, rows = summarize(subset, args.best_k, args.chance)
            cells[(key, depth)] = best if subset else NOT_RUN
            details[f"{key}/depth{depth}"] = rows
    table = format_table(cells, args.depths, args.methods)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(details, f, indent=1)
    _plot(details, args)
    return table


def _plot(details, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.depths), figsize=(5 * len(args.depths), 3.8), sharey=True, squeeze=False)
    for ax, depth in zip(axes[0], args.depths):
        ax.axhline(100 * args.chance, color="gray", lw=0.8, ls="--")
        for i, key in enumerate(args.methods):
            rows = details[f"{key}/depth{depth}"]
            if not rows:
                continue
            color = f"C{i}"
            xs = [r["log2_lr"] for r in rows]
            ys = [100 * r["mean"] if r["mean"] is not None else np.nan for r in rows]
            ax.plot(xs, ys, marker="o", color=color, label=METHODS[key][0])
            # Failed points (diverged or at chance) as crosses on the chance line,
            # spread a little so overlapping methods stay visible.
            failed = [r["log2_lr"] + 0.06 * (i - len(args.methods) / 2) for r in rows if r["mean"] is None]
            ax.plot(failed, [100 * args.chance] * len(failed), "x", color=color, ms=7, mew=2)
        ax.set_title(f"WRN-{depth}-{args.width} (x: failed, at chance or diverged)")
        ax.set_xlabel("log2 learning rate")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"test accuracy (%), best {args.best_k} of {args.seeds}")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "sweep.png"), dpi=110)
    plt.close(fig)


def _ints(text):
    return [int(v) for v in text.split(",")]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m keras_skipinit.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", type=_ints, default=[16, 100])
    parser.add_argument("--width", type=int, default=1)
    parser.add_argument("--methods", default="batchnorm,skipinit_one,skipinit_inv_sqrt_d,skipinit,sqrt2,none")
    parser.add_argument("--log2_lrs", type=_ints, default=[-4, -3, -2])
    parser.add_argument("--seeds", type=int, default=2, help="runs per learning rate (n)")
    parser.add_argument("--best_k", type=int, default=1, help="best k of n averaged (paper: 5 of 7)")
    parser.add_argument("--chance", type=float, default=0.11,
                        help="accuracy at or below this is a failed run (default: within 1 point of 10-class chance)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps_per_epoch", type=int, default=None)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--dataset", default="mnist_embedded")
    parser.add_argument("--out", default="runs/sweep", help="runs.jsonl, table.md, summary.json, sweep.png")
    parser.add_argument("--runs_dir", default=None, help="model_dir of each run (default: <out>/runs)")
    args = parser.parse_args(argv)
    args.methods = args.methods.split(",")
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; choose from {sorted(METHODS)}")
    if not 1 <= args.best_k <= args.seeds:
        parser.error("--best_k must be between 1 and --seeds")
    runs = run_sweep(args)
    print(report(runs, args))


if __name__ == "__main__":
    main()
