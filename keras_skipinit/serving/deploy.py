"""Single-file exports for phones, browsers and other runtimes:
LiteRT (``.tflite``, run by ``ai_edge_litert``) and ONNX (``.onnx``, run by
``onnxruntime``), each checked against the Keras model before it counts.

Both files take the input of the SavedModel's ``serving_default``:
``images`` uint8 [batch, H, W, C], and return ``probabilities`` float32
[batch, classes]. The model is the one `inference.inference_model` makes (BN, SkipInit,
Fixup and NF scales folded into the convs; a looped model unrolled first);
the evaluation preprocessing runs inside, written as whole-batch built-in ops
(no per-image map, no cond, no assert), so the ``.tflite`` needs no Flex
delegate:

- ``standardize``: per-image standardization, (x - mean) / max(std, 1/sqrt(N)),
  N = H*W*C per image (tf.image.per_image_standardization's formula);
- ``imagenet``: the file takes 224x224 images (resize the shorter side to 256
  and center-crop 224 in the app, with the decoding) and normalizes them by
  the ImageNet channel mean and std inside.

``--quantize``: LiteRT float16 weights, or full-integer int8; ONNX int8 by
ONNX Runtime's static quantization; int8 is calibrated on training images.

`check` runs a written file in its runtime on real images and compares with
the Keras model: float exports must agree within `FLOAT_TOLERANCE` on every
probability; a quantized export reports its accuracy beside the float model's
instead. The optional packages: ``pip install -e ".[export]"``.
"""

import dataclasses
import json
import os
import shutil

import keras
import numpy as np
import tensorflow as tf

from keras_skipinit import files, spec
from keras_skipinit.cli import parsing, startup
from keras_skipinit.data import preprocessing as preprocessing_lib
from keras_skipinit.serving import inference, publish, runtimes, savedmodel

FLOAT_TOLERANCE = 1e-4  # maximum absolute difference of any probability, float exports
ONNX_OPSET = 17


def require(fmt):
    """What writing and checking `fmt` needs (its converter and its runtime),
    or a one-line ValueError saying what to install."""
    absent = runtimes.missing(FORMATS[fmt].modules + runtimes.RUNTIMES[fmt].modules)
    if absent:
        raise ValueError(f"--format={fmt} {absent}")


def exact_shape(x, height, width, channels):
    """`x` unchanged, by ops that fail on any other image shape than
    [batch, height, width, channels]. LiteRT's signature runner resizes the
    input to whatever it is given and the converter drops shape asserts, so
    without them a 28x28 model answers 32x32 or 1x1 images (global pooling).
    Built-in ops only, exact in float: `x * 0` broadcast to the image shape
    (each dimension the model's or 1), the images regrouped by the model's
    image size (the element count a multiple of it), and the two stacked
    (same batch). The converter cannot fold them away, as it folds a reshape
    to the shape it already knows."""
    size = [1, height, width, channels]
    regrouped = tf.reshape(tf.reshape(x, [-1, height * width * channels]), [-1, height, width, channels])
    return tf.reduce_sum(tf.stack([regrouped, x * tf.zeros(size, x.dtype)], axis=-1), axis=-1)


def _archive(model, preprocessing, directory):
    """A SavedModel of one endpoint, uint8 images -> probabilities, with the
    model's variables tracked (so the converters freeze them)."""
    height, width, channels = model.input_shape[1:]
    if None in (height, width, channels):
        raise ValueError(f"the model needs a fixed input size to be exported, has {model.input_shape}")
    savedmodel.check_exportable(model, preprocessing, f"model {model.name!r}")
    def serve(images):
        x = exact_shape(tf.cast(images, tf.float32), height, width, channels)
        return {"probabilities": inference.probabilities(model, preprocessing_lib.get(preprocessing).batch(x))}

    spec = tf.TensorSpec([None, height, width, channels], tf.uint8, name="images")
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", serve, input_signature=[spec])
    archive.write_out(directory, verbose=False)
    return serve, spec


# What the int8 calibrator prints (C++) on every conversion: "fully_quantize: 0, inference_type: 6,
# input_inference_type: FLOAT32, ..." reads as if the file were not int8 (it is: int8 inside, float at
# the boundary, as --quantize=int8 documents).
CONVERTER_NOISE = ("fully_quantize:",)


def _filtered_stderr(noise):
    """The block's fd-2 output (C++ too) without the lines that start with one of `noise`."""
    return startup.filtered_stderr(lambda line: line.startswith(noise))


def _litert_bytes(serve, spec, saved_model, quantize, calibration, labels):
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]  # no Flex delegate needed
    if quantize == "float16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif quantize == "int8":
        # Full-integer quantization calibrated on real training images; the input stays uint8 images.
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([calibration[i : i + 1]] for i in range(len(calibration)))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    try:
        with _filtered_stderr(CONVERTER_NOISE):
            return converter.convert()
    except Exception as e:  # the converter's errors name the op it cannot express
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        ops = [line for line in lines if "op" in line.lower() and ("not supported" in line or "failed" in line)]
        raise ValueError(f"LiteRT cannot express this model with built-in ops: {(ops or lines or [repr(e)])[0]}") from None


