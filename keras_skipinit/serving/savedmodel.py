"""SavedModels for TensorFlow Serving, with inference-time folding.

`export()` writes ``<base_path>/<model_name>/<version>/`` (TF Serving's
layout) with two signatures and warm-up requests:

- ``serving_default``: ``images`` uint8 [batch, H, W, C] -> ``probabilities``
  float32 [batch, classes], ``top_k_classes`` int32 [batch, k],
  ``top_k_scores`` float32 [batch, k], and ``top_k_labels`` string [batch, k]
  where the class names are known (train.py records them). The evaluation preprocessing of
  training (per-image standardization, or ImageNet resize-256/center-crop-224
  and mean/std) runs inside the graph.
- ``predict_image_bytes``: ``image_bytes`` string [batch] (JPEG/PNG, base64
  in REST as ``{"b64": ...}``) -> the same outputs.
- ``assets.extra/tf_serving_warmup_requests``: one PredictionLog per
  signature, so the first real request does not pay for graph warm-up.

The served model is `inference.fold`'s (BN, SkipInit, Fixup and NF scales
folded into the convs) unless fold_layers=False.
"""

import contextlib
import os
import re
import shutil
import tempfile
import unicodedata

import keras
import numpy as np
import tensorflow as tf

from keras_skipinit import files
from keras_skipinit.data import preprocessing as preprocessing_lib
from keras_skipinit.serving import inference, publish
from keras_skipinit.training import model_files, run_dir

MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


# --- signatures --------------------------------------------------------------------


def _predictions(model, images, k, labels=None):
    """Probabilities and top-k for a preprocessed batch (with class names when
    `labels` are known); an empty batch gives empty outputs (TF's CPU
    convolutions reject a batch of 0)."""
    classes = model.output_shape[-1]

    values = tf.cond(tf.shape(images)[0] > 0, lambda: inference.probabilities(model, images),
                     lambda: tf.zeros([0, classes], tf.float32))
    values = tf.ensure_shape(values, [None, classes])
    scores, top = tf.math.top_k(values, k)
    outputs = {"probabilities": values, "top_k_classes": top, "top_k_scores": scores}
    if labels:
        outputs["top_k_labels"] = tf.gather(tf.constant(list(labels), tf.string), top)
    return outputs


def _checked(x, shape, first, message):
    """`x` where its dimensions from `first` on are `shape`, else an
    InvalidArgumentError whose message names the expected and the received
    size. The error comes from the data path (a cond), not from a separate
    assert that the runtime may schedule after the op that would fail first
    with its own words (map_fn's "Specified a list with shape [28,28,1] from
    a tensor with shape [32,32,1]")."""
    def wrong_size():  # the expected shape: a shape check after it cannot fail before the Assert
        with tf.control_dependencies([tf.debugging.Assert(False, [message, tf.shape(x)], summarize=8)]):
            return tf.zeros(tf.concat([tf.shape(x)[:first], shape], 0), x.dtype)

    fits = tf.reduce_all(tf.equal(tf.shape(x)[first:], shape))
    return tf.cond(fits, lambda: tf.identity(x), wrong_size)


def _serving_functions(model, preprocessing, top_k, labels=None):
    height, width, channels = model.input_shape[1:]
    prep = preprocessing_lib.get(preprocessing)
    if None in (height, width, channels):
        raise ValueError(f"the model needs a fixed input size to be served, has {model.input_shape}.")
    k = min(top_k, model.output_shape[-1])

    def outputs(images):
        batch = tf.map_fn(prep.eval, images, fn_output_signature=tf.float32)
        return _predictions(model, tf.ensure_shape(batch, [None, height, width, channels]), k, labels)

    # Images at the model's size, unless the preprocessing resizes them.
    image_shape = [None, height, width, channels] if prep.resize is None else [None, None, None, channels]

    def serve_images(images):
        if prep.resize is None:  # else any size: the preprocessing resizes
            images = tf.ensure_shape(_checked(images, [height, width, channels], 1,
                                              f"images must be [batch, {height}, {width}, {channels}] uint8; got "
                                              "[batch, height, width, channels] ="), [None, height, width, channels])
        return outputs(images)

    def decode(encoded):
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        if prep.resize is None:  # fully defined: map_fn stacks an empty batch's list by its element shape
            image = tf.ensure_shape(_checked(image, [height, width, channels], 0,
                                             f"image_bytes must decode to {height}x{width} images; got [height, "
                                             "width, channels] ="), [height, width, channels])
        return prep.eval(image)

    def serve_bytes(image_bytes):
        batch = tf.map_fn(decode, image_bytes, fn_output_signature=tf.TensorSpec([None, None, channels], tf.float32))
        return _predictions(model, tf.ensure_shape(batch, [None, height, width, channels]), k, labels)

    return (
        (serve_images, [tf.TensorSpec(image_shape, tf.uint8, name="images")]),
        (serve_bytes, [tf.TensorSpec([None], tf.string, name="image_bytes")]),
    )


# --- layout and warm-up ----------------------------------------------------------------


def next_version(model_base):
    versions = [int(d) for d in os.listdir(model_base) if d.isdigit()] if os.path.isdir(model_base) else []
    return max(versions, default=0) + 1


def _warmup_records(model, preprocessing, model_name):
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    height, width, channels = model.input_shape[1:]
    image = np.zeros((1, height, width, channels), np.uint8)
    image[:, height // 4 : 3 * height // 4, width // 4 : 3 * width // 4] = 200
    encoded = tf.io.encode_png(image[0]).numpy()
    for signature, name, value in (
        ("serving_default", "images", tf.make_tensor_proto(image)),
        ("predict_image_bytes", "image_bytes", tf.make_tensor_proto([encoded])),
    ):
        request = predict_pb2.PredictRequest(
            model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature)
        )
        request.inputs[name].CopyFrom(value)
        log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
        yield log.SerializeToString()


