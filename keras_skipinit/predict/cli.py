"""What is in these images: `python -m keras_skipinit.predict --source=S IMAGE_OR_FOLDER ...`.

One line per image on stdout, `path<TAB>label<TAB>score` (top-1; `--top_k=K`
adds K-1 more label/score pairs, up to every class; a path or label holding a tab or a line
break, or starting with a double quote, is written as a JSON string, as git
quotes such paths), and with `--output=FILE.csv` the same as a CSV, written
atomically. `--source` answers in its own runtime, so the file
users deploy is the file that answers:

- a train.py model_dir (its newest state) or a `.keras` file train.py saved:
  Keras, on this process's backend, with the run's recorded preprocessing
  (another `.keras` file: `--preprocessing` names its own);
- a SavedModel version directory (`python -m export`), or its model folder
  (its newest version, as TF Serving serves): TensorFlow, its
  `serving_default` signature (its own in-graph preprocessing);
- a `.tflite` (LiteRT) or `.onnx` (ONNX Runtime) file from `--format=litert|onnx`.

Images (files, or folders searched recursively for JPEG, PNG, BMP, GIF and
WebP) are decoded by PIL into the model's channels and evaluation size: the
shorter side resized to the model's size and the centre square kept (for
ImageNet preprocessing: to 256, the centre 224), as `image_folder` reads a
training folder, a batch's files in threads (`image_folder.decode_all`).
Class names: the run's (a .keras file train.py saved carries them), a
SavedModel's `assets.extra/labels.txt`, or `<file>.labels.txt` beside an
exported file (else the class index); `--labels=FILE` names them instead. An
unreadable image is a line on stderr; the others are answered, and the exit
status is then 1. Exit 2: bad flags or a bad --source; 5: --output could
not be written; 130: Ctrl-C, 143: SIGTERM (the answers stream a batch at a time: those
given are kept, in --output too); 0: every image answered.
"""

import csv
import dataclasses
import io
import json
import os
import signal
import sys

import numpy as np

from keras_skipinit import files as files_lib  # What a folder is searched for: torchvision's ImageFolder suffixes and GIF (a training folder reads any file PIL reads).
from keras_skipinit.cli import parsing, startup
from keras_skipinit.data import image_folder, preprocessing as preprocessing_lib
from keras_skipinit.serving import publish, runtimes

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
NAME = "python -m keras_skipinit.predict"


def build_parser():
    """The command's flags (no Keras here: `parsing.preparse` answers --help and bad flags before it loads)."""
    parser = parsing.Command(NAME, "What is in these images, from a trained run or an exported "
                                 "file (one line per image: path, label, score).")
    parser.add_argument("images", nargs="+", help="image files, or folders searched recursively for them")
    parser.add_argument("--source", required=True, type=_existing, help="a train.py model_dir, a .keras file, a SavedModel version "
                        "directory or its model folder (newest version), a .tflite or a .onnx file")
    parser.add_argument("--top_k", type=parsing.positive_int, default=1, help="classes per image (default 1)")
    parser.add_argument("--labels", default=None, help="a file of class names, one a line (default: the names the "
                        "source records, else the class index)")
    parser.add_argument("--preprocessing", default=None, choices=preprocessing_lib.NAMES,
                        help="for a .keras file train.py did not save: the preprocessing it was trained with "
                        "(default: the one train.py recorded)")
    parser.add_argument("--output", default=None, help="also write the answers as a CSV file")
    parser.add_argument("--batch_size", type=parsing.positive_int, default=64, help="images per model call")
    return parser


def _existing(path):
    """--source: one that exists (said before Keras loads, not after; issue 89.5)."""
    if not os.path.exists(path):
        raise ValueError(f"{path}: no such model file or model_dir (a train.py model_dir, a .keras "
                                         "file, a SavedModel, a .tflite or a .onnx file)")
    return path