def export_file(model, fmt, path, preprocessing, quantize=None, calibration=None, labels=None, overwrite=False,
                check_on=None):
    """Writes `model` as one `fmt` file at `path` (and its class names at
    `publish.labels_path(path)` when `labels` are given); returns `path`.

    Everything is made in a staging folder beside `path` (same filesystem:
    the final moves are renames, so a kill or a full disk leaves no partial
    file at `path`). With `check_on` = (images, answers[, want]) the staged file
    is checked (`check`) before it replaces anything: a float file beyond the
    tolerance goes to `failed_path(path)` with its record, CheckFailed is
    raised and `path` stays as it was. Nothing is replaced unless
    `overwrite`, but a labels file that names the same classes is shared
    (m.tflite and m.onnx of one model); `publish.Stage` puts the file, its
    record and its labels in place as one unit. A full disk is an OSError, with
    nothing left behind."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {fmt!r}")
    require(fmt)
    offered = FORMATS[fmt].quantizations
    if quantize is not None and quantize not in offered:
        raise ValueError(f"--quantize={quantize} is not offered for --format={fmt} "
                         f"(offered: {', '.join(offered) or 'none'})")
    if quantize == "int8" and (calibration is None or not len(calibration)):
        raise ValueError("--quantize=int8 needs calibration images (the run's training split)")
    check_output(path, fmt, overwrite)
    suffixes = [f.suffix for f in FORMATS.values()]
    publish.check_labels(path, None if labels is None else publish.labels_text(labels), overwrite, suffixes)
    with files.new_folders(os.path.dirname(os.path.abspath(path))) as directory, \
            publish.Stage(directory, suffixes) as stage, savedmodel.disk_errors(path):
        staged = os.path.join(stage.path, os.path.basename(path))
        _convert(model, fmt, staged, preprocessing, quantize, calibration, labels, stage.path)
        if labels:
            publish.write_labels(publish.labels_path(staged), labels)
        if check_on is not None:
            images, answers, *want = check_on
            try:
                check(staged, model, images, answers, preprocessing, quantize, *want)
            except CheckFailed as e:
                stage.publish(staged, failed_path(path), overwrite=True)
                raise CheckFailed(str(e).replace(staged, failed_path(path)), e.report) from None
        stage.publish(staged, path, overwrite)
    return path


def _convert(model, fmt, staged, preprocessing, quantize, calibration, labels, work_dir):
    """The file's bytes, written (and synced) to `staged`; the SavedModel
    it is converted from is made in `work_dir` (the staging folder)."""
    saved_model = os.path.join(work_dir, "saved_model")
    try:
        serve, spec = _archive(inference.inference_model(model), preprocessing, saved_model)
        blob = FORMATS[fmt].convert(serve, spec, saved_model, quantize, calibration, labels)
    finally:
        shutil.rmtree(saved_model, ignore_errors=True)
    with open(staged, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    if quantize is not None and FORMATS[fmt].quantize_file is not None:
        os.replace(FORMATS[fmt].quantize_file(staged, quantize, calibration), staged)


def _onnx_bytes(serve, spec, saved_model, quantize, calibration, labels):
    import tf2onnx

    proto, _ = tf2onnx.convert.from_function(tf.function(serve), input_signature=[spec], opset=ONNX_OPSET)
    if labels:
        entry = proto.metadata_props.add()
        entry.key, entry.value = "labels", json.dumps(list(labels))
    return proto.SerializeToString()


def _onnx_int8(path, quantize, calibration):
    """ONNX Runtime's static quantization (QDQ, int8 weights per channel,
    uint8 activations) calibrated on real training images."""
    from onnxruntime import quantization as q

    class Images(q.CalibrationDataReader):
        def __init__(self):
            self.batches = iter(calibration[i : i + 1] for i in range(len(calibration)))

        def get_next(self):
            batch = next(self.batches, None)
            return None if batch is None else {"images": batch}

    out = path[: -len(".onnx")] + "_int8.onnx"
    # Its advice to run ONNX Runtime's shape pre-processing first, on every call: the file is checked instead.
    with parsing.dropped_log_messages("Please consider to run pre-processing", "Please consider pre-processing"):
        q.quantize_static(path, out, Images(), quant_format=q.QuantFormat.QDQ, per_channel=True,
                          activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8)
    return out


def check_output(path, fmt, overwrite):
    """Refuses a wrong suffix, a folder that cannot be written or made (a
    missing one is made by the export, and removed again if it fails), or an
    existing file without `overwrite` (its labels file: `_check_labels`, once
    the model's class names are known)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not path.endswith(FORMATS[fmt].suffix):
        raise ValueError(f"--output for --format={fmt} must end in {FORMATS[fmt].suffix}, got {path}")
    existing = files.check_writable(directory, "--output", path)  # named as given, not as its directory
    longest = os.path.basename(failed_path(path)) + ".check.json"  # the longest name an export writes there
    if len(longest.encode()) > os.pathconf(existing, "PC_NAME_MAX"):
        raise ValueError(f"--output's name is too long for its filesystem (the export writes {longest!r} beside it)")
    if os.path.exists(path) and not overwrite:
        raise ValueError(f"{path} exists; pass --overwrite to replace it")


def read_check(path):
    """The check record (`check`) of the file at `path`."""
    with open(path + ".check.json") as f:
        return json.load(f)


def failed_path(path):
    """Where a file that failed its check is kept: m.tflite -> m.check_failed.tflite."""
    return publish.stem(path) + ".check_failed" + os.path.splitext(path)[1]


@dataclasses.dataclass(frozen=True)
class Format:
    """A single-file export format: a new one is one `FORMATS` entry.

    - suffix (the runtime's), quantizations (offered with --quantize), modules (what converting
      needs installed besides its runtime, `runtimes.RUNTIMES`; each
      module's package: '_' -> '-');
    - convert(serve, spec, saved_model, quantize, calibration, labels) -> the
      file's bytes from the inference graph (a tf function and its input
      spec, also written as a SavedModel directory);
    - quantize_file(path, quantize, calibration) -> the path of a quantized
      copy, for formats quantized after conversion (else None);
    a written file runs in its runtime, `runtimes.RUNTIMES` (the same key).
    """

    suffix: str
    quantizations: tuple
    modules: tuple
    convert: object
    quantize_file: object


FORMATS = {
    "litert": Format(runtimes.RUNTIMES["litert"].suffix, spec.EXPORT_QUANTIZATIONS["litert"], (), _litert_bytes, None),
    "onnx": Format(runtimes.RUNTIMES["onnx"].suffix, spec.EXPORT_QUANTIZATIONS["onnx"], ("tf2onnx",), _onnx_bytes,
                   _onnx_int8),
}


def run_file(path, images, batch=64):
    """Probabilities of a written file in its runtime."""
    run = runtimes.open_file(path).run
    return np.concatenate([run(images[i : i + batch]) for i in range(0, len(images), batch)])


def keras_probabilities(model, images, preprocessing, batch=64):
    """The Keras model's probabilities with training's own evaluation preprocessing."""
    outputs = []
    for i in range(0, len(images), batch):
        x = preprocessing_lib.get(preprocessing).normalize(tf.constant(images[i : i + batch]))
        outputs.append(inference.probabilities(model, x).numpy())
    return np.concatenate(outputs)


class CheckFailed(ValueError):
    """A float export whose outputs differ from the Keras model's beyond the
    tolerance; `report` is its check record."""

    def __init__(self, message, report=None):
        super().__init__(message)
        self.report = report


def check(path, model, images, labels, preprocessing, quantize=None, want=None):
    """Runs the file on `images` (uint8) and compares with `model` (or with
    `want`, its probabilities on them, computed once for several files);
    writes `<path>.check.json` and returns it. A float export beyond
    FLOAT_TOLERANCE raises CheckFailed (the file and its report stay)."""
    if want is None:
        want = keras_probabilities(model, images, preprocessing)
    got = run_file(path, images)
    report = {
        "file": os.path.basename(path), "bytes": os.path.getsize(path), "quantize": quantize or "none",
        "preprocessing": preprocessing,  # what the app does before the file (predict reads it: the crop)
        "images": int(len(images)), "max_abs_diff": float(np.abs(got - want).max()),
        "top1_agreement": float(np.mean(got.argmax(1) == want.argmax(1))),
        "tolerance": None if quantize else FLOAT_TOLERANCE,
    }
    if labels is not None:
        report["keras_top1"] = float(np.mean(want.argmax(1) == labels))
        report["file_top1"] = float(np.mean(got.argmax(1) == labels))
    with open(path + ".check.json", "w") as f:
        json.dump(report, f, indent=1)
    if quantize is None and report["max_abs_diff"] > FLOAT_TOLERANCE:
        raise CheckFailed(f"{path}: probabilities differ from the Keras model's by {report['max_abs_diff']:.2e} "
                          f"(tolerance {FLOAT_TOLERANCE:g}) on {len(images)} images; see {path}.check.json", report)
    return report


def check_images_fit(model, images, dataset_name):
    """Refuses, before any conversion, check images of another shape than the model's input."""
    if tuple(images.shape[1:]) != tuple(model.input_shape[1:]):
        raise ValueError(f"{dataset_name}'s images are {'x'.join(map(str, images.shape[1:]))}, the model takes "
                         f"{'x'.join(map(str, model.input_shape[1:]))}: pass --dataset with images of its size")
