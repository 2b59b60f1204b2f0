"""Fine-tuning (`--init_from`) and linear probes (`--freeze_backbone`): a
short run on the embedded digits (10 classes, 28x28) started again on a
3-class folder of real digits written at test time (32x32 after resizing)."""

import json
import os
import warnings

import numpy as np
import pytest

from keras_skipinit.training import finetune, model_files, run_dir, trainer
from test_image_folder import write_folder


@pytest.fixture(scope="module")
def source_and_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    trainer.train(trainer.Config(depth=10, epochs=1, steps_per_epoch=20, alpha_init="one", verbose=0,
                                   model_dir=str(root / "digits")))
    return root / "digits", write_folder(root / "folder", per_class=(16, 4))


def weights(model_dir):
    model, _, _ = model_files.newest_model(str(model_dir))
    return {layer.name: [np.asarray(w) for w in layer.get_weights()] for layer in model.layers if layer.weights}


def tune(tmp_path, source, folder, name, **kwargs):
    config = trainer.Config(**{**dict(dataset=str(folder), depth=10, alpha_init="one", epochs=1, steps_per_epoch=2,
                                       batch_size=16, init_from=str(source), model_dir=str(tmp_path / name),
                                       verbose=0), **kwargs})
    return trainer.train(config), tmp_path / name


@pytest.mark.heavy
def test_a_new_head_on_the_runs_backbone_and_a_linear_probe(source_and_folder, tmp_path):
    """At a learning rate of 1e-9 the backbone after two steps is the
    source's (to float rounding) and the classifier has 3 classes; with
    --freeze_backbone at 0.1 the backbone is the source's exactly while the
    classifier moves. The run records where it started."""
    source, folder = source_and_folder
    theirs = weights(source)
    results, tuned = tune(tmp_path, source, folder, "tiny_lr", learning_rate=1e-9)
    mine = weights(tuned)
    assert mine["predictions"][0].shape == (theirs["predictions"][0].shape[0], 3)
    body = [name for name in mine if name not in finetune.HEAD]
    assert len(body) > 10 and all(np.allclose(a, b, atol=1e-6) for n in body for a, b in zip(mine[n], theirs[n]))
    assert results["config"]["init_from"] == str(source)
    assert json.load(open(tuned / "model_spec.json"))["config"]["init_from"] == str(source)
    _, probe = tune(tmp_path, source, folder, "probe", learning_rate=0.1, freeze_backbone=True)
    frozen = weights(probe)
    assert all(np.array_equal(a, b) for n in body for a, b in zip(frozen[n], theirs[n]))
    assert not np.allclose(frozen["predictions"][0], mine["predictions"][0])


@pytest.mark.heavy
def test_the_classifier_follows_the_class_names(source_and_folder, tmp_path, capsys):
    """Both runs record class names: a folder of the digits 0, 1 and 7 starts
    from the digits classifier's columns 0, 1 and 7 (a rule by class count
    re-initialized it), and 10 classes of other names start from a new head
    (that rule gave each class another class's weights)."""
    source, _ = source_and_folder
    theirs = weights(source)
    digits = write_folder(tmp_path / "digits", per_class=(16, 4), classes={"0": 0, "1": 1, "7": 7})
    _, tuned = tune(tmp_path, source, digits, "by_name", learning_rate=1e-9)
    mine = weights(tuned)
    np.testing.assert_allclose(mine["predictions"][0], theirs["predictions"][0][:, [0, 1, 7]], atol=1e-6)
    np.testing.assert_allclose(mine["predictions"][1], theirs["predictions"][1][[0, 1, 7]], atol=1e-6)
    assert "and the classifier, its 3 classes matched by name among the 10 there." in capsys.readouterr().out
    others = write_folder(tmp_path / "others", per_class=(16, 4), classes={f"c{d}": d for d in range(10)})
    _, tuned = tune(tmp_path, source, others, "other_names", learning_rate=1e-9)
    assert not np.allclose(weights(tuned)["predictions"][0], theirs["predictions"][0], atol=1e-3)
    assert ("the classifier re-initialized (other classes: 0, 1, 2, 3, ... 6 more there; c0, c1, c2, c3, ... 6 more "
            "here)") in capsys.readouterr().out
    # Partly the same classes: the shared classes' columns are copied, the others new (the whole classifier was
    # re-initialized; issue 89.6), and the line says which.
    partly = write_folder(tmp_path / "partly_images", per_class=(16, 4), classes={"1": 1, "7": 7, "new": 3})
    _, tuned = tune(tmp_path, source, partly, "partly", learning_rate=1e-9)
    head = weights(tuned)["predictions"]  # columns: "1", "7", "new" (sorted folder names)
    np.testing.assert_allclose(head[0][:, :2], theirs["predictions"][0][:, [1, 7]], atol=1e-6)
    np.testing.assert_allclose(head[1][:2], theirs["predictions"][1][[1, 7]], atol=1e-6)
    assert not np.allclose(head[0][:, 2], theirs["predictions"][0][:, 3], atol=1e-3)
    assert ("the classifier's columns of the 2 classes both have (1, 7); the other 1 re-initialized (new)"
            in capsys.readouterr().out)


