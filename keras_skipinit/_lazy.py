"""A package's names lent by one of its modules, imported on first use
(PEP 562), so a folder's `__init__` stays empty of imports: `python -m
keras_skipinit.analysis --help` answers before Keras loads, and the folder's
own modules import each other without a circle through it."""

import importlib
import importlib.util

_MISSING = object()


def lend(package, *modules):
    """`__getattr__` and `__dir__` for `package`: `package.name` is the
    first of `package.module.name` for `modules` (the flat module the folder
    grew from keeps its public names, e.g. `keras_skipinit.training.train`).
    A submodule's own name is never lent: the import system finds it."""
    def __getattr__(name):
        if not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is None:
            for module in modules:
                found = getattr(importlib.import_module(f"{package}.{module}"), name, _MISSING)
                if found is not _MISSING:
                    return found
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        names = {*importlib.import_module(package).__dict__}
        for module in modules:
            names.update(n for n in vars(importlib.import_module(f"{package}.{module}")) if not n.startswith("_"))
        return sorted(names)

    return __getattr__, __dir__
