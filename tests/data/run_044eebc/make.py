"""Made this folder: a run by keras_skipinit at 044eebc (before the issue-88 redesign), killed right after
its mid-epoch checkpoint at (epoch 1, step 2); kept: model_spec.json, history.csv and that checkpoint (its
tensorboard logs, lock file and the epoch-end checkpoint before it left out). Made on TensorFlow 2.21,
Keras 3.15.1, 2 AVX-512 EPYC cores:

    git worktree add /tmp/old 044eebc && cd /tmp/old && PYTHONPATH=. python PATH/TO/make.py OUT

tests/test_training.py resumes it with today's code."""
import sys
from keras_skipinit import training
from keras_skipinit.checkpoint import Checkpoint

class Killed(Exception):
    pass

save = Checkpoint.save
def kill_after_mid_epoch_checkpoint(self, model, epoch, step, **state):
    save(self, model, epoch, step, **state)
    if (epoch, step) == (1, 2):
        raise Killed

Checkpoint.save = kill_after_mid_epoch_checkpoint
config = training.Config(depth=10, width=1, verbose=0, epochs=2, steps_per_epoch=4, checkpoint_steps=2,
                         schedule="cifar", learning_rate=0.05, normalization="regularized_skipinit",
                         model_dir=sys.argv[1])
try:
    training.train(config)
except Killed:
    print("killed at (1, 2)")
