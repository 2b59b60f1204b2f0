"""The experiments the sweep reproduces, as data (big_vision's configs):
each preset is a function whose docstring gives its command, its budget and
the doc its results feed, returning the settings it fixes; flags given on
the command line override them. METHOD_SETTINGS names the settings of a
method a sweep can run (its --methods): every `normalization.METHODS` entry
under its own name, and a few named settings of them (SkipInit's alpha = 1)."""

from keras_skipinit import normalization as norm_lib


def _method(name, title=None, **overrides):
    """(label, training.Config overrides) of a run of method `name`."""
    return title or norm_lib.METHODS[name].title, dict(normalization=name, **overrides)


# Every method under its own name (SkipInit with alpha_init recorded), then variants.
METHOD_SETTINGS = {
    **{name: _method(name) for name in norm_lib.METHODS},
    "skipinit": _method("skipinit", alpha_init="zero"),
    "skipinit_one": _method("skipinit", "SkipInit (alpha = 1)", alpha_init="one"),
    "skipinit_inv_sqrt_d": _method("skipinit", "SkipInit (alpha = 1/sqrt(d))", alpha_init="inv_sqrt_depth"),
    # The Fixup authors' exact CIFAR network: their stem keeps PyTorch's default init (cifar_resnet only).
    "fixup_torch_stem": _method("fixup", "Fixup, stem at PyTorch's default init", stem_init="pytorch_default"),
    "lsuv": _method("none", "LSUV, no normalization", lsuv=True),
}
# SkipInit Table 1 (CIFAR-10, WRN-n-2, 200 epochs, best 5 of 7): test accuracy %.
PAPER_TABLE1 = {("batchnorm", 16): 93.5, ("batchnorm", 100): 94.7, ("skipinit_one", 16): 93.0,
                ("skipinit_inv_sqrt_d", 16): 93.0, ("skipinit_inv_sqrt_d", 100): 94.2, ("skipinit", 16): 93.3,
                ("skipinit", 100): 94.2, ("sqrt2", 16): 92.4, ("sqrt2", 100): 88.9}

_FASHION = dict(dataset="fashion_mnist", bn_momentum=0.9)


def skipinit_table1():
    """SkipInit §2.3 Table 1 (App. D Table 3) at CPU scale: WRN-16-1 and
    WRN-100-1, one epoch of 9,600 Fashion-MNIST images, best 2 of 3 seeds
    per rate, the grid extended until each optimum is interior.

        python -m keras_skipinit.sweep --preset=skipinit_table1 --out=docs/skipinit_table1 \
            --beside=docs/skipinit_table1/depth1000

    (Depth 1000: skipinit_table1_deep, whose folder the command's table and
    figure show beside depths 16 and 100.) Budget and results:
    docs/skipinit_table1/README.md."""
    return dict(protocol="table1", depths=[16, 100], width=1,
                methods=["batchnorm", "skipinit_one", "skipinit_inv_sqrt_d", "skipinit", "sqrt2", "none"],
                log2_lrs=[-4, -3, -2], seeds=3, best_k=2, extend_grid=True, epochs=1, schedule="cifar",
                batch_size=64, train_examples=9600, **_FASHION)


def skipinit_table1_deep():
    """Table 1's deep row: WRN-1000-1 (unrolled), 2 seeds per
    rate, best 2 of 2 (the budget's cut); each grid starts at the octaves
    around the method's depth-1000 stability edge, so the stability_edge
    sweep's depth-1000 runs count (copy its runs.jsonl lines), then extends
    until each optimum is interior.

        python -m keras_skipinit.sweep --preset=skipinit_table1_deep --out=docs/skipinit_table1/depth1000

    Budget and results: docs/skipinit_table1/README.md."""
    return {**skipinit_table1(), "depths": [1000], "methods": ["batchnorm", "skipinit", "sqrt2"], "seeds": 2,
            "best_k": 2, "centre_log2_lrs": dict(batchnorm=-1, skipinit=-6, sqrt2=-5), "checkpoint_steps": 10}


