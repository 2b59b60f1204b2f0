"""The sweep's report from its runs: table.md, summary.json and the plots
(sweep.png, curves.png), per protocol."""

import json
import math
import os

import numpy as np

from keras_skipinit import files
from keras_skipinit.sweep import factors, log, plots
from keras_skipinit.sweep.plots import arch
from keras_skipinit.sweep.presets import METHOD_SETTINGS, PAPER_TABLE1
from keras_skipinit.sweep.protocol import (EDGE, EXPERIMENT, FINAL, LOSS_MARGIN, SELECT, SURVIVAL, best_row,
                                           fisher_less, grid_edge, half_rates, in_cell, log2_label, lr_key, lr_label,
                                           run_ident, stability_edge, summarize, survival, trained, welch, wilson)


def protocol_batch(run):
    return run_ident(run)[2]

NOT_RUN = "not run"


def _cell(best, fmt):
    if best == NOT_RUN:
        return NOT_RUN
    if best is None:
        return "—"
    return f"{fmt(best['mean'])} ± {fmt(best['std'])} ({lr_label(best['lr'])})"


def table1_tables(runs, args, beside=(), split="test"):
    """SkipInit Table 1 (test accuracy) and App. D Table 3 (training loss),
    and a per-cell account of the learning-rate grid; `beside`
    (`load_beside`): other table1 sweeps, whose cells fill the depths this
    one did not run (depth 1000's 2 of 2 seeds in their own --out)."""
    details = {}
    for key in args.methods:
        for depth in args.depths:
            subset = in_cell(runs, (key, depth, args.batch_sizes[0]))
            if subset:
                best, rows = summarize(subset, args.best_k, args.chance)
                ce_rows = summarize(subset, args.best_k, args.chance, "train_cross_entropy", lower_is_better=True)[1]
                details[f"{key}/depth{depth}"] = {"test_top1": rows, "train_cross_entropy": ce_rows,
                                                  "optimum": grid_edge(best, rows) if best else "all failed"}
    borrowed = _borrow(details, beside)
    depths = sorted(set(args.depths) | set(borrowed))
    heads = {d: f"depth {d}" + (f" (best {borrowed[d]['best_k']} of {borrowed[d]['seeds']}: {borrowed[d]['out']}/)"
                                 if d in borrowed else "") for d in depths}
    acc_lines = ["| method | " + " | ".join(f"{heads[d]}: {split} acc. % (lr)" for d in depths) + " |"]
    ce_lines = ["| method | " + " | ".join(f"{heads[d]}: train cross-entropy (lr)" for d in depths) + " |"]
    acc_lines.append("|---|" + "---|" * len(depths))
    ce_lines.append(acc_lines[1])
    grid = ["| method | depth | learning rates tried | best (acc.) | optimum | failed runs / runs |", "|---|---|---|---|---|---|"]
    for key in args.methods:
        accs, ces = [], []
        for depth in depths:
            cell = details.get(f"{key}/depth{depth}")
            if cell is None:
                accs.append(NOT_RUN), ces.append(NOT_RUN)
                continue
            rows = cell["test_top1"]
            best = best_row(rows)
            best_ce = best_row(cell["train_cross_entropy"], lower_is_better=True) if best else None  # as the paper
            accs.append(_cell(best, lambda v: f"{100 * v:.1f}"))
            ces.append(_cell(best_ce, lambda v: f"{v:.3f}"))
            tried = sorted(r["lr"] for r in rows)
            grid.append(
                f"| {METHOD_SETTINGS[key][0]} | {depth} | {lr_label(tried[0])} .. {lr_label(tried[-1])} ({len(tried)}) | "
                f"{lr_label(best['lr']) if best else '—'} | {cell['optimum']} | "
                f"{sum(r['failed'] for r in rows)} / {sum(r['runs'] for r in rows)} |"
            )
        acc_lines.append(f"| {METHOD_SETTINGS[key][0]} | " + " | ".join(accs) + " |")
        ce_lines.append(f"| {METHOD_SETTINGS[key][0]} | " + " | ".join(ces) + " |")
    return "\n".join(acc_lines), "\n".join(ce_lines), "\n".join(grid), details, borrowed


