"""The budget figure (budget.png): per method and depth, the best learning rate
and the stability edge against the number of updates, from the committed
sweeps' summary.json files (docs/skipinit_table1 and docs/stability_edge at
150 updates, docs/survival's half-train rate at depth 16, and every
docs/budget/updates*/ folder). Rerun after a folder gains runs:

    python docs/budget/figure.py

It prints the points it draws. The best rate is the best 2 of 3 seeds' mean
(2 of 2 at depth 1000; `protocol.best_row`; on held-out images where the
sweep chose so); the edge the largest rate where 2 of 3 trained (2 of 2 at
depth 1000; `protocol.stability_edge`),
drawn as a lower bound where nothing above it failed yet. A cell of fewer
than 3 rates (a grid not yet run) or with a rate still missing seeds (fewer
than its sweep's --seeds) is left out (said)."""

import glob
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from keras_skipinit.sweep import plots, protocol  # noqa: E402 (the checkout's package, not an installed one)
from keras_skipinit.sweep.presets import METHOD_SETTINGS  # noqa: E402

METHODS, UPDATES_PER_EPOCH = ("skipinit", "batchnorm"), 150  # 9,600 images at batch 64


def _cells(path):
    with open(os.path.join(ROOT, path, "summary.json")) as f:
        summary = json.load(f)
    return summary["settings"], summary["cells"]


def points():
    """[(method, depth, updates, what, log2 rate, note)]: what is 'best', 'edge' (bracketed), 'edge >=' (a
    lower bound) or 'half' (the survival half-train rate by accuracy and loss; note: its 95% interval, a bound None
    beyond the grid)."""
    found = []
    folders = ["docs/skipinit_table1",  # its summary holds depth 1000's cells too (--beside)
               *sorted(os.path.relpath(os.path.dirname(p), ROOT)  # a cell in progress has runs, no summary yet
                       for p in glob.glob(os.path.join(HERE, "updates*", "summary.json")))]
    for folder in folders:
        settings, cells = _cells(folder)
        updates = settings["epochs"] * UPDATES_PER_EPOCH
        for name, cell in cells.items():
            method, depth = name.split("/depth")
            if method not in METHODS:
                continue
            chosen_on = "validation" if "validation_top1" in cell else "test"  # the converged protocol: held out
            rows = cell[f"{chosen_on}_top1"]
            seeds = {r["runs"] for r in rows}  # skipinit_table1's depth 1000 runs 2 seeds a rate throughout: complete
            if len(rows) < 3 or len(seeds) > 1 or (folder != "docs/skipinit_table1" and seeds != {settings["seeds"]}):
                print(f"{folder}: {name} is in progress (fewer than 3 rates, or a rate with fewer than "
                      f"{settings['seeds']} seeds): not drawn")
                continue
            best = protocol.best_row(rows)
            if best:
                found.append((method, int(depth), updates, "best", math.log2(best["lr"]),
                              f"{100 * best['mean']:.1f}% ({chosen_on})"))
            if not folder.startswith("docs/skipinit_table1"):  # at 150 updates: the edge study's own search
                edge, next_rate = protocol.stability_edge(rows)
                if edge is not None:
                    found.append((method, int(depth), updates, "edge >=" if next_rate is not None else "edge", edge, folder))
    _, cells = _cells("docs/stability_edge")
    for name, cell in cells.items():
        method, depth = name.split("/depth")
        if method in METHODS and cell["edge_log2"] is not None:
            top = cell["edge_log2"] == protocol.PAPER_LOG2_RANGE[1]  # trained at the paper's bound: searched no higher
            found.append((method, int(depth), UPDATES_PER_EPOCH, "edge >=" if top else "edge", cell["edge_log2"],
                          "docs/stability_edge"))
    _, cells = _cells("docs/survival")
    for name, cell in cells.items():
        method, depth = name.split("/depth")
        half, low, high = cell["half_log2_by_loss"]
        if method in METHODS and half is not None:
            found.append((method, int(depth), UPDATES_PER_EPOCH, "half", half, (low, high)))
    return sorted(found)


def draw(found, path):
    plt = plots._plt()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    depths = sorted({p[1] for p in found})
    # Hollow edges first, the best rate on top: where the best rate is the edge, the circle shows inside the square.
    styles = {"edge": dict(marker="s", mfc="none", ms=8), "edge >=": dict(marker="^", mfc="none", ms=8),
              "best": dict(marker="o", ms=6)}
    for i, method in enumerate(METHODS):
        for j, depth in enumerate(depths):
            # Depths side by side at one budget, and within a depth the methods: where both choose one rate, both show.
            shift = 2 ** (0.25 * (j - (len(depths) - 1) / 2) + 0.12 * (i - (len(METHODS) - 1) / 2))
            color, dash = f"C{i}", ("-", "--", ":")[j % 3]
            for what, style in styles.items():
                mine = sorted((p[2], p[4]) for p in found if p[:2] == (method, depth) and p[3] == what)
                if mine:
                    ax.plot([u * shift for u, _ in mine], [r for _, r in mine], color=color, ls=dash if what == "best" else "none",
                            label=f"{METHOD_SETTINGS[method][0]}, depth {depth}" if what == "best" else None, **style)
            for p in found:
                if p[:2] == (method, depth) and p[3] == "half":
                    low, high = p[5]
                    ax.errorbar([p[2] * shift * 1.04], [p[4]],
                                yerr=None if None in (low, high) else [[p[4] - low], [high - p[4]]],
                                fmt="D", color=color, mfc="white", ms=5, capsize=3)
    ax.set_xscale("log", base=2)
    budgets = [150, 600, 2400]  # 2,400: the longest budget, drawn where its points will go
    ax.set_xticks(budgets, [str(u) for u in budgets])
    ax.set_xlim(100, 3600)
    ax.set_xlabel("updates (batch 64, 9,600 Fashion-MNIST images, the cifar schedule's shape)")
    ax.set_ylabel("log2 learning rate")
    ax.set_title("Best rate (filled, best 2 of 3 seeds) and stability edge (square: largest rate where 2 of 3 train;\n"
                 "triangle: nothing above it failed yet; diamond: survival half-train rate, 95% interval), WRN-d-1;\n"
                 "depth 1000: 2 seeds a rate, best 2 of 2, edge where 2 of 2 train",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    plots._save_figure(fig, path)


def main(path=os.path.join(HERE, "budget.png")):
    found = points()
    for method, depth, updates, what, rate, note in found:
        if what == "half":
            note = "95% " + " .. ".join("beyond the grid" if v is None else f"2^{v:.2f}" for v in note)
        print(f"{METHOD_SETTINGS[method][0]:22} depth {depth:5} {updates:5} updates  {what:8} 2^{rate:.2f}  {note}")
    draw(found, path)
    return found


if __name__ == "__main__":
    main()
