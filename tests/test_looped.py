"""The looped, depth-independent form (loop_blocks=True) is the same function
as the unrolled form: small depths only, the loop logic is the same at any depth.

Tolerance: float32 round-off, rtol 1e-5 and atol 1e-5 on outputs and weights.
On TensorFlow the forward passes are bit-identical (the same ops in the same
order); XLA on JAX fuses the loop body differently (seen: 5e-7 relative,
2e-6 absolute on probabilities), and after optimizer steps reassociation
gives ~1e-7 on the weights."""

import keras
import numpy as np
import pytest

from conftest import tf_only
from keras_skipinit import analysis, applications as apps, looped
from keras_skipinit.normalization import NORMALIZATIONS

RNG = np.random.default_rng(0)
X = RNG.standard_normal((6, 16, 16, 3)).astype("float32")
Y = np.eye(10, dtype="float32")[np.arange(6) % 10]
LOOPABLE = list(NORMALIZATIONS)


def pair(normalization="batchnorm", depth=22, rng=RNG, noise=0.05, **kwargs):
    """An unrolled WRN with weights perturbed by N(0, noise) (BN statistics
    included) and its looped twin with the same weights."""
    if normalization == "ghost_batchnorm":
        kwargs.setdefault("ghost_batch_size", 4)
    common = dict(input_shape=(16, 16, 3), normalization=normalization, seed=1, **kwargs)
    unrolled = apps.WideResNet(depth, 1, **common)
    loop = apps.WideResNet(depth, 1, loop_blocks=True, **common)
    unrolled(X, training=True)
    unrolled.set_weights([w + rng.normal(0, noise, w.shape).astype(w.dtype) for w in unrolled.get_weights()])
    loop(X)
    looped.transfer_weights(unrolled, loop)
    return unrolled, loop


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def weights_by_block(model):
    return looped._per_block_weights(model)


def assert_same_weights(a, b, atol=0.0):
    assert_same_block_weights(weights_by_block(a), weights_by_block(b), atol)


def assert_same_block_weights(wa, wb, atol=0.0):
    """`weights_by_block` snapshots: the same blocks, equal weights (exactly with atol 0)."""
    assert sorted(wa) == sorted(wb)
    for name in wa:
        for x, y in zip(wa[name], wb[name]):
            np.testing.assert_allclose(x, y, rtol=1e-5 if atol else 0, atol=atol, err_msg=name)


@pytest.mark.parametrize("normalization", LOOPABLE)
def test_looped_equals_unrolled_in_inference_and_training(normalization):
    unrolled, loop = pair(normalization)
    assert any(isinstance(layer, looped.RepeatedBlocks) for layer in loop.layers)
    assert loop.count_params() == unrolled.count_params()
    close(loop(X, training=False), unrolled(X, training=False))
    if normalization != "regularized_skipinit":  # dropout: training mode is random
        close(loop(X, training=True), unrolled(X, training=True))
        assert_same_weights(unrolled, loop, atol=1e-5)  # BN moving statistics updated alike


@pytest.mark.heavy
@pytest.mark.parametrize("normalization,remat", [("ghost_batchnorm", True), ("fixup", False)])
def test_training_steps_give_the_same_weights(normalization, remat):
    """Same loss and gradients: after an SGD step (moving statistics included)
    the looped model's weights equal the unrolled model's, and the next step's
    loss shows those updated weights are the ones used. With remat, the
    backward pass recomputes the blocks: the statistics must still move once
    a step (ghost BN); without it, the plain loop (Fixup's scalars)."""
    # Weights after one step, not three: ReLU's gradient jumps where a pre-activation crosses zero, so any
    # rounding difference between the forms (remat recomputes the forward; XLA fuses the loop body
    # differently) can move a later step's weights by far more than round-off. Ghost BN keeps its weights as
    # built: with the 0.05 perturbation a 1e-6 relative change of the input moved one step's update by 3%
    # (seen in CI under JAX after 3 steps: 2e-4 apart); as built, 1e-5 moves it by 4e-5 (7e-7 absolute).
    # Its own generator: the weights must not depend on which tests pytest-xdist ran before in this worker.
    # Depth 16: one loop (group1's two blocks; the other groups' second block stands alone), the cheapest
    # model with a loop to differentiate through.
    ghost = normalization == "ghost_batchnorm"
    unrolled, _ = pair(normalization, depth=16, rng=np.random.default_rng(0), noise=0.0 if ghost else 0.05)
    loop = apps.WideResNet(16, 1, input_shape=(16, 16, 3), normalization=normalization, loop_blocks=True,
                           remat=remat, ghost_batch_size=4 if ghost else None)
    loop(X)
    looped.transfer_weights(unrolled, loop)
    losses, after_one_step = [], []
    for model in (unrolled, loop):
        model.compile(optimizer=keras.optimizers.SGD(0.02, momentum=0.9), loss="categorical_crossentropy")
        losses.append([float(model.train_on_batch(X, Y))])
        after_one_step.append(weights_by_block(model))
        losses[-1].append(float(model.train_on_batch(X, Y)))
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert_same_block_weights(*after_one_step, atol=1e-5)


