"""Training img/s on JAX against TensorFlow (issue 20, part 5).

The model, optimizer, L2 and metrics exactly as `train.py` compiles them
(`run_model.compiled_model`: on JAX every step is XLA-compiled, on
TensorFlow XLA is the --xla opt-in, measured both ways), one fixed batch of
random images, steady-state `train_on_batch` steps after a warm-up. The
backend is fixed per process, so each (model, backend) runs in a process of
its own; the processes are interleaved round by round and the median per
setting reported, with the ratio to TensorFlow in the same run.

    python benchmarks/backend_speed.py               # ~10 min on 2 cores
    python benchmarks/backend_speed.py --models=wrn16 --rounds=1

Needs JAX (`pip install -e ".[jax]"`). Run it alone: anything else on the
machine changes the figures.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# name -> (trainer.Config overrides, input shape, classes, batch)
MODELS = {
    "wrn16": (dict(model="wrn", depth=16, width=1, normalization="batchnorm"), (28, 28, 1), 10, 128),
    "resnet50_v2": (dict(model="resnet_v2", depth=50, normalization="batchnorm"), (112, 112, 3), 1000, 8),
}
SETTINGS = {  # name -> (KERAS_BACKEND, --xla)
    "TensorFlow": ("tensorflow", False),
    "TensorFlow + XLA": ("tensorflow", True),
    "JAX": ("jax", False),  # compiled with XLA whatever --xla says (Jax.jit_compile)
}


def measure(model_name, xla, warmup, steps):
    """In this process: seconds per training step after `warmup` steps."""
    import keras
    import numpy as np

    from keras_skipinit.training import run_model, trainer
    overrides, shape, classes, batch = MODELS[model_name]
    keras.utils.set_random_seed(0)
    config = trainer.Config(**overrides, batch_size=batch, xla=xla, epochs=10)
    dataset = type("Data", (), dict(input_shape=shape, num_classes=classes))
    model = run_model.compiled_model(config, dataset, steps_per_epoch=100)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *shape)).astype("float32")
    y = np.eye(classes, dtype="float32")[rng.integers(0, classes, batch)]
    start = time.perf_counter()
    for _ in range(warmup):
        model.train_on_batch(x, y)
    first = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
    return {"step_s": statistics.median(times), "warmup_s": first, "backend": keras.backend.backend()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--one", help=argparse.SUPPRESS)  # worker mode: a JSON setting
    args = p.parse_args()
    if args.one:
        s = json.loads(args.one)
        print(json.dumps(measure(s["model"], s["xla"], args.warmup, args.steps)))
        return

    import _common

    models, settings = args.models.split(","), args.settings.split(",")
    times, warmups = {(m, s): [] for m in models for s in settings}, {}
    for r in range(args.rounds):
        for model in models:
            for setting in settings:
                backend, xla = SETTINGS[setting]
                env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu"}
                one = json.dumps({"model": model, "xla": xla})
                proc = subprocess.run([sys.executable, __file__, f"--one={one}", f"--warmup={args.warmup}",
                                       f"--steps={args.steps}"], capture_output=True, text=True, env=env)
                if proc.returncode:
                    sys.exit(f"{model} on {setting} failed:\n{proc.stderr[-3000:]}")
                out = json.loads(proc.stdout.strip().splitlines()[-1])
                assert out["backend"] == backend, out
                times[(model, setting)].append(out["step_s"])
                warmups.setdefault((model, setting), out["warmup_s"])
                batch = MODELS[model][3]
                print(f"round {r + 1}: {model} {setting}: {batch / out['step_s']:.0f} img/s", flush=True)
    results, rows = [], []
    for model in models:
        batch, shape = MODELS[model][3], MODELS[model][1]
        ref = statistics.median(times[(model, settings[0])])
        for setting in settings:
            sec = statistics.median(times[(model, setting)])
            results.append({"model": model, "setting": setting, "batch": batch, "input_shape": shape,
                            "images_per_s": batch / sec, "step_s": sec, "step_s_per_round": times[(model, setting)],
                            "warmup_s": warmups[(model, setting)], f"vs_{settings[0]}": ref / sec})
            rows.append((model, f"{batch} x {'x'.join(map(str, shape))}", setting, f"{batch / sec:.0f}",
                         f"{ref / sec:.2f}x", f"{warmups[(model, setting)]:.0f}"))
    print(f"\ntraining steps as train.py compiles them (BatchNorm), {_common.device()}")
    print(_common.table(("model", "batch", "backend", "img/s", f"vs {settings[0]}", "warm-up s"), rows))
    print("\nwrote", _common.write("backend_speed_" + _common.device(), {"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
