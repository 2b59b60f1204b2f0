"""NF-ResNets (Brock et al. 2021a; the blog seed): y = x + beta * f(alpha * x)."""

import math

import keras
import numpy as np
import pytest

from keras_skipinit import analysis, applications as apps
from keras_skipinit.layers import NF_RELU_GAMMA, ScaledWSConv2D

RNG = np.random.default_rng(0)


def test_scaled_ws_conv_kernel_is_standardized():
    layer = ScaledWSConv2D(8, 3, kernel_initializer=keras.initializers.RandomNormal(0.5, 3.0, seed=1))
    x = RNG.standard_normal((4, 9, 9, 5)).astype("float32")
    layer(x)
    kernel = np.asarray(layer.standardized_kernel())
    fan_in = 3 * 3 * 5
    np.testing.assert_allclose(kernel.mean(axis=(0, 1, 2)), 0, atol=1e-6)
    np.testing.assert_allclose(kernel.var(axis=(0, 1, 2)), 1 / fan_in, rtol=1e-4)
    layer.gain.assign(np.full(8, 2.0, "float32"))
    np.testing.assert_allclose(np.asarray(layer.standardized_kernel()).var(axis=(0, 1, 2)), 4 / fan_in, rtol=1e-4)


def test_scaled_ws_conv_preserves_unit_variance_and_zero_mean():
    layer = ScaledWSConv2D(256, 3, padding="valid", use_bias=False)
    x = (RNG.standard_normal((16, 12, 12, 64)) + 3.0).astype("float32")  # mean 3: centring removes it
    y = np.asarray(layer(x))
    assert abs(y.mean()) < 0.05 and y.var() == pytest.approx(1.0, rel=0.1)


def test_relu_gamma_gives_unit_variance():
    z = RNG.standard_normal(1_000_000)
    assert np.var(NF_RELU_GAMMA * np.maximum(z, 0)) == pytest.approx(1.0, rel=0.01)


def test_spp_follows_the_analytic_variance():
    beta = 0.5  # larger than the default 0.2 so the per-block growth stands out of the noise
    # 96x96 inputs: zero padding of 3x3 convs on small maps (8x8 at 32x32 input)
    # removes ~30% of a branch's variance, which the analysis does not model.
    model = apps.WideResNet(28, 2, normalization="nf", nf_beta=beta, seed=0, input_shape=(96, 96, 3))
    x = RNG.standard_normal((16, 96, 96, 3)).astype("float32")
    rows = analysis.block_statistics(model, x)
    expected = 1.0
    for row in rows:
        first = row["name"].endswith("_block1")  # transition: projected shortcut of alpha * x
        alpha = float(keras.ops.convert_to_numpy(model.get_layer(row["name"] + "_preact_bn_nf_alpha").value))
        assert alpha == pytest.approx(1 / math.sqrt(expected))
        predicted_skip = 1.0 if first else expected
        assert row["skip_var"] == pytest.approx(predicted_skip, rel=0.2), row
        assert row["branch_var"] == pytest.approx(beta**2, rel=0.25), row
        assert row["skip_mean_sq"] < 0.05 * predicted_skip
        expected = (1.0 if first else expected) + beta**2
    last_identity = [r["skip_var"] for r in rows if r["name"].startswith("group1")][-1]
    assert last_identity > 1 + 2 * beta**2  # grows by beta^2 per block (here 1 + 3 beta^2 = 1.75)


def test_nf_resnet_v2_and_round_trip(tmp_path):
    model = apps.ResNet50V2(input_shape=(64, 64, 3), classes=5, normalization="nf", seed=0)
    assert not [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert all(isinstance(layer, ScaledWSConv2D) for layer in model.layers if isinstance(layer, keras.layers.Conv2D))
    wrn = apps.WideResNet(10, 1, normalization="nf", nf_beta=0.3, seed=0)
    x = RNG.standard_normal((2, 32, 32, 3)).astype("float32")
    for w in wrn.weights:
        if w.path.endswith("gain"):
            w.assign(w * 1.5)
    path = tmp_path / "nf.keras"
    wrn.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded(x), wrn(x), atol=1e-6)


def test_nf_rejects_v1_and_stray_beta():
    with pytest.raises(ValueError, match="ResNet-V2 or WideResNet"):
        apps.ResNet50V1(normalization="nf")
    with pytest.raises(ValueError, match="nf_beta applies only"):
        apps.WideResNet(10, 1, normalization="skipinit", nf_beta=0.2)
    with pytest.raises(ValueError, match="nf_beta must be > 0"):
        apps.WideResNet(10, 1, normalization="nf", nf_beta=0.0)
