"""Layers for training residual networks with or without normalization.

- `SkipInitScale`: the learnable scalar at the end of a residual branch
  (SkipInit, De & Smith 2020, §2.2); with `initial_value=1` it is also Fixup's
  per-branch scalar multiplier (Fixup rule 3, Zhang et al. 2019, §3).
- `FixupBias`: one learnable scalar bias (Fixup rule 3; SkipInit App. F).
- `GhostBatchNormalization`: batch norm over virtual batches (SkipInit App. A
  and §3; Hoffer et al. 2017).
- `fixup_kernel_initializer`: He init scaled by L^(-1/(2m-2)) (Fixup rule 2).
- `ScaledWSConv2D`: scaled weight-standardized conv of NF-ResNets (Brock et
  al. 2021a; the NF-ResNet blog seed).
- `ZeroPadShortcut`: the parameter-free "option A" shortcut of the CIFAR
  ResNets (He et al. 2016, §4.1-4.2).
"""

import math
import numbers

import keras
from keras import ops

from keras_skipinit import compat
from keras_skipinit._checks import finite_number as _check_finite_number, is_int as _is_int

_PACKAGE = "keras_skipinit"


class _ScalarParameter(keras.layers.Layer):
    """One learnable scalar (shape ``()``) combined element-wise with the input."""

    weight_name = "value"

    def __init__(self, initial_value=0.0, **kwargs):
        super().__init__(**kwargs)
        self.initial_value = _check_finite_number("initial_value", initial_value)

    def build(self, input_shape):
        self.value = self.add_weight(
            shape=(),
            name=self.weight_name,
            initializer=keras.initializers.Constant(self.initial_value),
            trainable=True,
        )

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "initial_value": self.initial_value}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SkipInitScale(_ScalarParameter):
    """Multiplies its input by one learnable scalar ``alpha``.

    SkipInit (§2.2): "include a learnable scalar multiplier at the end of each
    residual branch, initialized to alpha"; the paper recommends alpha = 0
    (the block is the identity at init) and shows 1/sqrt(d) also trains, d
    being the number of residual blocks (Table 1). With ``initial_value=1.0``
    this is Fixup's scalar multiplier (rule 3).
    """

    weight_name = "alpha"

    def call(self, inputs):
        return inputs * ops.cast(self.value, inputs.dtype)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class FixupBias(_ScalarParameter):
    """Adds one learnable scalar bias (init 0).

    Fixup rule 3 places one before each convolution, linear layer and
    activation; SkipInit App. F places one after the merge of a ResNet-V1
    block, before its final ReLU.
    """

    weight_name = "bias"

    def call(self, inputs):
        return inputs + ops.cast(self.value, inputs.dtype)


def fixup_kernel_initializer(num_branches, branch_layers, seed=None, mode="fan_in"):
    """He-normal initializer scaled by ``L^(-1/(2m-2))`` (Fixup rule 2, §3).

    L is the number of residual branches, m the number of weight layers in a
    branch. The result is a plain `VarianceScaling` (untruncated normal), so
    the standard deviation is ``sqrt(2/fan) * L^(-1/(2m-2))``, fan = fan-in
    (default) or fan-out (`mode="fan_out"`, the authors' CIFAR code).
    """
    if not _is_int(num_branches) or num_branches < 1:
        raise ValueError(f"num_branches must be a positive int, got {num_branches!r}.")
    if not _is_int(branch_layers) or branch_layers < 2:
        raise ValueError(
            f"branch_layers (m) must be an int >= 2 for Fixup's L^(-1/(2m-2)), got {branch_layers!r}."
        )
    multiplier = int(num_branches) ** (-1.0 / (2 * int(branch_layers) - 2))
    return keras.initializers.VarianceScaling(
        scale=2.0 * multiplier**2,
        mode=mode,
        distribution="untruncated_normal",
        seed=seed,
    )


