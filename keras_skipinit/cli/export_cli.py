"""Command line of `python -m export` and keras-skipinit-export. It runs on
TensorFlow (SavedModels are TensorFlow graphs): started under another Keras
backend, it runs itself again with KERAS_BACKEND=tensorflow.

Exit status: 0 written and checked, 2 bad flags or input (nothing written),
4 a written file failed its check against the Keras model (kept beside
--output as <name>.check_failed.<suffix> with its .check.json, for
inspection; --output and anything the user had are left as they were),
5 the export could not be written (a full disk, a read-only filesystem:
one line, nothing half-made left)."""

import os
import sys

from absl import logging

from keras_skipinit import spec
from keras_skipinit.cli import parsing
from keras_skipinit.data import preprocessing as preprocessing_lib
from keras_skipinit.serving import publish

USAGE = """Export a trained model: a TensorFlow Serving SavedModel, or one LiteRT or ONNX file.

  keras-skipinit-export --source=runs/default --base_path=exports/serving --model_name=skipinit
  tensorflow_model_server --rest_api_port=8501 --model_name=skipinit \\
      --model_base_path=$PWD/exports/serving/skipinit
  keras-skipinit-export --source=runs/default --format=litert --output=exports/skipinit.tflite
  keras-skipinit-export --source=runs/default --format=litert --quantize=int8 --output=exports/skipinit_int8.tflite
  keras-skipinit-export --source=runs/default --format=onnx --output=exports/skipinit.onnx

LiteRT and ONNX files take uint8 images [batch, H, W, C] and return
probabilities [batch, classes]; each is run in its runtime on real images of
the run's evaluation split (class-balanced) and compared with the Keras
model before it is put at --output (<file>.check.json; class names in
<name>.labels.txt beside it).

--source is a train.py model_dir (its newest state: the newest checkpoint,
else model.keras) or a .keras file (train.py records the preprocessing
inside; for other files pass --preprocessing). Writes
<base_path>/<model_name>/<version>/ with the next free version unless
--version is given; an existing version is never replaced without --overwrite.
`python -m export` in a checkout and the installed `keras-skipinit-export`
are the same command.
"""

def _existing(path):
    """--source: one that exists (said before Keras loads, not 8 s after; issue 89.5)."""
    if not os.path.exists(path):
        raise ValueError("no such model file or model_dir (a train.py model_dir or a .keras file)")
    return path


COMMAND = parsing.Command("export", USAGE, as_invoked=True)
_flag = COMMAND.add_argument
_flag("--source", type=_existing, required=True, help="A train.py model_dir or a .keras file.")
_flag("--format", default="saved_model", choices=["saved_model", *spec.EXPORT_QUANTIZATIONS],
      help="saved_model: TF Serving; litert: one .tflite (built-in ops only, ai_edge_litert); onnx: one .onnx "
      "(onnxruntime). litert and onnx need pip install -e \".[export]\".")
_flag("--base_path", help="--format=saved_model: TF Serving model base path (parent of <model_name>/).")
_flag("--output", help="--format=litert|onnx: the file to write (.tflite / .onnx).")
_flag("--quantize", choices=sorted({q for qs in spec.EXPORT_QUANTIZATIONS.values() for q in qs}),
      help="--format=litert: float16 weights, or full-integer int8; --format=onnx: int8 (ONNX Runtime's static "
      "quantization). int8 is calibrated on --calibration_images training images of the run's dataset "
      "(the input stays uint8 images). The check then reports accuracy.")
_flag("--check_images", type=parsing.positive_int, default=500,
      help="Images of the run's evaluation split the written file is checked on.")
_flag("--calibration_images", type=parsing.positive_int, default=200, help="Training images that calibrate --quantize=int8.")
_flag("--dataset", help="Dataset of the check and calibration images (default: the run's; required for "
      "a .keras file from elsewhere with --format=litert|onnx).")
