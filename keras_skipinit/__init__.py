"""keras_skipinit: deep residual networks with or without normalization.

SkipInit (De & Smith 2020), Fixup (Zhang et al. 2019) and Ghost Batch Norm
for Keras 3. The models, layers, analysis, LSUV, optimizer and schedules run
on every Keras backend (TensorFlow, JAX, PyTorch); training and the sweeps
run on TensorFlow and on JAX (without TensorFlow there: `data.numpy_feed`);
serving and export are TensorFlow code (SavedModel).

Importing the package loads nothing but itself and reads no command line:
its modules are imported when first used (`keras_skipinit.applications`,
`from keras_skipinit import layers`), and our Keras objects are registered
with Keras now if it is loaded, else when it loads (`_serializables`), so a
.keras file of ours loads after `import keras_skipinit`.
"""

import importlib

from keras_skipinit import _serializables

__version__ = "0.1.0"
# The public modules by name (every backend: the first row; TensorFlow's route: the second), each folder's
# modules listed in its __init__. The flat names of before the folders map to their modules.
MODULES = {name: f"keras_skipinit.{name}" for name in (
    "analysis", "applications", "layers", "looped", "lsuv", "normalization", "optimizers", "schedules",
    "data", "serving", "sweep", "training")}
MODULES.update(digits="keras_skipinit.data.digits", pipelines="keras_skipinit.data.pipelines",
               tfds_prepare="keras_skipinit.data.tfds_prepare", run_dir="keras_skipinit.training.run_dir",
               train_cli="keras_skipinit.cli.train_cli", export_cli="keras_skipinit.cli.export_cli")
LAYERS = ("FixupBias", "GhostBatchNormalization", "SkipInitScale")
__all__ = [*MODULES, *LAYERS]

_serializables.register_with_keras()


def __getattr__(name):
    """`keras_skipinit.applications`, `.training`, ...: modules imported on
    first use (the TensorFlow ones need TensorFlow); the three layers."""
    if name in MODULES:
        return importlib.import_module(MODULES[name])
    if name in LAYERS:
        return getattr(importlib.import_module("keras_skipinit.layers"), name)
    raise AttributeError(f"module 'keras_skipinit' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
