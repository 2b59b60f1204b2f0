"""The registry built on the zoo's one table of architecture facts.

`ARCHITECTURES` (kept in `keras_skipinit.spec`, read before Keras loads) maps each architecture's name (train.py's --model, the
sweep's, model_spec.json's) to what the rest of the package needs to know:
its constructor, title, default input, whether its blocks are
pre-activation (NF needs them), the depths it takes, and the constructor
options only it has. `build` (model_spec.json -> model), train.py's
validation, the sweep's tables and `create_model` read it.

Model names (timm's `create_model` / `list_models`):
- ``resnet50_v1``, ``resnet101_v1``, ``resnet152_v1``, ``resnet50_v2``, ...
  (He et al. 2016a/b, ImageNet input 224x224x3, 1000 classes);
- ``wrn_<depth>_<width>``, any depth 6k+4 and width >= 1: ``wrn_16_4``,
  ``wrn_28_10``, ``wrn_1000_1`` (Zagoruyko & Komodakis 2016, 32x32x3);
- ``cifar_resnet<depth>``, any depth 6n+2: ``cifar_resnet20``, ...,
  ``cifar_resnet1202`` (He et al. 2016a §4.2, 32x32x3).
"""

import fnmatch
import importlib
import re

from keras_skipinit.spec import ARCHITECTURES, MODELS, Architecture, architecture, title

__all__ = ["ARCHITECTURES", "MODELS", "Architecture", "architecture", "build", "check_options", "create_model",
           "list_models", "parse_name", "title"]

def _pattern(name_format):
    """A regex of an `Architecture.name_format`: {depth} and {width} as named digit groups."""
    parts = re.split(r"(\{depth\}|\{width\})", name_format)
    return re.compile("".join(f"(?P<{p[1:-1]}>\\d+)" if p in ("{depth}", "{width}") else re.escape(p) for p in parts))


def check_options(model, **options):
    """Architecture-only options given (not None) to another architecture: one ValueError."""
    arch = architecture(model)
    for name, value in options.items():
        if value is not None and name not in arch.options:
            owners = [m for m, a in ARCHITECTURES.items() if name in a.options]
            raise ValueError(f"{name} applies only to model={' or '.join(owners)}")


def build(model, depth, width=None, **kwargs):
    """The zoo's model `model` (one of `MODELS`) of `depth`; `width` is the
    WRN widening factor (WRN only); keyword arguments go to the constructor."""
    arch = architecture(model)
    module, name = arch.constructor.split(":")
    constructor = getattr(importlib.import_module(f"keras_skipinit.applications.{module}"), name)
    if arch.takes_width:
        return constructor(depth, width, *arch.version, **kwargs)
    if width is not None:
        raise ValueError(f"width applies only to model='wrn', got width={width!r} for model={model!r}")
    return constructor(depth, *arch.version, **kwargs)


def parse_name(name):
    """(model, depth, width) of a model name, e.g. 'wrn_16_4' -> ('wrn', 16, 4).
    Every family whose `name_format` matches is asked, not the first: a name
    is the one family's that takes its depth (and width); two that take it
    are an ambiguity, said as such (issue 88.7: a `resnet{depth}` family of
    depths 18 and 34 made "first match wins" refuse ResNet-50)."""
    matches, refusals = [], []
    for model, arch in ARCHITECTURES.items():
        match = _pattern(arch.name_format).fullmatch(name) if arch.name_format and isinstance(name, str) else None
        if not match:
            continue
        depth, width = int(match["depth"]), int(match["width"]) if "width" in match.groupdict() else None
        try:
            arch.check_depth(depth)
            if width is not None and width < 1:
                raise ValueError(f"{name}: the width must be a positive int")
        except ValueError as e:
            refusals.append(str(e))
            continue
        matches.append((model, depth, width))
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(f"model name {name!r} is ambiguous: families {[m[0] for m in matches]} all take it")
    if refusals:
        raise ValueError(" ".join(refusals) if len(refusals) == 1 else f"{name}: " + "; ".join(refusals))
    formats = ", ".join(arch.name_format for arch in ARCHITECTURES.values() if arch.name_format)
    examples = [n for arch in ARCHITECTURES.values() for n in arch.names[:1]]
    raise ValueError(f"unknown model name {name!r}: {formats}; e.g. {', '.join(examples)}, ... (list_models())")


def list_models(pattern="*"):
    """The registered model names matching the shell-style `pattern`
    ('wrn_*', '*_v2'), sorted. `create_model` also takes any other valid
    depth or width of a family ('wrn_52_2', 'cifar_resnet74')."""
    names = [n for arch in ARCHITECTURES.values() for n in arch.names]
    return sorted(fnmatch.filter(names, pattern), key=_sort_key)


def _sort_key(name):
    model, depth, width = parse_name(name)
    return list(ARCHITECTURES).index(model), depth, width or 0


def create_model(name=None, **kwargs):
    """The model `name` (see `list_models`); keyword arguments go to its
    constructor (normalization=..., input_shape=..., classes=...,
    include_top=False, pyramid_outputs=True, ...). Without a name, the
    family, depth and width are keywords too: a run's recorded spec
    (model_spec.json's "model") builds as `create_model(**spec)`.

        create_model("wrn_16_4", normalization="skipinit")
        create_model("resnet50_v2", include_top=False, pyramid_outputs=True)
        create_model(model="wrn", depth=16, width=4, normalization="skipinit")
    """
    if name is None:
        if "model" not in kwargs or "depth" not in kwargs:
            raise TypeError("create_model() needs a model name ('wrn_16_4') or model= and depth= (and width= for wrn)")
        model, depth, width = kwargs.pop("model"), kwargs.pop("depth"), kwargs.pop("width", None)
    else:
        model, depth, width = parse_name(name)
    if isinstance(kwargs.get("input_shape"), list):  # a JSON record's
        kwargs["input_shape"] = tuple(kwargs["input_shape"])
    return build(model, depth, width, **kwargs)
