"""The papers' training protocol (SkipInit §2.3, §3, §5; Fixup §4).

Reads top to bottom: config -> distribution -> data -> model (built and compiled
in `run_model`) -> epoch loop (checkpoint, divergence check, history) ->
evaluation -> results.

- SGD with heavy-ball momentum 0.9; L2 (5e-4) added to the loss on conv and
  dense kernels, reported separately (`cross_entropy` is the loss without it).
- Large batches from small ghost batches by gradient accumulation (§3).
- Fixup's 10x lower learning rate for scalar multipliers and biases
  (`scalar_lr_multiplier`, by default 0.1 for Fixup as in the authors'
  CIFAR and ImageNet code, 1 otherwise; exact for SGD with momentum, see
  `ScalarLRSGD`).
- On TensorFlow: MirroredStrategy over visible GPUs; MultiWorkerMirroredStrategy
  from TF_CONFIG. On JAX: keras.distribution.DataParallel over the local
  devices of one process, or over several processes (KERAS_DISTRIBUTION_*).
  All of it
  in `distribute`; the chief writes model_dir, other workers write the same
  files to a scratch directory that is then deleted.
- Checkpoints every epoch and every `checkpoint_steps` steps; a killed run
  resumes at the step it stopped, with the same data order.
- A non-finite loss stops training at once; the run is recorded as diverged.
"""

import dataclasses
import os
import shutil
import sys
import tempfile
import time

import keras

from keras_skipinit import applications, files, lsuv, machine, normalization as norm_lib, spec
from keras_skipinit.data import pipelines, sources as data_lib
from keras_skipinit.training import distribute, finetune, memory, model_files, run_dir
from keras_skipinit.training.run_model import build_model, build_note, compiled_model, method_options, model_args
from keras_skipinit.training.callbacks import EpochProgress, EpochScalars, Interrupt, Stopped, TrainingMonitor
from keras_skipinit.training.checkpoint import Checkpoint

MODELS = applications.MODELS  # train.py --model
PRECISIONS, STRATEGIES = spec.PRECISIONS, spec.STRATEGIES
MAX_EPOCHS, MAX_STEPS_PER_EPOCH, MAX_SEED = spec.MAX_EPOCHS, spec.MAX_STEPS_PER_EPOCH, spec.MAX_SEED
Config = spec.Config  # a run's settings, each declared once there (default, help, choices, bounds)


def validate(config):
    """Raises ValueError naming the allowed values for any bad setting."""
    c = config
    spec.check_settings(c)  # each setting's kind, choices and bounds, as its flag has them (NaN and infinity refused)
    arch = applications.architecture(c.model)
    norm_lib.check_method(c.normalization, preactivation=arch.preactivation, **method_options(c))
    applications.registry.check_options(c.model, shortcut=c.shortcut, stem_init=c.stem_init)
    arch.check_depth(c.depth)  # before the model_dir is made: a refused depth leaves nothing
    if arch.takes_width and c.width < 1:
        raise ValueError(f"width must be a positive integer, got {c.width!r}")
    if not 0 <= c.momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {c.momentum}")
    if c.dropout is not None and not 0 <= c.dropout < 1:
        raise ValueError(f"dropout must be in [0, 1), got {c.dropout}")
    if c.lsuv and norm_lib.METHODS[c.normalization].normalizes:
        raise ValueError(f"lsuv initializes networks without normalization, not normalization={c.normalization}")
    if c.batch_size % c.accumulation_steps:
        raise ValueError(
            f"batch_size ({c.batch_size}) must be divisible by accumulation_steps ({c.accumulation_steps})"
        )
    if not c.model_dir or not c.model_dir.strip():
        raise ValueError("model_dir must name a directory (got an empty --model_dir; an unset shell variable?)")
    files.check_writable(c.model_dir, "--model_dir")
    finetune.check(c)
    if data_lib.image_folder.looks_like_folder(c.dataset):
        data_lib.image_folder.layout(c.dataset, held_out=bool(c.validation_examples))  # before the model_dir is touched


