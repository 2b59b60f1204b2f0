"""Help and flag refusals before Keras loads TensorFlow.

`import keras` loads TensorFlow: 7 s on an idle machine, over a minute under
load, before absl could print --help or refuse `--depth=abc`. Each command's
flag table (train.py's and export's: names, kinds, defaults, choices, bounds,
checks, and the help text) is therefore kept as data in flag_tables.json,
written from the live flags by `python -m keras_skipinit._flag_table` (a test
fails when it differs from them). The package's `__init__` calls `preparse`
for these commands before importing Keras: absl parses argv against a fresh
FlagValues made from the table, so help, unknown flags, bad values and stray
arguments get the same text and exit status as from the live flags, in a
fraction of a second. What only the live code can check (a depth the
architecture does not take, a missing dataset) is checked after the import,
as before. Flags other libraries define (absl's logging, TensorFlow's) are
accepted here as any value and checked by the live parse.

The argparse commands (the sweep, its quantization step, the analysis CLI)
keep only their help text here (`-h`/`--help`, rendered at 80 columns):
their refusals come from checks that read the live data (methods, presets)
and still wait for the import.
"""

import json
import math
import os
import subprocess
import sys

from absl import flags

from keras_skipinit import _cli, _startup

COMMANDS = {"train": "keras_skipinit.train_cli", "export": "keras_skipinit.export_cli"}
HELP_COMMANDS = {"sweep": "keras_skipinit.sweep.cli", "analysis": "keras_skipinit.analysis",
                 "quantization": "keras_skipinit.sweep.quantization"}  # argparse: their build_parser()
ARGPARSE_HELP = ("-h", "--help")
TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flag_tables.json")
_DEFINE = {"int": flags.DEFINE_integer, "float": flags.DEFINE_float, "bool": flags.DEFINE_bool,
           "string": flags.DEFINE_string, "enum": flags.DEFINE_enum}


# --- checks beyond absl's kinds and bounds, as data (the live flags register the same) ---------------

def check(spec):
    """(predicate, message) of a check spec: ["positive"] or ["float_or", names]."""
    kind, *args = spec
    if kind == "positive":
        return (lambda v: v is None or (v > 0 and math.isfinite(v))), "must be a finite number > 0"
    if kind == "finite":
        return (lambda v: v is None or math.isfinite(v)), "must be a finite number"
    if kind == "float_or":
        names = args[0]

        def float_or(v):
            if v is None or v in names:
                return True
            try:
                return math.isfinite(float(v))
            except ValueError:
                return False
        return float_or, f"must be a finite float or one of {sorted(names)}"
    raise ValueError(f"unknown flag check {kind!r}")


def register_checks(checks, flag_values=flags.FLAGS):
    """Registers `checks` ({flag: spec}) as absl validators."""
    for name, spec in checks.items():
        predicate, message = check(spec)
        flags.register_validator(name, predicate, f"--{name} {message}", flag_values=flag_values)


# --- the table, from the live flags --------------------------------------------------------------------

def table(module):
    """The flag table of a command module (imported, its flags defined)."""
    by_module = flags.FLAGS.flags_by_module_dict()
    own = {flag.name for flag in by_module.get(module.__name__, ())}
    records = []
    for flag in sorted({flag.name: flag for fl in by_module.values() for flag in fl}.values(), key=lambda f: f.name):
        name = flag.name
        if name in ("help", "helpshort", "helpfull", "helpxml"):  # _cli's help
            continue
        record = {"name": name, "kind": flag.flag_type().split()[-1], "short_name": flag.short_name}
        if name in own:
            parser = flag.parser
            record.update(default=flag.default, required=any(
                "must have a value other than None" in v.message for v in flag.validators))
            if record["kind"] == "enum":
                record["enum_values"] = list(parser.enum_values)
            for bound in ("lower_bound", "upper_bound"):
                if getattr(parser, bound, None) is not None:
                    record[bound] = getattr(parser, bound)
            if name in getattr(module, "FLAG_CHECKS", {}):
                record["check"] = list(module.FLAG_CHECKS[name])
        else:
            record["kind"] = "bool" if record["kind"] == "bool" else "string"  # checked by the live parse
            record["library"] = True
        records.append(record)
    return {"help": _cli.help_text(module.USAGE, module), "flags": records}


def help_table(module):
    """An argparse command's table: its help text only."""
    return {"help": module.build_parser().format_help().rstrip("\n")}


def live_tables():
    """Every command's table from its live flags: each absl command in a
    process of its own (both define --dataset), the argparse ones in one."""
    code = "import json, sys, importlib; from keras_skipinit import _flag_table; print(json.dumps(" \
           "{c: getattr(_flag_table, k)(importlib.import_module(m)) for c, k, m in json.loads(sys.argv[1])}))"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "COLUMNS": "80"}  # absl and argparse wrap at COLUMNS
    groups = [[(c, "table", m)] for c, m in COMMANDS.items()] + [[(c, "help_table", m) for c, m in HELP_COMMANDS.items()]]
    procs = [(group, subprocess.Popen([sys.executable, "-c", code, json.dumps(group)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env)) for group in groups]
    tables = {}
    for group, proc in procs:
        out, err = proc.communicate(timeout=600)
        if proc.returncode:
            raise RuntimeError(f"reading {[c for c, _, _ in group]}'s flags failed:\n{err[-3000:]}")
        tables.update(json.loads(out.strip().splitlines()[-1]))
    return tables


# --- the pre-parse ----------------------------------------------------------------------------------------

def _flag_values(records):
    values = flags.FlagValues()
    for r in records:  # a library flag's record has no default, bounds or choices: any value parses
        default = r.get("default", False if r["kind"] == "bool" else None)
        extra = {k: r[k] for k in ("lower_bound", "upper_bound", "enum_values") if k in r}
        _DEFINE[r["kind"]](name=r["name"], default=default, help="", short_name=r["short_name"], flag_values=values,
                           **extra)
        if r.get("required"):
            flags.mark_flag_as_required(r["name"], flag_values=values)
    register_checks({r["name"]: r["check"] for r in records if "check" in r}, values)
    return values


def preparse(name, argv=None):
    """Help, or a one-line refusal with exit status 2, for this process's
    command line (`name`: `_startup.flag_command()`), from the command's flag
    table, before Keras is imported. Returns (nothing is done) when the flags
    parse; the live parse follows."""
    argv = list(sys.argv if argv is None else argv)
    try:
        with open(TABLES) as f:
            entry = json.load(f)[name]
    except (OSError, ValueError, KeyError):  # no table (a broken install): the live parse checks everything
        return
    if name in HELP_COMMANDS:
        if any(arg in ARGPARSE_HELP for arg in argv[1:]):
            _cli.print_help(entry["help"])
        return
    if argv[0] == "-m":  # runpy imports the package before it sets argv[0] to the module's file
        module = _startup._invocation()[1]
        program = "export" if module == "export" else module.rsplit(".", 1)[-1] + ".py"
    else:
        program = _cli.program({"train": "train.py", "export": "export"}[name])
    if any(arg in _cli.HELP for arg in argv[1:]):
        _cli.print_help(entry["help"])
    try:
        rest = _flag_values(entry["flags"])(argv)
    except flags.Error as e:
        _cli.refuse(program, f"{e} (--help lists the flags)")
    if len(rest) > 1:
        _cli.refuse(program, _cli.unexpected(rest[1:]))


if __name__ == "__main__":
    with open(TABLES, "w") as f:
        json.dump(live_tables(), f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {TABLES}")