def stability_edge():
    """The stability edge against depth. For WRN-16, -100 and -1000-1
    (unrolled: faster per step than looped on a CPU; measured in the
    budget), the largest log2 learning rate at which 2
    of 3 seeds train (finite loss, above chance) in skipinit_table1's short
    run (150 updates at batch 64, 9,600 Fashion-MNIST images), searched an
    octave at a time from the octaves given per method. Runs of the
    skipinit_table1 sweep count (same settings; copy its runs.jsonl lines).

        python -m keras_skipinit.sweep --preset=stability_edge --out=docs/stability_edge --depths=16,100 \
            --beside=docs/stability_edge/depth1000

    (Depth 1000: stability_edge_deep, whose folder the command's table and
    plot show beside depths 16 and 100.) Budget and results:
    docs/stability_edge/README.md."""
    return {**skipinit_table1(), "protocol": "edge", "depths": [16, 100, 1000],
            "methods": ["batchnorm", "skipinit", "fixup", "sqrt2"], "extend_grid": False,
            "log2_lrs": [-3], "centre_log2_lrs": dict(batchnorm=0, skipinit=-4, fixup=-3, sqrt2=-5)}


def stability_edge_deep():
    """The stability edge at depth 1000 (WRN-1000-1, unrolled) in its own
    folder: 2 seeds per rate, both must train (the budget's cut of the third
    seed), checkpoints every 10 updates (a run is ~45 min on a CPU).

        python -m keras_skipinit.sweep --preset=stability_edge_deep --out=docs/stability_edge/depth1000

    Budget and results: docs/stability_edge/README.md."""
    return {**stability_edge(), "depths": [1000], "seeds": 2, "best_k": 2,
            "methods": ["skipinit", "batchnorm", "sqrt2", "fixup"], "checkpoint_steps": 10}


def survival():
    """Survival curves at depth 16 (WRN-16-1, skipinit_table1's 150-update
    run): per learning rate, the fraction of 10 seeds that train, with 95%
    Wilson intervals, by test accuracy and by training loss too, and the rate
    where half train; seven rates half an octave apart around each method's
    edge in docs/stability_edge. The factors in folders of their own, each
    compared to the base (--compare_to: the half-train rate's shift with a
    95% interval); per-channel normalization's fall reached the grid's top,
    so its folder has 2^-2 and 2^-1.5 too (the second command):

        python -m keras_skipinit.sweep --preset=survival --out=docs/survival
        python -m keras_skipinit.sweep --preset=survival --methods=skipinit \\
            --preprocessing=mean_std --out=docs/survival/mean_std --compare_to=docs/survival
        python -m keras_skipinit.sweep --preset=survival --methods=skipinit \\
            --preprocessing=mean_std --out=docs/survival/mean_std --compare_to=docs/survival \\
            --centre_log2_lrs=fixup=-3 --log2_lrs=-2,-1.5
        python -m keras_skipinit.sweep --preset=survival --methods=fixup --mixup_alpha=1 \\
            --l2=5e-5 --out=docs/survival/fixup_authors_recipe --compare_to=docs/survival

    210 + 90 + 70 runs of 20-90 s on 2 CPU cores, done (rerun to resume).
    Budget and results: docs/survival/README.md."""
    return {**stability_edge(), "protocol": "survival", "depths": [16], "methods": ["skipinit", "fixup", "batchnorm"],
            "seeds": 10, "best_k": 1, "centre_log2_lrs": dict(skipinit=-4, fixup=-3, batchnorm=2)}


