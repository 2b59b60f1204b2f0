"""CifarResNet: He et al. 2016a §4.2's ResNet-6n+2 and the Fixup authors' CIFAR
code (hongyi-zhang/Fixup, cifar/models/fixup_resnet_cifar.py), point by point."""

import json
import math
import os

import keras
import numpy as np
import pytest

from conftest import tf_only
from keras_skipinit import applications as apps, layers as ksl, looped
from keras_skipinit.applications import cifar_resnet

RNG = np.random.default_rng(0)
X = RNG.standard_normal((4, 16, 16, 3)).astype("float32")

# He et al. 2016a, Table 6: parameters of the CIFAR-10 ResNets (millions).
PAPER_PARAMS = {20: 0.27, 32: 0.46, 44: 0.66, 56: 0.85, 110: 1.7, 1202: 19.4}


def trainable_count(model):
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


def hand_count(depth, classes=10, shortcut="A"):
    """Trainable parameters by hand: bias-free 3x3 convs, BN gamma/beta,
    option A shortcuts free, option B a 1x1 conv + BN per transition."""
    n = (depth - 2) // 6
    total = 27 * 16 + 2 * 16 + 64 * classes + classes
    c = 16
    for f in (16, 32, 64):
        for i in range(n):
            total += 9 * c * f + 9 * f * f + 4 * f
            if c != f and shortcut == "B":
                total += c * f + 2 * f
            c = f
    return total


@pytest.mark.parametrize("depth", sorted(PAPER_PARAMS))
def test_batchnorm_parameter_counts_equal_the_paper_table(depth):
    # ResNet-1202 in its looped form (same weights, ~60x fewer layers to build).
    model = apps.CifarResNet(depth, loop_blocks=depth > 200)
    count = trainable_count(model)
    assert count == hand_count(depth)
    digits = 2 if PAPER_PARAMS[depth] < 1 else 1
    assert round(count / 1e6, digits) == PAPER_PARAMS[depth]
    assert model.output_shape == (None, 10)


def test_stages_shapes_and_option_b():
    model = apps.CifarResNet(20, input_shape=(28, 28, 1), classes=7)
    shapes = {p: model.get_layer(p + "_out").output.shape[1:] for p in ("stage1_block3", "stage2_block1", "stage3_block3")}
    assert shapes == {"stage1_block3": (28, 28, 16), "stage2_block1": (14, 14, 32), "stage3_block3": (7, 7, 64)}
    assert model.output_shape == (None, 7)
    assert not [layer for layer in model.layers if layer.name.endswith("_0_conv")]
    b = apps.CifarResNet(20, shortcut="B")
    assert trainable_count(b) == hand_count(20, shortcut="B")
    assert [layer.name for layer in b.layers if layer.name.endswith("_0_conv")] == [
        "stage2_block1_0_conv", "stage3_block1_0_conv"]


def test_option_a_shortcut_is_subsampling_and_zero_channels():
    x = RNG.standard_normal((2, 7, 7, 3)).astype("float32")
    layer = ksl.ZeroPadShortcut(5, 2)
    y = np.asarray(layer(x))
    assert y.shape == (2, 4, 4, 5) == layer.compute_output_shape(x.shape)
    np.testing.assert_array_equal(y[..., :3], x[:, ::2, ::2, :])
    assert np.all(y[..., 3:] == 0)
    clone = ksl.ZeroPadShortcut.from_config(layer.get_config())
    np.testing.assert_array_equal(clone(x), y)
    with pytest.raises(ValueError, match="may not have more channels"):
        ksl.ZeroPadShortcut(2)(x)


def test_fixup_follows_the_authors_code():
    depth, L = 20, 9
    model = apps.CifarResNet(depth, normalization="fixup", seed=0)
    names = {layer.name: layer for layer in model.layers}
    # Scalar biases: none before the stem conv, one before the stem ReLU and
    # the classifier; per block bias1a (also on the shortcut), bias1b,
    # bias2a, scale (init 1), bias2b; none before the block's final ReLU.
    assert "stem_conv_bias" not in names and "stem_relu_bias" in names and "predictions_bias" in names
    per_block = ("_1_conv_bias", "_1_relu_bias", "_2_conv_bias", "_fixup_scale", "_fixup_bias")
    prefixes = [p for p, _, _ in cifar_resnet.block_specs(depth)]
    scalars = [layer.name for layer in model.layers if isinstance(layer, (ksl.FixupBias, ksl.SkipInitScale))]
    assert sorted(scalars) == sorted(["stem_relu_bias", "predictions_bias"] + [p + s for p in prefixes for s in per_block])
    assert float(names["stage1_block1_fixup_scale"].value.numpy()) == 1.0
    # The shortcut's input carries the block's first bias.
    pad = names["stage2_block1_0_pad"]
    assert pad.input._keras_history.operation is names["stage2_block1_1_conv_bias"]
    # conv1: He-normal by fan-out times L^-1/2 (transition blocks: fan-out != fan-in).
    for prefix in ("stage2_block1", "stage3_block2"):
        kernel = names[prefix + "_1_conv"].kernel.numpy()
        expected = math.sqrt(2.0 / (kernel.shape[-1] * 9)) * L**-0.5
        assert abs(kernel.std() / expected - 1) < 0.05, prefix
        assert np.all(names[prefix + "_2_conv"].kernel.numpy() == 0)
    dense = names["predictions"]
    assert np.all(dense.kernel.numpy() == 0) and np.all(dense.bias.numpy() == 0)
    assert not any(layer.use_bias for layer in model.layers if isinstance(layer, keras.layers.Conv2D))