@pytest.mark.heavy
def test_a_start_on_other_preprocessing_says_so(source_and_folder, tmp_path, capsys):
    """The digits run standardized each image; a fine-tuning run on the folder's per-channel statistics
    feeds its first layers otherwise scaled inputs: one note line, and none where they agree."""
    source, folder = source_and_folder
    tune(tmp_path, source, folder, "same")
    assert "Note: --init_from" not in capsys.readouterr().out
    tune(tmp_path, source, folder, "other", preprocessing="mean_std")
    (note,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Note: --init_from")]
    assert "preprocessed by standardize; this run's are by mean_std(" in note


@pytest.mark.heavy
def test_a_resumed_fine_tuning_run_continues_from_its_own_checkpoint(source_and_folder, tmp_path, monkeypatch):
    source, folder = source_and_folder
    tune(tmp_path, source, folder, "resumed", learning_rate=0.01)
    monkeypatch.setattr(finetune, "load_into", lambda *a: pytest.fail("restarted from --init_from"))
    results, _ = tune(tmp_path, source, folder, "resumed", learning_rate=0.01, epochs=2)
    assert results["status"] == "completed" and results["epochs_completed"] == 2


@pytest.mark.parametrize("change,match", [
    (dict(depth=16), "--depth=10 there, 16 here"),
    (dict(normalization="fixup", alpha_init=None), "--normalization=skipinit there, fixup here"),
    (dict(init_from="nowhere.keras"), "no such train.py model_dir, .keras or .weights.h5 file"),
    (dict(init_from=None, freeze_backbone=True), "freeze_backbone trains the classifier"),
    # An unset $SRC: it trained from scratch, recording '' (issue 91.5).
    (dict(init_from=""), "init_from is empty \\(an unset shell variable\\?\\)"),
    # The run's model.keras records its settings: the same layers under another method (/sqrt(2) scales the
    # branches of a network with the same convolutions as no scaling) is refused too.
    (dict(init_from="model.keras", normalization="none", alpha_init=None), "--normalization=skipinit there, none"),
])
def test_a_source_of_another_model_is_one_line(source_and_folder, tmp_path, change, match):
    source, folder = source_and_folder
    if change.get("init_from") == "model.keras":
        change = {**change, "init_from": str(source / "model.keras")}
    config = trainer.Config(**{**dict(dataset=str(folder), depth=10, alpha_init="one", init_from=str(source),
                                       model_dir=str(tmp_path / "run")), **change})
    with pytest.raises(ValueError, match=match):
        trainer.validate(config)
    assert not (tmp_path / "run").exists()


def test_a_run_started_from_its_own_model_dir_is_refused_before_restart_deletes_it(source_and_folder, tmp_path):
    """--init_from=X --model_dir=X --restart deleted X, then failed reading it (issue 91.11)."""
    import shutil

    source, _ = source_and_folder
    own = tmp_path / "own"
    shutil.copytree(source, own)
    before = sorted(os.listdir(own))
    for init_from in (own, own / run_dir.MODEL):
        config = trainer.Config(depth=10, alpha_init="one", init_from=str(init_from), model_dir=str(own),
                                 restart=True, verbose=0)
        with pytest.raises(ValueError, match="is this run's own --model_dir.* --restart would delete them first"):
            trainer.train(config)
        assert sorted(os.listdir(own)) == before


def test_a_keras_file_with_layers_this_model_lacks_is_refused(source_and_folder, tmp_path):
    """A .keras file records no settings: SkipInit's run loaded into a model without normalization or
    scaling (the same convolutions, no alphas) copied the convolutions and dropped the trained alphas
    silently, another function than the source's. Now one line names a layer left out."""
    source, folder = source_and_folder
    model, _, _ = model_files.newest_model(str(source))
    model.save(tmp_path / "digits.keras")
    with pytest.raises(ValueError, match="its layer 'group1_block1_skipinit' and 2 more have no place in this model"):
        tune(tmp_path, tmp_path / "digits.keras", folder, "other", normalization="none", alpha_init=None)


@pytest.mark.heavy
def test_a_weights_file_starts_a_run_with_a_new_head(source_and_folder, tmp_path, capsys):
    """--init_from=FILE.weights.h5 (model.save_weights: no architecture in
    it): read into this run's architecture with the file's 10 classes, the
    backbone copied and the 3-class head new, with a note that its settings
    could not be checked; the sweep passes --init_from and --freeze_backbone
    to its runs as experiment settings."""
    from keras_skipinit.sweep import cli, runner

    source, folder = source_and_folder
    model, _, _ = model_files.newest_model(str(source))
    path = tmp_path / "digits.weights.h5"
    model.save_weights(path)
    results, tuned = tune(tmp_path, path, folder, "from_weights", learning_rate=1e-9)
    theirs, mine = weights(source), weights(tuned)
    assert results["status"] == "completed" and mine["predictions"][0].shape[-1] == 3
    assert f"Note: --init_from={path} records no settings or preprocessing" in capsys.readouterr().out
    for name in ("stem_conv", "group3_block1_2_conv"):
        np.testing.assert_allclose(mine[name][0], theirs[name][0], atol=1e-6)
    # Of another method: SkipInit's weights into /sqrt(2) (its alphas would be dropped) or Fixup (its
    # multipliers and biases filled from them): refused, as from a model_dir (issue 91.3).
    for method, differs in (("sqrt2", "skip_init_scale: 3 weights there, 0 here"),
                            ("fixup", "fixup_bias: 0 weights there, 20 here")):
        with warnings.catch_warnings(record=True) as caught, pytest.raises(
                ValueError, match=f"holds the weights of another model or method \\({differs}\\)"):
            warnings.simplefilter("always")
            tune(tmp_path, path, folder, f"into_{method}", normalization=method, alpha_init=None)
        # refused before Keras reads the file: its "Skipping nested container" warning came before the line
        assert not [w for w in caught if "Skipping nested container" in str(w.message)]
        assert not (tmp_path / f"into_{method}" / run_dir.SPEC).exists()
    (tmp_path / "not.weights.h5").write_bytes(b"no hdf5")
    with pytest.raises(ValueError, match="not a weights file of a keras_skipinit classifier"):
        tune(tmp_path, tmp_path / "not.weights.h5", folder, "bad")

    settings = cli.parse_args(["--preset=skipinit_table1", f"--init_from={path}", "--freeze_backbone",
                               "--methods=skipinit", "--out=" + str(tmp_path / "sweep")])
    config = runner.config(settings, ("skipinit", 16, 64, 0.1, 0, "select"))
    assert config.init_from == str(path) and config.freeze_backbone
    with pytest.raises(SystemExit):  # an unset $SRC: refused by the sweep's parser too (issue 91.5)
        cli.parse_args(["--preset=skipinit_table1", "--init_from=", "--out=" + str(tmp_path / "sweep")])
    assert "init_from is empty" in capsys.readouterr().err


@pytest.mark.heavy
def test_imagenet_weights_start_a_resnet_with_their_own_preprocessing(tmp_path, monkeypatch, capsys):
    """--init_from=imagenet: a ResNet50-V2 run on a folder starts from keras.applications'
    ImageNet weights (stand-ins here: no download offline), its 3-class head new, and
    preprocesses as those weights expect (imagenet_tf: [-1, 1]), which the run records
    for its exports."""
    from test_applications import _offline_imagenet

    made = _offline_imagenet(monkeypatch, "ResNet50V2")
    folder = write_folder(tmp_path / "folder", per_class=(4, 2))
    config = trainer.Config(dataset=str(folder), model="resnet_v2", depth=50, normalization="batchnorm",
                             init_from="imagenet", image_size=224,
                             channels=3, epochs=1, steps_per_epoch=1, batch_size=4, learning_rate=1e-9,
                             model_dir=str(tmp_path / "run"), verbose=0)
    results = trainer.train(config)
    ((theirs, _),) = made
    mine = weights(tmp_path / "run")
    for name in ("conv1_conv", "conv3_block2_2_conv", "conv5_block3_3_conv"):
        np.testing.assert_allclose(mine[name][0], theirs.get_layer(name).get_weights()[0], atol=1e-6)
    assert mine["predictions"][0].shape == (2048, 3)
    assert "Started from keras.applications.ResNet50V2's ImageNet weights: " in capsys.readouterr().out
    assert results["status"] == "completed"
    assert json.load(open(tmp_path / "run" / "model_spec.json"))["preprocessing"] == "imagenet_tf"


@pytest.mark.parametrize("change,match", [
    (dict(model="wrn", depth=16), "ImageNet weights for --model=resnet_v1 and resnet_v2"),
    (dict(normalization="skipinit"), "--normalization=batchnorm or ghost_batchnorm without --loop_blocks"),
    (dict(preprocessing="standardize"), "preprocesses as its weights expect \\(imagenet_caffe for --model=resnet_v1"),
])
def test_imagenet_weights_where_they_do_not_fit_are_one_line(tmp_path, change, match):
    config = trainer.Config(**{**dict(model="resnet_v1", depth=50, normalization="batchnorm", init_from="imagenet",
                                       model_dir=str(tmp_path / "run")), **change})
    with pytest.raises(ValueError, match=match):
        trainer.validate(config)
    assert not (tmp_path / "run").exists()


def test_imagenet_weights_need_imagenet_style_images():
    """28x28 digits would be standardized per image, not scaled as the weights expect: one line naming the fix."""
    from keras_skipinit.data import preprocessing
    with pytest.raises(ValueError, match="my_images has 28x28x3 images \\(a folder's --image_size=224 makes them so"):
        preprocessing.choose("imagenet_tf", "my_images", (28, 28, 3))
    assert preprocessing.choose("imagenet_caffe", "my_images", (None, None, 3)) == "imagenet_caffe"


def test_every_init_from_value_has_one_kind_of_source(tmp_path):
    """--init_from's kinds of source are one table (`finetune.SOURCES`): each value is taken by the first
    entry that takes it, a directory before a file's suffix; a value no kind takes is the same one line from
    the check, the load and the records (no entry leaves a step undefined)."""
    (tmp_path / "run.keras").mkdir()  # a directory named like a file: a model_dir
    (tmp_path / "w.weights.h5").write_bytes(b"")
    kinds = {value: finetune.source_for(value).kind for value in
             (finetune.IMAGENET, str(tmp_path / "run.keras"), str(tmp_path / "w.weights.h5"), "m.keras", "m.h5")}
    assert list(kinds.values()) == ["imagenet", "model_dir", "weights", ".keras", "none"]
    nothing = finetune.source_for("m.h5")
    assert finetune.preprocessing_note("m.h5", "standardize") is None and not nothing.record("m.h5").known
    for step in (lambda: nothing.check(trainer.Config(init_from="m.h5"), "m.h5"),
                 lambda: nothing.load("m.h5", None, None)):
        with pytest.raises(ValueError, match="--init_from=m.h5: no such train.py model_dir, .keras or .weights.h5"):
            step()