@dataclasses.dataclass
class Source:
    description: str
    shape: tuple  # (height, width, channels) of the uint8 images `probabilities` takes
    resize: object  # shorter side resized to this (a (height, width) pair: to cover it), then the centre kept
    labels: dict  # class index -> name, where known
    classes: int  # the model's class count
    probabilities: object  # (uint8 batch, their files) -> float32 (batch, classes)


def image_files(paths):
    """The image files `paths` name, folders searched recursively in sorted order."""
    found = []
    for path in paths:
        if os.path.isdir(path):
            found += image_folder.files_under(path, IMAGE_SUFFIXES)
        elif os.path.isfile(path):
            found.append(path)
        else:
            raise ValueError(f"{path}: no such image file or folder")
    if not found:
        raise ValueError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) in {', '.join(paths)}")
    return found


def _versions(folder):
    """A TF Serving model folder's version directories (whole-number names holding a saved_model.pb), oldest first."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted((n for n in names if n.isdigit() and os.path.exists(os.path.join(folder, n, "saved_model.pb"))), key=int)


def load(source, preprocessing=None):
    """The `Source` that --source names, in its own runtime; `preprocessing`
    (--preprocessing) for a Keras source only: an export preprocesses inside."""
    version = _version_dir(source)
    exported_file = source.endswith(tuple(r.suffix for r in runtimes.RUNTIMES.values()))
    if preprocessing is not None and (version or exported_file):
        raise ValueError(f"--preprocessing is for a train.py model_dir or a .keras file; --source={source} is an "
                         "export, which preprocesses its images inside")
    if version:
        return _saved_model(version)
    return _exported_file(source) if exported_file else _keras(source, preprocessing)


def _version_dir(source):
    """The SavedModel version directory `source` names (itself, or a model
    folder's newest version, as TF Serving serves), else None."""
    if not os.path.isdir(source):
        return None
    if os.path.exists(os.path.join(source, "saved_model.pb")):
        return source
    versions = _versions(source)
    return os.path.join(source, versions[-1]) if versions else None


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _keras(source, preprocessing=None):
    missing = startup.missing_backend()
    if missing:  # the core install has no backend: one line, as every bad input
        raise ValueError(missing)
    startup.load_keras(sys.stderr)  # stdout: the answers
    import keras

    from keras_skipinit.training import model_files, run_dir
    if os.path.isdir(source) and not os.path.exists(os.path.join(source, run_dir.SPEC)):
        models = sorted(n for n in os.listdir(source) if _versions(os.path.join(source, n)))  # an export's --base_path
        hint = f": it holds exported models, e.g. --source={os.path.join(source, models[0])}" if models else ""
        raise ValueError(f"--source={source} is neither a train.py model_dir (no {run_dir.SPEC}) nor a SavedModel "
                         f"version directory (no saved_model.pb) or its model folder{hint}")
    model, preprocessing, description = model_files.load_source(source, preprocessing)
    run_dir.check_classifier(model, f"--source={source}")
    labels = model_files.recorded_labels(source, model.output_shape[-1])
    prep = preprocessing_lib.get(preprocessing)
    softmax_inside = getattr(model.layers[-1], "activation", None) is keras.activations.softmax

    def probabilities(images, files):
        out = keras.ops.convert_to_numpy(model(prep.numpy(images), training=False)).astype(np.float32)
        return out if softmax_inside else _softmax(out)

    height, width, channels = model.input_shape[1:]
    if height is None or width is None:  # every image was called unreadable (issue 91.19)
        raise ValueError(f"--source={source} takes images of any size {tuple(model.input_shape[1:])}: predict feeds "
                         "a fixed size; save the model with its training images' input_shape")
    resize = preprocessing_lib.IMAGENET_RESIZE if prep.input_size else _cover(height, width)
    return Source(description, (height, width, channels), resize, dict(enumerate(labels or ())), model.output_shape[-1],
                  probabilities)


def _saved_model(path):
    missing = parsing.without_tensorflow(f"--source={path} (a SavedModel)")
    if missing:
        raise ValueError(missing)
    startup.load_keras(sys.stderr)  # TensorFlow's start-up lines filtered
    import tensorflow as tf

    serve = tf.saved_model.load(path).signatures["serving_default"]
    height, width, channels = serve.structured_input_signature[1]["images"].shape[1:]
    classes = serve.structured_outputs["probabilities"].shape[-1]
    labels = _names_beside(os.path.join(path, publish.SAVED_MODEL_LABELS), classes)  # older exports lack the file

    def probabilities(images, files):
        out = serve(images=tf.constant(images))
        if "top_k_labels" in out:  # the names of the classes it answered (all that an older export gives)
            for indices, names in zip(out["top_k_classes"].numpy(), out["top_k_labels"].numpy()):
                labels.update((int(c), n.decode()) for c, n in zip(indices, names))
        return out["probabilities"].numpy().astype(np.float32)

    if height is None:  # it resizes (shorter side to 256) and centre-crops 224 itself (ImageNet preprocessing):
        # give it the centre 256 square at 256, which its resize leaves as it is: its crop is then the run's
        # (a 224 crop given would be cropped again, the centre 87.5% enlarged)
        height = width = preprocessing_lib.IMAGENET_RESIZE
    return Source(f"SavedModel {path}", (height, width, channels), _cover(height, width), labels, classes,
                  probabilities)


def _cover(height, width):
    """What `image_folder.decode` resizes an image to for a model of
    height x width: the shorter side to the size of a square, else a cover
    of the rectangle (a model of non-square images; issue 91.19)."""
    return height if height == width else (height, width)


def _exported_file(path):
    """A .tflite or .onnx file in its runtime (no TensorFlow needed: `runtimes`)."""
    if not os.path.isfile(path):
        raise ValueError(f"--source={path}: no such file")
    loaded = runtimes.open_file(path)
    labels = _names_beside(publish.labels_path(path), loaded.classes)  # as the export wrote them
    height = loaded.shape[0]
    resize = preprocessing_lib.IMAGENET_RESIZE if _resizes_and_crops(path, height) else _cover(*loaded.shape[:2])
    return Source(path, loaded.shape, resize, labels, loaded.classes, lambda images, files: loaded.run(images))


def _resizes_and_crops(path, size):
    """Whether the file's images are ImageNet-style (the app resizes the
    shorter side to 256 and keeps the centre `size` square, as the run and
    its SavedModel do; issue 91.2: predict resized straight to `size`, another
    crop): as its export's check record says, else by size (above 64 px only
    ImageNet-style preprocessing is trained)."""
    try:
        with open(path + ".check.json") as f:
            recorded = json.load(f).get("preprocessing")
    except (OSError, ValueError, AttributeError):
        recorded = None
    try:
        return preprocessing_lib.get(recorded).input_size is not None
    except ValueError:  # an export from before the record named it, or none
        return size > preprocessing_lib.CIFAR_MAX_SIZE


def _names_beside(labels_file, classes):
    """{class index: name} from an export's labels file, checked against its
    class count; {} where it has none."""
    return dict(enumerate(runtimes.read_labels(labels_file, classes))) if os.path.isfile(labels_file) else {}


def predict(source, files, top_k=1, batch_size=64, progress=None):
    """(file, [(label, score), ...] or None where it could not be read), in
    the files' order, a batch at a time (answers stream as they come)."""
    height, width, channels = source.shape
    mode = "L" if channels == 1 else "RGB"
    for start in range(0, len(files), batch_size):
        chunk = files[start : start + batch_size]
        decoded = image_folder.decode_all(chunk, mode, source.resize, (height, width))
        readable = [(f, x) for f, x in zip(chunk, decoded) if x is not None and x.shape == (height, width, channels)]
        ranked = {}
        if readable:
            probabilities = source.probabilities(np.stack([x for _, x in readable]), [f for f, _ in readable])
            for (f, _), row in zip(readable, probabilities):
                top = np.argsort(-row, kind="stable")[:top_k]
                ranked[f] = [(int(c), float(row[c])) for c in top]
        if progress:
            progress(min(start + batch_size, len(files)), len(files))
        for f in chunk:
            yield f, ranked.get(f) and [(source.labels.get(c, str(c)), s) for c, s in ranked[f]]


def _field(text):
    """`text` as one field of a stdout line: as it is, or as a JSON string
    where it would split the line or read as one."""
    return json.dumps(text, ensure_ascii=False) if text.startswith('"') or any(c in text for c in "\t\n\r") else text


class _Progress:
    """"done/total images" on stderr's last line, cleared before an answer
    line is printed (on a terminal the answers ran into it: "64/100
    imagesmy_images/...", issue 89.6)."""

    def __init__(self):
        self.shown = False

    def __call__(self, done, total):
        print(f"\r{done}/{total} images", end="" if done < total else "\n", file=sys.stderr, flush=True)
        self.shown = done < total

    def clear(self):
        if self.shown:
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)
            self.shown = False


