"""The command layer's plumbing: every entry point's start (`start`), absl's
flags for train.py and export, argparse for the others, one wording of errors."""

import argparse
import contextlib
import importlib
import logging
import math
import os
import re
import sys

from absl import app, flags

from keras_skipinit.cli import startup


def program(default):
    """The command's name as invoked: train.py, keras-skipinit-train, ..."""
    base = os.path.basename(sys.argv[0])
    return default if base in ("", "__main__.py", "-c") else base


HELP = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def help_text(usage, module):
    """The usage text and the command's own flags (those `module` defines),
    each with its help and default."""
    return f"{usage.rstrip()}\n\nFlags:\n{flags.FLAGS.module_help(module)}\n"


# Flags that TensorFlow and absl.testing define when they load: accepted by the pre-parse, checked by the live one.
LIBRARY_FLAGS = ("delta_threshold", "hbm_oom_exit", "op_conversion_fallback_to_while_loop", "runtime_oom_exit",
                 "tt_check_filter", "tt_single_core_summaries", "test_random_seed", "test_randomize_ordering_seed",
                 "test_srcdir", "test_tmpdir", "xml_output_file")


def start(program, command=None, training=False, keras=True):
    """An entry point's first step (train.py, `python -m ...`, the console
    scripts), before anything imports Keras: the backend checked
    (`startup.check_backend`); --help and bad flags answered by `command`'s flags
    (`preparse`: an absl command's module, or "module:function" making an
    argparse parser; none of them imports Keras); then, with `keras`, Keras
    loaded by `startup.load_keras`. Only entry points call it: importing the package
    reads no command line (issue 88.1)."""
    startup.check_backend(program, training)
    if command:
        preparse(command, program)
    if keras:
        startup.load_keras()


def preparse(command, program_name, argv=None):
    """Help, or a one-line refusal with exit status 2, for this process's
    command line before Keras loads (`command`: an absl command's module, or
    "module:function" making an argparse parser; none of them imports Keras):
    `start` calls it. The flags are the live ones (train.py's from
    `spec.Config`), so nothing can go stale; the live parse after the import
    repeats this one. Returns when the flags parse."""
    argv = list(sys.argv if argv is None else argv)
    module_name, _, parser = command.partition(":")
    module = importlib.import_module(module_name)
    if parser:  # argparse (the sweep, analysis, quantization): its own parse
        getattr(module, parser)().parse_args(argv[1:])
        return
    parse_flags(argv, module.USAGE, module, program_name, known_only=True)


def parse_flags(argv, usage, module, program_name, known_only=False):
    """Parses argv into absl's FLAGS: --help prints the usage and `module`'s
    flags (exit 0); a bad flag or a stray argument is one line (exit 2).
    known_only: flags not (yet) defined are refused unless `LIBRARY_FLAGS`."""
    if any(arg in HELP for arg in argv[1:]):
        print_help(help_text(usage, module))
    unknown = _unknown_flag(argv[1:])  # before absl's parse: its validators (a required --source) spoke first
    if unknown:
        known = [n for f in flags.FLAGS.get_flags_for_module(module) for n in (f.name, f.short_name) if n]
        refuse(program_name, f"Unknown command line flag '{unknown}'{did_you_mean(unknown, known)} (--help lists the flags)")
    try:
        rest = flags.FLAGS(argv, known_only=known_only)
    except flags.Error as e:  # a validator of several flags: absl's "flags a=1, b=2: " before its words, dropped
        refuse(program_name, f"{_MULTI_FLAG_PREFIX.sub('', str(e))} (--help lists the flags)")
    if known_only:  # the library flags, not yet defined, stay in `rest`
        rest = [rest[0]] + [a for a in rest[1:] if not a.startswith("-")]
    if len(rest) > 1:
        refuse(program_name, unexpected(rest[1:]))
    return rest


_MULTI_FLAG_PREFIX = re.compile(r"^flags (\w+=[^,]*, )*\w+=[^:]*: ")


