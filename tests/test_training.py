import json
import os
import re
import signal
import shutil
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from conftest import BACKEND, require_module, run_cli_cases, tf_only, train_py_in_process
from keras_skipinit import applications as apps, machine, schedules
from keras_skipinit.data import pipelines, sources as data_lib
from keras_skipinit.training import distribute, memory, run_dir, run_model, trainer
from keras_skipinit.training.checkpoint import Checkpoint
from keras_skipinit.optimizers import ScalarLRSGD

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(depth=10, width=1, verbose=0)


def small_config(tmp_path, **kwargs):
    return trainer.Config(**{**SMALL, "model_dir": str(tmp_path / "run"), **kwargs})


def final_weights(model_dir):
    model = keras.models.load_model(os.path.join(model_dir, "model.keras"))
    return [keras.ops.convert_to_numpy(w) for w in model.weights]


# --- pieces -------------------------------------------------------------------------


def test_l2_term_is_coefficient_times_sum_of_squared_kernels():
    model = apps.WideResNet(10, 1, normalization="regularized_skipinit", alpha_init="one")
    run_model.add_l2(model, 5e-4)
    kernels = [keras.ops.convert_to_numpy(w) for w in model.weights if w.path.endswith("kernel")]
    assert len(kernels) == 1 + 3 * 2 + 2 + 1  # stem, 2 per block, 2 projections, classifier
    expected = 5e-4 * sum(float(np.sum(k.astype(np.float64) ** 2)) for k in kernels)
    model(np.zeros((1, 32, 32, 3), "float32"))
    assert float(sum(model.losses)) == pytest.approx(expected, rel=1e-5)
    # Biases and scalars are not regularized.
    assert all(w.regularizer is None for w in model.trainable_weights if not w.path.endswith("kernel"))


def test_a_long_silent_build_is_announced_in_one_line():
    """Issue 46.10: an unrolled 1,000-layer net built for minutes without a word."""
    note = run_model.build_note(trainer.Config(depth=1000))
    assert note.startswith("Building WRN-1000-1 unrolled") and "--loop_blocks" in note
    assert run_model.build_note(trainer.Config(depth=1000, loop_blocks=True)) is None
    assert run_model.build_note(trainer.Config(depth=100)) is None


def test_scalar_lr_multiplier_equals_lower_learning_rate_for_scalars():
    def make():
        scalar = keras.Variable(1.0, name="alpha")
        vector = keras.Variable(np.ones(3, "float32"), name="w")
        return scalar, vector

    s1, v1 = make()
    s2, v2 = make()
    opt1 = ScalarLRSGD(scalar_lr_multiplier=0.1, learning_rate=0.5, momentum=0.9)
    opt2 = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
    opt3 = keras.optimizers.SGD(learning_rate=0.5, momentum=0.9)
    _, v3 = make()
    for step in range(4):
        grads = [np.float32(0.3 * step + 1.0), np.array([1.0, -2.0, 0.5], "float32")]
        opt1.apply(grads, [s1, v1])
        opt2.apply(grads[:1], [s2])
        opt3.apply(grads[1:], [v3])
    to_np = keras.ops.convert_to_numpy
    assert float(to_np(s1)) == pytest.approx(float(to_np(s2)), rel=1e-6)
    np.testing.assert_allclose(to_np(v1), to_np(v3), rtol=1e-6)
    assert ScalarLRSGD.from_config(opt1.get_config()).scalar_lr_multiplier == 0.1


def test_fixup_scalars_learn_10x_slower_by_default():
    """Fixup's reference code trains multipliers and biases at lr / 10."""
    assert run_model.scalar_lr(trainer.Config(normalization="fixup")) == 0.1
    assert run_model.scalar_lr(trainer.Config(normalization="fixup", scalar_lr_multiplier=1.0)) == 1.0
    assert run_model.scalar_lr(trainer.Config(normalization="skipinit")) == 1.0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(model="vgg"), "model must be one of"),
        (dict(normalization="groupnorm"), "normalization must be one of"),
        (dict(learning_rate=-0.1), "learning_rate"),
        (dict(batch_size=10, accumulation_steps=3), "divisible by accumulation_steps"),
        (dict(ghost_batch_size=16), "ghost_batchnorm"),
        (dict(schedule="cosine"), "schedule must be one of"),
        # NaN passes every comparison; counts past any plan were tracebacks or hangs (from Python, the sweep)
        (dict(mixup_alpha=float("nan")), "mixup_alpha must be a finite number"),
        (dict(normalization="ghost_batchnorm", ghost_batch_size=-3), "ghost_batch_size must be an integer from 1"),
        (dict(epochs=10**20), "epochs must be an integer from 1 to 1000000"),
        (dict(seed=-5), "seed must be an integer from 0 to 4294967295"),
        (dict(steps_per_epoch=10**9), "repeats the 4000 training examples over 10,000 times"),
    ],
)
def test_bad_configs_raise_value_errors(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        trainer.train(small_config(tmp_path, **kwargs))


def test_a_batch_larger_than_the_data_is_refused_also_with_steps_per_epoch(tmp_path):
    """It ran out of memory and segfaulted (exit 139) instead."""
    with pytest.raises(ValueError, match="batch_size 100000 exceeds the 4000 training examples"):
        trainer.train(small_config(tmp_path, batch_size=100000, steps_per_epoch=2))


def test_activation_memory_is_every_layer_output_and_refused_beyond_the_memory(monkeypatch, tmp_path):
    inputs = keras.Input((6, 6, 1))
    conv = keras.layers.Conv2D(3, 3, padding="same")(inputs)  # 108 per image
    pooled = keras.layers.GlobalAveragePooling2D()(conv)  # 3
    model = keras.Model(inputs, keras.layers.Dense(5)(pooled))  # 5
    assert memory.activation_bytes(model, 10) == 10 * (108 + 3 + 5) * 4
    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 10 * 116 * 4 - 1)
    with pytest.raises(ValueError, match="needs at least .* --ignore_memory_check runs it anyway"):
        memory.check_memory(model, 10)
    assert memory.check_memory(model, 9) is None
    assert "will likely be killed" in memory.check_memory(model, 10, ignore=True)
    # A refused run leaves no model_dir behind (it would hold only its lock file).
    with pytest.raises(ValueError, match="needs at least"):
        trainer.train(small_config(tmp_path, steps_per_epoch=2))
    assert not os.path.exists(tmp_path / "run")
    looped = apps.WideResNet(16, 1, input_shape=(8, 8, 1), classes=3, loop_blocks=True)
    unrolled = apps.WideResNet(16, 1, input_shape=(8, 8, 1), classes=3)
    assert memory.activation_bytes(looped, 1) <= memory.activation_bytes(unrolled, 1)
    assert memory.activation_bytes(looped, 1) >= 6 * 8 * 8 * 16  # each block's output at least


