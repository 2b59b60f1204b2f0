"""The model a run trains: its constructor arguments (recorded in
model_spec.json), built, and compiled with the papers' optimizer, L2 and
metrics (SkipInit §2.3; Fixup's scalar learning rate). `training` runs it;
benchmarks/ time it."""

import keras

from keras_skipinit import applications, normalization as norm_lib, schedules
from keras_skipinit.training import distribute, finetune
from keras_skipinit.optimizers import ScalarLRSGD


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


def build_model(config, dataset, **changes):
    """The run's model (`model_args`), with `changes` to its arguments (a
    fine-tuning source's class count)."""
    return applications.create_model(**{**model_args(config, dataset), **changes})


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
        jit_compile=distribute.current().jit_compile(config.xla),
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
