"""The papers' learning-rate schedules, with phase lengths scaled to `epochs`.

- 'cifar' (SkipInit §2.3): constant for the first half (100 of 200 epochs),
  then halved every 5% of training (10 of 200 epochs): drops at epochs 100,
  110, ..., 190.
- 'imagenet' (SkipInit §5): linear warm-up from 0 over 5/90 of training,
  constant for 40/90, then halved every 5/90: drops at 45, 50, ..., 85 of 90.
- 'constant'.
"""

import keras
import tensorflow as tf

SCHEDULES = ("cifar", "imagenet", "constant")


def phases(kind, epochs):
    """(end of warm-up, end of the constant phase, epochs between halvings)."""
    if kind == "cifar":
        return 0.0, 0.5 * epochs, 0.05 * epochs
    if kind == "imagenet":
        return epochs * 5 / 90, epochs * 45 / 90, epochs * 5 / 90
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}.")


def lr_at_epoch(kind, epoch, base_lr, epochs):
    """The schedule as a plain function of a (fractional) epoch."""
    if kind == "constant":
        return base_lr
    warmup, constant, every = phases(kind, epochs)
    if epoch < warmup:
        return base_lr * epoch / warmup
    if epoch < constant:
        return base_lr
    return base_lr * 0.5 ** (int((epoch - constant) // every) + 1)


@keras.saving.register_keras_serializable(package="keras_skipinit")
class PaperSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`lr_at_epoch` as a Keras schedule of the optimizer step."""

    def __init__(self, kind, base_lr, steps_per_epoch, epochs):
        if kind not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}.")
        self.kind, self.base_lr = kind, float(base_lr)
        self.steps_per_epoch, self.epochs = int(steps_per_epoch), float(epochs)

    def __call__(self, step):
        epoch = tf.cast(step, tf.float32) / self.steps_per_epoch
        base = tf.constant(self.base_lr, tf.float32)
        if self.kind == "constant":
            return base
        warmup, constant, every = phases(self.kind, self.epochs)
        drops = tf.floor((epoch - constant) / every) + 1
        decayed = base * tf.pow(0.5, tf.maximum(drops, 0.0))
        warm = base * epoch / warmup if warmup > 0 else base
        return tf.where(epoch < warmup, warm, tf.where(epoch < constant, base, decayed))

    def get_config(self):
        return {
            "kind": self.kind,
            "base_lr": self.base_lr,
            "steps_per_epoch": self.steps_per_epoch,
            "epochs": self.epochs,
        }
