"""Plumbing shared by the two commands (train_cli, export_cli)."""

import os
import sys

from absl import app, flags


def program(default):
    """The command's name as invoked: train.py, keras-skipinit-train, ..."""
    base = os.path.basename(sys.argv[0])
    return default if base in ("", "__main__.py", "-c") else base


def run(main, usage, name):
    """absl's app.run with this command's usage text, also when started
    through pip's wrapper script (whose module has no docstring). Bad flags
    (an unknown one, a value outside its enum or bounds) are one line and exit
    status 2, as every other bad input (absl's own: FATAL, status 1)."""
    sys.modules["__main__"].__doc__ = usage

    def parse(argv):
        try:
            return flags.FLAGS(argv)
        except flags.Error as e:
            print(f"{program(name)}: error: {e} (--helpfull lists the flags)", file=sys.stderr)
            sys.exit(2)

    app.run(main, flags_parser=parse)


def tensorflow_env():
    """This process's environment with the TensorFlow backend: SavedModels
    are TensorFlow graphs, so export runs there whatever backend trained."""
    return {**os.environ, "KERAS_BACKEND": "tensorflow"}


def rerun_on_tensorflow():
    """Replaces this process by the same command on the TensorFlow backend
    (the backend is fixed once Keras is imported)."""
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    os.execve(sys.executable, [sys.executable, *argv[1:]], tensorflow_env())
