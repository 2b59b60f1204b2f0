"""Devices, replicas and workers: the one place where training differs by
Keras backend. One interface, `Distribution`, with an implementation per
backend (`TensorFlow`, `Jax`; `current()` picks it by Keras' backend, the one
lookup); the trainer asks `make(name)` for one and uses its members only.

- TensorFlow: tf.distribute's Mirrored (local GPUs) and MultiWorkerMirrored
  (TF_CONFIG) strategies; each replica runs the model on its part of the batch.
- JAX: keras.distribution's `DataParallel` over the devices of one process or
  of several (KERAS_DISTRIBUTION_*); one program runs on the global batch.

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
import sys

import keras

from keras_skipinit import machine
from keras_skipinit.cli import startup

BACKENDS = startup.TRAINING_BACKENDS


def backend():
    return keras.backend.backend()


def check_backend():
    """Training runs on TensorFlow and JAX; other backends are refused in
    one line rather than run half-supported."""
    if backend() not in BACKENDS:
        raise ValueError(startup.backend_error(backend()))


def of_backend():
    """The `Distribution` class of Keras' backend (the one backend switch);
    on a backend that does not train, the interface's defaults (what
    predict, which runs on any backend, asks: `build_uninitialized`)."""
    return {"tensorflow": TensorFlow, "jax": Jax}.get(backend(), Distribution)


def current():
    """The `Distribution` class of Keras' backend; others refused in one line."""
    check_backend()
    return of_backend()


def make(name):
    """The distribution for strategy `name`, one of `spec.STRATEGIES` (checked by `trainer.validate`)."""
    return current().make(name)


class Distribution:
    """What training asks of devices, replicas and workers. Class-level
    answers (`on_gpu`, `jit_compile`, `sync_weights`) need no instance; an
    instance (`make`) holds the run's devices: `scope()` around building and
    fitting, `replicas`, `chief`, `workers`, `model_batch`, `pads_evaluation`,
    `prepare_model`, `feed_sharded_by_us`."""

    name = None
    pads_evaluation = False  # the evaluation set in whole global batches (`pipelines.eval_pipeline`)
    # A model whose every weight a checkpoint replaces is built without running its initializers
    # (`model_files`): where they are costly and a variable can be assigned before it exists.
    build_uninitialized = False

    def scope(self):
        raise NotImplementedError

    @property
    def replicas(self):
        raise NotImplementedError

    @property
    def workers(self):
        """Processes (worker machines) taking part; 1 unless multi-worker."""
        return 1

    @property
    def chief(self):
        """Whether this process owns model_dir (the only one, or the first)."""
        return True

    def model_batch(self, batch):
        """The batch one call of the model sees, where batch statistics are taken."""
        raise NotImplementedError

    def prepare_model(self, model):
        """What `fit` needs beyond `compile` here."""

    def feed_sharded_by_us(self):
        """Called where our NumPy feed (`data.numpy_feed`) gives each process its own part of each batch."""

    @staticmethod
    def on_gpu():
        """Whether the model runs on GPUs (memory and precision warnings)."""
        raise NotImplementedError

    @staticmethod
    def jit_compile(xla):
        """`Model.compile(jit_compile=...)` for the --xla setting."""
        return xla

    @staticmethod
    def sync_weights(model):
        """Makes the model's variables hold the weights of the last step."""


# --- JAX: keras.distribution -------------------------------------------------------


