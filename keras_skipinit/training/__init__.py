"""Training: a run from its settings to its results (`trainer.train`).

- `trainer`: the run's steps (validate, data, model, restore, epochs, finish)
- `run_model`: the model a run's settings build and compile
- `distribute`: TensorFlow's `tf.distribute` strategies and JAX's one device
- `callbacks`: progress, scalars, interruption and divergence during `fit`
- `checkpoint`: the step checkpoints a run resumes from
- `run_dir`: a run's folder (settings, history, best and final weights)
- `finetune`: a run started from another run's weights (`--init_from`)
- `memory`: activation memory per batch, checked before the first step

`keras_skipinit.training.train` and `.Config` are `trainer`'s names.
"""

from keras_skipinit import _lazy

__getattr__, __dir__ = _lazy.lend(__name__, "trainer")
