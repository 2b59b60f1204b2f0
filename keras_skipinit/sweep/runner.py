"""Runs a sweep: asks the protocol what may run now, hands those runs to the
executor (this process, or Ray tasks), and records each result as it comes
back (one writer) before asking again."""

import dataclasses
import math
import os
import re
import threading
import time

import numpy as np

from keras_skipinit import machine as machine_lib, normalization as norm_lib, spec
from keras_skipinit.sweep import executors, log, protocol
from keras_skipinit.sweep.presets import METHOD_SETTINGS


def config(settings, run):
    """A run's trainer.Config. Runs that choose the learning rate evaluate on
    --validation_examples held out of the training set; final runs train on
    all of it and evaluate on the test set. With --micro_batch_size, a batch
    is accumulated from micro-batches of at most that size (SkipInit §3)."""
    from keras_skipinit.training import trainer
    key, depth, batch, lr, seed, phase = run
    method = dict(METHOD_SETTINGS[key][1])
    not_its = set(norm_lib.OPTIONS) - set(norm_lib.METHODS[method["normalization"]].options)  # other methods' options
    # Every setting the sweep has a flag for, as given (the others: the method's, else train.py's defaults); the
    # held-out images only where a run chooses the learning rate.
    given = {k: getattr(settings, k) for k in spec.FIELDS if k not in not_its and getattr(settings, k, None) is not None}
    micro = min(batch, settings.micro_batch_size or batch)
    name = f"{key}_d{depth}" + (f"_b{batch}" if settings.protocol == "batch_scaling" else "")
    return trainer.Config(**{
        **method, **given, "depth": depth, "learning_rate": lr, "batch_size": batch,
        "accumulation_steps": batch // micro, "seed": seed, "verbose": 0,
        "validation_examples": settings.validation_examples if phase == protocol.SELECT else None,
        "mixed_precision": machine_lib.resolve_precision(settings.mixed_precision),
        "model_dir": os.path.join(settings.runs_dir, f"{name}_lr{lr:.6g}_s{seed}"
                                  + ("_final" if phase == protocol.FINAL else "")),
    })


def check_same_experiment(settings, done, path):
    """Refuses to mix experiments in one --out: every recorded run's training
    settings must be those this sweep would give it."""
    for run_id, run in done.items():
        recorded = (run.get("results") or {}).get("config") or {}
        if run_id[0] not in METHOD_SETTINGS:
            raise ValueError(f"{path} holds runs of method {run_id[0]!r}, which this version does not know")
        wanted = dataclasses.asdict(config(settings, run_id))
        differ = [f"{k} {recorded[k]!r} there, {wanted[k]!r} here" for k in protocol.EXPERIMENT
                  if k in recorded and recorded[k] != wanted[k]]
        if settings.protocol != "batch_scaling" and run_id[2] != settings.batch_size:  # a cell's axis only there
            differ.append(f"batch_size {run_id[2]!r} there, {settings.batch_size!r} here")
        if differ:
            raise ValueError(f"{path} holds runs of another experiment ({'; '.join(differ)}; run "
                             f"{run_label(run_id, settings)}): give this sweep an --out of its own, or the other one's flags")


MARKER = "sweep.json"  # in --out: the protocol whose tables and figures the folder holds


def check_protocol(settings, done, out):
    """Refuses a --protocol other than the one whose runs `out` holds
    (its sweep.json; in folders from before it, what the runs show: final
    runs come from a protocol that chooses the rate, run directories named
    by batch from batch_scaling), before anything in `out` is rewritten."""
    from keras_skipinit import files
    path = os.path.join(out, MARKER)
    if os.path.exists(path):
        recorded = files.read_json(path).get("protocol")
        if recorded != settings.protocol:
            raise ValueError(f"{out} holds a --protocol={recorded} sweep ({path}), not --protocol={settings.protocol}: "
                             "give this sweep an --out of its own, or that protocol")
        return
    finals = [run for run in done if run[5] == protocol.FINAL]
    by_batch = [run for run in done.values()
                if re.search(r"_b\d+_lr", ((run.get("results") or {}).get("config") or {}).get("model_dir", ""))]
    shown = "batch_scaling" if by_batch else "converged" if finals else None  # else table1, depth or undecided
    if shown and shown != settings.protocol:
        raise ValueError(f"{out} holds the runs of a --protocol={shown} sweep, not --protocol={settings.protocol}: "
                         "give this sweep an --out of its own, or that protocol")


