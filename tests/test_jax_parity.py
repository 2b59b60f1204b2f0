"""docs/jax_parity/paired.py's report (issue 90.4): the paired differences of
TensorFlow and JAX runs that share their initial weights and batches."""

import importlib.util
import json
import math
import os

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