@pytest.mark.parametrize("kind", ["cifar", "imagenet", "constant"])
def test_schedule_follows_updates_not_micro_batches(kind):
    """With gradient accumulation, update u must use lr(u): after all updates
    of plain SGD with gradient 1, w = -sum_u lr(u) (SkipInit §3)."""
    steps_per_epoch, epochs, accumulation = 5, 4, 3
    schedule = schedules.PaperSchedule(kind, 0.5, steps_per_epoch, epochs)
    optimizer = ScalarLRSGD(learning_rate=schedule, momentum=0.0, gradient_accumulation_steps=accumulation)
    w = keras.Variable(np.zeros(1, "float32"))
    optimizer.build([w])
    updates = steps_per_epoch * epochs
    for micro in range(updates * accumulation):
        if micro % accumulation == 0:
            u = micro // accumulation
            assert float(optimizer.learning_rate) == pytest.approx(float(schedule(u)), rel=1e-6), u
        optimizer.apply([np.ones(1, "float32")], [w])
    expected = -sum(schedules.lr_at_epoch(kind, u / steps_per_epoch, 0.5, epochs) for u in range(updates))
    assert int(optimizer.iterations) == updates
    assert float(keras.ops.convert_to_numpy(w)[0]) == pytest.approx(expected, rel=1e-5)


@pytest.mark.heavy
def test_accumulation_logs_the_schedule_of_updates(tmp_path):
    """The case reported: --accumulation_steps=2 --epochs=2 logged 2.44e-05
    after epoch 1 (the end of training) instead of 0.025."""
    trainer.train(small_config(tmp_path, accumulation_steps=2, steps_per_epoch=3, epochs=2, learning_rate=0.05))
    rows = open(tmp_path / "run" / "history.csv").read().splitlines()
    lr = [float(row.split(",")[1]) for row in rows[1:]]
    assert lr == pytest.approx([schedules.lr_at_epoch("cifar", e, 0.05, 2) for e in (1, 2)], rel=1e-5)
    assert lr[0] == pytest.approx(0.025)


@pytest.mark.heavy
def test_epochs_longer_than_the_data_repeat_it(tmp_path):
    """steps_per_epoch beyond one pass: every epoch makes all its updates
    (the schedule counts them), on repeated, reshuffled data."""
    config = small_config(tmp_path, train_examples=96, batch_size=32, steps_per_epoch=7, epochs=2)
    results = trainer.train(config)
    model = keras.models.load_model(tmp_path / "run" / "model.keras")
    assert int(model.optimizer.iterations) == 14 and results["num_train"] == 96


@pytest.mark.heavy
@pytest.mark.parametrize("ghost,batch,note", [(None, 32, "each is one ghost batch"), (24, 64, "has 16 examples")])
def test_ghost_batches_with_remainders_train(tmp_path, capsys, ghost, batch, note):
    """Default flags with ghost_batchnorm (ghost 64, batch 32) failed; the layer
    normalizes a remainder as its own ghost batch, and train.py says so."""
    config = small_config(tmp_path, normalization="ghost_batchnorm", ghost_batch_size=ghost, batch_size=batch,
                          epochs=1, steps_per_epoch=2)
    assert trainer.train(config)["status"] == "completed"
    assert note in capsys.readouterr().out


# --- end to end --------------------------------------------------------------------


@pytest.mark.heavy
def test_training_learns_real_digits_end_to_end(tmp_path, capsys):
    """Two epochs of the decaying schedule on the embedded digits, WRN-10-1,
    with NF (Brock et al. 2021a: no normalization layer and no zero-init
    branch, so it is also the test that NF trains on real data). Seeds 0-4 on
    one machine: test top-1 0.88-0.91, final training cross-entropy 0.45-0.62
    (from ln 10 = 2.30); one constant-lr epoch gave 0.58-0.78, too close to
    any threshold. BatchNorm (momentum 0.9, lr 0.1) gave 0.941-0.961 and
    0.23-0.25 at the same time. The default model (SkipInit alpha = 0) is not
    used here: it leaves its initial plateau after a seed-dependent time (3
    epochs at lr 0.05, seeds 0-4: 0.88, 0.75, 0.72, 0.88, 0.10), so no
    threshold on it holds on every machine. fit runs once per epoch; the
    progress display must still read 'Epoch k/N'."""
    config = small_config(tmp_path, epochs=2, normalization="nf", learning_rate=0.05, verbose=2)
    results = trainer.train(config)
    out = capsys.readouterr().out
    assert "Epoch 1/2" in out and "Epoch 2/2" in out
    assert results["status"] == "completed"
    assert results["train_cross_entropy"] < 1.0, results
    assert results["test_top1"] > 0.7, results  # chance: 0.1
    saved = json.load(open(tmp_path / "run" / "results.json"))
    assert saved["test_top1"] == pytest.approx(results["test_top1"])
    assert saved["config"]["normalization"] == "nf"
    assert os.listdir(tmp_path / "run" / "tensorboard")
    history = open(tmp_path / "run" / "history.csv").read().splitlines()
    assert history[0].startswith("epoch,lr,") and len(history) == 3


@pytest.mark.heavy
def test_tensorboard_scalars_are_written_without_tensorflow(tmp_path):
    """Each epoch's metrics and learning rate as TensorBoard scalars in Keras'
    layout (train/, validation/, epoch_<metric>, step = epoch), written by a
    process in which TensorFlow cannot be imported (a JAX user's: Keras needs
    JAX there, its numpy backend too)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    require_module("jax", 'pip install -e ".[jax]"')

    script = f"""
