"""What a training run leaves in its model_dir, written and read in one place.

    model_dir/
      model_spec.json      the run's flags, the model's constructor arguments,
                           the evaluation preprocessing
      checkpoint/ckpt-EEEEEE-SSSSSS/   weights (model and optimizer) and
                           state.json, at epoch E, step S; the newest two kept
                           (written and read by `checkpoint.Checkpoint`)
      history.csv, results.json, tensorboard/
      model.keras          the final model, with keras_skipinit.json inside
                           (preprocessing and input shape, for export)
      .lock                held (flock) by the process training the run

`training` writes these and `serving` reads them; neither imports the other.
A run's models (model.keras, its newest state) are read by `model_files`.
"""

import contextlib
import dataclasses
import fcntl
import os
import shutil
import socket
import sys

import keras

from keras_skipinit import applications, compat, files, spec
from keras_skipinit.training.checkpoint import Checkpoint

SPEC = "model_spec.json"
RESULTS = "results.json"
HISTORY = "history.csv"
MODEL = "model.keras"
CHECKPOINTS = "checkpoint"
LOCK = ".lock"


class ModelDirInUse(ValueError):
    """Another live process holds the model_dir's lock."""


@contextlib.contextmanager
def lock(model_dir):
    """Holds model_dir for one process: an exclusive flock on model_dir/.lock
    for the life of the `with` block. The kernel drops it when the process
    ends, killed or not, so no stale lock survives a crash. A second process
    gets a one-line ValueError naming the holder (pid, host, command). A
    model_dir this call made is removed again if the block fails leaving
    nothing in it but the lock file (a refused run leaves no trace)."""
    created = not os.path.exists(model_dir)
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, LOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        with os.fdopen(fd) as f:
            holder = f.read().strip() or "another process"
        raise ModelDirInUse(f"--model_dir={model_dir} is in use by {holder}; wait for it, or use another --model_dir") from None
    try:
        os.ftruncate(fd, 0)
        command = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))
        os.write(fd, f"process {os.getpid()} on {socket.gethostname()} ({command[:200]})\n".encode())
        yield
    except BaseException:
        if created and os.listdir(model_dir) == [LOCK]:
            os.remove(path)
            os.rmdir(model_dir)
        raise
    finally:
        os.close(fd)  # releases the flock


def holder(model_dir):
    """Who holds model_dir's lock now (the line `lock` wrote: process, host,
    command), or None where no process does; nothing is written."""
    try:
        fd = os.open(os.path.join(model_dir, LOCK), os.O_RDONLY)
    except OSError:
        return None
    with os.fdopen(fd) as f:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return f.read().strip() or "another process"
        fcntl.flock(fd, fcntl.LOCK_UN)
    return None


# Flags that may differ when a model_dir is reused: where things are read or
# written, how much is shown, and --epochs (raised to continue a run).
REUSABLE_FLAGS = spec.REUSABLE  # settings a continued run may change (`spec.setting(reusable=True)`)
_RUN_FILES = (SPEC, RESULTS, HISTORY, MODEL, CHECKPOINTS, "tensorboard")


def check_not_foreign(model_dir):
    """Refuses a non-empty directory that holds no run (before anything,
    even the lock file, is written into it)."""
    if not os.path.exists(os.path.join(model_dir, SPEC)) and os.path.isdir(model_dir) and (
        set(os.listdir(model_dir)) - {LOCK}
    ):
        raise ValueError(
            f"--model_dir={model_dir} is not empty and holds no keras_skipinit run ({SPEC}); "
            "use a new or empty directory"
        )


def check_model_dir(current, defaults, chief=True):
    """Refuses a model_dir that holds a different run. `current`: the run's
    training.Config as a dict; `defaults`: Config()'s (for specs written
    before a field existed). Returns the stored results of a run that is
    already complete with these flags, else None. With `restart`, the chief
    first deletes the run's files."""
    model_dir = current["model_dir"]
    spec_path = os.path.join(model_dir, SPEC)
    if current["restart"] and chief and os.path.exists(spec_path):
        for name in _RUN_FILES:
            path = os.path.join(model_dir, name)
            shutil.rmtree(path) if os.path.isdir(path) else (os.path.exists(path) and os.remove(path))
    if not os.path.exists(spec_path):
        check_not_foreign(model_dir)
        return None
    recorded = {**defaults, **read_spec(model_dir)["config"]}
    differ = [k for k in current if k not in REUSABLE_FLAGS and recorded.get(k) != current[k]]
    if differ:
        changes = ", ".join(f"--{k} ({recorded.get(k)!r} there, {current[k]!r} now)" for k in differ)
        raise ValueError(
            f"--model_dir={model_dir} holds a run with other flags: {changes}. Use a new --model_dir, "
            "or --restart to discard that run"
        )
    checkpoints = Checkpoint(os.path.join(model_dir, CHECKPOINTS)).all()
    trained = checkpoints[0][0] if checkpoints else 0
    if trained > current["epochs"]:
        raise ValueError(
            f"--epochs={current['epochs']} is below the {trained} epochs already trained in {model_dir}; "
            "raise --epochs, or --restart"
        )
    results_path = os.path.join(model_dir, RESULTS)
    if os.path.exists(results_path):
        results = _run_file(results_path)
        if results.get("status") == "diverged" or results.get("epochs_completed", 0) >= current["epochs"]:
            return {**results, "already_complete": True}
    return None