def test_fixup_shortcut_sees_the_shared_bias():
    model = apps.CifarResNet(8, input_shape=(16, 16, 3), normalization="fixup", seed=0)
    model.get_layer("stage2_block1_1_conv_bias").value.assign(0.75)
    inner = keras.Model(model.input, [model.get_layer("stage1_block1_out").output,
                                      model.get_layer("stage2_block1_0_pad").output])
    x_in, skip = (np.asarray(t) for t in inner(X))
    np.testing.assert_allclose(skip[..., :16], x_in[:, ::2, ::2, :] + 0.75, rtol=1e-6)
    assert np.all(skip[..., 16:] == 0)


@pytest.mark.parametrize("normalization", ["fixup", "skipinit", "regularized_skipinit"])
def test_branches_are_zero_and_blocks_are_relu_of_the_shortcut_at_init(normalization):
    model = apps.CifarResNet(14, input_shape=(16, 16, 3), normalization=normalization, seed=2)
    prefixes = [p for p, _, _ in cifar_resnet.block_specs(14)]
    tensors = []
    for p in prefixes:
        add = model.get_layer(p + "_add")
        tensors += [add.input[0], model.get_layer(p + "_branch_out").output, model.get_layer(p + "_out").output]
    values = [np.asarray(v) for v in keras.Model(model.input, tensors)(X)]
    for i, p in enumerate(prefixes):
        skip, branch, out = values[3 * i : 3 * i + 3]
        assert np.all(branch == 0), p
        np.testing.assert_array_equal(out, np.maximum(skip, 0), err_msg=p)
        assert out.max() > 0
    if normalization != "fixup":  # SkipInit App. F: a scalar bias before each final ReLU
        assert len([layer for layer in model.layers if layer.name.endswith("_merge_bias")]) == len(prefixes)
    else:
        logits = keras.Model(model.input, model.get_layer("predictions").output)(X)
        assert np.all(np.asarray(logits) == 0)


@pytest.mark.parametrize("stem_init,std,bound", [
    ("he_normal", math.sqrt(2 / 27), None),
    ("pytorch_default", 1 / math.sqrt(3 * 27), 1 / math.sqrt(27)),
])
def test_stem_initialization(stem_init, std, bound):
    kernel = apps.CifarResNet(8, stem_init=stem_init, seed=0).get_layer("stem_conv").kernel.numpy()
    assert abs(kernel.std() / std - 1) < 0.1
    if bound:
        assert np.abs(kernel).max() <= bound


def test_looped_form_equals_unrolled():
    common = dict(input_shape=(16, 16, 3), normalization="fixup", seed=1)
    unrolled = apps.CifarResNet(20, **common)
    loop = apps.CifarResNet(20, loop_blocks=True, **common)
    assert sum(isinstance(layer, looped.RepeatedBlocks) for layer in loop.layers) == 3
    unrolled.set_weights([w + RNG.normal(0, 0.05, w.shape).astype(w.dtype) for w in unrolled.get_weights()])
    looped.transfer_weights(unrolled, loop)
    np.testing.assert_allclose(loop(X), unrolled(X), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(depth=21), "6n\\+2"),
    (dict(depth=2), "6n\\+2"),
    (dict(shortcut="C"), "shortcut must be one of"),
    (dict(stem_init="glorot"), "stem_init must be one of"),
    (dict(normalization="nf"), "post-activation"),
])
def test_bad_arguments_raise_clear_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        apps.CifarResNet(**kwargs)


@pytest.mark.heavy
@tf_only
def test_trains_from_the_trainer_and_exports_for_serving(tmp_path):
    import tensorflow as tf

    from keras_skipinit.serving import savedmodel
    from keras_skipinit.training import trainer
    model_dir = str(tmp_path / "run")
    config = trainer.Config(model="cifar_resnet", depth=8, normalization="fixup", shortcut="B",
                             stem_init="pytorch_default", epochs=1, steps_per_epoch=3, verbose=0, model_dir=model_dir)
    results = trainer.train(config)
    assert results["config"]["model"] == "cifar_resnet"
    model, preprocessing, _ = savedmodel.load_source(model_dir)
    assert model.name == "cifar_resnet8"
    spec = json.loads(open(os.path.join(model_dir, "model_spec.json")).read())["model"]
    assert (spec["shortcut"], spec["stem_init"]) == ("B", "pytorch_default")
    assert "stage2_block1_0_conv" in [layer.name for layer in model.layers]  # option B: a 1x1 projection
    assert any(w.numpy().any() for w in model.get_layer("predictions").weights)  # it trained
    path = savedmodel.export(model, str(tmp_path / "serving"), "cifar", preprocessing=preprocessing)
    images = tf.constant(RNG.integers(0, 256, (2, 28, 28, 1)).astype("uint8"))
    served = tf.saved_model.load(path).signatures["serving_default"]
    np.testing.assert_allclose(served(images=images)["probabilities"],
                               model(tf.image.per_image_standardization(images), training=False), atol=1e-5)
    with pytest.raises(ValueError, match="6n\\+2"):
        trainer.train(trainer.Config(model="cifar_resnet", depth=16, verbose=0, model_dir=str(tmp_path / "bad")))
    with pytest.raises(ValueError, match="shortcut applies only to model=cifar_resnet"):
        trainer.train(trainer.Config(model="wrn", shortcut="B", verbose=0, model_dir=str(tmp_path / "bad")))