def mark_protocol(settings, out):
    from keras_skipinit import files
    path = os.path.join(out, MARKER)
    if not os.path.exists(path):
        files.write_json(path, {"protocol": settings.protocol, "model": settings.model})


def check_cells(settings):
    """Refuses, before any run, a cell that train.py would refuse on this
    model (a method, a depth, a batch): not hours into the sweep."""
    from keras_skipinit.training import trainer
    for key, depth, batch in protocol.cells(settings):
        try:
            trainer.validate(config(settings, (key, depth, batch, 0.1, 0, protocol.SELECT)))
        except ValueError as e:
            where = f"depth {depth}" + (f", batch {batch}" if settings.protocol == "batch_scaling" else "")
            raise ValueError(f"--methods={key} at {where} with --model={settings.model}: {e}") from None


def run_label(run, settings):
    key, depth, batch, lr, seed, phase = run
    shown = settings.protocol == "batch_scaling"
    return (f"{key} depth {depth}" + (f" batch {batch}" if shown else "") + f" lr {protocol.lr_label(lr)} seed {seed}"
            + (" (final)" if phase == protocol.FINAL else ""))


def executor_for(settings):
    if settings.executor == "sequential":
        return executors.make("sequential")
    if settings.executor == "processes":
        return executors.make("processes", processes=settings.processes)
    return executors.make("ray", address=settings.ray_address, cpus_per_run=settings.cpus_per_run,
                          gpus_per_run=settings.gpus_per_run, max_retries=settings.max_retries)


def record(settings, run, outcome):
    """The runs.jsonl line of a finished run (its test_top1 is the accuracy
    on its eval_split, as in every runs.jsonl committed before results.json
    named its metrics by split)."""
    key, depth, batch, lr, seed, phase = run
    result = outcome["result"]
    results = {k: v for k, v in result.items() if k not in ("chief", "signal")}
    # Paths relative to --out: no machine's directories in committed results.
    results["config"] = {**results["config"],
                         "model_dir": os.path.relpath(results["config"]["model_dir"], settings.out)}
    return {"model": settings.model, "method": key, "depth": depth, "width": settings.width, "batch_size": batch,
            "accumulation_steps": results["config"].get("accumulation_steps", 1), "lr": lr,
            "log2_lr": math.log2(lr), "seed": seed, "phase": phase, "status": result["status"],
            "test_top1": result.get("eval_top1"), "eval_split": result["eval_split"],
            "train_cross_entropy": result["train_cross_entropy"], "curve": outcome["curve"],
            "wall_time_s": result["wall_time_s"], "machine": outcome["machine"], "results": results}


class Interrupted(Exception):
    """A run stopped by SIGINT or SIGTERM (checkpointed: the same command resumes it)."""

    def __init__(self, label, signum):
        super().__init__(label)
        self.signal = signum


class EpochWatch:
    """Progress within long runs: a sweep prints a line per finished run,
    which at depth 100 and 2,400 updates is 40 minutes apart. Between
    `start` and `stop`, every `poll_s` seconds each run in flight whose history.csv
    (in its model_dir, where this machine sees it: not on a Ray cluster's
    other nodes) gained an epoch gets a line, at most one every `every_s`
    seconds a run: runs of a minute or less stay quiet. A run's time left is
    measured between epoch ends this sweep saw it train: a resumed run's
    epochs from before (`before`: the epochs each run had when submitted)
    ended before the interruption, so they give no rate."""

    every_s, poll_s = 60.0, 10.0

    def __init__(self, in_flight, settings, done, before):
        self.in_flight, self.settings, self.done = in_flight, settings, done  # done: the recorded runs, by ident
        self.before = before
        self._shown = {}  # run -> (epoch, time) of its last line, or (0, when first seen in flight)
        self._first = {}  # run -> (epoch, its history.csv's time) at the first epoch end seen that this sweep trained
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="sweep-epoch-watch")

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join()

    def _loop(self):
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self):
        from keras_skipinit.training import run_dir
        now = time.time()
        for run, config in list(self.in_flight.items()):
            shown_epoch, shown_time = self._shown.setdefault(run, (0, now))
            try:
                rows = run_dir.read_history(config.model_dir)
                changed = os.path.getmtime(os.path.join(config.model_dir, run_dir.HISTORY))
            except (OSError, ValueError):  # not there yet, or not on this machine
                continue
            if not rows:
                continue
            epoch = rows[-1]["epoch"]
            if epoch > self.before.get(run, epoch):  # an epoch this sweep trained: the rate starts at its end
                self._first.setdefault(run, (epoch, changed))
            first_epoch, first_time = self._first.get(run, (epoch, changed))
            if epoch <= shown_epoch or now - shown_time < self.every_s:
                continue
            self._shown[run] = (epoch, now)
            acc = rows[-1].get("val_top1")
            line = f"  {run_label(run, self.settings)}: epoch {epoch}/{config.epochs}"
            if acc is not None:
                recorded = [r for r in list(self.done.values()) if r.get("phase") == run[5]]  # their split, once known
                line += f", {log.eval_split(recorded, config.validation_examples)} {100 * acc:.1f}%"
            if epoch > first_epoch:  # two epochs' ends seen: a rate
                per_epoch = (changed - first_time) / (epoch - first_epoch)
                line += f", about {(config.epochs - epoch) * per_epoch / 60:.0f} min left in this run"
            print(line, flush=True)


