"""The papers' training protocol (SkipInit §2.3, §3, §5; Fixup §4).

Reads top to bottom: config -> strategy -> data -> model -> optimizer ->
epoch loop (checkpoint, divergence check, history) -> evaluation -> results.

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

from keras_skipinit import applications, data as data_lib, distribute, files, finetune, lsuv, machine, memory, pipelines
from keras_skipinit import normalization as norm_lib, run_dir, schedules, spec
from keras_skipinit.callbacks import EpochProgress, EpochScalars, Interrupt, Stopped, TrainingMonitor
from keras_skipinit.checkpoint import Checkpoint
from keras_skipinit.optimizers import ScalarLRSGD

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
    run_dir.check_writable(c.model_dir, "--model_dir")
    finetune.check(c)
    if data_lib.image_folder.looks_like_folder(c.dataset):
        data_lib.image_folder.layout(c.dataset)  # a folder's layout, before the model_dir is touched


def method_options(config):
    """The method's options (`normalization.OPTIONS`) as the config sets them."""
    return {name: getattr(config, name) for name in norm_lib.OPTIONS}


def scalar_lr(config):
    """The learning-rate multiplier of scalar parameters: the flag, else the
    method's (`normalization.Method.scalar_lr`: 0.1 for Fixup, 1 otherwise)."""
    if config.scalar_lr_multiplier is not None:
        return config.scalar_lr_multiplier
    return norm_lib.METHODS[config.normalization].scalar_lr


def model_args(config, dataset):
    """The model's constructor arguments (`applications.create_model`), as
    recorded in model_spec.json."""
    args = dict(
        model=config.model,
        depth=config.depth,
        input_shape=list(dataset.input_shape),
        classes=dataset.num_classes,
        normalization=config.normalization,
        **{name: value for name, value in method_options(config).items() if value is not None},
        dropout=config.dropout,
        seed=config.seed,
    )
    if config.loop_blocks or config.remat:  # absent from specs written before the looped form
        args.update(loop_blocks=config.loop_blocks, remat=config.remat)
    arch = applications.architecture(config.model)
    if arch.takes_width:
        args["width"] = config.width
    for name in arch.options:  # absent from specs written before the option existed
        if getattr(config, name) is not None:
            args[name] = getattr(config, name)
    return args


def build_model(config, dataset):
    return applications.create_model(**model_args(config, dataset))


def build_note(config):
    """One line before a build that is silent for minutes on a CPU (an
    unrolled net of 500+ layers; benchmarks/depth_scaling.py), or None."""
    if config.loop_blocks or config.depth < 500:
        return None
    name = applications.registry.title(config.model, config.depth, config.width)
    return (f"Building {name} unrolled ({config.depth} layers): minutes before its first step on a CPU; "
            "--loop_blocks builds the same network in seconds (one loop per stage).")


def compiled_model(config, dataset, steps_per_epoch):
    """The model with the papers' optimizer, L2 and metrics, compiled as
    `train` runs it (also what benchmarks/ time)."""
    model = build_model(config, dataset)
    if config.freeze_backbone:
        finetune.freeze_backbone(model)
    add_l2(model, config.l2)
    optimizer = ScalarLRSGD(
        scalar_lr_multiplier=scalar_lr(config),
        learning_rate=schedules.PaperSchedule(config.schedule, config.learning_rate, steps_per_epoch, config.epochs),
        momentum=config.momentum,
        gradient_accumulation_steps=config.accumulation_steps if config.accumulation_steps > 1 else None,
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.CategoricalCrossentropy(),
        weighted_metrics=[  # = metrics without sample weights; weighted: the padding of pipelines.eval_pipeline
            keras.metrics.CategoricalCrossentropy(name="cross_entropy"),
            keras.metrics.CategoricalAccuracy(name="top1"),
            keras.metrics.TopKCategoricalAccuracy(5, name="top5"),
        ],
        jit_compile=distribute.jit_compile(config.xla),
    )
    return model


def add_l2(model, coefficient):
    """L2 on the loss (SkipInit §2.3): coefficient * sum(w^2) over conv and
    dense kernels (not biases, BN parameters or scalars)."""
    if coefficient <= 0:
        return
    regularizer = keras.regularizers.L2(coefficient)
    for variable in model.trainable_weights:
        if variable.path.endswith("kernel"):
            variable.regularizer = regularizer


