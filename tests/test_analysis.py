import csv
import json
import math
import os

import keras
import numpy as np
import pytest

from keras_skipinit import analysis, applications as apps
from keras_skipinit.analysis import command, flags

RNG = np.random.default_rng(0)


def gaussian(batch, dim=100):
    return RNG.standard_normal((batch, dim)).astype("float32")


def slope_through_origin(blocks, values):
    blocks, values = np.asarray(blocks, float), np.asarray(values, float)
    return float(blocks @ values / (blocks @ blocks))


def column(rows, stat):
    return np.array([r[stat] for r in rows])


def test_unnormalized_linear_net_variance_doubles_per_block():
    # App. B: width 1000, batch 1000 (reduced depth); theory 2^(l-1).
    rows = analysis.block_statistics(analysis.toy_resnet("linear", 10, 1000), gaussian(1000))
    blocks = column(rows, "block")
    slope = np.polyfit(blocks, np.log2(column(rows, "skip_var")), 1)[0]
    assert slope == pytest.approx(1.0, abs=0.05)
    predicted = np.array([analysis.theory("linear", b)["skip_var"] for b in blocks])
    np.testing.assert_allclose(column(rows, "skip_var"), predicted, rtol=0.2)
    np.testing.assert_allclose(column(rows, "branch_var"), predicted, rtol=0.2)  # branch = skip (§2.1)
    assert np.all(np.isnan(column(rows, "bn_moving_var")))


def test_bn_linear_net_variance_grows_linearly():
    rows = analysis.block_statistics(analysis.toy_resnet("linear_bn", 16, 1000), gaussian(1000))
    blocks = column(rows, "block")
    assert slope_through_origin(blocks, column(rows, "skip_var")) == pytest.approx(1.0, rel=0.1)
    assert slope_through_origin(blocks, column(rows, "bn_moving_var")) == pytest.approx(1.0, rel=0.1)
    np.testing.assert_allclose(column(rows, "branch_var"), 1.0, rtol=0.15)
    np.testing.assert_allclose(column(rows, "bn_moving_mean_sq"), 0, atol=0.1)  # Fig. 2(b)


def test_bn_relu_net_moving_statistics_follow_appendix_c():
    rows = analysis.block_statistics(analysis.toy_resnet("relu_bn", 16, 1000), gaussian(1000))
    blocks = column(rows, "block")
    var_slope = slope_through_origin(blocks, column(rows, "bn_moving_var"))
    mean_slope = slope_through_origin(blocks, column(rows, "bn_moving_mean_sq"))
    assert var_slope == pytest.approx(1 - 1 / math.pi, rel=0.12)  # 0.682
    assert mean_slope == pytest.approx(1 / math.pi, rel=0.25)  # 0.318
    # Moving variance < skip variance: ReLU correlates examples (App. C).
    assert np.all(column(rows, "bn_moving_var")[4:] < column(rows, "skip_var")[4:])


def test_sqrt2_relu_net_keeps_variance_at_width_1000_not_at_width_16():
    """/sqrt(2) (SkipInit §2.1's baseline) preserves the variance on average
    over the weights: at width 1000 one draw stays at the theory's 2; at
    width 16 the product of the blocks' random gains falls by orders."""
    rows = analysis.block_statistics(analysis.toy_resnet("relu_sqrt2", 16, 1000), gaussian(1000))
    # one draw's gains wander ~5% a block at width 1000: within 30% over 16 blocks (without the sqrt(2): 2^16)
    np.testing.assert_allclose(column(rows, "skip_var"), analysis.theory("relu_sqrt2", 1)["skip_var"], rtol=0.3)
    np.testing.assert_allclose(column(rows, "branch_var"), 2.0, rtol=0.3)
    narrow = analysis.block_statistics(analysis.toy_resnet("relu_sqrt2", 200, 16), gaussian(256))
    assert column(narrow, "skip_var")[-1] < 1e-3 * column(narrow, "skip_var")[0]


