"""Test set-up: quiet TF logs and, under TensorFlow, two logical CPU devices
for the tf.distribute tests.

The model and layer tests also run under JAX (`KERAS_BACKEND=jax`, see
tests/test_backends.py); tests that need TensorFlow itself are marked
`tf_only`. The logical devices must be configured before TensorFlow
initializes its runtime, so this runs when the test session starts
(pytest_configure), before any test module is imported.
"""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _startup_module():
    """The package's `_startup`, loaded from its file: importing the package would import Keras first."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "keras_skipinit", "cli", "startup.py")
    spec = importlib.util.spec_from_file_location("_keras_skipinit_startup", path)
    startup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(startup)
    return startup


def _stderr_to_devnull():
    """TensorFlow 2.21 writes start-up lines from C++ (absl, before
    TF_CPP_MIN_LOG_LEVEL applies) to file descriptor 2 on import. Under
    pytest-xdist the controller's copy is released after the summary, so
    the run would not end on pytest's closing line: keep them out, with the
    package's own capture (`_startup.filtered_stderr`, every line dropped),
    loaded from its file: importing the package would import Keras first."""
    return _startup_module().filtered_stderr(lambda line: True)


# Set by pytest_configure in every process that runs tests (not in pytest-xdist's
# controller, which only schedules them: it skips TensorFlow's start).
BACKEND = None
# The backend Keras will load, read as Keras reads it, without loading it: a marker everywhere, the xdist
# controller's collection too (it was None there: `pytest --collect-only` failed in 5 modules; issue 88.9).
tf_only = pytest.mark.skipif(_startup_module().requested_backend() != "tensorflow",
                             reason="needs TensorFlow (tf.function, tf.distribute, tf.data)")


def _start_keras():
    global BACKEND
    with _stderr_to_devnull():
        import keras

        if keras.backend.backend() == "tensorflow":
            import tensorflow  # noqa: F401
    BACKEND = keras.backend.backend()
    if BACKEND == "tensorflow":
        import tensorflow as tf

        _cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
        )


def pytest_configure(config):
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    if workers > 1:  # xdist's workers share the cores: a thread pool each of cores / workers, not of every core
        # (2 workers of 2 threads on 2 cores oversubscribe them: the suite took 478-490 s, 437 s so). Read
        # when TensorFlow starts its runtime, after the import; train.py processes the tests start inherit it.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # macOS
        os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(max(1, cores // workers)))
    if hasattr(config, "workerinput") or getattr(config.option, "dist", "no") == "no":
        _start_keras()


# Tests that train or start a process (marked heavy) run first: at the end of the collection,
# where xdist hands out its last tests, one worker would run the last of them while the other
# idled. First, and with pytest.ini's --dist worksteal (an idle worker takes the end of a busy
# one's queue), the run ends on short tests on both workers (timings: README.md).
def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)  # stable: otherwise as collected


# .ci/run: the README's install runs the suite first and writes here the tests that
# skipped (needing JAX, Ray or Fashion-MNIST), which it runs again with the extras.
SKIPPED_FILE = os.environ.get("KERAS_SKIPINIT_SKIPPED_FILE")
_skipped = []


def pytest_runtest_logreport(report):
    if SKIPPED_FILE and report.skipped and report.nodeid not in _skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session):
    if SKIPPED_FILE and not hasattr(session.config, "workerinput"):  # the xdist controller sees every report
        with open(SKIPPED_FILE, "w") as f:
            f.write("".join(nodeid + "\n" for nodeid in _skipped))


@pytest.fixture(autouse=True)
def _clean_keras_state():
    import keras

    # Fresh layer names and graph per test. free_memory=False: no gc.collect() per test,
    # which grows slow once TensorFlow's objects fill the heap.
    keras.backend.clear_session(free_memory=False)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
# Set by .ci/run: tests that need optional data or packages fail instead of skipping.
REQUIRE_ALL = os.environ.get("KERAS_SKIPINIT_CI") == "1"


def require_module(name, install):
    """An optional package: skip without it, fail instead where it must be there (CI)."""
    import importlib.util

    if importlib.util.find_spec(name) is None:
        message = f"needs {name}: {install}"
        if REQUIRE_ALL:
            pytest.fail(message + " (KERAS_SKIPINIT_CI=1)")
        pytest.skip(message)


def require_fashion_mnist():
    """The original Fashion-MNIST files from Debian's dataset-fashion-mnist:
    skip without them, fail instead where the data must be there (CI)."""
    if not os.path.isdir(FASHION_MNIST_DIR) or len(os.listdir(FASHION_MNIST_DIR)) < 4:
        message = f"needs {FASHION_MNIST_DIR}: apt-get install dataset-fashion-mnist"
        if REQUIRE_ALL:
            pytest.fail(message + " (KERAS_SKIPINIT_CI=1)")
        pytest.skip(message)
    return FASHION_MNIST_DIR


def session_dir(tmp_path_factory):
    """The test session's temporary folder, one for all pytest-xdist workers."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


@pytest.fixture
def mock_tfds(monkeypatch):
    """`tfds.testing.mock_data` for reading code. It replaces TFDS's
    download_and_prepare, so our offline checks around it
    (`tfds_prepare.prepare`, tested on the real path in test_tfds_prepare)
    step aside too."""
    import tensorflow_datasets as tfds

    from keras_skipinit.data import tfds_prepare
    monkeypatch.setattr(tfds_prepare, "prepare", lambda builder, manual_dir=None: builder)
    return tfds.testing.mock_data


_CLI_CASES = r"""
import contextlib, io, json, sys, traceback

name, cases = sys.argv[1], json.loads(sys.argv[2])
module = __import__(f"keras_skipinit.cli.{name}_cli", fromlist=["main"])
program = {"train": "train.py", "export": "export"}[name]
results = []
for argv in cases:
    sys.argv = [program, *argv]
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            sys.exit(module.main(module.parse()))  # as `run` does; each parse starts from the defaults
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def train_py_in_process(*argv):
    """train.py's main on these flags in this process (no new process and
    TensorFlow start); returns its exit status. run_cli_cases runs the whole
    command, flag errors included."""
    from keras_skipinit.cli import train_cli
    return train_cli.main(train_cli.parse(list(argv)))


def run_cli_cases(name, cases, root, timeout=600):
    """The command `name` ("train" or "export") run once per argv in `cases`,
    all in one process (one TensorFlow start instead of one per case): the
    command's own parse and main, with exit status, as a new process runs them. Returns (status, stdout, stderr) per case."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": root}
    proc = subprocess.run([sys.executable, "-c", _CLI_CASES, name, json.dumps(cases)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [tuple(r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]
