"""docs/jax_parity/paired.py's report (issue 90.4): the paired differences of
TensorFlow and JAX runs that share their initial weights and batches."""

import importlib.util
import json
import math
import os
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("paired", os.path.join(ROOT, "docs", "jax_parity", "paired.py"))
paired = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paired)


def test_the_report_is_the_paired_t_interval_and_the_equivalence_test(tmp_path, capsys):
    """Three pairs by hand: differences 1, 2, 3 points (mean 2, sd 1, 95% half-width t(0.975, 2) / sqrt 3
    = 4.303 / 1.732 = 2.484); the BatchNorm losses differ by 0.01 each (sd 0: the 90% interval is the point,
    inside the +-0.03 margin); an unpaired run (seed 9, TensorFlow only) is left out."""
    runs = []
    for seed, (tf, jax) in enumerate([(51.0, 50.0), (62.0, 60.0), (43.0, 40.0)]):
        for backend, top1, loss in (("tensorflow", tf, 0.31), ("jax", jax, 0.30)):
            runs.append({"backend": backend, "method": "skipinit", "seed": seed, "test_top1": top1,
                         "train_cross_entropy": 1.0})
            runs.append({"backend": backend, "method": "batchnorm", "seed": seed, "test_top1": 80.0,
                         "train_cross_entropy": loss})
    runs.append({"backend": "tensorflow", "method": "skipinit", "seed": 9, "test_top1": 99.0, "train_cross_entropy": 0})
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    paired.report(str(tmp_path))
    summary = json.loads((tmp_path / "paired.json").read_text())
    top1 = summary["skipinit/test_top1"]
    assert top1["pairs"] == 3 and top1["mean_difference"] == pytest.approx(2.0) and top1["sd"] == pytest.approx(1.0)
    assert top1["ci95"] == pytest.approx([2 - 4.3027 / math.sqrt(3), 2 + 4.3027 / math.sqrt(3)], abs=1e-3)
    loss = summary["batchnorm/train_cross_entropy"]
    assert loss["mean_difference"] == pytest.approx(0.01) and loss["equivalent_at_margin"] is True
    assert "equivalent within +-0.03: True" in capsys.readouterr().out


def test_the_committed_paired_report_and_its_readme_are_what_the_runs_give(tmp_path):
    """docs/jax_parity/paired: paired.json recomputed from runs.jsonl (64 runs, every seed paired), and the
    README's intervals are paired.json's."""
    folder = os.path.join(ROOT, "docs", "jax_parity", "paired")
    shutil.copy(os.path.join(folder, "runs.jsonl"), tmp_path)
    paired.report(str(tmp_path))
    with open(os.path.join(folder, "paired.json")) as f:
        committed = json.load(f)
    assert json.loads((tmp_path / "paired.json").read_text()) == committed
    assert all(committed[f"{m}/test_top1"]["pairs"] == 16 for m in paired.METHODS)
    with open(os.path.join(folder, "README.md")) as f:
        readme = f.read()
    top1, loss = committed["skipinit/test_top1"], committed["batchnorm/train_cross_entropy"]
    assert f"{top1['ci95'][0]:+.2f} .. {top1['ci95'][1]:+.2f}" in readme
    assert f"{loss['ci90'][0]:+.4f} .. {loss['ci90'][1]:+.4f}" in readme and loss["equivalent_at_margin"]
