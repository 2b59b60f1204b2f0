"""The sweep's tables of where training fails: Fixup Fig. 3's trained runs
by depth, the stability edge (the lowest rate at which half the runs fail)
and survival by rate, each with its interval."""

import math

import numpy as np

from keras_skipinit.sweep import factors
from keras_skipinit.sweep.plots import arch
from keras_skipinit.sweep.presets import METHOD_SETTINGS
from keras_skipinit.sweep.protocol import (LOSS_MARGIN, SELECT, fisher_less, half_rates, in_cell, log2_label, lr_label,
                                           stability_edge, summarize, survival, trained, wilson)
from keras_skipinit.sweep.tables import NOT_RUN, accuracies, borrow


def depth_table(runs, args):
    """Fixup Fig. 3 as a table: mean ± std test accuracy over all seeds, and
    how many runs trained (beat chance)."""
    lines = ["| method | " + " | ".join(f"depth {d}" for d in args.depths) + " |", "|---|" + "---|" * len(args.depths)]
    details = {}
    for key in args.methods:
        cells = []
        for depth in args.depths:
            subset = in_cell(runs, (key, depth, args.batch_sizes[0]))
            if not subset:
                cells.append(NOT_RUN)
                continue
            accs = accuracies(subset, args)
            n_trained = sum(trained(r, args.chance) for r in subset)
            diverged = sum(r["status"] == "diverged" for r in subset)
            cells.append(f"{100 * np.mean(accs):.1f} ± {100 * np.std(accs):.1f} ({n_trained}/{len(subset)} trained"
                         + (f", {diverged} diverged" if diverged else "") + ")")
            details[f"{key}/depth{depth}"] = {"mean": float(np.mean(accs)), "std": float(np.std(accs)),
                                              "trained": n_trained, "diverged": diverged, "runs": len(subset),
                                              "test_top1": [r["test_top1"] for r in subset]}
        lines.append(f"| {METHOD_SETTINGS[key][0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + _trained_compared(details, args), details


def _trained_compared(details, args):
    """The depth table's trained fractions with 95% Wilson intervals, per
    depth and over all depths, and against the first method's (one-sided
    Fisher exact p: does the method train less often?)."""
    first = next((key for key in args.methods if any(f"{key}/depth{d}" in details for d in args.depths)), None)

    def pooled(cells):
        return {"trained": sum(c["trained"] for c in cells), "runs": sum(c["runs"] for c in cells)}

    lines = []
    for key in args.methods:
        rows = [(str(d), details[f"{key}/depth{d}"], details.get(f"{first}/depth{d}")) for d in args.depths
                if f"{key}/depth{d}" in details]
        if len(rows) > 1:
            refs = [ref for _, _, ref in rows]
            rows.append(("all", pooled([cell for _, cell, _ in rows]), None if None in refs else pooled(refs)))
        for name, cell, ref in rows:
            k, n = cell["trained"], cell["runs"]
            p = "—" if key == first or ref is None else f"{fisher_less(k, n, ref['trained'], ref['runs']):.3g}"
            lines.append(f"| {METHOD_SETTINGS[key][0]} | {name} | {k}/{n} | {_percent(wilson(k, n))} | {p} |")
    if not lines:
        return ""
    return (f"\n\nRuns that trained (above {100 * args.chance:g}% without diverging), with 95% Wilson intervals; p: "
            f"one-sided Fisher exact test that the method trains less often than {METHOD_SETTINGS[first][0]} at the "
            "same depths\n\n| method | depth | trained | 95% interval | p |\n|---|---|---|---|---|\n"
            + "\n".join(lines))


def edge_table(runs, args, beside=()):
    """The stability edge per method and depth, as table.md's
    text: the largest log2 rate where best_k of n seeds trained, the count
    there and one octave above it; details hold every rate tried. `beside`
    (`load_beside`): other edge sweeps, whose cells fill the depths this one
    did not run (returned as borrowed: {depth: sweep})."""
    details = {}
    for key in args.methods:
        for depth in args.depths:
            subset = in_cell(runs, (key, depth, args.batch_sizes[0]), SELECT)
            if subset:
                details[f"{key}/depth{depth}"] = _edge_cell(summarize(subset, args.best_k, args.chance)[1])
    borrowed = borrow(details, beside)
    columns = {**{d: f"depth {d}" for d in args.depths},
               **{d: f"depth {d} ({s['best_k']} of {s['seeds']}: {s['out']}/)" for d, s in borrowed.items()}}
    depths = sorted(columns)
    lines = ["| method | " + " | ".join(columns[d] for d in depths) + " |", "|---|" + "---|" * len(depths)]
    for key in args.methods:
        cells = [_edge_text(details[f"{key}/depth{d}"]) if f"{key}/depth{d}" in details else NOT_RUN for d in depths]
        lines.append(f"| {METHOD_SETTINGS[key][0]} | " + " | ".join(cells) + " |")
    return (f"Stability edge: counting up from the smallest learning rate at which {args.best_k} of {args.seeds} seeds "
            f"trained (finite loss, accuracy above {100 * args.chance:g}%), the last before the first at which fewer "
            f"did; {arch(args)}, batch {args.batch_sizes[0]}, {args.epochs} "
            "epoch(s); in brackets the seeds that trained there and one octave above\n\n" + "\n".join(lines) + "\n",
            details, borrowed)


def _edge_cell(rows):
    """A cell's edge (`stability_edge`), whether its search is done, and the
    seeds that trained and ran per log2 rate."""
    edge, step = stability_edge(rows)
    return {"edge_log2": edge, "bracketed": step is None,
            "trained": {str(k): v for k, v in sorted((round(math.log2(r["lr"])), r["runs"] - r["failed"]) for r in rows)},
            "runs": {str(k): v for k, v in sorted((round(math.log2(r["lr"])), r["runs"]) for r in rows)}}


def _edge_text(cell):
    trained, runs_at = ({int(k): v for k, v in cell[part].items()} for part in ("trained", "runs"))
    edge = cell["edge_log2"]
    if edge is None:
        return f"none >= 2^{min(trained)}" + ("" if cell["bracketed"] else " (searching)")
    above = (f"2^{edge + 1}: {trained[edge + 1]}/{runs_at[edge + 1]}" if edge + 1 in trained
             else "the paper's bound" if cell["bracketed"] else "searching")
    return f"2^{edge} ({trained[edge]}/{runs_at[edge]} trained; {above})"


def survival_table(runs, args, compared=None):
    """Per method, depth and rate: the fraction of seeds that trained, by
    accuracy and by accuracy and training loss, with 95% Wilson intervals;
    per cell the log2 rate where half train (`protocol.half_rates`); with
    `compared` (`factors.load`), the factor's shifts (`factors.table`)."""
    limit = math.log(args.classes) - LOSS_MARGIN
    lines = ["| method | depth | rate | trained (acc.) | 95% interval | trained (acc. and loss) | 95% interval |",
             "|---|---|---|---|---|---|---|"]
    halves = ["| method | depth | half train at (acc.) | 95% interval | half train at (acc. and loss) | 95% interval |",
              "|---|---|---|---|---|---|"]
    details = {}
    for key in args.methods:
        for depth in args.depths:
            subset = in_cell(runs, (key, depth, args.batch_sizes[0]), SELECT)
            if not subset:
                continue
            rows = survival(subset, args.chance, limit)
            for r in rows:
                lines.append(f"| {METHOD_SETTINGS[key][0]} | {depth} | {lr_label(r['lr'])} | {r['trained']}/{r['runs']} | "
                             f"{_percent(r['interval'])} | {r['trained_by_loss']}/{r['runs']} | "
                             f"{_percent(r['interval_by_loss'])} |")
            accuracy, loss = half_rates(rows), half_rates(rows, by_loss=True)
            halves.append(f"| {METHOD_SETTINGS[key][0]} | {depth} | {log2_label(accuracy[0])} | {_span(accuracy)} | "
                          f"{log2_label(loss[0])} | {_span(loss)} |")
            details[f"{key}/depth{depth}"] = {"rates": rows, "half_log2": list(accuracy), "half_log2_by_loss": list(loss)}
    text = (f"Survival: per learning rate, the runs that trained of {args.seeds} seeds: by accuracy (finite loss, test "
            f"accuracy above {100 * args.chance:g}%), and by accuracy and loss (also a final training cross-entropy "
            f"below ln {args.classes} - {LOSS_MARGIN:g} = {limit:.3f}); 95% Wilson intervals; {arch(args)}, batch "
            f"{args.batch_sizes[0]}, {args.epochs} epoch(s)\n\n" + "\n".join(lines) +
            "\n\nThe log2 rate where half the seeds train (linear between grid points; its interval: the same "
            "crossing of the intervals' bounds; beyond the grid: —)\n\n" + "\n".join(halves) + "\n")
    if len(details) > 1:
        text += "\n" + factors.between_methods(details, args.methods, args.depths)
    if compared:
        text += "\n" + factors.table(details, compared)
    return text, details


def _percent(interval):
    return f"{100 * interval[0]:.0f}-{100 * interval[1]:.0f}%"


def _span(half):
    _, low, high = half
    return f"{log2_label(low)} .. {log2_label(high)}"
