"""`python -m keras_skipinit.predict`: real digits written as PNG files at test
time, answered by a short train.py run, its SavedModel and its LiteRT and
ONNX files. The run's own answers need no TensorFlow (CI's JAX stage runs
the first tests)."""

import csv
import dataclasses
import json
import os

import numpy as np
import pytest
from PIL import Image

from conftest import require_module, tf_only
from keras_skipinit.data import digits, preprocessing
from keras_skipinit.training import model_files, run_dir, trainer
from keras_skipinit.predict import cli as predict


@pytest.fixture(scope="module")
def run_and_images(tmp_path_factory):
    """A 20-step WRN-10-1 run on the embedded digits, and 40 of its test digits as PNG files (4 of each)."""
    root = tmp_path_factory.mktemp("predict")
    trainer.train(trainer.Config(depth=10, width=1, epochs=1, steps_per_epoch=20, learning_rate=0.05,
                                   alpha_init="one", verbose=0, model_dir=str(root / "run")))
    (_, _), (x, y) = digits.split()
    folder = root / "images" / "nested"
    folder.mkdir(parents=True)
    for digit in range(10):
        for i, image in enumerate(x[y == digit][:4]):
            Image.fromarray(image[..., 0]).save(folder / f"{digit}_{i}.png")
    return root / "run", root / "images"


def answers(capsys, *argv):
    status = predict.main([str(a) for a in argv])
    out = capsys.readouterr().out
    return status, [line.split("\t") for line in out.splitlines()]


def test_a_run_answers_what_its_model_computes(run_and_images, capsys, tmp_path):
    """Each line: path, label (the run's class names), score; the labels are
    the argmax of the Keras model on the run's evaluation preprocessing of the
    same pixels, and the CSV holds the same rows."""
    run, images = run_and_images
    csv_path = tmp_path / "new" / "a.csv"  # its folder is made
    status, lines = answers(capsys, f"--source={run}", images, "--top_k=2", f"--output={csv_path}")
    files = sorted(str(p) for p in images.rglob("*.png"))
    assert status == 0 and [line[0] for line in lines] == files and all(len(line) == 5 for line in lines)
    model, prep, _ = model_files.newest_model(str(run))
    x = np.stack([np.asarray(Image.open(f))[..., None] for f in files])
    want = np.argmax(np.asarray(model(preprocessing.get(prep).numpy(x), training=False)), axis=-1)
    assert [line[1] for line in lines] == [str(c) for c in want]  # the digits' class names are "0".."9"
    assert all(float(line[2]) >= float(line[4]) for line in lines)
    with open(csv_path) as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["path", "label_1", "score_1", "label_2", "score_2"] and rows[1:] == lines


@pytest.mark.skipif(os.environ.get("KERAS_BACKEND", "tensorflow") != "jax",
                    reason="JAX only: there each initializer is an XLA program compiled per shape (CI's JAX stage)")
def test_a_jax_run_folder_is_rebuilt_without_running_its_initializers(run_and_images, monkeypatch):
    """Issue 89.5: predict from a JAX run folder took 20 s, most of it compiling the initializers of weights
    the checkpoint then replaced. The model comes back with no initializer run, computes what the model
    built as usual and restored computes, and Keras holds no variable left uninitialized."""
    import keras
    from keras.src.backend.common import global_state

    from keras_skipinit.training.checkpoint import Checkpoint

    run, _ = run_and_images
    initialized = []
    original = keras.Variable._initialize_with_initializer
    monkeypatch.setattr(keras.Variable, "_initialize_with_initializer",
                        lambda self, initializer: initialized.append(self.path) or original(self, initializer))
    model, _, _ = model_files.newest_model(str(run))
    assert initialized == [] and not global_state.get_global_attribute("uninitialized_variables")
    monkeypatch.undo()
    usual = run_dir.recorded_model(run_dir.read_spec(str(run))["model"])
    Checkpoint(str(run / run_dir.CHECKPOINTS)).restore(usual, with_optimizer=False)
    x = np.random.default_rng(0).standard_normal((8, 28, 28, 1)).astype("float32")
    np.testing.assert_array_equal(np.asarray(model(x, training=False)), np.asarray(usual(x, training=False)))
    assert [w.path for w in model.weights] == [w.path for w in usual.weights]


