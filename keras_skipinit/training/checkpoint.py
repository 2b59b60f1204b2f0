"""A run's checkpoints: model and optimizer state, the model's random state
and the run's own state at a position in training (`run_dir` names the
folder: model_dir/checkpoint/ckpt-EEEEEE-SSSSSS/)."""

import os
import re
import shutil
import sys
import tempfile

import keras

from keras_skipinit import files


class Checkpoint:
    """Model and optimizer state at a position in training, as versioned
    directories ``ckpt-<epoch>-<step>``: each is written in a temporary
    directory and renamed into place, so a kill leaves only complete
    checkpoints; the newest `keep` are kept. Restoring falls back to the
    previous checkpoint when the newest cannot be read. Non-chief workers
    restore from `directory` and write to `write_directory`."""

    WEIGHTS, STATE = "weights.weights.h5", "state.json"
    _NAME = re.compile(r"ckpt-(\d+)-(\d+)$")

    def __init__(self, directory, write_directory=None, keep=2):
        self.directory = directory
        self.write_directory = write_directory or directory
        self.keep = keep
        self.state = {}  # the restored checkpoint's state.json (`restore`)

    @classmethod
    def _list(cls, directory):
        """[(epoch, step, path)], newest first."""
        if not os.path.isdir(directory):
            return []
        found = [(cls._NAME.match(name), name) for name in os.listdir(directory)]
        return sorted(((int(m[1]), int(m[2]), os.path.join(directory, name)) for m, name in found if m), reverse=True)

    def all(self):
        return self._list(self.directory)

    def save(self, model, epoch, step_in_epoch, **state):
        """Saves at (epoch, step_in_epoch) with `state` (JSON values: the
        run's history rows, its partial epoch's metrics, its time so far) and
        the model's random state (`random_state`) in state.json beside the
        weights."""
        out = self.write_directory
        os.makedirs(out, exist_ok=True)
        files.check_space(out, model.weights + (model.optimizer.variables if model.optimizer else []), "a checkpoint")
        with files.removed_on_failure(tempfile.mkdtemp(prefix="tmp-", dir=out)) as tmp:
            model.save_weights(os.path.join(tmp, self.WEIGHTS))
            files.write_json(os.path.join(tmp, self.STATE),
                             files.strict_json({**state, "epoch": epoch, "step_in_epoch": step_in_epoch,
                                                "random_state": [_to_list(v) for v in random_state(model)]}))
            final = os.path.join(out, f"ckpt-{epoch:06d}-{step_in_epoch:06d}")
            if os.path.exists(final):  # the same position saved again (e.g. a resumed run)
                shutil.rmtree(final)
            os.replace(tmp, final)
        for _, _, old in self._list(out)[self.keep :]:
            shutil.rmtree(old, ignore_errors=True)
        for name in os.listdir(out):  # a save killed midway left its tmp-*; one process writes here (run_dir.lock)
            if name.startswith("tmp-"):
                shutil.rmtree(os.path.join(out, name), ignore_errors=True)

    def restore(self, model, with_optimizer=True):
        """Loads the newest readable checkpoint into `model`; returns its
        (epoch, step_in_epoch) and path, or (0, 0) and None if there is none.
        Its state.json (what `save` was given) is then `self.state`."""
        self.state = {}
        candidates = self.all()
        if not candidates:
            return (0, 0), None
        if with_optimizer:
            model.optimizer.build(model.trainable_variables)
        failures = []
        for epoch, step, path in candidates:
            try:
                state = files.read_json(os.path.join(path, self.STATE))
                model.load_weights(os.path.join(path, self.WEIGHTS))
                _restore_random_state(model, state.get("random_state"), path)
            except (OSError, ValueError, KeyError) as e:
                failures.append(f"{path} ({files.one_line(e)})")
                continue
            if failures:
                print(f"Warning: unreadable checkpoint {failures[-1]}; restored {path} instead.", file=sys.stderr)
            self.state = state
            return (state["epoch"], state["step_in_epoch"]), path
        raise ValueError(
            f"no readable checkpoint in {self.directory}: {'; '.join(failures)}. Delete {self.directory} to start "
            "that run over, or use a new --model_dir."
        )


def random_state(model):
    """The model's random-number state: the variables of its Keras
    SeedGenerators (dropout's masks), which a weights file does not hold.
    Each advances once per draw, so a checkpoint keeps them (state.json)
    and a resumed run draws the masks the uninterrupted run draws."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights and v.path.endswith("seed_generator_state")]


def _to_list(variable):
    return [int(x) for x in keras.ops.convert_to_numpy(variable)]


def _restore_random_state(model, saved, path):
    """Puts `random_state`'s saved values back (none in a checkpoint of a
    model without dropout, nor in one of an earlier version)."""
    if saved is None:
        return
    variables = random_state(model)
    if len(saved) != len(variables):
        raise ValueError(f"{path} holds {len(saved)} random states, the model has {len(variables)}")
    for variable, value in zip(variables, saved):
        variable.assign(keras.ops.convert_to_tensor(value, dtype=variable.dtype))
