import dataclasses
import glob
import json
import math
import os
import shutil
import socket
import types

import keras
import matplotlib
import numpy as np
import pytest

from keras_skipinit import machine, sweep
from keras_skipinit.training import trainer
from keras_skipinit.sweep import cli as sweep_cli, factors, presets, protocol, runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(log2_lr, seed, acc, status="completed", ce=None):
    return {"lr": 2.0**log2_lr, "seed": seed, "status": status, "test_top1": acc, "train_cross_entropy": ce}


def test_best_k_of_n_and_best_learning_rate():
    runs = [run(-3, 0, 0.90), run(-3, 1, 0.80), run(-3, 2, 0.94),
            run(-2, 0, 0.93), run(-2, 1, 0.92), run(-2, 2, 0.50)]
    best, rows = sweep.summarize(runs, best_k=2, chance=0.11)
    # best 2 of 3: lr 2^-3 -> (0.94, 0.90), lr 2^-2 -> (0.93, 0.92)
    assert [r["lr"] for r in rows] == [0.125, 0.25]
    assert rows[0]["mean"] == pytest.approx(0.92) and rows[0]["std"] == pytest.approx(0.02)
    assert best["lr"] == 0.25 and best["mean"] == pytest.approx(0.925)


def test_learning_rates_read_as_powers_of_two_after_keying():
    """Summaries key learning rates to 6 digits; 2^-9 must still read 2^-9."""
    for k in range(-12, 3):
        assert sweep.lr_label(protocol.lr_key(2.0**k)) == f"2^{k}"
    assert sweep.lr_label(0.1) == "0.1"


def test_diverged_and_at_chance_runs_count_as_failed():
    runs = [run(-1, 0, None, "diverged"), run(-1, 1, 0.9), run(-4, 0, 0.5), run(-4, 1, 0.6)]
    best, rows = sweep.summarize(runs, best_k=2, chance=0.11)
    assert rows[1]["failed"] == 1 and rows[1]["mean"] is None  # one of the best 2 failed
    assert best["lr"] == 2.0**-4
    assert sweep.summarize(runs, best_k=1, chance=0.11)[0]["lr"] == 0.5  # best 1 of 2 skips the failure
    at_chance = [run(-3, 0, 0.1000000015), run(-2, 0, 0.098)]
    assert sweep.summarize(at_chance, best_k=1, chance=0.11)[0] is None


def test_training_loss_table_selects_the_lowest_losses():
    runs = [run(-3, 0, 0.9, ce=0.20), run(-3, 1, 0.9, ce=0.30), run(-2, 0, 0.9, ce=0.10), run(-2, 1, 0.9, ce=0.50)]
    best, rows = sweep.summarize(runs, best_k=1, chance=0.11, key="train_cross_entropy", lower_is_better=True)
    assert best["lr"] == 0.25 and best["mean"] == pytest.approx(0.10)
    best2, _ = sweep.summarize(runs, best_k=2, chance=0.11, key="train_cross_entropy", lower_is_better=True)
    assert best2["lr"] == 0.125 and best2["mean"] == pytest.approx(0.25)


@pytest.mark.parametrize("log2s,best_at,expected_next,where", [
    ([-6, -4, -2], -4, None, "interior"),
    ([-6, -4, -2], -2, -1, "edge"),
    ([-6, -4, -2], -6, -7, "edge"),
    ([-10, -9], -10, None, "paper bound"),
    ([0, 1, 2], 2, None, "paper bound"),
])
def test_grid_extension_until_the_optimum_is_interior(log2s, best_at, expected_next, where):
    rows = [{"lr": 2.0**k, "mean": 0.9 if k == best_at else 0.5} for k in log2s]
    best = next(r for r in rows if r["mean"] == 0.9)
    assert sweep.next_log2_lr(best, rows) == expected_next
    assert sweep.grid_edge(best, rows) == where
    # every learning rate failed: try smaller ones, down to 2^-10
    assert sweep.next_log2_lr(None, rows) == (min(log2s) - 1 if min(log2s) > -10 else None)


def fake_training(monkeypatch, train):
    """trainer.train replaced by `train`. No model is built, so the
    executor's clear_session after each run has nothing for gc.collect() to
    free (0.4 s a run once TensorFlow fills the heap): it clears without it."""
    monkeypatch.setattr(trainer, "train", train)
    clear = keras.backend.clear_session
    monkeypatch.setattr(keras.backend, "clear_session", lambda free_memory=True: clear(free_memory=False))


def fake_train(calls):
    """Accuracy peaks at lr 2^-7 and falls 10 points per octave."""
    def train(config):
        calls.append((config.normalization, config.learning_rate, config.seed, config.bn_momentum))
        acc = 0.9 - 0.1 * abs(math.log2(config.learning_rate) + 7) + 0.001 * config.seed
        return {"status": "completed", "eval_split": "test", "eval_top1": acc, "train_cross_entropy": 1 - acc, "wall_time_s": 1.0,
                "chief": True, "epochs_completed": config.epochs, "config": dataclasses.asdict(config)}
    return train


