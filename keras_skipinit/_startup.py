"""A quiet start for our commands (train.py, python -m export, the sweep,
the console scripts, the benchmarks).

TensorFlow prints C++ start-up lines on import and on the first device
query, before its logging reads TF_CPP_MIN_LOG_LEVEL: "All log messages
before absl::InitializeLog()", the oneDNN and CPU-feature notes, and on
every machine without a GPU "failed call to cuInit: ... UNKNOWN ERROR
(303)", which reads like a failure. `quiet_start` imports Keras (and its
TensorFlow) with file descriptor 2 captured, and writes back every line
but those. A user's own TF_CPP_MIN_LOG_LEVEL wins: then nothing is
filtered.
"""

import os
import re
import sys
import tempfile

_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|[IWE]\d{4} [\d:.]+\s+\d+ (port|cudart_stub|cuda_platform|cuda_executor|cuda_dnn|cuda_fft|cuda_blas"
    r"|cpu_feature_guard)\.cc:\d+\] "
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.$"
)


def our_command():
    """Whether this process runs one of our commands, not a user's program
    that imports the package."""
    argv = getattr(sys, "orig_argv", [])
    if "-m" in argv[:-1]:
        module = argv[argv.index("-m") + 1]
        return module == "export" or module.startswith("keras_skipinit")
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    return script == "train.py" or script.startswith("keras-skipinit-")


def is_noise(line):
    return bool(_NOISE.match(line))


def quiet_start():
    """Imports Keras and, on the TensorFlow backend, TensorFlow and its device
    list, with TensorFlow's start-up lines filtered from stderr (unless
    TF_CPP_MIN_LOG_LEVEL is set, or Keras is already imported)."""
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ or "keras" in sys.modules:
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import keras

            if keras.backend.backend() == "tensorflow":
                import tensorflow as tf

                tf.config.list_physical_devices("GPU")  # cuInit's line comes here, not on import
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(True) if not is_noise(line)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()