def test_conv_relu_bn_net_runs_on_images():
    model = analysis.toy_resnet("conv_relu_bn", 6, 16, (28, 28, 1))
    rows = analysis.block_statistics(model, analysis.sample_inputs("mnist_embedded", (28, 28, 1), 32, 0))
    assert len(rows) == 6
    assert column(rows, "skip_var")[-1] > column(rows, "skip_var")[0]


@pytest.mark.parametrize("normalization", ["skipinit", "fixup"])
def test_skipinit_and_fixup_keep_variance_flat(normalization):
    model = apps.WideResNet(40, 1, normalization=normalization, seed=0)
    x = RNG.standard_normal((16, 32, 32, 3)).astype("float32")
    rows = analysis.block_statistics(model, x)
    assert len(rows) == 18
    assert np.all(column(rows, "branch_var") == 0)
    for group in ("group1", "group2", "group3"):
        skip = [r["skip_var"] for r in rows if r["name"].startswith(group)]
        # After the group's first (projection) block the skip path is unchanged.
        np.testing.assert_allclose(skip[1:], skip[1], rtol=1e-6)


def test_batchnorm_wrn_grows_and_unnormalized_wrn_explodes():
    x = RNG.standard_normal((16, 32, 32, 3)).astype("float32")
    bn = analysis.block_statistics(apps.WideResNet(40, 1, normalization="batchnorm", seed=0), x)
    none = analysis.block_statistics(apps.WideResNet(40, 1, normalization="none", seed=0), x)
    g1_bn = column(bn, "skip_var")[1:6]
    g1_none = column(none, "skip_var")[1:6]
    # Blocks 2..6 of group 1: BN grows roughly linearly (~ +1 per block); the
    # unnormalized net geometrically (2x per block in the idealized analysis of
    # §2.1; ReLU means and zero padding make it ~1.6x here).
    bn_growth, none_growth = g1_bn[-1] / g1_bn[0], g1_none[-1] / g1_none[0]
    assert 1.3 < bn_growth < 4
    assert none_growth > 2 * bn_growth
    np.testing.assert_allclose(column(bn, "bn_moving_var")[1:6], g1_bn, rtol=0.35)


def test_block_statistics_restores_bn_state():
    model = apps.WideResNet(10, 1, normalization="batchnorm")
    before = [w.numpy().copy() for w in model.non_trainable_weights]
    momenta = [layer.momentum for layer in model.layers if hasattr(layer, "momentum")]
    analysis.block_statistics(model, RNG.standard_normal((4, 32, 32, 3)).astype("float32"))
    for a, b in zip(before, model.non_trainable_weights):
        np.testing.assert_array_equal(a, b.numpy())
    assert momenta == [layer.momentum for layer in model.layers if hasattr(layer, "momentum")]


def test_write_and_cli(tmp_path):
    analysis.main(["--toy=linear_bn", "--depth=5", "--width=64", "--batch_size=64", f"--out={tmp_path}/toy"])
    rows = list(csv.DictReader(open(tmp_path / "toy" / "spp.csv")))
    assert len(rows) == 5 and rows[0]["label"] == "linear_bn"
    assert (tmp_path / "toy" / "spp.png").stat().st_size > 10_000
    analysis.main(["--depth=10", "--normalizations=batchnorm,skipinit", "--batch_size=8", f"--out={tmp_path}/wrn"])
    results = json.load(open(tmp_path / "wrn" / "spp.json"))
    assert set(results) == {"batchnorm", "skipinit"} and len(results["skipinit"]) == 3
    analysis.main(["--model=cifar_resnet", "--depth=8", "--normalizations=fixup", "--batch_size=8",
                   f"--out={tmp_path}/cifar"])
    assert len(json.load(open(tmp_path / "cifar" / "spp.json"))["fixup"]) == 3
    with pytest.raises(SystemExit):
        analysis.main(["--model=cifar_resnet", "--depth=10", f"--out={tmp_path}/bad"])


