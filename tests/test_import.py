"""Importing the package is a library import (issue 88.1): it reads no
command line and loads no Keras; a .keras file of ours loads after it, in
either order of `import keras`."""

import json
import os
import subprocess
import sys

import keras
import pytest

from keras_skipinit import applications as apps, layers as ksl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USER_SCRIPT = """
import argparse
import keras_skipinit

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float)
args = parser.parse_args()
model = keras_skipinit.applications.create_model("wrn_16_1", input_shape=(8, 8, 3), classes=3)
print(args.lr, model.count_params())
"""


def run(args, cwd, **env):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3", **env})


@pytest.mark.heavy
def test_a_users_own_train_py_with_its_own_flags_imports_the_package(tmp_path):
    """A user's script named train.py, parsing its own --lr, exited 2 ("Unknown
    command line flag 'lr'"): the package's import parsed the caller's argv as
    our train.py's."""
    (tmp_path / "train.py").write_text(USER_SCRIPT)
    proc = run(["train.py", "--lr=0.1"], tmp_path)
    expected = apps.create_model("wrn_16_1", input_shape=(8, 8, 3), classes=3).count_params()
    assert proc.returncode == 0 and proc.stdout.split() == ["0.1", str(expected)], proc.stderr[-2000:]


def test_importing_reads_no_argv_and_loads_no_keras(tmp_path):
    """Foreign flags, --help included, and our own commands' names in argv:
    the import answers none of them and loads no Keras (or TensorFlow)."""
    probe = ("import sys, keras_skipinit, keras_skipinit.sweep, keras_skipinit.predict; "
             "print(sorted(m for m in ('keras', 'tensorflow', 'jax') if m in sys.modules))")
    for argv in (["--lr=0.1"], ["--help"], ["--epochs=x", "--bogus"]):
        proc = run(["-c", probe, *argv], tmp_path)
        assert proc.returncode == 0 and proc.stdout.strip() == "[]", (argv, proc.stdout, proc.stderr[-2000:])


LOAD_SCRIPT = """
import json, sys
if sys.argv[1] == "keras first":
    import keras
    import keras_skipinit
else:
    import keras_skipinit
    import keras
model = keras.saving.load_model(sys.argv[2])
print(json.dumps([type(layer).__name__ for layer in model.layers]))
"""


@pytest.mark.heavy
def test_a_keras_file_of_ours_loads_after_the_import_in_either_order(tmp_path):
    """`import keras_skipinit` registers our layers with Keras now where it is
    loaded, else when it loads (the import itself loads no Keras)."""
    inputs = keras.Input((4, 4, 2))
    x = ksl.GhostBatchNormalization(ghost_batch_size=2)(inputs)
    model = keras.Model(inputs, ksl.FixupBias()(ksl.SkipInitScale()(x)))
    path = str(tmp_path / "m.keras")
    model.save(path)
    expected = [type(layer).__name__ for layer in model.layers]
    for order in ("keras first", "package first"):
        proc = run(["-c", LOAD_SCRIPT, order, path], tmp_path)
        assert proc.returncode == 0, (order, proc.stderr[-2000:])
        assert json.loads(proc.stdout.strip().splitlines()[-1]) == expected, order


def test_the_public_names_outlive_the_move_into_folders():
    """Issue 88.7: the modules moved into folders by concern; the names users
    imported before (`keras_skipinit.training.train`, `from keras_skipinit
    import data, digits, pipelines, run_dir`, `analysis.block_statistics`)
    are the same objects as the modules' own, and a name no module has is an
    AttributeError, not a silent None."""
    import keras_skipinit as ks
    from keras_skipinit.analysis import propagation, step
    from keras_skipinit.data import digits, pipelines, sources
    from keras_skipinit.serving import savedmodel
    from keras_skipinit.training import run_dir, trainer

    assert (ks.training.train, ks.training.Config) == (trainer.train, trainer.Config)
    assert (ks.data.load, ks.data.Dataset, ks.serving.export) == (sources.load, sources.Dataset, savedmodel.export)
    assert (ks.analysis.block_statistics, ks.analysis.function_change) == (
        propagation.block_statistics, step.function_change)
    assert (ks.digits, ks.pipelines, ks.run_dir) == (digits, pipelines, run_dir)
    assert ks.data.pipelines is pipelines  # a folder's own module, not a name its lender happens to hold
    import importlib.util

    for name in ks.MODULES:  # each names a module (found, not imported: train_cli's and export_cli's absl
        assert importlib.util.find_spec(ks.MODULES[name]) is not None, name  # flags cannot share one process)
    for package in (ks.data, ks.training, ks.serving, ks.analysis):
        with pytest.raises(AttributeError, match="no_such_name"):
            package.no_such_name


def test_the_package_is_in_folders_by_concern():
    """Issue 88.7's limits: at most 15 modules flat at the top of the package
    (the rest in folders by concern) and every module at most 420 lines."""
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "keras_skipinit")
    top = [name for name in os.listdir(root) if name.endswith(".py")]
    assert len(top) <= 15, sorted(top)
    long = {}
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    lines = sum(1 for _ in f)
                if lines > 420:
                    long[os.path.relpath(os.path.join(folder, name), root)] = lines
    assert not long, long
