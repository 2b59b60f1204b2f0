"""The command layer: every entry point's start (`start`), every command's
flags (`Command`, on absl's flags), one wording of errors."""

import contextlib
import importlib
import textwrap
import logging
import math
import os
import re
import sys
import types

from absl import flags

from keras_skipinit.cli import startup


def program(default):
    """The command's name as invoked: train.py, keras-skipinit-train, ..."""
    base = os.path.basename(sys.argv[0])
    return default if base in ("", "__main__.py", "-c") else base


def start(program, command=None, training=False, keras=True):
    """An entry point's first step (train.py, `python -m ...`, the console
    scripts), before anything imports Keras: the backend checked
    (`startup.check_backend`); --help and bad flags answered by `command`
    ("module:function", the command's parse of argv; no such module imports
    Keras); then, with `keras`, Keras loaded by `startup.load_keras`. Returns
    the parse's value (the command's settings): train.py and export run on it
    (the sweep, analysis and quantization parse again in their main, which
    their tests call with an argv). Only entry points call it: importing the
    package reads no command line (issue 88.1)."""
    startup.check_backend(program, training)
    args = preparse(command) if command else None
    if keras:
        startup.load_keras()
    return args


def preparse(command, argv=None):
    """Help, or a one-line refusal with exit status 2, for this process's
    command line before Keras loads: `command` is "module:function", the
    function the command parses its argv with (the live flags, so nothing can
    go stale). Returns what it returns when the flags parse."""
    module_name, _, function = command.partition(":")
    return getattr(importlib.import_module(module_name), function)(sys.argv[1:] if argv is None else list(argv))


def _flags_given(args):
    """The arguments in `args` that are flags: before "--", starting with
    "-", not "-" (stdin) nor a negative number (a value)."""
    return [a for a in args[:args.index("--") if "--" in args else len(args)]
            if a.startswith("-") and a != "-" and not _NUMBER.match(a)]


HELP = ("--help", "-h", "-?", "--helpshort", "--helpfull")


class _Value(flags.ArgumentParser):
    """absl's parser of one flag: `convert` makes the value from the text (a
    ValueError's words are the line said), then `choices` are checked. A value
    that is not text (a default, a preset's) is taken as it is."""

    def __init__(self, convert, choices, kind):
        self.convert, self.choices, self.kind = convert, choices, kind
        self.syntactic_help = f"one of: {', '.join(map(str, choices))}" if choices else ""

    def parse(self, argument):
        if not isinstance(argument, str):
            return argument
        value = self.convert(argument) if self.convert else argument
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"expected one of {', '.join(map(str, self.choices))}, got {argument!r}")
        return value

    def flag_type(self):
        return self.kind


def _builtin(convert):
    """int and float as flag types: their error said as "expected an integer" (`_number`), not int()'s words."""
    return lambda text: _number(text, convert, lambda value: True, "an integer" if convert is int else "a number")