def comparisons(runs, args, split, finals=False):
    """Rates and methods compared, where the tables give only each side's
    best k of n: per cell, its best rate against every other rate tried
    (the selection runs, on `split`); per depth, the first method against
    each other at their best rates (`finals`: their final runs, on the test
    set). The difference of mean accuracy in points over each side's
    trained runs, with Welch's 95% interval (`protocol.welch`). A section
    of table.md, or "" where nothing compares (one rate, one method)."""
    rows = []
    for depth in args.depths:
        at_best = {}
        for key in args.methods:
            cell = (key, depth, args.batch_sizes[0])
            selection = in_cell(runs, cell, SELECT)
            best = summarize(selection, args.best_k, args.chance)[0] if selection else None
            if best is None:
                continue
            by_rate = {}
            for run in selection:
                by_rate.setdefault(lr_key(run["lr"]), []).append(run)
            name, chosen = METHOD_SETTINGS[key][0], by_rate[best["lr"]]
            for lr, other in sorted(by_rate.items()):
                if lr != best["lr"]:
                    rows.append(_compared(f"{name}: {lr_label(best['lr'])} − {lr_label(lr)}", depth,
                                          f"{split}, every seed", chosen, other, args.chance))
            at_best[key] = (f"{name} ({lr_label(best['lr'])})", in_cell(runs, cell, FINAL) if finals else chosen)
        on = "test, final seeds" if finals else f"{split}, every seed"
        (label, first_runs), *others = at_best.values() or [(None, [])]
        for other_label, other_runs in others:
            if first_runs and other_runs:
                rows.append(_compared(f"{label} − {other_label}", depth, on, first_runs, other_runs, args.chance))
    if not rows:
        return ""
    return ("\nRates and methods compared: the difference of mean accuracy over each side's trained runs, with "
            "Welch's 95% interval (—: fewer than 2 trained runs a side); trained: runs that trained / runs, per "
            "side\n\n| compared | depth | on | difference (points) | 95% interval | trained |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


def _compared(label, where, on, runs_a, runs_b, chance, value=lambda r: 100 * r["test_top1"], digits=1):
    """One row of `comparisons`: `value` (test accuracy in points unless
    given) of side a minus side b over each side's trained runs."""
    a, b = ([value(r) for r in side if trained(r, chance)] for side in (runs_a, runs_b))
    interval = welch(a, b)
    if interval is not None:
        difference, span = f"{interval[0]:+.{digits}f}", f"{interval[1]:+.{digits}f} .. {interval[2]:+.{digits}f}"
    else:
        difference, span = (f"{np.mean(a) - np.mean(b):+.{digits}f}" if a and b else "—"), "—"
    return (f"| {label} | {where} | {on} | {difference} | {span} | "
            f"{len(a)}/{len(runs_a)}, {len(b)}/{len(runs_b)} |")


def batch_comparisons(runs, args):
    """SkipInit Fig. 3's claims compare methods at each batch size: the first
    method minus each other at their chosen rates, over the final runs'
    test accuracy (points) and final training cross-entropy (Fig. 3(b)),
    with Welch's 95% interval. A section of table.md, or "" (one method)."""
    rows, depth = [], args.depths[0]
    (first, *others) = args.methods
    for batch in args.batch_sizes:
        a = in_cell(runs, (first, depth, batch), FINAL)
        for key in others:
            b = in_cell(runs, (key, depth, batch), FINAL)
            if a and b:
                label = f"{METHOD_SETTINGS[first][0]} − {METHOD_SETTINGS[key][0]}"
                rows.append(_compared(label, batch, "test accuracy (points)", a, b, args.chance))
                rows.append(_compared(label, batch, "training cross-entropy", a, b, args.chance,
                                      lambda r: r["train_cross_entropy"], digits=2))
    if not rows:
        return ""
    return ("\nMethods compared at each batch size (final runs at each method's chosen rate): the difference of "
            "means over each side's trained runs, with Welch's 95% interval (—: fewer than 2 trained runs a side); "
            "trained: runs that trained / runs, per side\n\n| compared | batch | on | difference | 95% interval "
            "| trained |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


def _borrow(details, beside):
    """Adds to `details` the cells of the `beside` sweeps at the depths this
    sweep has no cell at (the first sweep listed wins); returns {depth: sweep}."""
    own = {int(name.split("/depth")[1]) for name in details}
    borrowed = {}
    for sweep in beside:
        for depth in sorted(set(sweep["depths"]) - own - set(borrowed)):
            borrowed[depth] = sweep
            details.update({name: cell for name, cell in sweep["cells"].items() if name.endswith(f"/depth{depth}")})
    return borrowed


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
            accs = _accuracies(subset, args)
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
    borrowed = _borrow(details, beside)
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


def load_beside(folders, args):
    """--beside: each folder's sweep as its summary.json recorded it (depths,
    best_k of seeds, cells), for one table and plot across sweeps (depth
    1000 runs fewer seeds in its own --out). Edge and table1 sweeps only; a
    folder whose settings differ from this sweep's (`EXPERIMENT`) is refused."""
    if folders and args.protocol not in (EDGE, "table1"):
        raise ValueError(f"--beside: only --protocol={EDGE} and table1 sweeps show other sweeps' depths, "
                         f"not --protocol={args.protocol}")
    sweeps = []
    for folder in folders:
        settings, cells = log.read_summary(folder, "--beside")
        if not {"depths", "best_k", "seeds"} <= set(settings):
            raise ValueError(f"--beside: {os.path.join(folder, 'summary.json')} is not a sweep's summary.json (no "
                             "settings with depths, best_k and seeds); write it with that sweep's --report_only")
        # Its depths, seeds and methods may differ; a setting newer than its summary is not compared.
        differ = [f"--{k}={settings.get(k)} there, {getattr(args, k)} here"
                  for k in ("protocol", "batch_sizes", "micro_batch_size", "chance", *EXPERIMENT)
                  if hasattr(args, k) and k in settings and settings[k] != getattr(args, k)]
        if differ:
            raise ValueError(f"--beside: {folder} is another experiment ({'; '.join(differ)})")
        sweeps.append({"out": os.path.basename(os.path.normpath(folder)), "depths": settings["depths"],
                       "best_k": settings["best_k"], "seeds": settings["seeds"], "cells": cells})
    return sweeps


def converged_table(runs, args):
    """Converged Table 1: per cell, the learning rate chosen on the
    validation split and the test accuracy of the final runs at it (mean ±
    std over all seeds), beside the paper's CIFAR-10 figure."""
    lines = ["| method | depth | lr chosen (validation acc. % per lr, best k of n) | test acc. % (final runs) "
             "| paper, CIFAR-10 WRN-n-2 | precision (selection; final) |", "|---|---|---|---|---|---|"]
    details = {}
    for key in args.methods:
        for depth in args.depths:
            selection = in_cell(runs, (key, depth, args.batch_sizes[0]), SELECT)
            final = in_cell(runs, (key, depth, args.batch_sizes[0]), FINAL)
            if not selection and not final:
                continue
            best, rows = summarize(selection, args.best_k, args.chance) if selection else (None, [])
            accs = _accuracies(final, args)
            trained = sum(r["status"] == "completed" and r["test_top1"] > args.chance for r in final)
            test = (f"{100 * np.mean(accs):.1f} ± {100 * np.std(accs):.1f} ({trained}/{len(final)} trained)"
                    if final else NOT_RUN)
            paper = PAPER_TABLE1.get((key, depth))
            if not selection:
                chosen = f"{lr_label(final[0]['lr'])} (given, --chosen_log2_lrs)"
            else:
                chosen = _chosen(best, rows)
            lines.append(f"| {METHOD_SETTINGS[key][0]} | {depth} | {chosen} | {test} | "
                         f"{'—' if paper is None else f'{paper:.1f}'} | "
                         f"{_precisions(selection) or '—'}; {_precisions(final) or '—'} |")
            details[f"{key}/depth{depth}"] = {"validation_top1": rows, "lr": final[0]["lr"] if final else best and best["lr"],
                                              "test_top1": [r["test_top1"] for r in final],
                                              "mean": float(np.mean(accs)) if final else None,
                                              "std": float(np.std(accs)) if final else None, "paper": paper}
    return "\n".join(lines), details


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


def _accuracies(runs, args):
    """Each run's evaluation accuracy, a failed (diverged) run counted at chance."""
    return [r["test_top1"] if r["status"] == "completed" else args.chance_level for r in runs]


def _chosen(best, rows):
    """The chosen rate and where it sits in its grid, then every rate's score:
    '2^-4 (interior); 2^-5: 91.1, 2^-4: 91.4, ...'."""
    tried = ", ".join(f"{lr_label(r['lr'])}: " + ("—" if r["mean"] is None else f"{100 * r['mean']:.1f}") for r in rows)
    return (f"{lr_label(best['lr'])} ({grid_edge(best, rows)})" if best else "— (all failed)") + f"; {tried}"


def _precisions(runs):
    """The precisions `runs` trained in, e.g. 'bfloat16 x2, float32 x1'."""
    counts = {}
    for run in runs:
        precision = run.get("results", {}).get("config", {}).get("mixed_precision", "none")  # train.py's values
        name = "float32" if precision == "none" else precision
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))


