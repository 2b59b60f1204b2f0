"""The JAX route without TensorFlow (`pip install -e ".[jax]"`): what only a
Python without TensorFlow can show. CI's third stage runs this file there,
with the training, resume and sweep tests that run on any backend
(.ci/run); where TensorFlow is installed these skip, except the first, and
the last runs only there (TFDS prepares its dataset with TensorFlow)."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import BACKEND, require_fashion_mnist, require_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None
without_tensorflow = pytest.mark.skipif(
    HAS_TENSORFLOW or BACKEND != "jax",
    reason='runs where TensorFlow is not installed, on JAX (CI\'s third stage: pip install -e ".[jax]")')


def run(args, **env):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT, **env})


def test_a_backend_that_is_not_installed_is_one_line():
    """The core install has no backend of its own: `keras_skipinit.applications`
    names the missing package and the extra that installs it (Keras' own
    error names only the module), and train.py says so in one line, exit 2."""
    missing = next((b for b in ("tensorflow", "jax") if importlib.util.find_spec(b) is None), None)
    if missing is None:
        pytest.skip("TensorFlow and JAX are both installed: no backend is missing")
    proc = run(["-c", "import keras_skipinit.applications"], KERAS_BACKEND=missing)
    assert proc.returncode == 1 and f'pip install -e ".[{missing}]"' in proc.stderr.splitlines()[-1], proc.stderr
    proc = run(["train.py"], KERAS_BACKEND=missing)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and f"needs {missing}" in lines[0], proc.stderr


@without_tensorflow
def test_tensorflow_is_absent_and_exports_refuse_in_one_line_before_any_work(tmp_path):
    with pytest.raises(ImportError):
        importlib.import_module("tensorflow")
    proc = run(["train.py", "--epochs=1", "--steps_per_epoch=1", f"--model_dir={tmp_path}/run",
                f"--export_dir={tmp_path}/serving"])
    assert proc.returncode == 2 and "--export_dir needs TensorFlow" in proc.stderr, proc.stderr
    assert not os.path.exists(tmp_path / "run")
    os.makedirs(tmp_path / "source")  # one that exists: a missing --source is refused first, by its flag
    proc = run(["-m", "export", f"--source={tmp_path}/source", f"--base_path={tmp_path}/serving"])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert 'pip install -e ".[tensorflow]"' in proc.stderr
    proc = run(["train.py", "--dataset=cifar10", f"--model_dir={tmp_path}/run"])
    assert proc.returncode == 2 and "TFDS, which reads dataset names, is not installed" in proc.stderr, proc.stderr
    proc = run(["train.py", "--dataset=my-images", f"--model_dir={tmp_path}/run"])  # a mistyped folder, no name
    assert proc.returncode == 2 and "neither a TFDS name (name[/config][:version]) nor an existing folder" in proc.stderr


@without_tensorflow
def test_every_method_builds_and_runs_without_tensorflow():
    """The package's models (every normalization, a training-mode forward),
    LSUV on the embedded digits, the schedules and the training, sweep and
    CLI modules, where TensorFlow is not installed; the export module names
    what it needs."""
    import keras

    import keras_skipinit as ks
    from keras_skipinit import applications as apps
    assert keras.backend.backend() == "jax"
    x = np.random.default_rng(0).standard_normal((4, 16, 16, 3)).astype("float32")
    for n in ks.normalization.NORMALIZATIONS:
        model = apps.WideResNet(10, 1, input_shape=(16, 16, 3), normalization=n)
        assert np.isfinite(np.asarray(model(x, training=True))).all(), n
    ks.lsuv.lsuv_init(apps.WideResNet(10, 1, input_shape=(28, 28, 1), normalization="none"), ks.analysis.real_digits(8))
    assert abs(float(ks.schedules.PaperSchedule("cifar", 1.0, 5, 4)(13)) - 2 ** -4) < 1e-9
    assert ks.training and ks.sweep and ks.train_cli
    with pytest.raises(ModuleNotFoundError, match="tensorflow"):  # the folder imports; its SavedModel export needs TF
        ks.serving.export


@without_tensorflow
def test_fashion_mnist_is_read_from_its_original_files():
    """In memory, fed by NumPy: the 70,000 images with TFDS's class names."""
    directory = require_fashion_mnist()
    from keras_skipinit.data import pipelines, sources
    dataset = sources.load("fashion_mnist", manual_dir=directory, train_examples=1000)
    assert sources.numpy_feed(dataset) and (dataset.num_train, dataset.num_test) == (1000, 10000)
    assert dataset.label_names[0] == "T-shirt/top"
    x, y = pipelines.first_batch(pipelines.train_pipeline(dataset, 8, epoch=0))
    assert x.shape == (8, 28, 28, 1) and y.shape == (8, 10)
    assert np.all(np.abs(x.mean(axis=(1, 2, 3))) < 0.6)  # standardized, then padded with zeros and cropped


def _sample_builder(name, images, labels, test_images, test_labels):
    """A TFDS builder of the given images (an array, or a list of images of
    varying sizes) and labels (not registered: read back from its files)."""
    import tensorflow_datasets as tfds

    shape = images.shape[1:] if isinstance(images, np.ndarray) else (None, None, images[0].shape[-1])

    class Sample(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = tfds.features.FeaturesDict({"image": tfds.features.Image(shape=shape),
                                                   "label": tfds.features.ClassLabel(num_classes=10)})
            return tfds.core.DatasetInfo(builder=self, features=features, supervised_keys=("image", "label"))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(images, labels),
                    "test": self._generate_examples(test_images, test_labels)}

        def _generate_examples(self, x, y):
            for i, (image, label) in enumerate(zip(x, y)):
                yield i, {"image": image, "label": int(label)}

    Sample.name = name
    return Sample