@keras.saving.register_keras_serializable(package=_PACKAGE)
class GhostBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization with statistics over virtual ("ghost") batches.

    SkipInit App. A / §3 and Hoffer et al. (2017): in training, the batch is
    split into consecutive groups of ``ghost_batch_size`` examples and each
    group is normalized by its own per-channel mean and (biased) variance.
    If the batch size is not a multiple of ``ghost_batch_size``, the last
    ghost batch holds the remaining ``batch % ghost_batch_size`` examples and
    is normalized by its own statistics (a batch smaller than the ghost size is
    one ghost batch). The moving mean and variance are updated with the
    example-weighted average of the ghost means and of the ghost variances;
    inference uses the moving statistics, as in `BatchNormalization`.

    Ghost batches are formed from the examples a replica sees, so under
    `tf.distribute` strategies the statistics are replica-local and do not
    depend on the number of replicas (as long as each replica's batch is a
    multiple of the ghost size); the moving-statistic updates are averaged over
    replicas. Statistics are computed in float32 under mixed precision. With
    ``ghost_batch_size=None`` the layer is plain `BatchNormalization`.
    Only channels-last normalization (``axis=-1``) is supported.
    """

    def __init__(self, ghost_batch_size=None, axis=-1, **kwargs):
        if "virtual_batch_size" in kwargs:  # tf_keras' name: a DeprecationWarning (`compat.RENAMED_KEYWORDS`)
            given = {"virtual_batch_size": kwargs.pop("virtual_batch_size")}
            if ghost_batch_size is not None:
                given["ghost_batch_size"] = ghost_batch_size
            ghost_batch_size = compat.keywords(given, "GhostBatchNormalization")["ghost_batch_size"]
        if ghost_batch_size is not None and (
            isinstance(ghost_batch_size, bool)
            or not isinstance(ghost_batch_size, numbers.Integral)
            or ghost_batch_size < 1
        ):
            raise ValueError(
                "ghost_batch_size must be a positive int or None, "
                f"got {ghost_batch_size!r}."
            )
        if axis != -1:
            raise ValueError(f"GhostBatchNormalization supports axis=-1 (channels last) only, got axis={axis!r}.")
        if kwargs.get("renorm") or kwargs.get("synchronized"):
            raise ValueError("GhostBatchNormalization does not support renorm or synchronized statistics.")
        super().__init__(axis=axis, **kwargs)
        self.ghost_batch_size = None if ghost_batch_size is None else int(ghost_batch_size)

    def add_weight(self, *args, **kwargs):
        # Moving statistics are updated per replica; average the updates.
        if kwargs.get("trainable") is False:
            kwargs.setdefault("aggregation", "mean")
        return super().add_weight(*args, **kwargs)

    def call(self, inputs, training=None, mask=None):
        if mask is not None:
            raise ValueError("GhostBatchNormalization does not support masks.")
        if not (training and self.trainable and self.ghost_batch_size):
            return super().call(inputs, training=training)
        x = ops.cast(inputs, "float32")
        outputs, mean, variance = self._ghost_normalize(x)
        momentum = self.momentum
        self.moving_mean.assign(self.moving_mean * momentum + mean * (1.0 - momentum))
        self.moving_variance.assign(self.moving_variance * momentum + variance * (1.0 - momentum))
        return ops.cast(outputs, self.compute_dtype)

    def _ghost_normalize(self, x):
        """Normalizes each ghost batch of `x` (float32, channels last).

        Example i belongs to ghost batch i // ghost_batch_size; per-example
        means over positions are combined per ghost batch with segment sums
        (no padding: cost independent of how the batch size relates to the
        ghost size; every example has the same number of positions, so the
        mean of per-example means is the ghost batch mean). Two passes (mean,
        then centred squares) as in `BatchNormalization`. Returns the output
        and the example-weighted averages of the ghost means and variances,
        each of shape (channels,). Written in `keras.ops`: any backend.
        """
        rank = len(x.shape)
        spatial = tuple(range(1, rank - 1))
        batch = ops.shape(x)[0]  # an int, or a scalar tensor for a dynamic batch under TF
        segment = ops.floor_divide(ops.arange(batch), self.ghost_batch_size)
        num_ghost = (batch + self.ghost_batch_size - 1) // self.ghost_batch_size

        def per_ghost(values):  # [batch, ...spatial, C] -> [num_ghost, C]
            per_example = ops.mean(values, axis=spatial) if spatial else values
            return ops.segment_sum(per_example, segment, num_segments=num_ghost) / count

        def per_example(stat):  # [num_ghost, C] -> broadcastable to x
            return ops.reshape(ops.take(stat, segment, axis=0), (-1,) + (1,) * (rank - 2) + (x.shape[-1],))

        ones = ops.ones_like(x[(slice(None),) + (0,) * (rank - 1)])[:, None]  # [batch, 1]
        count = ops.segment_sum(ones, segment, num_segments=num_ghost)  # examples per ghost batch
        mean = per_ghost(x)
        centered = x - per_example(mean)
        variance = per_ghost(ops.square(centered))
        normalized = centered * per_example(ops.rsqrt(variance + self.epsilon))
        if self.scale:
            normalized = normalized * ops.cast(self.gamma, "float32")
        if self.center:
            normalized = normalized + ops.cast(self.beta, "float32")
        weights = count / ops.sum(count)
        return normalized, ops.sum(mean * weights, axis=0), ops.sum(variance * weights, axis=0)

    def get_config(self):
        config = super().get_config()
        for key in ("renorm", "renorm_clipping", "renorm_momentum", "synchronized"):
            config.pop(key, None)
        return {**config, "ghost_batch_size": self.ghost_batch_size}

    @classmethod
    def from_config(cls, config):
        return cls(**compat.ghost_batch_norm_config(config))


# ReLU gain that maps N(0, 1) inputs to unit-variance outputs:
# Var(relu(z)) = (1 - 1/pi) / 2, so gamma = sqrt(2 / (1 - 1/pi)) (Brock et al. 2021a, §4).
NF_RELU_GAMMA = math.sqrt(2.0 / (1.0 - 1.0 / math.pi))


@keras.saving.register_keras_serializable(package=_PACKAGE)
class ScaledWSConv2D(keras.layers.Conv2D):
    """Conv2D with Scaled Weight Standardization (NF-ResNets, Brock et al. 2021a).

    The kernel used is ``gain * (W - mean(W)) / (std(W) * sqrt(fan_in))`` with
    mean and std per output channel and a learnable per-channel ``gain``
    (init 1). Centred weights make every output zero-mean and, for
    unit-variance inputs, unit-variance, so the residual branch preserves
    variance and the analytic bookkeeping of NF-ResNets holds (the centred
    weight normalization of the NF-ResNet blog).
    """

    def __init__(self, *args, eps=1e-4, **kwargs):
        super().__init__(*args, **kwargs)
        self.eps = float(eps)

    def build(self, input_shape):
        super().build(input_shape)
        self.gain = self.add_weight(shape=(self.filters,), name="gain", initializer="ones", trainable=True)

    def standardized_kernel(self):
        kernel = ops.cast(self.kernel, "float32")
        fan_in = float(math.prod(kernel.shape[:-1]))
        mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
        var = ops.var(kernel, axis=(0, 1, 2), keepdims=True)
        scale = ops.rsqrt(ops.maximum(var * fan_in, self.eps)) * ops.cast(self.gain, "float32")
        return (kernel - mean) * scale

    def call(self, inputs):
        kernel = ops.cast(self.standardized_kernel(), inputs.dtype)
        outputs = self.convolution_op(inputs, kernel)
        if self.use_bias:
            outputs = outputs + ops.cast(self.bias, outputs.dtype)
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    # Conv2D saves only kernel and bias; the gain goes after them.
    def save_own_variables(self, store):
        super().save_own_variables(store)
        if self.built:
            store[str(2 if self.use_bias else 1)] = self.gain

    def load_own_variables(self, store):
        super().load_own_variables(store)
        if self.built:
            self.gain.assign(store[str(2 if self.use_bias else 1)])

    def get_config(self):
        return {**super().get_config(), "eps": self.eps}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class ZeroPadShortcut(keras.layers.Layer):
    """Option A shortcut (He et al. 2016, §4.1-4.2): the identity, subsampled
    by `strides` and with zero channels appended up to `filters`; no
    parameters. The Fixup authors' CIFAR ResNet appends the zeros after the
    input's channels (`torch.cat((x, zeros), 1)`), as here.
    """

    def __init__(self, filters, strides=1, **kwargs):
        super().__init__(**kwargs)
        if not _is_int(filters) or filters < 1 or not _is_int(strides) or strides < 1:
            raise ValueError(f"filters and strides must be positive ints, got {filters!r}, {strides!r}.")
        self.filters, self.strides = int(filters), int(strides)

    def build(self, input_shape):
        if input_shape[-1] is None or input_shape[-1] > self.filters:
            raise ValueError(
                f"ZeroPadShortcut pads {input_shape[-1]} channels up to filters={self.filters}: "
                "the input may not have more channels than that."
            )

    def call(self, inputs):
        s = self.strides
        x = inputs[:, ::s, ::s, :] if s > 1 else inputs
        extra = self.filters - inputs.shape[-1]
        return ops.pad(x, [[0, 0], [0, 0], [0, 0], [0, extra]]) if extra else x

    def compute_output_shape(self, input_shape):
        def sub(d):
            return None if d is None else -(-d // self.strides)

        return (input_shape[0], sub(input_shape[1]), sub(input_shape[2]), self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "strides": self.strides}
