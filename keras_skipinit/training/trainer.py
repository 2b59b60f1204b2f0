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
    spec.check(c)  # each setting's kind, choices and bounds, as its flag has them (NaN and infinity refused)
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


@dataclasses.dataclass
class _Run:
    """One process's run, handed from step to step of `_train`: the
    settings, then what each step sets up."""

    config: Config
    distribution: distribute.Distribution
    out_dir: str  # where this process writes: model_dir, or a non-chief worker's scratch directory
    start: float
    interrupt: Interrupt
    chief: bool
    dataset: object = None
    micro_batch: int = 0  # examples per micro-step (gradient accumulation: SkipInit §3)
    micro_steps: int = 0  # micro-steps per epoch
    model: object = None
    checkpoint: Checkpoint = None
    epoch: int = 0  # epochs done
    skip: int = 0  # micro-steps of the next epoch done
    restored: str = None  # the checkpoint resumed from
    rows: list = None  # history.csv's rows so far
    partial_logs: dict = None  # the metrics of a resumed epoch's steps before the checkpoint
    earlier_s: float = 0.0  # the time of the processes before this one
    feed: str = "tf.data"
    backends: list = None

    def save(self, epoch, step, partial_logs=None):
        self.checkpoint.save(self.model, epoch, step, history=self.rows, partial_logs=partial_logs,
                             wall_time_s=self.earlier_s + time.time() - self.start, feed=self.feed)


def _train(config, distribution, out_dir, start, interrupt):
    """The run itself: its data, its model (built, or restored from
    model_dir's checkpoint), its records carried on, the epoch loop, the
    results. Returns results.json's record, or `_interrupted`'s."""
    run = _Run(config, distribution, out_dir, start, interrupt, chief=distribution.chief)
    _set_up_data(run)
    _build(run)
    _start_or_restore(run)
    _carry_records(run)
    eval_ds, eval_steps = _eval_data(run)
    with data_lib.feed_errors():  # a streamed file found corrupt: its one line, not TensorFlow's wrapping
        stopped, diverged, final_eval = _epoch_loop(run, eval_ds, eval_steps)
        return stopped or _finish(run, diverged, final_eval, eval_ds, eval_steps)


