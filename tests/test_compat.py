"""What older versions wrote under names that have changed since (the
compat module): model_spec.json's model record, a .keras file's ghost batch
norm, and the constructors' old keywords, all build today's model."""

import json
import zipfile

import numpy as np
import pytest

from keras_skipinit import applications as apps
from keras_skipinit.training import run_dir
from keras_skipinit.layers import GhostBatchNormalization


def test_a_model_spec_with_the_old_names_builds_the_same_model():
    today = dict(model="wrn", depth=10, width=1, input_shape=[8, 8, 1], classes=3, seed=0)
    old = run_dir.recorded_model({**today, "normalization": "ghost_batchnorm", "virtual_batch_size": 2,
                                  "dropout_rate": 0.25})
    new = apps.create_model(**today, normalization="ghost_batchnorm", ghost_batch_size=2, dropout=0.25)
    assert [l.ghost_batch_size for l in old.layers if isinstance(l, GhostBatchNormalization)][:1] == [2]
    assert old.get_layer("top_dropout").rate == new.get_layer("top_dropout").rate == 0.25
    assert [w.shape for w in old.weights] == [w.shape for w in new.weights]


def test_old_keywords_warn_and_both_names_at_once_are_refused():
    with pytest.warns(DeprecationWarning, match="'virtual_batch_size' is now 'ghost_batch_size'"):
        model = apps.WideResNet(10, 1, input_shape=(8, 8, 1), classes=3, normalization="ghost_batchnorm",
                                virtual_batch_size=2)
    assert {l.ghost_batch_size for l in model.layers if isinstance(l, GhostBatchNormalization)} == {2}
    with pytest.raises(TypeError, match="one setting under two names"):
        apps.ResNet50V2(dropout_rate=0.1, dropout=0.2, weights=None)


def test_every_renamed_public_keyword_still_works_with_a_warning():
    """Each keyword renamed since the first release (`compat.RENAMED_KEYWORDS`) works under its old name with
    a DeprecationWarning, in the model constructors and, for virtual_batch_size (tf_keras' name, what people
    moving from Keras 2 type), in the layer itself (issue 88.8: it raised "Unrecognized keyword arguments")."""
    from keras_skipinit import compat
    values = {"ghost_batch_size": 2, "dropout": 0.25}
    assert set(compat.RENAMED_KEYWORDS.values()) == set(values)
    for old, new in compat.RENAMED_KEYWORDS.items():
        with pytest.warns(DeprecationWarning, match=f"'{old}' is now '{new}'"):
            model = apps.WideResNet(10, 1, input_shape=(8, 8, 1), classes=3, normalization="ghost_batchnorm",
                                    seed=0, **{old: values[new]})
        if new == "ghost_batch_size":
            assert {l.ghost_batch_size for l in model.layers if isinstance(l, GhostBatchNormalization)} == {2}
        else:
            assert model.get_layer("top_dropout").rate == 0.25
    with pytest.warns(DeprecationWarning, match="GhostBatchNormalization: 'virtual_batch_size' is now 'ghost_batch_size'"):
        layer = GhostBatchNormalization(virtual_batch_size=4)
    # Each warning names the user's line, also through create_model (it pointed at registry.py; issue 91)
    for make in (lambda: GhostBatchNormalization(virtual_batch_size=4),
                 lambda: apps.create_model("wrn_16_1", input_shape=(8, 8, 1), classes=3, dropout_rate=0.1)):
        with pytest.warns(DeprecationWarning) as caught:
            make()
        assert [w.filename for w in caught] == [__file__], [w.filename for w in caught]
    assert layer.ghost_batch_size == 4 and layer.get_config()["ghost_batch_size"] == 4
    with pytest.raises(TypeError, match="one setting under two names"):
        GhostBatchNormalization(4, virtual_batch_size=4)


def test_a_keras_file_saved_with_virtual_batch_size_loads(tmp_path):
    """The saved config of GhostBatchNormalization named its argument
    virtual_batch_size before the rename: such a file loads, same outputs."""
    import keras

    model = apps.WideResNet(10, 1, input_shape=(8, 8, 1), classes=3, normalization="ghost_batchnorm",
                            ghost_batch_size=2, seed=0)
    path, old = tmp_path / "m.keras", tmp_path / "old.keras"
    model.save(path)
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "config.json":
                assert b'"ghost_batch_size"' in data
                data = data.replace(b'"ghost_batch_size"', b'"virtual_batch_size"')
                json.loads(data)
            dst.writestr(item, data)
    loaded = keras.saving.load_model(old)
    # A file naming both (edited, or written by another program) is refused, as such a model_spec.json is
    # (issue 91.9: one of the two was taken silently).
    both = tmp_path / "both.keras"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(both, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "config.json":
                data = data.replace(b'"ghost_batch_size": 2', b'"ghost_batch_size": 2, "virtual_batch_size": 4')
            dst.writestr(item, data)
    with pytest.raises(Exception, match="names both 'virtual_batch_size' \\(4\\) and 'ghost_batch_size' \\(2\\)"):
        keras.saving.load_model(both)
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 1)).astype("float32")
    np.testing.assert_allclose(loaded(x, training=True), model(x, training=True), atol=1e-6)
    assert {l.ghost_batch_size for l in loaded.layers if isinstance(l, GhostBatchNormalization)} == {2}
