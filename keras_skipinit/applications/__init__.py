"""Model zoo: ResNet-V1/V2, Wide-ResNet and the CIFAR ResNets with a `normalization=` switch."""

from keras_skipinit.applications.cifar_resnet import CifarResNet

from keras_skipinit.applications.resnet import (
    ResNet,
    ResNet50V1,
    ResNet50V2,
    ResNet101V1,
    ResNet101V2,
    ResNet152V1,
    ResNet152V2,
)
from keras_skipinit.applications.wide_resnet import WideResNet

# The architectures by the names train.py, the sweep, analysis and
# model_spec.json use for them.
MODELS = ("wrn", "resnet_v1", "resnet_v2", "cifar_resnet")


def build(model, depth, width=None, **kwargs):
    """The zoo's model `model` (one of `MODELS`) of `depth`; `width` is the
    WRN widening factor (WRN only); keyword arguments go to the constructor."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    if model == "wrn":
        return WideResNet(depth, width, **kwargs)
    if width is not None:
        raise ValueError(f"width applies only to model='wrn', got width={width!r} for model={model!r}")
    if model == "cifar_resnet":
        return CifarResNet(depth, **kwargs)
    return ResNet(depth, 1 if model == "resnet_v1" else 2, **kwargs)


__all__ = [
    "MODELS",
    "build",
    "CifarResNet",
    "ResNet",
    "ResNet50V1",
    "ResNet50V2",
    "ResNet101V1",
    "ResNet101V2",
    "ResNet152V1",
    "ResNet152V2",
    "WideResNet",
]
