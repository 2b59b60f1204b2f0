"""The JAX route without TensorFlow (`pip install -e ".[jax]"`): what only a
Python without TensorFlow can show. CI's third stage runs this file there,
with the training, resume and sweep tests that run on any backend
(.ci/run); where TensorFlow is installed these skip, except the first."""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import BACKEND, require_fashion_mnist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None
without_tensorflow = pytest.mark.skipif(
    HAS_TENSORFLOW or BACKEND != "jax",
    reason='runs where TensorFlow is not installed, on JAX (CI\'s third stage: pip install -e ".[jax]")')


def run(args, **env):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT, **env})


def test_a_backend_that_is_not_installed_is_one_line():
    """The core install has no backend of its own: `import keras_skipinit`
    names the missing package and the extra that installs it (Keras' own
    error names only the module), and train.py says so in one line, exit 2."""
    missing = next((b for b in ("tensorflow", "jax") if importlib.util.find_spec(b) is None), None)
    if missing is None:
        pytest.skip("TensorFlow and JAX are both installed: no backend is missing")
    proc = run(["-c", "import keras_skipinit"], KERAS_BACKEND=missing)
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
    proc = run(["-m", "export", f"--source={tmp_path}/run", f"--base_path={tmp_path}/serving"])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "pip install tensorflow" in proc.stderr
    proc = run(["train.py", "--dataset=cifar10", f"--model_dir={tmp_path}/run"])
    assert proc.returncode == 2 and "need TensorFlow and tensorflow-datasets" in proc.stderr, proc.stderr


@without_tensorflow
def test_fashion_mnist_is_read_from_its_original_files():
    """In memory, fed by NumPy: the 70,000 images with TFDS's class names."""
    directory = require_fashion_mnist()
    from keras_skipinit import data

    dataset = data.load("fashion_mnist", manual_dir=directory, train_examples=1000)
    assert data.numpy_feed(dataset) and (dataset.num_train, dataset.num_test) == (1000, 10000)
    assert dataset.label_names[0] == "T-shirt/top"
    x, y = data.first_batch(data.train_pipeline(dataset, 8, epoch=0))
    assert x.shape == (8, 28, 28, 1) and y.shape == (8, 10)
    assert np.all(np.abs(x.mean(axis=(1, 2, 3))) < 0.6)  # standardized, then padded with zeros and cropped