def checked_log(settings, repair=False):
    """(path, recorded runs) of --out's runs.jsonl, refused in one line
    before any run where they are another model's, experiment's or
    protocol's, or where a cell is one train.py would refuse."""
    path = os.path.join(settings.out, log.LOG)
    done = log.load(path, repair=repair)
    others = sorted({r.get("model", "wrn") for r in done.values()} - {settings.model})
    if others:
        raise ValueError(f"{path} holds runs of --model={others[0]}, not --model={settings.model}: "
                         "give this sweep an --out of its own")
    check_same_experiment(settings, done, path)
    check_protocol(settings, done, settings.out)
    check_cells(settings)
    return path, done


def plan(settings):
    """--dry_run: from the recorded runs, what the sweep would start now and
    how many runs are left as far as known (a grid extension decides more as
    results come), with the time the runs starting now took in their cells so
    far (median recorded run time, less the epochs a resumed run has done); a run
    another process trains now says so; nothing is run or written."""
    path, done = checked_log(settings)
    cells = set(protocol.cells(settings))
    recorded = [run for ident, run in done.items() if ident[:3] in cells]
    pending, left = protocol.pending_runs(settings, done), protocol.runs_left(settings, done)
    progress = {run: _progress(config(settings, run)) for run in pending}
    running = sum(bool(progress[run].holder) for run in pending)
    first = {cell: {protocol.lr_key(lr) for lr in protocol.base_lrs(settings, cell[0], cell[2])} for cell in cells}
    outside = sum(protocol.lr_key(ident[3]) not in first[ident[:3]] for ident in done if ident[:3] in cells)
    lines = [f"{len(recorded)} runs of this sweep's cells recorded in {path}"
             + (f" ({outside} at rates outside its first grid: its extensions, or runs copied in; its tables use "
                "them)" if outside else "") + f"; {len(pending)} would start now"
             + (f" ({running} of them running now in another process)" if running else "")
             + f", {left} left as far as known now" + (":" if pending else " (the sweep is complete)")]
    lines += [f"  {run_label(run, settings)}" + (f" ({progress[run].note})" if progress[run].note else "") for run in pending]
    times = {}
    for ident, run in done.items():
        if ident[:3] in cells and run.get("wall_time_s"):
            times.setdefault(ident[:3], []).append(run["wall_time_s"])
    known = [float(np.median(times[run[:3]])) * (1 - progress[run].epochs / settings.epochs)
             for run in pending if run[:3] in times]
    if known:
        which = (f"the {len(pending)} starting now" if len(known) == len(pending) else
                 f"{len(known)} of the {len(pending)} starting now (those in cells with recorded runs)")
        total = sum(known)
        lines.append(f"{which}: about {f'{total:.0f} s' if total < 120 else f'{total / 60:.0f} min'} of one process "
                     "at their cells' median recorded run time"
                     + (", less the epochs they have done" if any(progress[run].epochs for run in pending) else ""))
    return "\n".join(lines)


def _check_not_held(run, run_config, settings):
    """One line in the sweep's words where another process holds a run's
    folder (a second sweep on the same --runs_dir): the run's own refusal
    named a --model_dir the user never gave (issue 91)."""
    from keras_skipinit.training import run_dir
    who = run_dir.holder(run_config.model_dir)
    if who:
        raise ValueError(f"run {run_label(run, settings)}: its folder {run_config.model_dir} (in --runs_dir="
                         f"{settings.runs_dir}) is in use by {who}: another sweep of this --runs_dir? Wait for it, "
                         "or give this sweep another --out and --runs_dir")