def train(config):
    """Trains per `config`; returns the results dict (also in results.json)."""
    distribute.check_backend()
    validate(config)
    start = time.time()
    strategy = distribute.make_strategy(config.strategy)  # multi-worker: before any other TF op
    if distribute.is_chief(strategy):
        run_dir.check_not_foreign(config.model_dir)
        with run_dir.lock(config.model_dir):  # one process per model_dir, for the run's life
            with Interrupt() as interrupt:
                return _train_chief(config, strategy, start, interrupt)
    stored = run_dir.check_model_dir(dataclasses.asdict(config), dataclasses.asdict(Config()), chief=False)
    if stored is not None:
        return {**stored, "chief": False}
    _seed_and_precision(config)
    # Every worker runs the same saves (they may read distributed variables);
    # only the chief's land in model_dir.
    out_dir = tempfile.mkdtemp(prefix="keras_skipinit_worker_")
    try:
        with Interrupt() as interrupt:
            return _train(config, strategy, out_dir, start, interrupt)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _train_chief(config, strategy, start, interrupt):
    stored = run_dir.check_model_dir(dataclasses.asdict(config), dataclasses.asdict(Config()))
    if stored is not None:
        print(
            f"The run in {os.path.normpath(config.model_dir)} is complete ({stored['status']}, "
            f"{_epochs(stored['epochs_completed'])}); results: {os.path.join(config.model_dir, run_dir.RESULTS)}",
            flush=True,
        )
        return {**stored, "chief": True}
    _seed_and_precision(config)
    return _train(config, strategy, config.model_dir, start, interrupt)


def _seed_and_precision(config):
    keras.utils.set_random_seed(config.seed)
    keras.config.set_dtype_policy(PRECISIONS[config.mixed_precision])


