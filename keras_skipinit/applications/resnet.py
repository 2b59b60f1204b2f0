"""ResNet-V1 (He et al. 2016a) and ResNet-V2 (He et al. 2016b) bottleneck nets.

The block table is data shared by V1 and V2 and all depths. With
``normalization="batchnorm"`` the models match keras.applications
``ResNet50`` / ``ResNet50V2`` layer for layer (parameter counts equal).
V2 puts the stride in the last block of the first three stages (SkipInit
App. G, keras.applications); V1 in the first block of the last three stages.
"""

import keras

from keras_skipinit import normalization as norm_lib, spec
from keras_skipinit.applications import _base

BLOCKS_PER_STAGE = spec.RESNET_BLOCKS
STAGE_FILTERS = (64, 128, 256, 512)  # bottleneck width; block output is 4x
EXPANSION = 4
BRANCH_LAYERS = 3  # Fixup's m for a bottleneck branch


def block_specs(depth, version):
    """(prefix, bottleneck filters, stride) for every residual block."""
    specs = []
    for stage, (blocks, filters) in enumerate(zip(BLOCKS_PER_STAGE[depth], STAGE_FILTERS)):
        for i in range(blocks):
            if version == 1:
                stride = 2 if stage > 0 and i == 0 else 1
            else:
                stride = 2 if stage < 3 and i == blocks - 1 else 1
            specs.append((f"conv{stage + 2}_block{i + 1}", filters, stride))
    return specs


def bottleneck_v1(x, ops, filters, stride, prefix):
    """Post-activation bottleneck: conv-norm-relu x2, conv-norm, add, relu."""
    if x.shape[-1] != EXPANSION * filters:
        shortcut = ops.conv(x, EXPANSION * filters, 1, prefix + "_0_conv", strides=stride, bias=True)
        shortcut = ops.norm(shortcut, prefix + "_0_bn")
    else:
        shortcut = x
    y = ops.conv(x, filters, 1, prefix + "_1_conv", strides=stride, bias=True, role="branch")
    y = ops.act(ops.norm(y, prefix + "_1_bn"), prefix + "_1_relu")
    y = ops.conv(y, filters, 3, prefix + "_2_conv", bias=True, role="branch")
    y = ops.act(ops.norm(y, prefix + "_2_bn"), prefix + "_2_relu")
    y = ops.conv(y, EXPANSION * filters, 1, prefix + "_3_conv", bias=True, role="last")
    y = ops.branch_end(ops.norm(y, prefix + "_3_bn"), prefix)
    x = ops.merge(shortcut, y, prefix, v1=True)
    return keras.layers.Activation("relu", name=prefix + "_out")(x)


def bottleneck_v2(x, ops, filters, stride, prefix):
    """Pre-activation bottleneck with an identity skip (SkipInit App. G)."""
    preact = ops.preact(x, prefix + "_preact_bn", prefix + "_preact_relu")
    projected = x.shape[-1] != EXPANSION * filters
    if projected:
        shortcut = ops.conv(preact, EXPANSION * filters, 1, prefix + "_0_conv", strides=stride, bias=True)
    elif stride > 1:
        shortcut = keras.layers.MaxPooling2D(1, strides=stride, name=prefix + "_0_max_pool")(x)
    else:
        shortcut = x
    y = ops.conv(preact, filters, 1, prefix + "_1_conv", role="branch")
    y = ops.act(ops.norm(y, prefix + "_1_bn"), prefix + "_1_relu")
    y = ops.conv(y, filters, 3, prefix + "_2_conv", strides=stride, role="branch")
    y = ops.act(ops.norm(y, prefix + "_2_bn"), prefix + "_2_relu")
    y = ops.conv(y, EXPANSION * filters, 1, prefix + "_3_conv", bias=True, role="last")
    y = ops.branch_end(y, prefix)
    return keras.layers.Identity(name=prefix + "_out")(ops.merge(shortcut, y, prefix, projected=projected))


def _body(depth, version):
    block = bottleneck_v1 if version == 1 else bottleneck_v2

    def body(x, ops):
        x = ops.conv(x, 64, 7, "conv1_conv", strides=2, bias=True)
        if version == 1:
            x = ops.act(ops.norm(x, "conv1_bn"), "conv1_relu")
        x = keras.layers.ZeroPadding2D(1, name="pool1_pad")(x)
        x = keras.layers.MaxPooling2D(3, strides=2, name="pool1_pool")(x)
        x = ops.stack(x, block_specs(depth, version), block, expansion=EXPANSION)
        if version == 2:
            x = ops.preact(x, "post_bn", "post_relu")
        return x

    return body


@_base.constructor(classes=1000)
def ResNet(depth, version, **arguments):
    """A bottleneck ResNet of `depth` (50, 101, 152), `version` 1 or 2.

    Arguments follow keras.applications (include_top, weights, input_tensor,
    input_shape (default (224, 224, 3)), pooling, classes (default 1000),
    classifier_activation, name), then the keyword-only arguments below.
    `pyramid_outputs=True`: {"P2", "P3", "P4", "P5"} at strides 4, 8, 16, 32.
    `weights="imagenet"` (BatchNorm or Ghost BatchNorm): keras.applications'
    ImageNet weights, for its input scaling (`applications._base.imagenet_weights`).
    """
    spec.resnet_blocks(depth)
    if version not in (1, 2):
        raise ValueError(f"ResNet version must be 1 or 2, got {version!r}.")
    context = norm_lib.Context(num_blocks=sum(BLOCKS_PER_STAGE[depth]), branch_layers=BRANCH_LAYERS, v1=version == 1,
                               default_ghost_batch_size=256, default_regularized_dropout=0.2)
    return _base.build(_body(depth, version), arguments, context=context, default_name=f"resnet{depth}v{version}",
                       default_input_shape=(224, 224, 3), stem_stride=4,
                       keras_application=spec.keras_application(f"resnet_v{version}", depth))


def _variant(depth, version):
    constructor = _base.variant(ResNet, depth=depth, version=version)
    constructor.__name__ = constructor.__qualname__ = f"ResNet{depth}V{version}"
    paper = " (He et al. 2016a, post-activation)" if version == 1 else " (He et al. 2016b, pre-activation)"
    constructor.__doc__ = (f"Instantiates the ResNet{depth}V{version} architecture{paper}: `ResNet` without `depth` "
                           f"and `version`.\n\n" + ResNet.__doc__.split("\n\n", 1)[1])
    return constructor


ResNet50V1 = _variant(50, 1)
ResNet101V1 = _variant(101, 1)
ResNet152V1 = _variant(152, 1)
ResNet50V2 = _variant(50, 2)
ResNet101V2 = _variant(101, 2)
ResNet152V2 = _variant(152, 2)