READ_WITHOUT_TENSORFLOW = """
import json, os, sys

class Hidden:  # TensorFlow is not there, as in a JAX user's Python: not found, not importable
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, *args):
        hidden = name == "tensorflow" or name.startswith("tensorflow.")
        return None if hidden else self.finder.find_spec(name, *args)

sys.meta_path[:] = [Hidden(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
os.environ["KERAS_BACKEND"] = "jax"
import numpy as np
from keras_skipinit.data import pipelines, sources

folder, empty = sys.argv[1:]
dataset = sources.load("digit_sample", data_dir=folder, train_examples=40)
x, y = pipelines.first_batch(pipelines.train_pipeline(dataset, 8, epoch=0))
np.savez(os.path.join(folder, "read.npz"), *dataset.train, *dataset.test)
large = sources.load("large_sample", data_dir=folder)  # ImageNet-style: read per batch
train = pipelines.first_batch(pipelines.train_pipeline(large, 4, epoch=0))[0]
np.savez(os.path.join(folder, "large.npz"), train=train, eval=pipelines.first_batch(pipelines.eval_pipeline(large, 4))[0])
errors = []
for name, where in (("cifar10", empty), ("digit_sampel", empty)):
    try:
        sources.load(name, data_dir=where)
    except ValueError as e:
        errors.append(str(e))
print(json.dumps({"numpy_feed": sources.numpy_feed(dataset), "batch": [x.shape, y.shape], "errors": errors,
                  "large": [sources.numpy_feed(large), large.preprocessing, type(large.train).__name__],
                  "tensorflow": "tensorflow" in sys.modules}))
"""


@pytest.mark.heavy
@pytest.mark.skipif(not HAS_TENSORFLOW, reason="prepares its dataset with TensorFlow (TFDS encodes images with it)")
def test_a_tfds_dataset_prepared_as_array_record_is_read_without_tensorflow(tmp_path):
    """Any TFDS image dataset prepared as array_record (here, where TensorFlow
    is installed, as `tfds build --file_format=array_record` would) is read on
    JAX by a Python that cannot import TensorFlow: the same examples in the
    same order as tf.data reads them, fed by NumPy; ImageNet-style ones
    (images of any size) read per batch, evaluated as TensorFlow's pipeline
    and the exports preprocess them. Not prepared so, or a name TFDS does not
    know (its suggestions once fetched the community index, which crashed
    without TensorFlow): one line saying what to do."""
    require_module("jax", 'pip install -e ".[jax]"')
    require_module("array_record", 'pip install -e ".[tfds]"')
    from keras_skipinit.data import digits
    (x, y), (xt, yt) = digits.split()
    folder, empty = tmp_path / "tfds", tmp_path / "empty"
    sample = _sample_builder("digit_sample", x[:48], y[:48], xt[:16], yt[:16])
    sample(data_dir=str(folder), file_format="array_record").download_and_prepare()
    sample(data_dir=str(tmp_path / "tfrecord")).download_and_prepare()  # what tf.data reads
    rng = np.random.default_rng(0)
    big = [rng.integers(0, 256, (h, w, 3)).astype(np.uint8) for h, w in ((72, 90), (120, 66), (81, 81), (64, 200))]
    _sample_builder("large_sample", big, y[:4], big, y[:4])(
        data_dir=str(folder), file_format="array_record").download_and_prepare()
    empty.mkdir()
    proc = run(["-c", READ_WITHOUT_TENSORFLOW, str(folder), str(empty)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["numpy_feed"] and not out["tensorflow"] and out["batch"] == [[8, 28, 28, 1], [8, 10]]
    assert out["large"] == [True, "imagenet", "Records"]
    not_prepared, typo = out["errors"]
    assert "tfds build cifar10 --file_format=array_record" in not_prepared and "not prepared" in not_prepared
    assert typo.startswith("unknown dataset 'digit_sampel'")  # the suggestions leave out the community index

    import tensorflow as tf
    import tensorflow_datasets as tfds

    from keras_skipinit.data import preprocessing
    large = np.load(folder / "large.npz")
    stored = tfds.builder("large_sample", data_dir=str(folder)).as_data_source("test")
    want = [preprocessing.get("imagenet").eval(tf.constant(stored[i]["image"])).numpy() for i in range(4)]
    np.testing.assert_allclose(large["eval"], np.stack(want), atol=1e-4)  # the pixels TensorFlow's pipeline makes
    assert large["train"].shape == (4, 224, 224, 3) and np.isfinite(large["train"]).all()

    read = np.load(folder / "read.npz")
    builder = tfds.builder("digit_sample", data_dir=str(tmp_path / "tfrecord"))
    # The same folder on TensorFlow (train.py, export's check images): tf.data cannot stream array_record
    # (NotImplementedError), so the small dataset is read whole through data_source; the large one is one line.
    from keras_skipinit.data import sources
    on_tensorflow = sources.load("digit_sample", data_dir=str(folder), train_examples=40)
    assert not sources.numpy_feed(on_tensorflow)
    with pytest.raises(ValueError, match="prepared as array_record only.*tfds build large_sample --data_dir=DIR"):
        sources.load("large_sample", data_dir=str(folder))
    for i, split in enumerate(("train[:40]", "test")):  # tf.data's examples, in its order
        want = tfds.as_numpy(builder.as_dataset(split=split, as_supervised=True, shuffle_files=False))
        images, labels = (np.stack(a) for a in zip(*want))
        np.testing.assert_array_equal(read[f"arr_{2 * i}"], images)
        np.testing.assert_array_equal(read[f"arr_{2 * i + 1}"], labels)
        ours = (on_tensorflow.train, on_tensorflow.test)[i]
        np.testing.assert_array_equal(ours[0], images)
        np.testing.assert_array_equal(ours[1], labels)