def budget():
    """The optimum against the budget (§2.3's depth-independent rate, tested
    where it can hold): skipinit_table1's sweep (WRN-16-1, batch 64, 9,600
    Fashion-MNIST images, 3 seeds per rate, best 2 of 3, the grid extended
    until each optimum is interior) for SkipInit (alpha = 0) and BatchNorm
    at 600 updates (4 passes, the same schedule's shape), to set beside the
    150-update cells of docs/skipinit_table1 and the edges of
    docs/stability_edge.

        python -m keras_skipinit.sweep --preset=budget --out=docs/budget/updates600
        python -m keras_skipinit.sweep --preset=budget --depths=100 --methods=skipinit,batchnorm \\
            --log2_lrs=-7,-6,-5,-4,-3,-1,1 --centre_log2_lrs= --no-extend_grid --final_seeds=0 \\
            --out=docs/budget/updates600_depth100

    21 runs of 165-300 s on 2 AVX2-only CPU cores (75 min); rerun to
    resume. The second: depth 100's cells, written from their runs (one
    sweep per method and rate, run as the GPU step's lines: docs/budget/README.md;
    27 runs, 363-2,201 s each on two CPUs, one or two at once). 2,400 updates:
    budget_long; depth 100 and 1000 at longer budgets (a lent GPU) are
    planned in docs/budget/README.md."""
    return {**skipinit_table1(), "depths": [16], "methods": ["batchnorm", "skipinit"], "epochs": 4}


def budget_long():
    """The optimum against the budget at 2,400 updates (16 passes over the
    budget preset's 9,600 images, the same schedule's shape), WRN-16-1,
    SkipInit (alpha = 0) and BatchNorm: each rate chosen on 5,000 held-out
    training images (the converged protocol's rule, best 2 of 3 seeds; the
    grid around the 600-update optima, extended until interior), then 3
    final seeds at it, test accuracy reported. The finals are seeds 3-5:
    both phases train on the same 9,600 images, so seeds 0-2 would repeat
    the selection runs on the test set.

        python -m keras_skipinit.sweep --preset=budget_long --out=docs/budget/updates2400
        python -m keras_skipinit.sweep --preset=budget_long --methods=skipinit \\
            --chosen_log2_lrs=skipinit=-5 --out=docs/budget/updates2400/skipinit_2-5
        python -m keras_skipinit.sweep --preset=budget_long --depths=100 \\
            --centre_log2_lrs=skipinit=-5,batchnorm=-4 --executor=processes \\
            --processes=2 --out=docs/budget/updates2400_depth100

    The first: 24 + 3 runs of ~11 (SkipInit) to ~20 (BatchNorm) min alone
    on 2 AVX2-only CPU cores, done over three sessions: 9.4 h of run time,
    two at once. The second: SkipInit's final seeds one octave under its
    chosen rate (the rate the mean of 3 seeds would choose). The third:
    depth 100, the grids around its 600-update optima, 24 runs of 35-65 min
    two at once on 2 AVX512_BF16 Xeon cores (20.3 h of run time, over
    sessions). Rerun to resume (a run killed mid-way resumes
    from its last epoch where its --runs_dir survives). Budget and results:
    docs/budget/README.md."""
    return {**budget(), "protocol": "converged", "methods": ["skipinit", "batchnorm"], "epochs": 16,
            "validation_examples": 5000, "final_seeds": 3, "final_seed_start": 3,
            "centre_log2_lrs": dict(skipinit=-4, batchnorm=-3)}


def fixup_fig3():
    """Fixup §4.1 Fig. 3: one epoch at lr 0.1 against depth (WRN-16/52/100-1,
    32,000 Fashion-MNIST images), 3 seeds, six methods.

        python -m keras_skipinit.sweep --preset=fixup_fig3 --out=docs/fixup_fig3

    Budget and results: docs/fixup_fig3/README.md."""
    return dict(protocol="depth", depths=[16, 52, 100], width=1,
                methods=["batchnorm", "fixup", "skipinit", "sqrt2", "none", "lsuv"], lrs=[0.1], seeds=3, best_k=3,
                extend_grid=False, epochs=1, schedule="constant", batch_size=128, train_examples=32000, **_FASHION)


