"""The sweep's report from its runs: table.md, summary.json and the plots
(sweep.png, curves.png), per protocol."""

import json
import os

from keras_skipinit import files
from keras_skipinit.sweep import factors, failure_tables, log, plots, tables
from keras_skipinit.sweep.plots import arch
from keras_skipinit.sweep.protocol import EDGE, EXPERIMENT, FINAL, SURVIVAL, run_ident


def protocol_batch(run):
    return run_ident(run)[2]


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
        table, details = tables.batch_scaling_table(runs, args)
        text = (f"{arch(args, args.depths[0])}, {args.dataset}, {args.epochs} epochs at every batch size; learning rate "
                f"chosen on {args.validation_examples} training images held out, then {_finals(args)} (test accuracy, "
                f"final training cross-entropy without L2: mean ± std)\n\n"
                f"{table}\n" + tables.batch_comparisons(runs, args))
        plots.plot_batch_scaling(details, args)
    elif args.protocol == "converged":
        table, details = tables.converged_table(runs, args)
        then = (f"then {_finals(args)}, test accuracy mean ± std" if args.final_seeds
                else "no final runs (--final_seeds=0: choosing only)")
        text = (f"{arch(args)}, {args.epochs} epochs; learning rate chosen on {args.validation_examples} "
                f"training images held out (best {args.best_k} of {args.seeds} per lr), {then}\n\n{table}\n"
                + tables.comparisons(runs, args, "validation", finals=args.final_seeds > 0))
        plots.plot_curves([r for r in runs if r.get("phase") == FINAL], args, "test")
    elif args.protocol == EDGE:
        text, details, borrowed = failure_tables.edge_table(runs, args, load_beside(args.beside, args))
        plots.plot_edges(details, args, borrowed)
    elif args.protocol == SURVIVAL:
        compared = factors.load(args.compare_to, args)
        text, details = failure_tables.survival_table(runs, args, compared)
        plots.plot_survival(details, args, compared)
    elif args.protocol == "table1":
        split = log.eval_split(runs, args.validation_examples)
        accuracy, cross_entropy, grid, details, borrowed = tables.table1_tables(runs, args, load_beside(args.beside, args), split)
        text = (f"{split.capitalize()} accuracy, best {args.best_k} of {args.seeds} (— in a cell: every run of that cell failed)\n\n{accuracy}\n\n"
                f"Training cross-entropy (no L2 term), best {args.best_k} of {args.seeds}\n\n{cross_entropy}\n\n"
                f"Learning-rate grid per cell\n\n{grid}\n" + tables.comparisons(runs, args, split))
        plots.plot_table1(details, args, borrowed, split)
    else:
        table, details = failure_tables.depth_table(runs, args)
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
