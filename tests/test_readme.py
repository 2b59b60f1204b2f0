"""The code blocks of the README and the guides as CI runs them
(.ci/readme_blocks.py: page by page, in order, in a fresh clone): what can be
checked without running them; and the documentation's pages and links."""

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
    return [(page, command) for page, section, language, commands in readme_blocks.all_blocks()
            for command in commands]


def test_every_skip_reason_is_used_and_the_main_commands_run():
    """A skip pattern no command matches is stale; the quick start and the Deploy block run."""
    commands = [command for _, command in _commands()]
    for pattern, reason in readme_blocks.SKIP:
        assert any(re.search(pattern, c) for c in commands), f"no README command is skipped for: {reason}"
    ran = [c for page, c in _commands() if readme_blocks.classify(page, c)[1] is None]
    assert "python train.py" in ran and any("--format=onnx" in c for c in ran)
    assert any(c.startswith("KERAS_BACKEND=jax python train.py") for c in ran)


def test_the_train_commands_that_run_do_not_collide_in_one_model_dir():
    """The README's JAX commands trained into the quick start's runs/default with other flags, which
    refuses them ("holds a run with other flags: --depth"): each runnable train.py command names a
    model_dir of its own, or gives that run's own flags."""
    by_dir = {}
    for page, command in _commands():
        if "train.py" not in command or readme_blocks.classify(page, command)[1] is not None:
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
    for page, section, language, commands in readme_blocks.all_blocks():
        for command in commands:
            if readme_blocks.classify(page, command)[1] is None:
                assert not re.search(r"""(^|[\s="'])/(tmp|var|home)/""", command), command


DOC_PAGES = ("README.md", "docs/index.md", *readme_blocks.PAGES[1:])


def test_the_front_page_is_short_and_the_guides_are_the_sites_nav():
    """Issue 89.7: the README is a front page (at most 250 lines, no line a wall); the guides CI runs
    are the site's guides, in the same order (mkdocs.yml's nav)."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read().splitlines()
    assert len(readme) <= 250, len(readme)
    assert max(len(line) for line in readme) <= 200
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        nav = re.findall(r"^\s+- (guides/\w+\.md)$", f.read(), re.M)
    assert nav == [page[len("docs/"):] for page in readme_blocks.PAGES[1:]]


def test_every_relative_link_of_the_docs_resolves():
    """A guide moved out of the README keeps its links true: every relative link (and image) of the
    README and the guides names a file or folder of the repository."""
    broken = []
    for page in DOC_PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+://", path) and not os.path.exists(
                    os.path.join(ROOT, os.path.dirname(page), path)):
                broken.append(f"{page}: {target}")
    assert not broken, broken


def _public_modules():
    found = []
    for folder, dirs, names in os.walk(os.path.join(ROOT, "keras_skipinit")):
        dirs[:] = [d for d in dirs if not d.startswith("__")]
        package = os.path.relpath(folder, ROOT).replace(os.sep, ".")
        for name in names:
            module = package if name == "__init__.py" else f"{package}.{name[:-3]}"
            if name.endswith(".py") and name != "__main__.py" and not any(
                    part.startswith("_") for part in module.split(".")):
                found.append(module)
    return found


def test_the_api_reference_has_every_public_module_once():
    """Every public module (no part of its name private) is rendered by exactly one `::: module` of
    docs/api/, and every page there is in the site's nav: a new module cannot go undocumented."""
    rendered = []
    for name in os.listdir(os.path.join(ROOT, "docs", "api")):
        with open(os.path.join(ROOT, "docs", "api", name), encoding="utf-8") as f:
            rendered += [line[4:].strip() for line in f if line.startswith("::: ")]
    assert sorted(rendered) == sorted(_public_modules())
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        nav = set(re.findall(r"^\s+- (api/\w+\.md)$", f.read(), re.M))
    assert nav == {f"api/{name}" for name in os.listdir(os.path.join(ROOT, "docs", "api"))}