import os, sys, types
sys.modules["tensorflow"] = None  # importing it fails
os.environ["KERAS_BACKEND"] = "jax"
from keras_skipinit.training.callbacks import EpochScalars

scalars = EpochScalars({str(tmp_path)!r})
scalars.set_model(types.SimpleNamespace(optimizer=types.SimpleNamespace(learning_rate=0.25)))
scalars.on_epoch_end(0, {{"loss": 2.0, "top1": 0.5, "val_loss": 1.5, "val_top1": 0.625}})
scalars.on_epoch_end(1, {{"loss": 1.0, "top1": 0.75, "val_loss": 1.25, "val_top1": 0.75}})
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-2000:]
    read = {}
    for split in ("train", "validation"):
        events = EventAccumulator(str(tmp_path / split))
        events.Reload()
        read[split] = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert read["train"] == {"epoch_loss": [(0, 2.0), (1, 1.0)], "epoch_top1": [(0, 0.5), (1, 0.75)],
                             "epoch_learning_rate": [(0, 0.25), (1, 0.25)]}
    assert read["validation"] == {"epoch_loss": [(0, 1.5), (1, 1.25)], "epoch_top1": [(0, 0.625), (1, 0.75)]}


@pytest.mark.heavy
def test_reported_metrics_are_those_of_the_final_model_named_by_split(tmp_path):
    """results.json reuses the validation of the last epoch (same weights)
    instead of evaluating the test split a second time."""
    results = trainer.train(small_config(tmp_path, epochs=2, steps_per_epoch=3))
    model = keras.models.load_model(tmp_path / "run" / "model.keras")
    model.compile(metrics=[keras.metrics.CategoricalAccuracy(name="top1")], loss="categorical_crossentropy")
    evaluated = model.evaluate(pipelines.eval_pipeline(data_lib.load(data_lib.EMBEDDED), 32), verbose=0, return_dict=True)
    assert results["test_top1"] == pytest.approx(evaluated["top1"], abs=1e-7)
    # Named by split: eval_* always, test_* only on the test set; older files still read.
    assert {k: results[f"eval_{k}"] for k in ("top1", "top5", "cross_entropy")} == {
        k: results[f"test_{k}"] for k in ("top1", "top5", "cross_entropy")}
    held_out = trainer.train(small_config(tmp_path, epochs=1, steps_per_epoch=2, validation_examples=500,
                                           model_dir=str(tmp_path / "held_out")))
    assert held_out["eval_split"] == "validation" and held_out["eval_top1"] is not None
    assert held_out["backends"] == [BACKEND]
    assert not [k for k in held_out if k.startswith("test_")]


@pytest.mark.heavy
def test_a_larger_evaluation_batch_evaluates_the_same_model_alike(tmp_path, monkeypatch):
    """--eval_batch_size: the evaluation's batches have that size, and the same trained weights score the
    same (up to float rounding) as with the training batch's."""
    sizes = []
    for feed in (pipelines.TFData, pipelines.NumPy):  # the run's feed, whichever the backend chose
        monkeypatch.setattr(feed, "eval", lambda self, batch_size, _eval=feed.eval, **kw: (
            sizes.append(batch_size), _eval(self, batch_size, **kw))[1])
    common = dict(epochs=1, steps_per_epoch=2, normalization="skipinit", alpha_init="one", learning_rate=0.05)
    small = trainer.train(small_config(tmp_path / "a", **common))
    large = trainer.train(small_config(tmp_path / "b", eval_batch_size=500, **common))
    assert sizes == [trainer.Config().batch_size, 500]
    assert large["eval_top1"] == pytest.approx(small["eval_top1"], abs=1e-3)  # 1 image in 1,000
    assert large["eval_cross_entropy"] == pytest.approx(small["eval_cross_entropy"], rel=1e-4)


@pytest.mark.heavy
def test_a_run_chooses_its_feed_once(tmp_path, monkeypatch):
    """Issue 88.4: a run's feed (tf.data or NumPy, `pipelines.Feed`) is chosen once; every epoch's batches and
    each evaluation come from it (the choice was asked again for every epoch and evaluation)."""
    asked = []
    numpy_feed = data_lib.numpy_feed
    monkeypatch.setattr(data_lib, "numpy_feed", lambda dataset: asked.append(dataset.name) or numpy_feed(dataset))
    results = trainer.train(small_config(tmp_path, epochs=2, steps_per_epoch=2))
    assert results["epochs_completed"] == 2 and asked == [data_lib.EMBEDDED]


@pytest.mark.heavy
def test_gradient_accumulation_equals_one_large_batch(tmp_path):
    common = dict(normalization="skipinit", alpha_init="one", epochs=1, steps_per_epoch=2, schedule="constant",
                  learning_rate=0.05, batch_size=32)
    trainer.train(small_config(tmp_path / "a", **common))
    trainer.train(small_config(tmp_path / "b", accumulation_steps=4, **common))
    for a, b in zip(final_weights(tmp_path / "a" / "run"), final_weights(tmp_path / "b" / "run")):
        np.testing.assert_allclose(a, b, atol=2e-5)


@tf_only
def test_mirrored_strategy_is_shared_by_runs_in_one_process():
    """A second MirroredStrategy reuses the first one's collective instance
    keys and aborts the next all-reduce of another size (tensorflow#62790):
    training the looped and the unrolled mirrored models in one pytest process
    failed so in CI."""
    first = distribute.make("mirrored")
    assert first.replicas == 2 and distribute.make("mirrored").strategy is first.strategy


