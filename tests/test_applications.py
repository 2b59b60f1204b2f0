import math
import re

import keras
import numpy as np
import pytest

from keras_skipinit import applications as apps
from keras_skipinit.applications import resnet, wide_resnet

RNG = np.random.default_rng(0)


def block_prefixes(model):
    return [layer.name[: -len("_branch_out")] for layer in model.layers if layer.name.endswith("_branch_out")]


def block_tensors(model, x):
    """Per block: (block input, shortcut, end of branch, block output)."""
    prefixes = block_prefixes(model)
    outs = []
    for p in prefixes:
        add = model.get_layer(p + "_add")
        outs += [add.input[0], model.get_layer(p + "_branch_out").output, model.get_layer(p + "_out").output]
    values = keras.Model(model.input, outs)(x, training=False)
    values = [np.asarray(v) for v in values]
    return prefixes, [tuple(values[3 * i : 3 * i + 3]) for i in range(len(prefixes))]


# --- keras.applications parity --------------------------------------------------


@pytest.mark.parametrize(
    "ours,theirs,count",
    [
        (apps.ResNet50V2, keras.applications.ResNet50V2, 25_613_800),
        (apps.ResNet50V1, keras.applications.ResNet50, 25_636_712),
    ],
    ids=["v2", "v1"],
)
def test_resnet50_matches_keras_applications(ours, theirs, count):
    model = ours()
    assert model.count_params() == count
    reference = theirs(weights=None)
    assert reference.count_params() == count
    # Same stride placement: every block output has keras' shape.
    for layer in reference.layers:
        if "_block" in layer.name and layer.name.endswith("_out"):
            assert model.get_layer(layer.name).output.shape == layer.output.shape, layer.name


def _offline_imagenet(monkeypatch, name):
    """keras.applications.`name` whose weights="imagenet" (a download) are
    stand-ins: seeded random values, distinct per weight, recorded."""
    real, made = getattr(keras.applications, name), []

    def make(weights=None, **arguments):
        model = real(weights=None, **arguments)
        if weights == "imagenet":
            rng = np.random.default_rng(1)
            for w in model.weights:
                w.assign(rng.uniform(0.5, 1.5, w.shape) if "variance" in w.path else 0.05 * rng.standard_normal(w.shape))
            made.append((model, arguments))
        return model

    monkeypatch.setattr(keras.applications, name, make)
    return made


@pytest.mark.heavy
def test_imagenet_weights_are_keras_applications_weights(monkeypatch):
    """weights="imagenet" (keras.applications' signature) copies keras.applications'
    ImageNet weights: the model then computes what keras.applications' does, for
    V1 and V2, with the top and as a backbone, for BatchNorm and Ghost BatchNorm."""
    x = RNG.standard_normal((2, 224, 224, 3)).astype("float32")
    for ours, name, arguments in ((apps.ResNet50V1, "ResNet50", {"normalization": "ghost_batchnorm"}),
                                  (apps.ResNet50V2, "ResNet50V2", {"include_top": False, "input_shape": (64, 64, 3)})):
        made = _offline_imagenet(monkeypatch, name)
        model = ours(weights="imagenet", **arguments)
        ((theirs, passed),) = made
        assert passed["input_shape"] == model.input_shape[1:]
        inputs = x[:, :model.input_shape[1], :model.input_shape[2]]
        np.testing.assert_allclose(model(inputs, training=False), theirs(inputs, training=False), atol=1e-5)


@pytest.mark.heavy
def test_imagenet_weights_offline_are_one_line_saying_where_to_put_them(monkeypatch):
    """Offline, weights="imagenet" and --init_from=imagenet were a 98-line traceback from Keras' download
    (issue 91.14): one ValueError naming the network, the failure and Keras' cache folder."""
    from keras.src.utils import file_utils

    from keras_skipinit.training import finetune
    failure = "URL fetch failure on https://example/w.h5: None -- [Errno -3] Temporary failure in name resolution"

    def offline(*args, **kwargs):
        raise Exception(failure)

    monkeypatch.setattr(file_utils, "get_file", offline)
    monkeypatch.setenv("KERAS_HOME", "/somewhere/keras")
    words = (f"keras.applications.ResNet50V2's ImageNet weights could not be fetched ({failure}): connect once "
             "(Keras keeps them in /somewhere/keras/models)")
    with pytest.raises(ValueError, match=re.escape(words)):
        apps.ResNet50V2(weights="imagenet", include_top=False, input_shape=(64, 64, 3))
    with pytest.raises(ValueError, match=re.escape(words)):
        finetune.source_for(finetune.IMAGENET).load(finetune.IMAGENET, None, "ResNet50V2")