def test_an_interrupted_analysis_keeps_the_methods_it_measured(tmp_path, monkeypatch, capsys):
    """Ctrl-C during a later method (an unrolled depth-1000 net builds for
    minutes each) kept nothing: the files were written at the end. Each
    method's rows are written as they come; one line says what the files
    hold; exit 130."""
    measure = analysis.block_statistics

    def interrupted_on_the_second(model, x):
        if interrupted_on_the_second.calls:
            raise KeyboardInterrupt
        interrupted_on_the_second.calls += 1
        return measure(model, x)

    interrupted_on_the_second.calls = 0
    monkeypatch.setattr(command, "block_statistics", interrupted_on_the_second)
    with pytest.raises(SystemExit) as exit_info:
        analysis.main(["--depth=10", "--normalizations=skipinit,batchnorm", "--batch_size=8", f"--out={tmp_path}"])
    assert exit_info.value.code == 130
    assert f"interrupted; {tmp_path}/spp.* hold skipinit (run the command again" in capsys.readouterr().err
    assert list(json.load(open(tmp_path / "spp.json"))) == ["skipinit"]
    assert {row["label"] for row in csv.DictReader(open(tmp_path / "spp.csv"))} == {"skipinit"}
    assert sorted(os.listdir(tmp_path)) == ["spp.csv", "spp.json", "spp.png"]  # no temporary file left


def test_an_unknown_method_is_refused_by_the_flags_alone(capsys):
    """--normalizations is checked by the flag parser, which runs before Keras
    loads (`_cli.preparse`): one line naming the unknown names and the known."""
    with pytest.raises(SystemExit):
        flags.build_parser().parse_args(["--normalizations=skipinit,layernorm"])
    err = capsys.readouterr().err
    assert "'layernorm': not one of batchnorm, ghost_batchnorm, skipinit" in err and "'skipinit'" not in err


def test_an_out_folder_that_cannot_be_written_is_refused_by_the_flags_alone(tmp_path, capsys):
    """--out under a file was found only when the results were written, after
    the analysis (minutes at depth 1000): now the flag parser refuses it,
    before Keras loads, and makes nothing."""
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        flags.build_parser().parse_args([f"--out={tmp_path}/file/spp"])
    assert exit_info.value.code == 2
    assert f"--out={tmp_path}/file/spp: {tmp_path}/file/spp cannot be made: {tmp_path}/file is a file" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["file"]


def test_models_without_blocks_are_rejected():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="no residual blocks"):
        analysis.block_statistics(model, np.zeros((1, 3), "float32"))


@pytest.mark.heavy
def test_function_change_is_the_sgd_steps_logit_change_per_unit_rate(tmp_path):
    """Issue 42.3 (Fixup §3): for logits f = x W, one SGD step on the mean
    cross-entropy moves them by -lr x G, G = x^T (softmax(f) - onehot) / B:
    the measure is RMS_i ||x_i G|| (exactly; no lr dependence), and the
    weights are restored. The CLI writes the measure against depth."""
    import keras

    x, labels = gaussian(16, 5), RNG.integers(0, 3, 16)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, use_bias=False)])
    w = model.weights[0].numpy().astype(np.float64)
    logits = x @ w
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    grad = x.T @ (p - np.eye(3)[labels]) / len(x)
    expected = np.sqrt(np.mean(np.sum((x @ grad) ** 2, axis=1)))
    assert analysis.function_change(model, x, labels, lr=1e-2) == pytest.approx(expected, rel=1e-3)
    np.testing.assert_array_equal(model.weights[0].numpy(), w.astype(np.float32))

    analysis.main(["--function_change", "--depths=10,16", "--normalizations=fixup,skipinit", "--batch_size=8",
                   f"--out={tmp_path}"])
    measured = json.load(open(tmp_path / "function_change.json"))
    assert set(measured) == {"fixup", "skipinit"} and all(set(v) == {"10", "16"} for v in measured.values())
    assert all(value > 0 for rows in measured.values() for value in rows.values())
    assert (tmp_path / "function_change.png").stat().st_size > 5000


