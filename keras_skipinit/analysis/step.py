"""The one-step function change at initialization (Fixup §3): how far one
SGD step moves a network's output, per unit learning rate."""

import json
import math
import os

import keras
import numpy as np

from keras_skipinit import files
from keras_skipinit.analysis import propagation


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
    plt = propagation.pyplot()
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
    propagation.save_png(fig, path)
    return path