@pytest.mark.parametrize("version,normalization", [(1, "fixup"), (2, "skipinit"), (2, "batchnorm")])
def test_bottleneck_resnets_loop_their_identical_blocks(version, normalization):
    x = RNG.standard_normal((2, 48, 48, 3)).astype("float32")
    common = dict(input_shape=(48, 48, 3), classes=5, normalization=normalization, seed=0)
    unrolled = apps.ResNet(50, version, **common)
    loop = apps.ResNet(50, version, loop_blocks=True, **common)
    unrolled(x)
    unrolled.set_weights([w + RNG.normal(0, 0.02, w.shape).astype(w.dtype) for w in unrolled.get_weights()])
    loop(x)
    looped.transfer_weights(unrolled, loop)
    runs = {layer.name: len(layer.prefixes) for layer in loop.layers if isinstance(layer, looped.RepeatedBlocks)}
    # V1: blocks 2.. of each stage; V2: blocks 2..n-1 of the strided stages (the last has the stride).
    assert runs == ({"conv2_block2_x2": 2, "conv3_block2_x3": 3, "conv4_block2_x5": 5, "conv5_block2_x2": 2}
                    if version == 1 else {"conv3_block2_x2": 2, "conv4_block2_x4": 4, "conv5_block2_x2": 2})
    close(loop(x, training=True), unrolled(x, training=True))


def test_conversion_both_ways_and_unroll():
    unrolled, loop = pair("fixup")
    back = looped.unroll(loop)
    assert [layer.name for layer in back.layers[1:]] == [layer.name for layer in unrolled.layers[1:]]
    assert_same_weights(back, unrolled)  # copies: exact
    fresh = apps.WideResNet(22, 1, input_shape=(16, 16, 3), normalization="fixup")
    fresh(X)
    looped.transfer_weights(loop, fresh)  # looped -> unrolled constructor form
    assert_same_weights(fresh, unrolled)
    assert looped.unroll(unrolled) is unrolled
    with pytest.raises(ValueError, match="no counterpart"):
        looped.transfer_weights(apps.WideResNet(10, 1, input_shape=(16, 16, 3), normalization="fixup"), fresh)


def test_analysis_reads_a_looped_model_through_its_unrolled_form():
    unrolled, loop = pair("batchnorm")
    a, b = analysis.block_statistics(unrolled, X), analysis.block_statistics(loop, X)
    assert [r["block"] for r in a] == [r["block"] for r in b] and len(a) == 9
    for ra, rb in zip(a, b):
        assert ra["skip_var"] == pytest.approx(rb["skip_var"], rel=1e-5)


@pytest.mark.parametrize("normalization", ["ghost_batchnorm", "nf"])
def test_keras_file_and_config_round_trip(tmp_path, normalization):
    _, loop = pair(normalization)
    path = tmp_path / "looped.keras"
    loop.save(path)
    loaded = keras.models.load_model(path)
    close(loaded(X, training=False), loop(X, training=False))
    layer = next(layer for layer in loop.layers if isinstance(layer, looped.RepeatedBlocks))
    clone = looped.RepeatedBlocks.from_config(layer.get_config())
    assert clone.prefixes == layer.prefixes and clone.get_config()["prefixes"] == layer.prefixes
    assert clone.initial_values == layer.initial_values and bool(layer.initial_values) == (normalization == "nf")


@pytest.mark.parametrize("seed", [3, None])
def test_fresh_looped_blocks_are_drawn_like_unrolled_ones(seed):
    """Each looped block gets its own draw from the template's initializers
    (He-normal kernels with the unrolled std), not copies of one block, with
    or without a seed (an unseeded Keras initializer repeats its values)."""
    model = apps.WideResNet(52, 1, input_shape=(16, 16, 3), normalization="skipinit", loop_blocks=True, seed=seed)
    layer = model.get_layer("group1_block1_x8")
    kernel = keras.ops.convert_to_numpy(next(w.value for w in layer._stacked if w.name == "1_conv_kernel"))
    assert kernel.shape == (8, 3, 3, 16, 16)
    assert not any(np.allclose(kernel[i], kernel[j]) for i in range(8) for j in range(i))
    np.testing.assert_allclose(kernel.std(axis=(1, 2, 3, 4)), np.sqrt(2 / (3 * 3 * 16)), rtol=0.1)