def test_a_keras_file_from_elsewhere_answers_with_the_preprocessing_named(run_and_images, capsys, tmp_path):
    """A .keras file train.py did not save records no preprocessing: refused,
    naming --preprocessing, which then answers as the run (--labels names its
    classes); an export (which preprocesses inside) refuses the flag."""
    run, images = run_and_images
    model, _, _ = model_files.newest_model(str(run))
    model.save(tmp_path / "plain.keras")
    with pytest.raises(SystemExit):
        predict.main([f"--source={tmp_path / 'plain.keras'}", str(images)])
    assert "pass --preprocessing=standardize|" in capsys.readouterr().err
    _, from_run = answers(capsys, f"--source={run}", images, "--top_k=2")
    status, plain = answers(capsys, f"--source={tmp_path / 'plain.keras'}", images, "--top_k=2", "--preprocessing=standardize")
    assert status == 0 and [[line[0], line[2], line[4]] for line in plain] == [[line[0], line[2], line[4]] for line in from_run]
    (tmp_path / "names.txt").write_text("".join(f"digit {d}\n" for d in range(10)))  # it records no names: --labels
    _, named = answers(capsys, f"--source={tmp_path / 'plain.keras'}", images, "--preprocessing=standardize",
                       f"--labels={tmp_path / 'names.txt'}")
    assert [line[1] for line in named] == [f"digit {line[1]}" for line in from_run]
    (tmp_path / "m.onnx").write_bytes(b"")
    with pytest.raises(SystemExit):
        predict.main([f"--source={tmp_path / 'm.onnx'}", str(images), "--preprocessing=standardize"])
    assert "--preprocessing is for a train.py model_dir or a .keras file" in capsys.readouterr().err