def train(config):
    """Trains per `config`; returns the results dict (also in results.json)."""
    validate(config)
    start = time.time()
    distribution = distribute.make(config.strategy)  # multi-worker: before any other TF op
    if distribution.chief:
        run_dir.check_not_foreign(config.model_dir)
        with run_dir.lock(config.model_dir):  # one process per model_dir, for the run's life
            with Interrupt() as interrupt:
                return _train_chief(config, distribution, start, interrupt)
    stored = run_dir.check_model_dir(dataclasses.asdict(config), dataclasses.asdict(Config()), chief=False)
    if stored is not None:
        return {**stored, "chief": False}
    _seed_and_precision(config)
    # Every worker runs the same saves (they may read distributed variables);
    # only the chief's land in model_dir.
    out_dir = tempfile.mkdtemp(prefix="keras_skipinit_worker_")
    try:
        with Interrupt() as interrupt:
            return _train(config, distribution, out_dir, start, interrupt)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _train_chief(config, distribution, start, interrupt):
    stored = run_dir.check_model_dir(dataclasses.asdict(config), dataclasses.asdict(Config()))
    if stored is not None:
        print(
            f"The run in {os.path.normpath(config.model_dir)} is complete ({stored['status']}, "
            f"{_epochs(stored['epochs_completed'])}); results: {os.path.join(config.model_dir, run_dir.RESULTS)}",
            flush=True,
        )
        return {**stored, "chief": True}
    _seed_and_precision(config)
    return _train(config, distribution, config.model_dir, start, interrupt)


def _seed_and_precision(config):
    keras.utils.set_random_seed(config.seed)
    keras.config.set_dtype_policy(PRECISIONS[config.mixed_precision])


@dataclasses.dataclass(frozen=True)
class _Process:
    """Where this process runs the run (its settings, `config`, travel beside it to every step)."""

    distribution: distribute.Distribution
    out_dir: str  # where this process writes: model_dir, or a non-chief worker's scratch directory
    start: float
    interrupt: Interrupt
    chief: bool
    checkpoint: Checkpoint  # model_dir's checkpoints (a non-chief worker writes its own in out_dir)


@dataclasses.dataclass(frozen=True)
class _Data:
    """The run's data and how an epoch takes it (`_set_up_data`)."""

    dataset: object
    micro_batch: int  # examples per micro-step (gradient accumulation: SkipInit §3)
    micro_steps: int  # micro-steps per epoch
    feed: pipelines.Feed  # its batches (`Feed.name`: tf.data or NumPy, each orders an epoch's examples its own way)


@dataclasses.dataclass(frozen=True)
class _Start:
    """Where training starts (`_start_or_restore`)."""

    epoch: int  # epochs done
    skip: int  # micro-steps of the next epoch done
    restored: str  # the checkpoint resumed from, or None
    state: dict  # its state.json ({} where none): what the run carries from process to process (`_carry_records`)


@dataclasses.dataclass(frozen=True)
class _Records:
    """What a run carries from process to process in its checkpoints (`_carry_records`)."""

    rows: tuple  # history.csv's rows so far
    partial_logs: dict  # the metrics of a resumed epoch's steps before the checkpoint
    earlier_s: float  # the time of the processes before this one
    backends: list


@dataclasses.dataclass(frozen=True)
class _End:
    """How the epoch loop ended (`_epoch_loop`)."""

    stopped: dict  # `_interrupted`'s record, or None
    diverged: dict  # where the loss went non-finite, or None
    final_eval: dict  # the last epoch's evaluation, or None
    epoch: int  # epochs done
    rows: tuple  # history.csv's rows


def _train(config, distribution, out_dir, start, interrupt):
    """The run itself, a line of steps that take and return values: its data, its model (built, or
    restored from model_dir's checkpoint), its records carried on, the epoch loop, the results.
    Returns results.json's record, or `_interrupted`'s."""
    process = _Process(distribution, out_dir, start, interrupt, chief=distribution.chief,
                       checkpoint=Checkpoint(os.path.join(config.model_dir, run_dir.CHECKPOINTS),
                                             os.path.join(out_dir, run_dir.CHECKPOINTS)))
    data = _set_up_data(config, process)
    model = _build(config, process, data)
    begun = _start_or_restore(config, process, data, model)
    records = _carry_records(config, process, data, begun)
    eval_ds, eval_steps = _eval_data(config, process, data)
    with data_lib.feed_errors():  # a streamed file found corrupt: its one line, not TensorFlow's wrapping
        end = _epoch_loop(config, process, data, model, begun, records, eval_ds, eval_steps)
        return end.stopped or _finish(config, process, data, model, records, end, eval_ds, eval_steps)