def export(model, base_path, model_name, version=None, overwrite=False, preprocessing=preprocessing_lib.STANDARDIZE,
           top_k=5, fold_layers=True, labels=None):
    """Writes a TF Serving SavedModel; returns its directory. With `labels`
    (class names by class index) the signatures also return top_k_labels, and
    assets.extra/labels.txt holds them all (one a line, as beside a .tflite)."""
    check_target(base_path, model_name)
    model_base = os.path.join(base_path, model_name)
    if version is None:
        version = next_version(model_base)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"version must be a positive integer, got {version!r}.")
    path = os.path.join(model_base, str(version))
    if os.path.exists(path) and not overwrite:
        raise ValueError(f"version {version} already exists at {path}; pass overwrite=True (--overwrite) to replace it.")
    served = inference.fold(model) if fold_layers else model
    archive = keras.export.ExportArchive()
    archive.track(served)
    (serve_images, image_spec), (serve_bytes, bytes_spec) = _serving_functions(served, preprocessing, top_k, labels)
    archive.add_endpoint("serving_default", serve_images, input_signature=image_spec)
    archive.add_endpoint("predict_image_bytes", serve_bytes, input_signature=bytes_spec)
    # Built beside the version (a name TF Serving ignores, one per export), then moved in: a version
    # directory appears complete or not at all, and one being replaced is served until the new one is whole.
    with files.new_folders(model_base), disk_errors(path):
        tmp = tempfile.mkdtemp(prefix=f".{version}.tmp-", dir=model_base)
        try:
            archive.write_out(tmp, verbose=False)
            os.makedirs(os.path.join(tmp, "assets.extra"), exist_ok=True)
            if labels:
                publish.write_labels(os.path.join(tmp, publish.SAVED_MODEL_LABELS), labels)
            with tf.io.TFRecordWriter(os.path.join(tmp, WARMUP_FILE)) as writer:
                for record in _warmup_records(served, preprocessing, model_name):
                    writer.write(record)
            _swap_in(tmp, path, overwrite)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


_CANNOT_WRITE = ("No space left on device", "Read-only file system", "Permission denied", "Disk quota exceeded")


@contextlib.contextmanager
def disk_errors(path):
    """A full disk or a filesystem gone read-only while writing `path`, from
    Python or from TensorFlow's C++ writers (an OpError there): one OSError
    of one line naming `path`."""
    try:
        yield
    except tf.errors.OpError as e:
        if not any(words in str(e) for words in _CANNOT_WRITE):
            raise
        raise OSError(f"cannot write {path}: {files.one_line(e)}") from None
    except OSError as e:
        raise OSError(f"cannot write {path}: {files.one_line(e)}") from None


def _swap_in(tmp, path, overwrite):
    """Renames `tmp` to `path`; an old `path` (with `overwrite`) is renamed
    aside first and removed after, so TF Serving loses the version for the
    time between two renames only. Refuses a `path` that appeared meanwhile
    (another export) without `overwrite`."""
    try:
        os.rename(tmp, path)  # fails where `path` is a version (made meanwhile by another export, or replaced)
        return
    except OSError:
        if not overwrite:
            raise ValueError(f"{path} was written by another export meanwhile; pass --overwrite to replace it") from None
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old-", dir=os.path.dirname(path))
    os.replace(path, os.path.join(old, "version"))
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def check_target(base_path, model_name, flag="--base_path"):
    """Validates where an export goes, before any work: `model_name` is one
    safe path component under `base_path` (named `flag` in messages), which
    is a directory or absent."""
    if not isinstance(model_name, str) or not MODEL_NAME.fullmatch(model_name):
        raise ValueError(
            "model_name must be one path component of letters, digits, '_', '-' and '.', not starting with '.' "
            f"or '-', got {model_name!r}."
        )
    if not base_path:
        raise ValueError(f"{flag} must name a directory, got an empty one")
    files.check_writable(base_path, flag)


def model_name_for(path):
    """A served model name from a file or directory name: characters other
    than letters, digits, '_', '-', '.' become '_' ('wrn16_lr=0.05' ->
    'wrn16_lr_0.05')."""
    base = os.path.basename(os.path.normpath(path))
    base = os.path.splitext(base)[0] if base.endswith(".keras") else base
    base = unicodedata.normalize("NFKD", base).encode("ascii", "ignore").decode()  # 'ünï2' -> 'uni2', not '_n_2'
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", base)
    return name if MODEL_NAME.fullmatch(name) else "model"


def load_source(source, preprocessing=None):
    """`model_files.load_source` of a model an export can serve (`check_exportable`)."""
    model, preprocessing, description = model_files.load_source(source, preprocessing)
    check_exportable(model, preprocessing, source)
    return model, preprocessing, description


def check_exportable(model, preprocessing, source):
    """One line, before any export work, for a model an export cannot serve:
    no classifier head (include_top=False, pyramid_outputs=True), or ImageNet
    preprocessing (resize 256, crop 224) on a model of another input size."""
    run_dir.check_classifier(model, source)
    size = preprocessing_lib.get(preprocessing).input_size
    if size is not None and tuple(model.input_shape[1:3]) != (size, size):
        raise ValueError(f"preprocessing={preprocessing} crops images to {size}x{size}; "
                         f"{source} takes {model.input_shape[1]}x{model.input_shape[2]}")