def test_a_model_without_a_classifier_is_refused(run_and_images, capsys, tmp_path):
    """A backbone's pooled features under a softmax answered "class 40" (issue 91.10): refused, one line."""
    from keras_skipinit.applications import WideResNet

    _, images = run_and_images
    for pooling in ("avg", None):
        path = tmp_path / f"backbone_{pooling}.keras"
        WideResNet(10, 1, input_shape=(28, 28, 1), include_top=False, pooling=pooling, seed=0).save(path)
        with pytest.raises(SystemExit) as exit_info:
            predict.main([f"--source={path}", "--preprocessing=standardize", str(images)])
        assert exit_info.value.code == 2
        (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
        assert "features, not class scores; it needs a classifier head" in line, line


def test_a_model_of_non_square_images_answers_and_a_size_free_one_is_refused(tmp_path, capsys):
    """A model of 24x40 images (a folder of one shared non-square size trains one) answered nothing: every
    image was "not a readable image" (issue 91.19). Images of its size are taken as they are, others resized
    to cover 24x40 and their centre kept; a model of any size is refused in one line."""
    import keras

    from keras_skipinit.applications import WideResNet

    model = WideResNet(10, 1, input_shape=(24, 40, 1), classes=3, seed=0, normalization="skipinit", alpha_init="one")
    model_files.save_model(model, str(tmp_path / "wide.keras"), "standardize")
    rng = np.random.default_rng(0)
    same = rng.integers(0, 256, (24, 40), np.uint8)
    Image.fromarray(same).save(tmp_path / "same.png")
    Image.fromarray(rng.integers(0, 256, (60, 60), np.uint8)).save(tmp_path / "square.png")
    status, lines = answers(capsys, "--source=" + str(tmp_path / "wide.keras"), "--top_k=3", tmp_path / "same.png",
                            tmp_path / "square.png")
    assert status == 0 and len(lines) == 2
    want = keras.ops.convert_to_numpy(model(preprocessing.get("standardize").numpy(same[None, ..., None]),
                                            training=False))[0]
    got = {int(c): float(p) for c, p in zip(lines[0][1::2], lines[0][2::2])}
    np.testing.assert_allclose([got[c] for c in range(3)], want, atol=1e-4)
    WideResNet(10, 1, input_shape=(None, None, 1), classes=3, seed=0).save(tmp_path / "any.keras")
    with pytest.raises(SystemExit):
        predict.main([f"--source={tmp_path / 'any.keras'}", "--preprocessing=standardize", str(tmp_path / "same.png")])
    assert "takes images of any size (None, None, 1): predict feeds a fixed size" in capsys.readouterr().err


def test_unreadable_images_are_named_and_the_others_answered(run_and_images, capsys, tmp_path):
    run, images = run_and_images
    broken = tmp_path / "broken.png"
    broken.write_text("not an image")
    status = predict.main([f"--source={run}", str(images), str(broken)])
    out, err = capsys.readouterr()
    assert status == 1 and len(out.splitlines()) == 40 and "broken.png: not a readable image" in err
    for argv, match in (([f"--source={tmp_path / 'none'}", str(images)], "no such model file or model_dir"),
                        ([f"--source={run}", str(tmp_path / "none.png")], "no such image file or folder"),
                        ([f"--source={run}", str(images), f"--output={broken}/a.csv"], "is a file"),
                        # root may write everywhere by access(); /proc takes no file (issue 91.22: refused at the end)
                        ([f"--source={run}", str(images), "--output=/proc/x.csv"],
                         "--output=/proc/x.csv cannot be written: /proc takes no new file")):
        with pytest.raises(SystemExit) as exit_:
            predict.main(argv)
        assert exit_.value.code == 2 and match in capsys.readouterr().err


@pytest.mark.parametrize("stop", ["ctrl_c", "sigterm"])
def test_answers_stream_and_ctrl_c_keeps_those_given(run_and_images, capsys, tmp_path, monkeypatch, stop):
    """Ctrl-C (or SIGTERM: it wrote no --output, issue 91.12) in the third batch of 10: the 20 answers given
    are on stdout and in --output, one line says where it stopped, exit 130 (143) (the answers came all at
    the end, so an interrupted run left none)."""
    import signal

    run, images = run_and_images
    load = predict.load

    def interrupted_in_the_third_batch(*args):
        source = load(*args)
        calls = []

        def probabilities(images, files):
            calls.append(1)
            if len(calls) == 3:
                if stop == "sigterm":
                    os.kill(os.getpid(), signal.SIGTERM)
                raise KeyboardInterrupt
            return source.probabilities(images, files)

        return dataclasses.replace(source, probabilities=probabilities)

    monkeypatch.setattr(predict, "load", interrupted_in_the_third_batch)
    before = signal.getsignal(signal.SIGTERM)
    status = predict.main([f"--source={run}", str(images), "--batch_size=10", f"--output={tmp_path / 'a.csv'}"])
    out, err = capsys.readouterr()
    assert status == {"ctrl_c": 130, "sigterm": 143}[stop] and len(out.splitlines()) == 20
    assert f"{'terminated' if stop == 'sigterm' else 'interrupted'} after 20 of 40 images; their answers are above " \
           "and in --output" in err
    assert signal.getsignal(signal.SIGTERM) is before  # the handler put back
    with open(tmp_path / "a.csv") as f:
        assert [row[0] for row in list(csv.reader(f))[1:]] == [line.split("\t")[0] for line in out.splitlines()]


def test_progress_on_a_terminal_is_cleared_before_each_answer(run_and_images, capsys, monkeypatch):
    """On a terminal the answers ran into the progress line ("64/100 imagesmy_images/..."; issue 89.6): each
    progress line is cleared (carriage return, erase line) before the answers that follow it."""
    import sys

    run, images = run_and_images
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert predict.main([f"--source={run}", str(images), "--batch_size=16"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 40
    assert err.count("\r\x1b[K") == 2 and err.endswith("\r40/40 images\n"), repr(err)  # after 16 and 32


def test_a_path_that_would_split_its_line_is_written_as_a_json_string(run_and_images, capsys, tmp_path, monkeypatch):
    """One line per image, and each path read back: a tab, a line break or a
    leading double quote would make a name two fields, two lines or ambiguous."""
    run, images = run_and_images
    digit = next(images.rglob("*.png"))
    names = ["plain.png", "tab\there.png", "line\nbreak.png", '"quoted".png', 'in"side.png']
    for name in names:
        (tmp_path / name).write_bytes(digit.read_bytes())
    monkeypatch.chdir(tmp_path)
    status = predict.main([f"--source={run}", *names])
    lines = capsys.readouterr().out.splitlines()
    assert status == 0 and len(lines) == len(names) and all(len(line.split("\t")) == 3 for line in lines)
    paths = [line.split("\t")[0] for line in lines]
    assert [json.loads(p) if p.startswith('"') else p for p in paths] == names
    assert paths[0] == "plain.png" and paths[-1] == 'in"side.png'  # written as they are


def test_a_top_k_above_the_classes_answers_every_class_under_a_header_of_as_many(run_and_images, capsys, tmp_path):
    run, images = run_and_images
    status = predict.main([f"--source={run}", str(images), "--top_k=12", f"--output={tmp_path / 'a.csv'}"])
    lines = capsys.readouterr().out.splitlines()
    with open(tmp_path / "a.csv") as f:
        rows = list(csv.reader(f))
    assert status == 0 and all(len(line.split("\t")) == 21 for line in lines)  # the path and 10 classes
    assert len(rows[0]) == 21 and rows[0][-1] == "score_10" and all(len(row) == 21 for row in rows)


def test_a_folder_is_searched_for_the_formats_a_training_folder_reads(tmp_path):
    """A run trained on TIFF or PGM files (microscopy, scans) is asked about the same files; notes are left out."""
    for name in ("a.tif", "b.TIFF", "c.pgm", "d.png", "notes.txt"):
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / name, format="PNG" if name == "notes.txt" else None)
    assert [os.path.basename(f) for f in predict.image_files([str(tmp_path)])] == ["a.tif", "b.TIFF", "c.pgm", "d.png"]


@tf_only
def test_the_saved_model_answers_as_the_run(run_and_images, capsys, tmp_path):
    """The file users deploy is the file that answers: the SavedModel's
    serving_default gives the run's top-1 labels on every image (the issue asks 95%)."""
    from keras_skipinit.serving import savedmodel
    run, images = run_and_images
    model, prep, _ = savedmodel.load_source(str(run))
    saved = savedmodel.export(model, str(tmp_path / "serving"), "digits", preprocessing=prep,
                           labels=run_dir.read_spec(str(run))["labels"])
    _, from_run = answers(capsys, f"--source={run}", images)
    status, from_saved = answers(capsys, f"--source={saved}", images)
    assert status == 0 and [line[:2] for line in from_saved] == [line[:2] for line in from_run]
    assert answers(capsys, f"--source={tmp_path / 'serving' / 'digits'}", images)[1] == from_saved  # newest version
    with pytest.raises(SystemExit):  # the export's --base_path: the model folder is named
        predict.main([f"--source={tmp_path / 'serving'}", str(images)])
    assert f"it holds exported models, e.g. --source={tmp_path / 'serving' / 'digits'}" in capsys.readouterr().err


@tf_only
def test_a_saved_model_names_every_class_not_only_its_served_top_k(run_and_images, capsys, tmp_path):
    """The export writes every class name (assets.extra/labels.txt): on one
    image, a SavedModel serving the top 1 answers --top_k=3 with three names
    (from the signature's top_k_labels alone the other two were indices)."""
    from keras_skipinit.serving import savedmodel
    run, images = run_and_images
    model, prep, _ = savedmodel.load_source(str(run))
    names = [f"digit {d}" for d in range(10)]
    saved = savedmodel.export(model, str(tmp_path / "serving"), "named", preprocessing=prep, labels=names, top_k=1)
    status, (line,) = answers(capsys, f"--source={saved}", images / "nested" / "7_0.png", "--top_k=3")
    assert status == 0 and all(label in names for label in line[1::2]) and len(line) == 7


def _imagenet_model_and_pictures(tmp_path):
    """An ImageNet-style model (224x224 RGB), saved as m.keras, and 0..2.png: large non-square pictures whose
    crop matters (a bright block off centre on a gradient)."""
    from keras_skipinit.applications import WideResNet

    model = WideResNet(10, 1, input_shape=(224, 224, 3), classes=5, normalization="skipinit", alpha_init="one", seed=0)
    model_files.save_model(model, str(tmp_path / "m.keras"), "imagenet")
    rows, cols = np.mgrid[:300, :260]
    for i in range(3):
        image = np.stack([(rows * (i + 1)) % 256, (cols * 2) % 256, np.full_like(rows, 40 * i)], -1)
        image[20 + 30 * i : 120 + 30 * i, 150:250] = 255
        Image.fromarray(image.astype(np.uint8)).save(tmp_path / f"{i}.png")
    return model


@tf_only
@pytest.mark.heavy
def test_litert_and_onnx_files_of_an_imagenet_model_answer_as_its_keras_file(tmp_path, capsys):
    """Its LiteRT and ONNX files take the 224 crop from the app: predict resizes to 256 and crops the centre
    224 as the run does (it resized straight to 224, another crop: other answers; issue 91.2)."""
    for module in ("ai_edge_litert", "onnxruntime", "tf2onnx"):
        require_module(module, 'pip install -e ".[export]"')
    from keras_skipinit.data import image_folder
    from keras_skipinit.serving import deploy
    model = _imagenet_model_and_pictures(tmp_path)
    pictures = [tmp_path / f"{i}.png" for i in range(3)]
    status, lines = answers(capsys, f"--source={tmp_path / 'm.keras'}", "--top_k=5", *pictures)
    assert status == 0
    labels_run, scores_run = [line[1::2] for line in lines], [[float(v) for v in line[2::2]] for line in lines]
    crops = np.stack([image_folder.decode(p, "RGB", 256, 224) for p in pictures])
    for fmt in ("litert", "onnx"):
        path = deploy.export_file(model, fmt, str(tmp_path / f"m{deploy.FORMATS[fmt].suffix}"), "imagenet",
                                  check_on=(crops, None))
        for record in (True, False):  # by the export's check record, and by size where a file comes alone
            if record:
                assert json.load(open(path + ".check.json"))["preprocessing"] == "imagenet"
            else:
                os.remove(path + ".check.json")
            status, lines = answers(capsys, f"--source={path}", "--top_k=5", *pictures)
            assert status == 0 and [line[1::2] for line in lines] == labels_run, (fmt, record)
            np.testing.assert_allclose([[float(v) for v in line[2::2]] for line in lines], scores_run, atol=2e-4)


@tf_only
@pytest.mark.heavy
def test_an_imagenet_saved_model_answers_as_its_keras_file_on_images_of_any_size(tmp_path, capsys):
    """A SavedModel that resizes and crops itself (ImageNet preprocessing) answers what its .keras file
    answers on the same large, non-square images: its crop is the run's, not a crop of predict's crop."""
    from keras_skipinit.serving import savedmodel
    model = _imagenet_model_and_pictures(tmp_path)
    saved = savedmodel.export(model, str(tmp_path / "serving"), "m", preprocessing="imagenet")
    got = {}
    for source in (tmp_path / "m.keras", saved):
        status, lines = answers(capsys, f"--source={source}", "--top_k=5", tmp_path / "0.png", tmp_path / "1.png",
                                tmp_path / "2.png")
        assert status == 0
        got[source] = [line[1::2] for line in lines], np.array([[float(v) for v in line[2::2]] for line in lines])
    (labels, scores), (labels_run, scores_run) = got[saved], got[tmp_path / "m.keras"]
    assert labels == labels_run
    np.testing.assert_allclose(scores, scores_run, atol=2e-5)


@tf_only
def test_litert_and_onnx_files_answer_as_the_run(run_and_images, capsys, tmp_path):
    from keras_skipinit.serving import deploy, savedmodel
    for module in ("ai_edge_litert", "onnxruntime", "tf2onnx"):
        require_module(module, 'pip install -e ".[export]"')
    run, images = run_and_images
    _, from_run = answers(capsys, f"--source={run}", images)
    model, prep, _ = savedmodel.load_source(str(run))
    names = [f"digit {label}" for label in run_dir.read_spec(str(run))["labels"]]  # not the class indices
    for fmt in ("litert", "onnx"):
        path = deploy.export_file(model, fmt, str(tmp_path / f"m{deploy.FORMATS[fmt].suffix}"), prep, labels=names)
        status, lines = answers(capsys, f"--source={path}", images)
        assert status == 0 and [line[:2] for line in lines] == [[f, f"digit {label}"] for f, label, _ in from_run], fmt


def test_an_onnx_file_answers_without_tensorflow(tmp_path, capsys):
    """An exported file runs in its own runtime, TensorFlow or not (CI's JAX
    stage has none): a hand-made ONNX graph of the exports' interface (uint8
    `images` -> `probabilities`) that ranks classes by how close an image's
    mean brightness is to 30, 128 and 220, with its labels file beside it."""
    require_module("onnx", 'pip install onnx onnxruntime (or -e ".[export]")')
    require_module("onnxruntime", 'pip install onnx onnxruntime (or -e ".[export]")')
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Cast", ["images"], ["x"], to=TensorProto.FLOAT),
             helper.make_node("ReduceMean", ["x"], ["m"], axes=[1, 2, 3], keepdims=0),
             helper.make_node("Unsqueeze", ["m", "one"], ["m1"]),
             helper.make_node("Sub", ["m1", "centres"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["d2"]),
             helper.make_node("Neg", ["d2"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1)]
    graph = helper.make_graph(
        nodes, "brightness", [helper.make_tensor_value_info("images", TensorProto.UINT8, [None, 8, 8, 1])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 3])],
        initializer=[helper.make_tensor("centres", TensorProto.FLOAT, [3], [30.0, 128.0, 220.0]),
                     helper.make_tensor("one", TensorProto.INT64, [1], [1])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    (tmp_path / "m.labels.txt").write_text("dark\nmid\nbright\n")
    for name, value in (("a", 10), ("b", 140), ("c", 250), ("d", 35)):
        Image.fromarray(np.full((8, 8), value, np.uint8)).save(tmp_path / f"{name}.png")
    status, lines = answers(capsys, f"--source={path}", *(tmp_path / f"{n}.png" for n in "abcd"))
    assert status == 0 and [line[1] for line in lines] == ["dark", "mid", "bright", "dark"]
