"""Depth scaling of WRN n-k, unrolled against looped (loop_blocks=True, with
and without remat): build time, first step (trace/compile) time, steady step
time, peak RSS, each depth and form in a fresh process; real digits (the
embedded MNIST, 28x28) so the loss can be seen to fall.

    python benchmarks/depth_scaling.py                     # WRN-16/100/1000-2, all three forms
    python benchmarks/depth_scaling.py --width=1 --depths=10000 --forms=looped,looped_remat --batch_size=8
    python benchmarks/depth_scaling.py --width=1 --depths=10000 --forms=looped_remat --batch_size=8 --fixed_batch
    KERAS_BACKEND=jax python benchmarks/depth_scaling.py --depths=16,100
"""

import argparse
import json
import subprocess
import sys
import time

import _common

CHILD = r"""
import json, resource, sys, time, statistics
import numpy as np, keras
from keras_skipinit import analysis, applications as apps
depth, width, batch, normalization, steps, build_only, form, lr, fixed_batch = json.loads(sys.argv[1])
start = time.perf_counter()
model = apps.WideResNet(depth, width, input_shape=(28, 28, 1), normalization=normalization,
                        loop_blocks=form != "unrolled", remat=form == "looped_remat", seed=0)  # unseeded looped blocks were copies of one
out = {"depth": depth, "form": form, "layers": len(model.layers), "params": model.count_params(),
       "build_s": time.perf_counter() - start}
if not build_only:
    model.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9), loss=keras.losses.CategoricalCrossentropy())
    n = batch * (1 if fixed_batch else steps + 1)  # steps + 1 different batches of real digits, or one
    x_all, labels = analysis.real_digits(n, seed=0, with_labels=True)
    y_all = np.eye(10, dtype="float32")[labels]
    batches = [(x_all[i * batch:(i + 1) * batch], y_all[i * batch:(i + 1) * batch])
               for i in ([0] * (steps + 1) if fixed_batch else range(steps + 1))]
    start = time.perf_counter(); losses = [float(model.train_on_batch(*batches[0]))]
    out["first_step_s"] = time.perf_counter() - start
    times = []
    for xb, yb in batches[1:]:
        start = time.perf_counter(); losses.append(float(model.train_on_batch(xb, yb))); times.append(time.perf_counter() - start)
    out["step_s"] = statistics.median(times)
    out["images_per_s"] = batch / out["step_s"]
    out["losses"] = losses
out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print("RESULT " + json.dumps(out))
"""


def measure(depth, form, args, build_only=False):
    spec = json.dumps([depth, args.width, args.batch_size, args.normalization, args.steps, build_only, form, args.lr,
                       args.fixed_batch])
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, spec], capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"depth": depth, "form": form, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200],
                "wall_s": time.perf_counter() - start}
    return json.loads(lines[-1][7:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--depths", default="16,100,1000")
    p.add_argument("--width", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--normalization", default="skipinit")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--forms", default="unrolled,looped,looped_remat")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--fixed_batch", action="store_true",
                   help="train every step on the same batch: the loss then falls step by step if the whole depth "
                        "learns (with a new batch per step, batch-to-batch noise hides a few steps of progress)")
    p.add_argument("--build_10000", action="store_true", help="also build (only) a 10,000-layer WRN in each form")
    p.add_argument("--name", default="depth_scaling", help="results/<name>.json")
    p.add_argument("--timeout", type=int, default=1800)
    args = p.parse_args()
    forms = args.forms.split(",")
    results = []
    for depth in (int(d) for d in args.depths.split(",")):
        for form in forms:
            results.append(measure(depth, form, args))
            print(json.dumps(results[-1]), flush=True)
    if args.build_10000:
        results += [measure(10_000, form, args, build_only=True) for form in forms]
    rows = [
        (f"WRN-{r['depth']}-{args.width}", r["form"], r.get("layers", "-"),
         f"{r['build_s']:.1f}" if "build_s" in r else "-",
         f"{r['first_step_s']:.1f}" if "first_step_s" in r else "-", f"{r['step_s']:.3f}" if "step_s" in r else "-",
         f"{r['images_per_s']:.0f}" if "images_per_s" in r else "-",
         f"{r['peak_rss_gib']:.2f}" if "peak_rss_gib" in r else "-",
         " > ".join(f"{v:.2f}" for v in r["losses"][:: max(1, len(r["losses"]) // 4)]) if "losses" in r else "",
         r.get("error", ""))
        for r in results
    ]
    print(f"{_common.BACKEND}: {args.normalization}, batch {args.batch_size}, 28x28 real digits, lr {args.lr}, "
          "each depth and form in a fresh process")
    print(_common.table(("model", "form", "layers", "build s", "first step s", "step s", "img/s", "peak RSS GiB",
                         "loss", "error"), rows))
    print("wrote", _common.write(args.name, {"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