def _train(config, strategy, out_dir, start, interrupt):
    """The run itself; writes go to `out_dir` (model_dir, or a non-chief
    worker's scratch directory), checkpoints are read from model_dir."""
    model_dir, chief = config.model_dir, distribute.is_chief(strategy)

    dataset = data_lib.load_for(config)
    if data_lib.numpy_feed(dataset):
        distribute.feed_shards_itself(strategy)
    replicas = strategy.num_replicas_in_sync
    micro_batch = config.batch_size // config.accumulation_steps
    if micro_batch % replicas:
        raise ValueError(
            f"batch_size / accumulation_steps ({micro_batch}) must be divisible by the {replicas} replicas"
        )
    if config.batch_size > dataset.num_train:  # also with --steps_per_epoch (it repeats the data, not the batch)
        raise ValueError(f"batch_size {config.batch_size} exceeds the {dataset.num_train} training examples")
    steps_per_epoch = config.steps_per_epoch or dataset.num_train // config.batch_size
    pipelines.check_passes(dataset, config.batch_size, config.steps_per_epoch)
    micro_steps = steps_per_epoch * config.accumulation_steps

    note = build_note(config)
    if note and chief:
        print(note, flush=True)
    with strategy.scope():
        model = compiled_model(config, dataset, steps_per_epoch)
        _note_ghost_batches(model, distribute.model_batch(strategy, micro_batch), chief)
        for warning in (memory.check_memory(model, micro_batch // replicas, config.ignore_memory_check),
                        machine.bfloat16_warning(config.mixed_precision, distribute.on_gpu())):
            if warning and chief:
                print(warning, file=sys.stderr, flush=True)
        distribute.prepare_model(model, strategy)
        checkpoint = Checkpoint(
            os.path.join(model_dir, run_dir.CHECKPOINTS), os.path.join(out_dir, run_dir.CHECKPOINTS)
        )
        if config.init_from and not checkpoint.all():  # a resumed run continues from its own checkpoint
            started = finetune.load_into(model, config.init_from, lambda classes: applications.create_model(
                **{**model_args(config, dataset), "classes": classes}))
            if chief:
                print(started, flush=True)
        if config.lsuv and not checkpoint.all():
            images, _ = pipelines.first_batch(pipelines.train_pipeline(dataset, micro_batch, 0, config.seed))
            lsuv.lsuv_init(model, images, seed=config.seed)
        (epoch, skip), restored = checkpoint.restore(model)  # builds the optimizer's variables: in scope
    # The run's history rows, its partial epoch's metrics and its time so far travel in every checkpoint:
    # history.csv is rebuilt from the one resumed from (a kill between a checkpoint and its row loses nothing).
    state = Checkpoint.read_state(restored) if restored else {}
    feed = "NumPy" if data_lib.numpy_feed(dataset) else "tf.data"  # each orders an epoch's examples its own way
    if skip and state.get("feed", feed) != feed:
        raise ValueError(
            f"{restored} was written mid-epoch by a run fed by {state['feed']} (its backend's data route); "
            f"{distribute.backend()} here feeds by {feed}, which orders the epoch's examples otherwise, so the "
            "epoch would train some examples twice and others never. Resume it on the backend that wrote it; "
            "a checkpoint at an epoch's end resumes on either")
    backends = run_dir.write_spec(out_dir, dataclasses.asdict(config), model_args(config, dataset), dataset,
                                  distribute.backend())
    rows = state.get("history")
    if rows is None:  # a checkpoint from before the rows travelled with it, or none
        rows = [row for row in run_dir.read_history(out_dir) if row["epoch"] <= epoch]
    if rows or os.path.exists(os.path.join(out_dir, run_dir.HISTORY)):
        run_dir.write_history(out_dir, rows)
    partial_logs = state.get("partial_logs") if skip else None
    earlier_s = state.get("wall_time_s", 0.0)  # the time of the processes before this one

    def save(epoch, step, partial_logs=None):
        checkpoint.save(model, epoch, step, history=rows, partial_logs=partial_logs,
                        wall_time_s=earlier_s + time.time() - start, feed=feed)

    if restored and chief and epoch >= config.epochs:  # killed after its last checkpoint, before results.json
        print(f"Every epoch was trained ({restored}); evaluating the final weights.", flush=True)
    elif restored and chief:
        print(f"Resuming from epoch {epoch + 1}, step {skip} of {micro_steps} ({restored}).", flush=True)
        earlier = sorted({row["schedule_epochs"] for row in rows if row.get("schedule_epochs", config.epochs)
                          != config.epochs})
        if earlier:
            print(f"Note: continuing a run trained on the {'/'.join(map(str, earlier))}-epoch schedule to "
                  f"--epochs={config.epochs}: its epochs so far keep that schedule, so this is a continuation, not "
                  f"a {config.epochs}-epoch run (results.json: schedule_segments).", flush=True)
    eval_ds = pipelines.eval_pipeline(dataset, micro_batch, whole_batches=distribute.pads_evaluation(strategy))
    # Said explicitly: over several JAX processes Keras re-batches and shards the set, which loses its
    # length, and then warns "Your input ran out of data" at its normal end.
    eval_steps = pipelines.num_batches(eval_ds)
    verbose = config.verbose if config.verbose is not None else (1 if sys.stdout.isatty() else 2)
    verbose = verbose if chief else 0
    tensorboard = EpochScalars(os.path.join(out_dir, "tensorboard"))
    diverged, final_eval = None, None
    while epoch < config.epochs and diverged is None:
        if interrupt.signal:  # arrived during an evaluation or before the first step: the epoch is saved
            return _interrupted(interrupt, epoch, skip, micro_steps, chief, checkpointed=bool(restored or epoch))
        if skip < micro_steps:
            monitor = TrainingMonitor(save, epoch, skip, config.checkpoint_steps, micro_steps, partial_logs,
                                      interrupt)
            train_ds = pipelines.train_pipeline(
                dataset, micro_batch, epoch, config.seed, config.mixup_alpha, skip, num_batches=micro_steps
            )
            try:
                with strategy.scope():  # multi-worker: the model pins no strategy
                    history = model.fit(
                        train_ds,
                        initial_epoch=epoch,
                        epochs=epoch + 1,
                        steps_per_epoch=micro_steps - skip,
                        validation_data=eval_ds,
                        validation_steps=eval_steps,
                        callbacks=[monitor, tensorboard,
                                   EpochProgress(config.epochs, skip, micro_steps, dataset.eval_split)],
                        shuffle=False,  # the pipeline shuffles, seeded per epoch
                        verbose=verbose,
                    )
            except Stopped:  # a signal: TrainingMonitor checkpointed the step it reached
                return _interrupted(interrupt, epoch, monitor.step, micro_steps, chief)
            diverged = monitor.diverged
            if diverged:
                break
            logs = {k: v[-1] for k, v in history.history.items()}
        else:  # a checkpoint at the epoch's last step (written by older versions): its updates are done
            with strategy.scope():
                metrics = model.evaluate(eval_ds, steps=eval_steps, verbose=0, return_dict=True)
                logs = {**(partial_logs or {}), **{f"val_{k}": v for k, v in metrics.items()}}
        epoch, skip, partial_logs = epoch + 1, 0, None
        rows.append({"epoch": epoch, "lr": float(model.optimizer.learning_rate), "schedule_epochs": config.epochs,
                     **logs})
        save(epoch, 0)
        run_dir.write_history(out_dir, rows)
        # The validation at the end of the last epoch saw the final weights.
        final_eval = {k[len("val_"):]: v for k, v in logs.items() if k.startswith("val_")}

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
        with strategy.scope():
            metrics = model.evaluate(eval_ds, steps=eval_steps, verbose=0, return_dict=True)
    results = run_dir.results_record(
        dataclasses.asdict(config), dataset, metrics, diverged,
        train_cross_entropy=rows[-1].get("cross_entropy") if rows and not diverged else None,
        schedule_segments=schedule_segments(rows),
        final_lr=float(model.optimizer.learning_rate),  # evaluates the schedule at the current step
        epochs_completed=epoch, replicas=replicas, workers=distribute.num_workers(strategy), chief=chief,
        wall_time_s=earlier_s + time.time() - start,  # every process of the run, up to its checkpoint
        backend=distribute.backend(),  # the one that finished the run
        backends=backends)  # every one it used
    if not diverged:
        run_dir.save_model(model, os.path.join(out_dir, run_dir.MODEL), dataset.preprocessing)
    files.write_json(os.path.join(out_dir, run_dir.RESULTS), results)
    if interrupt.signal:  # arrived in the last step or evaluation: the run is complete, its caller stops
        return {**results, "signal": interrupt.signal}
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
    (`distribute.model_batch`) into ghost batches and normalizes a remainder
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