_flag("--labels", help="A file of class names, one a line (default: the names train.py recorded).")
_flag("--model_name", help="Served model name, one path component (default: the source's name).")
_flag("--version", type=parsing.positive_int, help="Version number (default: the next free one).")
_flag("--overwrite", action="boolean", default=False, help="Replace an existing version (or --output file).")
_flag("--preprocessing", choices=list(preprocessing_lib.NAMES),
      help="In-graph preprocessing (default: the one recorded by train.py; required for other .keras files).")
_flag("--top_k", type=parsing.positive_int, default=5, help="Classes returned per image.")
_flag("--fold", action="boolean", default=True, help="Fold BN/SkipInit/Fixup affine layers into the convs (exact).")
F = COMMAND.flag_values  # the last parse's values (and which flags it was given: F[name].present)


def parse(argv=None):
    return COMMAND.parse_args(argv)


def main(args):
    logging.set_verbosity(logging.WARNING)
    from keras_skipinit.serving import deploy, savedmodel
    try:
        _check_flags()
        if F.format != "saved_model":
            deploy.require(F.format)
            deploy.check_output(F.output, F.format, F.overwrite)
        else:
            name = F.model_name if F["model_name"].present else savedmodel.model_name_for(F.source)
            savedmodel.check_target(F.base_path, name)
        model, preprocessing, source = savedmodel.load_source(F.source, F.preprocessing)
        labels = _labels(model)
        if F.format == "saved_model":
            print(f"Writing the SavedModel of {source} (10-20 s)...", flush=True)
            path = savedmodel.export(model, F.base_path, name, version=F.version, overwrite=F.overwrite,
                                  preprocessing=preprocessing, top_k=F.top_k, fold_layers=F.fold, labels=labels)
        else:
            return _export_file(model, preprocessing, source, labels)
    except ValueError as e:
        print(f"{parsing.program('export')}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a filesystem gone read-only: nothing half-made is left
        print(f"{parsing.program('export')}: error: {e}; nothing was written", file=sys.stderr)
        return 5
    print(f"Exported {source} to {path} (signatures: serving_default, predict_image_bytes; {preprocessing}).")
    print(f"Inspect: saved_model_cli show --all --dir {path}")
    return 0


# Flags that do something for one kind of export only: given with the other, they are refused, not ignored.
_SAVED_MODEL_ONLY = ("base_path", "model_name", "version", "top_k", "fold")
_FILE_ONLY = ("output", "quantize", "check_images", "calibration_images", "dataset")


def _check_flags():
    """Flags that belong to one format only, given with another: one line."""
    from keras_skipinit.serving import deploy
    saved_model = F.format == "saved_model"
    given = [name for name in (_FILE_ONLY if saved_model else _SAVED_MODEL_ONLY) if F[name].present]
    if given:
        kind = f"--format={'|'.join(deploy.FORMATS)}" if saved_model else "--format=saved_model"
        raise ValueError(f"{', '.join('--' + n for n in given)}: for {kind} only, not --format={F.format}")
    if saved_model and F.base_path is None:
        raise ValueError("--format=saved_model needs --base_path")
    if not saved_model and F.output is None:
        raise ValueError(f"--format={F.format} needs --output=FILE{deploy.FORMATS[F.format].suffix}")
    if F["calibration_images"].present and F.quantize != "int8":
        raise ValueError("--calibration_images calibrates --quantize=int8 only")


def _run_of(source):
    """The train.py model_dir behind --source: the source itself, or the
    folder of a run's own model.keras (its model_spec.json beside it); None
    for a .keras file from elsewhere."""
    from keras_skipinit.training import run_dir
    if os.path.isdir(source):
        return source
    folder = os.path.dirname(os.path.abspath(source))
    if os.path.basename(source) == run_dir.MODEL and os.path.exists(os.path.join(folder, run_dir.SPEC)):
        return folder
    return None


def _labels(model):
    from keras_skipinit.serving import runtimes
    from keras_skipinit.training import model_files
    classes = model.output_shape[-1]
    if F.labels is not None:
        return runtimes.read_labels(F.labels, classes)
    return model_files.recorded_labels(F.source, classes)


def _data():
    """The dataset of the check and calibration images: --dataset, else the run's."""
    from keras_skipinit.data import sources as data_lib
    from keras_skipinit.training import run_dir
    if F.dataset is not None:
        is_dir = os.path.isdir(os.path.expanduser(F.dataset))
        if data_lib.image_folder.looks_like_folder(F.dataset) and (
                not is_dir or data_lib.image_folder.evaluated_split(F.dataset) is None):
            what = "has no" if is_dir else "is no folder with a"
            raise ValueError(f"--dataset={F.dataset} {what} test/ (or validation/, val/) folder of the images an export "
                             "is checked on: name a folder with one, or leave --dataset out to check on the run's own")
        return data_lib.load(F.dataset)
    if _run_of(F.source) is None:
        raise ValueError(f"{F.source} is a .keras file from outside a train.py run: pass --dataset=NAME for the "
                         "images its export is checked on")
    recorded = run_dir.read_spec(_run_of(F.source))
    config = {**recorded["config"], "train_examples": None, "preprocessing": None}
    if recorded.get("dataset_folder"):  # a folder given by a relative path: where it was, from anywhere
        config["dataset"] = recorded["dataset_folder"]
    elif os.sep in config["dataset"] and not os.path.exists(os.path.expanduser(config["dataset"])):
        raise ValueError(f"the run trained on --dataset={config['dataset']}, a folder named relative to where train.py "
                         "ran (a run from before its folder was recorded whole): pass --dataset=<that folder> from here")
    return data_lib.load_for(config)


def _export_file(model, preprocessing, source, labels):
    from keras_skipinit.data import pipelines
    from keras_skipinit.serving import deploy
    print(f"Converting {source} to {F.format}{' ' + F.quantize if F.quantize else ''} and checking the file on "
          f"up to {F.check_images} test images in its runtime (10-30 s)...", flush=True)
    dataset = _data()
    if dataset.num_classes != model.output_shape[-1]:
        raise ValueError(f"{dataset.name} has {dataset.num_classes} classes, the model {model.output_shape[-1]}: "
                         "pass --dataset with the model's classes for the check images")
    images, answers = pipelines.sample_images(dataset, "eval", F.check_images, preprocessing)
    deploy.check_images_fit(model, images, dataset.name)
    calibration = None
    if F.quantize == "int8":
        calibration, _ = pipelines.sample_images(dataset, "train", F.calibration_images, preprocessing)
    try:
        path = deploy.export_file(model, F.format, F.output, preprocessing, quantize=F.quantize,
                                  calibration=calibration, labels=labels, overwrite=F.overwrite,
                                  check_on=(images, answers))
    except deploy.CheckFailed as e:
        print(f"{parsing.program('export')}: check failed: {e}", file=sys.stderr)
        return 4
    report = deploy.read_check(path)
    accuracy = (f"; top-1 {100 * report['file_top1']:.2f}% (Keras float {100 * report['keras_top1']:.2f}%)"
                if "file_top1" in report else "")
    print(f"Exported {source} to {path} ({report['bytes']:,} bytes, {F.quantize or 'float32'}). Checked on "
          f"{report['images']} {dataset.name} {dataset.eval_split} images: max |p - p_keras| "
          f"{report['max_abs_diff']:.2e}, top-1 agreement {100 * report['top1_agreement']:.2f}%{accuracy}.")
    if labels:
        print(f"Class names: {publish.labels_path(path)}")
    return 0


def run():
    """Console entry point (keras-skipinit-export); `python -m export` calls it too."""
    from keras_skipinit.cli import startup
    args = parsing.start(parsing.program("export"), f"{__name__}:parse", keras=False)
    parsing.exit_without_tensorflow("export")  # SavedModels are TensorFlow graphs
    if startup.requested_backend() != "tensorflow":  # before Keras loads (it said so twice, on each backend)
        parsing.rerun_on_tensorflow()
    startup.load_keras()
    import keras

    if keras.backend.backend() != "tensorflow":  # a backend chosen otherwise than KERAS_BACKEND and keras.json
        parsing.rerun_on_tensorflow()
    sys.exit(main(args))