def batch_scaling_table(runs, args):
    """SkipInit Fig. 3 as a table: per (method, batch size) the rate chosen on
    the validation split, the rates that failed (diverged or at chance), and
    the final runs' test accuracy and training cross-entropy (no L2 term),
    mean ± std over seeds."""
    lines = ["| method | batch (micro-batch x steps) | lr chosen (validation acc. % per lr) | failed lrs "
             "| test acc. % (final runs) | train cross-entropy (final runs) | lowest-loss lr |",
             "|---|---|---|---|---|---|---|"]
    details = {}
    depth = args.depths[0]
    for key in args.methods:
        for batch in args.batch_sizes:
            cell = (key, depth, batch)
            selection, final = in_cell(runs, cell, SELECT), in_cell(runs, cell, FINAL)
            if not selection and not final:
                continue
            best, rows = summarize(selection, args.best_k, args.chance) if selection else (None, [])
            best_ce, ce_rows = (summarize(selection, args.best_k, args.chance, "train_cross_entropy", lower_is_better=True)
                                if selection else (None, []))
            failed = [r["lr"] for r in rows if r["mean"] is None]
            trained = [r["lr"] for r in rows if r["mean"] is not None]
            accs = _accuracies(final, args)
            ces = [r["train_cross_entropy"] for r in final if r["status"] == "completed"]
            micro = (selection or final)[0].get("accumulation_steps", 1)
            lines.append(
                f"| {METHOD_SETTINGS[key][0]} | {batch} ({batch // micro} x {micro}) | {_chosen(best, rows)} | "
                f"{', '.join(lr_label(lr) for lr in failed) or '—'} | "
                + (f"{100 * np.mean(accs):.1f} ± {100 * np.std(accs):.1f} ({len(final)} seeds)" if final else NOT_RUN)
                + " | " + (f"{np.mean(ces):.3f} ± {np.std(ces):.3f}" if ces else NOT_RUN)
                + f" | {lr_label(best_ce['lr']) if best_ce else '—'} |")
            details[f"{key}/batch{batch}"] = {
                "batch_size": batch, "accumulation_steps": micro, "validation_top1": rows,
                "train_cross_entropy": ce_rows, "lr": best and best["lr"], "lr_lowest_loss": best_ce and best_ce["lr"],
                "failed_lrs": failed, "trained_lrs": trained, "test_top1": [r["test_top1"] for r in final],
                "final_train_cross_entropy": [r["train_cross_entropy"] for r in final],
                "mean": float(np.mean(accs)) if final else None, "std": float(np.std(accs)) if final else None,
                "ce_mean": float(np.mean(ces)) if ces else None, "ce_std": float(np.std(ces)) if ces else None}
    return "\n".join(lines), details


