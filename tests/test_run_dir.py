"""What a run leaves in its model_dir: checkpoints, reuse of a model_dir,
results and the command lines around them (issue: hardening)."""

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest

from conftest import run_cli_cases, train_py_in_process
from keras_skipinit import applications as apps, files
from keras_skipinit.cli import startup
from keras_skipinit.serving import savedmodel
from keras_skipinit.training import model_files, run_dir, trainer
from keras_skipinit.normalization import NORMALIZATIONS
from keras_skipinit.training.checkpoint import Checkpoint, random_state
from keras_skipinit.optimizers import ScalarLRSGD

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = ["--depth=10", "--width=1", "--epochs=1", "--steps_per_epoch=2", "--verbose=0"]


def error_lines(stderr):
    return [line for line in stderr.splitlines() if ": error:" in line]


def small_model(seed):
    model = apps.WideResNet(10, 1, input_shape=(8, 8, 1), classes=3, normalization="skipinit", seed=seed)
    model.compile(optimizer=ScalarLRSGD(learning_rate=0.1, momentum=0.9), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def same_weights(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a.get_weights(), b.get_weights()))


# --- checkpoints -------------------------------------------------------------------


def test_checkpoints_are_whole_directories_and_the_newest_two_are_kept(tmp_path):
    ckpt = Checkpoint(str(tmp_path))
    models = [small_model(seed) for seed in range(3)]
    for (epoch, step), model in zip([(0, 5), (1, 0), (1, 3)], models):
        ckpt.save(model, epoch, step)
    assert [(e, s) for e, s, _ in ckpt.all()] == [(1, 3), (1, 0)]
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000001-000000", "ckpt-000001-000003"]  # no temporaries left
    target = small_model(9)
    assert ckpt.restore(target)[0] == (1, 3) and same_weights(target, models[2])
    # A save killed midway leaves its tmp-* folder: the next save removes it (they stayed after the resumed run
    # completed; issue 91, smaller).
    (tmp_path / "tmp-killed").mkdir()
    (tmp_path / "tmp-killed" / Checkpoint.WEIGHTS).write_bytes(b"half a file")
    ckpt.save(models[0], 2, 0)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000001-000003", "ckpt-000002-000000"]


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_a_checkpoint_restores_every_variable_of_every_method(tmp_path, normalization):
    """Weights, optimizer slots, BN moving statistics and the random state
    (dropout's SeedGenerators, which a weights file does not hold) of a
    model of each method, after a few draws, come back from a checkpoint
    into another model of the same method."""
    def model_of(seed):
        model = apps.WideResNet(10, 1, input_shape=(8, 8, 1), classes=3, normalization=normalization, seed=seed,
                                **({"ghost_batch_size": 2} if normalization == "ghost_batchnorm" else {}))
        # Eager steps: the same state changes without tracing a step per method (~5 s each on 2 cores).
        model.compile(optimizer=ScalarLRSGD(learning_rate=0.1, momentum=0.9), loss="mse", run_eagerly=True)
        return model

    x = np.random.default_rng(0).standard_normal((4, 8, 8, 1)).astype("float32")
    trained = model_of(0)
    trained.fit(x, np.eye(3)[[0, 1, 2, 0]], batch_size=2, epochs=2, verbose=0)  # advances every state
    Checkpoint(str(tmp_path)).save(trained, 0, 4)
    restored = model_of(1)
    Checkpoint(str(tmp_path)).restore(restored)
    state = lambda model: [keras.ops.convert_to_numpy(v) for v in model.variables + model.optimizer.variables]
    assert len(state(restored)) == len(state(trained))
    for a, b in zip(state(restored), state(trained)):
        np.testing.assert_array_equal(a, b)
    if normalization == "regularized_skipinit":
        assert random_state(restored)


