import json
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from keras_skipinit import applications as apps, training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(depth=10, width=1, verbose=0)


def small_config(tmp_path, **kwargs):
    return training.Config(**{**SMALL, "model_dir": str(tmp_path / "run"), **kwargs})


def run_cli(*flags, timeout=600):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def final_weights(model_dir):
    model = keras.models.load_model(os.path.join(model_dir, "model.keras"))
    return [w.numpy() for w in model.weights]


# --- pieces -------------------------------------------------------------------------


def test_l2_term_is_coefficient_times_sum_of_squared_kernels():
    model = apps.WideResNet(10, 1, normalization="regularized_skipinit", alpha_init="one")
    training.add_l2(model, 5e-4)
    kernels = [w.numpy() for w in model.weights if w.path.endswith("kernel")]
    assert len(kernels) == 1 + 3 * 2 + 2 + 1  # stem, 2 per block, 2 projections, classifier
    expected = 5e-4 * sum(float(np.sum(k.astype(np.float64) ** 2)) for k in kernels)
    model(np.zeros((1, 32, 32, 3), "float32"))
    assert float(sum(model.losses)) == pytest.approx(expected, rel=1e-5)
    # Biases and scalars are not regularized.
    assert all(w.regularizer is None for w in model.trainable_weights if not w.path.endswith("kernel"))


