"""The exported files' runtimes, without TensorFlow or Keras: LiteRT for a
`.tflite`, ONNX Runtime for an `.onnx`.

`predict` answers with them (a JAX-only install too: the files are made with
TensorFlow, they run without it) and `deploy` checks the files it writes
with them. A new runtime is one `RUNTIMES` entry.
"""

import dataclasses
import os

import numpy as np

from keras_skipinit.cli import startup  # LiteRT's C++ note on every interpreter (not a warning; a user's own Python shows it: README).

NOISE = ("INFO: Created TensorFlow Lite XNNPACK delegate",)


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A file opened in its runtime: `run(uint8 images [batch, H, W, C])`
    -> probabilities [batch, classes]; `shape` (H, W, C); `classes`."""

    run: object
    shape: tuple
    classes: int


def _litert(path):
    """LiteRT's signature runner: the XNNPACK CPU delegate, every core."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=path, num_threads=os.cpu_count()).get_signature_runner()
    shape = tuple(int(d) for d in runner.get_input_details()["images"]["shape"][1:])
    classes = int(runner.get_output_details()["probabilities"]["shape"][-1])
    return Loaded(lambda images: runner(images=images)["probabilities"], shape, classes)


def _onnx(path):
    """ONNX Runtime's session: the CPU provider."""
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    shape = tuple(int(d) for d in session.get_inputs()[0].shape[1:])
    classes = int(session.get_outputs()[0].shape[-1])
    return Loaded(lambda images: session.run(["probabilities"], {name: images})[0], shape, classes)


@dataclasses.dataclass(frozen=True)
class Runtime:
    """suffix: the file's; modules: what runs it (each module's package: '_' -> '-'); open(path) -> `Loaded`."""

    suffix: str
    modules: tuple
    open: object


RUNTIMES = {"litert": Runtime(".tflite", ("ai_edge_litert",), _litert),
            "onnx": Runtime(".onnx", ("onnxruntime",), _onnx)}


def format_of(path):
    """The `RUNTIMES` name of a file, by its suffix."""
    for name, runtime in RUNTIMES.items():
        if path.endswith(runtime.suffix):
            return name
    raise ValueError(f"{path} is none of the export formats ({', '.join(r.suffix for r in RUNTIMES.values())})")


def missing(modules):
    """One line naming what to install where one of `modules` is not, else None."""
    absent = [name for name in modules if not startup.installed(name)]
    return f"needs {', '.join(absent)}: pip install -e \".[export]\"" if absent else None


def open_file(path):
    """`path` (.tflite or .onnx) in its runtime, as `Loaded` (float32
    probabilities); a one-line ValueError where the runtime is not installed.
    Its C++ note is kept out where it comes: LiteRT makes its XNNPACK
    delegate, and says so, at the first call only (later calls unfiltered)."""
    fmt = format_of(path)
    absent = missing(RUNTIMES[fmt].modules)
    if absent:
        raise ValueError(f"{path}: {fmt} {absent}")
    with startup.filtered_stderr(lambda line: line.startswith(NOISE)):
        loaded = RUNTIMES[fmt].open(path)
    first = [True]

    def run(images):
        if not first:
            return np.asarray(loaded.run(images), np.float32)
        with startup.filtered_stderr(lambda line: line.startswith(NOISE)):
            probabilities = np.asarray(loaded.run(images), np.float32)
        first.clear()
        return probabilities

    return dataclasses.replace(loaded, run=run)


def read_labels(path, classes):
    """Class names, one a line (UTF-8 text); as many as the model has classes."""
    if not os.path.isfile(path):
        raise ValueError(f"--labels={path}: {'a directory' if os.path.isdir(path) else 'no such file'}, "
                         "not a file of class names")
    try:
        with open(path, encoding="utf-8") as f:
            labels = [line.rstrip("\n") for line in f if line.strip()]
    except UnicodeDecodeError:
        raise ValueError(f"--labels={path} is not a text file of class names (not UTF-8)") from None
    if len(labels) != classes:
        raise ValueError(f"{path} names {len(labels)} classes, the model has {classes}")
    return labels
