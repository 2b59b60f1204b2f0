"""Wide-ResNet n-k (Zagoruyko & Komodakis 2016), CIFAR style.

A 3x3 stem with 16 channels, then 3 groups of (n - 4) / 6 pre-activation basic
blocks of widths 16k, 32k, 64k (strides 1, 2, 2), then norm-ReLU, global
average pooling and the classifier. The SkipInit paper trains n-2 for n in
{16, 100, 1000}, 16-4 and 28-10 (§2.3, §3, App. E).
"""

import keras

from keras_skipinit import layers as ksl, normalization as norm_lib, spec
from keras_skipinit.applications import _base

GROUP_WIDTHS = (16, 32, 64)
GROUP_STRIDES = (1, 2, 2)
BRANCH_LAYERS = 2  # Fixup's m for a basic block
blocks_per_group = spec.wrn_blocks_per_group


def block_specs(depth, width):
    """(prefix, filters, stride) for every residual block."""
    n = blocks_per_group(depth)
    return [
        (f"group{g + 1}_block{i + 1}", base * width, stride if i == 0 else 1)
        for g, (base, stride) in enumerate(zip(GROUP_WIDTHS, GROUP_STRIDES))
        for i in range(n)
    ]


def basic_block(x, ops, filters, stride, prefix):
    """Pre-activation basic block: (norm-ReLU-conv3x3) x2 + skip."""
    preact = ops.preact(x, prefix + "_preact_bn", prefix + "_preact_relu")
    projected = x.shape[-1] != filters or stride != 1
    if projected:
        shortcut = ops.conv(preact, filters, 1, prefix + "_0_conv", strides=stride)
    else:
        shortcut = x
    y = ops.conv(preact, filters, 3, prefix + "_1_conv", strides=stride, role="branch")
    y = ops.act(ops.norm(y, prefix + "_1_bn"), prefix + "_1_relu")
    y = ops.conv(y, filters, 3, prefix + "_2_conv", role="last")
    y = ops.branch_end(y, prefix)
    return keras.layers.Identity(name=prefix + "_out")(ops.merge(shortcut, y, prefix, projected=projected))


@_base.constructor(classes=10)
def WideResNet(depth=16, width=2, **arguments):
    """Wide-ResNet `depth`-`width` (depth = 6k+4, any k: 1000+ layers work).

    Arguments as `keras_skipinit.applications.ResNet`, with CIFAR defaults:
    input (32, 32, 3), 10 classes, ghost batch 64 (§3), dropout 0.6 for
    'regularized_skipinit' (§4); convs have no bias unless `use_bias` or the
    method asks for them. `pyramid_outputs=True` (with include_top=False):
    the three groups' outputs as {"P0", "P1", "P2"} at strides 1, 2, 4.
    """
    if not ksl._is_int(width) or width < 1:
        raise ValueError(f"WideResNet width must be a positive int, got {width!r}.")
    specs = block_specs(depth, width)
    depth, width = int(depth), int(width)

    def body(x, ops):
        x = ops.conv(x, GROUP_WIDTHS[0], 3, "stem_conv")
        x = ops.stack(x, specs, basic_block)
        return ops.preact(x, "post_bn", "post_relu")

    context = norm_lib.Context(num_blocks=len(specs), branch_layers=BRANCH_LAYERS, v1=False,
                               default_ghost_batch_size=64, default_regularized_dropout=0.6)
    return _base.build(body, arguments, context=context, default_name=f"wide_resnet{depth}_{width}",
                       default_input_shape=(32, 32, 3), stem_stride=1)
