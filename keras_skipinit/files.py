"""Files that are complete or not there: atomic writes, strict JSON, room
on the disk checked before a write, errors as one line."""

import contextlib
import errno
import json
import math
import os
import shutil
import tempfile
import threading

import numpy as np


def one_line(error):
    """An exception as one line of at most ~300 characters: its first line,
    the middle cut out where it is longer (its end often says why: a long
    path, then "No space left on device")."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {line if len(line) <= 300 else line[:150] + ' ... ' + line[-145:]}"


def read_json(path):
    """A JSON file of a run; a corrupt one is a one-line error naming it."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {one_line(e)}") from None


@contextlib.contextmanager
def removed_on_failure(path):
    """Removes `path` (a temporary file or directory) if the block fails:
    a full disk leaves nothing half-written behind."""
    try:
        yield path
    except BaseException:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.remove(path)
        raise


@contextlib.contextmanager
def new_folders(path):
    """os.makedirs(path) for the block; the folders it made are removed
    again, where still empty, when the block fails."""
    made, folder = [], os.path.abspath(path)
    while not os.path.exists(folder):
        made.append(folder)
        folder = os.path.dirname(folder)
    os.makedirs(path, exist_ok=True)
    try:
        yield path
    except BaseException:
        for folder in made:  # the deepest first
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise


def check_writable(path, flag=None, given=None):
    """A one-line ValueError, before any work, when the directory `path`
    (made if absent) cannot be written: it or its nearest existing ancestor
    is a file, or that ancestor is not writable (permissions, a read-only
    filesystem); the line names it as `flag`=path (as path where no flag;
    `flag`=`given` where the flag named a file in `path`: the user's words).
    Returns that ancestor (`path` itself where it exists)."""
    named = f"{flag}={path if given is None else given}" if flag else path
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        if existing != os.path.abspath(path):
            raise ValueError(f"{named} cannot be made: {existing} is a file")
        # where the flag named a file in `path`, say that its folder is the file
        raise ValueError(f"{named} is a file, not a directory" if given is None else
                         f"{named} cannot be written: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{named} cannot be written: {existing} is not writable "
                         "(permissions or a read-only filesystem)")
    try:  # what access() cannot tell (root passes it everywhere): /proc, a full disk, a filesystem taking no files
        handle, probe = tempfile.mkstemp(prefix=".keras_skipinit-probe-", dir=existing)
        os.close(handle)
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"{named} cannot be written: {existing} takes no new file ({one_line(e)})") from None
    return existing


def write_atomic(path, content):
    """`content` (str or bytes) written to a temporary file beside `path` and
    renamed: `path` is complete or as it was. The temporary file is the
    writer's own (process and thread in its name): two writers of one path
    at once each rename a whole file, the last one's stays."""
    data = content.encode() if isinstance(content, str) else content
    with removed_on_failure(f"{path}.{os.getpid()}-{threading.get_ident()}.tmp") as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


def check_space(directory, variables, what):
    """Raises OSError(ENOSPC) when `directory`'s filesystem has less room
    than `variables` take (plus a margin for the file's own structure):
    before h5py starts a file it then cannot finish (its half-open file
    crashes the process at exit)."""
    need = sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in variables) * 1.1 + (1 << 20)
    free = shutil.disk_usage(directory).free
    if free < need:
        raise OSError(errno.ENOSPC, f"No space left on device: {what} needs about {need / 2**20:.1f} MiB, "
                                    f"{free / 2**20:.1f} MiB free", directory)


def write_json(path, value):
    """Written to a temporary file and renamed: complete or not there."""
    write_atomic(path, json.dumps(value, indent=2, allow_nan=False))


def strict_json(value):
    """NaN and infinities as null (strict JSON has no NaN); numpy scalars as numbers."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_if_changed(path, content):
    """Writes `content` unless `path` holds it already: a report of
    unchanged runs leaves the checkout as it was (renamed into place)."""
    if os.path.exists(path):
        with open(path, "rb") as f:
            if f.read() == content:
                return
    write_atomic(path, content)
