"""A run's models: .keras files with their preprocessing, labels and
settings inside (`keras_skipinit.json`), and a run's newest state (newest
readable checkpoint or model.keras), read by predict, export and --init_from."""

import contextlib
import json
import os
import re
import sys
import zipfile

import keras

from keras_skipinit import files
from keras_skipinit.data import preprocessing as preprocessing_lib
from keras_skipinit.training import distribute, run_dir
from keras_skipinit.training.checkpoint import Checkpoint

KERAS_METADATA = "keras_skipinit.json"  # member of a .keras zip


def save_model(model, path, preprocessing, settings=None, labels=None):
    """`model.save(path)` with the evaluation preprocessing and input shape
    inside the .keras zip (`keras_skipinit.json`), so export never guesses;
    `settings`: the model's (`finetune.SAME`), so --init_from can check them;
    `labels`: the class names, for predict and exports of the file alone."""
    preprocessing_lib.get(preprocessing)
    files.check_space(os.path.dirname(os.path.abspath(path)), model.weights, os.path.basename(path))
    with files.removed_on_failure(path + ".tmp.keras") as tmp:
        model.save(tmp)
        with zipfile.ZipFile(tmp, "a") as archive:
            extra = {k: v for k, v in (("settings", settings), ("labels", labels and list(labels))) if v}
            archive.writestr(KERAS_METADATA, json.dumps({"preprocessing": preprocessing, **extra}))
        os.replace(tmp, path)


def keras_metadata(path):
    """The keras_skipinit.json inside a .keras file, or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            if KERAS_METADATA in archive.namelist():
                return json.loads(archive.read(KERAS_METADATA))
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    return None


def recorded_labels(source, classes):
    """The class names train.py recorded for `source`, a model_dir (its
    model_spec.json) or a .keras file it saved, where they name `classes`
    classes; else None (an export then answers class indices)."""
    if os.path.isdir(source):
        labels = run_dir.read_spec(source).get("labels")
    else:
        labels = (keras_metadata(source) or {}).get("labels")
    return naming(labels, classes)


def naming(labels, classes):
    """`labels` as a list where they name `classes` classes, else None."""
    return list(labels) if labels and len(labels) == classes else None


def load_keras(path):
    """A .keras file (no optimizer); a corrupt or foreign file is one line."""
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not a .keras file (not a zip archive)")
    try:
        return keras.models.load_model(path, compile=False)
    except Exception as e:  # corrupt or foreign files: one line, not a traceback
        unknown = re.search(r"Could not locate class '([^']+)'", str(e))
        if unknown:
            from keras_skipinit import __version__
            raise ValueError(f"{path} uses the layer {unknown[1]}, which keras_skipinit {__version__} does not "
                             "define: load it where the package that defines it is imported") from None
        raise ValueError(f"cannot load {path} as a Keras model: {files.one_line(e)}") from None


def load_source(source, preprocessing=None):
    """(model, preprocessing, description) from a train.py model_dir (its
    newest state: newest checkpoint, else model.keras) or a .keras file,
    whose evaluation preprocessing train.py records inside it. A .keras file
    without that record needs `preprocessing`; it is never guessed. An
    explicit `preprocessing` overrides the recorded one (a note line says so).
    No TensorFlow: predict loads its Keras sources here on any backend."""
    if preprocessing is not None:
        preprocessing_lib.get(preprocessing)
    if os.path.isdir(source):
        if not os.path.exists(os.path.join(source, run_dir.SPEC)):
            raise ValueError(f"{source} is not a train.py model_dir (no {run_dir.SPEC}).")
        model, recorded, description = newest_model(source)
    elif os.path.exists(source):
        model, description = load_keras(source), source
        recorded = (keras_metadata(source) or {}).get("preprocessing")
        if recorded is None and preprocessing is None:
            raise ValueError(
                f"{source} does not record the preprocessing it was trained with (not saved by train.py); "
                f"pass --preprocessing={'|'.join(preprocessing_lib.NAMES)}"
            )
    else:
        raise ValueError(f"no such model file or model_dir: {source}")
    if preprocessing is not None and recorded is not None and preprocessing != recorded:
        print(f"Note: using preprocessing={preprocessing}; {source} was trained with {recorded}.", file=sys.stderr)
    return model, preprocessing or recorded, description


def newest_model(model_dir):
    """(model, preprocessing, description) of the newest readable state in a
    run's model_dir: its newest readable checkpoint (equal to model.keras
    when the run finished; newer when it was resumed and stopped), or
    model.keras where that is newer (the newest checkpoint unreadable: a
    fallback to an older one would lose epochs that model.keras holds)."""
    spec = run_dir.read_spec(model_dir)
    checkpoint = Checkpoint(os.path.join(model_dir, run_dir.CHECKPOINTS))
    path = os.path.join(model_dir, run_dir.MODEL)
    if checkpoint.all():
        try:
            model, ((epoch, step), restored) = _restored(spec["model"], checkpoint)
        except ValueError as e:
            if not os.path.exists(path):
                raise
            print(f"Warning: {e}; using {path}.", file=sys.stderr)
        else:
            finished = _model_keras_epochs(model_dir)
            if finished is None or (finished, 0) <= (epoch, step):
                where = f"epoch {epoch}" + (f", step {step}" if step else "")
                return model, spec["preprocessing"], f"checkpoint {restored} ({where})"
            print(f"Warning: {path} (epoch {finished}) is newer than the newest readable checkpoint; using it.",
                  file=sys.stderr)
    if os.path.exists(path):
        return load_keras(path), spec["preprocessing"], path
    raise ValueError(f"{model_dir} has neither a checkpoint nor {run_dir.MODEL} to export")


def _restored(model_args, checkpoint):
    """(model, ((epoch, step), path)): the recorded model holding the newest readable checkpoint.

    On JAX, building a model runs every initializer, each an XLA program compiled per weight shape
    (seconds apiece: 20-30 s of predict from a WRN-10-1 run folder on 2 cores), for values the checkpoint
    replaces (issue 89.5). Where the backend's `Distribution.build_uninitialized` says so, the model is
    built in a Keras StatelessScope that initializes nothing, the checkpoint assigns its variables, and
    only those it did not hold are initialized. TensorFlow's initializers are cheap eager ops, and its
    variables cannot be assigned before they exist: there the model is built as usual."""
    deferred = distribute.of_backend().build_uninitialized
    with keras.StatelessScope(initialize_variables=False) if deferred else contextlib.nullcontext():
        model = run_dir.recorded_model(model_args)
    try:
        return model, checkpoint.restore(model, with_optimizer=False)
    finally:
        if deferred:
            _initialize_unassigned()


def _initialize_unassigned():
    """Empties Keras' list of the variables a StatelessScope left uninitialized: those assigned since
    keep their value (their initializer dropped), the others are initialized now."""
    from keras.src.backend.common import global_state  # where Keras 3 keeps that list (no public name)

    pending = global_state.get_global_attribute("uninitialized_variables") or []
    global_state.set_global_attribute("uninitialized_variables", [])
    for variable in pending:
        if variable._value is None:
            variable._deferred_initialize()
        else:
            variable._initializer = None


def _model_keras_epochs(model_dir):
    """The epochs model.keras holds (results.json's, written after it), or
    None where the run has no model.keras and results.json of a finished run."""
    results_path = os.path.join(model_dir, run_dir.RESULTS)
    if not (os.path.exists(os.path.join(model_dir, run_dir.MODEL)) and os.path.exists(results_path)):
        return None
    results = files.read_json(results_path)
    return results.get("epochs_completed") if results.get("status") == "completed" else None