@pytest.mark.heavy
def test_imagenet_weights_are_refused_before_the_download_where_they_do_not_fit(monkeypatch):
    made = _offline_imagenet(monkeypatch, "ResNet50V2")
    for arguments, message in (({"normalization": "skipinit"}, "'skipinit' computes another function"),
                               # the same weights as keras.applications' (names, shapes), another function
                               ({"normalization": "bn_sqrt2"}, "'bn_sqrt2' computes another function"),
                               ({"loop_blocks": True}, "differ from it in .* layer"),
                               ({"classes": 10}, "pass include_top=False for a backbone")):
        with pytest.raises(ValueError, match=message):
            apps.ResNet50V2(weights="imagenet", input_shape=(64, 64, 3), **arguments)
    with pytest.raises(ValueError, match="ImageNet weights exist for the ImageNet ResNets"):
        apps.WideResNet(16, 1, weights="imagenet")
    assert made == []  # nothing downloaded


def test_deeper_resnets_use_the_same_block_table():
    for depth, blocks in resnet.BLOCKS_PER_STAGE.items():
        for version in (1, 2):
            specs = resnet.block_specs(depth, version)
            assert len(specs) == sum(blocks)
            assert sum(s[2] == 2 for s in specs) == 3
    # keras.applications ResNet101V2 has 44,675,560 parameters.
    assert apps.ResNet101V2().count_params() == 44_675_560


def test_wide_resnet_structure_and_parameter_count():
    model = apps.WideResNet(16, 4)
    # WRN-16-4 (Zagoruyko & Komodakis, Table 1): 2.7M parameters. Exact count:
    # stem + 2 blocks x 3 groups of two 3x3 convs, 1x1 projections, BN, head.
    params, cin = 3 * 3 * 3 * 16, 16  # stem conv, no bias
    for c in (16 * 4, 32 * 4, 64 * 4):
        for _ in range(2):
            params += 4 * cin + 9 * cin * c + 4 * c + 9 * c * c  # preact BN, conv, BN, conv
            params += cin * c if cin != c else 0  # 1x1 projection
            cin = c
    params += 4 * cin + cin * 10 + 10  # post BN, classifier
    assert model.count_params() == params
    assert model.output.shape == (None, 10)
    assert len(wide_resnet.block_specs(1000, 2)) == 498


# --- identity and zero at initialization -------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: apps.WideResNet(16, 1, **kw),
        lambda **kw: apps.ResNet50V2(input_shape=(64, 64, 3), **kw),
        lambda **kw: apps.ResNet50V1(input_shape=(64, 64, 3), **kw),
    ],
    ids=["wrn", "v2", "v1"],
)
@pytest.mark.parametrize("normalization", ["skipinit", "regularized_skipinit"])
def test_skipinit_alpha_zero_blocks_output_their_skip_input(make, normalization):
    model = make(normalization=normalization, seed=3)
    x = RNG.normal(size=(2,) + model.input.shape[1:]).astype("float32")
    prefixes, blocks = block_tensors(model, x)
    assert len(prefixes) == model_blocks(model)
    for prefix, (shortcut, branch, out) in zip(prefixes, blocks):
        assert np.all(branch == 0), prefix
        expected = np.maximum(shortcut, 0) if model.name.endswith("v1") else shortcut
        np.testing.assert_array_equal(out, expected, err_msg=prefix)
        assert np.abs(out).max() > 0


def model_blocks(model):
    return len(block_prefixes(model))


def test_identity_skip_blocks_pass_their_input_unchanged():
    model = apps.WideResNet(10, 1, normalization="skipinit")
    x = RNG.normal(size=(2, 32, 32, 3)).astype("float32")
    inp = model.get_layer("group1_block1_add").input[0]  # stem output, identity skip
    out = model.get_layer("group1_block1_out").output
    a, b = keras.Model(model.input, [inp, out])(x)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "make",
    [
        lambda: apps.WideResNet(16, 2, normalization="fixup", seed=0),
        lambda: apps.ResNet50V1(input_shape=(64, 64, 3), normalization="fixup", seed=0),
        lambda: apps.ResNet50V2(input_shape=(64, 64, 3), normalization="fixup", seed=0),
    ],
    ids=["wrn", "v1", "v2"],
)
def test_fixup_branches_and_logits_are_zero_at_init(make):
    model = make()
    x = RNG.normal(size=(2,) + model.input.shape[1:]).astype("float32")
    _, blocks = block_tensors(model, x)
    for _, branch, _ in blocks:
        assert np.all(branch == 0)
    logits = keras.Model(model.input, model.get_layer("predictions").output)(x)
    assert np.all(np.asarray(logits) == 0)
    np.testing.assert_allclose(model(x), np.full((2, model.output.shape[-1]), 1 / model.output.shape[-1]), rtol=1e-6)


