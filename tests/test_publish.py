"""An export's file, check record and class names put in place as one unit
(`publish`: file operations, no TensorFlow; the conversions: test_deploy)."""

import json
import os

import pytest

from keras_skipinit.serving import publish

SUFFIXES = (".tflite", ".onnx")


def _publish(folder, name, content, labels=None, overwrite=False):
    """Puts a made-up file (no conversion) at folder/name as an export does."""
    with publish.Stage(str(folder), SUFFIXES) as stage:
        staged = os.path.join(stage.path, name)
        open(staged, "w").write(content)
        open(staged + ".check.json", "w").write(json.dumps({"file": content}))
        if labels:
            publish.write_labels(publish.labels_path(staged), labels)
        publish.check_labels(str(folder / name), labels and publish.labels_text(labels), overwrite, SUFFIXES)
        stage.publish(staged, str(folder / name), overwrite)


def _published(folder, name):
    path = folder / name
    labels = publish.labels_path(str(path))
    return (path.read_text(), json.loads((folder / (name + ".check.json")).read_text())["file"],
            open(labels).read().split() if os.path.exists(labels) else None)


def test_the_files_of_one_model_share_their_class_names_and_a_replacement_takes_its_own(tmp_path):
    """m.tflite and m.onnx share m.labels.txt: the same names are no
    conflict (the README's Deploy block wrote both), other names need
    --overwrite; a file replaced by a model without names loses the old
    names file, unless another file of the stem still uses it."""
    _publish(tmp_path, "m.tflite", "a", list("0123456789"))
    _publish(tmp_path, "m.onnx", "b", list("0123456789"))
    assert _published(tmp_path, "m.onnx") == ("b", "b", list("0123456789"))
    for overwrite in (False, True):  # --overwrite replaces m.onnx, never m.tflite's names (issue 91.4)
        with pytest.raises(ValueError, match="m.labels.txt names the classes of .*m.tflite, other classes than this "
                           "model's: export to another name, or remove .*m.tflite first"):
            _publish(tmp_path, "m.onnx", "c", list("abc"), overwrite=overwrite)
    assert _published(tmp_path, "m.tflite")[2] == list("0123456789")
    with pytest.raises(ValueError, match="m.labels.txt names the classes of .*m.onnx"):
        _publish(tmp_path, "m.tflite", "d", None, overwrite=True)
    for name in ("m.onnx", "m.onnx.check.json"):
        os.remove(tmp_path / name)
    _publish(tmp_path, "m.tflite", "d", None, overwrite=True)
    assert _published(tmp_path, "m.tflite") == ("d", "d", None)
    assert sorted(os.listdir(tmp_path)) == ["m.tflite", "m.tflite.check.json"]


def test_a_kill_between_the_moves_is_finished_by_the_next_export(tmp_path, monkeypatch):
    """File, record and class names are one unit: an export killed after
    its new names moved in but before its file did leaves its journal, and
    the next export into the folder finishes its moves; staging folders of
    exports killed before publishing are removed then too."""
    _publish(tmp_path, "m.tflite", "old", list("01"))
    replace = os.replace

    def killed_before_the_file(source, target):
        if target.endswith("m.tflite"):
            raise KeyboardInterrupt
        replace(source, target)

    monkeypatch.setattr(publish.os, "replace", killed_before_the_file)
    with pytest.raises(KeyboardInterrupt):
        _publish(tmp_path, "m.tflite", "new", list("ab"), overwrite=True)
    monkeypatch.undo()
    assert not os.path.exists(tmp_path / "m.tflite.check.json")  # never the record of another file
    killed_early = tmp_path / ".export-killed"
    killed_early.mkdir()
    (killed_early / ".lock").write_text("")
    _publish(tmp_path, "n.tflite", "other")
    assert _published(tmp_path, "m.tflite") == ("new", "new", ["a", "b"])
    assert sorted(os.listdir(tmp_path)) == ["m.labels.txt", "m.tflite", "m.tflite.check.json", "n.tflite",
                                            "n.tflite.check.json"]
