"""The papers' training protocol (SkipInit §2.3, §3, §5; Fixup §4).

Reads top to bottom: config -> strategy -> data -> model -> optimizer ->
epoch loop (checkpoint, divergence check, history) -> evaluation -> results.

- SGD with heavy-ball momentum 0.9; L2 (5e-4) added to the loss on conv and
  dense kernels, reported separately (`cross_entropy` is the loss without it).
- Large batches from small ghost batches by gradient accumulation (§3).
- Fixup's 10x lower learning rate for scalar multipliers and biases
  (`scalar_lr_multiplier`; exact for SGD with momentum, see `ScalarLRSGD`).
- MirroredStrategy over visible GPUs; MultiWorkerMirroredStrategy from
  TF_CONFIG (with two workarounds for keras-team/keras#20585, see
  `enable_multi_worker_fit`); the chief writes model_dir, other workers
  write the same files to a scratch directory that is then deleted.
- Checkpoints every epoch and every `checkpoint_steps` steps; a killed run
  resumes at the step it stopped, with the same data order.
- A non-finite loss stops training at once; the run is recorded as diverged.
"""

import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

from keras_skipinit import applications, data as data_lib, normalization as norm_lib, schedules

MODELS = ("wrn", "resnet_v1", "resnet_v2")
PRECISIONS = {"none": "float32", "float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker")


@dataclasses.dataclass
class Config:
    model: str = "wrn"
    depth: int = 16
    width: int = 1
    normalization: str = "skipinit"
    alpha_init: str | float | None = None
    ghost_batch_size: int | None = None
    nf_beta: float | None = None
    dropout: float | None = None
    dataset: str = data_lib.EMBEDDED
    data_dir: str | None = None
    batch_size: int = 32
    accumulation_steps: int = 1
    epochs: int = 12
    steps_per_epoch: int | None = None
    learning_rate: float = 0.05
    schedule: str = "cifar"
    momentum: float = 0.9
    l2: float = 5e-4
    mixup_alpha: float = 0.0
    scalar_lr_multiplier: float = 1.0
    mixed_precision: str = "none"
    xla: bool = False
    strategy: str = "auto"
    seed: int = 0
    model_dir: str = "runs/default"
    export_dir: str | None = None
    checkpoint_steps: int = 0
    verbose: int | None = None


def validate(config):
    """Raises ValueError naming the allowed values for any bad setting."""
    c = config
    if c.model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {c.model!r}")
    if c.normalization not in norm_lib.NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {norm_lib.NORMALIZATIONS}, got {c.normalization!r}")
    if c.schedule not in schedules.SCHEDULES:
        raise ValueError(f"schedule must be one of {schedules.SCHEDULES}, got {c.schedule!r}")
    if c.mixed_precision not in PRECISIONS:
        raise ValueError(f"mixed_precision must be one of {tuple(PRECISIONS)}, got {c.mixed_precision!r}")
    if c.strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {c.strategy!r}")
    positive = {"batch_size": c.batch_size, "accumulation_steps": c.accumulation_steps, "epochs": c.epochs}
    for name, value in positive.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not (c.learning_rate > 0 and math.isfinite(c.learning_rate)):
        raise ValueError(f"learning_rate must be > 0, got {c.learning_rate}")
    if not 0 <= c.momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {c.momentum}")
    if c.l2 < 0 or c.mixup_alpha < 0 or c.scalar_lr_multiplier <= 0:
        raise ValueError("l2 and mixup_alpha must be >= 0 and scalar_lr_multiplier > 0")
    if c.steps_per_epoch is not None and c.steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be a positive integer, got {c.steps_per_epoch}")
    if c.ghost_batch_size is not None and c.normalization != "ghost_batchnorm":
        raise ValueError("ghost_batch_size applies only to normalization=ghost_batchnorm")
    if c.nf_beta is not None and c.normalization != "nf":
        raise ValueError("nf_beta applies only to normalization=nf")
    if c.normalization == "nf" and c.model == "resnet_v1":
        raise ValueError("normalization=nf needs pre-activation blocks: use --model=wrn or resnet_v2")
    if c.batch_size % c.accumulation_steps:
        raise ValueError(
            f"batch_size ({c.batch_size}) must be divisible by accumulation_steps ({c.accumulation_steps})"
        )


def make_strategy(name):
    """auto: MultiWorkerMirroredStrategy if TF_CONFIG is set, MirroredStrategy
    over more than one GPU, else the default (one device)."""
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
        return tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
    if name == "mirrored" or len(gpus) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def is_multi_worker(strategy):
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and strategy.extended._in_multi_worker_mode()