@pytest.mark.parametrize(
    "make,num_blocks,m,layer",
    [
        (lambda: apps.WideResNet(16, 4, normalization="fixup", seed=0), 6, 2, "group3_block2_1_conv"),
        (lambda: apps.ResNet50V1(normalization="fixup", seed=0), 16, 3, "conv5_block2_2_conv"),
    ],
    ids=["wrn-m2", "resnet50-m3"],
)
def test_fixup_branch_kernels_have_scaled_he_std(make, num_blocks, m, layer):
    model = make()
    kernel = model.get_layer(layer).kernel.numpy()
    fan_in = np.prod(kernel.shape[:-1])
    expected = math.sqrt(2.0 / fan_in) * num_blocks ** (-1.0 / (2 * m - 2))
    assert abs(kernel.std() / expected - 1) < 0.03
    assert not model.get_layer(layer).use_bias  # scalar biases replace per-channel ones
    last = layer.rsplit("_", 2)[0] + ("_2_conv" if m == 2 else "_3_conv")
    assert np.all(model.get_layer(last).kernel.numpy() == 0)
    # Rule 3, per branch: a scalar bias before each of its m convs and m-1
    # inner ReLUs, and the multiplier (init 1) and bias (init 0) at its end.
    names = {layer.name: layer for layer in model.layers}
    for prefix in block_prefixes(model):
        for i in range(1, m + 1):
            assert f"{prefix}_{i}_conv_bias" in names
        for i in range(1, m):
            assert f"{prefix}_{i}_relu_bias" in names
        assert float(names[f"{prefix}_fixup_scale"].value.numpy()) == 1.0
        assert float(names[f"{prefix}_fixup_bias"].value.numpy()) == 0.0
    assert "predictions_bias" in names


def test_skipinit_alpha_options():
    d = 6  # WRN-16: 3 groups x 2 blocks
    for alpha_init, expected in [("zero", 0.0), ("one", 1.0), ("inv_sqrt_depth", 1 / math.sqrt(d)), (0.3, 0.3)]:
        model = apps.WideResNet(16, 1, normalization="skipinit", alpha_init=alpha_init)
        alphas = [w.numpy() for w in model.weights if w.path.endswith("alpha")]
        assert len(alphas) == d
        np.testing.assert_allclose(alphas, expected, rtol=1e-6)


def test_regularized_skipinit_adds_biases_and_dropout():
    wrn = apps.WideResNet(16, 1, normalization="regularized_skipinit")
    convs = [layer for layer in wrn.layers if isinstance(layer, keras.layers.Conv2D)]
    assert convs and all(c.use_bias for c in convs)
    assert wrn.get_layer("top_dropout").rate == 0.6  # CIFAR (§4)
    v1 = apps.ResNet50V1(input_shape=(64, 64, 3), normalization="regularized_skipinit")
    assert v1.get_layer("top_dropout").rate == 0.2  # ImageNet (App. F, G)
    assert len([layer for layer in v1.layers if layer.name.endswith("_merge_bias")]) == 16  # App. F
    v2 = apps.ResNet50V2(input_shape=(64, 64, 3), normalization="regularized_skipinit")
    assert not [layer for layer in v2.layers if layer.name.endswith("_merge_bias")]
    assert not [layer for layer in v2.layers if isinstance(layer, keras.layers.BatchNormalization)]


def test_sqrt2_block_is_sum_over_sqrt2():
    model = apps.WideResNet(10, 1, normalization="sqrt2", seed=1)
    x = RNG.normal(size=(2, 32, 32, 3)).astype("float32")
    _, blocks = block_tensors(model, x)
    for shortcut, branch, out in blocks:
        np.testing.assert_allclose(out, (shortcut + branch) / math.sqrt(2), rtol=1e-5, atol=1e-6)
        assert np.abs(branch).mean() > 0.1


def test_ghost_model_equals_batchnorm_model_when_ghost_covers_the_batch():
    x = RNG.normal(size=(8, 32, 32, 3)).astype("float32")
    bn = apps.WideResNet(10, 1, normalization="batchnorm", seed=5)
    ghost = apps.WideResNet(10, 1, normalization="ghost_batchnorm", ghost_batch_size=8, seed=5)
    np.testing.assert_allclose(ghost(x, training=True), bn(x, training=True), atol=1e-5)
    small = apps.WideResNet(10, 1, normalization="ghost_batchnorm", ghost_batch_size=2, seed=5)
    assert np.abs(small(x, training=True) - bn(x, training=True)).max() > 1e-3


