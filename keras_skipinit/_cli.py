"""Plumbing shared by the two commands (train_cli, export_cli)."""

import argparse
import contextlib
import logging
import os
import sys

from absl import app, flags

from keras_skipinit import _startup


def program(default):
    """The command's name as invoked: train.py, keras-skipinit-train, ..."""
    base = os.path.basename(sys.argv[0])
    return default if base in ("", "__main__.py", "-c") else base


HELP = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def help_text(usage, module):
    """The usage text and the command's own flags (those `module` defines),
    each with its help and default."""
    return f"{usage.rstrip()}\n\nFlags:\n{flags.FLAGS.module_help(module)}\n"


def run(main, usage, name):
    """absl's app.run with this command's usage text, also when started
    through pip's wrapper script (whose module has no docstring). --help
    (and -h, --helpfull) prints the usage and the command's own flags and
    exits 0 (absl's listed no flags, or every library's, and exited 1). Bad
    flags (an unknown one, a value outside its enum or bounds) and stray
    arguments are one line and exit status 2, as every other bad input."""
    sys.modules["__main__"].__doc__ = usage

    def parse(argv):
        if any(arg in HELP for arg in argv[1:]):
            print_help(help_text(usage, sys.modules[main.__module__]))
        try:
            rest = flags.FLAGS(argv)
        except flags.Error as e:
            refuse(program(name), f"{e} (--help lists the flags)")
        if len(rest) > 1:
            refuse(program(name), unexpected(rest[1:]))
        return rest

    app.run(main, flags_parser=parse)


def print_help(text):
    """Prints --help and exits 0, also into a pipe closed early (`| head`)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    sys.exit(0)


def unexpected(arguments):
    return f"unexpected arguments: {' '.join(arguments)} (flags are --name=value; --help lists them)"


class ArgumentParser(argparse.ArgumentParser):
    """argparse for our commands (the sweep, its quantization step, the
    analysis CLI): a bad flag is one line and exit status 2, as for train.py
    and export, not the usage block above the error."""

    def error(self, message):
        refuse(self.prog, f"{message} (--help lists the flags)")


@contextlib.contextmanager
def dropped_log_messages(*texts, logger=""):
    """Python logging records of `logger` (the root's by default) that
    contain one of `texts` are dropped for the block: advice a library
    repeats on every call that our command has no use for."""
    class Drop(logging.Filter):
        def filter(self, record):
            return not any(text in str(record.msg) for text in texts)

    drop, target = Drop(), logging.getLogger(logger)
    target.addFilter(drop)
    handlers = [h for h in logging.getLogger().handlers + target.handlers]  # absl's handler filters too
    for handler in handlers:
        handler.addFilter(drop)
    try:
        yield
    finally:
        target.removeFilter(drop)
        for handler in handlers:
            handler.removeFilter(drop)


def refuse(program_name, message):
    """Bad input: one line on stderr, exit status 2."""
    print(f"{program_name}: error: {message}", file=sys.stderr)
    sys.exit(2)


def without_tensorflow(what):
    """One line for `what` where TensorFlow is not installed (the JAX-only
    install), or None: SavedModels, and the LiteRT and ONNX files converted
    from them, are TensorFlow graphs."""
    if _startup.installed("tensorflow"):
        return None
    return (f"{what} needs TensorFlow (SavedModel, LiteRT and ONNX files are made from TensorFlow graphs), which "
            "this Python does not have: pip install -e \".[tensorflow]\"")


def exit_without_tensorflow(name):
    """A command that is TensorFlow throughout (export): without it, one
    line and exit status 2 rather than an ImportError traceback."""
    missing = without_tensorflow(program(name))
    if missing:
        print(f"{program(name)}: error: {missing}", file=sys.stderr)
        sys.exit(2)


def tensorflow_env():
    """This process's environment with the TensorFlow backend: SavedModels
    are TensorFlow graphs, so export runs there whatever backend trained."""
    return {**os.environ, "KERAS_BACKEND": "tensorflow"}


def rerun_on_tensorflow():
    """Replaces this process by the same command on the TensorFlow backend
    (the backend is fixed once Keras is imported)."""
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    os.execve(sys.executable, [sys.executable, *argv[1:]], tensorflow_env())
