"""Layer-sequential unit-variance initialization (LSUV; Mishkin & Matas 2016).

The baseline of Fixup's depth experiment (Fixup §4.1, Fig. 3) for networks
without normalization. Algorithm 1 of Mishkin & Matas: initialize every conv
and dense kernel with an orthonormal matrix, then, layer by layer in forward
order, divide the kernel by the standard deviation of the layer's output on
one batch of training data until that variance is within `tolerance` of 1
(at most `max_iterations` times per layer).
"""

import keras
from keras import ops

from keras_skipinit import layers as ksl

WEIGHT_LAYERS = (keras.layers.Conv2D, keras.layers.Dense)


def lsuv_init(model, images, tolerance=0.1, max_iterations=10, seed=None):
    """Applies LSUV to a built `model` without normalization layers, in place.

    Args:
      model: a functional Keras model (e.g. `WideResNet(..., normalization='none')`).
      images: one batch of (preprocessed) training inputs.
      tolerance: stop rescaling a layer when |Var(output) - 1| < tolerance.
      max_iterations: rescalings per layer at most.
      seed: seed of the orthonormal initialization.

    Returns one record per conv/dense layer: name, output variance after the
    orthonormal init and after LSUV, and the number of rescalings. A layer
    whose output is identically zero (e.g. zero-initialized) is left as is.
    """
    _check(model)
    if not 0 < tolerance < 1 or max_iterations < 1:
        raise ValueError(f"need 0 < tolerance < 1 and max_iterations >= 1, got {tolerance}, {max_iterations}")
    weight_layers = [layer for layer in model.layers if isinstance(layer, WEIGHT_LAYERS)]
    if not weight_layers:
        raise ValueError(f"model {model.name!r} has no Conv2D or Dense layers to initialize")
    for i, layer in enumerate(weight_layers):
        orthogonal = keras.initializers.Orthogonal(seed=None if seed is None else seed * 7919 + i)
        layer.kernel.assign(orthogonal(layer.kernel.shape, dtype=layer.kernel.dtype))
        if layer.use_bias:
            layer.bias.assign(ops.zeros(layer.bias.shape, layer.bias.dtype))
    images = ops.convert_to_tensor(images)
    records = []
    for layer in weight_layers:  # model.layers is in topological (forward) order
        # The layer's input depends only on earlier layers, already final.
        if layer.input is model.inputs[0]:
            inputs = images
        else:
            inputs = keras.Model(model.input, layer.input)(images, training=False)
        variance = initial = float(ops.convert_to_numpy(ops.var(layer(inputs))))
        steps = 0
        while variance > 0 and abs(variance - 1.0) >= tolerance and steps < max_iterations:
            layer.kernel.assign(layer.kernel / ops.sqrt(ops.cast(variance, layer.kernel.dtype)))
            variance = float(ops.convert_to_numpy(ops.var(layer(inputs))))
            steps += 1
        records.append({"layer": layer.name, "initial_variance": initial, "variance": variance, "iterations": steps})
    return records


def _check(model):
    """LSUV rescales kernels to unit output variance: meaningless where a
    normalization layer or a weight-standardized conv undoes the scale."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            raise ValueError(
                f"LSUV initializes networks without normalization; {model.name!r} has the normalization layer "
                f"{layer.name!r}. Build the model with normalization='none' (or another method without BN)."
            )
        if isinstance(layer, ksl.ScaledWSConv2D):
            raise ValueError(
                f"LSUV cannot rescale weight-standardized convolutions ({layer.name!r} of {model.name!r}): "
                "they standardize their kernels on every call."
            )