def _set_up_data(run):
    config, distribution = run.config, run.distribution
    run.dataset = dataset = data_lib.load_for(config)
    if run.chief:
        run_dir.check_same_data(config.model_dir, dataset)
    run.dataset = dataset = _continued(run, dataset)
    if run.chief and data_lib.image_folder.looks_like_folder(config.dataset):
        print(data_lib.described(dataset), flush=True)
    if data_lib.numpy_feed(dataset):
        distribution.feed_sharded_by_us()
    run.feed = "NumPy" if data_lib.numpy_feed(dataset) else "tf.data"  # each orders an epoch's examples its own way
    replicas = distribution.replicas
    run.micro_batch = config.batch_size // config.accumulation_steps
    if run.micro_batch % replicas:
        raise ValueError(
            f"batch_size / accumulation_steps ({run.micro_batch}) must be divisible by the {replicas} replicas"
        )
    if config.batch_size > dataset.num_train:  # also with --steps_per_epoch (it repeats the data, not the batch)
        raise ValueError(f"batch_size {config.batch_size} exceeds the {dataset.num_train} training examples")
    pipelines.check_passes(dataset, config.batch_size, config.steps_per_epoch)
    run.micro_steps = (config.steps_per_epoch or dataset.num_train // config.batch_size) * config.accumulation_steps


def _continued(run, dataset):
    """The dataset with the preprocessing a continued run recorded (`run_dir.continued_preprocessing`)."""
    dataset, note = run_dir.continued_preprocessing(run.config.model_dir, dataset)
    if note and run.chief:
        print(note, flush=True)
    return dataset


def _build(run):
    """The compiled model, in the distribution's scope, with the lines a run
    should see before it: a slow build, ghost batches, memory, bfloat16."""
    config, distribution, chief = run.config, run.distribution, run.chief
    note = build_note(config)
    if note and chief:
        print(note, flush=True)
    with distribution.scope():
        run.model = model = compiled_model(config, run.dataset, run.micro_steps // config.accumulation_steps)
        _note_ghost_batches(model, distribution.model_batch(run.micro_batch), chief)
        for warning in (memory.check_memory(model, run.micro_batch // distribution.replicas,
                                            config.ignore_memory_check),
                        machine.bfloat16_warning(config.mixed_precision, distribution.on_gpu())):
            if warning and chief:
                print(warning, file=sys.stderr, flush=True)
        distribution.prepare_model(model)


def _start_or_restore(run):
    """The model's starting weights: model_dir's newest checkpoint where
    there is one (a resumed run continues, fine-tuning runs too), else
    --init_from's and LSUV's on the initializers'."""
    config, model = run.config, run.model
    with run.distribution.scope():
        run.checkpoint = Checkpoint(os.path.join(config.model_dir, run_dir.CHECKPOINTS),
                                    os.path.join(run.out_dir, run_dir.CHECKPOINTS))
        first_start = not run.checkpoint.all()
        if config.init_from and first_start:
            started = finetune.load_into(model, config.init_from, lambda classes: build_model(
                config, run.dataset, classes=classes), run.dataset.label_names,
                spec.keras_application(config.model, config.depth))
            if run.chief:
                note = finetune.preprocessing_note(config.init_from, run.dataset.preprocessing)
                print(started + (f"\n{note}" if note else ""), flush=True)
        if config.lsuv and first_start:
            images, _ = pipelines.first_batch(pipelines.train_pipeline(run.dataset, run.micro_batch, 0, config.seed))
            lsuv.lsuv_init(model, images, seed=config.seed)
        (run.epoch, run.skip), run.restored = run.checkpoint.restore(model)  # builds the optimizer's variables


def _carry_records(run):
    """The run's history rows, its partial epoch's metrics and its time so
    far travel in every checkpoint: history.csv is rebuilt from the one
    resumed from (a kill between a checkpoint and its row loses nothing)."""
    config, out_dir = run.config, run.out_dir
    state = Checkpoint.read_state(run.restored) if run.restored else {}
    if run.skip and state.get("feed", run.feed) != run.feed:
        raise ValueError(
            f"{run.restored} was written mid-epoch by a run fed by {state['feed']} (its backend's data route); "
            f"{run.distribution.name} here feeds by {run.feed}, which orders the epoch's examples otherwise, so the "
            "epoch would train some examples twice and others never. Resume it on the backend that wrote it; "
            "a checkpoint at an epoch's end resumes on either")
    run.backends = run_dir.write_spec(out_dir, dataclasses.asdict(config), model_args(config, run.dataset),
                                      run.dataset, run.distribution.name)
    run.rows = state.get("history")
    if run.rows is None:  # a checkpoint from before the rows travelled with it, or none
        run.rows = [row for row in run_dir.read_history(out_dir) if row["epoch"] <= run.epoch]
    if run.rows or os.path.exists(os.path.join(out_dir, run_dir.HISTORY)):
        run_dir.write_history(out_dir, run.rows)
    run.partial_logs = state.get("partial_logs") if run.skip else None
    run.earlier_s = state.get("wall_time_s", 0.0)
    if run.restored and run.chief and run.epoch >= config.epochs:  # killed after its last checkpoint
        print(f"Every epoch was trained ({run.restored}); evaluating the final weights.", flush=True)
    elif run.restored and run.chief:
        print(f"Resuming from epoch {run.epoch + 1}, step {run.skip} of {run.micro_steps} ({run.restored}).",
              flush=True)
        earlier = sorted({row["schedule_epochs"] for row in run.rows if row.get("schedule_epochs", config.epochs)
                          != config.epochs})
        if earlier:
            print(f"Note: continuing a run trained on the {'/'.join(map(str, earlier))}-epoch schedule to "
                  f"--epochs={config.epochs}: its epochs so far keep that schedule, so this is a continuation, not "
                  f"a {config.epochs}-epoch run (results.json: schedule_segments).", flush=True)


def _eval_data(run):
    eval_ds = pipelines.eval_pipeline(run.dataset, run.config.eval_batch_size or run.micro_batch,
                                      whole_batches=run.distribution.pads_evaluation)
    # Said explicitly: over several JAX processes Keras re-batches and shards the set, which loses its
    # length, and then warns "Your input ran out of data" at its normal end.
    return eval_ds, pipelines.num_batches(eval_ds)


def _epoch_loop(run, eval_ds, eval_steps):
    """Trains the epochs left; returns (`_interrupted`'s record or None,
    where it diverged or None, the last epoch's evaluation or None)."""
    config, model, interrupt, chief = run.config, run.model, run.interrupt, run.chief
    verbose = config.verbose if config.verbose is not None else (1 if sys.stdout.isatty() else 2)
    verbose = verbose if chief else 0
    tensorboard = EpochScalars(os.path.join(run.out_dir, "tensorboard"))
    diverged, final_eval = None, None
    while run.epoch < config.epochs and diverged is None:
        if interrupt.signal:  # arrived during an evaluation or before the first step: the epoch is saved
            return _interrupted(interrupt, run.epoch, run.skip, run.micro_steps, chief,
                                checkpointed=bool(run.restored or run.epoch)), None, None
        if run.skip < run.micro_steps:
            monitor = TrainingMonitor(run.save, run.epoch, run.skip, config.checkpoint_steps, run.micro_steps,
                                      run.partial_logs, interrupt)
            train_ds = pipelines.train_pipeline(run.dataset, run.micro_batch, run.epoch, config.seed,
                                                config.mixup_alpha, run.skip, num_batches=run.micro_steps)
            try:
                with run.distribution.scope():  # multi-worker: the model pins no strategy
                    history = model.fit(
                        train_ds, initial_epoch=run.epoch, epochs=run.epoch + 1,
                        steps_per_epoch=run.micro_steps - run.skip, validation_data=eval_ds,
                        validation_steps=eval_steps,
                        callbacks=[monitor, tensorboard, EpochProgress(config.epochs, run.skip, run.micro_steps,
                                                                       run.dataset.eval_split)],
                        shuffle=False,  # the pipeline shuffles, seeded per epoch
                        verbose=verbose,
                    )
            except Stopped:  # a signal: TrainingMonitor checkpointed the step it reached
                return _interrupted(interrupt, run.epoch, monitor.step, run.micro_steps, chief), None, None
            diverged = monitor.diverged
            if diverged:
                break
            logs = {k: v[-1] for k, v in history.history.items()}
        else:  # a checkpoint at the epoch's last step (written by older versions): its updates are done
            with run.distribution.scope():
                metrics = model.evaluate(eval_ds, steps=eval_steps, verbose=0, return_dict=True)
                logs = {**(run.partial_logs or {}), **{f"val_{k}": v for k, v in metrics.items()}}
        run.epoch, run.skip, run.partial_logs = run.epoch + 1, 0, None
        run.rows.append({"epoch": run.epoch, "lr": float(model.optimizer.learning_rate),
                         "schedule_epochs": config.epochs, **logs})
        run.save(run.epoch, 0)
        run_dir.write_history(run.out_dir, run.rows)
        # The validation at the end of the last epoch saw the final weights.
        final_eval = {k[len("val_"):]: v for k, v in logs.items() if k.startswith("val_")}
    return None, diverged, final_eval


def _finish(run, diverged, final_eval, eval_ds, eval_steps):
    """results.json (and model.keras unless it diverged); the record."""
    model, rows = run.model, run.rows
    if diverged:
        print(
            f"Training diverged: non-finite loss ({diverged['loss']}) at epoch {diverged['epoch'] + 1}, "
            f"step {diverged['step_in_epoch']}; recorded as diverged.",
            flush=True,
        )
        metrics = {"top1": None, "top5": None, "cross_entropy": None}
    elif final_eval:
        metrics = final_eval
    else:  # every epoch was trained before this process (e.g. killed before results.json)
        with run.distribution.scope():
            metrics = model.evaluate(eval_ds, steps=eval_steps, verbose=0, return_dict=True)
    results = run_dir.results_record(
        dataclasses.asdict(run.config), run.dataset, metrics, diverged,
        train_cross_entropy=rows[-1].get("cross_entropy") if rows and not diverged else None,
        schedule_segments=schedule_segments(rows),
        final_lr=float(model.optimizer.learning_rate),  # evaluates the schedule at the current step
        epochs_completed=run.epoch, replicas=run.distribution.replicas,
        workers=run.distribution.workers, chief=run.chief,
        wall_time_s=run.earlier_s + time.time() - run.start,  # every process of the run, up to its checkpoint
        backend=run.distribution.name,  # the one that finished the run
        backends=run.backends)  # every one it used
    if not diverged:
        model_files.save_model(model, os.path.join(run.out_dir, run_dir.MODEL), run.dataset.preprocessing,
                           {k: getattr(run.config, k) for k in finetune.SAME}, run.dataset.label_names)
    files.write_json(os.path.join(run.out_dir, run_dir.RESULTS), results)
    if run.interrupt.signal:  # arrived in the last step or evaluation: the run is complete, its caller stops
        return {**results, "signal": run.interrupt.signal}
    return results


def schedule_segments(rows):
    """The schedules a run's epochs were trained on, as segments
    [{"first_epoch", "last_epoch", "schedule_epochs"}]: one for a run
    trained straight; more for a run continued with a higher --epochs, whose
    earlier epochs keep the shorter schedule. None where a row predates the
    record (history from an earlier version)."""
    segments = []
    for row in rows:
        if "schedule_epochs" not in row:
            return None
        if segments and segments[-1]["schedule_epochs"] == row["schedule_epochs"]:
            segments[-1]["last_epoch"] = row["epoch"]
        else:
            segments.append({"first_epoch": row["epoch"], "last_epoch": row["epoch"],
                             "schedule_epochs": row["schedule_epochs"]})
    return segments


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

