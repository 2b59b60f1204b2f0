import keras
import numpy as np
import pytest

from keras_skipinit import analysis, applications as apps, lsuv


def digits(n=64):
    """Standardized real digits (no TensorFlow: runs under every backend)."""
    return analysis.real_digits(n, seed=0)


def weight_layers(model):
    return [layer for layer in model.layers if isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense))]


def test_every_layer_output_has_unit_variance_on_the_batch():
    """Mishkin & Matas, Alg. 1: after LSUV each conv/dense output has variance
    1 (within the tolerance) on the batch it was computed on."""
    images = digits()
    model = apps.WideResNet(16, 1, input_shape=(28, 28, 1), normalization="none", seed=0)
    layers = weight_layers(model)
    probe = keras.Model(model.input, [layer.output for layer in layers])
    before = [float(np.var(out)) for out in probe(images)]
    assert max(before) > 10  # unnormalized He init: variance grows through the blocks
    records = lsuv.lsuv_init(model, images, tolerance=0.05, seed=1)
    after = [float(np.var(out)) for out in probe(images)]
    assert [r["layer"] for r in records] == [layer.name for layer in layers]
    np.testing.assert_allclose(after, 1.0, atol=0.05)
    np.testing.assert_allclose(after, [r["variance"] for r in records], rtol=1e-4)


def test_kernels_are_scaled_orthonormal_matrices():
    images = digits(32)
    model = apps.WideResNet(10, 2, input_shape=(28, 28, 1), normalization="sqrt2", seed=0)
    lsuv.lsuv_init(model, images, seed=3)
    for layer in weight_layers(model):
        w = layer.kernel.numpy().reshape(-1, layer.kernel.shape[-1])
        gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
        scale = np.mean(np.diag(gram))
        np.testing.assert_allclose(gram / scale, np.eye(len(gram)), atol=1e-4, err_msg=layer.name)


@pytest.mark.parametrize("normalization,match", [("batchnorm", "normalization layer"),
                                                 ("ghost_batchnorm", "normalization layer"),
                                                 ("nf", "weight-standardized")])
def test_models_with_normalization_are_refused(normalization, match):
    model = apps.WideResNet(10, 1, input_shape=(28, 28, 1), normalization=normalization)
    with pytest.raises(ValueError, match=match):
        lsuv.lsuv_init(model, digits(8))


@pytest.mark.heavy
def test_train_py_flag(tmp_path):
    from keras_skipinit.training import trainer
    with pytest.raises(ValueError, match="lsuv initializes networks without normalization"):
        trainer.train(trainer.Config(lsuv=True, normalization="batchnorm", model_dir=str(tmp_path / "a")))
    results = trainer.train(trainer.Config(depth=10, normalization="none", lsuv=True, epochs=1, steps_per_epoch=3,
                                             verbose=0, model_dir=str(tmp_path / "b")))
    assert results["status"] == "completed" and results["config"]["lsuv"] is True
