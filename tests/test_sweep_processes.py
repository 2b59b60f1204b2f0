"""The sweep with its runs in child processes of this machine, several at
once (`--executor=processes`): a GPU shared by small runs, one run a process."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from keras_skipinit import sweep
from test_sweep_ray import assert_same_runs, lines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--depths=10", "--seeds=1", "--best_k=1", "--protocol=depth", "--lrs=0.05", "--methods=skipinit,batchnorm",
        "--epochs=3", "--steps_per_epoch=6"]


def start(out, log):
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_NUM_INTRAOP_THREADS": "1",
           "TF_NUM_INTEROP_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "keras_skipinit.sweep", "--executor=processes", "--processes=2",
                             *TINY, f"--out={out}", f"--runs_dir={out}_runs"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)


def epochs_done(runs_dir):  # over all runs
    found = 0
    for root, _, files in os.walk(runs_dir):
        if "history.csv" in files:
            with open(os.path.join(root, "history.csv")) as f:
                found += len(f.readlines()) > 1  # an epoch's row under the header
    return found


@pytest.mark.heavy
def test_a_signalled_sweep_stops_its_children_at_a_checkpoint_and_reruns_to_the_sequential_runs(tmp_path):
    """SIGTERM to the sweep's process alone (as a scheduler sends it): both
    runs, in flight at once in their own processes, stop (checkpointed where they trained),
    nothing is recorded, exit 143; the same command resumes both, and the
    runs equal the sequential sweep's (same seeds, within round-off)."""
    out = tmp_path / "par"
    with open(tmp_path / "log1", "w") as log:
        first = start(out, log)
    try:
        deadline = time.time() + 300
        # both runs started (at once), one past its first epoch of 3: the signal finds both in flight
        while epochs_done(f"{out}_runs") < 1 or len(os.listdir(f"{out}_runs")) < 2:
            assert first.poll() is None, (tmp_path / "log1").read_text()[-3000:]
            assert time.time() < deadline, "timed out"
            time.sleep(0.2)
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 128 + signal.SIGTERM, (tmp_path / "log1").read_text()[-3000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    log1 = (tmp_path / "log1").read_text()
    assert "interrupted during run" in log1 and "run the same command to resume" in log1
    # each run said as it was handed to its process (issue 89.5: the sweep was silent ~28 s before its first line)
    assert all(f"  {m} depth 10 lr 0.05 seed 0: started (processes)" in log1 for m in ("skipinit", "batchnorm")), log1
    assert lines(out) == []
    with open(tmp_path / "log2", "w") as log:
        second = start(out, log)
    assert second.wait(timeout=300) == 0, (tmp_path / "log2").read_text()[-3000:]
    log2 = (tmp_path / "log2").read_text()
    assert "Resuming from epoch" in log2 and "1 running, 0 queued" in log2  # resumed; the other run in flight
    sweep.main([*TINY, f"--out={tmp_path}/seq", f"--runs_dir={tmp_path}/seq_runs"])
    for pair in assert_same_runs(tmp_path / "seq", out, runs=2).values():
        assert pair["other"]["results"]["epochs_completed"] == 3


def test_a_run_handed_over_after_the_signal_is_reported_interrupted_not_started():
    """The sweep may hand over the next runs after a signal (a run that finished as it came is recorded
    first): they start no process and come back interrupted, which stops the sweep."""
    from keras_skipinit.sweep import executors
    executor = executors.Processes(processes=2)
    try:
        executor._interrupt._handle(signal.SIGTERM, None)  # as the signal arrives: no child to pass it to
        executor.submit(("skipinit", 10, 32, 0.05, 0, "select"), config=None)
        answer = []
        waiting = threading.Thread(target=lambda: answer.append(executor.wait()), daemon=True)
        waiting.start()
        waiting.join(timeout=10)  # it waited forever on no process
        assert answer == [(("skipinit", 10, 32, 0.05, 0, "select"),
                           {"result": {"status": "interrupted", "signal": signal.SIGTERM}})]
    finally:
        executor.close()


class _DiesUnpickled:
    """A run's config whose unpickling in the child ends the child at once, as a kill would."""

    def __reduce__(self):
        return os._exit, (3,)


class _ExitsWithItsThreads:
    """A run's config whose unpickling in the child ends it with its TensorFlow thread count as exit code."""

    def __reduce__(self):
        return eval, ("__import__('os')._exit(10 * int(__import__('os').environ['TF_NUM_INTRAOP_THREADS'])"
                      " + int(__import__('os').environ['TF_NUM_INTEROP_THREADS']))",)


@pytest.mark.heavy
def test_runs_starting_together_split_the_free_cores_and_compute_as_a_run_here(monkeypatch):
    """A resumed sweep's one run is not held to cores / N (TensorFlow's pools are fixed at start);
    every run computes with the intra-op threads a sequential sweep's run has (all 4 cores here):
    they change its numbers (issue 89.4: runs started together got 2 and other accuracies)."""
    from keras_skipinit import machine
    from keras_skipinit.sweep import executors
    monkeypatch.setattr(machine, "cpu_count", lambda: 4)
    for name in executors.THREADS:
        monkeypatch.delenv(name, raising=False)
    executor = executors.Processes(processes=2)
    try:
        codes = []
        for runs in (["alone"], ["first", "second"]):
            for ident in runs:
                executor.submit(ident, _ExitsWithItsThreads())
            for _ in runs:
                with pytest.raises(executors.RunFailed) as died:
                    executor.wait()
                codes.append((died.value.ident, str(died.value).split("exit code ")[1].split(")")[0]))
    finally:
        executor.close()
    assert sorted(codes) == [("alone", "44"), ("first", "42"), ("second", "42")]
    assert executors.share(4, 2, 1) == 2 and executors.share(2, 1, 1) == 1 and executors.share(2, 0, 4) == 1


@pytest.mark.heavy
def test_a_run_whose_process_dies_is_a_failure_that_names_it_and_says_how_to_resume():
    from keras_skipinit.sweep import executors
    executor = executors.Processes(processes=1)
    try:
        executor.submit("the run", _DiesUnpickled())
        with pytest.raises(executors.RunFailed) as failed:
            executor.wait()
    finally:
        executor.close()
    assert failed.value.ident == "the run"
    assert str(failed.value) == "its process died (exit code 3); rerun the sweep to resume it from its last checkpoint"


@pytest.mark.heavy
def test_runs_started_together_end_with_the_sequential_sweeps_weights(tmp_path):
    """Issue 89.4: two runs started together got half the cores each as
    intra-op threads, and a convolution's weight gradient sums in per-thread
    blocks, so their weights (and, over long runs, accuracies) left the
    sequential sweep's. Every run now computes with the threads a run in the
    sweep's own process has: the same weights, bit for bit."""
    from keras_skipinit import machine
    if machine.cpu_count() < 2:
        pytest.skip("one core: runs started together and alone have the same threads")
    import numpy as np

    env = {k: v for k, v in os.environ.items() if k not in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    args = ["--depths=10", "--seeds=1", "--best_k=1", "--protocol=depth", "--lrs=0.1", "--methods=skipinit,batchnorm",
            "--epochs=1", "--steps_per_epoch=3", "--batch_size=256"]  # a batch whose gradient sums split by thread
    for executor in ("sequential", "processes"):
        more = ["--processes=2"] if executor == "processes" else []
        proc = subprocess.run([sys.executable, "-m", "keras_skipinit.sweep", f"--executor={executor}", *more, *args, f"--out={tmp_path}/{executor}", f"--runs_dir={tmp_path}/{executor}_runs"],
                              capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
    import keras

    for run in sorted(os.listdir(tmp_path / "sequential_runs")):
        sequential, together = (keras.saving.load_model(tmp_path / f"{executor}_runs" / run / "model.keras").get_weights()
                                for executor in ("sequential", "processes"))
        assert all(np.array_equal(a, b) for a, b in zip(sequential, together)), run
