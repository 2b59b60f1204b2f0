"""The papers' optimizer: SGD with heavy-ball momentum, with Fixup's lower
learning rate for scalar parameters (any Keras backend)."""

import keras


@keras.saving.register_keras_serializable(package="keras_skipinit")
class ScalarLRSGD(keras.optimizers.SGD):
    """SGD whose scalar (shape ``()``) parameters learn `scalar_lr_multiplier`
    times slower (Fixup §4: 10x lower for multipliers and biases). Scaling a
    parameter's gradients by c is exactly scaling its learning rate by c for
    heavy-ball SGD, whose update is linear in lr * g.

    With gradient accumulation the learning-rate schedule is a function of
    the number of updates (`iterations`); Keras 3 evaluates it at the number
    of micro-batches, which runs the schedule `accumulation_steps` times too
    fast (SkipInit §3 accumulates ghost batches into large batches).
    """

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

    def _get_current_learning_rate(self):
        if isinstance(self._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return self._learning_rate(self.iterations)  # updates, not micro-batches
        return super()._get_current_learning_rate()

    def get_config(self):
        return {**super().get_config(), "scalar_lr_multiplier": self.scalar_lr_multiplier}
