import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import run_cli_cases
from keras_skipinit import applications as apps, layers as ks_layers
from keras_skipinit.data import preprocessing
from keras_skipinit.serving import inference, savedmodel
from keras_skipinit.training import model_files, trainer
from keras_skipinit.training.checkpoint import Checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RNG = np.random.default_rng(0)


def perturbed(model, x):
    """Move every weight away from its init (BN statistics included), so a
    fold that dropped or misplaced any parameter changes the output."""
    model(x, training=True)
    for w in model.weights:
        w.assign(w.numpy() + RNG.normal(0, 0.05, w.shape).astype(w.dtype))
    return model


@pytest.mark.parametrize(
    "make",
    [
        lambda: apps.WideResNet(10, 1, normalization="skipinit", seed=1),
        lambda: apps.ResNet50V1(input_shape=(48, 48, 3), classes=7, normalization="batchnorm", seed=1),
    ],
    ids=["wrn-skipinit", "v1-bn"],
)
def test_folding_removes_the_affine_layers(make):
    """Equality of every family x normalization: test_models."""
    model = make()
    x = RNG.standard_normal((4,) + model.input_shape[1:]).astype("float32")
    perturbed(model, x)
    folded = inference.fold(model)
    # Tolerance: float32 reassociation of (W*s) x vs s*(W x), relative 1e-5.
    np.testing.assert_allclose(folded(x), model(x), rtol=1e-4, atol=1e-6)
    left = [layer for layer in folded.layers if isinstance(layer, keras.layers.BatchNormalization)]
    if model.name.endswith("v1"):
        assert not left  # every V1 BN follows a conv
    # Every SkipInit alpha / Fixup multiplier ends a branch right after a conv.
    for layer in model.layers:
        if isinstance(layer, ks_layers.SkipInitScale):
            assert isinstance(folded.get_layer(layer.name), inference.FoldedAway), layer.name


def test_fixup_input_bias_folds_only_into_1x1_convs():
    model = perturbed(apps.ResNet50V1(input_shape=(48, 48, 3), classes=5, normalization="fixup", seed=0),
                      RNG.standard_normal((2, 48, 48, 3)).astype("float32"))
    folded = inference.fold(model)
    assert isinstance(folded.get_layer("conv2_block1_1_conv_bias"), inference.FoldedAway)  # 1x1
    assert isinstance(folded.get_layer("conv2_block1_2_conv_bias"), keras.layers.Layer)
    assert not isinstance(folded.get_layer("conv2_block1_2_conv_bias"), inference.FoldedAway)  # 3x3: kept


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("serving")
    keras.utils.set_random_seed(0)
    model = apps.WideResNet(10, 1, input_shape=(28, 28, 1), normalization="batchnorm", seed=3)
    perturbed(model, RNG.standard_normal((8, 28, 28, 1)).astype("float32"))
    path = savedmodel.export(model, str(base), "wrn")
    images = RNG.integers(0, 256, (3, 28, 28, 1)).astype("uint8")
    expected = np.asarray(model(tf.image.per_image_standardization(images), training=False))
    return base, path, model, images, expected


@pytest.mark.heavy
def test_layout_versions_and_overwrite(exported, tmp_path):
    base, path, model, _, _ = exported
    assert path == os.path.join(str(base), "wrn", "1")
    assert os.path.exists(os.path.join(path, "saved_model.pb"))
    second = savedmodel.export(model, str(base), "wrn")
    assert second.endswith(os.path.join("wrn", "2"))
    with pytest.raises(ValueError, match="already exists"):
        savedmodel.export(model, str(base), "wrn", version=1)
    again = savedmodel.export(model, str(base), "wrn", version=2, overwrite=True)
    assert again == second
    with pytest.raises(ValueError, match="model_name"):
        savedmodel.export(model, str(base), "bad/name")


@pytest.mark.heavy
def test_an_export_killed_while_overwriting_leaves_the_old_version_served(exported, tmp_path, monkeypatch):
    """Issue 45.4: the new version is built beside the old one and swapped in;
    a failure (or kill) while building leaves the old version whole."""
    _, _, model, _, _ = exported
    base = tmp_path / "serving"
    path = savedmodel.export(model, str(base), "wrn", version=1)
    before = sorted(os.listdir(path))

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(savedmodel, "_warmup_records", killed)
    with pytest.raises(KeyboardInterrupt):
        savedmodel.export(model, str(base), "wrn", version=1, overwrite=True)
    assert sorted(os.listdir(path)) == before and os.listdir(base / "wrn") == ["1"]


