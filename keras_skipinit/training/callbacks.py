"""The callbacks of a training run (`training.train`): the step monitor
(divergence, checkpoints every N steps, a resumed epoch's metrics, a
signal's checkpoint), the progress display, TensorBoard scalars, and the
signal handling that stops a run at a step it can resume from."""

import math
import os
import signal
import sys
import threading
import time

import keras

from keras_skipinit.training import distribute


class Interrupt:
    """SIGINT (Ctrl-C) or SIGTERM while `train` runs: the step in progress
    finishes, a checkpoint is taken there and `train` returns status
    'interrupted' (no results.json: the same command resumes the run). A
    second signal ends the process at once (the handler from before acts),
    except SIGTERM again within REPEAT_S: GNU `timeout` sends its signal to
    the command and then to its process group, twice for one event (a
    second Ctrl-C acts however soon it comes).
    `on_signal(signum)`: called at the first (the sweep passes it on to its
    runs' processes). Only in the main thread (where signals arrive)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    REPEAT_S = 1.0

    def __init__(self, on_signal=None):
        self.signal, self._previous, self._on_signal, self._at = None, {}, on_signal, None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum, frame):
        if self.signal is None:
            self.signal, self._at = signum, time.monotonic()
            if self._on_signal:
                self._on_signal(signum)
            return
        if signum == self.signal == signal.SIGTERM and time.monotonic() - self._at < self.REPEAT_S:
            return  # the same event, delivered twice
        self._restore()
        signal.raise_signal(signum)  # to the handler from before: a second Ctrl-C or SIGTERM acts at once

    def _restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def __exit__(self, *exc):
        self._restore()


class Stopped(Exception):
    """Raised by TrainingMonitor out of `fit` once the interrupted step is checkpointed."""


class TrainingMonitor(keras.callbacks.Callback):
    """Stops at the first non-finite loss and checkpoints every N steps,
    except at the epoch's last step: the epoch-end checkpoint follows its
    evaluation, and a resume from the last step would find no step to run.

    A run resumed at step S of an epoch gets `partial_logs`, the epoch's
    training metrics over its first S steps (from the checkpoint), and merges
    them into the logs every later callback sees (history, TensorBoard, the
    progress display): the epoch reports its metrics over all its steps, as
    the run that was never stopped does. Every step is a batch of the same
    size, so the running means combine by step counts. Goes first in the
    callback list."""

    def __init__(self, save, epoch, first_step, every, last_step, partial_logs=None, interrupt=None):
        super().__init__()
        self.save, self.epoch, self.step, self.every = save, epoch, first_step, every
        self.first_step, self.last_step, self.partial_logs = first_step, last_step, partial_logs or {}
        self.interrupt = interrupt or Interrupt()
        self.diverged = None

    def _merge(self, logs):
        before, after = self.first_step, self.step - self.first_step
        for name, value in self.partial_logs.items():
            if name in logs and value is not None and not name.startswith("val_"):
                logs[name] = (before * value + after * logs[name]) / (before + after)

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        logs = logs if logs is not None else {}
        self._merge(logs)
        loss = logs.get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.diverged = {"epoch": self.epoch, "step_in_epoch": self.step, "loss": float(loss)}
            self.model.stop_training = True
        elif self.step < self.last_step and (self.interrupt.signal or self.every and self.step % self.every == 0):
            distribute.current().sync_weights(self.model)  # JAX: from the trainer's state
            self.save(self.epoch, self.step, partial_logs=dict(logs))
            if self.interrupt.signal:
                raise Stopped  # out of fit at once: no evaluation of a half-trained epoch

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            self._merge(logs)


class EpochProgress(keras.callbacks.ProgbarLogger):
    """Keras' progress display, counting epochs out of the whole run
    ("Epoch 3/12") although `train` calls fit once per epoch. A resumed
    epoch's bar counts from the step it resumed at (303/1875, not 1/1573);
    the evaluation's metrics are named by its split (`eval_split` "test":
    test_top1, where Keras says val_top1 for whatever it evaluates on); the
    evaluation after the bar says it runs; and where the display is a line
    per epoch (verbose 2: stdout is no terminal), a line at least every
    `every_s` seconds of an epoch."""

    def __init__(self, total_epochs, first_step=0, steps=None, eval_split="test", every_s=30):
        super().__init__()
        self.total_epochs, self.first_step, self.steps = total_epochs, first_step, steps
        self.eval_split, self.every_s, self._last = eval_split, every_s, time.time()

    def set_params(self, params):
        super().set_params({**params, "epochs": self.total_epochs, "steps": self.steps or params["steps"]})

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._last = time.time()

    def on_train_batch_end(self, batch, logs=None):
        step = batch + self.first_step
        super().on_train_batch_end(step, logs)
        if self.verbose == 2 and time.time() - self._last >= self.every_s:
            self._last = time.time()
            shown = " - ".join(f"{k}: {float(v):.4f}" for k, v in (logs or {}).items())
            print(f"  step {step + 1}/{self.target}" + (f" - {shown}" if shown else ""), flush=True)

    def on_test_begin(self, logs=None):
        super().on_test_begin(logs)
        if self._called_in_fit and self.verbose == 1:  # the bar's line: its final update writes over this
            sys.stdout.write(f" - evaluating on the {self.eval_split} split")
            sys.stdout.flush()

    def on_epoch_end(self, epoch, logs=None):
        prefix = "test_" if self.eval_split == "test" else "val_"
        super().on_epoch_end(epoch, {(prefix + k[4:] if k.startswith("val_") else k): v
                                     for k, v in (logs or {}).items()})


class EpochScalars(keras.callbacks.Callback):
    """TensorBoard scalars after every epoch, written without TensorFlow
    (the tensorboard package's event writer, as PyTorch's SummaryWriter uses
    it) in Keras' TensorBoard callback's layout: `<log_dir>/train` and
    `<log_dir>/validation`, tags `epoch_<metric>`, the learning rate as
    `epoch_learning_rate` in train, the step the epoch's index."""

    SPLITS = ("train", "validation")

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir = log_dir

    def on_train_begin(self, logs=None):  # the folders exist once fit runs, as with Keras' callback
        for split in self.SPLITS:
            os.makedirs(os.path.join(self.log_dir, split), exist_ok=True)

    def on_epoch_end(self, epoch, logs=None):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        splits = {"train": {"learning_rate": float(self.model.optimizer.learning_rate)}, "validation": {}}
        for key, value in (logs or {}).items():
            validation = key.startswith("val_")
            splits["validation" if validation else "train"][key[4:] if validation else key] = float(value)
        for split, scalars in splits.items():
            if not scalars:
                continue
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=f"epoch_{name}", simple_value=value)
                                                 for name, value in scalars.items()])
            writer = EventFileWriter(os.path.join(self.log_dir, split))
            writer.add_event(event_pb2.Event(wall_time=time.time(), step=epoch, summary=summary))
            writer.close()