def test_training_asks_one_distribution_interface_and_switches_on_no_backend():
    """Issue 88.6: what differs between TensorFlow and JAX in training is one interface
    (`distribute.Distribution`, an implementation per backend, chosen in one place); no module of
    training/ but distribute.py compares backends, and each implementation answers every member."""
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "keras_skipinit", "training")
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") and name != "distribute.py":
            with open(os.path.join(root, name), encoding="utf-8") as f:
                assert not re.search(r"backend\(\)\s*(==|!=|in\b)|JaxDataParallel|isinstance\([^)]*Strategy", f.read()), name
    members = {"scope", "replicas", "model_batch", "on_gpu", "make"}
    for implementation in (distribute.TensorFlow, distribute.Jax):
        assert issubclass(implementation, distribute.Distribution)
        assert all(member in vars(implementation) for member in members), implementation
    assert distribute.current().name == BACKEND
    distribution = distribute.make("auto")
    assert distribution.chief and distribution.workers == 1 and not distribution.pads_evaluation
    # TensorFlow: a replica's share of the batch (the 2 logical CPUs of conftest are not used by "auto");
    # JAX: the global batch, one program over every device (synchronized BatchNorm).
    assert distribution.model_batch(64) == (64 // distribution.replicas if BACKEND == "tensorflow" else 64)


# TensorFlow replicas normalize their own part of the batch: ghost batches of
# the per-replica size make them equal one device. JAX normalizes the global
# batch (synchronized BatchNorm), so plain BatchNorm is equal there too. The
# ghost case trains the looped form (--loop_blocks, depth 16: each group's
# second block runs in the loop), the graph that differs most from one device's.
TWO_DEVICE_CASES = [("ghost_batchnorm", 8, True)] + ([("batchnorm", None, False)] if BACKEND == "jax" else [])


@pytest.mark.heavy
@pytest.mark.parametrize("normalization,ghost,loop_blocks", TWO_DEVICE_CASES)
def test_two_devices_equal_one_device(tmp_path, normalization, ghost, loop_blocks):
    """MirroredStrategy over 2 logical CPUs (TensorFlow) or DataParallel over
    2 host devices (JAX, XLA_FLAGS=--xla_force_host_platform_device_count=2)."""
    common = dict(normalization=normalization, ghost_batch_size=ghost, epochs=1, steps_per_epoch=2,
                  schedule="constant", learning_rate=0.05, batch_size=32, loop_blocks=loop_blocks,
                  depth=16 if loop_blocks else 10)
    one = trainer.train(small_config(tmp_path / "one", strategy="one_device", **common))
    two = trainer.train(small_config(tmp_path / "two", strategy="mirrored", **common))
    assert (one["replicas"], two["replicas"]) == (1, 2)
    assert one["backend"] == two["backend"] == BACKEND
    moved = 0
    fresh = run_model.build_model(trainer.Config(**{**SMALL, **common}), data_lib.load(data_lib.EMBEDDED))
    initial = [keras.ops.convert_to_numpy(w) for w in fresh.weights]  # the same seed: the runs' initialization
    for a, b, w0 in zip(final_weights(tmp_path / "one" / "run"), final_weights(tmp_path / "two" / "run"), initial):
        np.testing.assert_allclose(a, b, atol=5e-5)
        moved += not np.allclose(a, w0)
    assert moved > 10  # the runs trained


@pytest.mark.heavy
def test_tfds_training_path_with_mock_cifar10(tmp_path, mock_tfds):
    with mock_tfds(num_examples=64):
        results = trainer.train(small_config(tmp_path, dataset="cifar10", epochs=1, batch_size=16, mixup_alpha=0.7))
    assert results["status"] == "completed" and results["num_train"] == 64
    assert results["config"]["dataset"] == "cifar10"


@pytest.mark.heavy
def test_divergence_is_recorded_not_crashed(tmp_path, capsys):
    status = train_py_in_process("--depth=10", "--width=1", "--normalization=none", "--learning_rate=1e6",
                                 "--epochs=2", "--steps_per_epoch=20", "--verbose=0", f"--model_dir={tmp_path}/run")
    assert status == 3 and "diverged" in capsys.readouterr().out
    text = (tmp_path / "run" / "results.json").read_text()
    assert "NaN" not in text  # strict JSON: a non-finite loss is written as null
    results = json.loads(text)
    assert results["status"] == "diverged" and results["diverged_at"]["epoch"] == 0
    assert results["epochs_completed"] == 0


BAD_FLAGS = [("--model=vgg", "model"), ("--learning_rate=-1", "learning_rate"), ("--normalization=layernorm", "normalization"),
             ("--alpha_init=half", "alpha_init"), ("--shortcut=C", "shortcut"), ("--epochs=0", "epochs"),
             ("--no_such_flag=1", "no_such_flag"), ("stray", "unexpected arguments: stray"),  # issue 46.7: usage, exit 1
             ("--epochs=99999999999999999999", "from 1 to 1000000"), ("--mixup_alpha=nan", "finite"),
             ("--learning_rate=inf", "finite"), ("--ghost_batch_size=-3", "ghost_batch_size"),
             ("--seed=-5", "seed"), ("--steps_per_epoch=10000000000000", "steps_per_epoch"),
             # before Keras loads, where they came 6-13 s after; --image_size was ignored but recorded (issue 91)
             ("--depth=17", "WideResNet depth must be 6k+4"),
             ("--model_dir=", "model_dir is empty (an unset shell variable?)"),
             ("--image_size=40", "--image_size is read for a folder --dataset only; mnist_embedded has its own")]


@pytest.mark.heavy
def test_cli_bad_flags_give_one_line_errors():
    """Exit status 2 and one line for every bad flag (issue 32.6: absl's own
    flag errors were 'FATAL Flags parsing error', status 1). The cases share
    one process; test_run_dir starts train.py itself on a bad flag."""
    cases = BAD_FLAGS + [("--dataset=./no/such/folder", "no such folder")]
    results = run_cli_cases("train", [[flag, "--epochs=1"] for flag, _ in cases] + [["--help"]], ROOT)
    for (flag, match), (status, _, err) in zip(cases, results):
        assert status == 2 and "Traceback" not in err and "FATAL" not in err, (flag, err)
        (line,) = [line for line in err.splitlines() if "error:" in line]
        assert match in line and line.startswith("train.py: error:"), (flag, line)
    status, out, _ = results[-1]  # issue 46.7: --help listed no flag and exited 1
    assert status == 0 and "--normalization" in out and "--learning_rate" in out and "--model_dir" in out


@pytest.mark.heavy
def test_help_and_flag_refusals_come_before_keras_loads(tmp_path):
    """--help and bad flags waited for TensorFlow's import (7 s idle, 83-105 s
    under load). The commands' flags are made from `spec` without Keras, so they
    are answered in a process where importing Keras or TensorFlow fails, by the
    same flags whose answers the test above checks after the import."""
    for name in ("keras", "tensorflow"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} was imported')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "KERAS_BACKEND": "tensorflow"}
    cases = [(["train.py", flag, "--epochs=1"], 2, match) for flag, match in BAD_FLAGS] + [
        (["train.py", "--help"], 0, "--learning_rate"), (["-m", "export", "--format=litert"], 2, "--source"),
        (["-m", "export", "--helpfull"], 0, "--base_path"), (["-m", "keras_skipinit.sweep", "--help"], 0, "--preset"),
        (["-m", "keras_skipinit.analysis", "-h"], 0, "--function_change"),
        (["-m", "keras_skipinit.sweep.quantization", "--help"], 0, "--check_images"),
        (["-m", "keras_skipinit.predict", "--help"], 0, "--top_k"), (["-m", "keras_skipinit.predict", "x.png"], 2, "--source"),
        (["-m", "keras_skipinit.sweep", "--epochs=0"], 2, "--epochs"), (["-m", "keras_skipinit.sweep", "--bogus"], 2, "--bogus"),
        # checks past the parser's own (sweep: parse_args's; analysis: its method list), before Keras too
        (["-m", "keras_skipinit.sweep", "--methods=skipnit"], 2, "--methods: unknown ['skipnit']"),
        (["-m", "keras_skipinit.sweep", "--depths=16,17"], 2, "--depths: WideResNet depth must be 6k+4"),
        # a missing source or folder: said here, in under a second, not 8 s later after Keras (issue 89.5)
        (["train.py", "--dataset=./no/such/folder"], 2, "--dataset=./no/such/folder: no such folder"),
        (["train.py", "--init_from=nowhere.keras"], 2, "--init_from=nowhere.keras: no such train.py model_dir"),
        (["-m", "export", "--source=/nowhere.keras"], 2, "no such model file or model_dir"),
        (["-m", "keras_skipinit.predict", "--source=/nowhere.keras", "x.png"], 2, "no such model file or model_dir"),
        (["-m", "keras_skipinit.analysis", "--normalizations=layernorm"], 2, "'layernorm': not one of"),
        # an unknown flag named first, with the closest one, in every command (issue 88.2: predict said that
        # --source was required, export that it must not be None; the sweep took --epoch as --epochs)
        (["train.py", "--learningrate=0.1"], 2, "unknown flag --learningrate (did you mean --learning_rate?)"),
        (["-m", "export", "--sorce=x"], 2, "unknown flag --sorce (did you mean --source?)"),
        (["-m", "keras_skipinit.predict", "--sorce=x", "x.png"], 2, "unknown flag --sorce (did you mean --source?)"),
        (["-m", "keras_skipinit.sweep", "--epoch=1"], 2, "unknown flag --epoch (did you mean --epochs?)"),
        (["-m", "keras_skipinit.analysis", "--depht=3"], 2, "unknown flag --depht (did you mean --depth?)")]
    for argv, status, match in cases:
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
        assert proc.returncode == status, (argv, proc.stderr[-2000:])
        if status:
            (line,) = proc.stderr.splitlines()
            assert match in line and line.startswith(("train.py: error:", "export: error:", "python -m keras_skipinit.sweep: error:",
                                                 "python -m keras_skipinit.predict: error:",
                                                 "python -m keras_skipinit.analysis: error:")), (argv, line)
        else:
            assert match in proc.stdout and not proc.stderr, (argv, proc.stderr[-2000:])


@pytest.mark.heavy
def test_a_method_added_by_one_record_is_a_flag_choice_and_trains(tmp_path):
    """Nothing is generated from the method table: in a scratch copy of the
    package, one `Method` record with a mechanism of its own (a hook scaling
    each branch by a fixed 1/2) is listed by train.py --help and accepted by
    --normalization before Keras loads, a run of it builds and trains, and the
    sweep's --methods takes it; no other file touched."""
    copy = tmp_path / "copy"
    shutil.copytree(os.path.join(ROOT, "keras_skipinit"), copy / "keras_skipinit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "train.py"), copy)
    methods = copy / "keras_skipinit" / "normalization.py"
    text = methods.read_text()
    assert text.count('    "none": Method(') == 1
    methods.write_text(text.replace('    "none": Method(', '    "halved": Method("Branch halved", "a test", hooks={'
                                    '"branch_end": lambda ops, x, name: __import__("keras").layers.Rescaling('
                                    '0.5, name=name + "_half")(x)}),\n    "none": Method('))
    fake = tmp_path / "fake"
    for name in ("keras", "tensorflow"):
        (fake / name).mkdir(parents=True)
        (fake / name / "__init__.py").write_text(f"raise ImportError('{name} was imported')\n")
    env = {**os.environ, "PYTHONPATH": f"{fake}{os.pathsep}{copy}", "KERAS_BACKEND": "tensorflow"}
    helped = subprocess.run([sys.executable, "train.py", "--help"], capture_output=True, text=True, env=env, cwd=copy)
    assert helped.returncode == 0 and "halved" in helped.stdout, helped.stderr[-2000:]
    refused = subprocess.run([sys.executable, "train.py", "--normalization=halved", "--epochs=0"], capture_output=True,
                             text=True, env=env, cwd=copy)  # the method passes; the next bad flag is the one named
    assert refused.returncode == 2 and "--epochs" in refused.stderr and "normalization" not in refused.stderr
    env["PYTHONPATH"] = str(copy)
    model_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "train.py", "--normalization=halved", "--depth=10", "--epochs=1",
                           "--steps_per_epoch=2", "--train_examples=64", "--verbose=0", f"--model_dir={model_dir}"],
                          capture_output=True, text=True, env=env, cwd=copy, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((model_dir / "results.json").read_text())
    assert results["config"]["normalization"] == "halved" and results["status"] == "completed"
    swept = subprocess.run([sys.executable, "-m", "keras_skipinit.sweep", "--methods=halved,bogus",
                            f"--out={tmp_path / 'sweep'}"], capture_output=True, text=True, env=env, cwd=copy)
    assert swept.returncode == 2 and "unknown ['bogus']" in swept.stderr, swept.stderr[-2000:]


@pytest.mark.heavy
def test_killed_run_resumes_without_losing_finished_epochs(tmp_path, capsys):
    model_dir = tmp_path / "killed"
    flags = ["--depth=10", "--width=1", "--epochs=2", "--steps_per_epoch=12", "--checkpoint_steps=3",
             "--schedule=constant", "--learning_rate=0.02", "--verbose=0"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "train.py", *flags, f"--model_dir={model_dir}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoints = Checkpoint(str(model_dir / "checkpoint"))
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        newest = checkpoints.all()[:1]
        if newest and newest[0][0] == 1 and newest[0][1] > 0:  # (epoch, step) of a complete checkpoint
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "run finished before it could be killed mid-epoch"
    assert not (model_dir / "results.json").exists()
    assert len((model_dir / "history.csv").read_text().splitlines()) == 2  # header + epoch 1

    assert train_py_in_process(*flags, f"--model_dir={model_dir}") == 0  # the resume: in this process
    assert "Resuming from epoch 2" in capsys.readouterr().out
    epochs = [line.split(",")[0] for line in (model_dir / "history.csv").read_text().splitlines()[1:]]
    assert epochs == ["1", "2"]
    assert json.loads((model_dir / "results.json").read_text())["epochs_completed"] == 2

    # Exactly where it stopped: same weights as a run that was never killed (the same flags, in this process).
    trainer.train(small_config(tmp_path / "straight", epochs=2, steps_per_epoch=12, checkpoint_steps=3,
                                schedule="constant", learning_rate=0.02, strategy="one_device"))
    for a, b in zip(final_weights(model_dir), final_weights(tmp_path / "straight" / "run")):
        np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.heavy
def test_ctrl_c_checkpoints_the_step_reached_and_says_how_to_resume(tmp_path):
    """Issue 46.6: SIGINT mid-epoch: one line naming the epoch and step, exit
    130, a checkpoint at that step (no results.json), no traceback; the same
    command resumes from it."""
    model_dir = tmp_path / "run"
    flags = ["--depth=10", "--width=1", "--epochs=1", "--steps_per_epoch=400", "--schedule=constant", "--verbose=0",
             f"--model_dir={model_dir}"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "train.py", *flags], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (model_dir / "tensorboard" / "train").exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "interrupted" in line]
    assert "interrupted at epoch 1, step " in line and "of 400" in line and "run the same command to resume" in line
    ((epoch, step, _),) = Checkpoint(str(model_dir / "checkpoint")).all()
    assert epoch == 0 and 0 < step < 400 and f"step {step} of 400" in line
    assert not (model_dir / "results.json").exists()


@pytest.mark.heavy
def test_a_signal_in_the_final_evaluation_completes_the_run_and_is_returned(tmp_path, monkeypatch, capsys):
    """Ctrl-C after the last step (its evaluation): the run completes and
    writes its results, and says the signal came (the sweep then stops, and
    train.py exits 130 instead of going on to --export_dir)."""
    from keras_skipinit.training import callbacks
    end = callbacks.EpochScalars.on_epoch_end

    def interrupted_here(self, epoch, logs=None):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        end(self, epoch, logs)

    monkeypatch.setattr(callbacks.EpochScalars, "on_epoch_end", interrupted_here)
    flags = [*[f"--{k}={v}" for k, v in SMALL.items()], "--epochs=1", "--steps_per_epoch=2",
             f"--model_dir={tmp_path / 'run'}"]
    assert train_py_in_process(*flags) == 130
    assert "interrupted as the run completed; its results are kept" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "completed"


def test_a_signal_before_the_first_step_says_nothing_was_saved(tmp_path, monkeypatch, capsys):
    """Ctrl-C while the data loads (TFDS preparing a dataset: a minute):
    there is no checkpoint, and the line says so (it said 'checkpoint saved')."""
    load = trainer.data_lib.load

    def interrupted_while_loading(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        return load(*args, **kwargs)

    monkeypatch.setattr(trainer.data_lib, "load", interrupted_while_loading)
    assert train_py_in_process(*[f"--{k}={v}" for k, v in SMALL.items()], f"--model_dir={tmp_path / 'run'}") == 130
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "interrupted" in line]
    assert "before the first step (nothing trained, no checkpoint)" in line and "checkpoint saved" not in line


@pytest.mark.parametrize("verbose", [1, 2])
def test_the_progress_counts_a_resumed_epoch_from_its_step_and_names_the_test_split(verbose, capsys):
    """A resumed epoch's bar counts 6..8 of 8 (it counted 1..3 of 3); the
    test split's metrics are test_*, not Keras' val_*; the bar says when it
    evaluates; a line per epoch (no terminal) also says where a long epoch is."""
    from keras_skipinit.training.callbacks import EpochProgress

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="sgd", loss="categorical_crossentropy", metrics=[keras.metrics.CategoricalAccuracy("top1")])
    x, y = np.ones((12, 2), "float32"), np.eye(2)[[0, 1] * 6]
    model.fit(x, y, batch_size=4, epochs=3, initial_epoch=2, validation_data=(x, y), verbose=verbose,
              callbacks=[EpochProgress(3, first_step=5, steps=8, eval_split="test", every_s=0)])
    out = capsys.readouterr().out
    assert "Epoch 3/3" in out and "test_top1" in out and "val_top1" not in out
    if verbose == 2:
        assert "  step 6/8" in out and "  step 8/8" in out
    else:
        assert "8/8" in out and "evaluating on the test split" in out


