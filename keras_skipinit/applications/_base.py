"""The keras.applications-style builder shared by every model in the zoo."""

import math
import os
import sys

import keras

from keras_skipinit import layers as ksl, normalization as norm_lib

POOLINGS = (None, "avg", "max")


def _check_input_shape(input_shape, default):
    if input_shape is None:
        return default
    shape = tuple(input_shape)
    if len(shape) != 3 or any(d is not None and (not ksl._is_int(d) or d < 1) for d in shape):
        raise ValueError(
            "input_shape must be (height, width, channels) with positive ints "
            f"(or None for a dynamic spatial size), got {input_shape!r}."
        )
    if shape[-1] is None:
        raise ValueError(f"input_shape must fix the number of channels, got {input_shape!r}.")
    return tuple(None if d is None else int(d) for d in shape)


def build(
    body_fn,
    recipe_kwargs,
    *,
    include_top,
    weights,
    input_tensor,
    input_shape,
    pooling,
    classes,
    classifier_activation,
    name,
    default_input_shape,
    seed,
    pyramid_outputs=False,
    stem_stride=1,
):
    """Validates the common arguments, resolves the recipe, builds the model.

    ``body_fn(inputs, ops)`` returns the final feature map (after the last
    activation); the head here is global pooling + the classifier. With
    `pyramid_outputs` (and include_top=False, pooling=None) the model returns
    the stage outputs instead, `pyramid(...)`; `stem_stride` is the stride of
    the body's first residual block input.
    """
    if not isinstance(include_top, bool):
        raise ValueError(f"include_top must be True or False, got {include_top!r}.")
    if not isinstance(pyramid_outputs, bool):
        raise ValueError(f"pyramid_outputs must be True or False, got {pyramid_outputs!r}.")
    if pyramid_outputs and (include_top or pooling is not None):
        raise ValueError("pyramid_outputs=True returns feature maps: pass include_top=False and pooling=None "
                         f"(got include_top={include_top!r}, pooling={pooling!r}).")
    if weights is not None and not (isinstance(weights, (str, os.PathLike)) and os.path.isfile(weights)):
        raise ValueError(
            "weights must be None (random initialization) or the path to an existing "
            f"weights file (.weights.h5), got {weights!r}."
        )
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}.")
    if include_top and (not ksl._is_int(classes) or classes < 1):
        raise ValueError(f"classes must be a positive int when include_top=True, got {classes!r}.")
    classes = int(classes) if include_top else classes
    recipe = norm_lib.resolve(**recipe_kwargs)
    # Keras walks the functional graph recursively (a few frames per layer):
    # 1000-layer nets need far more than Python's default limit of 1000.
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000 + 60 * recipe.num_blocks))

    if input_tensor is None:
        inputs = keras.Input(shape=_check_input_shape(input_shape, default_input_shape))
        x = inputs
    elif keras.backend.is_keras_tensor(input_tensor):
        inputs = keras.utils.get_source_inputs(input_tensor)
        x = input_tensor
    else:
        raise ValueError(f"input_tensor must be a Keras tensor (keras.Input), got {type(input_tensor).__name__}.")

    ops = norm_lib.BlockOps(recipe, seed=seed)
    x = body_fn(x, ops)
    if pyramid_outputs:
        x = pyramid(ops.block_outputs, x, stem_stride)
    elif include_top:
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        x = ops.head(x, classes, classifier_activation)
    elif pooling == "avg":
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    elif pooling == "max":
        x = keras.layers.GlobalMaxPooling2D(name="max_pool")(x)
    model = keras.Model(inputs, x, name=name)
    if weights is not None:
        model.load_weights(weights)
    return model


def pyramid(block_outputs, features, stem_stride):
    """The stage outputs as keras-hub's `pyramid_outputs`: {"P<l>": the last
    block output at stride 2**l} for each stride the blocks reach, the
    deepest level being `features`, the body's final map (after the closing
    norm-ReLU of pre-activation nets; the other levels are the residual
    stream, as timm's `features_only` takes them). Strides 4/8/16/32 (P2..P5)
    for the ImageNet ResNets, 1/2/4 (P0..P2) for the CIFAR nets."""
    base = int(math.log2(stem_stride))
    levels = {}
    for level, tensor in block_outputs:
        levels[f"P{base + level}"] = tensor
    levels[f"P{base + block_outputs[-1][0]}"] = features
    return levels
