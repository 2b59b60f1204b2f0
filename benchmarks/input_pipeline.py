"""Training img/s on JAX fed by the NumPy pipeline (`numpy_data`, no
TensorFlow) against tf.data (`pipelines.train_pipeline`), through `fit`.

WRN-16-1 (BatchNorm) compiled as train.py compiles it, batch 128, on the 60,000
Fashion-MNIST training images (Debian's dataset-fashion-mnist; the embedded
digits with --data=digits), `fit` over --steps steps after one warm-up epoch
of --steps. Each feed runs in a process of its own (JAX), interleaved round by
round; the median per feed and its ratio to tf.data in the same run. Also the
feeds alone (batches made and consumed, no model): what each costs the CPU
the model shares.

    python benchmarks/input_pipeline.py --rounds=3      # ~5 min on 2 cores

Needs JAX and TensorFlow (the comparison); run it alone.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FEEDS = ("numpy", "tf.data")


def _arrays(name, manual_dir=None):
    from keras_skipinit.data import digits, numpy_data, tfds_prepare
    if name == "digits":
        return digits.load()
    return numpy_data.idx_images(manual_dir or tfds_prepare.LOCAL_COPIES["fashion_mnist"].directory, "train")


def _feed(feed, images, labels, batch, epoch, steps):
    from keras_skipinit.data import numpy_data
    if feed == "numpy":
        return numpy_data.train_batches(images, labels, 10, batch, epoch, flip=True, num_batches=steps)
    import tensorflow as tf

    from keras_skipinit.data import pipelines, sources
    dataset = sources.Dataset("bench", tf.data.Dataset.from_tensor_slices((images, labels)), None, len(images), 0, 10,
                           images.shape[1:], "standardize", flip=True)
    return pipelines.train_pipeline(dataset, batch, epoch, num_batches=steps)  # as train.py gives fit on JAX


def measure(feed, data_name, batch, steps, manual_dir=None):
    """In this process: (img/s through fit, img/s of the feed alone)."""
    import keras

    from keras_skipinit import applications as apps
    images, labels = _arrays(data_name, manual_dir)
    start = time.perf_counter()
    batches = _feed(feed, images, labels, batch, 9, steps)
    for _ in (batches if feed == "numpy" else batches.as_numpy_iterator()):
        pass
    alone = steps * batch / (time.perf_counter() - start)
    model = apps.WideResNet(16, 1, input_shape=images.shape[1:], classes=10, normalization="batchnorm", seed=0)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="categorical_crossentropy")
    model.fit(_feed(feed, images, labels, batch, 0, steps), steps_per_epoch=steps, verbose=0)  # compile, warm up
    start = time.perf_counter()
    model.fit(_feed(feed, images, labels, batch, 1, steps), steps_per_epoch=steps, verbose=0)
    return steps * batch / (time.perf_counter() - start), alone


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--data", choices=("fashion_mnist", "digits"), default="fashion_mnist")
    parser.add_argument("--manual_dir", default=None, help="Fashion-MNIST's files (default: Debian's folder)")
    parser.add_argument("--child", default=None, help="one feed (numpy, tf.data) in this process only: its figures as JSON")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.data, args.batch, args.steps, args.manual_dir)))
        return
    figures = {feed: [] for feed in FEEDS}
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    for r in range(args.rounds):
        for feed in FEEDS:
            proc = subprocess.run([sys.executable, __file__, f"--child={feed}", f"--data={args.data}",
                                   *([f"--manual_dir={args.manual_dir}"] if args.manual_dir else []),
                                   f"--steps={args.steps}", f"--batch={args.batch}"], capture_output=True, text=True,
                                  env=env, check=True)
            figures[feed].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {feed}: {figures[feed][-1][0]:.0f} img/s through fit, "
                  f"{figures[feed][-1][1]:.0f} img/s alone", flush=True)
    base = statistics.median(f[0] for f in figures["tf.data"])
    print(f"\n| feed (JAX, WRN-16-1, batch {args.batch}, {args.data}) | img/s through fit | vs tf.data | "
          "img/s, feed alone |\n|---|---|---|---|")
    for feed in FEEDS:
        fit = statistics.median(f[0] for f in figures[feed])
        print(f"| {feed} | {fit:.0f} | {fit / base:.2f}x | {statistics.median(f[1] for f in figures[feed]):.0f} |")


if __name__ == "__main__":
    main()
