"""How our commands start (train.py, python -m export, the sweep, the
console scripts, the scripts in benchmarks/): `parsing.start`, called by each
entry point and by nothing the package imports, answers --help and bad
flags before Keras loads, then loads it quietly (`load_keras`).

TensorFlow prints C++ start-up lines on import and on the first device
query, before its logging reads TF_CPP_MIN_LOG_LEVEL: "All log messages
before absl::InitializeLog()", the oneDNN and CPU-feature notes, and on
every machine without a GPU "failed call to cuInit: ... UNKNOWN ERROR
(303)", which reads like a failure. `quiet_start` imports Keras (and its
TensorFlow) with file descriptor 2 captured, and writes back every line
but those. A user's own TF_CPP_MIN_LOG_LEVEL wins: then nothing is
filtered.
"""

import contextlib
import importlib.util
import json
import os
import re
import sys
import tempfile

TRAINING_BACKENDS = ("tensorflow", "jax")

_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|[IWE]\d{4} [\d:.]+\s+\d+ (port|cudart_stub|cuda_platform|cuda_executor|cuda_dnn|cuda_fft|cuda_blas"
    r"|cpu_feature_guard)\.cc:\d+\] "
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.$"
)


LOG_LEVEL_SET_ENV = "KERAS_SKIPINIT_SET_TF_LOG_LEVEL"  # quiet_start set TF_CPP_MIN_LOG_LEVEL, not the user


def log_level_is_users():
    """Whether TF_CPP_MIN_LOG_LEVEL is the user's own (then nothing is filtered)."""
    return "TF_CPP_MIN_LOG_LEVEL" in os.environ and os.environ.get(LOG_LEVEL_SET_ENV) != "1"


def installed(module):
    """Whether `module` can be imported here (without importing it): the one
    test of "is TensorFlow (TFDS, JAX, ...) installed" the package asks."""
    return importlib.util.find_spec(module) is not None


def requested_backend():
    """The backend Keras will load, read as Keras reads it (KERAS_BACKEND,
    else keras.json under KERAS_HOME or ~/.keras, else tensorflow), before
    importing it: Keras' NumPy backend imports JAX, so a refusal that asks
    Keras would need JAX."""
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(
        os.path.expanduser("~") if os.access(os.path.expanduser("~"), os.W_OK) else "/tmp", ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as f:
            return json.load(f).get("backend", "tensorflow")
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def backend_error(backend):
    """Why training refuses `backend` (also `distribute.check_backend`'s words)."""
    return (f"training runs on the TensorFlow or JAX backend; this process uses Keras backend {backend!r} "
            "(KERAS_BACKEND or ~/.keras/keras.json): run with KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax")


def missing_backend():
    """Why the Keras backend this process would load cannot load (its
    package is not installed: the core install has no TensorFlow), or None."""
    backend = requested_backend()
    module = {"tensorflow": "tensorflow", "jax": "jax", "numpy": "jax", "torch": "torch"}.get(backend)
    if module is None or installed(module):
        return None
    how = f'pip install -e ".[{module}]"' if module in TRAINING_BACKENDS else f"pip install {module}"
    other = (' (or JAX: pip install -e ".[jax]" and KERAS_BACKEND=jax)' if backend == "tensorflow" else "")
    return (f"Keras backend {backend!r} (KERAS_BACKEND, else ~/.keras/keras.json, else tensorflow) needs {module}, "
            f"which is not installed: {how}{other}")


def check_backend(program, training):
    """For our commands, before Keras loads: a backend the training commands
    (`training`) do not run on, or one whose package is not installed, is one
    line and exit status 2."""
    backend = requested_backend()
    error = backend_error(backend) if training and backend not in TRAINING_BACKENDS else missing_backend()
    if error:
        print(f"{program}: error: {error}", file=sys.stderr)
        sys.exit(2)


def load_keras(stream=None):
    """Says that Keras loads (seconds; on stdout unless `stream`), then
    `quiet_start`; nothing where it is loaded already."""
    if "keras" not in sys.modules:
        print(f"Loading Keras on {requested_backend()} (seconds; a minute on a busy machine)...", flush=True,
              file=stream or sys.stdout)
    quiet_start()


def is_noise(line):
    return bool(_NOISE.match(line))


@contextlib.contextmanager
def filtered_stderr(drop):
    """Runs the block with file descriptor 2 (C++ output too) captured, then
    writes back every line for which `drop(line)` is false."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(True) if not drop(line)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def quiet_start():
    """Imports Keras and TensorFlow (on JAX too, where installed) and its
    device list, with TensorFlow's start-up lines filtered from stderr
    (unless TF_CPP_MIN_LOG_LEVEL is the user's: then all of them shown);
    nothing where Keras is already imported."""
    if "keras" in sys.modules:
        return
    users = log_level_is_users()
    if not users:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        os.environ[LOG_LEVEL_SET_ENV] = "1"  # not the user's: child processes (Ray workers) filter for themselves
    with contextlib.nullcontext() if users else filtered_stderr(is_noise):
        import keras

        # On JAX too: our commands read data with tf.data. (Not jax.devices(): it would start
        # JAX's runtime before jax.distributed.initialize, which must come first.)
        if keras.backend.backend() == "tensorflow" or installed("tensorflow"):
            import tensorflow as tf

            tf.config.list_physical_devices("GPU")  # cuInit's line comes here, not on import