def _flags_given(args):
    """The arguments in `args` that are flags: before "--", starting with
    "-", not "-" (stdin) nor a negative number (a value)."""
    return [a for a in args[:args.index("--") if "--" in args else len(args)]
            if a.startswith("-") and a != "-" and not _NUMBER.match(a)]


def _unknown_flag(args):
    """The first flag in `args` that neither absl's FLAGS nor `LIBRARY_FLAGS`
    defines (--noname for a boolean), or None."""
    for name in map(_flag_name, _flags_given(args)):
        if not (name in flags.FLAGS or name in LIBRARY_FLAGS or (name.startswith("no") and name[2:] in flags.FLAGS)):
            return name
    return None


def _flag_name(arg):
    name = arg.lstrip("-").split("=", 1)[0]
    return name[2:] if name.startswith("no") and name[2:] in LIBRARY_FLAGS else name


def run(main, usage, name):
    """absl's app.run with this command's usage text, also when started
    through pip's wrapper script (whose module has no docstring). --help
    (and -h, --helpfull) prints the usage and the command's own flags and
    exits 0 (absl's listed no flags, or every library's, and exited 1). Bad
    flags (an unknown one, a value outside its enum or bounds) and stray
    arguments are one line and exit status 2, as every other bad input."""
    sys.modules["__main__"].__doc__ = usage

    app.run(main, flags_parser=lambda argv: parse_flags(argv, usage, sys.modules[main.__module__], program(name)))


def print_help(text):
    """Prints --help and exits 0, also into a pipe closed early (`| head`)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    sys.exit(0)


def unexpected(arguments):
    return f"unexpected arguments: {' '.join(arguments)} (flags are --name=value; --help lists them)"


def did_you_mean(name, known):
    """" (did you mean --X?)" for the known flag name closest to a mistyped
    `name` (difflib's ratio >= 0.6), else "": every command's one wording."""
    import difflib

    close = difflib.get_close_matches(name.lstrip("-"), [k.lstrip("-") for k in known], n=1)
    return f" (did you mean --{close[0]}?)" if close else ""


_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+([eE][-+]?\d+)?$")


class ArgumentParser(argparse.ArgumentParser):
    """argparse for our commands (the sweep, its quantization step, the
    analysis CLI, predict): a bad flag is one line and exit status 2, as for
    train.py and export, not the usage block above the error. Flags are
    written in full, as absl's are (no abbreviations: --epoch is not
    --epochs), and an unknown one is named first, with the flag it is
    closest to (argparse said that a required flag was missing)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def parse_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        for name in (arg.split("=", 1)[0] for arg in _flags_given(args)):
            if name not in self._option_string_actions:
                known = [o for o in self._option_string_actions if o.startswith("--")]
                self.error(f"unrecognized argument {name}{did_you_mean(name, known)}")
        return super().parse_args(args, namespace)

    def error(self, message):
        refuse(self.prog, f"{message} (--help lists the flags)")


def _number(text, convert, fits, expected):
    """An argparse type's value: `convert(text)` where `fits` it, else one line saying what was expected."""
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not fits(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text):
    """An argparse type: a whole number >= 1, else one line saying so."""
    return _number(text, int, lambda v: v >= 1, "a positive integer")


def non_negative_int(text):
    """An argparse type: a whole number >= 0 (a seed: NumPy refuses negative ones, late, as a traceback)."""
    return _number(text, int, lambda v: v >= 0, "a whole number >= 0")


def positive_finite(text):
    """An argparse type: a finite number > 0 (a learning rate)."""
    return _number(text, float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def numbers(convert, text, expected):
    """`convert` over a comma-separated flag value; a bad item is one argparse
    line saying what was expected (not "invalid _ints value")."""
    try:
        return [convert(v) for v in text.split(",")]
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def positive_ints(text):
    """An argparse type: whole numbers >= 1 separated by commas."""
    return numbers(positive_int, text, "positive integers separated by commas (e.g. 16,100)")


def writable_directory(text):
    """An argparse type: a directory that exists or can be made, and can be
    written (`files.check_writable`): refused before any work is done, not
    when its results are written."""
    from keras_skipinit import files
    try:
        files.check_writable(text)  # argparse names the flag
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


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
    if startup.installed("tensorflow"):
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