def _set_up_data(config, process):
    distribution, chief = process.distribution, process.chief
    dataset = data_lib.load_for(config)
    dataset, note = run_dir.continued_data(config.model_dir, dataset, process.checkpoint.all(), check=chief)
    if note and chief:
        print(note, flush=True)
    if chief and dataset.folder:
        print(data_lib.described(dataset), flush=True)
    replicas = distribution.replicas
    micro_batch = config.batch_size // config.accumulation_steps
    if micro_batch % replicas:
        raise ValueError(
            f"batch_size / accumulation_steps ({micro_batch}) must be divisible by the {replicas} replicas"
        )
    if config.batch_size > dataset.num_train:  # also with --steps_per_epoch (it repeats the data, not the batch)
        raise ValueError(f"batch_size {config.batch_size} exceeds the {dataset.num_train} training examples")
    pipelines.check_passes(dataset, config.batch_size, config.steps_per_epoch)
    micro_steps = (config.steps_per_epoch or dataset.num_train // config.batch_size) * config.accumulation_steps
    feed = pipelines.feed(dataset)  # chosen once: every epoch's batches and the evaluation's
    if feed.sharded_by_us:
        distribution.feed_sharded_by_us()
    return _Data(dataset, micro_batch, micro_steps, feed)


def _build(config, process, data):
    """The compiled model, in the distribution's scope, with the lines a run
    should see before it: a slow build, ghost batches, memory, bfloat16."""
    distribution, chief = process.distribution, process.chief
    note = build_note(config)
    if note and chief:
        print(note, flush=True)
    with distribution.scope():
        model = compiled_model(config, data.dataset, data.micro_steps // config.accumulation_steps)
        _note_ghost_batches(model, distribution.model_batch(data.micro_batch), chief)
        for warning in (memory.check_memory(model, data.micro_batch // distribution.replicas,
                                            config.ignore_memory_check),
                        machine.bfloat16_warning(config.mixed_precision, distribution.on_gpu())):
            if warning and chief:
                print(warning, file=sys.stderr, flush=True)
        distribution.prepare_model(model)
    return model


def _start_or_restore(config, process, data, model):
    """The model's starting weights: model_dir's newest checkpoint where
    there is one (a resumed run continues, fine-tuning runs too), else
    --init_from's and LSUV's on the initializers'."""
    with process.distribution.scope():
        checkpoint = process.checkpoint
        first_start = not checkpoint.all()
        if config.init_from and first_start:
            started = finetune.load_into(model, config.init_from, lambda classes: build_model(
                config, data.dataset, classes=classes), data.dataset.label_names,
                spec.keras_application(config.model, config.depth))
            if process.chief:
                note = finetune.preprocessing_note(config.init_from, data.dataset.preprocessing)
                print(started + (f"\n{note}" if note else ""), flush=True)
        if config.lsuv and first_start:
            images, _ = pipelines.first_batch(data.feed.train(data.micro_batch, 0, config.seed))
            lsuv.lsuv_init(model, images, seed=config.seed)
        (epoch, skip), restored = checkpoint.restore(model)  # builds the optimizer's variables
    return _Start(epoch, skip, restored, checkpoint.state)


def _carry_records(config, process, data, begun):
    """The run's history rows, its partial epoch's metrics and its time so
    far travel in every checkpoint: history.csv is rebuilt from the one
    resumed from (a kill between a checkpoint and its row loses nothing)."""
    out_dir, chief = process.out_dir, process.chief
    state = begun.state
    if begun.skip and state.get("feed", data.feed.name) != data.feed.name:
        raise ValueError(
            f"{begun.restored} was written mid-epoch by a run fed by {state['feed']} (its backend's data route); "
            f"{process.distribution.name} here feeds by {data.feed.name}, which orders the epoch's examples otherwise, so "
            "the epoch would train some examples twice and others never. Resume it on the backend that wrote it; "
            "a checkpoint at an epoch's end resumes on either")
    backends = run_dir.write_spec(out_dir, dataclasses.asdict(config), model_args(config, data.dataset),
                                  data.dataset, process.distribution.name)
    rows = state.get("history")
    if rows is None:  # a checkpoint from before the rows travelled with it, or none
        rows = [row for row in run_dir.read_history(out_dir) if row["epoch"] <= begun.epoch]
    if rows or os.path.exists(os.path.join(out_dir, run_dir.HISTORY)):
        run_dir.write_history(out_dir, rows)
    if begun.restored and chief and begun.epoch >= config.epochs:  # killed after its last checkpoint
        print(f"Every epoch was trained ({begun.restored}); evaluating the final weights.", flush=True)
    elif begun.restored and chief:
        print(f"Resuming from epoch {begun.epoch + 1}, step {begun.skip} of {data.micro_steps} ({begun.restored}).",
              flush=True)
        earlier = sorted({row["schedule_epochs"] for row in rows if row.get("schedule_epochs", config.epochs)
                          != config.epochs})
        if earlier:
            print(f"Note: continuing a run trained on the {'/'.join(map(str, earlier))}-epoch schedule to "
                  f"--epochs={config.epochs}: its epochs so far keep that schedule, so this is a continuation, not "
                  f"a {config.epochs}-epoch run (results.json: schedule_segments).", flush=True)
    return _Records(tuple(rows), state.get("partial_logs") if begun.skip else None, state.get("wall_time_s", 0.0),
                    backends)


def _eval_data(config, process, data):
    eval_ds = data.feed.eval(config.eval_batch_size or data.micro_batch,
                             whole_batches=process.distribution.pads_evaluation)
    # Said explicitly: over several JAX processes Keras re-batches and shards the set, which loses its
    # length, and then warns "Your input ran out of data" at its normal end.
    return eval_ds, pipelines.num_batches(eval_ds)


def _epoch_loop(config, process, data, model, begun, records, eval_ds, eval_steps):
    """Trains the epochs left, checkpointing as it goes; returns how it ended (`_End`)."""
    interrupt, chief = process.interrupt, process.chief
    epoch, skip, partial_logs, rows = begun.epoch, begun.skip, records.partial_logs, list(records.rows)

    def save(epoch, step, partial_logs=None):
        process.checkpoint.save(model, epoch, step, history=rows, partial_logs=partial_logs,
                                wall_time_s=records.earlier_s + time.time() - process.start, feed=data.feed.name)

    verbose = config.verbose if config.verbose is not None else (1 if sys.stdout.isatty() else 2)
    verbose = verbose if chief else 0
    tensorboard = EpochScalars(os.path.join(process.out_dir, "tensorboard"))
    diverged, final_eval = None, None
    while epoch < config.epochs and diverged is None:
        if interrupt.signal:  # arrived during an evaluation or before the first step: the epoch is saved
            return _End(_interrupted(interrupt, epoch, skip, data.micro_steps, chief,
                                     checkpointed=bool(begun.restored or epoch)), None, None, epoch, tuple(rows))
        if skip < data.micro_steps:
            monitor = TrainingMonitor(save, epoch, skip, config.checkpoint_steps, data.micro_steps, partial_logs,
                                      interrupt)
            train_ds = data.feed.train(data.micro_batch, epoch, config.seed, config.mixup_alpha, skip,
                                       num_batches=data.micro_steps)
            try:
                with process.distribution.scope():  # multi-worker: the model pins no strategy
                    history = model.fit(
                        train_ds, initial_epoch=epoch, epochs=epoch + 1,
                        steps_per_epoch=data.micro_steps - skip, validation_data=eval_ds,
                        validation_steps=eval_steps,
                        callbacks=[monitor, tensorboard, EpochProgress(config.epochs, skip, data.micro_steps,
                                                                       data.dataset.eval_split)],
                        shuffle=False,  # the pipeline shuffles, seeded per epoch
                        verbose=verbose,
                    )
            except Stopped:  # a signal: TrainingMonitor checkpointed the step it reached
                return _End(_interrupted(interrupt, epoch, monitor.step, data.micro_steps, chief), None, None,
                            epoch, tuple(rows))
            diverged = monitor.diverged
            if diverged:
                break
            logs = {k: v[-1] for k, v in history.history.items()}
        else:  # a checkpoint at the epoch's last step (written by older versions): its updates are done
            with process.distribution.scope():
                metrics = model.evaluate(eval_ds, steps=eval_steps, verbose=0, return_dict=True)
                logs = {**(partial_logs or {}), **{f"val_{k}": v for k, v in metrics.items()}}
        epoch, skip, partial_logs = epoch + 1, 0, None
        rows.append({"epoch": epoch, "lr": float(model.optimizer.learning_rate), "schedule_epochs": config.epochs,
                     **logs})
        save(epoch, 0)
        run_dir.write_history(process.out_dir, rows)
        # The validation at the end of the last epoch saw the final weights.
        final_eval = {k[len("val_"):]: v for k, v in logs.items() if k.startswith("val_")}
    return _End(None, diverged, final_eval, epoch, tuple(rows))


def _finish(config, process, data, model, records, end, eval_ds, eval_steps):
    """results.json (and model.keras unless it diverged); the record."""
    rows, diverged, distribution = end.rows, end.diverged, process.distribution
    if diverged:
        print(
            f"Training diverged: non-finite loss ({diverged['loss']}) at epoch {diverged['epoch'] + 1}, "
            f"step {diverged['step_in_epoch']}; recorded as diverged.",
            flush=True,
        )
        metrics = {"top1": None, "top5": None, "cross_entropy": None}
    elif end.final_eval:
        metrics = end.final_eval
    else:  # every epoch was trained before this process (e.g. killed before results.json)
        with distribution.scope():
            metrics = model.evaluate(eval_ds, steps=eval_steps, verbose=0, return_dict=True)
    results = run_dir.results_record(
        dataclasses.asdict(config), data.dataset, metrics, diverged,
        train_cross_entropy=rows[-1].get("cross_entropy") if rows and not diverged else None,
        schedule_segments=run_dir.schedule_segments(rows),
        final_lr=float(model.optimizer.learning_rate),  # evaluates the schedule at the current step
        epochs_completed=end.epoch, replicas=distribution.replicas,
        workers=distribution.workers, chief=process.chief,
        wall_time_s=records.earlier_s + time.time() - process.start,  # every process of the run, up to its checkpoint
        backend=distribution.name,  # the one that finished the run
        backends=records.backends)  # every one it used
    if not diverged:
        model_files.save_model(model, os.path.join(process.out_dir, run_dir.MODEL), data.dataset.preprocessing,
                               {k: getattr(config, k) for k in finetune.SAME}, data.dataset.label_names)
    files.write_json(os.path.join(process.out_dir, run_dir.RESULTS), results)
    if process.interrupt.signal:  # arrived in the last step or evaluation: the run is complete, its caller stops
        return {**results, "signal": process.interrupt.signal}
    return results


def _interrupted(interrupt, epoch, step, steps, chief, checkpointed=True):
    """What `train` returns when stopped by a signal: where it stopped (a
    checkpoint is there, unless the signal came before the first step of a
    new run: `checkpointed`); results.json is not written."""
    return {"status": "interrupted", "signal": interrupt.signal, "epoch": epoch + 1, "step_in_epoch": step,
            "steps_per_epoch": steps, "chief": chief, "checkpointed": checkpointed}


def _note_ghost_batches(model, batch, chief):
    """GhostBatchNormalization splits the batch one model call sees
    (`Distribution.model_batch`) into ghost batches and normalizes a remainder
    as its own, smaller ghost batch; say so when that happens, since the
    statistics then depend on the batch split."""
    ghost = next((l.ghost_batch_size for l in model.layers if getattr(l, "ghost_batch_size", None)), None)
    if not ghost or not chief or batch % ghost == 0:
        return
    if batch < ghost:
        detail = "each is one ghost batch (plain batch statistics)"
    else:
        detail = f"the last ghost batch of each has {batch % ghost} examples"
    print(f"Note: batches of {batch} per model call with ghost_batch_size {ghost}: {detail}.", flush=True)


def _epochs(n):
    return f"{n} epoch" + ("" if n == 1 else "s")