def is_chief(strategy):
    """The worker that owns model_dir: task 0 of 'worker' or the 'chief' task."""
    if not is_multi_worker(strategy):
        return True
    resolver = strategy.cluster_resolver
    return resolver.task_type == "chief" or (
        resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in resolver.cluster_spec().as_dict()
    )


def enable_multi_worker_fit(model):
    """Makes Keras 3's fit/evaluate work under MultiWorkerMirroredStrategy,
    which fails in two places (keras-team/keras#20585):

    1. `_maybe_symbolic_build` eagerly all-reduces a distributed input batch
       to build the model, which fails across workers. A model that pins no
       strategy skips it and builds when the step is traced; fit must then
       run inside `strategy.scope()`.
    2. Step outputs are reduced with `strategy.reduce(MEAN, v, axis=0)`,
       which fails for scalar metrics. Returning them as shape-[1] vectors
       makes that reduction the mean over replicas, a scalar.
    """

    def vectorize(step):
        def wrapped(data):
            return {k: tf.reshape(v, [1]) if len(v.shape) == 0 else v for k, v in step(data).items()}

        return wrapped

    model._distribute_strategy = None
    model.train_step = vectorize(model.train_step)
    model.test_step = vectorize(model.test_step)


def build_model(config, dataset):
    kwargs = dict(
        input_shape=dataset.input_shape,
        classes=dataset.num_classes,
        normalization=config.normalization,
        virtual_batch_size=config.ghost_batch_size,
        alpha_init=config.alpha_init,
        nf_beta=config.nf_beta,
        dropout_rate=config.dropout,
        seed=config.seed,
    )
    if config.model == "wrn":
        return applications.WideResNet(config.depth, config.width, **kwargs)
    return applications.ResNet(config.depth, 1 if config.model == "resnet_v1" else 2, **kwargs)


def write_model_spec(model_dir, config, dataset):
    """What export needs to rebuild the model from a checkpoint and to put the
    evaluation preprocessing in the serving graph (model_spec.json)."""
    spec = {
        "config": dataclasses.asdict(config),
        "input_shape": list(dataset.input_shape),
        "num_classes": dataset.num_classes,
        "preprocessing": "imagenet" if dataset.style == "imagenet" else "standardize",
    }
    with open(os.path.join(model_dir, "model_spec.json"), "w") as f:
        json.dump(spec, f, indent=2)


def model_from_spec(spec):
    """Rebuilds the (untrained) model described by a model_spec.json dict."""
    config = Config(**spec["config"])
    shape = dataclasses.make_dataclass("Shape", ["input_shape", "num_classes"])
    return build_model(config, shape(tuple(spec["input_shape"]), spec["num_classes"]))


def add_l2(model, coefficient):
    """L2 on the loss (SkipInit §2.3): coefficient * sum(w^2) over conv and
    dense kernels (not biases, BN parameters or scalars)."""
    if coefficient <= 0:
        return
    regularizer = keras.regularizers.L2(coefficient)
    for variable in model.trainable_weights:
        if variable.path.endswith("kernel"):
            variable.regularizer = regularizer


@keras.saving.register_keras_serializable(package="keras_skipinit")
class ScalarLRSGD(keras.optimizers.SGD):
    """SGD whose scalar (shape ``()``) parameters learn `scalar_lr_multiplier`
    times slower (Fixup §4: 10x lower for multipliers and biases). Scaling a
    parameter's gradients by c is exactly scaling its learning rate by c for
    heavy-ball SGD, whose update is linear in lr * g."""

    def __init__(self, scalar_lr_multiplier=1.0, **kwargs):
        super().__init__(**kwargs)
        self.scalar_lr_multiplier = float(scalar_lr_multiplier)

    def apply(self, grads, trainable_variables=None):
        if self.scalar_lr_multiplier != 1.0:
            variables = trainable_variables if trainable_variables is not None else self._trainable_variables
            grads = [
                g * self.scalar_lr_multiplier if g is not None and len(v.shape) == 0 else g
                for g, v in zip(grads, variables)
            ]
        return super().apply(grads, trainable_variables)

    def get_config(self):
        return {**super().get_config(), "scalar_lr_multiplier": self.scalar_lr_multiplier}


