"""The papers' learning-rate schedules, with phase lengths scaled to `epochs`.

- 'cifar' (SkipInit §2.3): constant for the first half (100 of 200 epochs),
  then halved every 5% of training (10 of 200 epochs): drops at epochs 100,
  110, ..., 190.
- 'imagenet' (SkipInit §5): linear warm-up from 0 over 5/90 of training,
  constant for 40/90, then halved every 5/90: drops at 45, 50, ..., 85 of 90.
- 'constant'.

Each schedule is data: its phases in units of 1/D of training (`FRACTIONS`).
`PaperSchedule` evaluates it in exact integer arithmetic on the optimizer
step with `keras.ops` (any backend), so a drop that falls on a step happens
at that step.
"""

import math

import keras
from keras import ops

from keras_skipinit import spec

SCHEDULES = spec.SCHEDULES
# kind -> (D, end of warm-up, end of the constant phase), in units of 1/D of
# training; the learning rate halves every 1/D after the constant phase.
FRACTIONS = {"cifar": (20, 0, 10), "imagenet": (18, 1, 9)}


def phases(kind, epochs):
    """(end of warm-up, end of the constant phase, epochs between halvings)."""
    if kind not in FRACTIONS:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}.")
    d, warmup, constant = FRACTIONS[kind]
    return epochs * warmup / d, epochs * constant / d, epochs / d


# Slack on the number of halvings, so that a drop falling exactly on a step
# happens at that step despite rounding ((2.6 - 2) / 0.2 = 2.9999999999999996).
_SLACK = 1e-9


def lr_at_epoch(kind, epoch, base_lr, epochs):
    """The schedule as a plain function of a (fractional) epoch."""
    if kind == "constant":
        return base_lr
    warmup, constant, every = phases(kind, epochs)
    if epoch < warmup:
        return base_lr * epoch / warmup
    halvings = math.floor((epoch - constant) / every + _SLACK) + 1
    return base_lr * 0.5 ** max(halvings, 0)


@keras.saving.register_keras_serializable(package="keras_skipinit")
class PaperSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`lr_at_epoch` as a Keras schedule of the optimizer step (the number
    of updates; `steps_per_epoch * epochs` must be a whole number of steps)."""

    def __init__(self, kind, base_lr, steps_per_epoch, epochs):
        if kind not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}.")
        self.kind, self.base_lr = kind, float(base_lr)
        self.steps_per_epoch, self.epochs = int(steps_per_epoch), float(epochs)
        total = self.steps_per_epoch * self.epochs
        if total != round(total) or total < 1:
            raise ValueError(f"steps_per_epoch * epochs must be a positive whole number of steps, got {total}.")
        self.total_steps = int(round(total))

    def __call__(self, step):
        base = ops.convert_to_tensor(self.base_lr, "float32")
        if self.kind == "constant":
            return base
        d, warmup, constant = FRACTIONS[self.kind]
        position = ops.cast(step, "int32") * d  # in units of total_steps / d
        halvings = ops.maximum(ops.floor_divide(position, self.total_steps) - constant + 1, 0)
        lr = base * ops.power(0.5, ops.cast(halvings, "float32"))
        if warmup:
            warm = base * ops.cast(position, "float32") / float(warmup * self.total_steps)
            lr = ops.where(position < warmup * self.total_steps, warm, lr)
        return lr

    def get_config(self):
        return {
            "kind": self.kind,
            "base_lr": self.base_lr,
            "steps_per_epoch": self.steps_per_epoch,
            "epochs": self.epochs,
        }
