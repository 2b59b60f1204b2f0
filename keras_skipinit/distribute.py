"""Devices, replicas and workers: the one place where training differs by
Keras backend (issue 20). `training` asks this module for a strategy and
uses only its `scope()` and `num_replicas_in_sync`, plus the functions below.

- TensorFlow: tf.distribute. MirroredStrategy over the local GPUs,
  MultiWorkerMirroredStrategy from TF_CONFIG (with the workarounds of
  `prepare_model`). Each replica runs the model on its own part of
  the batch; gradients are all-reduced.
- JAX: keras.distribution. `DataParallel` over the local devices of one
  process (several processes are refused for now, see `_jax_strategy`). One
  program runs on the global batch, split over the devices: gradients equal
  one device's on that batch.

Batch statistics differ in one respect. TensorFlow's replicas each normalize
their own part of the batch. Under JAX, `BatchNormalization` sees the global
batch, so its statistics are over all devices (synchronized BatchNorm: N
devices equal one device exactly), while `GhostBatchNormalization` splits the
global batch into ghost batches in order, which are per device as on
TensorFlow whenever the per-device batch is a multiple of the ghost batch
size (the layer's remainders aside).
"""

import contextlib
import json
import os

import keras

BACKENDS = ("tensorflow", "jax")
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker")


def backend():
    return keras.backend.backend()


def check_backend():
    """Training runs on TensorFlow and JAX; other backends are refused in
    one line rather than run half-supported."""
    if backend() not in BACKENDS:
        raise ValueError(
            f"training runs on the TensorFlow or JAX backend; this process uses Keras backend {backend()!r} "
            "(KERAS_BACKEND or ~/.keras/keras.json): run with KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax"
        )


def on_gpu():
    """Whether the model runs on GPUs (memory and precision warnings)."""
    if backend() == "jax":
        import jax

        return jax.default_backend() != "cpu"
    import tensorflow as tf

    return bool(tf.config.list_logical_devices("GPU"))


def jit_compile(xla):
    """`Model.compile(jit_compile=...)`. On JAX every step is compiled with
    XLA (False would run each step op by op: the issue's 75 ms against 15 ms
    per step); on TensorFlow XLA is the --xla opt-in."""
    return True if backend() == "jax" else xla


def make_strategy(name):
    """The strategy for `name`, one of STRATEGIES (checked by `training.validate`)."""
    if backend() == "jax":
        return _jax_strategy(name)
    return _tf_strategy(name)


# --- JAX: keras.distribution -------------------------------------------------------


class JaxDataParallel:
    """keras.distribution.DataParallel over `devices` (no distribution for
    one device), shaped like the part of tf.distribute.Strategy that
    training uses."""

    def __init__(self, devices):
        self.devices = list(devices)
        self.num_replicas_in_sync = len(self.devices)
        self.distribution = keras.distribution.DataParallel(devices=self.devices) if len(self.devices) > 1 else None

    def scope(self):
        return self.distribution.scope() if self.distribution else contextlib.nullcontext()


def _jax_strategy(name):
    """One process, all its devices. Many processes (keras.distribution.
    initialize) are refused for now: tried on localhost with 2 processes,
    Keras' per-process sharding split the 1,000 evaluation images unevenly
    (63 and 62 batches) and evaluation deadlocked."""
    import jax

    _hide_gpus_from_tensorflow()
    if name == "multi_worker" or int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "1")) > 1:
        raise ValueError("training over several JAX processes (keras.distribution.initialize) is not supported yet: "
                         "train on one host's devices, or on TensorFlow with TF_CONFIG (MultiWorkerMirroredStrategy)")
    if name == "one_device":
        return JaxDataParallel(jax.local_devices()[:1])
    return JaxDataParallel(jax.local_devices())


def _hide_gpus_from_tensorflow():
    """tf.data feeds JAX from the CPU; TensorFlow must not claim GPU memory."""
    try:
        import tensorflow as tf

        tf.config.set_visible_devices([], "GPU")
    except (ImportError, RuntimeError):  # RuntimeError: TF already initialized its devices
        pass


