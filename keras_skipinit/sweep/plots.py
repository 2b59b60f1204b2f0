"""The sweep's figures (sweep.png, curves.png), per protocol; each written
only where its bytes change (`files.write_if_changed`)."""

import math
import os
import types

import numpy as np

from keras_skipinit import files, spec
from keras_skipinit.sweep.presets import METHOD_SETTINGS
from keras_skipinit.sweep.protocol import lr_label, PAPER_LOG2_RANGE


def arch(args, depth="n"):
    """The architecture's name for tables and plots, e.g. WRN-16-1, ResNet-20."""
    return spec.title(args.model, depth, args.width)


def _save_figure(fig, path):
    """Lays the figure out, writes it as a PNG where its bytes change, closes it."""
    import io

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    files.write_if_changed(path, buffer.getvalue())
    _plt().close(fig)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_table1(details, args, borrowed=None, split="test"):
    """Accuracy and training cross-entropy against the rate, a column per
    depth; `borrowed` ({depth: sweep}): depths from another folder (--beside)."""
    plt = _plt()
    borrowed = borrowed or {}
    depths = sorted(set(args.depths) | set(borrowed))
    fig, axes = plt.subplots(2, len(depths), figsize=(5 * len(depths), 7), sharex="col", squeeze=False)
    for col, depth in enumerate(depths):
        acc_ax, ce_ax = axes[0][col], axes[1][col]
        acc_ax.axhline(100 * args.chance_level, color="gray", lw=0.8, ls="--")
        for i, key in enumerate(args.methods):
            cell = details.get(f"{key}/depth{depth}")
            if not cell:
                continue
            color, rows = f"C{i}", cell["test_top1"]
            xs = [math.log2(r["lr"]) for r in rows]
            acc_ax.plot(xs, [100 * r["mean"] if r["mean"] is not None else np.nan for r in rows], "o-", color=color,
                        label=METHOD_SETTINGS[key][0])
            failed = [x + 0.06 * (i - len(args.methods) / 2) for x, r in zip(xs, rows) if r["mean"] is None]
            acc_ax.plot(failed, [100 * args.chance_level] * len(failed), "x", color=color, ms=7, mew=2)
            ce = cell["train_cross_entropy"]
            ce_ax.plot([math.log2(r["lr"]) for r in ce], [r["mean"] if r["mean"] is not None else np.nan for r in ce],
                       "o-", color=color)
        other = borrowed.get(depth)
        acc_ax.set_title(f"{arch(args, depth)} (x: failed)" if other is None else
                         f"{arch(args, depth)}, best {other['best_k']} of {other['seeds']} (x: failed)")
        ce_ax.set_xlabel("log2 learning rate")
        ce_ax.set_yscale("log")
        for ax in (acc_ax, ce_ax):
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"{split} accuracy %, best {args.best_k} of {args.seeds}")
    axes[1][0].set_ylabel("training cross-entropy")
    from matplotlib.lines import Line2D  # every method, also those not (yet) drawn in the last column

    handles = [Line2D([], [], color=f"C{i}", marker="o", label=METHOD_SETTINGS[key][0]) for i, key in enumerate(args.methods)]
    axes[0][-1].legend(handles=handles, fontsize=7)
    _save_figure(fig, os.path.join(args.out, "sweep.png"))


def plot_curves(runs, args, split):
    """curves.png: evaluation accuracy after each epoch, per method and depth,
    mean over seeds with a band of ± one std; none without curves (a drawing
    of runs since taken out of runs.jsonl is removed)."""
    path, cells = os.path.join(args.out, "curves.png"), {}
    for run in runs:
        if run.get("curve"):
            cells.setdefault((run["method"], run["depth"]), []).append(run["curve"])
    if not cells:
        if os.path.exists(path):
            os.remove(path)
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
            ax.plot(epochs, mean, color=f"C{i}", label=f"{METHOD_SETTINGS[key][0]} ({len(curves)} seed{'s' * (len(curves) > 1)})")
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
    _save_figure(fig, path)


def _by_depth(details, args, key, i, spread):
    """Method `key`'s cells by depth and their x positions, the i-th method's
    shifted by `spread` * (i - methods/2) of the depth so that they do not overlap."""
    points = [(d, details[f"{key}/depth{d}"]) for d in args.depths if f"{key}/depth{d}" in details]
    return points, np.array([d for d, _ in points], float) * (1 + spread * (i - len(args.methods) / 2))


