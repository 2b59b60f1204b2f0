"""The sweep's accuracy tables: SkipInit's Table 1 (best k of n per rate),
the converged protocol's held-out choice and finals, batch scaling, and the
Welch comparisons between methods at each cell's chosen rate."""


import numpy as np

from keras_skipinit.sweep.presets import METHOD_SETTINGS, PAPER_TABLE1
from keras_skipinit.sweep.protocol import (FINAL, SELECT, best_row, grid_edge, in_cell, lr_key, lr_label, summarize,
                                           trained, welch)

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
    borrowed = borrow(details, beside)
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


def borrow(details, beside):
    """Adds to `details` the cells of the `beside` sweeps at the depths this
    sweep has no cell at (the first sweep listed wins); returns {depth: sweep}."""
    own = {int(name.split("/depth")[1]) for name in details}
    borrowed = {}
    for sweep in beside:
        for depth in sorted(set(sweep["depths"]) - own - set(borrowed)):
            borrowed[depth] = sweep
            details.update({name: cell for name, cell in sweep["cells"].items() if name.endswith(f"/depth{depth}")})
    return borrowed


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
            accs = accuracies(final, args)
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
            accs = accuracies(final, args)
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


def accuracies(runs, args):
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