class Command:
    """One command's flags (issue 88.2): every command (train.py, export,
    predict, the sweep and its quantization step, analysis) declares its flags
    with `add_argument` (argparse's words; the declarations are data, spec's
    settings enter through `spec.add_arguments`) and parses them with absl's
    flags, the one flag library: train.py's syntax (--name=value, --name value,
    --[no]name; --no-name too). Each command has its own FlagValues, so none
    touches absl's global FLAGS and commands share a process. Here, and only
    here, --help is answered and bad input worded: an unknown flag is named
    with the closest known one; a bad value, a missing required flag, a stray
    argument or a failed `check` is one line and exit status 2."""

    def __init__(self, name, description="", as_invoked=False):
        self.name, self.description, self.as_invoked = name, description, as_invoked
        self.flag_values = flags.FlagValues()
        self.names, self.required, self.checks, self.positional = [], [], [], None

    def add_argument(self, option, *, type=None, default=None, choices=None, help="", action=None, required=False,
                     nargs=None):
        """A flag ("--name"), or the one positional argument ("name", nargs="+" or "*")."""
        if not option.startswith("--"):
            self.positional = (option, help, nargs == "+")
            return
        name = option[2:]
        if action == "boolean":
            flags.DEFINE_boolean(name, bool(default), help, flag_values=self.flag_values, module_name=self.name)
        else:
            convert = _builtin(type) if type in (int, float) else type
            flags.DEFINE(_Value(convert, None if choices is None else tuple(choices), getattr(type, "__name__", "string")),
                         name, default, help, flag_values=self.flag_values, serializer=flags.ArgumentSerializer(),
                         module_name=self.name)
        self.names.append(name)
        if required:
            self.required.append(name)

    def check(self, rule):
        """`rule(args)` -> the words of a broken rule across flags, or None: run after each parse."""
        self.checks.append(rule)

    def parse_args(self, argv=None, defaults=None):
        """argv (default: this process's, after its name) -> a namespace of
        every flag's value (and the positional argument's list); `defaults(values)`
        -> {name: value} for flags not given (a preset's). Refuses bad input
        (`error`); --help prints `format_help` and exits 0."""
        argv = [f"--no{a[5:]}" if a.startswith("--no-") and a[5:] in self.names else a
                for a in (sys.argv[1:] if argv is None else argv)]
        given = _flags_given(argv)
        if any(arg in HELP for arg in given):
            print_help(self.format_help())
        fv = self.flag_values
        for arg in given:
            name = arg.lstrip("-").split("=", 1)[0]
            if name not in fv and not (name.startswith("no") and name[2:] in fv and fv[name[2:]].boolean):
                self.error(f"unknown flag --{name}{did_you_mean(name, self.names)}")
        fv.unparse_flags()
        try:
            rest = fv([self.prog, *argv])[1:]
        except flags.Error as e:
            self.error(str(e).removeprefix("flag "))
        values = {name: fv[name].value for name in self.names}
        for name, value in (defaults(values) if defaults else {}).items():
            if not fv[name].present:
                values[name] = value
        if self.positional:
            name, help, needed = self.positional
            if needed and not rest:
                self.error(f"no {name} given ({help})")
            values[name] = rest
        elif rest:
            self.error(unexpected(rest))
        for name in self.required:
            if values[name] is None:
                self.error(f"--{name} is required: {fv[name].help}")
        args = types.SimpleNamespace(**values)
        for rule in self.checks:
            words = rule(args)
            if words:
                self.error(words)
        return args

    def format_help(self):
        """The description and each flag: its help, choices and default."""
        lines = [self.description.rstrip(), "", "Flags:"]
        if self.positional:
            lines.append(f"  {self.positional[0]}{' ...' if self.positional[2] else ''}: {self.positional[1]}")
        for name in self.names:
            flag = self.flag_values[name]
            shown = f"--[no]{name}" if flag.boolean else f"--{name}"
            default = flag.default
            default = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
            syntax = getattr(flag.parser, "syntactic_help", "")
            help = " ".join(part for part in (flag.help.replace("(no help available)", ""), f"({syntax})" if syntax else "",
                                              f"(default: {default!r})" if default not in (None, "") else "") if part)
            lines.append(textwrap.fill(help, 110, initial_indent=f"  {shown}: ", subsequent_indent="      "))
        return "\n".join(lines) + "\n"

    @property
    def prog(self):
        """The command's name in its lines: `name`, or with `as_invoked` the name it was started by
        (train.py, keras-skipinit-train; read when said: importing a command reads no argv)."""
        return program(self.name) if self.as_invoked else self.name

    def error(self, message):
        refuse(self.prog, f"{message} (--help lists the flags)")


def print_help(text):
    """Prints --help and exits 0, also into a pipe closed early (`| head`)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    sys.exit(0)


def unexpected(arguments):
    return f"unexpected arguments: {' '.join(arguments)} (flags are --name=value)"


def did_you_mean(name, known):
    """" (did you mean --X?)" for the known flag name closest to a mistyped
    `name` (difflib's ratio >= 0.6), else "": every command's one wording."""
    import difflib

    close = difflib.get_close_matches(name.lstrip("-"), [k.lstrip("-") for k in known], n=1)
    return f" (did you mean --{close[0]}?)" if close else ""


_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+([eE][-+]?\d+)?$")


def _number(text, convert, fits, expected):
    """A flag type's value: `convert(text)` where `fits` it, else one line saying what was expected."""
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not fits(value):
        raise ValueError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text):
    """A flag type: a whole number >= 1, else one line saying so."""
    return _number(text, int, lambda v: v >= 1, "a positive integer")


def non_negative_int(text):
    """A flag type: a whole number >= 0 (a seed: NumPy refuses negative ones, late, as a traceback)."""
    return _number(text, int, lambda v: v >= 0, "a whole number >= 0")


def positive_finite(text):
    """A flag type: a finite number > 0 (a learning rate)."""
    return _number(text, float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def numbers(convert, text, expected):
    """`convert` over a comma-separated flag value; a bad item is one argparse
    line saying what was expected (not "invalid _ints value")."""
    try:
        return [convert(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"expected {expected}, got {text!r}") from None


def positive_ints(text):
    """A flag type: whole numbers >= 1 separated by commas."""
    return numbers(positive_int, text, "positive integers separated by commas (e.g. 16,100)")


def writable_directory(text):
    """A flag type: a directory that exists or can be made, and can be
    written (`files.check_writable`): refused before any work is done, not
    when its results are written."""
    from keras_skipinit import files
    try:
        files.check_writable(text)  # argparse names the flag
    except ValueError as e:
        raise ValueError(str(e)) from None
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