def test_a_kill_during_a_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    """Weights and position are one unit: either the whole new checkpoint
    is there, or the previous one is restored (a kill between two files
    once resumed at an old step with newer weights)."""
    ckpt = Checkpoint(str(tmp_path))
    old, new = small_model(0), small_model(1)
    ckpt.save(old, 0, 4)

    def killed(*args):
        raise KeyboardInterrupt  # the process dies at the rename

    monkeypatch.setattr(run_dir.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(new, 0, 8)
    monkeypatch.undo()
    target = small_model(9)
    assert ckpt.restore(target)[0] == (0, 4) and same_weights(target, old)


@pytest.mark.parametrize("damage", ["truncate", "empty", "missing", "bad_state"])
def test_an_unreadable_newest_checkpoint_falls_back_with_a_warning(tmp_path, capsys, damage):
    ckpt = Checkpoint(str(tmp_path))
    old = small_model(0)
    ckpt.save(old, 1, 0)
    ckpt.save(small_model(1), 2, 0)
    newest = ckpt.all()[0][2]
    weights = os.path.join(newest, ckpt.WEIGHTS)
    if damage == "truncate":
        data = open(weights, "rb").read()
        open(weights, "wb").write(data[: len(data) // 2])
    elif damage == "empty":
        open(weights, "wb").close()
    elif damage == "missing":
        os.remove(weights)
    else:
        open(os.path.join(newest, ckpt.STATE), "w").write("{not json")
    target = small_model(9)
    (position, path) = ckpt.restore(target)
    assert position == (1, 0) and same_weights(target, old)
    warning = capsys.readouterr().err
    assert "unreadable checkpoint" in warning and newest in warning and warning.count("\n") == 1


def test_no_readable_checkpoint_is_one_error_naming_the_files(tmp_path):
    ckpt = Checkpoint(str(tmp_path))
    ckpt.save(small_model(0), 1, 0)
    open(os.path.join(ckpt.all()[0][2], ckpt.WEIGHTS), "wb").close()
    with pytest.raises(ValueError, match=r"no readable checkpoint in .*ckpt-000001-000000.*Delete") as info:
        ckpt.restore(small_model(1))
    assert "\n" not in str(info.value)


def test_results_are_strict_json():
    value = files.strict_json({"loss": float("nan"), "x": [np.float32(1.5), float("inf")], "n": np.int64(3)})
    assert json.loads(json.dumps(value, allow_nan=False)) == {"loss": None, "x": [1.5, None], "n": 3}


def test_two_writers_of_one_file_at_once_each_rename_a_whole_file(tmp_path, monkeypatch):
    # Writer A has staged its file and is about to rename it when writer B (another thread, as another
    # process) writes the same path whole: A's rename must still find its own staged file.
    path, replace = str(tmp_path / "summary.json"), os.replace

    def replace_after_another_writer(src, dst):
        monkeypatch.setattr(os, "replace", replace)
        other = threading.Thread(target=files.write_atomic, args=(path, "B"))
        other.start()
        other.join()
        replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_after_another_writer)
    files.write_atomic(path, "A")
    assert open(path).read() == "A" and os.listdir(tmp_path) == ["summary.json"]


def test_corrupt_run_files_are_named(tmp_path):
    (tmp_path / "model_spec.json").write_text("")
    with pytest.raises(ValueError, match=r"cannot read .*model_spec.json: JSONDecodeError.*--restart discards it"):
        run_dir.read_spec(str(tmp_path))


# --- reusing a model_dir -------------------------------------------------------------


@pytest.mark.heavy
def test_a_finished_run_rerun_is_left_alone_and_other_flags_are_refused(tmp_path, capsys):
    """train.py on a used model_dir: the same flags leave a complete run alone;
    other flags are one line naming each difference (train.py's main in this process)."""
    model_dir = tmp_path / "run"
    trainer.train(trainer.Config(depth=10, width=1, epochs=1, steps_per_epoch=2, verbose=0, model_dir=str(model_dir)))
    before = (model_dir / "results.json").read_text()
    assert train_py_in_process(*QUICK, f"--model_dir={model_dir}") == 0
    same_out = capsys.readouterr().out
    assert "is complete (completed, 1 epoch)" in same_out and "Resuming" not in same_out
    assert train_py_in_process(*QUICK, "--learning_rate=0.4", "--seed=7", f"--model_dir={model_dir}") == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "--learning_rate (0.05 there, 0.4 now)" in line and "--seed (0 there, 7 now)" in line
    assert "--restart" in line and (model_dir / "results.json").read_text() == before


def test_a_killed_run_resumed_with_another_method_is_refused(tmp_path, monkeypatch):
    """Reported: killed as --normalization=none, it resumed as sqrt2 silently.
    A different depth printed 14 KB of layer reprs."""
    model_dir = tmp_path / "run"
    config = trainer.Config(depth=10, normalization="none", epochs=1, steps_per_epoch=2, verbose=0,
                             model_dir=str(model_dir))

    class Killed(Exception):
        pass

    def killed(*args, **kwargs):
        raise Killed

    for feed in (trainer.pipelines.TFData, trainer.pipelines.NumPy):  # killed once its model_spec.json is written
        monkeypatch.setattr(feed, "eval", killed)
    with pytest.raises(Killed):
        trainer.train(config)
    monkeypatch.undo()
    assert (model_dir / run_dir.SPEC).exists() and not (model_dir / run_dir.RESULTS).exists()
    for change, named in ((dict(normalization="sqrt2"), "--normalization ('none' there, 'sqrt2' now)"),
                          (dict(depth=16), "--depth (10 there, 16 now)")):
        with pytest.raises(ValueError) as info:
            trainer.train(trainer.Config(**{**config.__dict__, **change}))
        assert named in str(info.value) and len(str(info.value)) < 400


@pytest.mark.heavy
def test_raising_epochs_continues_and_restart_starts_over(tmp_path, capsys):
    """A continuation says what it is: its first epochs keep the shorter
    run's schedule (results.json's schedule_segments, history.csv's
    schedule_epochs), not the schedule of a run of the longer length."""
    model_dir = str(tmp_path / "run")
    base = dict(depth=10, epochs=1, steps_per_epoch=2, verbose=0, model_dir=model_dir)
    straight = trainer.train(trainer.Config(**base))
    assert straight["schedule_segments"] == [{"first_epoch": 1, "last_epoch": 1, "schedule_epochs": 1}]
    more = trainer.train(trainer.Config(**{**base, "epochs": 2}))
    assert more["epochs_completed"] == 2 and "already_complete" not in more
    assert more["schedule_segments"] == [{"first_epoch": 1, "last_epoch": 1, "schedule_epochs": 1},
                                         {"first_epoch": 2, "last_epoch": 2, "schedule_epochs": 2}]
    assert [row["schedule_epochs"] for row in run_dir.read_history(model_dir)] == [1, 2]
    assert "continuation, not a 2-epoch run" in capsys.readouterr().out
    with pytest.raises(ValueError, match="below the 2 epochs already trained"):
        trainer.train(trainer.Config(**base))
    fresh = trainer.train(trainer.Config(**{**base, "learning_rate": 0.02, "restart": True}))
    assert fresh["epochs_completed"] == 1 and fresh["config"]["learning_rate"] == 0.02
    assert len(open(os.path.join(model_dir, "history.csv")).read().splitlines()) == 2


@pytest.mark.heavy
def test_a_model_dir_is_held_by_one_process_at_a_time(tmp_path):
    """A second run on a model_dir that a train.py process holds refuses at
    once, naming the holder; a killed holder leaves no stale lock. (The second
    run is in this process: the lock is the kernel's, whoever asks.)"""
    model_dir = tmp_path / "run"
    # ~45 s of steps: still in its first epoch when the second run is refused and it is killed
    flags = ["--depth=10", "--width=1", "--epochs=1", "--steps_per_epoch=3000", "--verbose=0", f"--model_dir={model_dir}"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    first = subprocess.Popen([sys.executable, "train.py", *flags], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (model_dir / run_dir.SPEC).exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert first.poll() is None, "the first run ended before the second started"
        with pytest.raises(ValueError) as refused:
            trainer.train(trainer.Config(depth=10, width=1, epochs=1, steps_per_epoch=3000, verbose=0,
                                           model_dir=str(model_dir)))
        assert first.poll() is None, "the first run ended before the second was refused"
        message = str(refused.value)
        assert f"is in use by process {first.pid} on {socket.gethostname()}" in message and "train.py" in message
        assert "\n" not in message
    finally:
        first.kill()
        first.wait()
    assert not (model_dir / run_dir.HISTORY).exists()  # the refused run wrote nothing
    with run_dir.lock(str(model_dir)):  # the kernel released the killed holder's lock
        with pytest.raises(ValueError, match="is in use by process"):
            with run_dir.lock(str(model_dir)):  # a second holder, even in the same process
                pass


def test_unwritable_model_and_export_dirs_are_refused_before_anything_is_made(tmp_path, monkeypatch):
    readonly = str(tmp_path / "ro")
    os.makedirs(readonly)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: not str(p).startswith(readonly) and real_access(p, mode))
    with pytest.raises(ValueError, match=f"--model_dir={readonly}/a/run cannot be written: {readonly} is not writable"):
        trainer.validate(trainer.Config(model_dir=f"{readonly}/a/run"))
    with pytest.raises(ValueError, match="base_path=.* is not writable"):
        savedmodel.check_target(f"{readonly}/serving", "m")
    with pytest.raises(ValueError, match="^--export_dir=.* is not writable"):  # train.py's flag, named as such
        savedmodel.check_target(f"{readonly}/serving", "m", "--export_dir")
    assert os.listdir(readonly) == []
    open(f"{tmp_path}/file", "w").close()  # a file where a folder would have to be made
    with pytest.raises(ValueError, match=f"^--out={tmp_path}/file/a cannot be made: {tmp_path}/file is a file$"):
        files.check_writable(f"{tmp_path}/file/a", "--out")


def test_a_new_model_dir_holding_only_the_lock_file_is_accepted(tmp_path):
    with run_dir.lock(str(tmp_path / "run")):
        pass
    run_dir.check_not_foreign(str(tmp_path / "run"))  # no ValueError


def test_bad_model_and_export_dirs_are_one_line_errors_before_training(tmp_path, capsys):
    """Exit status 2 and one line from train.py's main (in this process)."""
    (tmp_path / "f").write_text("x")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    cases = [([f"--model_dir={tmp_path / 'f'}"], "is a file"),  # an empty --model_dir: its flag (test_training)
             ([f"--model_dir={tmp_path / 'foreign'}"], "holds no keras_skipinit run"),
             ([f"--model_dir={tmp_path / 'run'}", f"--export_dir={tmp_path / 'f'}"], "is a file")]
    for flags, words in cases:
        assert train_py_in_process(*QUICK, *flags) == 2, flags
        (line,) = error_lines(capsys.readouterr().err)
        assert words in line, (flags, line)
    assert sorted(os.listdir(tmp_path / "foreign")) == ["notes.txt"]  # nothing written into it, not even the lock
    assert not os.path.exists(tmp_path / "run")  # a bad --export_dir is found before anything is trained


# --- --export_dir ------------------------------------------------------------------------


@pytest.mark.heavy
def test_export_dir_uses_a_safe_name_and_records_the_export(tmp_path):
    model_dir = tmp_path / "wrn10_lr=0.05"
    assert train_py_in_process(*QUICK, f"--model_dir={model_dir}", f"--export_dir={tmp_path}/serving") == 0
    exported = tmp_path / "serving" / "wrn10_lr_0.05" / "1"
    assert (exported / "saved_model.pb").exists()
    assert json.loads((model_dir / "results.json").read_text())["export_path"] == str(exported)
    import tensorflow as tf

    # The class names the run recorded are served, as python -m export serves them (the digits' names here).
    outputs = tf.saved_model.load(str(exported)).signatures["serving_default"](images=tf.zeros([1, 28, 28, 1], tf.uint8))
    assert outputs["top_k_labels"].numpy().astype(str).tolist() == outputs["top_k_classes"].numpy().astype(str).tolist()
    # The same command again: the run is complete and exported; no second version of the same weights.
    assert train_py_in_process(*QUICK, f"--model_dir={model_dir}", f"--export_dir={tmp_path}/serving") == 0
    assert os.listdir(tmp_path / "serving" / "wrn10_lr_0.05") == ["1"]


@pytest.mark.heavy
def test_an_export_failure_after_training_keeps_the_results(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(savedmodel, "export", broken)
    model_dir = tmp_path / "run"
    assert train_py_in_process(*QUICK, f"--model_dir={model_dir}", f"--export_dir={tmp_path}/serving") == 4
    results = json.loads((model_dir / "results.json").read_text())
    assert results["status"] == "completed" and "export_path" not in results
    assert "export failed (the run's results are kept" in capsys.readouterr().err


# --- installed commands ----------------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.parametrize("command,module", [("keras-skipinit-train", "train_cli"), ("keras-skipinit-export", "export_cli")])
def test_console_commands_resolve_and_run_help(command, module):
    from importlib import metadata

    (entry,) = [e for e in metadata.entry_points(group="console_scripts") if e.name == command]
    # Loaded by the script below, in its own process: each command defines its absl flags at
    # import, so loading both into this process would define --dataset twice.
    assert entry.value == f"keras_skipinit.cli.{module}:run"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    script = os.path.join(os.path.dirname(sys.executable), command)
    proc = subprocess.run([script, "--helpfull"], capture_output=True, text=True, timeout=300, env=env, cwd="/")
    # The usage (naming the command) and the command's own flags, exit 0 (issue 46.7: absl's listed
    # TensorFlow's internal flags too and exited 1); without TensorFlow's start-up lines (see below).
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert command in proc.stdout and ("--normalization" if module == "train_cli" else "--base_path") in proc.stdout
    assert "--logtostderr" not in proc.stdout and "--test_tmpdir" not in proc.stdout  # absl's and libraries' own
    assert not [line for line in proc.stderr.splitlines() if startup.is_noise(line)], proc.stderr[-2000:]


@pytest.fixture
def full_disk(tmp_path):
    """A 200 KiB filesystem (tmpfs; mounting needs root, as CI runs)."""
    path = tmp_path / "full"
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if proc.returncode:
        pytest.skip(f"a full disk needs a small filesystem: `mount -t tmpfs` failed ({proc.stderr.strip()[:120]}); "
                    "run the tests as root")
    yield path
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.mark.heavy
def test_a_full_disk_is_one_line_and_leaves_nothing_half_written(tmp_path, full_disk, capsys):
    """Issue 45.5: a model_dir on a full disk: one line, exit 5, no partial
    checkpoint; --export_dir on a full disk: exit 4, results kept, no
    half-written version; python -m export there: exit 5."""
    assert train_py_in_process(*QUICK, f"--model_dir={full_disk / 'run'}") == 5
    err = capsys.readouterr().err
    assert "No space left on device" in err and "run the same command to resume" in err
    assert os.listdir(full_disk / "run" / "checkpoint") == []
    assert train_py_in_process(*QUICK, f"--model_dir={tmp_path / 'run'}", f"--export_dir={full_disk / 'serving'}") == 4
    assert "No space left on device" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / run_dir.RESULTS).read_text())["status"] == "completed"
    assert not os.path.exists(full_disk / "serving" / "run")
    # python -m export to a full disk (a SavedModel; a file made in a staging folder there): one line, exit 5,
    # nothing left behind, not even the folders it made.
    shutil.rmtree(full_disk / "serving", ignore_errors=True)
    cases = [[f"--source={tmp_path / 'run'}", f"--base_path={full_disk / 'serving'}"]]
    if importlib.util.find_spec("ai_edge_litert"):
        cases.append([f"--source={tmp_path / 'run'}", "--format=litert", f"--output={full_disk / 'm.tflite'}"])
    for status, _, err in run_cli_cases("export", cases, ROOT):
        assert status == 5 and "Traceback" not in err, err[-2000:]
        (line,) = [line for line in err.splitlines() if "error:" in line]
        assert "No space left on device" in line and "nothing was written" in line
    assert os.listdir(full_disk) == ["run"]  # the refused training run's, above


@pytest.mark.heavy
def test_export_takes_model_keras_where_it_is_newer_than_every_readable_checkpoint(tmp_path, capsys):
    from keras_skipinit.serving import savedmodel
    model_dir = tmp_path / "run"
    trainer.train(trainer.Config(depth=10, epochs=2, steps_per_epoch=2, verbose=0, model_dir=str(model_dir)))
    (_, _, newest), (_, _, older) = Checkpoint(str(model_dir / "checkpoint")).all()
    open(os.path.join(newest, Checkpoint.WEIGHTS), "wb").close()  # epoch 2's: model.keras holds it too
    model, _, source = savedmodel.load_source(str(model_dir))
    assert source.endswith("model.keras") and "is newer than the newest readable checkpoint" in capsys.readouterr().err
    assert same_weights(model, keras.models.load_model(model_dir / "model.keras"))
    open(os.path.join(older, Checkpoint.WEIGHTS), "wb").close()
    model, preprocessing, source = savedmodel.load_source(str(model_dir))
    assert source.endswith("model.keras") and preprocessing == "standardize"
    assert "no readable checkpoint" in capsys.readouterr().err
    os.remove(model_dir / "model.keras")
    with pytest.raises(ValueError, match="no readable checkpoint"):
        savedmodel.load_source(str(model_dir))


# --- a quiet start -------------------------------------------------------------------------


@pytest.mark.parametrize("command", [
    # A refusal that comes after TensorFlow loads (TFDS's list of names): train.py's bad flags are refused
    # before it loads at all (test_help_and_flag_refusals_come_before_keras_loads).
    [os.path.join(ROOT, "train.py"), "--dataset=no_such_dataset", "--model_dir=runs/no_such"],
    ["-m", "keras_skipinit.sweep", "--methods=no_such_method"],
    ["-m", "keras_skipinit.analysis", "--no_such_flag"],  # warned about its own import (issue 46.8)
    [os.path.join(ROOT, "benchmarks", "serving_latency.py"), "--no_such_flag"],  # imports the package first
])
@pytest.mark.heavy
def test_commands_start_without_tensorflow_start_up_lines(command):
    """They printed TensorFlow's C++ start-up lines (twice for train.py, with
    'failed call to cuInit' on every machine without a GPU) before the flag
    error; a user's own TF_CPP_MIN_LOG_LEVEL still shows them. (The installed
    console commands, export's among them: test_console_commands_resolve_and_run_help.)"""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    args = [sys.executable, *command]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, env={**env, "PYTHONPATH": ROOT}, cwd=ROOT)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and all("no_such" in line or "--help" in line or line.startswith("usage:") or line.startswith("  ")
                         for line in lines), lines
    if command[0].endswith("train.py"):
        loud = subprocess.run(args, capture_output=True, text=True, timeout=300,
                              env={**env, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "0"}, cwd=ROOT)
        assert any(startup.is_noise(line) for line in loud.stderr.splitlines()), loud.stderr[-2000:]


def test_tensorflow_start_up_lines_are_recognized_and_nothing_else():
    noise = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1795557130.894188    3178 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.",
        "E0000 00:00:1795557130.928432    3178 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call "
        "to cuInit: UNKNOWN ERROR (303)",
        "I0000 00:00:1795557234.888995    3528 port.cc:153] oneDNN custom operations are on. You may see slightly different "
        "numerical results due to floating-point round-off errors from different computation orders.",
        "I0000 00:00:1795557444.103872    4687 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available "
        "CPU instructions in performance-critical operations.",
        "To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other operations, rebuild "
        "TensorFlow with the appropriate compiler flags.",
    ]
    kept = ["train.py: error: --model_dir=x is in use by process 1", "W0000 00:00:1.0 12 op_kernel.cc:1] OOM when allocating",
            "Traceback (most recent call last):", "WARNING: something else"]
    assert all(startup.is_noise(line) for line in noise) and not any(startup.is_noise(line) for line in kept)


def test_a_model_this_version_cannot_build_or_load_is_one_line_naming_why(tmp_path):
    """Issue 46.3: model_spec.json with an unknown constructor argument (was a
    TypeError traceback) and a .keras file with a layer nobody defined (was
    Keras' generic message)."""
    import zipfile

    with pytest.raises(ValueError, match="cannot build .*no_such_argument.*another version"):
        run_dir.recorded_model({"model": "wrn", "depth": 10, "width": 1, "no_such_argument": 1})
    path, renamed = tmp_path / "m.keras", tmp_path / "renamed.keras"
    apps.WideResNet(10, 1, input_shape=(8, 8, 1), classes=3, normalization="skipinit", seed=0).save(path)
    with zipfile.ZipFile(path) as old, zipfile.ZipFile(renamed, "w") as new:
        for item in old.infolist():
            data = old.read(item.filename)
            new.writestr(item, data.replace(b"SkipInitScale", b"NoSuchLayer") if item.filename == "config.json"
                         else data)
    with pytest.raises(ValueError, match=r"uses the layer NoSuchLayer, which keras_skipinit .* does not define"):
        model_files.load_keras(str(renamed))