def _read_history(path):
    """(header, rows as dicts of strings) of a history.csv; ([], []) if none."""
    if not os.path.exists(path):
        return [], []
    with open(path) as f:
        lines = f.read().strip().splitlines()
    if not lines:
        return [], []
    header = lines[0].split(",")
    return header, [dict(zip(header, line.split(","))) for line in lines[1:]]


def write_history(model_dir, rows):
    """Writes history.csv whole (temporary file, then rename) from the run's
    rows (dicts, one per epoch), under one header: the union of their columns
    in order of appearance, blank where a row lacks one (or holds None). The rows travel in
    every checkpoint (`training`), so the file is rebuilt from the checkpoint
    a run resumes from: an epoch's row and its checkpoint commit together."""
    def cell(value):
        return "" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)

    header = list(dict.fromkeys(k for row in rows for k in row))
    lines = [",".join(header)] + [",".join(cell(row.get(k)) for k in header) for row in rows]
    files.write_atomic(os.path.join(model_dir, HISTORY), "\n".join(lines) + "\n")


def read_history(model_dir):
    """history.csv's rows as dicts of numbers (a blank cell left out): the
    rows of a run whose checkpoints predate the rows in their state."""
    header, rows = _read_history(os.path.join(model_dir, HISTORY))
    return [{k: (int(v) if k == "epoch" else float(v)) for k, v in row.items() if v} for row in rows]


def history_column(model_dir, column):
    """One column of a run's history.csv, a float per epoch (None where the
    epoch has no value; [] if the run has no history or no such column)."""
    header, rows = _read_history(os.path.join(model_dir, HISTORY))
    if column not in header:
        return []
    return [float(row[column]) if row.get(column) else None for row in rows]


# --- the model a run trains -------------------------------------------------------


def recorded_model(model_args):
    """The model a run's model_spec.json records (`applications.create_model`
    of its "model" record, in today's names: `compat.model_args`)."""
    try:
        return applications.create_model(**compat.model_args(model_args))
    except TypeError as e:  # an argument this version's constructors do not take
        raise ValueError(f"{SPEC} names a model this version of keras_skipinit cannot build ({e}); "
                         "was the run made by another version?") from None


def write_spec(model_dir, config, model_args, dataset, backend):
    """What export needs to rebuild the model from a checkpoint and to put the
    evaluation preprocessing in the serving graph; the flags (`config`, a
    dict), to refuse a model_dir reused with other flags; and every backend
    the run has used, in order (a run resumed on another backend continues
    exactly), which it returns."""
    path = os.path.join(model_dir, SPEC)
    backends = read_spec(model_dir).get("backends", []) if os.path.exists(path) else []
    if not backends or backends[-1] != backend:
        backends.append(backend)
    files.write_json(path, {
        "config": config,
        "model": model_args,
        "preprocessing": dataset.preprocessing,
        "labels": list(dataset.label_names),  # class names, for exports (serving's top_k_labels, labels.txt)
        "data": _data_record(dataset),  # what a resumed run checks it still trains on (continued_data)
        # A folder --dataset as an absolute path: export run elsewhere finds it (issue 91.21); --dataset stays as given
        **({"dataset_folder": dataset.folder} if dataset.folder else {}),
        "backends": backends,
    })
    return backends


def _data_record(dataset):
    return {"num_train": dataset.num_train, "num_test": dataset.num_test}