def _depth_axis(ax, args):
    """The x axis of a plot against depth: log scale, ticked at the depths run."""
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(args.depths, [str(d) for d in args.depths])
    ax.set_xlabel(f"depth ({arch(args)} layers)")


def plot_depth(details, args):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.axhline(100 * args.chance_level, color="gray", lw=0.8, ls="--", label="chance")
    for i, key in enumerate(args.methods):
        points, xs = _by_depth(details, args, key, i, 0.02)
        if not points:
            continue
        ax.errorbar(xs, [100 * c["mean"] for _, c in points], yerr=[100 * c["std"] for _, c in points], marker="o",
                    capsize=3, color=f"C{i}", label=METHOD_SETTINGS[key][0])
        for x, (_, c) in zip(xs, points):
            ax.scatter([x] * len(c["test_top1"]), [100 * (a if a is not None else args.chance_level) for a in c["test_top1"]],
                       s=8, color=f"C{i}", alpha=0.4)
    _depth_axis(ax, args)
    ax.set_ylabel(f"{'validation' if args.validation_examples else 'test'} accuracy % after {args.epochs} epoch(s)")
    ax.set_title(f"{args.dataset}: lr {', '.join(lr_label(lr) for lr in args.lrs)}, {args.seeds} seeds (dots: runs)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save_figure(fig, os.path.join(args.out, "sweep.png"))


def plot_edges(details, args, borrowed=None):
    """The stability edge against depth, one line per method; a cell where
    no rate trained is an x at the bottom. `borrowed`: {depth: sweep} of the
    depths whose cells come from another sweep (failure_tables.edge_table's --beside),
    named in the title with their k of n."""
    plt = _plt()
    borrowed = borrowed or {}
    args = types.SimpleNamespace(**{**vars(args), "depths": sorted({*args.depths, *borrowed})})
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    low = PAPER_LOG2_RANGE[0] - 1
    for i, key in enumerate(args.methods):
        points, xs = _by_depth(details, args, key, i, 0.03)
        if not points:
            continue
        ys = [c["edge_log2"] if c["edge_log2"] is not None else np.nan for _, c in points]
        ax.plot(xs, ys, "o-", color=f"C{i}", label=METHOD_SETTINGS[key][0])
        searching = [(x, y) for x, y, (_, c) in zip(xs, ys, points) if not c["bracketed"]]
        ax.plot([x for x, _ in searching], [y for _, y in searching], "o", color="white", ms=4)  # open: a lower bound
        none = [x for x, (_, c) in zip(xs, points) if c["edge_log2"] is None and c["bracketed"]]
        ax.plot(none, [low] * len(none), "x", color=f"C{i}", ms=8, mew=2)
    _depth_axis(ax, args)
    ax.set_xlim(min(args.depths) / 1.5, max(args.depths) * 1.5)
    ax.set_ylabel("stability edge: largest log2 learning rate that trains")
    others = "".join(f"; depth {d}: {s['best_k']} of {s['seeds']}" for d, s in sorted(borrowed.items()))
    ax.set_title(f"{args.dataset}, batch {args.batch_sizes[0]}: {args.best_k} of {args.seeds} seeds train{others}\n"
                 f"(x at {low}: none from 2^{low + 1} up; open: still searching)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save_figure(fig, os.path.join(args.out, "sweep.png"))


def plot_survival(details, args, compared=None):
    """Per method and depth, the fraction of seeds that trained against the
    log2 rate (by accuracy: filled; by accuracy and loss: open), with the
    95% intervals as bars; with `compared` (--compare_to), that sweep's
    curves of the same cells in gray."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, key in enumerate(args.methods):
        for j, depth in enumerate(args.depths):
            cell = details.get(f"{key}/depth{depth}")
            if cell is None:
                continue
            rows = cell["rates"]
            x = np.array([math.log2(r["lr"]) for r in rows])
            label = (METHOD_SETTINGS[key][0] + (f", depth {depth}" if len(args.depths) > 1 else "")
                     + (f" ({compared['factor']})" if compared else ""))
            for trained, interval, marker, shift in (("trained", "interval", "o-", -0.03),
                                                     ("trained_by_loss", "interval_by_loss", "s--", 0.03)):
                fraction = np.array([r[trained] / r["runs"] for r in rows])
                low, high = (np.array([r[interval][b] for r in rows]) for b in (0, 1))
                spread = [np.maximum(fraction - low, 0), np.maximum(high - fraction, 0)]  # round-off: never < 0
                ax.errorbar(x + shift, fraction, yerr=spread, fmt=marker, capsize=2,
                            color=f"C{i}", alpha=1.0 if j == 0 else 0.6, mfc="white" if shift > 0 else None,
                            label=label if shift < 0 else None)
    for name, cell in (compared or {}).get("cells", {}).items():
        if name in details and "rates" in cell:
            x = [math.log2(r["lr"]) for r in cell["rates"]]
            for trained, style in (("trained", "o-"), ("trained_by_loss", "s--")):
                ax.plot(x, [r[trained] / r["runs"] for r in cell["rates"]], style, color="gray", alpha=0.6,
                        mfc="white" if trained != "trained" else None,
                        label=f"{METHOD_SETTINGS[name.split('/')[0]][0]}, {compared['folder']}" if trained == "trained" else None)
    ax.axhline(0.5, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("log2 learning rate")
    ax.set_ylabel("fraction of seeds that trained")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"{args.dataset}, {arch(args)}, batch {args.batch_sizes[0]}, {args.seeds} seeds a rate\n"
                 "(filled: accuracy above chance; open: and training loss below ln(classes) - 0.1; 95% Wilson)",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save_figure(fig, os.path.join(args.out, "sweep.png"))


def plot_batch_scaling(details, args):
    """SkipInit Fig. 3: (a) test accuracy, (b) training cross-entropy of the
    final runs, (c) the rate chosen for accuracy and (d) the rate of lowest
    training loss, against batch size; error bars over seeds, rates that
    failed (diverged or at chance) marked x and the other rates tried as
    small open circles, so the largest stable rate tried per batch size
    shows (below the x where one failed)."""
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5), sharex=True)
    (acc_ax, ce_ax), (lr_ax, lr_ce_ax) = axes
    losses_drawn = set()
    for i, key in enumerate(args.methods):
        cells = [details[f"{key}/batch{b}"] for b in args.batch_sizes if f"{key}/batch{b}" in details]
        if not cells:
            continue
        color, label = f"C{i}", METHOD_SETTINGS[key][0]
        shift = 2 ** (0.04 * (i - len(args.methods) / 2))  # methods side by side at one batch size
        done = [c for c in cells if c["mean"] is not None]
        acc_ax.errorbar([c["batch_size"] * shift for c in done], [100 * c["mean"] for c in done],
                        yerr=[100 * c["std"] for c in done], marker="o", capsize=3, color=color, label=label)
        with_ce = [c for c in cells if c["ce_mean"] is not None]
        ce_ax.errorbar([c["batch_size"] * shift for c in with_ce], [c["ce_mean"] for c in with_ce],
                       yerr=[c["ce_std"] for c in with_ce], marker="o", capsize=3, color=color)
        losses_drawn.update(c["ce_mean"] for c in with_ce)
        for ax, field in ((lr_ax, "lr"), (lr_ce_ax, "lr_lowest_loss")):
            chosen = [c for c in cells if c[field]]
            ax.plot([c["batch_size"] * shift for c in chosen], [c[field] for c in chosen], "o-", color=color)
            for lrs, style in (("failed_lrs", dict(marker="x", ms=7, mew=2)),
                               ("trained_lrs", dict(marker="o", ms=4, mfc="none", alpha=0.6))):
                points = [(c["batch_size"] * shift, lr) for c in cells for lr in c[lrs]]
                ax.plot([b for b, _ in points], [lr for _, lr in points], linestyle="none", color=color, **style)
    acc_ax.set_ylabel("test accuracy % (final runs)")
    ce_ax.set_ylabel("training cross-entropy (no L2)")
    if len(losses_drawn) > 1:  # one value: a log axis is singular
        ce_ax.set_yscale("log")
    lr_ax.set_ylabel("learning rate chosen (x: failed, o: tried)")
    lr_ce_ax.set_ylabel("learning rate of lowest training loss")
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    for ax in (lr_ax, lr_ce_ax):
        ax.set_yscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_xticks(args.batch_sizes, [str(b) for b in args.batch_sizes])
    acc_ax.legend(fontsize=7)
    fig.suptitle(f"{arch(args, args.depths[0])}, {args.dataset}, {args.epochs} epochs at every batch size")
    _save_figure(fig, os.path.join(args.out, "sweep.png"))