class Checkpoint:
    """Weights + optimizer state and the position in training, written
    atomically (a kill mid-write leaves the previous checkpoint intact).
    Non-chief workers restore from `directory` but write to `write_directory`."""

    WEIGHTS, STATE = "ckpt.weights.h5", "state.json"

    def __init__(self, directory, write_directory=None):
        self.directory = directory
        self.write_directory = write_directory or directory

    def save(self, model, epoch, step_in_epoch):
        out = self.write_directory
        os.makedirs(out, exist_ok=True)
        tmp = os.path.join(out, "tmp." + self.WEIGHTS)
        model.save_weights(tmp)
        os.replace(tmp, os.path.join(out, self.WEIGHTS))
        state = os.path.join(out, self.STATE)
        with open(state + ".tmp", "w") as f:
            json.dump({"epoch": epoch, "step_in_epoch": step_in_epoch}, f)
        os.replace(state + ".tmp", state)

    def restore(self, model):
        """Returns (epoch, step_in_epoch) to resume from; (0, 0) if none."""
        state = os.path.join(self.directory, self.STATE)
        if not os.path.exists(state):
            return 0, 0
        model.optimizer.build(model.trainable_variables)
        model.load_weights(os.path.join(self.directory, self.WEIGHTS))
        with open(state) as f:
            state = json.load(f)
        return state["epoch"], state["step_in_epoch"]


class TrainingMonitor(keras.callbacks.Callback):
    """Stops at the first non-finite loss and checkpoints every N steps."""

    def __init__(self, checkpoint, epoch, first_step, every):
        super().__init__()
        self.checkpoint, self.epoch, self.step, self.every = checkpoint, epoch, first_step, every
        self.diverged = None

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.diverged = {"epoch": self.epoch, "step_in_epoch": self.step, "loss": float(loss)}
            self.model.stop_training = True
        elif self.every and self.step % self.every == 0:
            self.checkpoint.save(self.model, self.epoch, self.step)


class EpochProgress(keras.callbacks.ProgbarLogger):
    """Keras' progress display, counting epochs out of the whole run
    ("Epoch 3/12") although `train` calls fit once per epoch."""

    def __init__(self, total_epochs):
        super().__init__()
        self.total_epochs = total_epochs

    def set_params(self, params):
        super().set_params({**params, "epochs": self.total_epochs})