@dataclasses.dataclass(frozen=True)
class _Progress:
    """What --dry_run says of a pending run: the epochs its history.csv holds, the process holding its
    model_dir (None where none does), and a note naming both."""
    epochs: int
    holder: str | None
    note: str


def _progress(config):
    """A pending run's `_Progress`, read from its model_dir."""
    from keras_skipinit.training import run_dir
    epochs, who = _epochs_recorded(config), run_dir.holder(config.model_dir)
    notes = ([f"running now: {who.split(' (')[0]}"] if who else []) + (
        [f"{epochs} of {config.epochs} epochs done"] if epochs else [])
    return _Progress(epochs, who, "; ".join(notes))


def _epochs_recorded(config):
    """Epochs a run's history.csv holds as it is submitted: a resumed run's done elsewhere, 0 for a new
    run or one this machine does not see (on a Ray cluster's other nodes)."""
    from keras_skipinit.training import run_dir
    try:
        return max((row["epoch"] for row in run_dir.read_history(config.model_dir)), default=0)
    except (OSError, ValueError):
        return 0


def run_sweep(settings):
    """Runs the sweep: every run the protocol allows goes to the executor
    (--executor: this process, one run at a time; child processes, --processes
    at once; or Ray tasks, all at once),
    and each result is recorded here as it comes back, before the pending
    runs are decided again. Returns every recorded run."""
    os.makedirs(settings.out, exist_ok=True)
    path, done = checked_log(settings, repair=True)
    mark_protocol(settings, settings.out)
    executor = executor_for(settings)
    cells = set(protocol.cells(settings))
    done_before = sum(run_id[:3] in cells for run_id in done)
    start, new, in_flight = time.time(), 0, {}
    before, epochs_here = {}, 0  # epochs each run in flight had when submitted; epochs trained by this sweep
    watch = EpochWatch(in_flight, settings, done, before)
    watch.start()
    try:
        while True:
            pending = [run for run in protocol.pending_runs(settings, done) if run not in in_flight]
            for run in pending[: executor.capacity - len(in_flight)]:
                run_config = config(settings, run)
                _check_not_held(run, run_config, settings)
                before[run] = _epochs_recorded(run_config)  # set before the watch sees the run in flight
                in_flight[run] = run_config
                executor.submit(run, run_config)
                if settings.executor != "sequential":  # its process loads Keras first: seconds before a line of its own
                    print(f"  {run_label(run, settings)}: started ({settings.executor})", flush=True)
            if not in_flight:
                break
            run, outcome = executor.wait()
            if outcome["result"]["status"] == "interrupted":  # not a result: nothing recorded
                raise Interrupted(run_label(run, settings), outcome["result"]["signal"])
            ended = in_flight.pop(run)
            epochs_here += max(ended.epochs - before.pop(run), 0)  # what was left of it (a diverged run ends it too)
            line = record(settings, run, outcome)
            log.append(path, line)
            done[protocol.ident(*run)] = line
            if outcome["result"].get("signal"):  # arrived as the run completed: recorded, the sweep stops
                raise Interrupted(run_label(run, settings) + " (recorded: it had completed)", outcome["result"]["signal"])
            new += 1
            running, queued = executor.in_flight()
            finished, left = done_before + new, protocol.runs_left(settings, done)
            # This sweep's throughput so far, in epochs: a resumed run's epochs from before are not its work.
            epochs_left = left * settings.epochs - sum(before.values())
            if epochs_here or not left:
                eta = f"about {(time.time() - start) * epochs_left / max(epochs_here, 1) / 60:.0f} min left"
            else:  # only runs complete before this sweep have ended: nothing measures its speed yet
                eta = "time left not known until a run trains here"
            acc = "—" if line["test_top1"] is None else f"{100 * line['test_top1']:.1f}%"
            busy = f"{running} running, {queued} queued; " if settings.executor != "sequential" else ""
            print(f"[{finished}/{finished + left}] {run_label(run, settings)}: {line['status']}, {line['eval_split']} {acc}, "
                  f"{line['wall_time_s']:.0f} s; {busy}{eta}", flush=True)
    except executors.RunFailed as e:
        raise ValueError(f"run {run_label(e.ident, settings)}: {e}") from None
    finally:
        watch.stop()
        executor.close()
    return list(done.values())