def test_warmup_requests(exported):
    from tensorflow_serving.apis import prediction_log_pb2

    _, path, _, _, _ = exported
    records = list(tf.data.TFRecordDataset(os.path.join(path, savedmodel.WARMUP_FILE)).as_numpy_iterator())
    logs = [prediction_log_pb2.PredictionLog.FromString(r) for r in records]
    assert [log.predict_log.request.model_spec.signature_name for log in logs] == [
        "serving_default",
        "predict_image_bytes",
    ]
    image = tf.make_ndarray(logs[0].predict_log.request.inputs["images"])
    assert image.dtype == np.uint8 and image.shape == (1, 28, 28, 1)


CHECK_SCRIPT = r"""
import json, sys
sys.modules["keras_skipinit"] = None  # the SavedModel must not need this package
import numpy as np, tensorflow as tf
images_path, paths = sys.argv[1], sys.argv[2:]
images = np.load(images_path)
png = [tf.io.encode_png(i).numpy() for i in images]
outs = []
for path in paths:
    out = {}
    loaded = tf.saved_model.load(path)
    out["tf2_images"] = loaded.signatures["serving_default"](images=tf.constant(images))["probabilities"].numpy().tolist()
    r = loaded.signatures["predict_image_bytes"](image_bytes=tf.constant(png))
    out["tf2_bytes"] = r["probabilities"].numpy().tolist()
    out["tf2_top"] = r["top_k_classes"].numpy().tolist()
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:   # how the C++ model server loads it
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], path)
        for name, feed in (("serving_default", images), ("predict_image_bytes", np.array(png, dtype=object))):
            sig = meta.signature_def[name]
            (inp,) = sig.inputs.values()
            out["tf1_" + name] = sess.run(sig.outputs["probabilities"].name, {inp.name: feed}).tolist()
    outs.append(out)
print(json.dumps(outs))
"""


def serve_without_the_package(images, paths, folder):
    """CHECK_SCRIPT in a new process: each SavedModel's outputs on `images`
    through TF2's loader and TF1's Session (TF Serving's way)."""
    np.save(os.path.join(folder, "images.npy"), images)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, os.path.join(folder, "images.npy"), *paths],
                          capture_output=True, text=True, timeout=300, env=env, cwd=str(folder))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.heavy
def test_signatures_without_the_package_tf2_and_tf1(exported, tmp_path):
    _, path, _, images, expected = exported
    (out,) = serve_without_the_package(images, [path], tmp_path)
    # Tolerance: folded vs unfolded float32 graphs, 1e-5 absolute on probabilities.
    for key in ("tf2_images", "tf2_bytes", "tf1_serving_default", "tf1_predict_image_bytes"):
        np.testing.assert_allclose(out[key], expected, atol=1e-5, err_msg=key)
    np.testing.assert_array_equal(np.array(out["tf2_top"])[:, 0], expected.argmax(-1))


@pytest.mark.heavy
def test_saved_model_cli_lists_the_signatures(exported):
    _, path, _, _, _ = exported
    # TensorFlow's own console script, next to this interpreter (the venv may not be on PATH)
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    proc = subprocess.run([cli if os.path.exists(cli) else "saved_model_cli", "show", "--all", "--dir", path], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    for text in ("signature_def['serving_default']", "signature_def['predict_image_bytes']", "DT_UINT8", "DT_STRING",
                 "top_k_classes"):
        assert text in proc.stdout


def test_bad_inputs_fail_clearly(exported):
    _, path, _, _, _ = exported
    loaded = tf.saved_model.load(path)
    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError)):
        loaded.signatures["serving_default"](images=tf.zeros((1, 28, 28, 1), tf.float32))
    # The message names the expected and the received size (it was map_fn's "Specified a list with shape").
    for shape in ((1, 32, 32, 1), (2, 28, 28, 3)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"must be \[batch, 28, 28, 1\] uint8; got .*\] \["
                           + " ".join(map(str, shape)) + r"\]"):
            loaded.signatures["serving_default"](images=tf.zeros(shape, tf.uint8))
    wrong = tf.io.encode_png(tf.zeros((30, 30, 1), tf.uint8))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"must decode to 28x28 images; got .*\] \[30 30 1\]"):
        loaded.signatures["predict_image_bytes"](image_bytes=tf.stack([wrong]))