def test_fresh_looped_nf_blocks_get_their_own_alpha():
    """NF's fixed alpha = 1/sqrt(Var[x]) differs per block (Var[x] grows by
    beta^2 a block): a fresh looped model has the unrolled model's alphas,
    block by block, and the analytic values after each loop (post_bn too)."""
    common = dict(input_shape=(16, 16, 3), normalization="nf", nf_beta=0.3)
    alphas = [{name: float(w[0]) for name, w in weights_by_block(model).items() if name.endswith("_nf_alpha")}
              for model in (apps.WideResNet(22, 1, **common), apps.WideResNet(22, 1, loop_blocks=True, **common))]
    assert alphas[0] == pytest.approx(alphas[1], rel=1e-6) and len(alphas[0]) == 10  # 9 blocks + post_bn
    # group1 (no projection at width 1): Var[x] = 1 + j * beta^2 entering block j + 1.
    assert [alphas[1][f"group1_block{j + 1}_preact_bn_nf_alpha"] for j in range(3)] == pytest.approx(
        [1 / np.sqrt(1 + j * 0.09) for j in range(3)], rel=1e-6)
    assert alphas[1]["post_bn_nf_alpha"] == pytest.approx(1 / np.sqrt(1 + 3 * 0.09), rel=1e-6)


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="pass loop_blocks=True"):
        apps.WideResNet(16, 1, remat=True)
    _, loop = pair("skipinit")
    layer = next(layer for layer in loop.layers if isinstance(layer, looped.RepeatedBlocks))
    with pytest.raises(ValueError, match="one value per block"):
        looped.RepeatedBlocks(layer.block, layer.prefixes, initial_values={"_1_conv/kernel": [0.0]})
    with pytest.raises(ValueError, match="name no weight"):
        looped.RepeatedBlocks(layer.block, layer.prefixes, initial_values={"_nope/alpha": [0.0] * 3}).build(None)


# --- TensorFlow: graph size, export, tf.distribute, train.py ---------------------------


def train_step_ops(depth, loop):
    import tensorflow as tf

    model = apps.WideResNet(depth, 1, input_shape=(16, 16, 3), normalization="batchnorm", loop_blocks=loop)
    model.compile(optimizer="sgd", loss="categorical_crossentropy")
    step = tf.function(lambda x, y: model.train_step((x, y)))
    graph = step.get_concrete_function(tf.TensorSpec((6, 16, 16, 3)), tf.TensorSpec((6, 10))).graph
    return len(graph.get_operations())


@pytest.mark.heavy
@tf_only
def test_the_traced_graph_does_not_grow_with_depth():
    looped_ops = [train_step_ops(d, True) for d in (22, 52)]
    unrolled_ops = [train_step_ops(d, False) for d in (22, 52)]
    assert looped_ops[0] == looped_ops[1]
    assert unrolled_ops[1] > 2 * unrolled_ops[0] > 2 * looped_ops[0]


@pytest.mark.heavy
@tf_only
def test_export_of_a_looped_model_serves_its_outputs(tmp_path):
    """The loop runs in TF Serving's loader too (the default export: folded,
    the loop body rewritten without its BatchNorm layers)."""
    import tensorflow as tf

    from keras_skipinit.serving import savedmodel
    from test_export import serve_without_the_package

    model = apps.WideResNet(22, 1, input_shape=(28, 28, 1), normalization="batchnorm", loop_blocks=True, seed=2)
    model(RNG.standard_normal((4, 28, 28, 1)).astype("float32"), training=True)
    path = savedmodel.export(model, str(tmp_path / "folded"), "looped")
    images = RNG.integers(0, 256, (3, 28, 28, 1)).astype("uint8")
    expected = np.asarray(model(tf.image.per_image_standardization(images), training=False))
    (out,) = serve_without_the_package(images, [path], tmp_path)
    for key in ("tf2_images", "tf2_bytes", "tf1_serving_default", "tf1_predict_image_bytes"):
        np.testing.assert_allclose(out[key], expected, atol=1e-5, err_msg=key)
