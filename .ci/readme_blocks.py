"""The code blocks of the README and the guides, run in order as a new user
would run them.

CI runs this in a fresh clone of the commit, in its second stage (every extra
installed: `--stage=tensorflow`) and its third (`.[jax]` without TensorFlow:
`--stage=jax`): each command of a ```bash block, and each ```python block,
page by page in `PAGES`' order (the README, then the guides as mkdocs.yml's
nav lists them), in the clone's root, one shell each. A command that exits
non-zero fails the run. The JAX guide's blocks run in the JAX stage, the
others in the TensorFlow stage.

Not every command can run on CI's machine (no internet, no Docker, one host):
`SKIP` says, by pattern, which ones do not and why. A command that neither
runs nor matches a reason is an error here and in tests/test_readme.py, so a
new README command is either run by CI or said not to be.

    python .ci/readme_blocks.py --stage=tensorflow     # run the blocks
    python .ci/readme_blocks.py --list                 # how each command is classified
"""

import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDES = ("models", "training", "own_images", "serving", "experiments", "jax_and_clusters", "contributing")
PAGES = ("README.md", *(f"docs/guides/{name}.md" for name in GUIDES))
JAX_PAGE = "docs/guides/jax_and_clusters.md"

# (pattern, why the command does not run in CI): searched in the command, continuation lines joined.
SKIP = [
    (r"^python3 -m venv", "CI's stage made its venv"),
    (r"^pip install", "CI's stage installed it (and more) in its venv"),
    (r"^python -m pytest", "CI's first stage runs the test command on the README's install"),
    (r"--dataset=(cifar10|imagenet2012)\b", "a TFDS download (CI has no internet)"),
    (r"^docker ", "Docker and TF Serving's image (a download)"),
    (r"^curl ", "a TF Serving server (the docker command)"),
    (r"^ray start|--executor=ray", "a Ray cluster"),
    (r"KERAS_DISTRIBUTION_NUM_PROCESSES", "several hosts"),
    (r"--function_change --depths=16,100,1000", "builds WRN-1000 unrolled: minutes (its toy size is tested)"),
    (r"WideResNet\(1000, 2, normalization=\"skipinit\"\)", "builds WRN-1000-2 and four ResNet-50s (80 s on 2 cores); the constructors are tested "
                            "at small size"),
]


def blocks(page):
    """[(section, language, [command or program, ...])] of a page's ```bash
    and ```python blocks in order: a bash block's commands one a line
    (continuations joined, comments and blank lines left out), a python block
    whole."""
    found, section, lines, language = [], "", [], None
    for line in open(os.path.join(ROOT, page), encoding="utf-8").read().splitlines():
        if language is None:
            if line.startswith("#"):
                section = line
            match = re.fullmatch(r"```(bash|python)", line.strip())
            if match:
                language, lines = match[1], []
            continue
        if line.strip() == "```":
            found.append((section, language, _commands(lines) if language == "bash" else ["\n".join(lines)]))
            language = None
        else:
            lines.append(line)
    return found


def _commands(lines):
    commands, current = [], ""
    for line in lines:
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip()[:-1] + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            commands.append(" ".join(current.split()))
            current = ""
    return commands


def all_blocks():
    """[(page, section, language, commands)] of every page in `PAGES`' order."""
    return [(page, *block) for page in PAGES for block in blocks(page)]


def classify(page, command):
    """('tensorflow' or 'jax', None) for a command that runs in that stage, or (stage, reason) for one that does not."""
    stage = "jax" if page == JAX_PAGE else "tensorflow"
    for pattern, reason in SKIP:
        if re.search(pattern, command):
            return stage, reason
    return stage, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=("tensorflow", "jax"))
    parser.add_argument("--list", action="store_true", help="print how each command is classified")
    args = parser.parse_args()
    failed = []
    for page, section, language, commands in all_blocks():
        for command in commands:
            stage, reason = classify(page, command)
            shown = command.splitlines()[0][:110]
            if args.list or stage != args.stage:
                if args.list:
                    print(f"{stage:10} {'skip: ' + reason if reason else 'run'} | {shown}")
                continue
            if reason:
                print(f"skipped ({reason}): {shown}", flush=True)
                continue
            print(f"$ {shown}", flush=True)
            start = time.time()
            argv = ["bash", "-c", command] if language == "bash" else [sys.executable, "-c", command]
            proc = subprocess.run(argv, cwd=ROOT)
            print(f"  exit {proc.returncode} after {time.time() - start:.0f} s", flush=True)
            if proc.returncode:
                failed.append(shown)
    if failed:
        print(f"{len(failed)} command(s) of the README and guides failed: {failed}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