def train(config):
    """Trains per `config`; returns the results dict (also in results.json)."""
    validate(config)
    start = time.time()
    strategy = make_strategy(config.strategy)  # multi-worker: before any other TF op
    keras.utils.set_random_seed(config.seed)
    keras.config.set_dtype_policy(PRECISIONS[config.mixed_precision])
    os.makedirs(config.model_dir, exist_ok=True)
    if is_chief(strategy):
        return _train(config, strategy, config.model_dir, start)
    # Every worker runs the same saves (they may read distributed variables);
    # only the chief's land in model_dir.
    out_dir = tempfile.mkdtemp(prefix="keras_skipinit_worker_")
    try:
        return _train(config, strategy, out_dir, start)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _train(config, strategy, out_dir, start):
    """The run itself; writes go to `out_dir` (model_dir, or a non-chief
    worker's scratch directory), checkpoints are read from model_dir."""
    model_dir, chief, multi_worker = config.model_dir, is_chief(strategy), is_multi_worker(strategy)

    dataset = data_lib.load(config.dataset, config.data_dir)
    replicas = strategy.num_replicas_in_sync
    micro_batch = config.batch_size // config.accumulation_steps
    if micro_batch % replicas:
        raise ValueError(
            f"batch_size / accumulation_steps ({micro_batch}) must be divisible by the {replicas} replicas"
        )
    steps_per_epoch = config.steps_per_epoch or dataset.num_train // config.batch_size
    if steps_per_epoch < 1:
        raise ValueError(f"batch_size {config.batch_size} exceeds the {dataset.num_train} training examples")
    micro_steps = steps_per_epoch * config.accumulation_steps

    with strategy.scope():
        model = build_model(config, dataset)
        ghost = next((l.virtual_batch_size for l in model.layers if hasattr(l, "virtual_batch_size")), None)
        if ghost and (micro_batch // replicas) % ghost:
            raise ValueError(
                f"per-replica batch ({micro_batch // replicas}) must be a multiple of ghost_batch_size ({ghost})"
            )
        add_l2(model, config.l2)
        optimizer = ScalarLRSGD(
            scalar_lr_multiplier=config.scalar_lr_multiplier,
            learning_rate=schedules.PaperSchedule(config.schedule, config.learning_rate, steps_per_epoch, config.epochs),
            momentum=config.momentum,
            gradient_accumulation_steps=config.accumulation_steps if config.accumulation_steps > 1 else None,
        )
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.CategoricalCrossentropy(),
            metrics=[
                keras.metrics.CategoricalCrossentropy(name="cross_entropy"),
                keras.metrics.CategoricalAccuracy(name="top1"),
                keras.metrics.TopKCategoricalAccuracy(5, name="top5"),
            ],
            jit_compile=config.xla,
        )
        if multi_worker:
            enable_multi_worker_fit(model)
        checkpoint = Checkpoint(os.path.join(model_dir, "checkpoint"), os.path.join(out_dir, "checkpoint"))
        epoch, skip = checkpoint.restore(model)  # builds the optimizer's variables: in scope
    write_model_spec(out_dir, config, dataset)
    if (epoch or skip) and chief:
        print(f"Resuming from epoch {epoch + 1}, step {skip} of {micro_steps} ({checkpoint.directory}).", flush=True)
    eval_ds = data_lib.eval_pipeline(dataset, micro_batch)
    verbose = config.verbose if config.verbose is not None else (1 if sys.stdout.isatty() else 2)
    verbose = verbose if chief else 0
    tensorboard = keras.callbacks.TensorBoard(os.path.join(out_dir, "tensorboard"))
    history_path = os.path.join(out_dir, "history.csv")
    diverged = None
    while epoch < config.epochs and diverged is None:
        monitor = TrainingMonitor(checkpoint, epoch, skip, config.checkpoint_steps)
        train_ds = data_lib.train_pipeline(dataset, micro_batch, epoch, config.seed, config.mixup_alpha, skip)
        with strategy.scope():  # multi-worker: the model pins no strategy
            history = model.fit(
                train_ds,
                initial_epoch=epoch,
                epochs=epoch + 1,
                steps_per_epoch=micro_steps - skip,
                validation_data=eval_ds,
                callbacks=[monitor, tensorboard, EpochProgress(config.epochs)],
                shuffle=False,  # the pipeline shuffles, seeded per epoch
                verbose=verbose,
            )
        diverged = monitor.diverged
        if diverged:
            break
        epoch, skip = epoch + 1, 0
        checkpoint.save(model, epoch, 0)
        row = {"epoch": epoch, "lr": _current_lr(model), **{k: v[-1] for k, v in history.history.items()}}
        _append_csv(history_path, row)

    if diverged:
        print(
            f"Training diverged: non-finite loss ({diverged['loss']}) at epoch {diverged['epoch'] + 1}, "
            f"step {diverged['step_in_epoch']}; recorded as diverged.",
            flush=True,
        )
        metrics = {"top1": None, "top5": None, "cross_entropy": None}
    else:
        with strategy.scope():
            metrics = model.evaluate(eval_ds, verbose=0, return_dict=True)
    train_ce = _last_history_value(history_path, "cross_entropy") if not diverged else None
    results = {
        "status": "diverged" if diverged else "completed",
        "diverged_at": diverged,
        "test_top1": metrics.get("top1"),
        "test_top5": metrics.get("top5"),
        "test_cross_entropy": metrics.get("cross_entropy"),
        "train_cross_entropy": train_ce,
        "final_lr": _current_lr(model),
        "epochs_completed": epoch,
        "replicas": replicas,
        "workers": _num_workers(strategy) if multi_worker else 1,
        "chief": chief,
        "wall_time_s": time.time() - start,
        "num_train": dataset.num_train,
        "num_test": dataset.num_test,
        "config": dataclasses.asdict(config),
    }
    if not diverged:
        model.save(os.path.join(out_dir, "model.keras"))
        if config.export_dir and chief:
            from keras_skipinit import serving

            preprocessing = "imagenet" if dataset.style == "imagenet" else "standardize"
            name = os.path.basename(os.path.normpath(model_dir))
            results["export_path"] = serving.export(model, config.export_dir, name, preprocessing=preprocessing)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=2, default=_json_default)
    return results


def _num_workers(strategy):
    spec = strategy.cluster_resolver.cluster_spec().as_dict()
    return sum(len(spec.get(job, [])) for job in ("chief", "worker"))


def _json_default(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    raise TypeError(type(value).__name__)


def _current_lr(model):
    return float(model.optimizer.learning_rate)  # evaluates the schedule at the current step


def _append_csv(path, row):
    new = not os.path.exists(path)
    with open(path, "a") as f:
        if new:
            f.write(",".join(row) + "\n")
        f.write(",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in row.values()) + "\n")


def _last_history_value(path, column):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        lines = f.read().strip().splitlines()
    header, last = lines[0].split(","), lines[-1].split(",")
    return float(last[header.index(column)]) if column in header else None