def _finals(args):
    """The choosing protocols' final runs in words: how many seeds, which
    (where --final_seed_start moves them) and on which images."""
    numbered = (f" ({args.final_seed_start}-{args.final_seed_start + args.final_seeds - 1})"
                if args.final_seed_start else "")
    images = f"the same {args.train_examples} training images" if args.train_examples else "the full training set"
    return f"{args.final_seeds} seeds{numbered} on {images}"


def report(runs, args):
    runs = [r for r in runs if r["method"] in args.methods and r["depth"] in args.depths
            and protocol_batch(r) in args.batch_sizes]
    if args.protocol == "batch_scaling":
        table, details = batch_scaling_table(runs, args)
        text = (f"{arch(args, args.depths[0])}, {args.dataset}, {args.epochs} epochs at every batch size; learning rate "
                f"chosen on {args.validation_examples} training images held out, then {_finals(args)} (test accuracy, "
                f"final training cross-entropy without L2: mean ± std)\n\n"
                f"{table}\n" + batch_comparisons(runs, args))
        plots.plot_batch_scaling(details, args)
    elif args.protocol == "converged":
        table, details = converged_table(runs, args)
        then = (f"then {_finals(args)}, test accuracy mean ± std" if args.final_seeds
                else "no final runs (--final_seeds=0: choosing only)")
        text = (f"{arch(args)}, {args.epochs} epochs; learning rate chosen on {args.validation_examples} "
                f"training images held out (best {args.best_k} of {args.seeds} per lr), {then}\n\n{table}\n"
                + comparisons(runs, args, "validation", finals=args.final_seeds > 0))
        plots.plot_curves([r for r in runs if r.get("phase") == FINAL], args, "test")
    elif args.protocol == EDGE:
        text, details, borrowed = edge_table(runs, args, load_beside(args.beside, args))
        plots.plot_edges(details, args, borrowed)
    elif args.protocol == SURVIVAL:
        compared = factors.load(args.compare_to, args)
        text, details = survival_table(runs, args, compared)
        plots.plot_survival(details, args, compared)
    elif args.protocol == "table1":
        split = log.eval_split(runs, args.validation_examples)
        accuracy, cross_entropy, grid, details, borrowed = table1_tables(runs, args, load_beside(args.beside, args), split)
        text = (f"{split.capitalize()} accuracy, best {args.best_k} of {args.seeds} (— in a cell: every run of that cell failed)\n\n{accuracy}\n\n"
                f"Training cross-entropy (no L2 term), best {args.best_k} of {args.seeds}\n\n{cross_entropy}\n\n"
                f"Learning-rate grid per cell\n\n{grid}\n" + comparisons(runs, args, split))
        plots.plot_table1(details, args, borrowed, split)
    else:
        table, details = depth_table(runs, args)
        split = log.eval_split(runs, args.validation_examples)
        text = f"{split.capitalize()} accuracy after {args.epochs} epoch(s), mean ± std over {args.seeds} seeds\n\n{table}\n"
        plots.plot_depth(details, args)
        if args.epochs > 1:
            plots.plot_curves(runs, args, split)
    files.write_if_changed(os.path.join(args.out, "table.md"), text.encode())
    seconds = sum(r["wall_time_s"] or 0 for r in runs)
    command = " ".join(a for a in args.argv if a != "--report_only")  # the command that runs (or resumes) it
    summary = {"command": "python -m keras_skipinit.sweep " + command, "settings": _settings(args),
               "machines": sorted({r.get("machine", "?") for r in runs}), "runs": len(runs),
               "run_time_s": seconds, "cells": details}
    path, content = os.path.join(args.out, "summary.json"), json.dumps(files.strict_json(summary), indent=1)
    data = ("machines", "runs", "run_time_s", "cells")  # not the command and settings a later version words otherwise
    old, new = (files.read_json(path) if os.path.exists(path) else {}), json.loads(content)
    if any(old.get(k) != new[k] for k in data):
        files.write_if_changed(path, content.encode())
    return text


def _settings(args):
    return {k: v for k, v in vars(args).items() if k not in ("argv", "out", "runs_dir")}
