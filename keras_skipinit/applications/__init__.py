"""Model zoo: ResNet-V1/V2, Wide-ResNet and the CIFAR ResNets with a `normalization=` switch.

By name: `create_model("wrn_16_4", normalization="skipinit")`, `list_models()`;
the architecture facts the package reads are one table, `ARCHITECTURES`.
"""

from keras_skipinit.applications.cifar_resnet import CifarResNet
from keras_skipinit.applications.registry import (
    ARCHITECTURES,
    MODELS,
    Architecture,
    architecture,
    build,
    create_model,
    list_models,
)
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
    "ARCHITECTURES",
    "MODELS",
    "Architecture",
    "architecture",
    "build",
    "create_model",
    "list_models",
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
