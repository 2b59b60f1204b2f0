"""The sweep on Ray (`--executor=ray`, issue 23): a local Ray instance per
test (`--ray_address=local`), tiny real runs, the driver in a process group
of its own so that what a killed driver leaves behind is cleaned up."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import require_module
from keras_skipinit import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--depths=10", "--seeds=1", "--best_k=1", "--protocol=depth", "--lrs=0.05"]


def require_ray():
    require_module("ray", 'pip install -e ".[ray]"')


def start(args, out, log, quiet=True):
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3", "RAY_DEDUP_LOGS": "0"}
    if not quiet:  # as a user starts it: the workers must filter TensorFlow's start-up lines themselves
        env.pop("TF_CPP_MIN_LOG_LEVEL")
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "keras_skipinit.sweep", "--executor=ray", "--ray_address=local", *args,
         f"--out={out}", f"--runs_dir={out}_runs"],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)


def kill_session(proc):
    """SIGKILL to every process of the driver's session: the driver, the local
    Ray instance it started and its workers (Ray puts each worker in a
    process group of its own, but not in a session of its own)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                session = int(f.read().rsplit(")", 1)[1].split()[3])
            if session == proc.pid:
                os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass


def wait_for(predicate, proc, timeout=300):
    deadline = time.time() + timeout
    while not predicate():
        assert proc.poll() is None, "the sweep ended before the moment the test waits for"
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


def checkpoints(runs_dir):
    found = []
    for root, dirs, _ in os.walk(runs_dir):
        found += [os.path.join(root, d) for d in dirs if d.startswith("ckpt-")]
    return found


