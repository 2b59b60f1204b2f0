"""The real TFDS prepare path (not `tfds.testing.mock_data`, which skips it)."""

import fcntl
import gzip
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds

from conftest import require_fashion_mnist, session_dir
from keras_skipinit.cli import startup
from keras_skipinit.data import sources, tfds_prepare
from keras_skipinit.training import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFFLINE = "import socket\ndef _offline(*a, **k): raise socket.gaierror(-2, 'Name or service not known')\nsocket.create_connection = _offline\n"


def run_train_offline(*flags):
    code = OFFLINE + "import runpy, sys\nsys.argv = ['train.py'] + sys.argv[1:]\nrunpy.run_path('train.py', run_name='__main__')\n"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-c", code, *flags], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


@pytest.fixture(scope="session")
def fashion_mnist_first_run(tmp_path_factory):
    """A new user's first command, offline: train.py --dataset=fashion_mnist
    on an empty data_dir, so that TFDS's own builder prepares fashion_mnist
    from the local files with the network cut off. Once per test session,
    shared by pytest-xdist's workers (a lock file); (data_dir, outcome)."""
    require_fashion_mnist()
    root = session_dir(tmp_path_factory)
    data_dir, outcome = root / "fashion_mnist_tfds", root / "fashion_mnist_first_run.json"
    with open(root / "fashion_mnist_first_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not outcome.exists():
            proc = run_train_offline("--dataset=fashion_mnist", f"--data_dir={data_dir}", "--train_examples=512",
                                     "--epochs=1", "--steps_per_epoch=4", "--depth=10", "--verbose=0",
                                     f"--model_dir={root / 'fashion_mnist_first_run'}")
            outcome.write_text(json.dumps({"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}))
    return str(data_dir), json.loads(outcome.read_text())


@pytest.fixture
def fashion_mnist_data_dir(fashion_mnist_first_run):
    data_dir, outcome = fashion_mnist_first_run
    assert outcome["returncode"] == 0, outcome["stderr"][-2000:]
    return data_dir


@pytest.mark.heavy
def test_fashion_mnist_is_prepared_by_tfds_own_builder_from_local_files(fashion_mnist_data_dir, fashion_mnist_first_run):
    # train.py says what it prepares, from where, into where (TFDS's own line was followed by a silent minute),
    # after a first line of its own before Keras loads.
    stdout = fashion_mnist_first_run[1]["stdout"]
    assert stdout.startswith("Loading Keras on ")
    assert "Preparing fashion_mnist once, from its original files in " in stdout and fashion_mnist_data_dir in stdout
    builder = tfds.builder("fashion_mnist", data_dir=fashion_mnist_data_dir)
    assert builder.is_prepared()
    assert {k: v.num_examples for k, v in builder.info.splits.items()} == {"train": 60000, "test": 10000}
    info = json.load(open(os.path.join(builder.data_dir, "dataset_info.json")))
    assert info["moduleName"] == type(builder).__module__  # indistinguishable from a download
    # The real data: 6,000 training and 1,000 test images per class.
    labels = np.concatenate([y for _, y in tfds.as_numpy(builder.as_dataset(split="test", as_supervised=True, batch_size=5000))])
    np.testing.assert_array_equal(np.bincount(labels), [1000] * 10)


@pytest.mark.heavy
def test_training_on_real_fashion_mnist_through_train_py(fashion_mnist_data_dir, tmp_path):
    """64 updates on 2,048 real images. Seeds 0-4 on one machine: final
    training cross-entropy 0.89-0.95 (from ln 10 = 2.30), test top-1
    0.62-0.67 on all 10,000 test images."""
    results = trainer.train(trainer.Config(
        depth=10, width=1, normalization="batchnorm", bn_momentum=0.9, dataset="fashion_mnist",
        data_dir=fashion_mnist_data_dir, train_examples=2048, epochs=2, batch_size=64, learning_rate=0.1,
        verbose=0, model_dir=str(tmp_path / "run"),
    ))
    assert results["status"] == "completed" and results["num_train"] == 2048 and results["num_test"] == 10000
    assert results["train_cross_entropy"] < 1.3, results
    assert results["test_top1"] > 0.45, results


@pytest.mark.heavy
def test_fashion_mnist_validation_split_is_the_last_5000_training_images(fashion_mnist_data_dir):
    ds = sources.load("fashion_mnist", fashion_mnist_data_dir, validation_examples=5000)
    assert (ds.num_train, ds.num_test, ds.eval_split) == (55000, 5000, "validation")
    builder = tfds.builder("fashion_mnist", data_dir=fashion_mnist_data_dir)
    full = builder.as_dataset(split="train", as_supervised=True)
    (first_val, _), = ds.test.take(1)
    (image_55000, _), = full.skip(55000).take(1)
    (last_train, _), = ds.train.skip(54999).take(1)
    (image_54999, _), = full.skip(54999).take(1)
    np.testing.assert_array_equal(first_val, image_55000)
    np.testing.assert_array_equal(last_train, image_54999)


def test_files_that_are_no_known_copy_are_refused(tmp_path):
    manual = tmp_path / "manual"
    manual.mkdir()
    for name in tfds_prepare.LOCAL_COPIES["fashion_mnist"].sha256:
        with gzip.open(manual / name, "wb") as f:
            f.write(b"not fashion-mnist")
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte.gz is neither the original t10k-images-idx3-ubyte.gz .* nor a known copy"):
        sources.load("fashion_mnist", str(tmp_path / "tfds"), manual_dir=str(manual))


def test_offline_without_files_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(tfds_prepare.socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    with pytest.raises(ValueError) as info:
        sources.load("cifar10", str(tmp_path / "tfds"), manual_dir=str(tmp_path / "empty"))
    message = str(info.value)
    assert "unreachable" in message and "--data_dir" in message and "cifar-10-binary.tar.gz" in message
    assert "\n" not in message
    # Fashion-MNIST's message names the Debian package.
    with pytest.raises(ValueError, match="apt-get install dataset-fashion-mnist"):
        sources.load("fashion_mnist", str(tmp_path / "tfds"), manual_dir=str(tmp_path / "empty"))


def test_download_failures_become_one_line(tmp_path, monkeypatch):
    """A host that answers but a download that fails (proxy, 404, reset)."""
    def fail(self, **kwargs):
        raise ConnectionError("Max retries exceeded with url: /~kriz/cifar-10-binary.tar.gz\n(details)")

    monkeypatch.setattr(tfds_prepare, "_check_reachable", lambda *a: None)
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", fail)
    with pytest.raises(ValueError, match=r"ConnectionError: Max retries exceeded.*--manual_dir") as info:
        sources.load("cifar10", str(tmp_path / "tfds"))
    assert "\n" not in str(info.value)


def test_runs_starting_together_prepare_a_dataset_once(tmp_path):
    """Two processes' first use of one data_dir at once (two sweeps, Ray's
    trials): the second waits for the first instead of racing it to TFDS's
    final rename of the finished folder, which the loser fails."""
    class Builder:  # TFDS's DatasetBuilder as prepare() uses it; preparing fails where the folder exists
        name, url_infos, MANUAL_DOWNLOAD_INSTRUCTIONS, builder_config, version = "toy", {}, None, None, "1.0.0"
        calls = []

        def __init__(self, data_dir, version=None):
            self.data_dir_root, self.data_dir = data_dir, os.path.join(data_dir, "toy", "1.0.0")

        def is_prepared(self):
            return os.path.isdir(self.data_dir)

        def download_and_prepare(self, download_config=None):
            Builder.calls.append(self)
            time.sleep(0.5)
            os.makedirs(self.data_dir)  # FileExistsError for the second, as TFDS's rename

    start, results = threading.Barrier(2), []

    def first_use():
        start.wait()
        results.append(tfds_prepare.prepare(Builder(str(tmp_path))))

    threads = [threading.Thread(target=first_use) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(Builder.calls) == 1 and len(results) == 2 and all(b.is_prepared() for b in results)


def test_manual_download_datasets_say_where_files_go(tmp_path):
    with pytest.raises(ValueError, match="downloaded by hand.*--manual_dir"):
        sources.load("imagenet2012", str(tmp_path / "tfds"))


def test_unknown_dataset_suggests_close_names():
    with pytest.raises(ValueError) as info:
        sources.load("cifar1O")
    assert "unknown dataset 'cifar1O'" in str(info.value) and "cifar10" in str(info.value)
    assert len(str(info.value)) < 300


@pytest.mark.parametrize("name,match", [
    ("my-images", "neither a TFDS name (name[/config][:version]) nor an existing folder"),  # TFDS: a 15-line help
    ("mnist/no_such_config", "dataset 'mnist/no_such_config': BuilderConfig no_such_config not found"),
    ("mnist:9.9.9", "dataset 'mnist:9.9.9': Dataset mnist cannot be loaded at version 9.9.9"),  # TFDS: an assert
    ("my_images/x", "not a TFDS dataset (see tfds.list_builders()). Or a folder of images: "  # both of its forms
                    "PATH/train/<class>/<image> and PATH/test/<class>/<image>, or PATH/<class>/<image>"),
])
def test_names_tfds_cannot_build_are_one_line(tmp_path, name, match):
    with pytest.raises(ValueError) as info:
        sources.load(name, str(tmp_path / "tfds"))
    assert match in str(info.value) and "\n" not in str(info.value)


@pytest.mark.heavy
def test_cli_cifar10_offline_is_one_line_no_traceback(tmp_path):
    proc = run_train_offline("--dataset=cifar10", f"--data_dir={tmp_path}/tfds", f"--model_dir={tmp_path}/run")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    # Nothing but the error: TFDS's notes neither (TensorFlow's C++ start-up lines aside, which this harness's
    # TF_CPP_MIN_LOG_LEVEL cannot stop and train.py's own start filters out).
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not startup._NOISE.search(line)]
    assert len(lines) == 1 and lines[0].startswith("train.py: error:") and "--data_dir" in lines[0], proc.stderr[-2000:]


def test_cli_fashion_mnist_offline(fashion_mnist_first_run):
    """train.py on an empty data_dir, the network cut off, prepares the
    dataset from Debian's files and trains (the session's first run, above)."""
    _, outcome = fashion_mnist_first_run
    assert outcome["returncode"] == 0, outcome["stderr"][-2000:]
    assert "Traceback" not in outcome["stderr"]
    assert "Test accuracy" in outcome["stdout"] and "on 10000 held-out images" in outcome["stdout"]