def continued_data(model_dir, dataset, checkpoints, check=True):
    """The data a run continues on, where model_dir holds one that a start
    continues (a spec, and `checkpoints`: `Checkpoint.all()`'s), read from its spec once:

    - `check`: refuses data other than the run started on: a folder given or
      relieved of images or classes since, a TFDS data_dir prepared otherwise.
      Compared: the example counts and the class names (an image replaced by
      another is not seen; a run recorded before its data was is not checked).
    - `dataset` with the preprocessing the run recorded: a folder's mean_std
      statistics are computed from its training images at each start, and an
      image replaced since gave a continuation other statistics than its first
      epochs (issue 91.8).

    Returns (dataset, a note where the preprocessing differs, else None)."""
    if not (checkpoints and os.path.exists(os.path.join(model_dir, SPEC))):
        return dataset, None
    recorded = read_spec(model_dir)
    then, now = recorded.get("data"), _data_record(dataset)
    changes = [] if then is None or not check else [
        f"{then[k]} {what} then, {now[k]} now" for k, what in (("num_train", "training examples"),
                                                               ("num_test", "evaluation examples"))
        if then.get(k) != now[k]]
    if then is not None and check and recorded.get("labels") is not None and \
            list(recorded["labels"]) != list(dataset.label_names):
        changes.append(f"classes {', '.join(map(str, recorded['labels']))} then, "
                       f"{', '.join(map(str, dataset.label_names))} now")
    if changes:
        raise ValueError(f"--dataset={dataset.name} is not the data the run in {model_dir} started on "
                         f"({'; '.join(changes)}): resuming would train on other images. Use a new --model_dir, or "
                         "--restart to discard that run")
    preprocessing = recorded.get("preprocessing")
    if preprocessing is None or preprocessing == dataset.preprocessing:
        return dataset, None
    note = (f"Note: the run in {model_dir} continues with the preprocessing it started with, {preprocessing}; its "
            f"images give {dataset.preprocessing} now")
    return dataclasses.replace(dataset, preprocessing=preprocessing), note


def check_classifier(model, source):
    """One line where `model` does not answer class scores ([batch, classes]
    from a Dense classifier, its softmax after it or inside): a backbone
    (include_top=False, with or without pooling, pyramid_outputs=True) gives
    features, and a softmax over pooled features answered "class 40"
    (issue 91.10)."""
    outputs = model.outputs if isinstance(model.outputs, (list, tuple)) else [model.outputs]
    shapes = ", ".join(str(tuple(o.shape)) for o in outputs)
    last = [layer for layer in model.layers if not isinstance(layer, (keras.layers.Activation, keras.layers.Softmax))]
    if len(outputs) != 1 or len(outputs[0].shape) != 2 or not last or not isinstance(last[-1], keras.layers.Dense):
        made = f" by its {type(last[-1]).__name__} layer {last[-1].name!r}" if last and len(outputs) == 1 else ""
        raise ValueError(f"{source} outputs {shapes}{made}: features, not class scores; it needs a classifier head "
                         "(a model built with include_top=False or pyramid_outputs=True has none)")


def results_record(config, dataset, metrics, diverged, **figures):
    """results.json's record: the status, the metrics named by split (eval_*
    on the evaluation split; test_* as well only when that is the test set),
    training's `figures`, the data's sizes and the flags (`config`, a dict);
    strict JSON."""
    return files.strict_json({
        "status": "diverged" if diverged else "completed",
        "diverged_at": diverged,
        **{f"{prefix}_{name}": metrics.get(name)
           for prefix in ("eval", "test")[: 2 if dataset.eval_split == "test" else 1]
           for name in ("top1", "top5", "cross_entropy")},
        **figures,
        "num_train": dataset.num_train,
        "num_test": dataset.num_test,
        "eval_split": dataset.eval_split,  # 'validation': eval_* are on the held-out training examples
        "config": config,
    })


def schedule_segments(rows):
    """The schedules a run's epochs were trained on, as segments
    [{"first_epoch", "last_epoch", "schedule_epochs"}]: one for a run
    trained straight; more for a run continued with a higher --epochs, whose
    earlier epochs keep the shorter schedule. None where a row predates the
    record (history from an earlier version)."""
    segments = []
    for row in rows:
        if "schedule_epochs" not in row:
            return None
        if segments and segments[-1]["schedule_epochs"] == row["schedule_epochs"]:
            segments[-1]["last_epoch"] = row["epoch"]
        else:
            segments.append({"first_epoch": row["epoch"], "last_epoch": row["epoch"],
                             "schedule_epochs": row["schedule_epochs"]})
    return segments


def _run_file(path):
    """A run's JSON file; one that cannot be read (empty, cut by a full disk) is a one-line error saying
    what to do."""
    try:
        return files.read_json(path)
    except ValueError as e:
        raise ValueError(f"{e}; the run's --model_dir is damaged: --restart discards it, or use a new "
                         "--model_dir") from None


def read_spec(model_dir):
    path = os.path.join(model_dir, SPEC)
    spec = _run_file(path)
    if not isinstance(spec, dict) or not {"config", "model", "preprocessing"} <= set(spec):
        raise ValueError(f"{path} is not a model_spec.json of this version of keras_skipinit")
    return spec
