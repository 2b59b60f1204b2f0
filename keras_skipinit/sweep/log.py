"""runs.jsonl: one line of JSON per finished run, appended by the sweep (the
one writer) as each result comes back."""

import json
import os
import sys

from keras_skipinit.sweep import protocol

LOG = "runs.jsonl"
_REQUIRED = ("method", "depth", "lr", "seed", "status")


def load(path, repair=False):
    """The runs recorded in `path`, keyed by their ident.

    A last line that does not parse as JSON is what a kill mid-write leaves:
    it is dropped with a warning (and, with `repair`, cut from the file so
    that the next result starts on a line of its own), and its run runs
    again. Any other bad line (one that does not parse before the last, or
    JSON that is not a sweep result) is a one-line ValueError naming the
    file and line; nothing is cut then."""
    runs = {}
    if not os.path.exists(path):
        return runs
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    offset = 0
    for number, raw in enumerate(lines, 1):
        if raw.strip():
            try:
                run = json.loads(raw)
            except ValueError as e:
                if number - 1 != last:
                    raise ValueError(f"{path}, line {number}: not a sweep result (not JSON: {e}); "
                                     "mend or delete that line") from None
                print(f"Warning: {path}, line {number} is incomplete (a sweep killed while writing it); "
                      "dropped, its run runs again.", file=sys.stderr)
                if repair:
                    with open(path, "r+b") as f:
                        f.truncate(offset)
                break
            missing = [k for k in _REQUIRED if not isinstance(run, dict) or k not in run]
            try:
                if missing:
                    raise KeyError(", ".join(missing))
                runs[protocol.run_ident(run)] = run
            except (KeyError, TypeError) as e:
                raise ValueError(f"{path}, line {number}: not a sweep result (missing {e}); "
                                 "mend or delete that line") from None
        offset += len(raw) + 1
    return runs


def append(path, run):
    """One whole line per result: a single write, flushed to disk before the
    sweep moves on (a kill leaves at most an incomplete last line)."""
    from keras_skipinit import run_dir

    with open(path, "ab") as f:
        f.write((json.dumps(run_dir.strict_json(run)) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())
