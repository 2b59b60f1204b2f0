"""The README's code blocks as CI runs them (.ci/readme_blocks.py: in order, in
a fresh clone): what can be checked without running them."""

import importlib.util
import os
import re
import shlex

from keras_skipinit.training import run_dir
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("readme_blocks", os.path.join(ROOT, ".ci", "readme_blocks.py"))
readme_blocks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_blocks)


def _commands():
    return [(section, command) for section, language, commands in readme_blocks.blocks(os.path.join(ROOT, "README.md"))
            for command in commands]


def test_every_skip_reason_is_used_and_the_main_commands_run():
    """A skip pattern no command matches is stale; the quick start and the Deploy block run."""
    commands = [command for _, command in _commands()]
    for pattern, reason in readme_blocks.SKIP:
        assert any(re.search(pattern, c) for c in commands), f"no README command is skipped for: {reason}"
    ran = [c for section, c in _commands() if readme_blocks.classify(section, c)[1] is None]
    assert "python train.py" in ran and any("--format=onnx" in c for c in ran)
    assert any(c.startswith("KERAS_BACKEND=jax python train.py") for c in ran)


def test_the_train_commands_that_run_do_not_collide_in_one_model_dir():
    """The README's JAX commands trained into the quick start's runs/default with other flags, which
    refuses them ("holds a run with other flags: --depth"): each runnable train.py command names a
    model_dir of its own, or gives that run's own flags."""
    by_dir = {}
    for section, command in _commands():
        if "train.py" not in command or readme_blocks.classify(section, command)[1] is not None:
            continue
        words = shlex.split(command.split("#")[0])
        flags = {w.split("=")[0].lstrip("-"): w.split("=", 1)[-1] for w in words if w.startswith("--")}
        env = tuple(sorted(w for w in words if re.fullmatch(r"[A-Z_]+=\S+", w)))
        model_dir = flags.pop("model_dir", "runs/default")
        kept = ({k: v for k, v in flags.items() if k not in run_dir.REUSABLE_FLAGS}, env)
        by_dir.setdefault(model_dir, kept)
        assert by_dir[model_dir] == kept, f"{command!r} trains into {model_dir} with other flags than the README's first run there"


def test_the_commands_that_run_write_inside_the_clone():
    """CI's README run found /tmp/digits.tflite from an earlier run on the same machine ("exists; pass
    --overwrite"): what the runnable commands write goes inside the clone, which each run makes afresh."""
    for section, language, commands in readme_blocks.blocks(os.path.join(ROOT, "README.md")):
        for command in commands:
            if readme_blocks.classify(section, command)[1] is None:
                assert not re.search(r"""(^|[\s="'])/(tmp|var|home)/""", command), command