class Jax(Distribution):
    """keras.distribution's `DataParallel` over `devices` (no distribution for
    one device); `processes` > 1: the devices of that many processes. One
    program runs on the global batch, split over the devices."""

    name = "jax"
    # Each initializer is an XLA program compiled per weight shape: seconds apiece (issue 89.5).
    build_uninitialized = True

    def __init__(self, devices, processes=1):
        self.devices = list(devices)
        self.processes = processes
        self.distribution = keras.distribution.DataParallel(devices=self.devices) if len(self.devices) > 1 else None

    @classmethod
    def make(cls, name):
        """One process: all its devices. Several processes (every one started
        with the KERAS_DISTRIBUTION_* variables that keras.distribution.initialize
        reads): all devices of all processes, process 0 the chief."""
        import jax

        _hide_gpus_from_tensorflow()
        processes = _jax_processes()
        if name == "multi_worker" and processes < 2:
            raise ValueError(
                "strategy=multi_worker on JAX needs every process started with KERAS_DISTRIBUTION_NUM_PROCESSES "
                "(> 1), KERAS_DISTRIBUTION_PROCESS_ID and KERAS_DISTRIBUTION_JOB_ADDRESSES (the coordinator's "
                "host:port)"
            )
        if processes > 1:
            if name == "one_device":
                raise ValueError(f"strategy=one_device contradicts {PROCESS_ENV[0]}={processes}: unset it, or use auto")
            _initialize_jax_processes(processes)
            return cls(jax.devices(), processes)
        return cls(jax.local_devices()[:1] if name == "one_device" else jax.local_devices())

    def scope(self):
        return self.distribution.scope() if self.distribution else contextlib.nullcontext()

    @property
    def replicas(self):
        return len(self.devices)

    @property
    def workers(self):
        return self.processes

    @property
    def chief(self):
        import jax

        return self.processes == 1 or jax.process_index() == 0

    @property
    def pads_evaluation(self):
        """Over several processes Keras splits each batch between them
        (`DataParallel.distribute_dataset`), so a last, partial batch goes to
        some processes only, and the others wait for it forever: training pads
        it with examples of weight 0."""
        return self.processes > 1

    def model_batch(self, batch):
        return batch  # the whole batch: one program over all devices (synchronized BatchNorm)

    def feed_sharded_by_us(self):
        """Keras shards tf.data only (and refuses other data over several
        processes): it must not shard our NumPy feed again."""
        if self.distribution is not None:
            self.distribution.auto_shard_dataset = False

    @staticmethod
    def on_gpu():
        import jax

        return jax.default_backend() != "cpu"

    @staticmethod
    def jit_compile(xla):
        """Every step compiled with XLA, whatever --xla says (False would
        dispatch each op from Python, several times slower:
        benchmarks/README.md, "JAX against TensorFlow")."""
        return True

    @staticmethod
    def sync_weights(model):
        """JAX keeps the weights in the trainer's state during `fit`."""
        model.jax_state_sync()


PROCESS_ENV = ("KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID", "KERAS_DISTRIBUTION_JOB_ADDRESSES")


def _jax_processes():
    value = os.environ.get(PROCESS_ENV[0], "1")
    try:
        processes = int(value)
    except ValueError:
        processes = 0
    if processes < 1:
        raise ValueError(f"{PROCESS_ENV[0]} must be a positive integer (the number of processes), got {value!r}")
    return processes


COORDINATOR_TIMEOUT_ENV = "KERAS_SKIPINIT_COORDINATOR_TIMEOUT"


def process_settings(processes, environ=os.environ):
    """(process id, coordinator host:port, timeout s) from the
    KERAS_DISTRIBUTION_* variables of a `processes`-process run, each
    checked with a one-line ValueError naming the variable: the id an integer
    in [0, processes), the addresses `host:port` (one, the coordinator, or
    one per process, the coordinator first)."""
    missing = [name for name in PROCESS_ENV[1:] if not environ.get(name)]
    if missing:
        raise ValueError(f"{PROCESS_ENV[0]}={processes} also needs {' and '.join(missing)} in every process")
    value = environ[PROCESS_ENV[1]]
    if not value.strip().isdigit() or int(value) >= processes:
        raise ValueError(f"{PROCESS_ENV[1]} must be an integer from 0 to {processes - 1} "
                         f"({PROCESS_ENV[0]}={processes}), got {value!r}")
    addresses = environ[PROCESS_ENV[2]].split(",")
    if len(addresses) not in (1, processes):
        raise ValueError(f"{PROCESS_ENV[2]} must name the coordinator, or all {processes} processes, "
                         f"got {len(addresses)} addresses")
    for address in addresses:
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{PROCESS_ENV[2]}: every address must be host:port with a port from 1 to 65535, "
                             f"got {address!r}")
    timeout = environ.get(COORDINATOR_TIMEOUT_ENV, "300")
    if not timeout.isdigit() or int(timeout) < 1:
        raise ValueError(f"{COORDINATOR_TIMEOUT_ENV} must be a positive number of seconds, got {timeout!r}")
    return int(value), addresses[0].strip(), int(timeout)


_JAX_INITIALIZED = []