def run_export(*flags):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "export", *flags], capture_output=True, text=True, timeout=300,
                          env=env, cwd=ROOT)


@pytest.mark.heavy
def test_cli_errors_are_one_line(tmp_path):
    """Exit status 2, one line, no traceback; unsafe model names are refused
    before the model is loaded (the source does not exist, and that is not what is said)."""
    corrupt = tmp_path / "corrupt.keras"
    corrupt.write_bytes(b"not a zip file")
    serving_dir = tmp_path / "serving"
    headless, small = tmp_path / "headless.keras", tmp_path / "small.keras"
    apps.WideResNet(10, 1, input_shape=(28, 28, 1), include_top=False, seed=0).save(headless)
    pooled = tmp_path / "pooled.keras"  # [batch, features]: two axes, yet no class scores (issue 91.10)
    apps.WideResNet(10, 1, input_shape=(28, 28, 1), include_top=False, pooling="avg", seed=0).save(pooled)
    apps.WideResNet(10, 1, input_shape=(28, 28, 1), seed=0).save(small)
    cases = [(["--source=/nonexistent.keras", f"--base_path={tmp_path}"], "no such model"),
             ([f"--source={corrupt}", f"--base_path={tmp_path}"], "not a .keras file"),
             ([f"--source={small}", f"--base_path={serving_dir}", "--model_name=.."], "one path component"),
             ([f"--source={small}", f"--base_path={serving_dir}", "--model_name="], "one path component"),
             # issue 46.3: a model without a classifier head, ImageNet preprocessing on a 28x28 model, a flag
             # of the other kind of export (each was a traceback after the work, or silently ignored)
             ([f"--source={headless}", f"--base_path={serving_dir}", "--preprocessing=standardize"],
              "features, not class scores; it needs a classifier head"),
             ([f"--source={pooled}", f"--base_path={serving_dir}", "--preprocessing=standardize"],
              "by its GlobalAveragePooling2D layer"),
             ([f"--source={small}", f"--base_path={serving_dir}", "--preprocessing=imagenet"],
              "crops images to 224x224"),
             ([f"--source={small}", f"--base_path={serving_dir}", "--dataset=mnist_embedded"],
              "--dataset: for --format=litert|onnx only")]
    for (flags, words), (status, _, err) in zip(cases, run_cli_cases("export", [c for c, _ in cases], ROOT)):
        assert status == 2 and "Traceback" not in err and words in err, (flags, err[-1000:])
    assert not os.path.exists(serving_dir) and not os.path.exists(tmp_path / "1")


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "-x", ".hidden"])
def test_model_names_must_be_one_safe_path_component(name, tmp_path):
    with pytest.raises(ValueError, match="one path component"):
        savedmodel.check_target(str(tmp_path), name)
    assert savedmodel.model_name_for("runs/wrn16_lr=0.05/") == "wrn16_lr_0.05"
    assert savedmodel.model_name_for("models/wrn.keras") == "wrn"
    assert savedmodel.model_name_for("runs/ünï2") == "uni2"  # not '_n_2', which 'ênê2' also became


def test_empty_batches_give_empty_outputs(exported):
    _, path, model, _, _ = exported
    loaded = tf.saved_model.load(path)
    classes = model.output_shape[-1]
    for name, arg in (("serving_default", dict(images=tf.zeros((0, 28, 28, 1), tf.uint8))),
                      ("predict_image_bytes", dict(image_bytes=tf.zeros((0,), tf.string)))):
        out = loaded.signatures[name](**arg)
        assert out["probabilities"].shape == (0, classes) and out["top_k_classes"].shape == (0, 5), name


@pytest.mark.heavy
@pytest.mark.parametrize("name,size,image_shape", [("imagenet", 224, (300, 260, 3)),
                                                   ("mnist_embedded_mean_std", 28, (28, 28, 1))])
