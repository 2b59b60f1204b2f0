"""docs/jax_parity's paired runs (issue 90.4): the TensorFlow and the JAX routes
compared by common random numbers. Each seed's initial weights are drawn once
(on TensorFlow, saved) and loaded on both backends, and both feed by NumPy in
its order (the JAX route's feed; probe.py's --feed=numpy), so a seed's two runs
differ only in each backend's arithmetic. WRN-10-1, 2 epochs (250 updates of
batch 32), the digits; SkipInit (alpha = 0) and the BatchNorm control.

    KERAS_BACKEND=tensorflow python docs/jax_parity/paired.py --weights   # each seed's initial weights, once
    KERAS_BACKEND=tensorflow python docs/jax_parity/paired.py             # the TensorFlow runs
    KERAS_BACKEND=jax python docs/jax_parity/paired.py                    # the JAX runs
    python docs/jax_parity/paired.py --report                             # -> paired.json, printed

Each finished run is one line of --out/runs.jsonl; a run already there is not
run again, so an interrupted command resumes with the same command. The report
(no Keras): per method the paired differences TensorFlow minus JAX, their mean
with a 95% t interval; for the BatchNorm control's training loss also a TOST
equivalence test at the margin fixed before the runs, +-0.03 nats (a tenth of
its ~0.3 at 2 epochs): equivalent where the 90% interval lies inside it.
"""

import argparse
import json
import math
import os

METHODS = ("skipinit", "batchnorm")
MARGIN = 0.03  # nats: the BatchNorm control's equivalence margin, fixed before the runs


def _config(method, seed, model_dir):
    from keras_skipinit.training import trainer

    return trainer.Config(depth=10, width=1, epochs=2, seed=seed, verbose=0, normalization=method,
                          model_dir=model_dir)


def _weights_path(out, method, seed):
    return os.path.join(out, "initial_weights", f"{method}_s{seed}.npz")


def write_weights(out, seeds):
    """Each (method, seed)'s initial weights as the run builds them here, by variable path."""
    import keras
    import numpy as np

    from keras_skipinit.data import sources
    from keras_skipinit.training import run_model

    dataset = sources.load("mnist_embedded")
    os.makedirs(os.path.join(out, "initial_weights"), exist_ok=True)
    for method in METHODS:
        for seed in seeds:
            keras.backend.clear_session()
            keras.utils.set_random_seed(seed)  # as trainer.train seeds before building
            model = run_model.build_model(_config(method, seed, None), dataset)
            np.savez(_weights_path(out, method, seed), **{w.path: keras.ops.convert_to_numpy(w) for w in model.weights})


def train(out, seeds):
    import keras
    import numpy as np

    from keras_skipinit.data import sources
    from keras_skipinit.training import trainer

    backend = keras.backend.backend()
    sources.numpy_feed = lambda dataset: dataset.random_access  # the NumPy feed on both backends
    compiled = trainer.compiled_model
    log = os.path.join(out, "runs.jsonl")
    done = set()
    if os.path.exists(log):
        with open(log) as f:
            done = {(r["backend"], r["method"], r["seed"]) for r in map(json.loads, f)}
    for method in METHODS:
        for seed in seeds:
            if (backend, method, seed) in done:
                continue
            saved = np.load(_weights_path(out, method, seed))

            def with_saved_weights(*args, **kwargs):
                model = compiled(*args, **kwargs)
                assert sorted(w.path for w in model.weights) == sorted(saved.files), "another model than the weights'"
                for w in model.weights:
                    w.assign(saved[w.path])
                return model

            trainer.compiled_model = with_saved_weights
            keras.backend.clear_session()
            results = trainer.train(_config(method, seed, os.path.join(out, "runs", f"{backend}_{method}_s{seed}")))
            record = {"backend": backend, "method": method, "seed": seed, "test_top1": 100 * results["test_top1"],
                      "train_cross_entropy": results["train_cross_entropy"], "wall_time_s": results["wall_time_s"]}
            with open(log, "a") as f:
                f.write(json.dumps(record) + "\n")
            print(json.dumps(record), flush=True)


def report(out):
    from scipy import stats

    with open(os.path.join(out, "runs.jsonl")) as f:
        runs = [json.loads(line) for line in f]
    by = {(r["backend"], r["method"], r["seed"]): r for r in runs}
    summary = {"margin_nats": MARGIN}
    for method in METHODS:
        seeds = sorted(s for (b, m, s) in by if b == "tensorflow" and m == method and ("jax", m, s) in by)
        for measure in ("test_top1", "train_cross_entropy"):
            d = [by["tensorflow", method, s][measure] - by["jax", method, s][measure] for s in seeds]
            n = len(d)
            if n < 2:
                continue
            mean = sum(d) / n
            sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
            half95, half90 = (stats.t.ppf(q, n - 1) * sd / math.sqrt(n) for q in (0.975, 0.95))
            row = {"pairs": n, "mean_difference": mean, "sd": sd, "ci95": [mean - half95, mean + half95],
                   "ci90": [mean - half90, mean + half90], "differences": dict(zip(seeds, d)),
                   "tensorflow": [by["tensorflow", method, s][measure] for s in seeds],
                   "jax": [by["jax", method, s][measure] for s in seeds]}
            if method == "batchnorm" and measure == "train_cross_entropy":
                row["equivalent_at_margin"] = bool(-MARGIN < mean - half90 and mean + half90 < MARGIN)
            summary[f"{method}/{measure}"] = row
            print(f"{method} {measure}: {n} pairs, TensorFlow - JAX mean {mean:+.4g} (sd {sd:.3g}), "
                  f"95% [{mean - half95:+.4g}, {mean + half95:+.4g}], 90% [{mean - half90:+.4g}, {mean + half90:+.4g}]"
                  + (f"; equivalent within +-{MARGIN}: {row['equivalent_at_margin']}" if "equivalent_at_margin" in row
                     else ""))
    with open(os.path.join(out, "paired.json"), "w") as f:
        json.dump(summary, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/jax_parity/paired")
    parser.add_argument("--seeds", default="0-15", help="first-last")
    parser.add_argument("--weights", action="store_true", help="draw each seed's initial weights (TensorFlow)")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    first, _, last = args.seeds.partition("-")
    seeds = list(range(int(first), int(last or first) + 1))
    if args.report:
        return report(args.out)
    os.makedirs(args.out, exist_ok=True)
    return write_weights(args.out, seeds) if args.weights else train(args.out, seeds)


if __name__ == "__main__":
    main()
