"""Model zoo: ResNet-V1/V2 and Wide-ResNet with a `normalization=` switch."""

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

__all__ = [
    "ResNet",
    "ResNet50V1",
    "ResNet50V2",
    "ResNet101V1",
    "ResNet101V2",
    "ResNet152V1",
    "ResNet152V2",
    "WideResNet",
]
