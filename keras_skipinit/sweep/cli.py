"""The sweep's command line: `python -m keras_skipinit.sweep --help`."""

import math
import os
import sys

from keras_skipinit import files, normalization as norm_lib, spec
from keras_skipinit.cli import parsing
from keras_skipinit.sweep import factors, log, protocol, report, runner
from keras_skipinit.sweep.presets import METHOD_SETTINGS, PRESETS


def _halves(text):
    """Integers or halves (-4.5): octaves and half octaves."""
    expected = "whole or half octaves (e.g. -6,-4.5)"
    values = parsing.numbers(float, text, expected)
    if any(2 * v != int(2 * v) for v in values if math.isfinite(v)) or not all(map(math.isfinite, values)):
        raise ValueError(f"expected {expected}, got {text!r}")
    return [int(v) if v == int(v) else v for v in values]


def _finite(text):
    """A float flag's value: NaN and infinity are refused (NaN passes every comparison after)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {text!r}")
    return value


def _floats(text):
    return [_finite(v) for v in text.split(",")]


def _names(text):
    return [v for v in text.split(",") if v]


def _method_ints(text):
    try:
        values = {k: int(v) for k, v in (item.split("=") for item in text.split(",") if item)}
    except ValueError:
        raise ValueError(f"expected method=integer,..., got {text!r}") from None
    far = [f"{k}={v}" for k, v in values.items() if abs(v) > protocol.MAX_LOG2_LR]  # 2^5000: OverflowError (91.16)
    if far:
        raise ValueError(f"log2 rates lie in -{protocol.MAX_LOG2_LR}..{protocol.MAX_LOG2_LR}, got "
                                         f"{', '.join(far)}")
    return values


def build_parser():
    """The sweep's flags: its own, and train.py's settings it passes on (help, kinds, choices from `spec.Config`).
    No Keras is imported here: `parsing.preparse` answers --help and bad flags before it loads."""
    parser = parsing.Command("python -m keras_skipinit.sweep", "The papers' depth and batch-size experiments, run through training.train.")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="the paper's settings; other flags override them")
    parser.add_argument("--protocol", choices=("table1", "depth", "converged", "batch_scaling", protocol.EDGE,
                                               protocol.SURVIVAL),
                        default="table1", help="converged: choose each cell's lr on --validation_examples, then "
                        "--final_seeds runs; batch_scaling: the same over --batch_sizes; edge: each cell's largest "
                        "log2 rate where --best_k of --seeds runs train, searched an octave at a time; survival: "
                        "per rate the fraction of --seeds runs that train, with 95% intervals, and the rate where "
                        "half train")
    spec.add_arguments(parser, {"model": "wrn", "width": 1, "dataset": spec.EMBEDDED, "data_dir": None,
                                "manual_dir": None, "epochs": 3, "schedule": "cifar", "steps_per_epoch": None,
                                "batch_size": 32, "train_examples": None, "validation_examples": None,
                                **{option: None for option in norm_lib.OPTIONS},  # every method's options
                                "l2": None, "mixup_alpha": None,
                                "preprocessing": None, "xla": False, "loop_blocks": False, "checkpoint_steps": 0,
                                "eval_batch_size": None, "init_from": None, "freeze_backbone": False},
                       notes={"model": "One model per --out.", "validation_examples": "Runs that choose the lr do.",
                              "checkpoint_steps": "A run killed midway (a deep one: an hour) loses at most N steps; "
                              "not an experiment setting.", "eval_batch_size": "Not an experiment setting.",
                              "l2": "Default: train.py's.", "mixup_alpha": "Default: train.py's.",
                              "bn_momentum": "PyTorch's default: 0.9."})
    parser.add_argument("--depths", type=parsing.positive_ints, default=[16, 100])
    parser.add_argument("--batch_sizes", type=parsing.positive_ints, default=None,
                        help="batch sizes as a cell's axis (--protocol=batch_scaling); default: --batch_size")
    parser.add_argument("--micro_batch_size", type=int, default=None,
                        help="accumulate each batch from micro-batches of at most this size (SkipInit §3)")
    parser.add_argument("--methods", type=_names,
                        default=["batchnorm", "skipinit_one", "skipinit_inv_sqrt_d", "skipinit", "sqrt2", "none"])
    parser.add_argument("--log2_lrs", type=_halves, default=None,
                        help="learning rates 2^k (e.g. -6,-4,-2; half octaves: -4.5)")
    parser.add_argument("--lrs", type=_floats, default=None, help="learning rates as values (e.g. 0.1)")
    parser.add_argument("--extend_grid", action="boolean", default=False,
                        help="extend each cell's grid until its optimum is interior (within 2^-10..2^2)")
    parser.add_argument("--seeds", type=int, default=3, help="runs per learning rate (n)")
    parser.add_argument("--best_k", type=int, default=2, help="best k of n averaged (paper: 5 of 7)")
    parser.add_argument("--chance", type=_finite, default=None,
                        help="accuracy at or below this is a failed run (default: within 1 point of the dataset's "
                        "chance, 1 / its classes)")
    parser.add_argument("--chance_level", type=_finite, default=None,
                        help="chance accuracy, drawn in the plots (default: 1 / the dataset's classes)")
    parser.add_argument("--classes", type=int, default=None,
                        help="--protocol=survival: a run trained by loss ends below ln(classes) - 0.1 in training "
                        "cross-entropy (default: the dataset's classes; 10 where only TFDS knows them)")
    parser.add_argument("--final_seeds", type=int, default=0,
                        help="then train this many seeds at each cell's best lr on all training images (test set); "
                        "0 with a choosing protocol: choose only (a cell's rates can run as separate sweeps, whose "
                        "runs.jsonl lines merged into one --out let a call with --final_seeds run the final seeds)")
    parser.add_argument("--final_seed_start", type=int, default=0,
                        help="the final runs' first seed: --seeds or above makes them new draws; from 0 they repeat the "
                        "selection's seeds, which where both phases train on the same images (--train_examples below "
                        "the split) reruns the selection runs on the test set")
    parser.add_argument("--centre_log2_lrs", type=_method_ints, default={},
                        help="per-method grid centre, e.g. batchnorm=-3,skipinit=-5: that method tries 2^(c-1..c+1)")
    parser.add_argument("--chosen_log2_lrs", type=_method_ints, default={},
                        help="converged protocol: method=k,... skips that method's selection and runs its final seeds at 2^k")
    parser.add_argument("--mixed_precision", choices=("none", "float16", "bfloat16", "auto"), default="none",
                        help="auto: bfloat16 on a CPU with bfloat16 instructions, else float32 (none)")
    parser.add_argument("--out", default=None, help="runs.jsonl, table.md, summary.json, sweep.png (default: "
                        "runs/<--preset>, else runs/sweep: two presets copied without --out do not collide)")
    parser.add_argument("--runs_dir", default=None, help="model_dir of each run (default: runs/sweeps/<out's name>)")
    parser.add_argument("--report_only", action="boolean", help="write the tables and plot from runs.jsonl")
    parser.add_argument("--dry_run", action="boolean",
                        help="print the runs the sweep would start now and how many are left; run and write nothing")
    parser.add_argument("--beside", type=_names, default=[],
                        help="--protocol=edge or table1: other such sweeps' --out folders (their summary.json) whose "
                             "cells fill the depths this sweep did not run, in its table and plot (depth 1000 in its own "
                             "folder with fewer seeds)")
    parser.add_argument("--compare_to", default=None,
                        help="--protocol=survival: another survival sweep's --out (its summary.json): the table gives how "
                             "far this sweep's changed settings move each cell's half-train rate, with a 95% interval")
    parser.add_argument("--executor", choices=("sequential", "processes", "ray"), default="sequential",
                        help="sequential: each run in this process in turn; processes: each run a child process, "
                             "--processes at once (one GPU or many cores shared); ray: each run a Ray task "
                             "(pip install -e \".[ray]\")")
    parser.add_argument("--processes", type=int, default=2,
                        help="--executor=processes: runs at once on this machine (runs starting together split the free cores)")
    parser.add_argument("--ray_address", default=None,
                        help="a Ray cluster's address (ray start --head prints it); default: RAY_ADDRESS, else the "
                             "cluster `ray start` started on this machine, else a new local instance; local: always a new one")
    parser.add_argument("--cpus_per_run", type=_finite, default=1, help="Ray resources of each run")
    parser.add_argument("--gpus_per_run", type=_finite, default=0, help="Ray resources of each run (GPUs: --cpus_per_run too)")
    parser.add_argument("--max_retries", type=int, default=3,
                        help="Ray: times a run whose worker died is retried (it resumes from its checkpoint)")
    return parser


def parse_args(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv, defaults=lambda values: PRESETS[values["preset"]]() if values["preset"] else {})
    args.argv = argv
    if args.log2_lrs and max(abs(k) for k in args.log2_lrs) > protocol.MAX_LOG2_LR:
        parser.error(f"--log2_lrs must lie in -{protocol.MAX_LOG2_LR}..{protocol.MAX_LOG2_LR}")
    if args.lrs is None:
        args.lrs = [2.0**k for k in (args.log2_lrs or [-4, -3, -2])]
    if not all(2.0**-protocol.MAX_LOG2_LR <= lr <= 2.0**protocol.MAX_LOG2_LR for lr in args.lrs):
        parser.error(f"--lrs must lie in 2^-{protocol.MAX_LOG2_LR}..2^{protocol.MAX_LOG2_LR} (every rate is checked "
                     f"before the first run), got {args.lrs}")
    if args.protocol == protocol.SURVIVAL and args.extend_grid:
        parser.error("--protocol=survival runs its grid as given: no --extend_grid")
    for depth in args.depths:  # refused before Keras loads, not at its run (6-13 s after)
        error = spec.across_error({"model": args.model, "depth": depth, "dataset": None, "image_size": None,
                                   "channels": None})
        if error:
            parser.error(f"--depths: {error}")
    error = None if args.report_only else spec.across_error(  # a report reads runs only: its folder may be gone
        {"model": None, "depth": None, "dataset": args.dataset, "image_size": None, "channels": None,
         "init_from": args.init_from})
    if error:
        parser.error(error)
    _chance_from_the_data(parser, args)
    if args.classes < 2:
        parser.error("--classes must be at least 2")
    if not 0 <= args.chance < 1 or not 0 <= args.chance_level < 1:
        parser.error("--chance and --chance_level are accuracies: from 0 to below 1")
    args.batch_sizes = args.batch_sizes or [args.batch_size]
    unknown = [m for m in [*args.methods, *args.centre_log2_lrs, *args.chosen_log2_lrs] if m not in METHOD_SETTINGS]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; choose from {sorted(METHOD_SETTINGS)}")
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if not 1 <= args.best_k <= args.seeds:
        parser.error("--best_k must be between 1 and --seeds")
    if args.protocol in protocol.CHOOSING and not args.validation_examples:
        parser.error(f"--protocol={args.protocol} chooses on held-out images: it needs --validation_examples")
    if args.final_seeds < 0 or args.final_seed_start < 0:
        parser.error("--final_seeds and --final_seed_start must be >= 0")
    if min(args.batch_sizes) < 1 or (args.micro_batch_size is not None and args.micro_batch_size < 1):
        parser.error("--batch_sizes and --micro_batch_size must be positive")
    uneven = [b for b in args.batch_sizes if args.micro_batch_size and b > args.micro_batch_size
              and b % args.micro_batch_size]
    if uneven:
        parser.error(f"--batch_sizes {uneven} are not whole multiples of --micro_batch_size={args.micro_batch_size}")
    if args.cpus_per_run <= 0 or args.gpus_per_run < 0:
        parser.error("--cpus_per_run must be > 0 (0 would start every run at once) and --gpus_per_run >= 0")
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    if args.max_retries < 0:
        parser.error("--max_retries must be >= 0 (Ray reads -1 as retrying forever)")
    if (args.extend_grid or args.protocol == protocol.EDGE) and any(
            abs(math.log2(lr) - round(math.log2(lr))) > 1e-9 for lr in args.lrs):
        parser.error("--extend_grid and --protocol=edge need a log2 grid (--log2_lrs)")
    args.out = args.out or os.path.join("runs", args.preset or "sweep")  # issue 89.1: presets collided in runs/sweep
    args.runs_dir = args.runs_dir or os.path.join("runs", "sweeps", os.path.basename(os.path.normpath(args.out)))
    # Ray workers may run elsewhere (on storage every node reads), child processes start anew: absolute paths
    if args.executor != "sequential":
        args.runs_dir = os.path.abspath(args.runs_dir)
        args.data_dir = args.data_dir and os.path.abspath(args.data_dir)
        args.manual_dir = args.manual_dir and os.path.abspath(args.manual_dir)
    try:  # the pre-parse's call too: refused before Keras loads, not after it (seconds to a minute)
        files.check_writable(args.out, "--out")  # also --report_only (it writes the report) and --dry_run
        if not (args.report_only or args.dry_run):
            files.check_writable(args.runs_dir, "--runs_dir")
    except ValueError as e:
        parser.error(str(e))
    return args


def _known_classes(args):
    """The class count of the sweep's --dataset where it is known without
    loading it: a folder's class folders, the embedded digits, a dataset read
    from its original files; else None (a TFDS name: TFDS knows)."""
    from keras_skipinit import spec
    from keras_skipinit.data import image_folder, numpy_data
    name = args.dataset[: -len(spec.RGB32)] if args.dataset.endswith(spec.RGB32) else args.dataset
    if image_folder.looks_like_folder(args.dataset):
        return len(image_folder.layout(args.dataset, held_out=bool(args.validation_examples))[0]["train"])
    if name == spec.EMBEDDED:
        return 10
    return len(numpy_data.LABEL_NAMES[name]) if name in numpy_data.LABEL_NAMES else None


def _chance_from_the_data(parser, args):
    """--classes, --chance and --chance_level from the dataset's classes where
    not given, and a given one that contradicts them refused: on 3-class data
    the 10-class defaults counted runs at chance (33%) as trained (issue
    91.6)."""
    try:
        classes = _known_classes(args)
    except ValueError as e:  # a folder that is gone: a report still reads its runs
        if not args.report_only:
            parser.error(str(e))
        classes = None
    if classes is not None and args.classes not in (None, classes):
        parser.error(f"--classes={args.classes}, but --dataset={args.dataset} has {classes} classes")
    args.classes = args.classes or classes or 10
    if args.chance is not None and args.chance < 1 / args.classes:
        parser.error(f"--chance={args.chance:g} is below {args.classes}-class chance ({1 / args.classes:.3g}): "
                     "runs at chance would count as trained")
    args.chance = round(1 / args.classes + 0.01, 4) if args.chance is None else args.chance
    args.chance_level = 1 / args.classes if args.chance_level is None else args.chance_level


def quantization_parser():
    """`python -m keras_skipinit.sweep.quantization`'s flags (here, not there: the pre-parse imports no module
    that runpy then runs)."""
    parser = parsing.Command("python -m keras_skipinit.sweep.quantization", "The int8 study, step 2: every completed final run of a sweep's --out exported float32, float16 and "
                                 "int8 (LiteRT) and float32 and int8 (ONNX Runtime), each file's top-1 accuracy measured in its runtime.")
    parser.add_argument("--out", required=True, help="a sweep's --out (its runs.jsonl names the runs)")
    parser.add_argument("--check_images", type=parsing.positive_int, default=10000,
                        help="evaluation images each file is measured on")
    parser.add_argument("--calibration_images", type=parsing.positive_int, default=200,
                        help="training images that calibrate int8")
    parser.add_argument("--report_only", action="boolean", help="rewrite quantization.md from quantization.jsonl")
    return parser


def parse_quantization(argv=None):
    """The quantization step's flags, refused in one line where bad."""
    return quantization_parser().parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        report.load_beside(args.beside, args)  # refused before any run
        factors.load(args.compare_to, args)
        if args.dry_run:
            print(runner.plan(args))
            return
        if args.report_only:
            path = os.path.join(args.out, log.LOG)
            done = log.load(path)
            runner.check_same_experiment(args, done, path)
            runner.check_protocol(args, done, args.out)
            runs = list(done.values())
            if not runs:
                raise ValueError(f"no runs in {args.out} (no {os.path.join(args.out, 'runs.jsonl')} with results): "
                                 "run the sweep without --report_only first")
        else:
            runs = runner.run_sweep(args)
    except ValueError as e:
        print(f"python -m keras_skipinit.sweep: error: {e}", file=sys.stderr)
        sys.exit(2)
    except (runner.Interrupted, KeyboardInterrupt) as e:
        where = f" during run {e}" if isinstance(e, runner.Interrupted) else ""
        print(f"python -m keras_skipinit.sweep: interrupted{where}; run the same command to resume", file=sys.stderr)
        sys.exit(128 + getattr(e, "signal", 2))
    print(report.report(runs, args))