def lines(out):
    path = os.path.join(out, "runs.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def assert_same_runs(sequential, other, runs):
    """The runs.jsonl of a sweep run elsewhere (Ray, child processes) holds each of the sequential sweep's
    `runs` runs once, completed, with its results (same seeds, within round-off)."""
    by_run = {}
    for name, folder in (("seq", sequential), ("other", other)):
        for run in lines(folder):
            by_run.setdefault((run["method"], run["lr"], run["seed"]), {})[name] = run
    assert len(by_run) == runs and all(len(pair) == 2 for pair in by_run.values())  # each run once
    for pair in by_run.values():
        assert pair["other"]["status"] == pair["seq"]["status"] == "completed"
        assert pair["other"]["test_top1"] == pytest.approx(pair["seq"]["test_top1"], abs=2e-3)
        assert pair["other"]["train_cross_entropy"] == pytest.approx(pair["seq"]["train_cross_entropy"], rel=1e-3)
    return by_run


@pytest.mark.heavy
def test_a_killed_ray_worker_is_retried_and_its_run_resumes_from_its_checkpoint(tmp_path):
    require_ray()
    out = tmp_path / "sweep"
    with open(tmp_path / "log", "w") as log:
        proc = start([*TINY, "--methods=skipinit", "--epochs=3", "--steps_per_epoch=10"], out, log, quiet=False)
    try:
        wait_for(lambda: checkpoints(f"{out}_runs"), proc)  # epoch 1 done
        holder = open(os.path.join(f"{out}_runs", "skipinit_d10_lr0.05_s0", ".lock")).read()
        os.kill(int(holder.split()[1]), signal.SIGKILL)  # "process PID on HOST (...)"
        assert proc.wait(timeout=600) == 0, (tmp_path / "log").read_text()[-3000:]
    finally:
        kill_session(proc)
    (run,) = lines(out)
    assert run["status"] == "completed" and run["results"]["epochs_completed"] == 3
    assert "Resuming from epoch 2" in (tmp_path / "log").read_text()
    # Issue 32.8: the workers printed TensorFlow's C++ start-up lines (cuInit's among them).
    from keras_skipinit.cli import startup
    prefix = re.compile(r"^(\x1b\[\d+m)?\([^)]*\)(\x1b\[0m)? ")  # Ray's "(_ray_run pid=...) ", maybe coloured
    noise = [line for line in (tmp_path / "log").read_text().splitlines() if startup.is_noise(prefix.sub("", line))]
    assert not noise, noise[:5]


@pytest.mark.heavy
def test_a_killed_driver_reruns_to_the_sequential_sweeps_runs(tmp_path):
    """A 2-run sweep on Ray whose driver is killed mid-run: the same command
    again completes it (finished runs kept, cut-off runs resumed), and its
    runs equal those of the sequential sweep (same seeds, within round-off)."""
    require_ray()
    out = tmp_path / "ray"
    args = [*TINY, "--methods=skipinit,batchnorm", "--epochs=2", "--steps_per_epoch=5"]
    with open(tmp_path / "log1", "w") as log:
        first = start(args, out, log)
    try:
        wait_for(lambda: checkpoints(f"{out}_runs"), first)  # mid-run
        kill_session(first)  # the driver with its Ray instance, at once (Ray would reap its workers in ~4 s)
        first.wait(timeout=60)
    finally:
        kill_session(first)
    assert len(lines(out)) < 2
    with open(tmp_path / "log2", "w") as log:
        second = start(args, out, log)
    try:
        assert second.wait(timeout=600) == 0, (tmp_path / "log2").read_text()[-3000:]
    finally:
        kill_session(second)
    log2 = (tmp_path / "log2").read_text()
    assert "Resuming from epoch 2" in log2 and "0 running, 0 queued" in log2
    sweep.main([*args, f"--out={tmp_path}/seq", f"--runs_dir={tmp_path}/seq_runs"])
    assert_same_runs(tmp_path / "seq", out, runs=2)


@pytest.mark.heavy
def test_a_cluster_that_is_not_there_or_too_small_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    """Issue 32.9: ray.init retried a dead address without end; a run asking for more than the
    cluster has waited forever in silence."""
    require_ray()
    import socket

    from keras_skipinit.sweep import executors
    with socket.socket() as s:  # a free port, closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(executors, "RAY_CONNECT_TIMEOUT_S", 2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for args, words in (([f"--ray_address=127.0.0.1:{port}"], f"no Ray cluster answers at 127.0.0.1:{port}"),
                        (["--ray_address=local", "--cpus_per_run=512"], "a run asks for 512 CPU")):
        start = time.time()
        with pytest.raises(SystemExit) as exit_info:
            sweep.main(["--executor=ray", *args, *TINY, f"--out={tmp_path / 'out'}", f"--runs_dir={tmp_path / 'runs'}"])
        assert exit_info.value.code == 2 and time.time() - start < 120
        (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
        assert words in line, line
    assert not os.path.exists(tmp_path / "runs") or not os.listdir(tmp_path / "runs")


@pytest.mark.heavy
def test_a_cluster_that_ray_start_started_with_token_authentication_takes_the_sweep(tmp_path):
    """Issue 89.3: Ray 2.59+ turns token authentication on where `ray start
    --head` finds a token (~/.ray/auth_token: any earlier local ray.init()
    writes one), but a driver given the cluster's address does not: the
    README's sequence failed with "InvalidAuthToken" a second, then a
    traceback. The sweep now connects with the token at hand; a driver told
    RAY_AUTH_MODE=disabled is refused in one line."""
    require_ray()
    import shutil
    import socket
    import tempfile

    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(os.urandom(16).hex())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    short = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 108 characters
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": ROOT}
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "TF_CPP_MIN_LOG_LEVEL"):
        env.pop(name, None)
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    head = subprocess.Popen([ray, "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                             f"--temp-dir={short}", "--block"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    try:
        log = []
        while not any("To terminate the Ray runtime" in line for line in log):  # after the address it prints
            line = head.stdout.readline()
            assert line, "".join(log)
            log.append(line)
        assert any("Token authentication is enabled" in line for line in log), "".join(log)
        (address,) = {m for line in log for m in re.findall(r"ray start --address='([\d.]+):", line)}
        sweep_args = [sys.executable, "-m", "keras_skipinit.sweep", "--executor=ray", f"--ray_address={address}:{port}",
                      *TINY, "--methods=skipinit", "--epochs=1", "--steps_per_epoch=2"]
        proc = subprocess.run([*sweep_args, f"--out={tmp_path}/out", f"--runs_dir={tmp_path}/runs"], capture_output=True,
                              text=True, timeout=600, cwd=ROOT, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert len((tmp_path / "out" / "runs.jsonl").read_text().splitlines()) == 1
        proc = subprocess.run([*sweep_args, f"--out={tmp_path}/refused", f"--runs_dir={tmp_path}/refused_runs"],
                              capture_output=True, text=True, timeout=600, cwd=ROOT, env={**env, "RAY_AUTH_MODE": "disabled"})
        (line,) = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and "could not connect to the Ray cluster" in line and "ray get-auth-token" in line, line
    finally:
        kill_session(head)
        head.wait()
        shutil.rmtree(short, ignore_errors=True)