def fixup_fig3_cifar_resnet():
    """Fig. 3 on the Fixup authors' CIFAR ResNets (20/56/110), one epoch of
    all 60,000 images (468 updates, near CIFAR-10's 390).

        python -m keras_skipinit.sweep --preset=fixup_fig3_cifar_resnet --out=docs/fixup_fig3/cifar_resnet

    Budget and results: docs/fixup_fig3/README.md."""
    return dict(protocol="depth", model="cifar_resnet", depths=[20, 56, 110],
                methods=["batchnorm", "fixup", "skipinit", "sqrt2", "fixup_torch_stem"], lrs=[0.1], seeds=3,
                best_k=3, extend_grid=False, epochs=1, schedule="constant", batch_size=128, **_FASHION)


def fixup_fig3_wrn_full_epoch():
    """Fig. 3 on WRN-n-1 with one epoch of all 60,000 images.

        python -m keras_skipinit.sweep --preset=fixup_fig3_wrn_full_epoch --out=docs/fixup_fig3/wrn_full_epoch

    Budget and results: docs/fixup_fig3/README.md."""
    return dict(protocol="depth", depths=[16, 52, 100], width=1, methods=["batchnorm", "fixup", "skipinit", "sqrt2"],
                lrs=[0.1], seeds=3, best_k=3, extend_grid=False, epochs=1, schedule="constant", batch_size=128,
                **_FASHION)


def table1_converged_epochs():
    """Converged Table 1, step 1 (choosing E): BatchNorm's validation curve
    at a constant learning rate, 20 epochs.

        python -m keras_skipinit.sweep --preset=table1_converged_epochs --out=docs/skipinit_table1_converged/epochs

    Budget and results: docs/skipinit_table1_converged/README.md."""
    return dict(protocol="depth", depths=[16], width=1, methods=["batchnorm"], log2_lrs=[-2], seeds=1, best_k=1,
                extend_grid=False, epochs=20, schedule="constant", batch_size=128, validation_examples=5000,
                mixed_precision="auto", **_FASHION)


def table1_converged():
    """Converged Table 1, step 2: WRN-16-1, six methods, 12 epochs; each
    rate chosen on 5,000 held-out images, then 3 seeds on all training
    images. The papers' headline methods first: a cut budget cuts the last.

        python -m keras_skipinit.sweep --preset=table1_converged --out=docs/skipinit_table1_converged/wrn16

    Budget and results: docs/skipinit_table1_converged/README.md."""
    return dict(protocol="converged", depths=[16], width=1,
                methods=["batchnorm", "skipinit", "fixup", "regularized_skipinit", "sqrt2", "nf"],
                centre_log2_lrs=dict(batchnorm=-2, skipinit=-4, regularized_skipinit=-4, fixup=-3, nf=-2, sqrt2=-6),
                seeds=1, best_k=1, extend_grid=True, final_seeds=3, epochs=12, schedule="cifar", batch_size=128,
                validation_examples=5000, mixed_precision="auto", **_FASHION)


def table1_converged_deep():
    """Converged Table 1, step 3, the deep row: WRN-100-1 at the rates step
    2 chose at depth 16 (no selection at depth 100), 2 seeds, step 2's
    training settings. Not run here (cut for budget; its plan is in
    docs/skipinit_table1_converged/README.md):

        python -m keras_skipinit.sweep --preset=table1_converged_deep --out=runs/table1_converged_deep"""
    return {**table1_converged(), "depths": [100], "methods": ["batchnorm", "skipinit"], "centre_log2_lrs": {},
            "chosen_log2_lrs": dict(batchnorm=-4, skipinit=-5), "extend_grid": False, "final_seeds": 2}


