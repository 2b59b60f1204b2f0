"""The factorial runs of docs/jax_parity: train.py's WRN-10-1, 2 epochs, SkipInit
(alpha = 0) on the embedded digits, with the feed and the order of the NumPy feed
swapped in, on the backend KERAS_BACKEND names (a probe: it replaces two
functions of the package for its own process).

    KERAS_BACKEND=tensorflow python docs/jax_parity/probe.py --feed=numpy --seeds=0,1,2
    KERAS_BACKEND=jax python docs/jax_parity/probe.py --feed=tfdata --seeds=0,1,2
    KERAS_BACKEND=tensorflow python docs/jax_parity/probe.py --feed=numpy --order=tfdata --seeds=0,1,2

--feed: the route's own feed is tf.data on TensorFlow and NumPy on JAX; this
picks either on either backend. --order (NumPy feed): its own permutations
(numpy), another NumPy stream (alt: the same generator, other seeds), or
tf.data's (tfdata: tf.data's shuffle of the indices, the very order the
tf.data feed trains in). Prints one line of JSON per run.
"""

import argparse
import json

import keras
import numpy as np

from keras_skipinit.data import numpy_data, sources as data_lib
from keras_skipinit.training import trainer


def _tfdata_permutation(self, p):
    import tensorflow as tf

    if self._pass[0] != p:
        n = self.num_examples
        shuffled = tf.data.Dataset.range(n).shuffle(min(n, 10_000), seed=self.seed * 1009 + self.epoch + 100_003 * p,
                                                    reshuffle_each_iteration=False)
        self._pass = (p, np.fromiter(shuffled.as_numpy_iterator(), np.int64))
    return self._pass[1]


def _alt_permutation(self, p):
    if self._pass[0] != p:
        self._pass = (p, np.random.default_rng([self.seed, self.epoch, p, 12345]).permutation(self.num_examples))
    return self._pass[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--feed", choices=("numpy", "tfdata"), required=True)
    parser.add_argument("--order", choices=("numpy", "alt", "tfdata"), default="numpy")
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--out", default="runs/jax_parity")
    args = parser.parse_args()
    data_lib.numpy_feed = lambda dataset: args.feed == "numpy" and dataset.random_access
    if args.order != "numpy":
        numpy_data.EpochOrder._permutation = {"alt": _alt_permutation, "tfdata": _tfdata_permutation}[args.order]
    for seed in map(int, args.seeds.split(",")):
        keras.backend.clear_session()
        name = f"{keras.backend.backend()}_{args.feed}_{args.order}_s{seed}"
        results = trainer.train(trainer.Config(depth=10, width=1, epochs=2, seed=seed, verbose=0,
                                                 model_dir=f"{args.out}/{name}"))
        print(json.dumps({"backend": keras.backend.backend(), "feed": args.feed, "order": args.order, "seed": seed,
                          "test_top1": results["test_top1"], "train_cross_entropy": results["train_cross_entropy"]}),
              flush=True)


if __name__ == "__main__":
    main()
