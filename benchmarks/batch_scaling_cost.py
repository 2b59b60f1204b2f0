"""The cost of one training epoch per (method, batch size) of a batch-scaling
preset (issue 35), measured before the sweep is planned.

Each cell trains with the exact trainer.Config the sweep gives its runs
(`sweep.runner.config`: micro-batch, accumulation steps, ghost batch size,
precision), through the real input pipeline and `run_model.compiled_model`,
in a fresh process, timed over steady-state micro-steps; cells interleaved
over rounds, medians reported. An epoch's seconds = training images / img/s
(the evaluation of the held-out images is measured once, at the end).

    python benchmarks/batch_scaling_cost.py                       # ~10 min on 2 cores
    python benchmarks/batch_scaling_cost.py --preset=batch_scaling_fashion_mnist --rounds=1

Needs Fashion-MNIST (`apt-get install dataset-fashion-mnist`). Run it alone.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def measure(preset_argv, key, batch, warmup, steps):
    """In this process: seconds per micro-step and per evaluated image."""
    import keras

    from keras_skipinit.data import pipelines, sources as data_lib
    from keras_skipinit.training import run_model, trainer
    from keras_skipinit.sweep import cli, protocol, runner

    settings = cli.parse_args(preset_argv)
    config = runner.config(settings, (key, settings.depths[0], batch, 0.01, 0, protocol.SELECT))
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(trainer.PRECISIONS[config.mixed_precision])
    dataset = data_lib.load(config.dataset, validation_examples=config.validation_examples)
    micro = config.batch_size // config.accumulation_steps
    model = run_model.compiled_model(config, dataset, steps_per_epoch=dataset.num_train // config.batch_size)
    stamps = {}

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            if step == warmup - 1:
                stamps["warm"] = time.perf_counter()

        def on_train_end(self, logs=None):
            stamps["end"] = time.perf_counter()

    train_ds = pipelines.train_pipeline(dataset, micro, 0, 0, num_batches=warmup + steps)
    model.fit(train_ds, epochs=1, steps_per_epoch=warmup + steps, verbose=0, callbacks=[Clock()])
    eval_ds = pipelines.eval_pipeline(dataset, micro)
    model.evaluate(eval_ds, verbose=0)  # compiled once
    start = time.perf_counter()
    model.evaluate(eval_ds, verbose=0)
    return {"micro_batch": micro, "accumulation_steps": config.accumulation_steps, "num_train": dataset.num_train,
            "num_eval": dataset.num_test, "micro_step_s": (stamps["end"] - stamps["warm"]) / steps,
            "eval_s": time.perf_counter() - start, "precision": config.mixed_precision}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="batch_scaling_fashion_mnist")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=4, help="micro-steps before timing")
    p.add_argument("--images", type=int, default=6144, help="timed training images per cell and round")
    p.add_argument("--one", help=argparse.SUPPRESS)  # worker mode: a JSON cell
    args = p.parse_args()
    preset_argv = [f"--preset={args.preset}"]
    if args.one:
        cell = json.loads(args.one)
        print(json.dumps(measure(preset_argv, cell["method"], cell["batch"], args.warmup, cell["steps"])))
        return

    import _common
    from keras_skipinit.sweep import cli

    settings = cli.parse_args(preset_argv)
    cells = [(key, batch) for batch in settings.batch_sizes for key in settings.methods]
    seen = {cell: [] for cell in cells}
    for r in range(args.rounds):
        for key, batch in cells:
            micro = min(batch, settings.micro_batch_size or batch)
            one = json.dumps({"method": key, "batch": batch, "steps": max(args.images // micro, 4)})
            proc = subprocess.run([sys.executable, __file__, f"--one={one}", f"--warmup={args.warmup}"],
                                  capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
            if proc.returncode:
                sys.exit(f"{key} batch {batch} failed:\n{proc.stderr[-3000:]}")
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            seen[(key, batch)].append(out)
            print(f"round {r + 1}: {key} batch {batch}: {out['micro_batch'] / out['micro_step_s']:.0f} img/s", flush=True)
    results, rows = [], []
    for key, batch in cells:
        outs = seen[(key, batch)]
        step = statistics.median(o["micro_step_s"] for o in outs)
        evals = statistics.median(o["eval_s"] for o in outs)
        first = outs[0]
        rate = first["micro_batch"] / step
        epoch = first["num_train"] / rate + evals
        results.append({"method": key, "batch_size": batch, **{k: first[k] for k in ("micro_batch", "accumulation_steps",
                        "num_train", "num_eval", "precision")}, "images_per_s": rate, "eval_s": evals, "epoch_s": epoch})
        rows.append((key, batch, f"{first['micro_batch']} x {first['accumulation_steps']}", f"{rate:.0f}",
                     f"{evals:.0f}", f"{epoch:.0f}"))
    print(f"\n{args.preset}: {settings.dataset}, WRN-{settings.depths[0]}-{settings.width}, {_common.BACKEND}, "
          f"{_common.machine()['cpu']}")
    print(_common.table(("method", "batch", "micro x steps", "img/s", "eval s", "epoch s (55k + eval)"), rows))
    print("\nwrote", _common.write(f"batch_scaling_cost_{args.preset}", {"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
