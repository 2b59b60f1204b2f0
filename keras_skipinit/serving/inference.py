"""The model that exports compute: affine layers folded into the convs,
looped stages unrolled, probabilities out.

`fold()` returns an equivalent model for inference with BatchNormalization,
SkipInit scalars, Fixup multipliers and biases and NF branch scales that
directly follow a convolution folded into its kernel and bias (exact: these
are per-channel affine maps of the conv output). A Fixup bias in front of a
1x1 convolution folds into the conv's bias (exact: no zero padding); in
front of a 3x3 convolution it is kept, since zero padding makes that fold
inexact at image borders. BNs before a ReLU (pre-activation) are kept.
"""

import keras
import numpy as np
import tensorflow as tf

from keras_skipinit import layers as ksl, looped


def _consumers(model):
    users = {}
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        for tensor in keras.tree.flatten(layer.input):
            users.setdefault(id(tensor), []).append(layer)
    return users


def _affine(layer):
    """(scale, shift) with layer(y) = scale * y + shift per channel, or None."""
    if isinstance(layer, keras.layers.BatchNormalization) and layer.axis in (-1, [-1], 3, [3]):
        inv = 1.0 / np.sqrt(layer.moving_variance.numpy() + layer.epsilon)
        gamma = layer.gamma.numpy() if layer.scale else 1.0
        beta = layer.beta.numpy() if layer.center else 0.0
        return gamma * inv, beta - gamma * inv * layer.moving_mean.numpy()
    if isinstance(layer, ksl.SkipInitScale):
        return float(layer.value.numpy()), 0.0
    if isinstance(layer, ksl.FixupBias):
        return 1.0, float(layer.value.numpy())
    if type(layer) is keras.layers.Rescaling:
        return float(layer.scale), float(layer.offset)
    return None


@keras.saving.register_keras_serializable(package="keras_skipinit")
class FoldedAway(keras.layers.Layer):
    """Stands where `fold` removed a layer: passes its input through and
    accepts the call arguments of the layer it replaces."""

    def call(self, inputs, training=None, mask=None):
        return inputs


def fold(model):
    """An equivalent inference model with affine followers (BN, SkipInit
    alphas, Fixup multipliers and biases, NF's Rescaling scales) folded into
    convs, and NF's ScaledWSConv2D made plain convs with their standardized
    kernels."""
    users = _consumers(model)
    plans = {}  # conv name -> (kernel, bias)
    removed = set()
    for conv in model.layers:
        # A ScaledWSConv2D (NF) becomes a plain conv with its standardized kernel (gain included).
        standardized = type(conv) is ksl.ScaledWSConv2D
        if type(conv) is not keras.layers.Conv2D and not standardized or conv.activation is not keras.activations.linear:
            continue
        kernel = keras.ops.convert_to_numpy(conv.standardized_kernel()) if standardized else conv.kernel.numpy()
        bias = conv.bias.numpy() if conv.use_bias else np.zeros(kernel.shape[-1], kernel.dtype)
        folded = []
        # A scalar bias feeding only this 1x1 conv: conv(x + c) = conv(x) + c * sum(W).
        producer = conv.input._keras_history.operation
        if (
            isinstance(producer, ksl.FixupBias)
            and conv.kernel_size == (1, 1)
            and len(users.get(id(producer.output), [])) == 1
        ):
            bias = bias + float(producer.value.numpy()) * kernel.sum(axis=(0, 1, 2))
            folded.append(producer.name)
        scale, shift = np.ones_like(bias), np.zeros_like(bias)
        tensor = conv.output
        while len(users.get(id(tensor), [])) == 1:
            follower = users[id(tensor)][0]
            affine = _affine(follower)
            if affine is None:
                break
            s, t = affine
            scale, shift = s * scale, s * shift + t
            folded.append(follower.name)
            tensor = follower.output
        if folded or standardized:
            removed.update(folded)
            plans[conv.name] = (kernel * scale, bias * scale + shift)

    def clone(layer):
        if layer.name in removed:
            return FoldedAway(name=layer.name)
        if layer.name in plans:
            config = layer.get_config()
            config.pop("eps", None)  # ScaledWSConv2D's
            config["use_bias"] = True
            return keras.layers.Conv2D.from_config(config)
        return layer.__class__.from_config(layer.get_config())

    folded = keras.models.clone_model(model, clone_function=clone)
    for layer in model.layers:
        if layer.name in plans:
            folded.get_layer(layer.name).set_weights(list(plans[layer.name]))
        elif layer.name not in removed and layer.weights:
            folded.get_layer(layer.name).set_weights(layer.get_weights())
    return folded


def probabilities(model, x):
    """The model's class probabilities for a preprocessed batch, float32
    (a softmax unless its last layer applies one)."""
    outputs = model(x, training=False)
    if getattr(model.layers[-1], "activation", None) is not keras.activations.softmax:
        outputs = tf.nn.softmax(outputs)
    return tf.cast(outputs, tf.float32)


def inference_model(model):
    """The folded (and unrolled) model the single-file exports compute."""
    return fold(looped.unroll(model))