def test_a_signal_is_held_until_the_step_ends_a_repeat_is_one_event_and_a_second_one_acts(monkeypatch):
    """The first SIGTERM is held for the step's end; the same signal again at once is the same event (GNU
    timeout sends it to the command and then to its process group: the run died unsaved); one later reaches
    the handler from before (a second Ctrl-C or SIGTERM stops at once)."""
    from keras_skipinit.training import callbacks
    before, reached = signal.getsignal(signal.SIGTERM), []

    def reach(signum, frame):
        reached.append(signum)

    signal.signal(signal.SIGTERM, reach)
    monkeypatch.setattr(callbacks.Interrupt, "REPEAT_S", 0.5)
    try:
        with callbacks.Interrupt() as interrupt:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # timeout's second delivery
            time.sleep(0.05)
            assert interrupt.signal == signal.SIGTERM and reached == []
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert reached == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is reach
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.heavy
@tf_only  # the run was fed by tf.data: its mid-epoch checkpoint resumes on TensorFlow
def test_a_run_made_before_the_redesign_resumes_to_what_todays_code_trains_straight(tmp_path):
    """Issue 88: old runs still resume. tests/data/run_044eebc is a run made by the code before the redesign
    (044eebc; its make.py), killed right after its mid-epoch checkpoint (epoch 2, step 2 of 4; regularized
    SkipInit: dropout's random state travels in it). Today's code resumes it from that step, and its final
    weights, step count and history are those of the same run trained straight by today's code (to float
    rounding)."""
    kwargs = dict(epochs=2, steps_per_epoch=4, checkpoint_steps=2, schedule="cifar", learning_rate=0.05,
                  normalization="regularized_skipinit")
    old = tmp_path / "old" / "run"
    shutil.copytree(os.path.join(ROOT, "tests", "data", "run_044eebc"), old, ignore=shutil.ignore_patterns("*.py"))
    resumed = trainer.train(small_config(tmp_path / "old", **kwargs))
    straight = trainer.train(small_config(tmp_path / "straight", **kwargs))
    assert resumed["status"] == straight["status"] == "completed" and resumed["epochs_completed"] == 2
    model = keras.models.load_model(os.path.join(old, run_dir.MODEL))
    assert int(model.optimizer.iterations) == 8
    # Equal up to float rounding: the old run's first steps ran in another process, whose thread count may sum
    # in another order (here 2e-7 apart; a step missed or taken twice moves weights by ~1e-2)
    for mine, theirs in zip(final_weights(old), final_weights(tmp_path / "straight" / "run")):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-5)
    rows, expected = run_dir.read_history(str(old)), run_dir.read_history(str(tmp_path / "straight" / "run"))
    assert [row["epoch"] for row in rows] == [1, 2] and [row.keys() for row in rows] == [r.keys() for r in expected]
    for row, other in zip(rows, expected):
        assert row == pytest.approx(other, rel=1e-4), (row, other)