def test_preprocessing_travels_inside_the_keras_file(name, size, image_shape, tmp_path):
    """A model is served with the preprocessing it was trained with, read from
    the .keras file: ImageNet-style (resize-256, center-crop 224, mean/std)
    or a dataset's per-channel mean/std (its statistics in the graph)."""
    model = apps.WideResNet(10, 1, input_shape=(size, size, image_shape[-1]), classes=4, normalization="skipinit",
                            alpha_init="one", seed=0)  # the preprocessing is the model's input, not its architecture
    path = str(tmp_path / "recorded.keras")
    model_files.save_model(model, path, name)
    loaded, recorded, _ = savedmodel.load_source(path)
    assert recorded == name
    plain = str(tmp_path / "plain.keras")
    model.save(plain)  # not saved by train.py: no record
    with pytest.raises(ValueError, match="does not record the preprocessing.*--preprocessing"):
        savedmodel.load_source(plain)
    assert savedmodel.load_source(plain, name)[1] == name
    exported = savedmodel.export(loaded, str(tmp_path / "serving"), "m", preprocessing=recorded, fold_layers=False)
    image = RNG.integers(0, 256, image_shape).astype("uint8")  # ImageNet-style: any size, resized and cropped
    got = tf.saved_model.load(exported).signatures["serving_default"](images=tf.constant(image[None]))["probabilities"]
    want = model(tf.expand_dims(preprocessing.get(name).eval(tf.constant(image)), 0), training=False)
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.heavy
def test_cli_exports_the_newest_state_of_a_model_dir(tmp_path):
    """A finished run, resumed and stopped later, has a checkpoint newer than
    its model.keras: export that one, and say which. (Both states side by
    side: the run as it finished, and a copy resumed and killed; one process.)"""
    import shutil

    finished, later = tmp_path / "finished" / "run", tmp_path / "later" / "run"
    trainer.train(trainer.Config(depth=10, width=1, epochs=1, steps_per_epoch=2, verbose=0, model_dir=str(finished)))
    shutil.copytree(finished, later)
    newer = keras.models.load_model(later / "model.keras")
    for w in newer.trainable_weights:
        w.assign(w + 0.01)
    Checkpoint(str(later / "checkpoint")).save(newer, 1, 1)  # as if resumed to epoch 2 and killed
    alone = tmp_path / "alone.keras"  # the run's model.keras copied out of its run: it carries the class names
    shutil.copy(finished / "model.keras", alone)
    results = run_cli_cases("export", [[f"--source={finished}", f"--base_path={tmp_path}/serving"],
                                       [f"--source={later}", f"--base_path={tmp_path}/serving"],
                                       [f"--source={alone}", f"--base_path={tmp_path}/serving"]], ROOT)
    (done, done_out, done_err), (status, out, err), (alone_status, _, alone_err) = results
    assert alone_status == 0, alone_err[-2000:]
    signature = tf.saved_model.load(str(tmp_path / "serving" / "alone" / "1")).signatures["serving_default"]
    assert "top_k_labels" in signature.structured_outputs
    assert done == 0 and "(epoch 1)" in done_out, done_err[-2000:]
    assert status == 0 and "(epoch 1, step 1)" in out, err[-2000:]
    images = tf.constant(RNG.integers(0, 256, (2, 28, 28, 1)).astype("uint8"))
    served = tf.saved_model.load(str(tmp_path / "serving" / "run" / "2")).signatures["serving_default"]
    outputs = served(images=images)
    np.testing.assert_allclose(outputs["probabilities"],
                               newer(tf.image.per_image_standardization(images), training=False), atol=1e-5)
    # train.py records the class names: the signature names the top-k classes (digits here).
    assert (outputs["top_k_labels"].numpy().astype(str) == outputs["top_k_classes"].numpy().astype(str)).all()


LOAD_SCRIPT = r"""
import json, sys, keras
def load(path):
    try:
        keras.models.load_model(path)
        return "loaded"
    except TypeError:
        return "TypeError"
plain = [load(path) for path in sys.argv[1:]]
import keras_skipinit  # registers the layers
print(json.dumps([plain, [load(path) for path in sys.argv[1:]]]))
"""


@pytest.mark.heavy
def test_loading_a_keras_file_needs_import_keras_skipinit(tmp_path):
    """Documented in README: Keras 3 imports only its own packages' modules
    named in a .keras file, so the package must be imported first; importing
    it is enough, also for a looped model (issue 32.4: RepeatedBlocks). One
    process: each file loaded before the import, then after it."""
    paths = [str(tmp_path / "fixup.keras"), str(tmp_path / "nf_looped.keras")]
    apps.WideResNet(22, 1, normalization="fixup").save(paths[0])
    apps.WideResNet(22, 1, normalization="nf", loop_blocks=True).save(paths[1])  # 3 blocks a stage: 2 identical loop
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, *paths], capture_output=True, text=True, timeout=300,
                          env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-1000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [["TypeError"] * 2, ["loaded"] * 2]
