"""keras_skipinit: deep residual networks with or without normalization.

SkipInit (De & Smith 2020), Fixup (Zhang et al. 2019) and Ghost Batch Norm
for Keras 3. The models, layers, analysis, LSUV, optimizer and schedules run
on every Keras backend (TensorFlow, JAX, PyTorch); training and the sweeps
run on TensorFlow and on JAX (without TensorFlow there: `data.numpy_feed`);
serving and export are TensorFlow code (SavedModel). Those modules are
imported when first used, so `import keras_skipinit` needs no TensorFlow.
"""

import importlib
import sys

from keras_skipinit import _startup

if _startup.our_command():  # before Keras loads TensorFlow: our commands start without its C++ start-up lines
    _startup.check_backend()
    if _command := _startup.flag_command():  # help and bad flags answered before TensorFlow's import
        from keras_skipinit import _cli

        _cli.preparse(_command)
        print(f"Loading Keras on {_startup.requested_backend()} (seconds; a minute on a busy machine)...", flush=True,
              file=sys.stderr if _command.startswith("keras_skipinit.predict") else sys.stdout)  # its stdout: answers
    _startup.quiet_start()
elif "keras" not in sys.modules and (_missing := _startup.missing_backend()):  # Keras' error names only the module
    raise ImportError(_missing)

# Importing the package registers every layer, optimizer and schedule a .keras file of ours names
# (looped: RepeatedBlocks, of --loop_blocks models).
from keras_skipinit import applications, layers, looped, lsuv, normalization, optimizers, schedules
from keras_skipinit.layers import FixupBias, GhostBatchNormalization, SkipInitScale

__version__ = "0.1.0"
TENSORFLOW_MODULES = ("data", "pipelines", "run_dir", "serving", "sweep", "tfds_prepare", "training", "train_cli", "export_cli")
__all__ = [
    "analysis", "applications", "layers", "looped", "lsuv", "normalization", "optimizers", "schedules",
    *TENSORFLOW_MODULES, "FixupBias", "GhostBatchNormalization", "SkipInitScale",
]


def __getattr__(name):
    """`keras_skipinit.training` etc.: TensorFlow modules, imported on first use; so is
    `analysis` (a command itself: `python -m keras_skipinit.analysis` warned when the
    package had imported it already)."""
    if name in TENSORFLOW_MODULES or name == "analysis":
        return importlib.import_module(f"keras_skipinit.{name}")
    raise AttributeError(f"module 'keras_skipinit' has no attribute {name!r}")
