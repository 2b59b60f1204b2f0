import math

import keras
import numpy as np
import pytest

from conftest import tf_only
from keras_skipinit.layers import (
    FixupBias,
    GhostBatchNormalization,
    SkipInitScale,
    fixup_kernel_initializer,
)

RNG = np.random.default_rng(0)


def ghost_reference(x, ghost, eps, gamma=1.0, beta=0.0):
    """Hand computation: each group of `ghost` examples (the last one may be
    smaller) normalized by its own per-channel mean and biased variance."""
    out, means, variances, counts = [], [], [], []
    for start in range(0, len(x), ghost):
        g = x[start : start + ghost].astype(np.float64)
        axes = tuple(range(g.ndim - 1))
        mean, var = g.mean(axes), g.var(axes)
        out.append((g - mean) / np.sqrt(var + eps) * gamma + beta)
        means.append(mean)
        variances.append(var)
        counts.append(len(g))
    w = np.array(counts, np.float64)[:, None] / sum(counts)
    return np.concatenate(out), (w * means).sum(0), (w * variances).sum(0)


# --- SkipInitScale / FixupBias -------------------------------------------------


@pytest.mark.parametrize("value", [0.0, 1.0 / math.sqrt(48), 1.0, -0.3])
def test_skipinit_scale_multiplies_by_its_initial_value(value):
    x = RNG.normal(size=(4, 5, 5, 3)).astype("float32")
    layer = SkipInitScale(value)
    np.testing.assert_allclose(layer(x), value * x, rtol=1e-6)
    assert layer.trainable_weights[0].shape == ()
    assert len(layer.trainable_weights) == 1


@tf_only
def test_skipinit_scale_alpha_is_learnable():
    import tensorflow as tf

    layer = SkipInitScale(0.0)
    x = tf.constant(RNG.normal(size=(8, 3)).astype("float32"))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(x) * x)
    (grad,) = tape.gradient(loss, layer.trainable_variables)
    np.testing.assert_allclose(grad, np.sum(x.numpy() ** 2), rtol=1e-5)


def test_fixup_bias_adds_a_scalar():
    x = RNG.normal(size=(2, 7)).astype("float32")
    layer = FixupBias(0.25)
    np.testing.assert_allclose(layer(x), x + 0.25, rtol=1e-6)
    assert FixupBias().initial_value == 0.0


@pytest.mark.parametrize("bad", ["0", float("nan"), None, True])
def test_scalar_layers_reject_non_numbers(bad):
    with pytest.raises(ValueError, match="initial_value"):
        SkipInitScale(bad)
    with pytest.raises(ValueError, match="initial_value"):
        FixupBias(bad)


@pytest.mark.parametrize("num_branches,m", [(6, 2), (16, 3), (500, 2)])
def test_fixup_initializer_std_is_scaled_he(num_branches, m):
    shape = (3, 3, 64, 128)
    kernel = np.asarray(fixup_kernel_initializer(num_branches, m, seed=1)(shape))
    expected = math.sqrt(2.0 / (3 * 3 * 64)) * num_branches ** (-1.0 / (2 * m - 2))
    # 73,728 samples: relative std error of the std estimate is ~0.3%.
    assert abs(kernel.std() / expected - 1) < 0.02
    assert abs(kernel.mean()) < 0.02 * expected


def test_fixup_initializer_rejects_bad_arguments():
    with pytest.raises(ValueError, match="branch_layers"):
        fixup_kernel_initializer(10, 1)
    with pytest.raises(ValueError, match="num_branches"):
        fixup_kernel_initializer(0, 2)


# --- GhostBatchNormalization ----------------------------------------------------


@pytest.mark.parametrize(
    "batch,ghost,shape",
    [(12, 4, (3, 3, 5)), (10, 4, (3, 3, 5)), (3, 8, (2, 2, 4)), (12, 4, (6,))],
    ids=["multiple", "remainder", "smaller-than-ghost", "dense"],
)
def test_ghost_bn_matches_hand_computation(batch, ghost, shape):
    x = (RNG.normal(size=(batch,) + shape) * 3 + 1).astype("float32")
    layer = GhostBatchNormalization(ghost, momentum=0.9, epsilon=1e-3)
    out = np.asarray(layer(x, training=True))
    ref, mean, var = ghost_reference(x, ghost, 1e-3)
    np.testing.assert_allclose(out, ref, atol=1e-4)
    np.testing.assert_allclose(layer.moving_mean.numpy(), 0.1 * mean, atol=1e-5)
    np.testing.assert_allclose(layer.moving_variance.numpy(), 0.9 + 0.1 * var, atol=1e-4)


def test_ghost_bn_uses_gamma_beta_and_moving_stats_at_inference():
    x = RNG.normal(size=(8, 4, 4, 3)).astype("float32")
    layer = GhostBatchNormalization(4, epsilon=1e-3)
    layer.build(x.shape)
    gamma, beta = np.array([1.0, 2.0, 0.5]), np.array([0.0, -1.0, 3.0])
    mm, mv = np.array([0.1, 0.2, 0.3]), np.array([1.5, 0.5, 2.0])
    layer.set_weights([gamma, beta, mm, mv])
    ref, _, _ = ghost_reference(x, 4, 1e-3, gamma, beta)
    np.testing.assert_allclose(layer(x, training=True), ref, atol=1e-4)
    layer.set_weights([gamma, beta, mm, mv])
    np.testing.assert_allclose(layer(x, training=False), (x - mm) / np.sqrt(mv + 1e-3) * gamma + beta, atol=1e-5)
    np.testing.assert_allclose(layer.moving_mean.numpy(), mm)  # inference does not update