def test_scalar_lr_multiplier_equals_lower_learning_rate_for_scalars():
    def make():
        scalar = keras.Variable(1.0, name="alpha")
        vector = keras.Variable(np.ones(3, "float32"), name="w")
        return scalar, vector

    s1, v1 = make()
    s2, v2 = make()
    opt1 = training.ScalarLRSGD(scalar_lr_multiplier=0.1, learning_rate=0.5, momentum=0.9)
    opt2 = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
    opt3 = keras.optimizers.SGD(learning_rate=0.5, momentum=0.9)
    _, v3 = make()
    for step in range(4):
        grads = [tf.constant(0.3 * step + 1.0), tf.constant([1.0, -2.0, 0.5])]
        opt1.apply(grads, [s1, v1])
        opt2.apply(grads[:1], [s2])
        opt3.apply(grads[1:], [v3])
    assert float(s1.numpy()) == pytest.approx(float(s2.numpy()), rel=1e-6)
    np.testing.assert_allclose(v1.numpy(), v3.numpy(), rtol=1e-6)
    assert training.ScalarLRSGD.from_config(opt1.get_config()).scalar_lr_multiplier == 0.1


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(model="vgg"), "model must be one of"),
        (dict(normalization="groupnorm"), "normalization must be one of"),
        (dict(learning_rate=-0.1), "learning_rate"),
        (dict(batch_size=10, accumulation_steps=3), "divisible by accumulation_steps"),
        (dict(ghost_batch_size=16), "ghost_batchnorm"),
        (dict(schedule="cosine"), "schedule must be one of"),
    ],
)
def test_bad_configs_raise_value_errors(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        training.train(small_config(tmp_path, **kwargs))


def test_ghost_batch_must_divide_the_per_replica_batch(tmp_path):
    config = small_config(tmp_path, normalization="ghost_batchnorm", ghost_batch_size=24, batch_size=64)
    with pytest.raises(ValueError, match="multiple of ghost_batch_size"):
        training.train(config)


# --- end to end --------------------------------------------------------------------


def test_embedded_default_learns_real_digits(tmp_path):
    """Three epochs of the default model (WRN-16-1, SkipInit alpha=0) at the
    default learning rate held constant must beat chance (0.1) by far."""
    config = small_config(tmp_path, depth=16, epochs=3, schedule="constant")
    results = training.train(config)
    assert results["status"] == "completed"
    assert results["test_top1"] > 0.8, results
    saved = json.load(open(tmp_path / "run" / "results.json"))
    assert saved["test_top1"] == pytest.approx(results["test_top1"])
    assert saved["config"]["normalization"] == "skipinit"
    assert os.listdir(tmp_path / "run" / "tensorboard")
    history = open(tmp_path / "run" / "history.csv").read().splitlines()
    assert history[0].startswith("epoch,lr,") and len(history) == 4


def test_progress_counts_epochs_of_the_whole_run(tmp_path, capsys):
    """fit runs once per epoch; the display must still read 'Epoch k/N'."""
    training.train(small_config(tmp_path, epochs=2, steps_per_epoch=2, verbose=2))
    out = capsys.readouterr().out
    assert "Epoch 1/2" in out and "Epoch 2/2" in out


def test_gradient_accumulation_equals_one_large_batch(tmp_path):
    common = dict(normalization="skipinit", alpha_init="one", epochs=1, steps_per_epoch=2, schedule="constant",
                  learning_rate=0.05, batch_size=32)
    training.train(small_config(tmp_path / "a", **common))
    training.train(small_config(tmp_path / "b", accumulation_steps=4, **common))
    for a, b in zip(final_weights(tmp_path / "a" / "run"), final_weights(tmp_path / "b" / "run")):
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_mirrored_two_devices_equals_one_device_with_ghost_bn(tmp_path):
    common = dict(normalization="ghost_batchnorm", ghost_batch_size=8, epochs=1, steps_per_epoch=2,
                  schedule="constant", learning_rate=0.05, batch_size=32)
    one = training.train(small_config(tmp_path / "one", strategy="one_device", **common))
    two = training.train(small_config(tmp_path / "two", strategy="mirrored", **common))
    assert (one["replicas"], two["replicas"]) == (1, 2)
    for a, b in zip(final_weights(tmp_path / "one" / "run"), final_weights(tmp_path / "two" / "run")):
        np.testing.assert_allclose(a, b, atol=5e-5)


def test_tfds_training_path_with_mock_cifar10(tmp_path):
    with tfds.testing.mock_data(num_examples=64):
        results = training.train(small_config(tmp_path, dataset="cifar10", epochs=1, batch_size=16, mixup_alpha=0.7))
    assert results["status"] == "completed" and results["num_train"] == 64
    assert results["config"]["dataset"] == "cifar10"


def test_divergence_is_recorded_not_crashed(tmp_path):
    proc = run_cli("--depth=10", "--width=1", "--normalization=none", "--learning_rate=1e6",
                   "--epochs=2", "--steps_per_epoch=20", "--verbose=0", f"--model_dir={tmp_path}/run")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "diverged" in proc.stdout and "Traceback" not in proc.stderr
    results = json.load(open(tmp_path / "run" / "results.json"))
    assert results["status"] == "diverged" and results["diverged_at"]["epoch"] == 0
    assert results["epochs_completed"] == 0


@pytest.mark.parametrize(
    "flag,match",
    [
        ("--model=vgg", "model"),
        ("--learning_rate=-1", "learning_rate"),
        ("--normalization=layernorm", "normalization"),
        ("--alpha_init=half", "alpha_init"),
    ],
)
def test_cli_bad_flags_give_one_line_errors(flag, match):
    proc = run_cli(flag, "--epochs=1")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert match in proc.stderr


def test_killed_run_resumes_without_losing_finished_epochs(tmp_path):
    model_dir = tmp_path / "killed"
    flags = ["--depth=10", "--width=1", "--epochs=3", "--steps_per_epoch=12", "--checkpoint_steps=3",
             "--schedule=constant", "--learning_rate=0.02", "--verbose=0"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "train.py", *flags, f"--model_dir={model_dir}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state_path = model_dir / "checkpoint" / "state.json"
    deadline = time.time() + 300
    state = None
    while time.time() < deadline and proc.poll() is None:
        try:
            state = json.loads(state_path.read_text())
        except (OSError, ValueError):
            state = None
        if state and state["epoch"] == 1 and state["step_in_epoch"] > 0:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "run finished before it could be killed mid-epoch"
    assert not (model_dir / "results.json").exists()
    assert len((model_dir / "history.csv").read_text().splitlines()) == 2  # header + epoch 1

    resumed = run_cli(*flags, f"--model_dir={model_dir}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Resuming from epoch 2" in resumed.stdout
    epochs = [line.split(",")[0] for line in (model_dir / "history.csv").read_text().splitlines()[1:]]
    assert epochs == ["1", "2", "3"]
    assert json.loads((model_dir / "results.json").read_text())["epochs_completed"] == 3

    # Exactly where it stopped: same weights as a run that was never killed.
    uninterrupted = run_cli(*flags, f"--model_dir={tmp_path / 'straight'}")
    assert uninterrupted.returncode == 0
    for a, b in zip(final_weights(model_dir), final_weights(tmp_path / "straight")):
        np.testing.assert_allclose(a, b, atol=1e-4)


def _free_ports(n):
    import socket

    sockets = [socket.socket() for _ in range(n)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def test_two_worker_run_on_localhost_equals_one_device(tmp_path):
    """MultiWorkerMirroredStrategy from TF_CONFIG, two processes: gradients are
    all-reduced (same weights as one device on the same global batch), the
    chief writes model_dir and the other worker leaves nothing behind."""
    flags = ["--depth=10", "--width=1", "--alpha_init=one", "--epochs=1", "--steps_per_epoch=3", "--batch_size=16",
             "--schedule=constant", "--learning_rate=0.05", "--verbose=0", f"--model_dir={tmp_path / 'mw'}"]
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    procs = []
    for index in range(2):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT, "TF_CONFIG": tf_config}
        procs.append(subprocess.Popen([sys.executable, "train.py", *flags], cwd=ROOT, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [proc.communicate(timeout=400) for proc in procs]
    for proc, (out, err) in zip(procs, outs):
        assert proc.returncode == 0, err[-3000:]
    assert "Test accuracy" in outs[0][0] and "the chief writes" in outs[1][0]
    results = json.loads((tmp_path / "mw" / "results.json").read_text())
    assert (results["replicas"], results["workers"], results["chief"]) == (2, 2, True)

    reference = small_config(tmp_path, alpha_init="one", epochs=1, steps_per_epoch=3, batch_size=16,
                             schedule="constant", learning_rate=0.05, strategy="one_device")
    training.train(reference)
    for a, b in zip(final_weights(tmp_path / "mw"), final_weights(tmp_path / "run")):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_multi_worker_without_tf_config_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="TF_CONFIG"):
        training.train(small_config(tmp_path, strategy="multi_worker"))