@pytest.mark.parametrize("normalization", ["batchnorm", "ghost_batchnorm"])
def test_bn_momentum_sets_the_moving_average(normalization):
    """moving <- m * moving + (1 - m) * batch statistic, with m = bn_momentum."""
    model = apps.WideResNet(10, 1, normalization=normalization, bn_momentum=0.9, seed=5)
    norms = [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]
    assert norms and all(l.momentum == 0.9 for l in norms)
    x = RNG.normal(3.0, 1.0, size=(8, 32, 32, 3)).astype("float32")
    first = model.get_layer("group1_block1_preact_bn")
    model(x, training=True)
    stem = np.asarray(keras.Model(model.input, model.get_layer("stem_conv").output)(x))
    np.testing.assert_allclose(first.moving_mean.numpy(), 0.1 * stem.mean((0, 1, 2)), rtol=1e-4, atol=1e-6)
    assert apps.WideResNet(10, 1, normalization="batchnorm").get_layer("post_bn").momentum == 0.99
    with pytest.raises(ValueError, match="bn_momentum applies only"):
        apps.WideResNet(10, 1, normalization="skipinit", bn_momentum=0.9)
    with pytest.raises(ValueError, match=r"bn_momentum must be in \[0, 1\)"):
        apps.WideResNet(10, 1, normalization="batchnorm", bn_momentum=1.0)


def test_pooling_include_top_and_input_tensor():
    feats = apps.WideResNet(10, 2, include_top=False)
    assert feats.output.shape == (None, 8, 8, 128)
    assert apps.WideResNet(10, 2, include_top=False, pooling="max").output.shape == (None, 128)
    inp = keras.Input((40, 40, 3))
    model = apps.ResNet50V2(input_tensor=inp, include_top=False, pooling="avg", normalization="skipinit")
    assert model.inputs[0] is inp
    assert model.output.shape == (None, 2048)
    logits = apps.WideResNet(10, 1, classes=7, classifier_activation=None)
    assert logits.output.shape == (None, 7)


def test_weights_argument_loads_a_weights_file(tmp_path):
    model = apps.WideResNet(10, 1, normalization="skipinit", alpha_init="one", seed=1)
    path = str(tmp_path / "wrn.weights.h5")
    model.save_weights(path)
    loaded = apps.WideResNet(10, 1, normalization="skipinit", alpha_init="one", seed=2, weights=path)
    x = RNG.normal(size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(loaded(x), model(x), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(normalization="layernorm"), "normalization must be one of"),
        (dict(depth=15), "6k\\+4"),
        (dict(width=0), "width"),
        (dict(normalization="ghost_batchnorm", ghost_batch_size=0), "ghost_batch_size"),
        (dict(normalization="batchnorm", ghost_batch_size=32), "ghost_batchnorm"),
        (dict(normalization="skipinit", alpha_init="half"), "alpha_init"),
        (dict(normalization="fixup", alpha_init=0.0), "alpha_init applies only"),
        (dict(pooling="min", include_top=False), "pooling"),
        (dict(classes=0), "classes"),
        (dict(weights="imagenet"), "weights"),
        (dict(dropout=1.0), "dropout"),
        (dict(use_bias="yes"), "use_bias"),
        (dict(input_shape=(32, 32)), "input_shape"),
        (dict(input_tensor=np.zeros((1, 32, 32, 3))), "input_tensor"),
    ],
)
def test_bad_arguments_raise_clear_value_errors(kwargs, match):
    kwargs = {"depth": 10, "width": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        apps.WideResNet(**kwargs)


def test_resnet_rejects_unknown_depth_and_version():
    with pytest.raises(ValueError, match="50, 101, 152"):
        apps.ResNet(34, 2)
    with pytest.raises(ValueError, match="version must be 1 or 2"):
        apps.ResNet(50, 3)


# --- serialization -----------------------------------------------------------------


# --- depth -------------------------------------------------------------------------


def test_depth_logic_small():
    for depth, blocks in [(10, 3), (16, 6), (40, 18), (100, 48), (1000, 498)]:
        assert len(wide_resnet.block_specs(depth, 1)) == blocks
    model = apps.WideResNet(40, 1, normalization="skipinit")
    assert model_blocks(model) == 18
    x = RNG.normal(size=(1, 32, 32, 3)).astype("float32")
    assert np.all(np.isfinite(model(x)))


@pytest.mark.heavy
def test_1000_layer_wide_resnet_builds_and_runs_forward():
    """The paper's 1000-layer net with SkipInit (the mission's claim). One
    normalization: the blocks are the same code at every depth and each
    method's numerics are tested at small depth (~35 s on 2 cores, eager)."""
    model = apps.WideResNet(1000, 1, normalization="skipinit")
    assert model_blocks(model) == 498
    x = RNG.normal(size=(4, 32, 32, 3)).astype("float32")
    out = np.asarray(model(x, training=True))
    assert out.shape == (4, 10) and np.all(np.isfinite(out))
    np.testing.assert_allclose(out.sum(-1), 1, rtol=1e-5)