def test_a_function_change_that_overflows_is_explained(tmp_path, monkeypatch, capsys):
    """Without normalization the deep nets' logits overflow at init: the line said "nan" unexplained (issue
    89.6); it says why, and the JSON holds null."""
    monkeypatch.setattr(command, "function_change", lambda model, x, y, lr: float("nan"))
    analysis.main(["--function_change", "--depths=10", "--normalizations=none", "--batch_size=8", f"--out={tmp_path}"])
    (line,) = [l for l in capsys.readouterr().out.splitlines() if l.startswith("none depth 10")]
    assert line.endswith(": not finite, the logits or the step overflow float32 at init (no normalization keeps the "
                         "signal's growth in check: null in the JSON, left out of the plot)"), line
    assert json.load(open(tmp_path / "function_change.json")) == {"none": {"10": None}}
    # A deep net says it is building before the minute it takes (issue 89.5: 57 s without a line at 1000)
    from keras_skipinit import applications
    monkeypatch.setattr(applications, "build", lambda *a, **k: None)
    monkeypatch.setattr(command, "function_change", lambda model, x, y, lr: 1.0)
    analysis.main(["--function_change", "--depths=1000", "--normalizations=fixup", "--batch_size=8", f"--out={tmp_path}"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "fixup depth 1000: building and taking the step (a minute or more on a CPU)...", lines


@pytest.mark.parametrize("argv,line", [
    (["--function_change", "--depths=16,x"], "--depths=16,x: expected positive integers separated by commas"),
    (["--depths=16,100"], "--depths and --lr are read with --function_change only"),  # was ignored: ran --depth=100
    (["--lr=0.1"], "--depths and --lr are read with --function_change only"),
    (["--batch_size=0"], "--batch_size=0: expected a positive integer, got '0'"),
    # Issue 91.17: each was a traceback after Keras loaded (nan and inf: a null in the JSON, then matplotlib's).
    (["--seed=-1"], "--seed=-1: expected a whole number >= 0, got '-1'"),
    (["--function_change", "--lr=nan"], "--lr=nan: expected a finite number > 0, got 'nan'"),
    (["--function_change", "--lr=inf"], "--lr=inf: expected a finite number > 0, got 'inf'"),
    (["--batch_size=100000"], "--batch_size=100000: the real digits are 5000"),
    (["--function_change", "--batch_size=5001", "--inputs=gaussian"], "--batch_size=5001: the real digits are 5000"),
])
def test_a_flag_the_analysis_would_ignore_or_cannot_read_is_refused_before_any_work(tmp_path, capsys, argv, line):
    """--depths=a once ran the one-depth analysis silently, and --function_change --depths=16,x ended in a
    traceback: one line each, nothing written."""
    with pytest.raises(SystemExit) as exit_info:
        analysis.main([*argv, f"--out={tmp_path}/out"])
    assert exit_info.value.code == 2 and line in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.heavy
@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the committed figures were computed on TensorFlow; "
                    "the same seed draws other initial weights on another backend")
@pytest.mark.parametrize("figure", ["spp_wrn100", "spp_toy_relu_bn"])
def test_the_readmes_figures_are_what_their_commands_compute(tmp_path, figure):
    """docs/spp_* are what the experiments guide's commands write (spp_wrn100 drifted ~1% once, unnoticed): the same
    rows, every statistic within 1e-3 (other CPUs' round-off grows through 48 unnormalized blocks)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readme = open(os.path.join(root, "docs", "guides", "experiments.md")).read().replace("\\\n", " ")
    (command,) = [line.split() for line in readme.splitlines() if line.startswith("python -m keras_skipinit.analysis")
                  and f"--out=docs/{figure}" in line]
    argv = [f"--out={tmp_path}" if a.startswith("--out=") else a for a in command[3:]]
    analysis.main(argv)
    ours, committed = (list(csv.DictReader(open(os.path.join(folder, "spp.csv"))))
                       for folder in (tmp_path, os.path.join(root, "docs", figure)))
    assert [(r["label"], r["name"]) for r in ours] == [(r["label"], r["name"]) for r in committed]
    for stat in ("skip_mean_sq", "skip_var", "branch_var", "bn_moving_mean_sq", "bn_moving_var"):
        np.testing.assert_allclose(column(ours, stat).astype(float), column(committed, stat).astype(float),
                                   rtol=1e-3, err_msg=stat)
