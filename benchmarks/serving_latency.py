"""Inference latency at batch 1 and 32, measured interleaved: the exported
SavedModel (folded and unfolded), LiteRT (float and int8, XNNPACK with a
thread per core) and ONNX Runtime (float and int8) files of the same model
(`python -m export --format=...`), Keras `predict` and a direct call.

    python benchmarks/serving_latency.py
    python benchmarks/serving_latency.py --no_files      # without the [export] extra
"""

import argparse
import os
import tempfile

import _common
import keras
import numpy as np
import tensorflow as tf

from keras_skipinit import applications as apps
from keras_skipinit.serving import deploy, runtimes, savedmodel

MODELS = {
    "WRN-16-2 batchnorm": lambda: apps.WideResNet(16, 2, input_shape=(32, 32, 3), normalization="batchnorm"),
    "WRN-16-2 fixup": lambda: apps.WideResNet(16, 2, input_shape=(32, 32, 3), normalization="fixup"),
    "ResNet50V1 batchnorm 64px": lambda: apps.ResNet50V1(input_shape=(64, 64, 3), classes=10),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--no_files", action="store_true", help="SavedModel and Keras only (no LiteRT/ONNX runtimes)")
    args = p.parse_args()
    files = {} if args.no_files else {"litert float": ("litert", None), "litert int8": ("litert", "int8"),
                                      "onnx float": ("onnx", None), "onnx int8": ("onnx", "int8")}
    results, rows = {}, []
    base = tempfile.mkdtemp()
    for name, make in MODELS.items():
        model = make()
        size = model.input_shape[1:]
        x = np.random.default_rng(0).standard_normal((4,) + size).astype("float32")
        model(x, training=True)  # non-trivial BN statistics
        paths = {
            "saved_model folded": savedmodel.export(model, base, name.replace(" ", "_"), fold_layers=True),
            "saved_model unfolded": savedmodel.export(model, base, name.replace(" ", "_"), fold_layers=False),
        }
        sigs = {k: tf.saved_model.load(v).signatures["serving_default"] for k, v in paths.items()}
        calibration = np.random.default_rng(2).integers(0, 256, (16,) + size).astype("uint8")  # speed, not accuracy
        written = {how: deploy.export_file(model, fmt, os.path.join(base, f"{name}_{how}{deploy.FORMATS[fmt].suffix}".replace(" ", "_")),
                                           "standardize", quantize=q, calibration=calibration)
                   for how, (fmt, q) in files.items()}
        for batch in (1, 32):
            images = tf.constant(np.random.default_rng(1).integers(0, 256, (batch,) + size).astype("uint8"))
            floats = tf.image.per_image_standardization(images)
            fns = {
                "saved_model folded": lambda s=sigs["saved_model folded"]: s(images=images),
                "saved_model unfolded": lambda s=sigs["saved_model unfolded"]: s(images=images),
                "keras predict": lambda: model.predict(floats, verbose=0),
                "keras __call__": lambda: model(floats, training=False),
            }
            for how, path in written.items():
                fns[how] = _file_runner(path, images.numpy())
            for fn in fns.values():
                fn()  # warm-up / trace
            medians = _common.interleaved(fns, args.rounds, args.steps)
            for how, sec in medians.items():
                results[f"{name} | batch {batch} | {how}"] = {"latency_ms": 1000 * sec}
                rows.append((name, batch, how, f"{1000 * sec:.2f}", f"{medians['saved_model folded'] / sec:.2f}x"))
        keras.backend.clear_session()
    print(_common.table(("model", "batch", "runtime", "latency ms", "speed vs SavedModel folded"), rows))
    print(f"LiteRT: XNNPACK, {os.cpu_count()} threads; ONNX Runtime: CPU provider, default threads")
    print("wrote", _common.write("serving_latency", {"args": vars(args), "results": results}))


def _file_runner(path, images):
    """One call of a LiteRT or ONNX file on `images`, opened as predict and
    export's check open it (`runtimes.RUNTIMES`; a runner per batch size: no
    tensor resizing inside the timed calls)."""
    loaded = runtimes.RUNTIMES[runtimes.format_of(path)].open(path)
    return lambda: loaded.run(images)


if __name__ == "__main__":
    main()