def _initialize_jax_processes(processes):
    """jax.distributed once per process (what keras.distribution.initialize
    does, plus a bounded, announced wait for the coordinator), with gloo for
    the collectives between CPU processes (JAX has none by default)."""
    if _JAX_INITIALIZED:
        return
    process_id, coordinator, timeout = process_settings(processes)
    import jax
    from keras.src.backend.jax import distribution_lib  # its initialize_rng: one seed in every process

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if process_id == 0:
        print(f"Process 0 of {processes}: the coordinator, at {coordinator}; waiting up to {timeout} s "
              f"({COORDINATOR_TIMEOUT_ENV}) for the other {processes - 1}", file=sys.stderr, flush=True)
    else:
        print(f"Process {process_id} of {processes}: connecting to the coordinator at {coordinator} (process 0), "
              f"waiting up to {timeout} s ({COORDINATOR_TIMEOUT_ENV})", file=sys.stderr, flush=True)
        # JAX aborts the process (a fatal C++ check, no exception) when the coordinator is not there
        # in time: wait for its port here, where a missing coordinator can be a one-line error.
        try:
            timeout = machine.wait_for_port(coordinator, timeout)
        except OSError as e:
            raise ValueError(f"process {process_id} of {processes} could not reach the coordinator at {coordinator} "
                             f"within {timeout} s ({e.strerror or e}): start process 0 there, or raise "
                             f"{COORDINATOR_TIMEOUT_ENV}") from None
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=processes, process_id=process_id,
                               initialization_timeout=timeout)
    distribution_lib.initialize_rng()
    _JAX_INITIALIZED.append(True)


def _hide_gpus_from_tensorflow():
    """tf.data feeds JAX from the CPU; TensorFlow must not claim GPU memory."""
    try:
        import tensorflow as tf

        tf.config.set_visible_devices([], "GPU")
    except (ImportError, RuntimeError):  # RuntimeError: TF already initialized its devices
        pass


# --- TensorFlow: tf.distribute ---------------------------------------------------------


class TensorFlow(Distribution):
    """tf.distribute: each replica runs the model on its own part of the
    batch; gradients are all-reduced."""

    name = "tensorflow"

    def __init__(self, strategy):
        self.strategy = strategy

    @classmethod
    def make(cls, name):
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
            return cls(tf.distribute.MultiWorkerMirroredStrategy())
        gpus = tf.config.list_logical_devices("GPU")
        if name == "one_device":
            return cls(tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0"))
        if name == "mirrored" and not gpus:  # e.g. logical CPU devices in tests
            return cls(_mirrored(tuple(d.name for d in tf.config.list_logical_devices("CPU"))))
        if name == "mirrored" or len(gpus) > 1:
            return cls(_mirrored(tuple(d.name for d in gpus)))
        return cls(tf.distribute.get_strategy())

    def scope(self):
        return self.strategy.scope()

    @property
    def replicas(self):
        return self.strategy.num_replicas_in_sync

    @property
    def _multi_worker(self):
        import tensorflow as tf

        return (isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy)
                and self.strategy.extended._in_multi_worker_mode())

    @property
    def workers(self):
        if not self._multi_worker:
            return 1
        spec = self.strategy.cluster_resolver.cluster_spec().as_dict()
        return sum(len(spec.get(job, [])) for job in ("chief", "worker"))

    @property
    def chief(self):
        """Task 0 of 'worker' or the 'chief' task (one process: itself)."""
        if not self._multi_worker:
            return True
        resolver = self.strategy.cluster_resolver
        return resolver.task_type == "chief" or (
            resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in resolver.cluster_spec().as_dict()
        )

    def model_batch(self, batch):
        return batch // self.replicas  # a replica's share

    def prepare_model(self, model):
        """Under MultiWorkerMirroredStrategy, Keras 3's fit/evaluate fail in two
        places (https://github.com/keras-team/keras/issues/20585):

        1. `_maybe_symbolic_build` eagerly all-reduces a distributed input batch
           to build the model, which fails across workers. A model that pins no
           strategy skips it and builds when the step is traced; fit must then
           run inside `scope()`.
        2. Step outputs are reduced with `strategy.reduce(MEAN, v, axis=0)`,
           which fails for scalar metrics. Returning them as shape-[1] vectors
           makes that reduction the mean over replicas, a scalar.
        """
        if not self._multi_worker:
            return
        import tensorflow as tf

        def vectorize(step):
            def wrapped(data):
                return {k: tf.reshape(v, [1]) if len(v.shape) == 0 else v for k, v in step(data).items()}

            return wrapped

        model._distribute_strategy = None
        model.train_step = vectorize(model.train_step)
        model.test_step = vectorize(model.test_step)

    @staticmethod
    def on_gpu():
        import tensorflow as tf

        return bool(tf.config.list_logical_devices("GPU"))


_MIRRORED = {}


def _mirrored(devices):
    """One MirroredStrategy per device set and process. A second instance
    restarts the collective instance keys that the first one's all-reduces
    already used in this process, and the next all-reduce of a different size
    aborts ("Shape mismatch in the collective instance 100",
    https://github.com/tensorflow/tensorflow/issues/62790): two runs in one process (the sweep runner,
    a notebook, the tests) must share the strategy."""
    import tensorflow as tf

    if devices not in _MIRRORED:
        _MIRRORED[devices] = tf.distribute.MirroredStrategy(list(devices))
    return _MIRRORED[devices]
