"""One command layer (issue 88.2): every command's flags are a
`parsing.Command` on absl's flags, parsed and worded in one place. In this
process (no Keras loads for a parse)."""

import ast
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# command -> (its parse of argv, a flag it has, a typo of that flag)
COMMANDS = {
    "train.py": ("keras_skipinit.cli.train_cli:parse", "learning_rate", "learningrate"),
    "export": ("keras_skipinit.cli.export_cli:parse", "source", "sorce"),
    "python -m keras_skipinit.predict": ("keras_skipinit.predict.cli:parse", "top_k", "topk"),
    "python -m keras_skipinit.sweep": ("keras_skipinit.sweep.cli:parse_args", "epochs", "epoch"),
    "python -m keras_skipinit.sweep.quantization": ("keras_skipinit.sweep.cli:parse_quantization", "check_images",
                                                    "check_image"),
    "python -m keras_skipinit.analysis": ("keras_skipinit.analysis.flags:parse", "depth", "depht"),
}


def _parse(target, argv):
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)(argv)


def test_no_module_of_the_package_uses_another_flag_library():
    """argparse gone from the package: its commands parse with absl only, through `parsing.Command`."""
    users = []
    for folder, _, names in os.walk(os.path.join(ROOT, "keras_skipinit")):
        for name in (n for n in names if n.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path) as f:
                tree = ast.parse(f.read())
            imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
            imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
            if "argparse" in imported:
                users.append(os.path.relpath(path, ROOT))
    assert users == []


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_names_an_unknown_flag_with_the_closest_one_in_one_line(name, capsys):
    target, flag, typo = COMMANDS[name]
    with pytest.raises(SystemExit) as stop:
        _parse(target, [f"--{typo}=1"])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"{name}: error: unknown flag --{typo} (did you mean --{flag}?) (--help lists the flags)"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_answers_help_with_its_flags(name, capsys):
    target, flag, _ = COMMANDS[name]
    with pytest.raises(SystemExit) as stop:
        _parse(target, ["--help"])
    assert stop.value.code == 0 and f"--{flag}:" in capsys.readouterr().out


def test_a_bad_value_a_missing_flag_and_a_stray_argument_are_each_one_line(capsys):
    cases = [("keras_skipinit.cli.train_cli:parse", ["--epochs=0"], "train.py: error: --epochs=0: epochs must be an "
              "integer from 1 to 1000000, got 0"),
             ("keras_skipinit.cli.export_cli:parse", ["--format=onnx"], "export: error: --source is required"),
             ("keras_skipinit.cli.train_cli:parse", ["stray"], "train.py: error: unexpected arguments: stray"),
             ("keras_skipinit.sweep.cli:parse_args", ["--depths=16,a"], "python -m keras_skipinit.sweep: error: "
              "--depths=16,a: expected positive integers separated by commas")]
    for target, argv, start in cases:
        with pytest.raises(SystemExit) as stop:
            _parse(target, argv)
        (line,) = capsys.readouterr().err.splitlines()
        assert stop.value.code == 2 and line.startswith(start), (argv, line)


def test_absl_syntax_in_every_command(tmp_path):
    """--name value, --noname and argparse's --no-name (the committed sweeps' commands) for a boolean, --name=false."""
    out = str(tmp_path / "out")
    for negation in ("--noextend_grid", "--no-extend_grid", "--extend_grid=false"):
        args = _parse("keras_skipinit.sweep.cli:parse_args", ["--preset=fixup_fig3", negation, "--out", out])
        assert args.extend_grid is False and args.out == out and args.depths == [16, 52, 100]  # the preset's
    args = _parse("keras_skipinit.sweep.cli:parse_args", ["--preset=fixup_fig3", "--depths=10", f"--out={out}"])
    assert args.depths == [10]  # a flag given wins over the preset
    args = _parse("keras_skipinit.cli.train_cli:parse", ["--alpha_init=0.5", "--depth", "10"])
    assert args.alpha_init == 0.5 and args.depth == 10
    args = _parse("keras_skipinit.predict.cli:parse", [f"--source={tmp_path}", "a.png", "--top_k=2", "b.png"])
    assert args.images == ["a.png", "b.png"] and args.top_k == 2


def test_each_parse_starts_from_the_defaults():
    """A command's flags are its own (not absl's global FLAGS): a second parse in the process does not keep the first's."""
    from absl import flags

    first = _parse("keras_skipinit.cli.train_cli:parse", ["--epochs=7"])
    second = _parse("keras_skipinit.cli.train_cli:parse", [])
    assert (first.epochs, second.epochs) == (7, 12) and "epochs" not in flags.FLAGS
