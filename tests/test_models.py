"""Every model family x every normalization, through the registry (timm's
tests/test_models.py pattern): build, forward, one training step, `.keras`
round trip, folded-export equality, feature maps. One test per guarantee;
the per-architecture files test what only that architecture has."""

import inspect

import keras
import numpy as np
import pytest

from conftest import BACKEND
from keras_skipinit import applications as apps, normalization as norm_lib
from keras_skipinit.layers import ScaledWSConv2D
from keras_skipinit.normalization import NORMALIZATIONS

# The smallest member of each family, at a toy input (ResNets: 32x32, stride 32 -> 1x1).
FAMILIES = {"wrn_10_1": (16, 16, 3), "cifar_resnet8": (16, 16, 3), "resnet50_v1": (32, 32, 3),
            "resnet50_v2": (32, 32, 3)}
CASES = [(name, n) for name in FAMILIES for n in NORMALIZATIONS]


@pytest.fixture
def toy_bottleneck_resnets(monkeypatch):
    """ResNet-50's block table at toy size: each stage's first and last block as
    in ResNet-50 (projection shortcut; stride where V1 or V2 puts it), in 8
    blocks of 4-32 filters instead of 16 of 64-512 (23.5M parameters: ~10 s a
    case, mostly saving and perturbing). The real table is test_applications'
    (against keras.applications)."""
    from keras_skipinit.applications import resnet

    monkeypatch.setitem(resnet.BLOCKS_PER_STAGE, 50, (2, 2, 2, 2))
    monkeypatch.setattr(resnet, "STAGE_FILTERS", (4, 8, 16, 32))


def _kwargs(normalization):
    return {"ghost_batch_size": 2} if normalization == "ghost_batchnorm" else {}


def _perturbed(model, x, rng):
    """Weights moved off their init (zero-init branches, scalars), so that a
    reload or a fold that drops a parameter changes the output."""
    model(x, training=True)  # BN moving statistics
    for w in model.weights:
        w.assign(w.numpy() + rng.normal(0, 0.05, w.shape).astype(w.dtype))
    return model