def parse(argv=None):
    """This command line's flags and images, refused in one line where bad."""
    return build_parser().parse_args(argv)


def main(argv=None):
    args = parse(argv)
    try:
        files = image_files(args.images)
        if args.output is not None:
            if os.path.isdir(args.output):
                raise ValueError(f"--output={args.output} is a folder, not a CSV file")
            files_lib.check_writable(os.path.dirname(os.path.abspath(args.output)), "--output", args.output)
        source = load(args.source, args.preprocessing)
        if args.labels is not None:  # a new dict: a SavedModel's answers no longer name classes into it
            source = dataclasses.replace(source, labels=dict(enumerate(runtimes.read_labels(args.labels, source.classes))))
    except ValueError as e:
        parsing.refuse(NAME, str(e))
    progress = _Progress() if sys.stderr.isatty() and len(files) > args.batch_size else None
    rows, unreadable, interrupted = [], 0, False
    # SIGTERM (a job's time limit, `kill`) as Ctrl-C: the answers so far go to --output too (issue 91.12)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        for file, ranked in predict(source, files, args.top_k, args.batch_size, progress):
            if progress:
                progress.clear()
            if ranked is None:
                unreadable += 1
                print(f"{NAME}: {file}: not a readable image (or not one PIL decodes, or 32-bit pixels)", file=sys.stderr)
                continue
            row = [file] + [value for label, score in ranked for value in (label, f"{score:.4f}")]
            rows.append(row)
            try:
                print("\t".join(map(_field, row)), flush=True)
            except BrokenPipeError:  # `| head`: the rest goes to --output only
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the answers so far stand, in --output too
        interrupted = 143 if isinstance(e, _Terminated) else 130
        print(("\n" if progress else "") + f"{NAME}: {'terminated' if interrupted == 143 else 'interrupted'} after "
              f"{len(rows) + unreadable} of {len(files)} images; their answers are above"
              f"{' and in --output' if args.output else ''}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.output is not None:
        text = io.StringIO()
        writer = csv.writer(text)
        pairs = max((len(row) // 2 for row in rows), default=args.top_k)  # --top_k, or the classes where fewer
        writer.writerow(["path"] + [f"{what}_{k + 1}" for k in range(pairs) for what in ("label", "score")])
        writer.writerows(rows)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
            files_lib.write_atomic(args.output, text.getvalue())
        except OSError as e:  # a full disk, a folder gone read-only: the answers above stand
            print(f"{NAME}: error: cannot write --output={args.output}: {files_lib.one_line(e)}", file=sys.stderr)
            return 5
    return interrupted or (1 if unreadable else 0)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, stopping predict as Ctrl-C does (exit 143)."""


def _terminated(signum, frame):
    raise _Terminated


def run():
    """Console entry point (keras-skipinit-predict; `python -m keras_skipinit.predict`).
    Keras loads only for a source that needs it (a .tflite or .onnx file does not)."""
    sys.exit(main())
