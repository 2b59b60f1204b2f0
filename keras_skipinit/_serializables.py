"""Our Keras objects registered with Keras, so `keras.saving.load_model`
reads a .keras file that names them (Keras 3 imports the module a file
names only for its own packages, keras and keras_hub).

`import keras_skipinit` calls `register_with_keras`: where Keras is loaded,
the modules that register (layers, RepeatedBlocks, the optimizer and the
schedules) are imported now; where it is not, when it loads. So the import
itself loads no Keras (a command's --help comes before it, issue 88.1), and
`import keras_skipinit` then `keras.saving.load_model(...)` works in either
order.
"""

import importlib
import importlib.abc
import importlib.util
import sys

from keras_skipinit.cli import startup

MODULES = ("keras_skipinit.layers", "keras_skipinit.looped", "keras_skipinit.optimizers", "keras_skipinit.schedules")


def register():
    """Imports each module that registers objects; one being imported now
    (the import that loaded Keras) registers its own when it completes. None
    of them imports another of them, so none waits on one half-imported."""
    for name in MODULES:
        if name not in sys.modules:
            importlib.import_module(name)


def register_with_keras():
    """`register` now where Keras is loaded, else right after Keras loads."""
    if "keras" in sys.modules:
        register()
    elif not any(isinstance(finder, _WhenKerasLoads) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WhenKerasLoads())


class _WhenKerasLoads(importlib.abc.MetaPathFinder):
    """Finds `keras` as the other finders do, with a loader that registers
    ours once Keras' own import has completed; used once, then removed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec("keras")
        if spec is not None and spec.loader is not None:
            spec.loader = _Registering(spec.loader)
        return spec


class _Registering(importlib.abc.Loader):
    """Keras' own loader, then `register`. A backend whose package is not
    installed (the core install has none) is named with the extra that
    installs it: Keras' error names only the module."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        try:
            self._loader.exec_module(module)
        except ImportError as e:
            missing = startup.missing_backend()
            if missing:
                raise ImportError(missing) from e
            raise
        register()

    def __getattr__(self, name):  # the rest (resources, get_filename ...) as Keras' own loader
        return getattr(self._loader, name)
