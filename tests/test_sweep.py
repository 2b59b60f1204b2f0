import pytest

from keras_skipinit import sweep


def run(lr, seed, acc, status="completed"):
    return {"log2_lr": lr, "seed": seed, "status": status, "test_top1": acc}


def test_best_k_of_n_and_best_learning_rate():
    runs = [run(-3, 0, 0.90), run(-3, 1, 0.80), run(-3, 2, 0.94),
            run(-2, 0, 0.93), run(-2, 1, 0.92), run(-2, 2, 0.50)]
    best, rows = sweep.summarize(runs, best_k=2, chance=0.11)
    # best 2 of 3: lr -3 -> (0.94, 0.90), lr -2 -> (0.93, 0.92)
    assert [r["log2_lr"] for r in rows] == [-3, -2]
    assert rows[0]["mean"] == pytest.approx(0.92) and rows[0]["std"] == pytest.approx(0.02)
    assert best["log2_lr"] == -2 and best["mean"] == pytest.approx(0.925)


def test_diverged_runs_count_as_failed():
    runs = [run(-1, 0, None, "diverged"), run(-1, 1, 0.9), run(-4, 0, 0.5), run(-4, 1, 0.6)]
    best, rows = sweep.summarize(runs, best_k=2, chance=0.11)
    assert rows[1]["diverged"] == 1 and rows[1]["mean"] is None  # one of the best 2 failed
    assert best["log2_lr"] == -4
    best_one, _ = sweep.summarize(runs, best_k=1, chance=0.11)
    assert best_one["log2_lr"] == -1  # best 1 of 2 ignores the failed run


def test_cells_at_chance_or_all_diverged_are_dashes():
    at_chance = [run(-3, 0, 0.1000000015), run(-2, 0, 0.098)]
    best, _ = sweep.summarize(at_chance, best_k=1, chance=0.11)
    assert best is None
    table = sweep.format_table({("skipinit_one", 100): None, ("skipinit_one", 16): {"mean": 0.93, "std": 0.001, "log2_lr": -2}},
                               [16, 100], ["skipinit_one"])
    assert table.splitlines()[-1] == "| SkipInit (alpha = 1) | 93.0 ± 0.1 (2^-2) | — |"
    partial = sweep.format_table({}, [16], ["skipinit_one"])
    assert partial.splitlines()[-1] == "| SkipInit (alpha = 1) | not run |"


def test_cli_rejects_unknown_methods(tmp_path):
    with pytest.raises(SystemExit):
        sweep.main(["--methods=layernorm", f"--out={tmp_path}"])
    with pytest.raises(SystemExit):
        sweep.main(["--seeds=2", "--best_k=3", f"--out={tmp_path}"])


def test_tiny_sweep_end_to_end_and_resume(tmp_path):
    args = ["--depths=10", "--methods=skipinit", "--log2_lrs=-4,20", "--seeds=1", "--epochs=1",
            "--steps_per_epoch=2", f"--out={tmp_path}"]
    sweep.main(args)
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 2 and '"diverged"' in lines[1]  # 2^20 blows up
    sweep.main(args)  # resumes: nothing re-run
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "table.md").exists() and (tmp_path / "sweep.png").stat().st_size > 5000
