"""runs.jsonl: one line of JSON per finished run, appended by the sweep (the
one writer) as each result comes back; `read_jsonl` and `append` also keep
the quantization study's log. `read_summary`: another sweep's summary.json."""

import json
import math
import os
import sys

from keras_skipinit import files
from keras_skipinit.sweep import protocol

LOG = "runs.jsonl"
NUMBER, OPTIONAL_NUMBER = (int, float), (int, float, type(None))
# What every sweep result holds, and of which type (JSON's: a bool is not a number here).
_REQUIRED = {"method": str, "depth": int, "lr": NUMBER, "seed": int, "status": str, "test_top1": OPTIONAL_NUMBER}


def _wrong_types(record, required):
    return [f"{key} is {record[key]!r}" for key, kinds in required.items()
            if kinds is not None and (not isinstance(record[key], kinds) or isinstance(record[key], bool))]


STATUSES = ("completed", "diverged")  # what a recorded run ended as (an interrupted one is not recorded)


def _impossible(record):
    """What a sweep result holds that no run gives (an edited line: a rate of
    0, below 0 or infinite, an unknown status, an accuracy outside 0..1),
    which the report's logarithms and intervals met as tracebacks or took as
    results (issue 91.16); None where nothing."""
    lr, top1, entropy = record["lr"], record["test_top1"], record.get("train_cross_entropy")
    if not (math.isfinite(lr) and 2.0**-protocol.MAX_LOG2_LR <= lr <= 2.0**protocol.MAX_LOG2_LR):
        return f"lr is {lr!r}: a rate from 2^-{protocol.MAX_LOG2_LR} to 2^{protocol.MAX_LOG2_LR}"
    if record["status"] not in STATUSES:
        return f"status is {record['status']!r}: one of {', '.join(STATUSES)}"
    if top1 is not None and not (math.isfinite(top1) and 0 <= top1 <= 1):
        return f"test_top1 is {top1!r}: an accuracy from 0 to 1"
    if isinstance(entropy, (int, float)) and not isinstance(entropy, bool) and math.isfinite(entropy) and entropy < 0:
        return f"train_cross_entropy is {entropy!r}: a cross-entropy is >= 0"
    return None


def read_jsonl(path, required, what, repair=False, impossible=None):
    """The records of a JSON-lines log, each a dict with the keys of
    `required` ({key: type or tuple of types, or None for any}; `what` names
    one in messages).

    A last line that does not parse as JSON is what a kill mid-write leaves:
    it is dropped with a warning (and, with `repair`, cut from the file so
    that the next record starts on a line of its own), and its work is done
    again. Any other bad line (one that does not parse before the last, or
    JSON without the required keys) is a one-line ValueError naming the file
    and line; nothing is cut then."""
    records = []
    if not os.path.exists(path):
        return records
    if not os.path.isfile(path):
        raise ValueError(f"{path} is not a file")
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    offset = 0
    for number, raw in enumerate(lines, 1):
        if raw.strip():
            try:
                record = json.loads(raw)
            except ValueError as e:
                if number - 1 != last:
                    raise ValueError(f"{path}, line {number}: not {what} (not JSON: {e}); "
                                     "mend or delete that line") from None
                print(f"Warning: {path}, line {number} is incomplete (killed while writing it); "
                      "dropped, its work is done again.", file=sys.stderr)
                if repair:
                    with open(path, "r+b") as f:
                        f.truncate(offset)
                break
            missing = [k for k in required if not isinstance(record, dict) or k not in record]
            wrong = [] if missing else _wrong_types(record, required)
            odd = None if missing or wrong or impossible is None else impossible(record)
            if missing or wrong or odd:
                why = f"missing {', '.join(missing)}" if missing else ", ".join(wrong) or odd
                raise ValueError(f"{path}, line {number}: not {what} ({why}); mend or delete that line")
            records.append(record)
        offset += len(raw) + 1
    return records


_RESULT = ("status", "test_top1", "train_cross_entropy")  # two records of one run must agree on these


def load(path, repair=False):
    """The runs recorded in `path` (runs.jsonl, read by `read_jsonl`), keyed
    by their ident; a dropped incomplete last line's run runs again. A run
    recorded twice (lines copied from another log) must have one result:
    two that differ are a one-line ValueError naming the run, not a silent
    choice of the later one."""
    runs = {}
    for run in read_jsonl(path, _REQUIRED, "a sweep result", repair, _impossible):
        ident = protocol.run_ident(run)
        if ident in runs and [runs[ident].get(k) for k in _RESULT] != [run.get(k) for k in _RESULT]:
            method, depth, _, lr, seed, phase = ident
            differ = ", ".join(f"{k} {runs[ident].get(k)!r} then {run.get(k)!r}" for k in _RESULT
                               if runs[ident].get(k) != run.get(k))
            raise ValueError(f"{path} records run {method} depth {depth} lr {protocol.lr_label(lr)} seed {seed} "
                             f"({phase}) twice with different results ({differ}): delete the wrong line")
        runs[ident] = run
    return runs


def append(path, record):
    """One whole line per record: a single write, flushed to disk before the
    writer moves on (a kill leaves at most an incomplete last line). It
    starts on a line of its own, also after a file whose last record has no
    newline (edited by hand): glued onto it, both would read as one torn line."""
    with open(path, "a+b") as f:
        f.seek(0, os.SEEK_END)
        fresh = f.tell() == 0 or (f.seek(-1, os.SEEK_END), f.read(1))[1] == b"\n"
        f.write((("" if fresh else "\n") + json.dumps(files.strict_json(record)) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


def read_summary(folder, flag):
    """A sweep folder's summary.json as (settings, cells) for `flag` (a
    --beside or --compare_to folder); unreadable or not a sweep's: a
    one-line error naming the file and how to write it."""
    path = os.path.join(folder, "summary.json")
    try:
        summary = files.read_json(path)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}; write it first with that sweep's --report_only") from None
    settings, cells = (summary.get("settings"), summary.get("cells")) if isinstance(summary, dict) else (None, None)
    if not (isinstance(settings, dict) and isinstance(cells, dict)):
        raise ValueError(f"{flag}: {path} is not a sweep's summary.json (no settings and cells); write it with that "
                         "sweep's --report_only")
    return settings, cells


def eval_split(runs, validation_examples):
    """The split `runs` were evaluated on, as their records name it ('test'; 'validation' for held-out images
    and for a dataset without a test split, e.g. ImageNet or a folder's val/); without records, the flags' guess."""
    recorded = {run.get("eval_split") for run in runs} - {None}
    if len(recorded) == 1:
        return recorded.pop()
    return "validation" if validation_examples else "test"
