"""An export put in place as one unit: the file, its check record
(`<file>.check.json`) and its class names (`<stem>.labels.txt`, shared by
the files of one model: m.tflite and m.onnx), made in a staging folder
beside the target and moved in under a lock on the folder, the moves
written down first so that the next export finishes what a kill
interrupted. File operations only (no TensorFlow)."""

import fcntl
import os
import shutil
import tempfile

from keras_skipinit import files


def stem(path):
    return os.path.splitext(os.path.abspath(path))[0]


def labels_path(path):
    """The class names of the file at `path`: m.tflite -> m.labels.txt
    (shared by the files of one stem in one folder: m.tflite, m.onnx)."""
    return stem(path) + ".labels.txt"


SAVED_MODEL_LABELS = os.path.join("assets.extra", "labels.txt")  # a SavedModel version's class names, by class index


def labels_text(labels):
    """A labels file's text: one class name a line."""
    return "".join(f"{label}\n" for label in labels)


def write_labels(path, labels):
    with open(path, "w", encoding="utf-8") as f:
        f.write(labels_text(labels))


class Stage:
    """The staging folder of one export (`.export-*` beside --output), held
    by a lock for the export's life. `publish` writes its moves down
    (`JOURNAL`) before it makes them; an export killed in between leaves its
    folder, and the next export into that folder finishes the moves and
    removes it (`recover`), as it removes the folders of exports killed
    before they published."""

    PREFIX, LOCK, JOURNAL = ".export-", ".lock", "publish.json"

    def __init__(self, folder, suffixes):
        self.folder, self.suffixes = folder, suffixes

    def __enter__(self):
        self.path = tempfile.mkdtemp(prefix=self.PREFIX, dir=self.folder)
        self._lock = os.open(os.path.join(self.path, self.LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if not os.path.exists(os.path.join(self.path, self.JOURNAL)):  # else: killed mid-publish, `recover` ends it
            shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock)

    def publish(self, staged, path, overwrite):
        """Puts the staged file, its check record and its class names at
        `path`, under an exclusive lock on the folder: refuses what another
        export wrote meanwhile (without `overwrite`), then makes the moves
        listed in the journal: the old record removed first, the labels
        (a stale labels file of `path` removed), the file, its record last."""
        folder = os.open(self.folder, os.O_RDONLY)
        try:
            fcntl.flock(folder, fcntl.LOCK_EX)
            recover(self.folder)
            moves = _moves(staged, path, overwrite, self.suffixes)
            files.write_json(os.path.join(self.path, self.JOURNAL), moves)
            _apply(moves)
            os.remove(os.path.join(self.path, self.JOURNAL))
        finally:
            os.close(folder)  # releases the lock


def _moves(staged, path, overwrite, suffixes):
    """The steps that put a staged export at `path`: [source, target] renames
    and [None, target] removals, in order; refuses conflicts."""
    record, labels = (staged + ".check.json", path + ".check.json"), (labels_path(staged), labels_path(path))
    if os.path.exists(path) and not overwrite:
        raise ValueError(f"{path} exists (written by another export meanwhile?); pass --overwrite to replace it")
    check_labels(path, _read_text(labels[0]), overwrite, suffixes)
    steps = [[None, record[1]]]
    if os.path.exists(labels[0]):
        steps.append(list(labels))
    elif os.path.exists(labels[1]):
        steps.append([None, labels[1]])  # a stale labels file: `_check_labels` found it is `path`'s alone
    steps += [[staged, path], [record[0], record[1]]]
    return [[source, target] for source, target in steps if os.path.exists(target if source is None else source)]


def _apply(moves):
    """Makes the moves whose source is still there (a step already made is skipped: the moves can be
    made again after a kill)."""
    for source, target in moves:
        if source is None:
            if os.path.exists(target):
                os.remove(target)
        elif os.path.exists(source):
            os.replace(source, target)


def recover(folder):
    """Ends what killed exports left in `folder`: a staging folder whose
    export is gone (its lock is free) has its journal's moves finished, then
    is removed. Call it with the folder locked."""
    for name in os.listdir(folder):
        stage = os.path.join(folder, name)
        if not name.startswith(Stage.PREFIX) or not os.path.isdir(stage):
            continue
        try:
            fd = os.open(os.path.join(stage, Stage.LOCK), os.O_RDWR)
        except FileNotFoundError:
            continue  # being made this moment (its lock file comes next), or not an export's
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live export
            journal = os.path.join(stage, Stage.JOURNAL)
            if os.path.exists(journal):
                _apply(files.read_json(journal))
            shutil.rmtree(stage, ignore_errors=True)
        finally:
            os.close(fd)


def _read_text(path):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def check_labels(path, new, overwrite, suffixes):
    """The labels file of `path` (shared by the files of one stem: m.tflite,
    m.onnx; the other formats' `suffixes`) may take `new` (its text, or None
    for a model without names):
    the same names are no conflict; other names replace it with `overwrite`
    only; no names remove a labels file that only `path` uses."""
    target = labels_path(path)
    old = _read_text(target)
    if old is None or old == new:
        return
    siblings = [f for f in (stem(path) + suffix for suffix in suffixes) if f != os.path.abspath(path)
                and os.path.exists(f)]
    if siblings:  # --overwrite replaces this file, never a sibling's names: that would relabel it (issue 91.4)
        raise ValueError(f"{target} names the classes of {siblings[0]}, " + (
            "and this model has no class names: pass --labels, or export to another name" if new is None else
            f"other classes than this model's: export to another name, or remove {siblings[0]} first (--overwrite "
            f"replaces {path} only)"))
    if not overwrite:
        raise ValueError(f"{target} exists and names other classes; pass --overwrite to replace it, or export to "
                         "another name")
