"""`python -m keras_skipinit.analysis`: signal-propagation plots of a model
or a toy net at initialization, or the one-step function change across
depths (`--function_change`); what each measures: `propagation`, `step`."""

import contextlib
import math
import os
import sys

import keras

from keras_skipinit.analysis import flags
from keras_skipinit.analysis.propagation import sample_inputs, block_statistics, real_digits, toy_resnet, write
from keras_skipinit.analysis.step import function_change, write_function_change


def main(argv=None):
    from keras_skipinit import applications
    parser = flags.build_parser()
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    if args.function_change:
        return _function_change_cli(args, parser)
    results = {}
    if args.toy:
        width = args.width if args.width > 1 else (100 if args.toy == "conv_relu_bn" else 1000)
        shape = (28, 28, 1) if args.toy == "conv_relu_bn" else (100,)
        inputs_kind = args.inputs if args.toy == "conv_relu_bn" else "gaussian"
        model = toy_resnet(args.toy, args.depth, width, shape, args.seed)
        results[args.toy] = block_statistics(model, sample_inputs(inputs_kind, shape, args.batch_size, args.seed))
        title = f"toy {args.toy}, {args.depth} blocks, width {width}"
        theory_kind = args.toy if args.toy != "conv_relu_bn" else None
    else:
        shape = (28, 28, 1) if args.inputs == "mnist_embedded" else (32, 32, 3)
        x = sample_inputs(args.inputs, shape, args.batch_size, args.seed)
        title = f"{args.model} depth {args.depth}, at initialization ({args.inputs})"
        with _kept_on_interrupt(args.out, "spp.*", results):
            for name in args.normalizations:
                if args.depth >= 500:  # silent for minutes otherwise (run_model.build_note's threshold)
                    print(f"{name}: building depth {args.depth} unrolled (minutes on a CPU)...", flush=True)
                kwargs = dict(input_shape=shape, normalization=name, seed=args.seed)
                try:
                    model = applications.build(args.model, args.depth, args.width if applications.architecture(args.model).takes_width else None,
                                               **kwargs)
                except ValueError as e:
                    parser.error(str(e))
                results[name] = block_statistics(model, x)
                write(results, args.out, title)  # each method's rows as they come: an interruption keeps them
                print(f"{name}: {len(results[name])} blocks measured", flush=True)
        print(f"wrote {os.path.join(args.out, 'spp.png')}, spp.csv, spp.json")
        return
    path = write(results, args.out, title, theory_kind)
    print(f"wrote {path}, spp.csv, spp.json")


@contextlib.contextmanager
def _kept_on_interrupt(out, what, results):
    """Ctrl-C during a long analysis (an unrolled depth-1000 net builds for
    minutes per method): one line naming what `out`'s files already hold
    (rewritten, atomically, after each measurement: also what a SIGTERM
    leaves), exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        done = [name if isinstance(rows, list) else f"{name} at depth {', '.join(map(str, rows))}"
                for name, rows in results.items() if rows]  # rows: spp's list, or function change's {depth: value}
        held = f"{os.path.join(out, what)} hold {', '.join(done)}" if done else "nothing was written"
        print(f"\npython -m keras_skipinit.analysis: interrupted; {held} (run the command again for the rest)",
              file=sys.stderr)
        sys.exit(130)


def _function_change_cli(args, parser):
    from keras_skipinit import applications
    from keras_skipinit.cli import parsing
    names = args.normalizations
    args.lr = flags.FUNCTION_CHANGE_LR if args.lr is None else args.lr
    args.depths = args.depths or list(flags.FUNCTION_CHANGE_DEPTHS)
    if args.lr <= 0:
        parser.error("--lr must be > 0")
    x, y = real_digits(args.batch_size, args.seed, with_labels=True)
    results = {name: {} for name in names}
    title = (f"{args.model} width {args.width}: one SGD step at lr {args.lr:g} at init, "
             f"{args.batch_size} real digits (Fixup §3)")
    with _kept_on_interrupt(args.out, "function_change.*", results):
        for depth in args.depths:
            for name in names:
                if depth >= 500:  # looped, yet ~1 min of build and step on a CPU without a line (issue 89.5)
                    print(f"{name} depth {depth}: building and taking the step (a minute or more on a CPU)...",
                          flush=True)
                try:
                    model = applications.build(args.model, depth, args.width, input_shape=x.shape[1:], normalization=name,
                                               seed=args.seed, classifier_activation=None, dropout=0.0,
                                               loop_blocks=depth >= 1000)
                except ValueError as e:
                    parser.error(str(e))
                with parsing.dropped_log_messages("triggered tf.function retracing", logger="tensorflow"):  # a new model each
                    results[name][depth] = function_change(model, x, y, args.lr)
                path = write_function_change({k: rows for k, rows in results.items() if rows}, args.out, title)
                change = results[name][depth]
                print(f"{name} depth {depth}: ||f(theta - lr g) - f(theta)|| / lr = {change:.4g} "
                      f"(logits per unit learning rate, RMS over {len(x)} images)" + (
                          "" if math.isfinite(change) else ": not finite, the logits or the step overflow float32 "
                          "at init (no normalization keeps the signal's growth in check: null in the JSON, left out "
                          "of the plot)"), flush=True)
                keras.backend.clear_session()
    print(f"wrote {path}, function_change.json")
