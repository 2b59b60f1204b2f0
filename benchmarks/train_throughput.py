"""Training throughput (images/s, steady state), measured interleaved in one run.

1. Our ResNet50-V2/V1 with BN against keras.applications ResNet50V2/ResNet50.
2. Every normalization choice against batchnorm (ResNet50-V2).

    python benchmarks/train_throughput.py                      # CPU defaults
    python benchmarks/train_throughput.py --gpu --batch_size=128 --input_size=224
"""

import argparse
import time

import _common
import keras
import numpy as np

from keras_skipinit import applications as apps
from keras_skipinit.normalization import NORMALIZATIONS


def step_fn(model, batch, size, classes, xla):
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.CategoricalCrossentropy(), jit_compile=xla)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, size, size, 3)).astype("float32")
    y = np.eye(classes, dtype="float32")[rng.integers(0, classes, batch)]
    start = time.perf_counter()
    model.train_on_batch(x, y)  # trace + compile
    first = time.perf_counter() - start
    return (lambda: model.train_on_batch(x, y)), first


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gpu", action="store_true", help="mixed precision (float16) + XLA")
    p.add_argument("--dtype_policy", default=None, help="float32, mixed_float16 or mixed_bfloat16 (default: "
                   "mixed_float16 with --gpu, else float32)")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--input_size", type=int, default=112)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--groups", default="keras,normalizations", help="comma list of: keras, normalizations")
    args = p.parse_args()
    policy = args.dtype_policy or ("mixed_float16" if args.gpu else "float32")
    keras.config.set_dtype_policy(policy)
    if args.gpu:
        if _common.device() == "cpu":
            print("warning: --gpu without a GPU: float16 + XLA on the CPU checks the code path, not GPU speed")
    shape = (args.input_size, args.input_size, 3)
    common = dict(input_shape=shape, classes=args.classes)
    pairs = {
        "ours ResNet50V2 (batchnorm)": lambda: apps.ResNet50V2(**common),
        "keras.applications ResNet50V2": lambda: keras.applications.ResNet50V2(weights=None, **common),
        "ours ResNet50V1 (batchnorm)": lambda: apps.ResNet50V1(**common),
        "keras.applications ResNet50": lambda: keras.applications.ResNet50(weights=None, **common),
    }
    ghost = max(1, args.batch_size // 4)  # 4 ghost batches per step, else ghost BN is plain BN
    norms = {
        f"ResNet50V2 {n}" + (f" (ghost {ghost})" if n == "ghost_batchnorm" else ""): (
            lambda n=n: apps.ResNet50V2(
                normalization=n, ghost_batch_size=ghost if n == "ghost_batchnorm" else None, **common
            )
        )
        for n in NORMALIZATIONS
    }
    groups = {"keras": ("ours vs keras.applications", pairs), "normalizations": ("normalizations (ResNet50V2)", norms)}
    results = {}
    for title, group in (groups[g] for g in args.groups.split(",")):
        fns, firsts = {}, {}
        for name, make in group.items():
            keras.backend.clear_session()
            fns[name], firsts[name] = step_fn(make(), args.batch_size, args.input_size, args.classes, args.gpu)
        medians = _common.interleaved(fns, args.rounds, args.steps)
        ref = next(iter(medians.values()))
        rows = []
        for name, sec in medians.items():
            results[name] = {"images_per_s": args.batch_size / sec, "step_s": sec, "first_step_s": firsts[name],
                             "relative_to_first_row": ref / sec}
            rows.append((name, f"{args.batch_size / sec:.1f}", f"{ref / sec:.2f}x", f"{firsts[name]:.1f}"))
        print(f"\n{title}: batch {args.batch_size}, {args.input_size}px, {_common.BACKEND}, {_common.device()}, {policy}{' + XLA' if args.gpu else ''}")
        print(_common.table(("model", "img/s", "vs first row", "first step s"), rows))
    name = f"train_throughput_{_common.device()}" + ("_fp16_xla" if args.gpu else "")
    if args.dtype_policy:
        name += "_" + args.dtype_policy
    if args.groups != p.get_default("groups"):
        name += "_" + args.groups.replace(",", "_")
    print("\nwrote", _common.write(name, {"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