def test_ghost_bn_equals_batch_norm_when_ghost_is_the_batch():
    x = (RNG.normal(size=(16, 5, 5, 6)) * 2 - 1).astype("float32")
    ghost = GhostBatchNormalization(16, momentum=0.8)
    plain = keras.layers.BatchNormalization(momentum=0.8)
    for _ in range(3):
        np.testing.assert_allclose(ghost(x, training=True), plain(x, training=True), atol=1e-5)
    np.testing.assert_allclose(ghost.moving_mean.numpy(), plain.moving_mean.numpy(), atol=1e-6)
    np.testing.assert_allclose(ghost.moving_variance.numpy(), plain.moving_variance.numpy(), atol=1e-5)
    np.testing.assert_allclose(ghost(x, training=False), plain(x, training=False), atol=1e-5)


def test_ghost_bn_differs_from_batch_norm_when_ghost_is_smaller():
    x = RNG.normal(size=(16, 6)).astype("float32")
    x[8:] += 5.0  # second ghost batch has another mean
    ghost_out = GhostBatchNormalization(8)(x, training=True)
    plain_out = keras.layers.BatchNormalization()(x, training=True)
    assert np.abs(ghost_out - plain_out).max() > 0.5
    np.testing.assert_allclose(np.mean(ghost_out[8:], 0), 0, atol=1e-5)


@tf_only
def test_ghost_bn_dynamic_batch_in_tf_function():
    import tensorflow as tf

    layer = GhostBatchNormalization(4)
    layer.build((None, 3, 3, 2))
    fn = tf.function(
        lambda t: layer(t, training=True),
        input_signature=[tf.TensorSpec([None, 3, 3, 2], tf.float32)],
    )
    for batch in (4, 7, 13):
        x = RNG.normal(size=(batch, 3, 3, 2)).astype("float32")
        out = fn(x)
        assert out.shape == x.shape
        np.testing.assert_allclose(out, ghost_reference(x, 4, layer.epsilon)[0], atol=1e-4)


def test_ghost_bn_mixed_precision_statistics_in_float32():
    keras.config.set_dtype_policy("mixed_float16")
    layer = GhostBatchNormalization(4)
    x = (RNG.normal(size=(8, 4, 4, 3)) * 50 + 200).astype("float16")
    out = layer(x, training=True)
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    assert layer.moving_mean.dtype == "float32"
    ref, mean, _ = ghost_reference(x.astype("float32"), 4, layer.epsilon)
    np.testing.assert_allclose(np.asarray(out).astype("float32"), ref, atol=2e-2)
    np.testing.assert_allclose(layer.moving_mean.numpy(), 0.01 * mean, rtol=1e-3)


@tf_only
def test_ghost_bn_mirrored_strategy_matches_one_device():
    import tensorflow as tf

    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    assert len(devices) >= 2, "conftest configures two logical CPUs"
    x = RNG.normal(size=(16, 3, 3, 4)).astype("float32") * np.arange(1, 17).reshape(16, 1, 1, 1)

    def run(strategy):
        with strategy.scope():
            layer = GhostBatchNormalization(4, momentum=0.5)
            layer.build(x.shape)
        dataset = tf.data.Dataset.from_tensor_slices(x).batch(16)
        batch = next(iter(strategy.experimental_distribute_dataset(dataset)))
        out = strategy.run(tf.function(lambda t: layer(t, training=True)), args=(batch,))
        out = np.concatenate([o.numpy() for o in strategy.experimental_local_results(out)])
        return out, layer.moving_mean.numpy(), layer.moving_variance.numpy()

    one = run(tf.distribute.OneDeviceStrategy(devices[0]))
    two = run(tf.distribute.MirroredStrategy(devices[:2]))
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(one[0], ghost_reference(x, 4, 1e-3)[0], atol=1e-4)


@pytest.mark.parametrize("bad", [0, -64, 2.5, "64", True])
def test_ghost_bn_rejects_bad_ghost_batch_size(bad):
    with pytest.raises(ValueError, match="ghost_batch_size"):
        GhostBatchNormalization(bad)


def test_ghost_bn_rejects_other_axes():
    with pytest.raises(ValueError, match="axis"):
        GhostBatchNormalization(4, axis=1)


# --- Serialization ----------------------------------------------------------------

LAYERS = [
    lambda: SkipInitScale(0.37),
    lambda: FixupBias(-0.5),
    lambda: GhostBatchNormalization(4, momentum=0.7, epsilon=1e-4),
]


@pytest.mark.parametrize("make", LAYERS, ids=["skipinit", "fixup_bias", "ghost_bn"])
def test_layer_config_and_keras_file_round_trip(make, tmp_path):
    layer = make()
    clone = type(layer).from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()

    inputs = keras.Input((4, 4, 3))
    model = keras.Sequential([inputs, layer])
    x = RNG.normal(size=(8, 4, 4, 3)).astype("float32")
    model(x, training=True)  # moves the BN statistics away from their init
    path = tmp_path / "layer.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.layers[-1]) is type(layer)
    np.testing.assert_allclose(loaded(x, training=False), model(x, training=False), atol=1e-6)
    np.testing.assert_allclose(loaded(x, training=True), model(x, training=True), atol=1e-5)