@pytest.mark.parametrize("name,normalization", CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_every_model_builds_trains_round_trips_and_folds(name, normalization, tmp_path, toy_bottleneck_resnets):
    _builds_trains_round_trips_and_folds(name, normalization, tmp_path)


def test_a_method_is_one_record(monkeypatch, tmp_path):
    """A method added by one `normalization.METHODS` record (and its layer),
    touching no other module, passes the guarantees above and reaches
    training's rules: the design of normalization.py, proved."""
    from keras_skipinit.training import run_model, trainer
    toy = norm_lib.Method("Layer normalization", "a test", norm=lambda recipe, name: keras.layers.LayerNormalization(
        epsilon=1e-5, name=name), normalizes=True, scalar_lr=0.5)
    monkeypatch.setitem(norm_lib.METHODS, "layernorm", toy)
    model = _builds_trains_round_trips_and_folds("cifar_resnet8", "layernorm", tmp_path)  # the smallest family
    assert [layer for layer in model.layers if isinstance(layer, keras.layers.LayerNormalization)]
    assert run_model.scalar_lr(trainer.Config(normalization="layernorm")) == 0.5
    with pytest.raises(ValueError, match="lsuv initializes networks without normalization"):
        trainer.validate(trainer.Config(normalization="layernorm", lsuv=True, model_dir=str(tmp_path / "run")))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_new_mechanism_is_one_record_with_a_hook(name, monkeypatch, tmp_path, toy_bottleneck_resnets):
    """A method whose mechanism the recipe fields lack (each branch scaled by
    a fixed, non-trainable 1/2) is one record with a `hooks` entry: it builds
    in every family, trains a step, round-trips through .keras and folds, and
    at init each block's branch output is half of what it is without it."""
    half = norm_lib.Method("Branch halved", "a test", hooks={
        "branch_end": lambda ops, x, prefix: keras.layers.Rescaling(0.5, name=prefix + "_half")(x)})
    monkeypatch.setitem(norm_lib.METHODS, "halved", half)
    model = _builds_trains_round_trips_and_folds(name, "halved", tmp_path)
    assert not model.trainable_weights or all("half" not in w.path for w in model.trainable_weights)
    shape = FAMILIES[name]
    x = np.random.default_rng(1).standard_normal((2,) + shape).astype("float32")
    plain = apps.create_model(name, input_shape=shape, classes=3, normalization="none", seed=1)
    halved = apps.create_model(name, input_shape=shape, classes=3, normalization="halved", seed=1)
    block = next(layer.name for layer in plain.layers if layer.name.endswith("_branch_out"))
    taps = [keras.Model(m.input, m.get_layer(block).output)(x) for m in (plain, halved)]
    np.testing.assert_allclose(np.asarray(taps[1]), 0.5 * np.asarray(taps[0]), rtol=1e-5, atol=1e-6)


def test_the_table4_variants_do_what_app_d2_says_at_init():
    """SkipInit App. D.2 / Table 4, on WRN-10-1 in training mode (batch
    statistics): bn_sqrt2's block output is its sum over sqrt(2);
    bn_block_end's block outputs are normalized per channel (mean 0,
    variance 1 over the batch, as BN at init makes them) while its branch
    still carries BN; bn_head_only has one BN, on the pooled features."""
    x = np.random.default_rng(2).standard_normal((32, 16, 16, 3)).astype("float32")

    def tap(model, layer):
        return np.asarray(keras.Model(model.input, model.get_layer(layer).output)(x, training=True))

    def norms(model):
        return [layer.name for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]

    sqrt2 = apps.create_model("wrn_10_1", input_shape=(16, 16, 3), normalization="bn_sqrt2", seed=1)
    np.testing.assert_allclose(tap(sqrt2, "group2_block1_out"), tap(sqrt2, "group2_block1_add") / np.sqrt(2),
                               rtol=1e-5, atol=1e-6)
    end = apps.create_model("wrn_10_1", input_shape=(16, 16, 3), normalization="bn_block_end", seed=1)
    out = tap(end, "group2_block1_out")
    np.testing.assert_allclose(out.mean(axis=(0, 1, 2)), 0.0, atol=1e-3)
    np.testing.assert_allclose(out.var(axis=(0, 1, 2)), 1.0, rtol=1e-2)
    assert "group2_block1_merge_bn" in norms(end) and "group2_block1_1_bn" in norms(end)
    head = apps.create_model("wrn_10_1", input_shape=(16, 16, 3), normalization="bn_head_only", seed=1)
    assert norms(head) == ["predictions_head_bn"]
    pooled = tap(head, "predictions_head_bn")
    np.testing.assert_allclose(pooled.mean(axis=0), 0.0, atol=1e-3)
    np.testing.assert_allclose(pooled.var(axis=0)[pooled.var(axis=0) > 0.5], 1.0, rtol=1e-2)


def _builds_trains_round_trips_and_folds(name, normalization, tmp_path):
    tmp_path.mkdir(exist_ok=True)
    shape = FAMILIES[name]
    model_name, _, _ = apps.registry.parse_name(name)
    if norm_lib.METHODS[normalization].preactivation_only and not apps.ARCHITECTURES[model_name].preactivation:
        with pytest.raises(ValueError, match="needs pre-activation blocks"):
            apps.create_model(name, input_shape=shape, normalization=normalization)
        return
    model = apps.create_model(name, input_shape=shape, classes=3, normalization=normalization, seed=1,
                              **_kwargs(normalization))
    rng = np.random.default_rng(0)  # each test its own draws: none depend on the order xdist runs them in
    x = rng.standard_normal((4,) + shape).astype("float32")
    y = np.array([0, 1, 2, 0])
    assert model.output_shape == (None, 3)
    np.testing.assert_allclose(np.asarray(model(x)).sum(axis=1), 1.0, rtol=1e-5)  # softmax

    # One training step moves the weights and gives a finite loss (eagerly: tracing a ResNet-50's
    # step costs ~10 s; the traced step is train.py's, tested in test_training). On inputs 100x
    # smaller: an unnormalized ResNet-50 (positively homogeneous at init) has logit gaps of 10-200
    # on these, where the clipped cross-entropy has no gradient (no weight moved on a GPU).
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy", run_eagerly=True)
    before = [w.numpy().copy() for w in model.trainable_weights]
    loss = model.train_on_batch(x / 100, y)
    assert np.isfinite(loss)
    assert any(not np.array_equal(b, w.numpy()) for b, w in zip(before, model.trainable_weights))

    _perturbed(model, x, rng)
    want = np.asarray(model(x, training=False))
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert [type(layer) for layer in loaded.layers] == [type(layer) for layer in model.layers]
    np.testing.assert_allclose(loaded(x, training=False), want, atol=1e-6)
    if BACKEND == "tensorflow":  # serving is TensorFlow code
        from keras_skipinit.serving import inference
        folded = inference.fold(model)  # float32 reassociation of (W*s) x vs s*(W x) only
        np.testing.assert_allclose(folded(x), want, rtol=1e-4, atol=1e-6)
        # NF's weight-standardized convs become plain convs (exporters and runtimes know those).
        assert not [layer for layer in folded.layers if isinstance(layer, ScaledWSConv2D)]
    return model


# Where each family's stages end, by the layer names keras.applications uses (ResNet-V2
# strides in the last block of a stage, so stride 4 ends one block early).
PYRAMID_LAYERS = {
    "wrn_10_1": {"P0": "group1_block1_out", "P1": "group2_block1_out", "P2": "post_relu"},
    "cifar_resnet8": {"P0": "stage1_block1_out", "P1": "stage2_block1_out", "P2": "stage3_block1_out"},
    "resnet50_v1": {"P2": "conv2_block3_out", "P3": "conv3_block4_out", "P4": "conv4_block6_out",
                    "P5": "conv5_block3_out"},
    "resnet50_v2": {"P2": "conv2_block2_out", "P3": "conv3_block3_out", "P4": "conv4_block5_out",
                    "P5": "post_relu"},
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_pyramid_outputs_are_the_stage_outputs_of_the_full_model(name):
    shape = (64, 64, 3) if name.startswith("resnet") else FAMILIES[name]
    features = apps.create_model(name, input_shape=shape, include_top=False, pyramid_outputs=True, seed=3)
    full = apps.create_model(name, input_shape=shape, classes=3, seed=3)
    x = np.random.default_rng(0).standard_normal((2,) + shape).astype("float32")
    got = features(x)
    assert sorted(got) == sorted(PYRAMID_LAYERS[name])
    for key, layer in PYRAMID_LAYERS[name].items():
        stride = 2 ** int(key[1:])
        assert got[key].shape[1:3] == (shape[0] // stride, shape[1] // stride), key
        want = keras.Model(full.input, full.get_layer(layer).output)(x)
        np.testing.assert_allclose(got[key], want, atol=1e-5, err_msg=key)
    with pytest.raises(ValueError, match="include_top=False and pooling=None"):
        apps.create_model(name, input_shape=shape, pyramid_outputs=True)


def test_the_registry_lists_and_creates_every_family():
    names = apps.list_models()
    assert {apps.registry.parse_name(n)[0] for n in names} == set(apps.MODELS)
    # Names are parsed by each entry's name_format: every listed name names its own family.
    assert all(apps.registry.parse_name(n)[0] == m for m, arch in apps.ARCHITECTURES.items() for n in arch.names)
    with pytest.raises(ValueError, match="unknown model name 'vgg16': wrn_{depth}_{width}, resnet{depth}_v1"):
        apps.create_model("vgg16")
    assert apps.list_models("*_v2") == ["resnet50_v2", "resnet101_v2", "resnet152_v2"]
    assert "wrn_16_4" in names and "cifar_resnet110" in names
    # Any valid member of a family, listed or not; parameter counts as the constructors give them.
    wrn = apps.create_model("wrn_22_2", normalization="skipinit")
    assert wrn.count_params() == apps.WideResNet(22, 2, normalization="skipinit").count_params()
    assert wrn.name == "wide_resnet22_2"
    for bad, match in (("wrn_17_1", "6k\\+4"), ("resnet34_v1", "one of \\[50, 101, 152\\]"), ("vgg16", "unknown model"),
                       ("cifar_resnet21", "6n\\+2")):
        with pytest.raises(ValueError, match=match):
            apps.create_model(bad)


def test_a_family_whose_names_overlap_another_s_leaves_every_listed_name_building(monkeypatch):
    """Issue 88.7: names were parsed first-match-wins, so a family added with
    an overlapping pattern (a basic-block "resnet{depth}_v1" of other depths)
    took ResNet-50's name and refused its depth. Each name is now the one
    family's that takes its depth; a name two families take is refused as
    ambiguous."""
    def toy_depth(depth):
        if depth not in (20, 32):
            raise ValueError(f"Toy depth must be 20 or 32, got {depth}")

    toy = apps.Architecture("Toy", "Toy-{depth}", "cifar_resnet:CifarResNet", (32, 32, 3), False, "20, 32", toy_depth,
                            name_format="resnet{depth}_v1", names=("resnet20_v1", "resnet32_v1"))
    monkeypatch.setitem(apps.ARCHITECTURES, "toy", toy)  # after resnet_v1: first-match-wins asked resnet_v1 first
    names = apps.list_models()
    assert {"resnet20_v1", "resnet32_v1", "resnet50_v1"} <= set(names)
    assert all(apps.registry.parse_name(n)[0] == m for m, arch in apps.ARCHITECTURES.items() for n in arch.names)
    small = dict(input_shape=(32, 32, 3), classes=10)
    assert apps.create_model("resnet20_v1", **small).count_params() == apps.CifarResNet(20, **small).count_params()
    assert apps.create_model("resnet50_v1", **small).count_params() == apps.ResNet(50, 1, **small).count_params()
    with pytest.raises(ValueError, match="ResNet depth must be one of .*; Toy depth must be 20 or 32"):
        apps.create_model("resnet34_v1")
    monkeypatch.setitem(apps.ARCHITECTURES, "toy", toy.__class__(**{**toy.__dict__, "check_depth": lambda d: None}))
    with pytest.raises(ValueError, match="'resnet50_v1' is ambiguous: families \\['resnet_v1', 'toy'\\]"):
        apps.create_model("resnet50_v1")


def test_named_resnets_have_explicit_signatures_and_docstrings():
    for make in (apps.ResNet50V1, apps.ResNet101V1, apps.ResNet152V1, apps.ResNet50V2, apps.ResNet101V2,
                 apps.ResNet152V2):
        parameters = inspect.signature(make).parameters
        assert list(parameters)[:8] == ["include_top", "weights", "input_tensor", "input_shape", "pooling", "classes",
                                        "classifier_activation", "name"]
        assert {"normalization", "pyramid_outputs", "seed"} <= set(parameters)
        assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters.values())
        assert make.__name__ in make.__doc__ and "Returns" in make.__doc__
