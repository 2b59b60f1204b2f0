"""Exported SavedModel latency at batch 1 and 32: folded vs unfolded export
vs Keras `predict` and a direct call, measured interleaved.

    python benchmarks/serving_latency.py
"""

import argparse
import tempfile

import _common
import keras
import numpy as np
import tensorflow as tf

from keras_skipinit import applications as apps, serving

MODELS = {
    "WRN-16-2 batchnorm": lambda: apps.WideResNet(16, 2, input_shape=(32, 32, 3), normalization="batchnorm"),
    "WRN-16-2 fixup": lambda: apps.WideResNet(16, 2, input_shape=(32, 32, 3), normalization="fixup"),
    "ResNet50V1 batchnorm 64px": lambda: apps.ResNet50V1(input_shape=(64, 64, 3), classes=10),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    results, rows = {}, []
    base = tempfile.mkdtemp()
    for name, make in MODELS.items():
        model = make()
        size = model.input_shape[1:]
        x = np.random.default_rng(0).standard_normal((4,) + size).astype("float32")
        model(x, training=True)  # non-trivial BN statistics
        paths = {
            "saved_model folded": serving.export(model, base, name.replace(" ", "_"), fold_layers=True),
            "saved_model unfolded": serving.export(model, base, name.replace(" ", "_"), fold_layers=False),
        }
        sigs = {k: tf.saved_model.load(v).signatures["serving_default"] for k, v in paths.items()}
        for batch in (1, 32):
            images = tf.constant(np.random.default_rng(1).integers(0, 256, (batch,) + size).astype("uint8"))
            floats = tf.image.per_image_standardization(images)
            fns = {
                "saved_model folded": lambda s=sigs["saved_model folded"]: s(images=images),
                "saved_model unfolded": lambda s=sigs["saved_model unfolded"]: s(images=images),
                "keras predict": lambda: model.predict(floats, verbose=0),
                "keras __call__": lambda: model(floats, training=False),
            }
            for fn in fns.values():
                fn()  # warm-up / trace
            medians = _common.interleaved(fns, args.rounds, args.steps)
            for how, sec in medians.items():
                results[f"{name} | batch {batch} | {how}"] = {"latency_ms": 1000 * sec}
                rows.append((name, batch, how, f"{1000 * sec:.2f}", f"{medians['saved_model unfolded'] / sec:.2f}x"))
        keras.backend.clear_session()
    print(_common.table(("model", "batch", "runtime", "latency ms", "speed vs unfolded"), rows))
    print("wrote", _common.write("serving_latency", {"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
