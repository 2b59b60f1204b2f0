"""The CIFAR ResNets of He et al. (2016a) §4.2: ResNet-20, 32, 44, 56, 110, 1202.

6n+2 layers: a 3x3 stem with 16 channels (conv-norm-ReLU), three stages of n
post-activation basic blocks (conv-norm-ReLU-conv-norm, add, ReLU) of widths
16, 32, 64 (the first block of stages 2 and 3 with stride 2), global average
pooling and the classifier. Shortcuts are parameter-free "option A" (identity,
subsampled, new channels zero; §4.2) or 1x1 projections + norm ("option B").

This is also the architecture of the Fixup authors' CIFAR code
(hongyi-zhang/Fixup, `cifar/models/fixup_resnet_cifar.py`), which
`normalization="fixup"` follows: a scalar bias before each branch conv, before
each branch ReLU, before the stem ReLU and before the classifier, none before
the stem conv nor before a block's final ReLU; the block's first bias is also
added to the shortcut's input; conv1 of each branch He-normal by fan-out times
L^-1/2 (m = 2), conv2 and the classifier zero. Convs are He-normal by fan-out
(that code's and PyTorch ResNets' convention) except the stem: see
`CifarResNet(stem_init=...)`.
"""

import keras

from keras_skipinit import layers as ksl, normalization as norm_lib, spec
from keras_skipinit.applications import _base

STAGE_WIDTHS = (16, 32, 64)
STAGE_STRIDES = (1, 2, 2)
BRANCH_LAYERS = 2  # Fixup's m for a basic block
SHORTCUTS, STEM_INITS = spec.SHORTCUTS, spec.STEM_INITS
blocks_per_stage = spec.cifar_blocks_per_stage
FAN_MODE = "fan_out"


def block_specs(depth):
    """(prefix, filters, stride) for every residual block."""
    n = blocks_per_stage(depth)
    return [
        (f"stage{s + 1}_block{i + 1}", filters, stride if i == 0 else 1)
        for s, (filters, stride) in enumerate(zip(STAGE_WIDTHS, STAGE_STRIDES))
        for i in range(n)
    ]


def basic_block(x, ops, filters, stride, prefix, shortcut="A"):
    """Post-activation basic block: conv-norm-ReLU-conv-norm, add, ReLU."""
    x_in = ops.scalar_bias(x, prefix + "_1_conv_bias")  # Fixup: shared with the shortcut
    if x.shape[-1] == filters and stride == 1:
        skip = x
    elif shortcut == "A":
        skip = ksl.ZeroPadShortcut(filters, stride, name=prefix + "_0_pad")(x_in)
    else:
        skip = ops.conv(x_in, filters, 1, prefix + "_0_conv", strides=stride, fan_mode=FAN_MODE, input_bias=False)
        skip = ops.norm(skip, prefix + "_0_bn")
    y = ops.conv(x_in, filters, 3, prefix + "_1_conv", strides=stride, role="branch", fan_mode=FAN_MODE,
                 input_bias=False)
    y = ops.act(ops.norm(y, prefix + "_1_bn"), prefix + "_1_relu")
    y = ops.conv(y, filters, 3, prefix + "_2_conv", role="last", fan_mode=FAN_MODE)
    y = ops.branch_end(ops.norm(y, prefix + "_2_bn"), prefix)
    x = ops.merge(skip, y, prefix, v1=True)
    return keras.layers.Activation("relu", name=prefix + "_out")(x)


@_base.constructor(classes=10)
def CifarResNet(depth=20, *, shortcut="A", stem_init="he_normal", **arguments):
    """ResNet-`depth` for CIFAR (depth = 6n+2: 20, 32, 44, 56, 110, 1202, ...).

    Arguments as `keras_skipinit.applications.ResNet` (a V1 network: SkipInit
    adds its scalar bias before each block's final ReLU, App. F; 'nf' needs
    pre-activation blocks and is refused), with CIFAR defaults: input
    (32, 32, 3), 10 classes, ghost batch 64, dropout 0.6 for
    'regularized_skipinit'. In addition:
      shortcut: 'A' (default, He et al. §4.2 and the Fixup authors' code:
        parameter-free, zero channels) or 'B' (1x1 projection + norm where
        the shape changes).
      stem_init: 'he_normal' (default: He et al. 2015, the initialization
        He et al. 2016 use and Fixup's rule 1 names for every layer outside
        the branches) or 'pytorch_default' (U(+-1/sqrt(fan_in)), which the
        Fixup authors' code leaves on its stem: their exact network).
      pyramid_outputs: with include_top=False, the three stages' outputs as
        {"P0", "P1", "P2"} at strides 1, 2, 4.
    """
    if shortcut not in SHORTCUTS:
        raise ValueError(f"shortcut must be one of {SHORTCUTS}, got {shortcut!r}.")
    if stem_init not in STEM_INITS:
        raise ValueError(f"stem_init must be one of {STEM_INITS}, got {stem_init!r}.")
    specs = block_specs(depth)
    depth = int(depth)

    def block(x, ops, filters, stride, prefix):
        return basic_block(x, ops, filters, stride, prefix, shortcut=shortcut)

    def body(x, ops):
        # The authors' code has no scalar bias before the stem conv.
        x = ops.conv(x, STAGE_WIDTHS[0], 3, "stem_conv", init=stem_init, input_bias=False)
        x = ops.act(ops.norm(x, "stem_bn"), "stem_relu")
        return ops.stack(x, specs, block)

    context = norm_lib.Context(num_blocks=len(specs), branch_layers=BRANCH_LAYERS, v1=True,
                               default_ghost_batch_size=64, default_regularized_dropout=0.6)
    return _base.build(body, arguments, context=context, default_name=f"cifar_resnet{depth}",
                       default_input_shape=(32, 32, 3), stem_stride=1)
