"""Training img/s of the settings a long CPU run can choose (issue 19, part 1).

WRN-n-1 on Fashion-MNIST (28x28x1) at batch 128 (--batch_size), through the real input
pipeline (`pipelines.train_pipeline`: augmentation on tf.data) and the model,
optimizer, L2 and metrics exactly as `train.py` compiles them
(`run_model.compiled_model`), timed with Keras' `fit` over steady-state
steps. Each setting runs in a fresh process (the dtype policy and thread
pools are per process); the settings are interleaved round by round and
the median per setting reported, as ratios to float32 in the same run.

    python benchmarks/long_run_speed.py                 # ~20 min on 2 cores
    python benchmarks/long_run_speed.py --depths=16 --rounds=1

Needs Fashion-MNIST prepared by TFDS (`apt-get install dataset-fashion-mnist`;
the first run prepares ~/tensorflow_datasets/fashion_mnist). Run it alone:
anything else on the machine changes the figures.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = {  # name -> (mixed_precision, xla, extra environment)
    "float32": ("none", False, {}),
    "bfloat16": ("bfloat16", False, {}),
    "float32 + XLA": ("none", True, {}),
    "bfloat16 + XLA": ("bfloat16", True, {}),
    "float32 + 1 inter-op thread": ("none", False, {"TF_NUM_INTEROP_THREADS": "1"}),
    "bfloat16 + 1 inter-op thread": ("bfloat16", False, {"TF_NUM_INTEROP_THREADS": "1"}),
}


def measure(depth, normalization, precision, xla, warmup, steps, batch_size=128):
    """In this process: seconds per training step after `warmup` steps."""
    import keras

    from keras_skipinit.data import pipelines, sources as data_lib
    from keras_skipinit.training import run_model, trainer
    config = trainer.Config(depth=depth, width=1, normalization=normalization, batch_size=batch_size,
                             mixed_precision=precision, xla=xla, dataset="fashion_mnist", epochs=10)
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(trainer.PRECISIONS[precision])
    dataset = data_lib.load(config.dataset)
    model = run_model.compiled_model(config, dataset, steps_per_epoch=dataset.num_train // config.batch_size)
    stamps = {}

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                stamps["first"] = time.perf_counter()
            if batch == warmup - 1:
                stamps["warm"] = time.perf_counter()

        def on_train_end(self, logs=None):
            stamps["end"] = time.perf_counter()

    start = time.perf_counter()
    train_ds = pipelines.train_pipeline(dataset, config.batch_size, 0, 0, num_batches=warmup + steps)
    model.fit(train_ds, epochs=1, steps_per_epoch=warmup + steps, verbose=0, callbacks=[Clock()])
    return {"step_s": (stamps["end"] - stamps["warm"]) / steps, "first_step_s": stamps["first"] - start}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", default="16,40,100")
    p.add_argument("--normalizations", default="batchnorm,skipinit",
                   help="the first gets every variant; the others float32 and bfloat16 at the smallest depth")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--name", help="results/<name>.json (default: long_run_speed_<device>)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30, help="timed steps per setting and round (a third at depth 100)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # worker mode: a JSON setting
    args = p.parse_args()
    if args.one:
        s = json.loads(args.one)
        print(json.dumps(measure(s["depth"], s["normalization"], s["precision"], s["xla"], args.warmup, s["steps"],
                                s["batch_size"])))
        return

    import _common

    depths = [int(d) for d in args.depths.split(",")]
    norms = args.normalizations.split(",")
    variants = args.variants.split(",")
    settings = [(d, norms[0], v) for d in depths for v in variants if "thread" not in v or d == depths[0]]
    settings += [(depths[0], n, v) for n in norms[1:] for v in ("float32", "bfloat16")]
    times = {s: [] for s in settings}
    firsts = {}
    for r in range(args.rounds):
        for depth, norm, variant in settings:
            precision, xla, env = VARIANTS[variant]
            steps = max(args.steps // 3, 8) if depth >= 100 else args.steps
            one = json.dumps({"depth": depth, "normalization": norm, "precision": precision, "xla": xla, "steps": steps,
                              "batch_size": args.batch_size})
            proc = subprocess.run([sys.executable, __file__, f"--one={one}", f"--warmup={args.warmup}"],
                                  capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env})
            if proc.returncode:
                sys.exit(f"WRN-{depth}-1 {norm} {variant} failed:\n{proc.stderr[-3000:]}")
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            times[(depth, norm, variant)].append(out["step_s"])
            firsts.setdefault((depth, norm, variant), out["first_step_s"])
            print(f"round {r + 1}: WRN-{depth}-1 {norm} {variant}: {args.batch_size / out['step_s']:.0f} img/s",
                  flush=True)
    batch, results, rows = args.batch_size, [], []
    for depth, norm, variant in settings:
        sec = statistics.median(times[(depth, norm, variant)])
        ref = statistics.median(times[(depth, norm, "float32")])
        results.append({"depth": depth, "normalization": norm, "variant": variant, "images_per_s": batch / sec,
                        "step_s": sec, "step_s_per_round": times[(depth, norm, variant)],
                        "first_step_s": firsts[(depth, norm, variant)], "vs_float32": ref / sec})
        rows.append((f"WRN-{depth}-1", norm, variant, f"{batch / sec:.0f}", f"{ref / sec:.2f}x",
                     f"{firsts[(depth, norm, variant)]:.0f}"))
    print(f"\nbatch {batch}, 28x28x1 Fashion-MNIST through the training pipeline, {_common.BACKEND}, "
          f"{_common.device()}")
    print(_common.table(("model", "normalization", "setting", "img/s", "vs float32", "first step s"), rows))
    name = args.name or "long_run_speed_" + _common.device()
    print("\nwrote", _common.write(name, {"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