@pytest.mark.heavy
def test_a_run_killed_anywhere_resumes_to_what_the_run_never_stopped_records(tmp_path, monkeypatch, capsys):
    """Killed between the last epoch's checkpoint and its history row (issue
    45.1), right after a mid-epoch checkpoint, or after an earlier version's
    checkpoint at an epoch's last step (issue 32.1: the resume applied a 9th
    update; made here: epoch 1's checkpoint saved as (epoch 0, step 4 of 4)
    without state, then a kill): the resumed run's weights, learning rate,
    history.csv (every epoch, training metrics over the whole epoch) and
    train_cross_entropy are the uninterrupted run's, and its wall time adds
    up both processes (the old checkpoint kept neither the epoch's metrics
    nor the time). No checkpoint is taken at an epoch's last step. With
    dropout (regularized SkipInit): its masks are random draws, and the
    resumed run draws the uninterrupted run's (they differed before the
    checkpoints held the random state: weights 0.1 apart)."""
    kwargs = dict(epochs=2, steps_per_epoch=4, checkpoint_steps=2, schedule="cifar", learning_rate=0.05,
                  normalization="regularized_skipinit")
    straight = trainer.train(small_config(tmp_path / "straight", **kwargs))
    expected = run_dir.read_history(str(tmp_path / "straight" / "run"))
    straight_weights = final_weights(tmp_path / "straight" / "run")

    class Killed(Exception):
        pass

    write_history, save = run_dir.write_history, Checkpoint.save
    saved, saved_at = [], []  # (epoch, step) of each save, and when it began (the time a checkpoint records)

    def save_and_note(self, model, epoch, step, **state):
        saved.append((epoch, step))
        saved_at.append(time.time())
        save(self, model, epoch, step, **state)

    def kill_before_the_last_row(model_dir, rows):
        if len(rows) == 2:
            raise Killed
        write_history(model_dir, rows)

    def kill_after_mid_epoch_checkpoint(self, model, epoch, step, **state):
        save_and_note(self, model, epoch, step, **state)
        if (epoch, step) == (1, 2):
            raise Killed

    def kill_after_an_old_last_step_checkpoint(self, model, epoch, step, **state):
        if (epoch, step) != (1, 0):
            return save_and_note(self, model, epoch, step, **state)
        save_and_note(self, model, 0, 4)  # as that version saved it: no state
        raise Killed

    faults = {"last_row": (run_dir, "write_history", kill_before_the_last_row),
              "mid_epoch": (Checkpoint, "save", kill_after_mid_epoch_checkpoint),
              "old_last_step": (Checkpoint, "save", kill_after_an_old_last_step_checkpoint)}
    for name, (owner, attribute, fault) in faults.items():
        config = small_config(tmp_path / name, **kwargs)
        saved.clear()
        monkeypatch.setattr(Checkpoint, "save", save_and_note)
        monkeypatch.setattr(owner, attribute, fault)
        started = time.time()
        with pytest.raises(Killed):
            trainer.train(config)
        killed_s = saved_at[-1] - started  # up to its last checkpoint
        assert (0, 4) not in saved[:-1] and saved[0] == (0, 2), (name, saved)
        monkeypatch.undo()
        recorded_at, results_record = [], run_dir.results_record  # when the resumed run's time is taken

        def note_results(*args, **kwargs):
            recorded_at.append(time.time())
            return results_record(*args, **kwargs)

        monkeypatch.setattr(run_dir, "results_record", note_results)
        started = time.time()
        capsys.readouterr()
        resumed = trainer.train(config)
        resumed_s = recorded_at[-1] - started  # not the model's save after it (over 1 s on a loaded machine)
        monkeypatch.undo()
        if name == "last_row":  # its last checkpoint is the run's end: nothing is resumed, the rest is done
            assert "Every epoch was trained" in capsys.readouterr().out
        model = keras.models.load_model(os.path.join(config.model_dir, run_dir.MODEL))
        assert int(model.optimizer.iterations) == 8, name
        for a, b in zip(final_weights(config.model_dir), straight_weights):
            np.testing.assert_allclose(a, b, atol=1e-5, err_msg=name)
        assert resumed["final_lr"] == pytest.approx(straight["final_lr"]), name
        with open(os.path.join(config.model_dir, run_dir.HISTORY)) as f:
            assert len({len(line.split(",")) for line in f.read().splitlines()}) == 1, name  # no ragged rows
        rows = run_dir.read_history(config.model_dir)
        assert [row["epoch"] for row in rows] == [1, 2], name
        for row, want in zip(rows, expected):
            # The old checkpoint kept no training metrics: that epoch's row has its validation and lr only.
            keys = row.keys() if (name, row["epoch"]) == ("old_last_step", 1) else want.keys()
            assert row.keys() == keys and {"val_top1", "lr"} <= keys, name
            for key in keys:  # loss, cross_entropy, top1, top5 over all the epoch's steps; validation; lr
                assert row[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (name, row["epoch"], key)
        assert resumed["train_cross_entropy"] == pytest.approx(straight["train_cross_entropy"], rel=1e-5), name
        if name != "old_last_step":  # that checkpoint records no time
            assert resumed["wall_time_s"] > killed_s + resumed_s - 1.0, (name, resumed["wall_time_s"], killed_s)


def _free_ports(n):
    import socket

    sockets = [socket.socket() for _ in range(n)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


@pytest.mark.heavy
def test_two_worker_run_on_localhost_equals_one_device(tmp_path):
    """Two processes on localhost, MultiWorkerMirroredStrategy from TF_CONFIG
    or, on JAX, keras.distribution.initialize from KERAS_DISTRIBUTION_*:
    gradients are all-reduced (same weights as one device on the same global
    batch), the chief writes model_dir and the other worker leaves nothing
    behind. The 1,000 evaluation images are not a whole number of batches of
    16 (on JAX they are padded with weight-0 copies: same metrics)."""
    flags = ["--depth=10", "--width=1", "--alpha_init=one", "--epochs=1", "--steps_per_epoch=3", "--batch_size=16",
             "--schedule=constant", "--learning_rate=0.05", "--verbose=0", f"--model_dir={tmp_path / 'mw'}"]
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    procs = []
    for index in range(2):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
        if BACKEND == "jax":
            env.update(KERAS_DISTRIBUTION_NUM_PROCESSES="2", KERAS_DISTRIBUTION_PROCESS_ID=str(index),
                       KERAS_DISTRIBUTION_JOB_ADDRESSES=",".join(workers))
        else:
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        procs.append(subprocess.Popen([sys.executable, "train.py", *flags], cwd=ROOT, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [proc.communicate(timeout=400) for proc in procs]
    for proc, (out, err) in zip(procs, outs):
        assert proc.returncode == 0, err[-3000:]
        assert "ran out of data" not in err, err[-3000:]  # issue 32.7: Keras' warning at the evaluation's end
    assert "Test accuracy" in outs[0][0] and "the chief writes" in outs[1][0]
    results = json.loads((tmp_path / "mw" / "results.json").read_text())
    devices = 2 * distribute.make("auto").replicas if BACKEND == "jax" else 2
    assert (results["replicas"], results["workers"], results["chief"]) == (devices, 2, True)

    reference = small_config(tmp_path, alpha_init="one", epochs=1, steps_per_epoch=3, batch_size=16,
                             schedule="constant", learning_rate=0.05, strategy="one_device")
    expected = trainer.train(reference)
    for a, b in zip(final_weights(tmp_path / "mw"), final_weights(tmp_path / "run")):
        np.testing.assert_allclose(a, b, atol=1e-5)
    for metric in ("test_top1", "test_top5", "test_cross_entropy"):
        assert results[metric] == pytest.approx(expected[metric], abs=1e-5), metric


@pytest.mark.parametrize("env,words", [
    (dict(NUM_PROCESSES="0"), "NUM_PROCESSES must be a positive integer"),
    (dict(NUM_PROCESSES="-3"), "NUM_PROCESSES must be a positive integer"),
    (dict(PROCESS_ID="abc"), "PROCESS_ID must be an integer from 0 to 1"),
    (dict(PROCESS_ID="2"), "PROCESS_ID must be an integer from 0 to 1"),
    (dict(JOB_ADDRESSES="localhost"), "must be host:port"),
    (dict(JOB_ADDRESSES="localhost:abc"), "must be host:port"),
    (dict(JOB_ADDRESSES="a:1,b:2,c:3"), "the coordinator, or all 2 processes"),
])
def test_bad_process_variables_name_the_variable(env, words, monkeypatch):
    """Issue 32.7: they trained one process silently, or failed in jax.distributed with a traceback."""
    good = {"NUM_PROCESSES": "2", "PROCESS_ID": "1", "JOB_ADDRESSES": "localhost:1234"}
    for name, value in {**good, **env}.items():
        monkeypatch.setenv(f"KERAS_DISTRIBUTION_{name}", value)
    with pytest.raises(ValueError, match=words):
        distribute.process_settings(distribute._jax_processes())
    for name, value in {**good, "PROCESS_ID": "0", "JOB_ADDRESSES": "h:1,h:2"}.items():
        monkeypatch.setenv(f"KERAS_DISTRIBUTION_{name}", value)
    assert distribute.process_settings(distribute._jax_processes()) == (0, "h:1", 300)


def test_multi_worker_without_a_cluster_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="TF_CONFIG" if BACKEND == "tensorflow" else "KERAS_DISTRIBUTION_NUM_PROCESSES"):
        trainer.train(small_config(tmp_path, strategy="multi_worker"))
    if BACKEND == "jax":  # an incomplete process set-up is named before jax.distributed waits for a coordinator
        monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "2")
        monkeypatch.delenv("KERAS_DISTRIBUTION_PROCESS_ID", raising=False)
        monkeypatch.setenv("KERAS_DISTRIBUTION_JOB_ADDRESSES", "localhost:1")
        with pytest.raises(ValueError, match="also needs KERAS_DISTRIBUTION_PROCESS_ID in every process"):
            trainer.train(small_config(tmp_path))
        with pytest.raises(ValueError, match="one_device contradicts KERAS_DISTRIBUTION_NUM_PROCESSES=2"):
            trainer.train(small_config(tmp_path, strategy="one_device"))
    assert not os.path.exists(tmp_path / "run" / "results.json")