def test_dry_run_lists_the_runs_a_sweep_would_start_and_runs_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """--dry_run after a sweep of 2 seeds asked for 3: the third seed's runs, how many are left and their
    time at the recorded runs' median (1 s each here); no run trains, no file changes."""
    calls = []
    fake_training(monkeypatch, fake_train(calls))
    args = ["--depths=10", "--methods=skipinit,batchnorm", "--log2_lrs=-4,-3", "--best_k=1", f"--out={tmp_path}"]
    sweep.main([*args, "--seeds=2"])
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    calls.clear(), capsys.readouterr()
    sweep.main([*args, "--seeds=3", "--dry_run"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("runs.jsonl; 4 would start now, 4 left as far as known now:")
    assert lines[1:5] == [f"  {m} depth 10 lr 2^{k} seed 2" for m in ("skipinit", "batchnorm") for k in (-4, -3)]
    assert lines[5] == "the 4 starting now: about 4 s of one process at their cells' median recorded run time"
    assert calls == [] and {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    # Recorded runs at rates outside the grid asked for are counted as what they are (issue 91: counted as the
    # sweep's without a word); its tables use them.
    sweep.main([*args[:2], "--log2_lrs=-3", *args[3:], "--seeds=2", "--dry_run"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("8 runs of this sweep's cells recorded in ") and first.endswith(
        "runs.jsonl (4 at rates outside its first grid: its extensions, or runs copied in; its tables use them); "
        "0 would start now, 0 left as far as known now (the sweep is complete)"), first


def test_dry_run_names_a_run_another_process_trains_and_counts_its_epochs_done(tmp_path, monkeypatch, capsys):
    """--dry_run beside the sweep running it: a run whose model_dir another process holds says so and how many
    epochs it has done, and the time left counts only its epochs to come (it counted a whole run)."""
    from keras_skipinit.training import run_dir
    fake_training(monkeypatch, fake_train([]))
    args = ["--depths=10", "--methods=skipinit", "--log2_lrs=-4,-3", "--best_k=1", "--epochs=4",
            "--no-extend_grid", f"--out={tmp_path}", f"--runs_dir={tmp_path / 'runs'}"]
    sweep.main([*args, "--seeds=1"])
    capsys.readouterr()
    running = tmp_path / "runs" / "skipinit_d10_lr0.0625_s1"
    os.makedirs(running)
    run_dir.write_history(str(running), [{"epoch": 1, "lr": 0.0625, "cross_entropy": 1.0}])
    with run_dir.lock(str(running)):  # another process's, as far as the lock can tell
        sweep.main([*args, "--seeds=2", "--dry_run"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("2 would start now (1 of them running now in another process), 2 left as far as known now:")
    assert lines[1] == f"  skipinit depth 10 lr 2^-4 seed 1 (running now: process {os.getpid()} on {socket.gethostname()}; 1 of 4 epochs done)"
    assert lines[2] == "  skipinit depth 10 lr 2^-3 seed 1"
    assert lines[3] == ("the 2 starting now: about 2 s of one process at their cells' median recorded run time, "
                        "less the epochs they have done")  # 1 s a run: 0.75 + 1


def test_extend_grid_runs_until_interior_and_resumes(tmp_path, monkeypatch):
    calls = []
    fake_training(monkeypatch, fake_train(calls))
    args = ["--depths=10", "--methods=skipinit,batchnorm", "--log2_lrs=-4,-3", "--seeds=2", "--best_k=1",
            "--extend_grid", "--bn_momentum=0.9", f"--out={tmp_path}"]
    sweep.main(args)
    lrs = sorted({round(math.log2(lr)) for norm, lr, _, _ in calls if norm == "skipinit"})
    assert lrs == [-8, -7, -6, -5, -4, -3]  # extended downwards until 2^-7 is interior
    assert {m for n, _, _, m in calls if n == "batchnorm"} == {0.9} and {m for n, _, _, m in calls if n != "batchnorm"} == {None}
    first = len(calls)
    sweep.main(args)  # resumes: nothing re-run
    assert len(calls) == first
    table = (tmp_path / "table.md").read_text()
    assert "| SkipInit (alpha = 0) | 10 | 2^-8 .. 2^-3 (6) | 2^-7 | interior | 0 / 12 |" in table
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["runs"] == 24 and summary["command"].startswith("python -m keras_skipinit.sweep")


def test_resumed_sweep_completes_the_seeds_of_an_added_grid_point(tmp_path, monkeypatch):
    """A sweep stopped between the seeds of an extension point must run the
    missing seeds on resume, though the partial point already makes the
    optimum look interior."""
    calls = []
    fake_training(monkeypatch, fake_train(calls))
    args = ["--depths=10", "--methods=skipinit", "--log2_lrs=-8,-7", "--seeds=3", "--best_k=1",
            "--extend_grid", f"--out={tmp_path}"]
    sweep.main(args)  # 2^-8 .. 2^-7 peaks at the top edge (2^-7): adds 2^-6
    log = tmp_path / "runs.jsonl"
    lines = log.read_text().splitlines()
    added = [line for line in lines if json.loads(line)["log2_lr"] == -6.0]
    assert len(added) == 3
    log.write_text("\n".join(line for line in lines if line != added[-1]) + "\n")  # stopped before seed 2
    calls.clear()
    sweep.main(args)
    assert [(round(math.log2(lr)), seed) for _, lr, seed, _ in calls] == [(-6, 2)]


def test_depth_protocol_counts_trained_runs(tmp_path, monkeypatch):
    def train(config):
        acc = 0.1 if config.depth == 16 and config.seed == 0 else 0.8
        status = "diverged" if config.normalization == "none" else "completed"
        return {"status": status, "eval_split": "test", "eval_top1": None if status == "diverged" else acc, "train_cross_entropy": 0.5,
                "wall_time_s": 1.0, "chief": True, "config": dataclasses.asdict(config)}

    fake_training(monkeypatch, train)
    sweep.main(["--preset=fixup_fig3", "--depths=16,22", "--methods=fixup,none", f"--out={tmp_path}"])
    table = (tmp_path / "table.md").read_text()
    assert "| Fixup | 56.7 ± 33.0 (2/3 trained) | 80.0 ± 0.0 (3/3 trained) |" in table
    assert "| No normalization, no scaling | 10.0 ± 0.0 (0/3 trained, 3 diverged) |" in table
    assert (tmp_path / "sweep.png").stat().st_size > 5000


def test_the_tables_name_the_split_their_runs_were_evaluated_on(tmp_path, monkeypatch):
    """A dataset without a test split (ImageNet; a folder with val/) evaluates on 'validation' with no
    --validation_examples: the table says so, as the runs record it (it said 'Test')."""
    def train(config):
        return {**fake_train([])(config), "eval_split": "validation"}

    fake_training(monkeypatch, train)
    for name, heading in (("table1", "Validation accuracy, best 1 of 1"), ("depth", "Validation accuracy after 3 epoch(s)")):
        out = tmp_path / name
        sweep.main([f"--protocol={name}", "--depths=10", "--methods=skipinit", "--lrs=0.1", "--seeds=1", "--best_k=1",
                    f"--out={out}"])
        assert (out / "table.md").read_text().startswith(heading)


def test_edge_protocol_brackets_the_largest_rate_where_k_of_n_train(tmp_path, monkeypatch):
    """Issue 42.1: per cell, octaves up from the largest rate that trained
    until one fails, down while none trained (to 2^-10); 2 of 3 seeds must
    train (finite loss, above chance). The search resumes without reruns."""
    edges = {"skipinit": -4, "batchnorm": 1, "sqrt2": None}  # from 2^(edge + 1) on, seed 0 only trains
    calls = []

    def train(config):
        key = "sqrt2" if config.normalization == "sqrt2" else config.normalization
        k, edge = round(math.log2(config.learning_rate)), edges[key]
        calls.append((key, k, config.seed))
        # --l2 and --preprocessing reach the runs (issue 42.2's factors)
        assert (config.l2, config.mixup_alpha, config.preprocessing) == (2.5e-4, 0.0, "mean_std")
        trains = edge is not None and (k <= edge or (k == edge + 1 and config.seed == 0))
        diverged = edge is not None and k > edge + 1
        return {"status": "diverged" if diverged else "completed", "eval_split": "test", "eval_top1": None if diverged else
                (0.8 if trains else 0.1), "train_cross_entropy": 0.5, "wall_time_s": 1.0, "chief": True,
                "config": dataclasses.asdict(config)}

    fake_training(monkeypatch, train)
    args = ["--protocol=edge", "--depths=10", "--methods=skipinit,batchnorm,sqrt2", "--log2_lrs=-3", "--seeds=3",
            "--best_k=2", "--centre_log2_lrs=skipinit=-4,batchnorm=0,sqrt2=-9", "--l2=2.5e-4", "--preprocessing=mean_std",
            f"--out={tmp_path}"]
    sweep.main(args)
    tried = {key: sorted({k for m, k, _ in calls if m == key}) for key in edges}
    assert tried == {"skipinit": [-5, -4, -3], "batchnorm": [-1, 0, 1, 2], "sqrt2": [-10, -9, -8]}
    assert len(calls) == 3 * 10
    table = (tmp_path / "table.md").read_text()
    assert "| SkipInit (alpha = 0) | 2^-4 (3/3 trained; 2^-3: 1/3) |" in table
    assert "| Batch Normalization | 2^1 (3/3 trained; 2^2: 1/3) |" in table
    assert "| Divide residual block by sqrt(2) | none >= 2^-10 |" in table
    cells = json.loads((tmp_path / "summary.json").read_text())["cells"]
    assert cells["skipinit/depth10"]["edge_log2"] == -4 and cells["sqrt2/depth10"]["edge_log2"] is None
    assert (tmp_path / "sweep.png").stat().st_size > 5000
    calls.clear()
    sweep.main(args)
    assert calls == []


def test_a_rate_that_trains_above_a_failing_one_is_not_the_edge():
    """The Fixup authors' recipe trained 3/3 at 2^-4, 1/3 at 2^-3, 2/3 at 2^-2, 0/3 at 2^-1: the code said
    2^-2 where the docs' rule ("below the first failing one") says 2^-4. One rule: the edge stops at the
    first failing rate above the smallest that trained; failures below that one do not end it."""
    def rows(trained):
        return [{"lr": 2.0**k, "mean": 0.5 if ok else None} for k, ok in trained.items()]

    assert protocol.stability_edge(rows({-4: True, -3: False, -2: True, -1: False})) == (-4, None)
    assert protocol.stability_edge(rows({-7: False, -6: True, -5: True, -4: False})) == (-5, None)
    assert protocol.stability_edge(rows({-6: True, -5: True})) == (-5, -4)
    assert protocol.stability_edge(rows({-3: False, -2: False})) == (None, -4)


def test_wilson_intervals_and_the_half_rate_match_a_hand_computation():
    """The 95% Wilson score interval (0/10: 0-27.8%, 5/10: 23.7-76.3%, 10/10: 72.2-100%) and the
    rate where half train, linear in log2 rate between the grid points around the crossing."""
    for (k, n), want in {(0, 10): (0.0, 0.2775), (5, 10): (0.2366, 0.7634), (10, 10): (0.7225, 1.0)}.items():
        assert protocol.wilson(k, n) == pytest.approx(want, abs=1e-4)
    x = [-5, -4.5, -4, -3.5, -3]
    assert protocol.half_rate(x, [1, 1, 0.8, 0.2, 0]) == pytest.approx(-3.75)  # -4 + (0.8 - 0.5) / 0.6 * 0.5
    assert protocol.half_rate(x, [0.2, 0.9, 0.6, 0.4, 0]) == pytest.approx(-3.75)  # slow at the bottom: from a half
    assert protocol.half_rate(x, [1, 1, 1, 1, 0.5]) is None  # not on the grid


def test_welch_interval_matches_scipys_unequal_variance_t_test():
    """protocol.welch is Welch's t interval for a difference of means: scipy's ttest_ind(equal_var=False)
    gives the same bounds; one value a side has no interval; equal values on both sides a zero-width one."""
    from scipy import stats

    a, b = [77.6, 77.4, 77.8, 75.1], [76.1, 76.0, 76.3]
    want = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    difference, low, high = protocol.welch(a, b)
    assert difference == pytest.approx(np.mean(a) - np.mean(b))
    assert (low, high) == pytest.approx((want.low, want.high))
    assert protocol.welch([80.0], b) is None
    assert protocol.welch([2.0, 2.0], [1.0, 1.0]) == (1.0, 1.0, 1.0)


def test_table1_report_compares_the_best_rate_with_its_neighbours_and_the_methods(tmp_path, monkeypatch):
    """The report's comparisons (the budget issue: an interval where the docs compare rates or methods):
    the best rate against each other rate over their trained runs, a diverged run counted out of
    'trained', and the first method against the second at their best rates; hand-made accuracies."""
    accuracy = {("skipinit", -3): [0.80, 0.82, 0.84], ("skipinit", -2): [0.70, 0.74, None],
                ("batchnorm", -3): [0.90, 0.90, 0.93], ("batchnorm", -2): [0.91, 0.91, 0.91]}

    def train(config):
        acc = accuracy[config.normalization, round(math.log2(config.learning_rate))][config.seed]
        return {"status": "completed" if acc else "diverged", "eval_split": "test", "eval_top1": acc,
                "train_cross_entropy": 1.0, "wall_time_s": 1.0, "chief": True, "config": dataclasses.asdict(config)}

    fake_training(monkeypatch, train)
    sweep.main(["--protocol=table1", "--depths=10", "--methods=skipinit,batchnorm", "--log2_lrs=-3,-2", "--seeds=3",
                "--best_k=2", "--no-extend_grid", f"--out={tmp_path}"])
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in (tmp_path / "table.md").read_text().splitlines()
            if " − " in line}
    # SkipInit: 2^-3 (82.0 on average) against 2^-2's two trained runs (72.0): +10.0 points.
    d, low, high = protocol.welch([80, 82, 84], [70, 74])
    assert rows["SkipInit (alpha = 0): 2^-3 − 2^-2"] == ["10", "test, every seed", "+10.0",
                                                         f"{low:+.1f} .. {high:+.1f}", "3/3, 2/3 |"]
    assert d == pytest.approx(10.0)
    # BatchNorm chooses 2^-3 on its best 2 of 3 (91.5 against 91.0); over every seed both average 91.0.
    assert rows["Batch Normalization: 2^-3 − 2^-2"][2] == "+0.0"
    assert rows["SkipInit (alpha = 0) (2^-3) − Batch Normalization (2^-3)"][2] == "-9.0"
    # The legend speaks of a cell (issue 89.6: "(—: every run failed)" read as if the whole sweep had)
    assert "Test accuracy, best 2 of 3 (— in a cell: every run of that cell failed)" in (tmp_path / "table.md").read_text()


def test_depth_report_gives_trained_fractions_with_intervals_and_fishers_p(tmp_path, monkeypatch):
    """Fixup Fig. 3's claims are fractions of seeds that train: the depth table adds each method's count per
    depth and pooled, its Wilson interval and the one-sided Fisher p against the first method; p by hand
    (1 of 3 against 3 of 3: C(4,1) C(2,2) / C(6,3) = 0.2; 0 of 3: 1/20) and from scipy for the pooled cell."""
    from scipy import stats

    def train(config):  # BatchNorm trains at every depth; Fixup in seed 0 at depth 10 only
        ok = config.normalization == "batchnorm" or (config.depth == 10 and config.seed == 0)
        return {"status": "completed", "eval_split": "test", "eval_top1": 0.6 if ok else 0.1,
                "train_cross_entropy": 1.0, "wall_time_s": 1.0, "chief": True, "config": dataclasses.asdict(config)}

    fake_training(monkeypatch, train)
    sweep.main(["--protocol=depth", "--depths=10,22", "--methods=batchnorm,fixup", "--lrs=0.1", "--seeds=3",
                "--best_k=1", f"--out={tmp_path}"])
    rows = [line for line in (tmp_path / "table.md").read_text().splitlines() if line.startswith("| Fixup |")][1:]
    assert rows == ["| Fixup | 10 | 1/3 | 6-79% | 0.2 |", "| Fixup | 22 | 0/3 | 0-56% | 0.05 |",
                    "| Fixup | all | 1/6 | 3-56% | 0.00758 |"]
    assert protocol.fisher_less(1, 6, 6, 6) == pytest.approx(stats.fisher_exact([[1, 5], [6, 0]], "less").pvalue)


def test_a_factors_shift_of_the_half_rate_and_its_interval_shrink_with_seeds():
    """The budget issue's factor sizes: the same survival counts one octave higher shift the half rate by
    exactly +1 (hand computation); its 95% interval holds it and narrows from 10 to 1,000 seeds a rate; a
    cell that never falls to half on its grid has no shift and no bounds. Two methods' gap is the same shift."""
    def cell(log2s, trained, n):
        return [{"lr": 2.0**x, "runs": n, "trained": round(f * n), "trained_by_loss": round(f * n)}
                for x, f in zip(log2s, trained)]
    x, fractions = [-5, -4.5, -4, -3.5, -3], [1, 1, 0.8, 0.2, 0]
    for n, width in ((10, 1.5), (1000, 0.1)):
        shift, low, high = protocol.half_rate_shift(cell([v + 1 for v in x], fractions, n), cell(x, fractions, n))
        assert shift == pytest.approx(1.0) and low < 1.0 < high and high - low < width
        if n == 10:
            assert high - low > 0.3  # ten seeds a rate cannot place a half rate to a tenth of an octave
    shift, low, high = protocol.half_rate_shift(cell(x, [1, 1, 1, 1, 1], 10), cell(x, fractions, 10))
    assert (shift, low, high) == (None, None, None)  # it halves above its grid: the shift's size is unknown
    # Between two methods of one sweep, the same shift: the second's half rate minus the first's.
    details = {f"{key}/depth16": {"rates": cell([v + d for v in x], fractions, 10), "half_log2": [-4 + d, None, None],
                                  "half_log2_by_loss": [-4 + d, None, None]} for key, d in (("skipinit", 0), ("batchnorm", 5))}
    table = factors.between_methods(details, ["skipinit", "batchnorm"], [16])
    assert "| Batch Normalization - SkipInit (alpha = 0) | 16 | 2^-4.00 / 2^1.00 | +5.00 |" in table


def test_survival_protocol_counts_seeds_per_half_octave_by_accuracy_and_by_loss(tmp_path, monkeypatch, capsys):
    """The budget issue's survival curves: seven rates half an octave apart around the method's centre, every
    seed of each; per rate the runs that trained by accuracy and by accuracy and loss (a run above chance whose
    training loss stayed at ln 10 trained by accuracy only), Wilson intervals, and the half rate. Resumes.
    A factor's folder compared to it (--compare_to) names the factor and gives its shift."""
    calls = []

    def train(config):
        k = math.log2(config.learning_rate)
        calls.append((k, config.seed))
        trains = k < -4 or (k == -4 and config.seed < 2)  # 2^-4: 2 of 4 seeds; above: none
        diverged = k > -3
        ce = 1.0 if trains and k < -4.5 else 2.25  # at 2^-4.5 and 2^-4 the loss stays near ln 10
        return {"status": "diverged" if diverged else "completed",
                "eval_split": "test", "eval_top1": None if diverged else (0.6 if trains else 0.1),
                "train_cross_entropy": None if diverged else ce, "wall_time_s": 1.0, "chief": True,
                "config": dataclasses.asdict(config)}

    fake_training(monkeypatch, train)
    args = ["--protocol=survival", "--depths=10", "--methods=skipinit", "--seeds=4", "--best_k=1", "--log2_lrs=-4",
            "--centre_log2_lrs=skipinit=-4", f"--out={tmp_path}"]
    sweep.main(args)
    assert sorted({k for k, _ in calls}) == [-5.5, -5, -4.5, -4, -3.5, -3, -2.5] and len(calls) == 28
    table = (tmp_path / "table.md").read_text()
    assert "| Survival | 10 | 2^-4.5 | 4/4 | 51-100% | 0/4 | 0-49% |".replace("Survival", "SkipInit (alpha = 0)") in table
    assert "| SkipInit (alpha = 0) | 10 | 2^-4 | 2/4 | 15-85% | 0/4 | 0-49% |" in table
    cell = json.loads((tmp_path / "summary.json").read_text())["cells"]["skipinit/depth10"]
    assert cell["half_log2"][0] == pytest.approx(-4.0)  # 4/4 at 2^-4.5, 2/4 at 2^-4, 0/4 at 2^-3.5: half at 2^-4
    assert cell["half_log2_by_loss"][0] == pytest.approx(-4.75)  # 4/4 at 2^-5, 0/4 at 2^-4.5
    assert cell["half_log2"][1] < cell["half_log2"][0] < cell["half_log2"][2]
    assert (tmp_path / "sweep.png").stat().st_size > 5000
    calls.clear()
    sweep.main(args)
    assert calls == []
    # A factor in a folder of its own, one octave later: its table gives the shift against the first folder.
    fake_training(monkeypatch, lambda config: {**train(dataclasses.replace(config, learning_rate=config.learning_rate / 2)),
                                               "config": dataclasses.asdict(config)})
    sweep.main([*args, "--preprocessing=mean_std", "--l2=5e-5", f"--out={tmp_path}/factor", f"--compare_to={tmp_path}"])
    table = (tmp_path / "factor" / "table.md").read_text()  # a setting left unset: its value, train.py's default
    assert f"against {tmp_path} (preprocessing default -> mean_std, l2 0.0005 (default) -> 5e-05)" in table
    assert "| SkipInit (alpha = 0) | 10 | 2^-4.00 / 2^-3.00 | +1.00 | " in table and "| 2^-4.75 / 2^-3.75 | +1.00 |" in table
    shift, low, high = json.loads((tmp_path / "factor" / "summary.json").read_text())["cells"]["skipinit/depth10"]["shift_log2"]
    assert shift == pytest.approx(1.0) and low < 1 < high and f"| {low:+.2f} .. {high:+.2f} |" in table
    for bad, why in (([*args[1:], "--protocol=edge", f"--compare_to={tmp_path}"], "only --protocol=survival"),
                     ([*args, f"--compare_to={tmp_path}/factor/runs"], "cannot read")):
        with pytest.raises(SystemExit):
            sweep.main([*bad, f"--out={tmp_path}/bad", "--report_only"])
        assert why in capsys.readouterr().err


@pytest.mark.parametrize("flag,line", [
    ("--log2_lrs=-5,abc", "--log2_lrs=-5,abc: expected whole or half octaves (e.g. -6,-4.5), got '-5,abc'"),
    ("--depths=16,a", "--depths=16,a: expected positive integers separated by commas (e.g. 16,100), got '16,a'"),
    ("--depths=16,0", "--depths=16,0: expected positive integers separated by commas (e.g. 16,100), got '16,0'"),
    ("--lrs=0.1,y", "--lrs=0.1,y: expected a number, got 'y'"),
    ("--cpus_per_run=2,3", "--cpus_per_run=2,3: expected a number, got '2,3'"),
    ("--seeds=0", "--seeds must be at least 1"),
])
def test_a_bad_number_in_a_sweep_flag_is_one_line_naming_what_was_expected(capsys, flag, line):
    """argparse words a type function's ValueError as 'invalid _halves value': the sweep's list flags say
    what they expected instead, and --seeds=0 is named as itself (it was refused as a --best_k error)."""
    from keras_skipinit.sweep import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args([flag, "--out=unused"])
    assert exit_info.value.code == 2 and f"error: {line}" in capsys.readouterr().err


def test_edge_report_fills_the_depths_it_did_not_run_from_other_sweeps(tmp_path, monkeypatch, capsys):
    """Issue 42.1's one table and plot across depths, when depth 1000 runs 2 of
    2 seeds in its own --out (--beside); a folder that is not an edge sweep is
    one line, before any run."""
    def train(config):  # trains up to 2^-4 at depth 10, up to 2^-6 at depth 22
        ok = math.log2(config.learning_rate) <= (-4 if config.depth == 10 else -6)
        return {"status": "completed", "eval_split": "test", "eval_top1": 0.8 if ok else 0.1, "train_cross_entropy": 0.5,
                "wall_time_s": 1.0, "chief": True, "config": dataclasses.asdict(config)}

    fake_training(monkeypatch, train)
    common = ["--protocol=edge", "--methods=skipinit", "--log2_lrs=-3", "--centre_log2_lrs=skipinit=-4"]
    sweep.main([*common, "--depths=22", "--seeds=2", "--best_k=2", f"--out={tmp_path}/deep"])
    shallow = [*common, "--depths=10,22", "--seeds=3", "--best_k=2", f"--out={tmp_path}/main"]
    sweep.main([*shallow, "--depths=10"])
    sweep.main([*shallow, "--report_only", f"--beside={tmp_path}/deep"])
    table = (tmp_path / "main" / "table.md").read_text()
    assert "| method | depth 10 | depth 22 (2 of 2: deep/) |" in table
    assert "| SkipInit (alpha = 0) | 2^-4 (3/3 trained; 2^-3: 0/3) | 2^-6 (2/2 trained; 2^-5: 0/2) |" in table
    cells = json.loads((tmp_path / "main" / "summary.json").read_text())["cells"]
    assert cells["skipinit/depth22"]["edge_log2"] == -6 and cells["skipinit/depth10"]["edge_log2"] == -4
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # a folder with no sweep: refused before any run
        sweep.main([*common, "--depths=10", f"--out={tmp_path}/new", f"--beside={tmp_path}/none"])
    (line,) = capsys.readouterr().err.splitlines()
    assert exit_info.value.code == 2 and line.startswith("python -m keras_skipinit.sweep: error: --beside: cannot read")
    assert not (tmp_path / "new").exists()


def test_table1_report_shows_a_deeper_sweeps_cells_beside_its_own(tmp_path, monkeypatch, capsys):
    """Issue 42.4: Table 1's depth-1000 row (2 of 2 seeds, its own --out)
    beside depths 16 and 100 in one table and figure; a folder of another
    experiment (here another width) is refused in one line, before any run."""
    def train(config):  # depth 22: 2^-3 best (0.7, 0.6), 2^-2 diverges, 2^-4 0.6
        k = round(math.log2(config.learning_rate))
        acc = {-4: 0.6, -3: 0.7 - 0.1 * config.seed}.get(k) if config.depth == 22 else 0.8 + 0.01 * k
        return {"status": "completed" if acc else "diverged", "eval_split": "test", "eval_top1": acc, "train_cross_entropy": 2.0 - (acc or 0),
                "wall_time_s": 1.0, "chief": True, "config": dataclasses.asdict(config)}

    fake_training(monkeypatch, train)
    common = ["--protocol=table1", "--methods=skipinit", "--log2_lrs=-4,-3,-2", "--best_k=2"]
    sweep.main([*common, "--depths=22", "--seeds=2", f"--out={tmp_path}/deep"])
    sweep.main([*common, "--depths=10", "--seeds=3", f"--out={tmp_path}/main"])
    sweep.main([*common, "--depths=10", "--seeds=3", "--report_only", f"--out={tmp_path}/main",
                f"--beside={tmp_path}/deep"])
    table = (tmp_path / "main" / "table.md").read_text()
    assert ("| method | depth 10: test acc. % (lr) | depth 22 (best 2 of 2: deep/): test acc. % (lr) |"
            in table)
    assert "| SkipInit (alpha = 0) | 78.0 ± 0.0 (2^-2) | 65.0 ± 5.0 (2^-3) |" in table
    assert "| SkipInit (alpha = 0) | 22 | 2^-4 .. 2^-2 (3) | 2^-3 | interior | 2 / 6 |" in table
    cells = json.loads((tmp_path / "main" / "summary.json").read_text())["cells"]
    assert cells["skipinit/depth22"]["optimum"] == "interior" and "skipinit/depth10" in cells
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        sweep.main([*common, "--depths=10", "--width=2", f"--out={tmp_path}/wide", f"--beside={tmp_path}/deep"])
    (line,) = capsys.readouterr().err.splitlines()
    assert exit_info.value.code == 2 and "--beside:" in line and "--width=1 there, 2 here" in line
    assert not (tmp_path / "wide").exists()


def _watched_on_a_fake_clock(monkeypatch):
    """The sweep's EpochWatch without its thread: the fake training polls it itself (`poll` below) on the
    sweep's fake clock, so what it shows depends on no wall time and no scheduling."""
    clock, watches = [0.0], []
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(time=lambda: clock[0]))  # the sweep's clock only
    monkeypatch.setattr(runner.EpochWatch, "start", lambda self: watches.append(self))
    monkeypatch.setattr(runner.EpochWatch, "stop", lambda self: None)

    def poll():
        for watch in watches:
            watch.poll()

    return clock, poll


def _epochs(config, epochs, clock, poll, seconds, dated, top1):
    """Trains `epochs` as train writes them, `seconds` apart on the sweep's clock, each history.csv dated
    `dated(epoch)`, the watch looking before the first and after each."""
    from keras_skipinit.training import run_dir
    rows = run_dir.read_history(config.model_dir) if os.path.exists(os.path.join(config.model_dir, run_dir.HISTORY)) else []
    poll()
    for epoch in epochs:
        clock[0] += seconds
        rows.append({"epoch": epoch, "lr": config.learning_rate, "cross_entropy": 1.0, "val_top1": top1 * epoch})
        run_dir.write_history(config.model_dir, rows)
        os.utime(os.path.join(config.model_dir, run_dir.HISTORY), (dated(epoch),) * 2)
        poll()
    return {"status": "completed", "eval_split": "test", "eval_top1": 0.75, "train_cross_entropy": 1.0,
            "wall_time_s": 2.0, "chief": True, "epochs_completed": epochs[-1], "config": dataclasses.asdict(config)}


def test_a_run_longer_than_a_minute_shows_its_epochs_and_a_short_one_stays_quiet(tmp_path, monkeypatch, capsys):
    """Between a sweep's per-run lines (40 min apart at depth 100 and 2,400
    updates), each run's finished epochs from its history.csv, with what is
    left of it; a run of a minute or less stays quiet (at most a line a
    minute a run). On the sweep's fake clock: epochs 0.5 s apart, then 10
    minutes apart with history.csv dated 10 minutes apart."""
    clock, poll = _watched_on_a_fake_clock(monkeypatch)
    seconds = [0.5]
    fake_training(monkeypatch, lambda config: _epochs(config, (1, 2, 3), clock, poll, seconds[0],
                                                      lambda epoch: 600.0 * epoch, 0.25))

    def sweep_once(out):
        os.makedirs(tmp_path / out / "runs" / "skipinit_d10_lr0.125_s0")
        sweep.main(["--depths=10", "--methods=skipinit", "--log2_lrs=-3", "--seeds=1", "--best_k=1", "--epochs=3",
                    "--no-extend_grid", f"--out={tmp_path / out}", f"--runs_dir={tmp_path / out / 'runs'}"])
        return [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]

    assert sweep_once("quiet") == []  # 1.5 s: under a minute
    seconds[0] = 600.0
    assert sweep_once("shown") == [
        "  skipinit depth 10 lr 2^-3 seed 0: epoch 1/3, test 25.0%",
        "  skipinit depth 10 lr 2^-3 seed 0: epoch 2/3, test 50.0%, about 10 min left in this run",
        "  skipinit depth 10 lr 2^-3 seed 0: epoch 3/3, test 75.0%, about 0 min left in this run"]


def test_a_resumed_runs_time_left_is_measured_from_an_epoch_this_sweep_trained(tmp_path, monkeypatch, capsys):
    """A run resumed after its first epoch (its history.csv written long before, at another session's end):
    the end of its second epoch, the first this sweep trains, gives no rate; the third's, 10 min after,
    gives 10 min left (the rate spanned the interruption: hours)."""
    from keras_skipinit.training import run_dir
    clock, poll = _watched_on_a_fake_clock(monkeypatch)
    clock[0] = 1e4 + 600.0
    fake_training(monkeypatch, lambda config: _epochs(config, (2, 3, 4), clock, poll, 600.0,
                                                      lambda epoch: 1e4 + 600.0 * epoch, 0.2))
    resumed = tmp_path / "runs" / "skipinit_d10_lr0.125_s0"
    os.makedirs(resumed)
    run_dir.write_history(str(resumed), [{"epoch": 1, "lr": 0.125, "cross_entropy": 1.0, "val_top1": 0.2}])
    os.utime(resumed / run_dir.HISTORY, (0.0, 0.0))
    sweep.main(["--depths=10", "--methods=skipinit", "--log2_lrs=-3", "--seeds=1", "--best_k=1", "--epochs=4",
                "--no-extend_grid", f"--out={tmp_path}", f"--runs_dir={tmp_path / 'runs'}"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert [line for line in lines if "epoch 2/4" in line or "epoch 3/4" in line] == [
        "  skipinit depth 10 lr 2^-3 seed 0: epoch 2/4, test 40.0%",
        "  skipinit depth 10 lr 2^-3 seed 0: epoch 3/4, test 60.0%, about 10 min left in this run"]


def _ten_minutes_an_epoch(monkeypatch):
    """Fake training on a fake sweep clock: 10 minutes an epoch, from the epochs its history.csv holds."""
    from keras_skipinit.training import run_dir
    clock = [0.0]
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(time=lambda: clock[0]))  # the sweep's clock only

    def train(config):
        clock[0] += 600.0 * (config.epochs - len(run_dir.read_history(config.model_dir)))
        return {"status": "completed", "eval_split": "test", "eval_top1": 0.75, "train_cross_entropy": 1.0,
                "wall_time_s": 1.0, "chief": True, "epochs_completed": config.epochs, "config": dataclasses.asdict(config)}

    fake_training(monkeypatch, train)


def test_the_time_left_counts_a_resumed_runs_earlier_epochs_as_done_before(tmp_path, monkeypatch, capsys):
    """A resumed sweep's first run to end had 3 of its 4 epochs from before: its 10 minutes here are one
    epoch's, so the next run's 4 epochs are ~40 min (counted as a whole run, the estimate said 10)."""
    from keras_skipinit.training import run_dir
    _ten_minutes_an_epoch(monkeypatch)
    resumed = tmp_path / "runs" / "skipinit_d10_lr0.125_s0"
    os.makedirs(resumed)
    run_dir.write_history(str(resumed), [{"epoch": e, "lr": 0.125, "cross_entropy": 1.0} for e in (1, 2, 3)])
    sweep.main(["--depths=10", "--methods=skipinit", "--log2_lrs=-3", "--seeds=2", "--best_k=1", "--epochs=4",
                "--no-extend_grid", f"--out={tmp_path}", f"--runs_dir={tmp_path / 'runs'}"])
    first, second = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert first.startswith("[1/2] skipinit depth 10 lr 2^-3 seed 0: completed") and first.endswith("about 40 min left")
    assert second.endswith("about 0 min left")


def test_a_run_complete_before_the_sweep_gives_no_time_left_estimate(tmp_path, monkeypatch, capsys):
    """A resumed sweep whose first run to end was already complete has measured nothing of its speed: it
    says the time left is not known (it said "about 0 min left" with a 4-epoch run still to train)."""
    from keras_skipinit.training import run_dir
    _ten_minutes_an_epoch(monkeypatch)
    complete = tmp_path / "runs" / "skipinit_d10_lr0.125_s0"
    os.makedirs(complete)
    run_dir.write_history(str(complete), [{"epoch": e, "lr": 0.125, "cross_entropy": 1.0} for e in (1, 2, 3, 4)])
    sweep.main(["--depths=10", "--methods=skipinit", "--log2_lrs=-3", "--seeds=2", "--best_k=1", "--epochs=4",
                "--no-extend_grid", f"--out={tmp_path}", f"--runs_dir={tmp_path / 'runs'}"])
    first, second = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert first.endswith("time left not known until a run trains here")
    assert second.endswith("about 0 min left")


def test_an_interrupted_run_stops_the_sweep_in_one_line_and_is_not_recorded(tmp_path, monkeypatch, capsys):
    """Issue 46.6: a run stopped by Ctrl-C (checkpointed by train) ends the
    sweep with one line and exit 130; it is not a result."""
    def train(config):
        return {"status": "interrupted", "signal": 2, "epoch": 1, "step_in_epoch": 3, "steps_per_epoch": 9,
                "chief": True}

    fake_training(monkeypatch, train)
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--depths=10", "--methods=skipinit", "--lrs=0.1", "--seeds=1", "--best_k=1", f"--out={tmp_path}"])
    assert exit_info.value.code == 130
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "interrupted during run skipinit depth 10" in line and "run the same command to resume" in line
    assert not (tmp_path / "runs.jsonl").exists() or (tmp_path / "runs.jsonl").read_text() == ""


def test_a_signal_as_a_run_completes_records_it_and_stops_the_sweep(tmp_path, monkeypatch, capsys):
    """Ctrl-C in a run's last step or final evaluation: the run completes
    (train returns its results with the signal), is recorded, and the sweep
    stops there with exit 130 (it went on to the next run, exit 0)."""
    calls = []

    def train(config):
        return {**fake_train(calls)(config), "signal": 2}

    fake_training(monkeypatch, train)
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--depths=10", "--methods=skipinit", "--lrs=0.1,0.05", "--seeds=1", "--best_k=1", f"--out={tmp_path}"])
    assert exit_info.value.code == 130 and len(calls) == 1
    assert "recorded: it had completed" in capsys.readouterr().err
    (line,) = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert "signal" not in json.loads(line)["results"]


def test_quantization_report_without_a_log_is_one_line_and_writes_nothing(tmp_path, capsys):
    """Issue 46.5: --report_only on a missing --out was a FileNotFoundError; on an --out without
    quantization.jsonl it wrote an empty table and exited 0."""
    from keras_skipinit.sweep import quantization

    for out in (tmp_path / "missing", tmp_path):
        assert quantization.main([f"--out={out}", "--report_only"]) == 2
        assert "no quantization.jsonl in" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def _documented_commands(preset):
    """The sweep commands a preset's docstring gives (continuation lines joined)."""
    text = presets.PRESETS[preset].__doc__.replace("\\\n", " ")
    return [line.split()[3:] for line in text.splitlines() if line.strip().startswith("python -m keras_skipinit.sweep ")]


@pytest.mark.heavy
def test_every_presets_documented_command_reports_its_committed_runs_unchanged(tmp_path, monkeypatch):
    """Issue 46.1-2: each preset's documented --out holds its runs (or the
    docstring says it was not run), and a report of those unchanged runs
    rewrites nothing (table.md, summary.json, the figures are as committed)."""
    monkeypatch.chdir(ROOT)  # --compare_to=docs/...: read where the command is documented to run, and named so
    reported = []
    for preset in presets.PRESETS:
        for i, argv in enumerate(_documented_commands(preset)):
            (out,) = [a.split("=", 1)[1] for a in argv if a.startswith("--out=")]
            if "not run here" in " ".join(presets.PRESETS[preset].__doc__.split()).lower():
                assert not out.startswith("docs/"), preset
                continue
            committed = os.path.join(ROOT, out)
            assert os.path.exists(os.path.join(committed, "runs.jsonl")), (preset, out)
            copy = tmp_path / preset / str(i)
            shutil.copytree(committed, copy)
            argv = [f"--out={copy}" if a.startswith("--out=") else  # --beside folders are only read
                    "--beside=" + ",".join(os.path.join(ROOT, f) for f in a.split("=", 1)[1].split(","))
                    if a.startswith("--beside=") else a for a in argv]
            sweep.main(argv + ["--report_only"])
            for name in sorted(os.listdir(committed)):
                if os.path.isfile(os.path.join(committed, name)):
                    with open(os.path.join(committed, name), "rb") as a, open(copy / name, "rb") as b:
                        before, after = a.read(), b.read()
                    if name.endswith(".png") and f"version{matplotlib.__version__},".encode() not in before:
                        continue  # drawn by another matplotlib (its PNG names it): its bytes may differ
                    assert before == after, (preset, name)
            assert sorted(os.listdir(copy)) == sorted(os.listdir(committed)), preset
            reported.append(preset)
    assert len(reported) >= 8


def test_the_budget_figure_redraws_from_the_committed_summaries_unchanged(tmp_path):
    """docs/budget/budget.png is what docs/budget/figure.py draws from the committed sweeps (rerun after a
    folder gains runs), with a best rate and an edge for both methods at depth 16 at every budget."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("budget_figure", os.path.join(ROOT, "docs", "budget", "figure.py"))
    figure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figure)
    found = figure.main(str(tmp_path / "budget.png"))
    for method in figure.METHODS:
        for updates in (150, 600):
            assert {"best"} <= {p[3] for p in found if p[:3] == (method, 16, updates)} and \
                {p[3] for p in found if p[:3] == (method, 16, updates)} & {"edge", "edge >="}, (method, updates)
    with open(os.path.join(ROOT, "docs", "budget", "budget.png"), "rb") as f:
        committed = f.read()
    if f"version{matplotlib.__version__},".encode() in committed:  # drawn by this matplotlib: the same bytes
        assert (tmp_path / "budget.png").read_bytes() == committed


@pytest.mark.heavy
def test_cifar_resnet_sweep_end_to_end_and_one_model_per_out(tmp_path, capsys):
    args = ["--model=cifar_resnet", "--depths=8", "--methods=fixup,fixup_torch_stem", "--lrs=0.1", "--seeds=1",
            "--best_k=1", "--protocol=depth", "--epochs=1", "--steps_per_epoch=2", f"--out={tmp_path}",
            f"--runs_dir={tmp_path}/runs"]
    sweep.main(args)
    lines = [json.loads(text) for text in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [line["method"] for line in lines] == ["fixup", "fixup_torch_stem"]
    assert lines[0]["model"] == "cifar_resnet" and lines[0]["results"]["config"]["model"] == "cifar_resnet"
    specs = [json.load(open(tmp_path / "runs" / f"{key}_d8_lr0.1_s0" / "model_spec.json"))["model"]
             for key in ("fixup", "fixup_torch_stem")]
    assert [(s["model"], s["depth"], s["normalization"]) for s in specs] == [("cifar_resnet", 8, "fixup")] * 2
    assert [s.get("stem_init") for s in specs] == [None, "pytorch_default"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        sweep.main([*args[1:], "--depths=10"])  # a WRN sweep into the CifarResNet sweep's --out
    assert "holds runs of --model=cifar_resnet" in capsys.readouterr().err
    assert sweep.arch(sweep.parse_args(["--preset=fixup_fig3_cifar_resnet"]), 56) == "ResNet-56 (CIFAR)"


@pytest.mark.parametrize("model,depth,method", [("wrn", 10, "fixup_torch_stem"), ("cifar_resnet", 8, "nf")])
def test_a_method_the_model_refuses_stops_the_sweep_before_any_run(tmp_path, capsys, model, depth, method):
    with pytest.raises(SystemExit):
        sweep.main([f"--model={model}", f"--depths={depth}", f"--methods=batchnorm,{method}", "--lrs=0.1", "--seeds=1",
                    "--best_k=1", "--protocol=depth", "--epochs=1", "--steps_per_epoch=2", f"--out={tmp_path}"])
    err = capsys.readouterr().err
    assert f"--methods={method} at depth {depth} with --model={model}" in err, err
    assert not (tmp_path / "runs.jsonl").exists()


def test_cli_rejects_bad_settings(tmp_path, monkeypatch, capsys):
    """One line, exit 2, before any run or file: rates past any grid (2^5000 overflowed; 2^-5000 was 0, a
    math domain error with --extend_grid), a grid with one bad rate (its first rate trained first), NaN
    where it would pass every comparison (--chance=nan: no run ever failed), a --beside summary of
    another shape (an AttributeError) or in a missing folder (its message wrapped twice)."""
    calls = []
    fake_training(monkeypatch, fake_train(calls))
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "summary.json").write_text('{"settings": 5, "cells": {}}')
    cases = [(["--methods=layernorm"], "unknown"), (["--seeds=2", "--best_k=3"], "best_k"),
             (["--lrs=0.1", "--extend_grid"], "log2 grid"), (["--executor=ray", "--cpus_per_run=0"], "cpus_per_run"),
             (["--executor=ray", "--max_retries=-1"], "max_retries"),
             (["--executor=processes", "--processes=0"], "--processes must be at least 1"), (["--log2_lrs=5000"], "-30..30"),
             (["--log2_lrs=-5000", "--extend_grid"], "-30..30"), (["--lrs=nan", "--extend_grid"], "finite"),
             (["--lrs=0.05,-1"], "--lrs must lie in"), (["--chance=nan"], "finite"), (["--chance=2"], "--chance"),
             (["--mixup_alpha=inf"], "finite"), ([f"--beside={tmp_path}/odd"], "is not a sweep's summary.json"),
             ([f"--beside={tmp_path}/missing"], "--beside: cannot read")]
    for bad, match in cases:
        with pytest.raises(SystemExit) as exit_info:
            sweep.main(["--depths=10", "--methods=skipinit", "--seeds=1", "--best_k=1", *bad, f"--out={tmp_path}/out"])
        (line,) = capsys.readouterr().err.strip().splitlines()  # no usage block above it
        assert exit_info.value.code == 2 and match in line and line.count("cannot read") <= 1, (bad, line)
    assert calls == [] and not (tmp_path / "out" / "runs.jsonl").exists()


@pytest.mark.heavy
def test_tiny_real_sweep_end_to_end(tmp_path):
    args = ["--depths=10", "--methods=skipinit", "--log2_lrs=-4,20", "--seeds=1", "--best_k=1", "--epochs=1",
            "--steps_per_epoch=2", f"--out={tmp_path}", f"--runs_dir={tmp_path}/runs"]
    sweep.main(args)
    lines = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [line["status"] for line in lines] == ["completed", "diverged"]  # 2^20 blows up
    assert lines[1]["results"]["diverged_at"]["epoch"] == 0 and "cores" in lines[0]["machine"]
    assert lines[0]["results"]["backend"] == keras.backend.backend()  # CI's third stage: JAX, without TensorFlow
    assert (tmp_path / "sweep.png").stat().st_size > 5000


def test_a_result_line_cut_by_a_kill_is_dropped_and_its_run_runs_again(tmp_path, monkeypatch, capsys):
    calls = []
    fake_training(monkeypatch, fake_train(calls))
    args = ["--depths=10", "--methods=skipinit", "--log2_lrs=-8,-7,-6", "--seeds=1", "--best_k=1", f"--out={tmp_path}"]
    sweep.main(args)
    log = tmp_path / "runs.jsonl"
    lines = log.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["results"]["config"]["model_dir"] ==
                                   os.path.relpath(f"runs/sweeps/{tmp_path.name}/skipinit_d10_lr{2.0**k:.6g}_s0", tmp_path)
                                   for line, k in zip(lines, (-8, -7, -6)))
    log.write_text("\n".join(lines[:2]) + "\n" + '{"method": "skipinit", "depth": 10, "l')  # killed mid-write
    sweep.main([*args, "--report_only"])  # reads the two whole lines, warns, changes nothing
    assert "line 3 is incomplete" in capsys.readouterr().err and log.read_text().endswith('"l')
    calls.clear()
    sweep.main(args)  # resume: the cut run runs again, its line whole on a line of its own
    assert [round(math.log2(lr)) for _, lr, _, _ in calls] == [-6]
    assert [json.loads(line)["log2_lr"] for line in log.read_text().splitlines()] == [-8, -7, -6]


def test_a_log_without_its_final_newline_keeps_every_record(tmp_path, monkeypatch):
    """A runs.jsonl whose last record lost its newline (edited by hand) is
    whole: the next record starts on a line of its own (glued on, both were
    read as one torn line and cut, and two runs trained again)."""
    calls = []
    fake_training(monkeypatch, fake_train(calls))
    args = ["--depths=10", "--methods=skipinit", "--seeds=1", "--best_k=1", f"--out={tmp_path}"]
    sweep.main([*args, "--log2_lrs=-8,-7"])
    log = tmp_path / "runs.jsonl"
    log.write_text(log.read_text().rstrip("\n"))
    calls.clear()
    sweep.main([*args, "--log2_lrs=-8,-7,-6"])
    assert [round(math.log2(lr)) for _, lr, _, _ in calls] == [-6]
    assert [json.loads(line)["log2_lr"] for line in log.read_text().splitlines()] == [-8, -7, -6]


WHOLE = json.dumps({"method": "skipinit", "depth": 10, "lr": 0.1, "seed": 0, "status": "completed", "test_top1": 0.5})


@pytest.mark.parametrize("lines,bad", [
    ([WHOLE, "{oops", WHOLE.replace('"seed": 0', '"seed": 1')], 2),  # a line that does not parse, before the last
    ([WHOLE.replace(', "status": "completed"', "")], 1),  # JSON without a status (was a KeyError traceback)
    ([WHOLE, '{"depth": 10, "lr": 0.1, "seed": 1, "status": "completed"}'], 2),  # a last line of JSON without method
    ([WHOLE.replace(', "test_top1": 0.5', "")], 1),  # without test_top1 (issue 46.5: a KeyError traceback)
    ([WHOLE.replace('"lr": 0.1', '"lr": "0.05"')], 1),  # a rate as a string (issue 46.5: "Unknown format code")
])
def test_a_result_line_that_is_not_a_torn_write_is_a_one_line_error_and_kept(tmp_path, capsys, lines, bad):
    """Issue 32.3: only a last line that does not parse is a kill's torn write."""
    log = tmp_path / "runs.jsonl"
    log.write_text("\n".join(lines) + "\n")
    for extra in (["--report_only"], ["--depths=10", "--methods=skipinit", "--lrs=0.1", "--seeds=1", "--best_k=1"]):
        with pytest.raises(SystemExit) as exit_info:
            sweep.main([f"--out={tmp_path}", *extra])
        assert exit_info.value.code == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"{log}, line {bad}: not a sweep result" in line
        assert log.read_text() == "\n".join(lines) + "\n"


def test_two_records_of_one_run_that_disagree_are_a_one_line_error(tmp_path, capsys):
    """A run recorded twice with other results (lines copied from another
    log): the later one won silently and changed a best rate."""
    log = tmp_path / "runs.jsonl"
    log.write_text("\n".join([WHOLE, WHOLE, WHOLE.replace('"test_top1": 0.5', '"test_top1": 0.7')]) + "\n")
    with pytest.raises(SystemExit) as exit_info:
        sweep.main([f"--out={tmp_path}", "--report_only"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and "records run skipinit depth 10 lr 0.1 seed 0" in line
    assert "test_top1 0.5 then 0.7" in line


def test_report_only_without_runs_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sweep.main([f"--out={tmp_path / 'empty'}", "--report_only"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no runs in" in line and "empty" in line


def test_converged_protocol_chooses_the_lr_on_validation_then_trains_final_seeds_on_all_data(tmp_path, monkeypatch):
    """Learning rates are chosen on the held-out split; the final runs train on
    the full training set at the chosen rate and are the only ones reported
    as test accuracy (with their per-epoch curves)."""
    configs = []

    def train(config):
        configs.append(config)
        acc = 0.9 - 0.1 * abs(math.log2(config.learning_rate) + 4) + 0.01 * config.seed
        os.makedirs(config.model_dir, exist_ok=True)
        with open(os.path.join(config.model_dir, "history.csv"), "w") as f:
            f.write("epoch,lr,val_top1\n" + "".join(f"{e},0.1,{acc * e / config.epochs}\n" for e in (1, 2, 3)))
        return {"status": "completed", "eval_top1": acc, "train_cross_entropy": 0.3, "wall_time_s": 1.0,
                "chief": True, "eval_split": "validation" if config.validation_examples else "test",
                "config": dataclasses.asdict(config)}

    fake_training(monkeypatch, train)
    args = ["--protocol=converged", "--depths=16", "--methods=batchnorm,skipinit", "--centre_log2_lrs=batchnorm=-2",
            "--log2_lrs=-5,-4,-3", "--seeds=1", "--best_k=1", "--extend_grid", "--epochs=3", "--validation_examples=500",
            "--final_seeds=2", f"--out={tmp_path}", f"--runs_dir={tmp_path}/runs"]
    sweep.main(args)
    select = [(c.normalization, round(math.log2(c.learning_rate))) for c in configs if c.validation_examples == 500]
    final = [(c.normalization, round(math.log2(c.learning_rate)), c.seed) for c in configs if c.validation_examples is None]
    # batchnorm starts at 2^-3..2^-1, peaks on the lower edge: extended to 2^-4, then 2^-5 (interior)
    assert select == [("batchnorm", -3), ("batchnorm", -2), ("batchnorm", -1), ("batchnorm", -4), ("batchnorm", -5),
                      ("skipinit", -5), ("skipinit", -4), ("skipinit", -3)]
    assert final == [("batchnorm", -4, 0), ("batchnorm", -4, 1), ("skipinit", -4, 0), ("skipinit", -4, 1)]
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in runs].count("final") == 4 and runs[0]["eval_split"] == "validation"
    assert runs[-1]["curve"] == pytest.approx([0.91 / 3, 0.91 * 2 / 3, 0.91])  # skipinit, final, seed 1
    table = (tmp_path / "table.md").read_text()
    # final: seeds 0 and 1 at 2^-4 -> 90.0 and 91.0; the paper's CIFAR-10 WRN-16-2 beside
    assert "| Batch Normalization | 16 | 2^-4 (interior); 2^-5: 80.0, 2^-4: 90.0, 2^-3: 80.0, 2^-2: 70.0, 2^-1: 60.0 | " \
           "90.5 ± 0.5 (2/2 trained) | 93.5 | float32 x5; float32 x2 |" in table
    assert (tmp_path / "curves.png").stat().st_size > 5000
    configs.clear()
    sweep.main(args)  # resumed: nothing runs again
    assert configs == []


def test_converged_protocol_needs_a_validation_split(tmp_path):
    with pytest.raises(SystemExit):
        sweep.main(["--protocol=converged", "--final_seeds=3", f"--out={tmp_path}"])


def test_a_cells_rates_chosen_in_separate_sweeps_then_merged_give_the_one_sweeps_final_runs(tmp_path, monkeypatch):
    """--final_seeds=0 chooses only: one sweep per rate (the GPU step runs them at once), their runs.jsonl
    merged, then the whole grid's call runs nothing but the final seeds at the rate one sweep chooses."""
    calls = []
    fake_training(monkeypatch, fake_train(calls))
    common = ["--protocol=converged", "--depths=10", "--methods=skipinit", "--seeds=2", "--best_k=1",
              "--validation_examples=100"]
    sweep.main([*common, "--log2_lrs=-8,-7,-6", "--final_seeds=2", f"--out={tmp_path}/one"])
    one = sorted(calls)
    calls.clear()
    (tmp_path / "rate-7").mkdir()
    (tmp_path / "rate-7" / "curves.png").write_bytes(b"a drawing of final runs no longer in runs.jsonl")
    for k in (-8, -7, -6):
        sweep.main([*common, f"--log2_lrs={k}", "--final_seeds=0", f"--out={tmp_path}/rate{k}"])
    assert len(calls) == 6  # 3 rates x 2 seeds, no final run
    assert "no final runs (--final_seeds=0: choosing only)" in (tmp_path / "rate-7" / "table.md").read_text()
    assert not (tmp_path / "rate-7" / "curves.png").exists()  # no final runs: no curves drawn, none left
    (tmp_path / "merged").mkdir()
    (tmp_path / "merged" / "runs.jsonl").write_text("".join((tmp_path / f"rate{k}" / "runs.jsonl").read_text()
                                                            for k in (-8, -7, -6)))
    sweep.main([*common, "--log2_lrs=-8,-7,-6", "--final_seeds=2", f"--out={tmp_path}/merged"])
    assert [(round(math.log2(lr)), seed) for _, lr, seed, _ in calls[6:]] == [(-7, 0), (-7, 1)]
    assert sorted(calls) == one
    assert (tmp_path / "merged" / "table.md").read_text() == (tmp_path / "one" / "table.md").read_text()


def test_final_seed_start_makes_the_final_runs_new_seeds_not_the_selections_again(tmp_path, monkeypatch):
    """--final_seed_start=--seeds: the final runs are seeds the selection did not train (from 0 they would
    repeat its seeds, on the same images where --train_examples is below the split); a rerun resumes."""
    calls = []
    fake_training(monkeypatch, fake_train(calls))
    args = ["--protocol=converged", "--depths=10", "--methods=skipinit", "--log2_lrs=-8,-7,-6", "--seeds=2",
            "--best_k=1", "--validation_examples=100", "--final_seeds=2", "--final_seed_start=2", f"--out={tmp_path}"]
    sweep.main(args)
    assert [(round(math.log2(lr)), seed) for _, lr, seed, _ in calls[6:]] == [(-7, 2), (-7, 3)]
    cell = json.loads((tmp_path / "summary.json").read_text())["cells"]["skipinit/depth10"]
    assert cell["test_top1"] == pytest.approx([0.902, 0.903])  # the report's finals: seeds 2 and 3
    calls.clear()
    sweep.main(args)
    assert calls == []
    long = presets.budget_long()
    assert long["final_seed_start"] == long["seeds"]  # the 2,400-update cell's finals are new draws


def test_converged_protocol_with_a_given_rate_skips_selection(tmp_path, monkeypatch):
    calls = []
    fake_training(monkeypatch, fake_train(calls))
    sweep.main(["--protocol=converged", "--depths=100", "--methods=batchnorm,skipinit", "--chosen_log2_lrs=batchnorm=-2,skipinit=-4",
                "--validation_examples=500", "--final_seeds=2", "--seeds=1", "--best_k=1", f"--out={tmp_path}"])
    assert [(n, round(math.log2(lr)), seed) for n, lr, seed, _ in calls] == [
        ("batchnorm", -2, 0), ("batchnorm", -2, 1), ("skipinit", -4, 0), ("skipinit", -4, 1)]
    table = (tmp_path / "table.md").read_text()
    assert "| SkipInit (alpha = 0) | 100 | 2^-4 (given, --chosen_log2_lrs) | 60.1 ± 0.1 (2/2 trained) | 94.2 |" in table
    cell = json.loads((tmp_path / "summary.json").read_text())["cells"]["skipinit/depth100"]
    assert cell["mean"] == pytest.approx(0.6005) and cell["std"] == pytest.approx(0.0005) and cell["lr"] == 2.0**-4


def test_deep_row_preset_trains_the_depth_16_settings_at_depth_100_without_selection():
    deep, wrn16 = sweep.parse_args(["--preset=table1_converged_deep"]), sweep.parse_args(["--preset=table1_converged"])
    assert (deep.depths, deep.width, deep.methods) == ([100], 1, ["batchnorm", "skipinit"])
    for name in ("epochs", "schedule", "batch_size", "dataset", "bn_momentum", "mixed_precision", "protocol"):
        assert getattr(deep, name) == getattr(wrn16, name), name
    assert [(key, depth, round(math.log2(lr)), seed, phase) for key, depth, _, lr, seed, phase in sweep.pending_runs(deep, {})] == [
        ("batchnorm", 100, -4, 0, "final"), ("batchnorm", 100, -4, 1, "final"),
        ("skipinit", 100, -5, 0, "final"), ("skipinit", 100, -5, 1, "final")]


def test_data_folders_reach_every_run_and_are_not_experiment_settings(tmp_path):
    """--data_dir and --manual_dir (a dataset's original files, e.g. on a lent
    GPU machine) reach each run's training config; runs made with other
    folders join the same --out."""
    args = sweep.parse_args(["--preset=stability_edge", f"--manual_dir={tmp_path}/fm", f"--data_dir={tmp_path}/tfds"])
    run = next(iter(sweep.pending_runs(args, {})))
    config = runner.config(args, run)
    assert (config.manual_dir, config.data_dir) == (f"{tmp_path}/fm", f"{tmp_path}/tfds")
    elsewhere = {"results": {"config": {**dataclasses.asdict(config), "manual_dir": None, "data_dir": None}}}
    runner.check_same_experiment(args, {run: elsewhere}, "runs.jsonl")  # no refusal


def test_auto_precision_is_bfloat16_only_where_the_cpu_has_it(tmp_path, monkeypatch):
    avx2 = tmp_path / "avx2"
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c\n")
    bf16 = tmp_path / "bf16"
    bf16.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16\n")
    assert machine.cpu_has_native_bfloat16(str(avx2)) is False
    assert machine.cpu_has_native_bfloat16(str(bf16)) is True
    assert machine.cpu_has_native_bfloat16(str(tmp_path / "missing")) is None
    for native, expected in ((False, "none"), (True, "bfloat16")):
        monkeypatch.setattr(machine, "cpu_has_native_bfloat16", lambda native=native: native)
        assert sweep.resolve_precision("auto") == expected
        assert sweep.resolve_precision("none") == "none"
        assert machine.bfloat16_warning("none", on_gpu=False) is None
        warning = machine.bfloat16_warning("bfloat16", on_gpu=False)
        assert (warning is None) == native and (native or "emulated" in warning)


def test_a_run_records_the_gpus_it_trained_on(monkeypatch):
    """runs.jsonl's machine names the GPUs the backend sees (a GPU run is not
    recorded as its host's CPU); on a machine without one, the CPU alone."""
    import keras

    assert machine.accelerator() is None and ";" not in machine.describe()
    if keras.backend.backend() == "jax":
        import jax

        fake = type("Device", (), {"platform": "gpu", "device_kind": "NVIDIA H100 80GB HBM3"})
        monkeypatch.setattr(jax, "devices", lambda: [fake(), fake()])
    else:
        import tensorflow as tf

        monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind: ["gpu0", "gpu1"] if kind == "GPU" else [])
        monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda d: {"device_name": "NVIDIA H100 80GB HBM3"})
    assert machine.describe().endswith("; 2x NVIDIA H100 80GB HBM3")


class _LastInFirstOut:
    """An executor that takes every pending run at once (a round, as Ray
    does) and finishes them in the reverse order of submission."""

    capacity = 1000

    def __init__(self):
        self.queue, self.batches, self.waited = [], [], True

    def submit(self, ident, config):
        if self.waited:  # the runs submitted between two results
            self.batches.append([])
        self.waited = False
        self.batches[-1].append(ident)
        self.queue.append((ident, config))

    def wait(self):
        from keras_skipinit.sweep import executors
        self.waited = True
        ident, config = self.queue.pop()
        return ident, executors.execute(config)

    def in_flight(self):
        return len(self.queue), 0

    def close(self):
        pass


def test_a_sweep_in_parallel_rounds_makes_the_sequential_sweeps_runs_and_tables(tmp_path, monkeypatch):
    """Runs that do not wait on each other go out together and come back in
    any order; the grid extension, the best rate and the final seeds are
    decided from the results alone, so the runs and tables are the same."""
    calls = []
    fake_training(monkeypatch, fake_train(calls))
    args = ["--protocol=converged", "--depths=10", "--methods=skipinit,batchnorm", "--log2_lrs=-5,-4",
            "--seeds=2", "--best_k=1", "--extend_grid", "--validation_examples=100", "--final_seeds=2"]
    sweep.main([*args, f"--out={tmp_path}/seq", f"--runs_dir={tmp_path}/seq_runs"])
    sequential = sorted(calls)
    calls.clear()
    executor = _LastInFirstOut()
    monkeypatch.setattr(runner, "executor_for", lambda _: executor)
    sweep.main([*args, f"--out={tmp_path}/par", f"--runs_dir={tmp_path}/par_runs"])
    assert sorted(calls) == sequential
    assert len(executor.batches[0]) == 8  # both cells' grids (2 rates x 2 seeds) at once
    assert executor.queue == [] and len(executor.batches) < len(sequential) / 2
    assert (tmp_path / "seq" / "table.md").read_text() == (tmp_path / "par" / "table.md").read_text()


def test_a_run_that_fails_in_its_executor_is_a_one_line_error_naming_it(tmp_path, monkeypatch, capsys):
    from keras_skipinit.sweep import executors
    class Failing(_LastInFirstOut):
        def wait(self):
            ident, _ = self.queue.pop()
            raise executors.RunFailed(ident, "its worker died 4 times (WorkerCrashedError); rerun the sweep")

    monkeypatch.setattr(runner, "executor_for", lambda _: Failing())
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--depths=10", "--methods=skipinit", "--log2_lrs=-4", "--seeds=1", "--best_k=1", f"--out={tmp_path}"])
    assert exit_info.value.code == 2
    assert "error: run skipinit depth 10 lr 2^-4 seed 0: its worker died 4 times" in capsys.readouterr().err


@pytest.mark.filterwarnings("error::UserWarning")  # the figure too: all its final runs share one loss here
def test_batch_scaling_centres_each_batch_on_the_proportional_rate_chooses_on_validation_and_resumes(tmp_path, monkeypatch):
    """SkipInit Fig. 3's protocol: cells (method, batch size); each grid starts
    at the octaves around centre + log2(B / batch_size) and extends until
    interior; final seeds on all data at the chosen rate. Ghost batch and
    accumulation settings are recorded per run; a resume runs nothing."""
    calls = []

    def train(config):  # the optimum moves up one octave per doubling of the batch, from 2^-7 at batch 64
        calls.append(config)
        peak = -7 + math.log2(config.batch_size / 64)
        acc = 0.9 - 0.1 * abs(math.log2(config.learning_rate) - peak)
        return {"status": "completed", "eval_top1": acc, "train_cross_entropy": 1 - acc, "wall_time_s": 1.0,
                "chief": True, "eval_split": "validation" if config.validation_examples else "test",
                "config": dataclasses.asdict(config)}

    fake_training(monkeypatch, train)
    args = ["--preset=batch_scaling_fashion_mnist", "--methods=ghost_batchnorm,skipinit", "--batch_sizes=64,512",
            "--centre_log2_lrs=ghost_batchnorm=-6,skipinit=-7", "--batch_size=64", "--micro_batch_size=256",
            "--checkpoint_steps=5", f"--out={tmp_path}", f"--runs_dir={tmp_path}/runs"]
    sweep.main(args)
    by_cell = {}
    for c in calls:
        by_cell.setdefault((c.normalization, c.batch_size), []).append(c)
    skipinit_64 = sorted({round(math.log2(c.learning_rate)) for c in by_cell[("skipinit", 64)]})
    assert skipinit_64 == [-8, -7, -6]  # centred on the optimum: no extension
    assert sorted({round(math.log2(c.learning_rate)) for c in by_cell[("skipinit", 512)]}) == [-5, -4, -3]
    assert sorted({round(math.log2(c.learning_rate)) for c in by_cell[("ghost_batchnorm", 64)]}) == [-8, -7, -6, -5]
    for (norm, batch), configs in by_cell.items():
        assert {(c.accumulation_steps, c.batch_size // c.accumulation_steps) for c in configs} == {
            (max(1, batch // 256), min(batch, 256))}
        assert {c.ghost_batch_size for c in configs} == ({64} if norm == "ghost_batchnorm" else {None})
        assert {c.checkpoint_steps for c in configs} == {5}  # every run checkpoints mid-epoch
        finals = [c for c in configs if c.validation_examples is None]
        assert [c.seed for c in finals] == [0, 1] and {math.log2(c.learning_rate) for c in finals} == {
            -7 + math.log2(batch / 64)}
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert {(r["batch_size"], r["accumulation_steps"]) for r in runs} == {(64, 1), (512, 2)}
    first = len(calls)
    sweep.main(args)
    assert len(calls) == first
    summary = json.loads((tmp_path / "summary.json").read_text())
    cell = summary["cells"]["skipinit/batch512"]
    assert cell["lr"] == 2.0**-4 and cell["lr_lowest_loss"] == 2.0**-4 and cell["mean"] == pytest.approx(0.9)
    assert cell["trained_lrs"] == [2.0**-5, 2.0**-4, 2.0**-3] and cell["failed_lrs"] == []
    assert "| SkipInit (alpha = 0) | 512 (256 x 2) | 2^-4 (interior)" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "sweep.png").stat().st_size > 10000


def test_batch_scaling_report_compares_the_methods_at_each_batch(tmp_path, monkeypatch):
    """SkipInit Fig. 3's claims compare methods per batch size: the report gives the first method minus the
    other over the final runs, test accuracy and training cross-entropy, with Welch's interval; hand-made runs
    (final seeds 0 and 1: Ghost BatchNorm 90 and 91%, SkipInit 80 and 82%, cross-entropy 1 - accuracy)."""
    def train(config):
        peak = -7 + math.log2(config.batch_size / 64)
        gbn = config.normalization == "ghost_batchnorm"
        acc = (0.9 if gbn else 0.8) + (0.01 if gbn else 0.02) * config.seed
        acc -= 0.1 * abs(math.log2(config.learning_rate) - peak)
        return {"status": "completed", "eval_top1": acc, "train_cross_entropy": 1 - acc, "wall_time_s": 1.0,
                "chief": True, "eval_split": "validation" if config.validation_examples else "test",
                "config": dataclasses.asdict(config)}

    fake_training(monkeypatch, train)
    sweep.main(["--preset=batch_scaling_fashion_mnist", "--methods=ghost_batchnorm,skipinit", "--batch_sizes=64",
                "--centre_log2_lrs=ghost_batchnorm=-7,skipinit=-7", "--batch_size=64", f"--out={tmp_path}",
                f"--runs_dir={tmp_path}/runs"])
    rows = {tuple(line.split(" | ")[1:3]): line.split(" | ")[3:] for line in
            (tmp_path / "table.md").read_text().splitlines() if " − " in line}
    _, low, high = protocol.welch([90, 91], [80, 82])
    assert rows["64", "test accuracy (points)"] == ["+9.5", f"{low:+.1f} .. {high:+.1f}", "2/2, 2/2 |"]
    d, low, high = protocol.welch([0.10, 0.09], [0.20, 0.18])
    assert d == pytest.approx(-0.095)
    assert rows["64", "training cross-entropy"][1] == f"{low:+.2f} .. {high:+.2f}"


@pytest.mark.parametrize("other,refusal", [
    (["--train_examples=200"], "holds runs of another experiment"),
    (["--preset=fixup_fig3", "--depths=10"], "holds runs of another experiment"),
    (["--batch_size=16", "--runs_dir=OTHER"], "batch_size 32 there, 16 here"),  # issue 45.6
    (["--protocol=table1"], "holds a --protocol=depth sweep"),  # issue 45.6
])
def test_a_sweep_into_an_out_of_another_experiment_is_refused(tmp_path, monkeypatch, capsys, other, refusal):
    """Issue 32.2: another preset, other training settings (the batch size
    too, with another --runs_dir), or another protocol, into an --out that
    holds a sweep's runs: one line naming what differs, nothing run, nothing
    in the --out rewritten."""
    calls = []
    fake_training(monkeypatch, fake_train(calls))
    first = ["--depths=10", "--methods=skipinit", "--lrs=0.1", "--seeds=1", "--best_k=1", "--protocol=depth",
             f"--out={tmp_path}", f"--runs_dir={tmp_path}/runs"]
    sweep.main(first)
    files = {name: (tmp_path / name).read_bytes() for name in ("runs.jsonl", "table.md", "summary.json")}
    other = [flag.replace("OTHER", str(tmp_path / "other")) for flag in other]
    for extra in ([], ["--report_only"]):
        with pytest.raises(SystemExit) as exit_info:
            sweep.main([*first, *other, *extra])
        assert exit_info.value.code == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert refusal in line
    assert len(calls) == 1 and {name: (tmp_path / name).read_bytes() for name in files} == files


def test_unwritable_out_and_runs_dir_are_one_line_errors_before_any_run(tmp_path, monkeypatch, capsys):
    (tmp_path / "a_file").write_text("x")
    readonly = str(tmp_path / "ro")
    os.makedirs(readonly)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: not str(p).startswith(readonly) and real_access(p, mode))
    cases = [([f"--out={tmp_path / 'a_file'}"], "--out=", "is a file"),
             ([f"--out={readonly}/out"], "--out=", "is not writable"),
             ([f"--out={readonly}/out", "--report_only"], "--out=", "is not writable"),
             ([f"--out={tmp_path / 'out'}", f"--runs_dir={readonly}/runs"], "--runs_dir=", "is not writable")]
    for argv, flag, words in cases:
        with pytest.raises(SystemExit) as exit_info:
            sweep.main(["--preset=fixup_fig3", *argv])
        assert exit_info.value.code == 2, argv
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert flag in line and words in line, line
        with pytest.raises(SystemExit):  # the pre-parse's parser: before Keras loads
            sweep_cli.parse_args(["--preset=fixup_fig3", *argv])
        assert flag in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out")


def test_chance_and_classes_follow_the_dataset(tmp_path, capsys):
    """A survival sweep on 3-class data counted runs at chance (33%) as trained with the 10-class defaults
    (issue 91.6): --chance, --chance_level and --classes come from the dataset's classes, and a given value
    that contradicts them is refused by the parser."""
    from test_image_folder import write_folder

    from keras_skipinit.sweep import cli as sweep_cli

    folder = write_folder(tmp_path / "f", per_class=(2, 1))
    base = ["--preset=survival", f"--dataset={folder}", f"--out={tmp_path / 'out'}"]
    args = sweep_cli.parse_args(base)
    assert (args.classes, args.chance, args.chance_level) == (3, round(1 / 3 + 0.01, 4), 1 / 3)
    assert protocol.trained({"status": "completed", "test_top1": 0.34, "train_cross_entropy": 1.0}, args.chance) is False
    defaults = sweep_cli.parse_args(["--preset=survival", f"--out={tmp_path / 'out'}"])  # fashion_mnist: 10
    assert (defaults.classes, defaults.chance, defaults.chance_level) == (10, 0.11, 0.1)
    for flag, words in (("--chance=0.11", "--chance=0.11 is below 3-class chance"),
                        ("--classes=10", f"--classes=10, but --dataset={folder} has 3 classes")):
        with pytest.raises(SystemExit):
            sweep_cli.parse_args([*base, flag])
        assert words in capsys.readouterr().err


def test_impossible_results_and_rates_are_one_line_not_a_traceback_or_a_result(tmp_path, monkeypatch, capsys):
    """Issue 91.16: --centre_log2_lrs=skipinit=5000 overflowed (even with --dry_run); a runs.jsonl line edited
    to a rate of 0, below 0 or 1e400 met the report's logarithms as tracebacks, and an unknown status or an
    accuracy of 5.0 was taken as a result. Each is one line naming the flag, or the file and line."""
    for flag in ("--centre_log2_lrs=skipinit=5000", "--chosen_log2_lrs=skipinit=-5000"):
        with pytest.raises(SystemExit) as exit_info:
            sweep.main(["--preset=skipinit_table1", flag, "--dry_run", f"--out={tmp_path / 'flags'}"])
        assert exit_info.value.code == 2 and "log2 rates lie in -30..30" in capsys.readouterr().err
    fake_training(monkeypatch, fake_train([]))
    argv = ["--depths=10", "--methods=skipinit", "--log2_lrs=-3", "--seeds=1", "--best_k=1", "--epochs=1",
            "--no-extend_grid", f"--out={tmp_path / 'out'}", f"--runs_dir={tmp_path / 'runs'}"]
    sweep.main(argv)
    capsys.readouterr()
    path = tmp_path / "out" / "runs.jsonl"
    good = path.read_text()
    record = json.loads(good)
    for key, value, words in (("lr", 0, "lr is 0: a rate from 2^-30 to 2^30"), ("lr", -0.1, "lr is -0.1"),
                              ("lr", 1e400, "lr is inf"), ("status", "weird", "status is 'weird'"),
                              ("test_top1", 5.0, "test_top1 is 5.0: an accuracy from 0 to 1")):
        path.write_text(json.dumps({**record, key: value}) + "\n")
        with pytest.raises(SystemExit) as exit_info:
            sweep.main([*argv, "--report_only"])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and "Traceback" not in err and f"line 1: not a sweep result ({words}" in err, err


def test_a_run_folder_held_by_another_sweep_is_said_in_the_sweeps_words(tmp_path, monkeypatch, capsys):
    """The second of two sweeps on one --runs_dir was refused naming a --model_dir the user never gave
    (issue 91): the sweep names the run, its folder in --runs_dir and what to do."""
    from keras_skipinit.training import run_dir
    fake_training(monkeypatch, fake_train([]))
    held = tmp_path / "runs" / "skipinit_d10_lr0.125_s0"
    with run_dir.lock(str(held)):
        with pytest.raises(SystemExit) as exit_info:
            sweep.main(["--depths=10", "--methods=skipinit", "--log2_lrs=-3", "--seeds=1", "--best_k=1", "--epochs=1",
                        "--no-extend_grid", f"--out={tmp_path / 'out'}", f"--runs_dir={tmp_path / 'runs'}"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and "--model_dir" not in line
    assert f"run skipinit depth 10 lr 2^-3 seed 0: its folder {held} (in --runs_dir={tmp_path / 'runs'}) is in use by" \
           in line and "another sweep of this --runs_dir?" in line, line


def test_a_runs_retracing_advice_stays_out_of_the_sweeps_output(monkeypatch, caplog, tmp_path):
    """Runs one after another in one process retrace their functions: TensorFlow's advice about it came
    between the sweep's lines (issue 91); other warnings still come through."""
    import logging

    from keras_skipinit.sweep import executors
    def train(config):
        logging.getLogger("tensorflow").warning("5 out of the last 5 calls to <function f> triggered tf.function "
                                                "retracing. Tracing is expensive ...")
        logging.getLogger("tensorflow").warning("something else")
        return {"status": "completed"}

    monkeypatch.setattr(trainer, "train", train)
    with caplog.at_level(logging.WARNING):
        executors.execute(types.SimpleNamespace(model_dir=str(tmp_path)))
    assert [r.getMessage() for r in caplog.records if r.name == "tensorflow"] == ["something else"]


def test_presets_copied_without_out_do_not_collide():
    """Two preset sweeps copied from the README without --out both wrote runs/sweep, and the second was
    refused ("holds runs of another experiment"; issue 89.1): each preset's default folder is its own."""
    from keras_skipinit.sweep import cli as sweep_cli

    first, second = (sweep_cli.parse_args([f"--preset={name}", "--dry_run"]) for name in ("fixup_fig3", "survival"))
    assert (first.out, first.runs_dir) == (os.path.join("runs", "fixup_fig3"), os.path.join("runs", "sweeps", "fixup_fig3"))
    assert (second.out, second.runs_dir) == (os.path.join("runs", "survival"), os.path.join("runs", "sweeps", "survival"))
    assert sweep_cli.parse_args(["--dry_run"]).out == os.path.join("runs", "sweep")


def _committed_sweeps():
    return sorted(os.path.dirname(p) for p in glob.glob(os.path.join(ROOT, "docs", "**", "summary.json"), recursive=True)
                  if "command" in json.load(open(p)))


@pytest.mark.heavy
def test_every_committed_table_is_what_its_runs_give(tmp_path, capsys, monkeypatch):
    """Every number in docs/ comes from a committed file (issue 90.2): each sweep folder's table.md is what its
    recorded command (summary.json's) writes with --report_only from its committed runs.jsonl, now."""
    import shlex

    monkeypatch.chdir(ROOT)  # the commands name other folders (--beside, --compare_to) from the clone's root
    folders = _committed_sweeps()
    assert len(folders) >= 20
    differ = []
    for i, folder in enumerate(folders):
        copy = tmp_path / str(i)
        shutil.copytree(folder, copy)
        argv = [a if not a.startswith("--out=") else f"--out={copy}" for a in
                shlex.split(json.load(open(os.path.join(folder, "summary.json")))["command"])[3:]]
        sweep.main([*argv, "--report_only"])
        capsys.readouterr()
        if (copy / "table.md").read_text() != open(os.path.join(folder, "table.md")).read():
            differ.append(os.path.relpath(folder, ROOT))
    assert differ == [], f"table.md differs from its runs' --report_only in {differ}"


def test_every_method_option_is_a_sweep_flag_that_reaches_the_methods_runs():
    """Issue 88.3: the sweep's flags named method options by hand (--ghost_batch_size, --bn_momentum), so
    --nf_beta and --alpha_init were refused; every `normalization.OPTIONS` entry is a flag now, and a run of
    a method that takes it gets it (one of a method that does not, its default)."""
    from keras_skipinit import normalization as norm_lib
    parser = sweep_cli.build_parser()
    assert set(norm_lib.OPTIONS) <= set(parser.names)
    settings = sweep.parse_args(["--methods=nf,skipinit", "--nf_beta=0.4", "--alpha_init=one", "--depths=10"])
    nf = runner.config(settings, ("nf", 10, 32, 0.1, 0, protocol.FINAL))
    skip = runner.config(settings, ("skipinit", 10, 32, 0.1, 0, protocol.FINAL))
    assert (nf.nf_beta, nf.alpha_init, skip.alpha_init, skip.nf_beta) == (0.4, None, "one", None)


def test_every_sweep_flag_that_is_a_setting_reaches_its_runs_over_the_methods_own():
    """Issue 88.4: the sweep's runs take every train.py setting it has a flag for as given (no hand-kept list
    of names: --l2, --mixup_alpha, --init_from, --freeze_backbone were one), over the method's own settings
    (the preset's alpha_init='zero' for SkipInit); a run's own values (depth, rate, batch, seed, model_dir)
    over both."""
    from keras_skipinit import spec
    settings = sweep.parse_args(["--methods=skipinit", "--depths=10", "--l2=1e-4", "--mixup_alpha=0.2",
                                 "--eval_batch_size=64", "--alpha_init=one", "--train_examples=500", "--epochs=2"])
    run = runner.config(settings, ("skipinit", 10, 32, 0.125, 3, protocol.FINAL))
    shared = {k for k in spec.FIELDS if getattr(settings, k, None) is not None} - {"batch_size", "mixed_precision"}
    assert {k: getattr(run, k) for k in shared} == {k: getattr(settings, k) for k in shared}
    assert (run.l2, run.mixup_alpha, run.eval_batch_size, run.alpha_init) == (1e-4, 0.2, 64, "one")
    assert (run.depth, run.learning_rate, run.seed, run.batch_size) == (10, 0.125, 3, 32)
    default = runner.config(sweep.parse_args(["--methods=skipinit", "--depths=10"]), ("skipinit", 10, 32, 0.1, 0,
                                                                                     protocol.FINAL))
    assert (default.alpha_init, default.l2, default.mixup_alpha) == ("zero", 5e-4, 0.0)  # the method's, train.py's