# --- TensorFlow: tf.distribute ---------------------------------------------------------


def _tf_strategy(name):
    """auto: MultiWorkerMirroredStrategy if TF_CONFIG is set, MirroredStrategy
    over more than one GPU, else the default (one device)."""
    import tensorflow as tf

    if name == "multi_worker" or (name == "auto" and "TF_CONFIG" in os.environ):
        if "TF_CONFIG" not in os.environ:
            raise ValueError("strategy=multi_worker needs the cluster in the TF_CONFIG environment variable")
        try:
            cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
        except (ValueError, KeyError, TypeError):
            raise ValueError("TF_CONFIG must be JSON with a 'cluster' and a 'task', see tf.distribute.cluster_resolver")
        if not cluster:
            raise ValueError("TF_CONFIG has an empty 'cluster'")
        tf.get_logger().setLevel("WARNING")  # else an INFO line per collective op
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    if name == "mirrored" and not gpus:  # e.g. logical CPU devices in tests
        return _mirrored(tuple(d.name for d in tf.config.list_logical_devices("CPU")))
    if name == "mirrored" or len(gpus) > 1:
        return _mirrored(tuple(d.name for d in gpus))
    return tf.distribute.get_strategy()


_MIRRORED = {}


def _mirrored(devices):
    """One MirroredStrategy per device set and process. A second instance
    restarts the collective instance keys that the first one's all-reduces
    already used in this process, and the next all-reduce of a different size
    aborts ("Shape mismatch in the collective instance 100",
    tensorflow/tensorflow#62790): two runs in one process (the sweep runner,
    a notebook, the tests) must share the strategy."""
    import tensorflow as tf

    if devices not in _MIRRORED:
        _MIRRORED[devices] = tf.distribute.MirroredStrategy(list(devices))
    return _MIRRORED[devices]


def is_multi_worker(strategy):
    if isinstance(strategy, JaxDataParallel):
        return False
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and strategy.extended._in_multi_worker_mode()


def is_chief(strategy):
    """The worker that owns model_dir: task 0 of 'worker' or the 'chief'
    task (one process: itself)."""
    if not is_multi_worker(strategy):
        return True
    resolver = strategy.cluster_resolver
    return resolver.task_type == "chief" or (
        resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in resolver.cluster_spec().as_dict()
    )


def num_workers(strategy):
    if not is_multi_worker(strategy):
        return 1
    spec = strategy.cluster_resolver.cluster_spec().as_dict()
    return sum(len(spec.get(job, [])) for job in ("chief", "worker"))


def prepare_model(model, strategy):
    """What `fit` needs beyond `compile`: under MultiWorkerMirroredStrategy,
    Keras 3's fit/evaluate fail in two places (keras-team/keras#20585):

    1. `_maybe_symbolic_build` eagerly all-reduces a distributed input batch
       to build the model, which fails across workers. A model that pins no
       strategy skips it and builds when the step is traced; fit must then
       run inside `strategy.scope()`.
    2. Step outputs are reduced with `strategy.reduce(MEAN, v, axis=0)`,
       which fails for scalar metrics. Returning them as shape-[1] vectors
       makes that reduction the mean over replicas, a scalar.
    """
    if not is_multi_worker(strategy):
        return
    import tensorflow as tf

    def vectorize(step):
        def wrapped(data):
            return {k: tf.reshape(v, [1]) if len(v.shape) == 0 else v for k, v in step(data).items()}

        return wrapped

    model._distribute_strategy = None
    model.train_step = vectorize(model.train_step)
    model.test_step = vectorize(model.test_step)


def model_batch(strategy, batch):
    """The batch one call of the model sees, where batch statistics are
    taken: a replica's share on TensorFlow, the whole batch on JAX (one
    program over all devices)."""
    return batch if isinstance(strategy, JaxDataParallel) else batch // strategy.num_replicas_in_sync


def sync_weights(model):
    """Makes the model's variables hold the weights of the last step (JAX
    keeps them in the trainer's state during `fit`); a no-op on TensorFlow."""
    if hasattr(model, "jax_state_sync"):
        model.jax_state_sync()
