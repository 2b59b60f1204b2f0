"""The zoo's one table of architecture facts, and the registry built on it.

`ARCHITECTURES` maps each architecture's name (train.py's --model, the
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

import dataclasses
import fnmatch
import re
from typing import Callable

from keras_skipinit.applications import cifar_resnet, resnet, wide_resnet


@dataclasses.dataclass(frozen=True)
class Architecture:
    title: str
    label: str  # a model's name in tables and plots, formatted with depth and width
    constructor: Callable  # constructor(depth, [width,] **keyword arguments)
    default_input_shape: tuple
    preactivation: bool  # pre-activation blocks (He et al. 2016b): what normalization='nf' needs
    depths: str  # the depths it takes, in words
    check_depth: Callable  # raises ValueError for a depth it does not take
    takes_width: bool = False  # a widening factor (WRN's k)
    options: tuple = ()  # constructor arguments only this architecture has (train.py flags of the same name)
    names: tuple = ()  # the registered model names `list_models` lists


def _resnet(version):
    def constructor(depth, **kwargs):
        return resnet.ResNet(depth, version, **kwargs)

    return constructor


def _resnet_depth(depth):
    if depth not in resnet.BLOCKS_PER_STAGE:
        raise ValueError(f"ResNet depth must be one of {sorted(resnet.BLOCKS_PER_STAGE)}, got {depth!r}.")


ARCHITECTURES = {
    "wrn": Architecture(
        "Wide-ResNet", "WRN-{depth}-{width}", wide_resnet.WideResNet, (32, 32, 3), True, "6k+4 (10, 16, 22, 28, ..., 1000)",
        wide_resnet.blocks_per_group, takes_width=True,
        names=tuple(f"wrn_{d}_{k}" for d, k in ((16, 1), (16, 2), (16, 4), (16, 8), (28, 10), (40, 4), (100, 1),
                                                  (100, 2), (1000, 1)))),
    "resnet_v1": Architecture(
        "ResNet V1", "ResNet-{depth} V1", _resnet(1), (224, 224, 3), False, "50, 101, 152", _resnet_depth,
        names=tuple(f"resnet{d}_v1" for d in resnet.BLOCKS_PER_STAGE)),
    "resnet_v2": Architecture(
        "ResNet V2", "ResNet-{depth} V2", _resnet(2), (224, 224, 3), True, "50, 101, 152", _resnet_depth,
        names=tuple(f"resnet{d}_v2" for d in resnet.BLOCKS_PER_STAGE)),
    "cifar_resnet": Architecture(
        "CIFAR ResNet", "ResNet-{depth} (CIFAR)", cifar_resnet.CifarResNet, (32, 32, 3), False, "6n+2 (8, 20, 32, 44, 56, 110, 1202)",
        cifar_resnet.blocks_per_stage, options=("shortcut", "stem_init"),
        names=tuple(f"cifar_resnet{d}" for d in (20, 32, 44, 56, 110, 1202))),
}
MODELS = tuple(ARCHITECTURES)
_PATTERNS = (
    (re.compile(r"resnet(\d+)_v([12])"), lambda m: (f"resnet_v{m[2]}", int(m[1]), None)),
    (re.compile(r"wrn_(\d+)_(\d+)"), lambda m: ("wrn", int(m[1]), int(m[2]))),
    (re.compile(r"cifar_resnet(\d+)"), lambda m: ("cifar_resnet", int(m[1]), None)),
)


def architecture(model):
    """The `Architecture` of `model` (one of `MODELS`), or a ValueError naming them."""
    if model not in ARCHITECTURES:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    return ARCHITECTURES[model]


def title(model, depth="n", width=None):
    """The name tables and plots use: WRN-16-1, ResNet-50 V2, ResNet-20 (CIFAR)."""
    return architecture(model).label.format(depth=depth, width=width)


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
    if arch.takes_width:
        return arch.constructor(depth, width, **kwargs)
    if width is not None:
        raise ValueError(f"width applies only to model='wrn', got width={width!r} for model={model!r}")
    return arch.constructor(depth, **kwargs)


def parse_name(name):
    """(model, depth, width) of a model name, e.g. 'wrn_16_4' -> ('wrn', 16, 4)."""
    for pattern, parts in _PATTERNS:
        match = pattern.fullmatch(name) if isinstance(name, str) else None
        if match:
            model, depth, width = parts(match)
            ARCHITECTURES[model].check_depth(depth)
            if width is not None and width < 1:
                raise ValueError(f"{name}: the width must be a positive int")
            return model, depth, width
    raise ValueError(f"unknown model name {name!r}: resnet<50|101|152>_v<1|2>, wrn_<depth>_<width> or "
                     f"cifar_resnet<depth>; e.g. {', '.join(list_models()[:3])}, ... (list_models())")


def list_models(pattern="*"):
    """The registered model names matching the shell-style `pattern`
    ('wrn_*', '*_v2'), sorted. `create_model` also takes any other valid
    depth or width of a family ('wrn_52_2', 'cifar_resnet74')."""
    names = [n for arch in ARCHITECTURES.values() for n in arch.names]
    return sorted(fnmatch.filter(names, pattern), key=_sort_key)


def _sort_key(name):
    model, depth, width = parse_name(name)
    return MODELS.index(model), depth, width or 0


def create_model(name, **kwargs):
    """The model `name` (see `list_models`); keyword arguments go to its
    constructor (normalization=..., input_shape=..., classes=...,
    include_top=False, pyramid_outputs=True, ...).

        create_model("wrn_16_4", normalization="skipinit")
        create_model("resnet50_v2", include_top=False, pyramid_outputs=True)
    """
    model, depth, width = parse_name(name)
    return build(model, depth, width, **kwargs)
