"""Depth scaling of WRN n-k: build time, first step (trace/compile) time,
steady step time and peak memory, each depth in a fresh process; and whether
a 10,000-layer network builds.

    python benchmarks/depth_scaling.py                 # 16, 100, 1000 + 10,000 build
    python benchmarks/depth_scaling.py --depths=16,100 --no_build_10000
"""

import argparse
import json
import resource
import subprocess
import sys
import time

import _common

CHILD = r"""
import json, resource, sys, time, statistics
import numpy as np, keras, tensorflow as tf
from keras_skipinit import applications as apps
depth, width, batch, normalization, steps, build_only = json.loads(sys.argv[1])
start = time.perf_counter()
model = apps.WideResNet(depth, width, normalization=normalization)
out = {"depth": depth, "layers": len(model.layers), "params": model.count_params(),
       "build_s": time.perf_counter() - start}
if not build_only:
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss=keras.losses.CategoricalCrossentropy())
    x = tf.constant(np.random.default_rng(0).standard_normal((batch, 32, 32, 3)).astype("float32"))
    y = tf.one_hot(np.arange(batch) % 10, 10)
    start = time.perf_counter(); model.train_on_batch(x, y); out["first_step_s"] = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter(); model.train_on_batch(x, y); times.append(time.perf_counter() - start)
    out["step_s"] = statistics.median(times)
    out["images_per_s"] = batch / out["step_s"]
out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print("RESULT " + json.dumps(out))
"""


def measure(depth, args, build_only=False):
    spec = json.dumps([depth, args.width, args.batch_size, args.normalization, args.steps, build_only])
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, spec], capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"depth": depth, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200],
                "wall_s": time.perf_counter() - start}
    return json.loads(lines[-1][7:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--depths", default="16,100,1000")
    p.add_argument("--width", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--normalization", default="skipinit")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--no_build_10000", action="store_true")
    p.add_argument("--timeout", type=int, default=1800)
    args = p.parse_args()
    results = [measure(int(d), args) for d in args.depths.split(",")]
    if not args.no_build_10000:
        results.append(measure(10_000, args, build_only=True))
    rows = [
        (f"WRN-{r['depth']}-{args.width}", r.get("layers", "-"), f"{r['build_s']:.1f}" if "build_s" in r else "-",
         f"{r['first_step_s']:.1f}" if "first_step_s" in r else "-", f"{r['step_s']:.3f}" if "step_s" in r else "-",
         f"{r['images_per_s']:.0f}" if "images_per_s" in r else "-",
         f"{r['peak_rss_gib']:.2f}" if "peak_rss_gib" in r else "-", r.get("error", ""))
        for r in results
    ]
    print(f"{args.normalization}, batch {args.batch_size}, 32x32 inputs, each depth in a fresh process")
    print(_common.table(("model", "layers", "build s", "first step s", "step s", "img/s", "peak RSS GiB", "error"), rows))
    print("wrote", _common.write("depth_scaling", {"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