def batch_scaling_fashion_mnist():
    """SkipInit §3 Fig. 3 at CPU scale: WRN-16-1 on all of Fashion-MNIST,
    batch sizes 64 .. 4096 at a fixed budget of 3 epochs. BatchNorm over
    ghost batches of 64, SkipInit (alpha = 0), and /sqrt(2) as the
    unnormalized network (docs/skipinit_table1: the one that trains at depth
    16). Micro-batches of at most 256 (4 ghost batches), gradients
    accumulated to the batch. Each cell's grid starts at the octaves around
    Table 1 converged's rates at batch 128, scaled with the batch; rate chosen
    on 5,000 held-out images, then 2 seeds on all 60,000.

        python -m keras_skipinit.sweep --preset=batch_scaling_fashion_mnist --methods=ghost_batchnorm,skipinit \
            --out=docs/skipinit_fig3_batch_scaling

    (/sqrt(2), the third method, was cut for budget: the committed runs are
    the two others'.)

    Budget (measured epoch costs, E, cut order) and results:
    docs/skipinit_fig3_batch_scaling/README.md."""
    return dict(protocol="batch_scaling", depths=[16], width=1, methods=["ghost_batchnorm", "skipinit", "sqrt2"],
                batch_sizes=[64, 256, 1024, 4096], batch_size=128, micro_batch_size=256, ghost_batch_size=64,
                centre_log2_lrs=dict(ghost_batchnorm=-4, skipinit=-5, sqrt2=-6), seeds=1, best_k=1,
                extend_grid=True, final_seeds=2, epochs=3, schedule="cifar", validation_examples=5000,
                mixed_precision="auto", **_FASHION)


def batch_scaling_cifar10():
    """SkipInit §3 Fig. 3 at the paper's scale (not run here: days of GPU
    time): CIFAR-10, WRN-16-4, 200 epochs, batch sizes 64 .. 16384, ghost
    batches of 64, micro-batches of 64 as in the paper's single-device runs.

        python -m keras_skipinit.sweep --preset=batch_scaling_cifar10 --out=runs/skipinit_fig3_cifar10"""
    return dict(protocol="batch_scaling", depths=[16], width=4, methods=["ghost_batchnorm", "skipinit", "sqrt2"],
                batch_sizes=[64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384], batch_size=64, micro_batch_size=64,
                ghost_batch_size=64, centre_log2_lrs=dict(ghost_batchnorm=-4, skipinit=-4, sqrt2=-6), seeds=1,
                best_k=1, extend_grid=True, final_seeds=2, epochs=200, schedule="cifar", validation_examples=5000,
                dataset="cifar10")


def quantization_fashion_mnist():
    """The int8 study, step 1: WRN-16-1 on all of Fashion-MNIST for
    batchnorm, skipinit, fixup and nf, 2 seeds each, 2 epochs, at the rates
    Table 1 converged chose at 12 epochs (nf, never chosen there: BN's rate,
    NF-ResNets' recipe). Step 2 exports each run float / float16 / int8:

        python -m keras_skipinit.sweep --preset=quantization_fashion_mnist --out=docs/int8_quantization
        python -m keras_skipinit.sweep.quantization --out=docs/int8_quantization

    Budget and results: docs/int8_quantization/README.md."""
    return dict(protocol="converged", depths=[16], width=1, methods=["batchnorm", "skipinit", "fixup", "nf"],
                chosen_log2_lrs=dict(batchnorm=-4, skipinit=-5, fixup=-5, nf=-4), seeds=1, best_k=1,
                extend_grid=False, final_seeds=2, epochs=2, schedule="cifar", batch_size=128,
                validation_examples=5000, mixed_precision="auto", **_FASHION)


PRESETS = {f.__name__: f for f in (
    skipinit_table1, skipinit_table1_deep, stability_edge, stability_edge_deep, survival, budget, budget_long, fixup_fig3, fixup_fig3_cifar_resnet,
    fixup_fig3_wrn_full_epoch, table1_converged_epochs, table1_converged, table1_converged_deep,
    batch_scaling_fashion_mnist, batch_scaling_cifar10, quantization_fashion_mnist)}
