"""Writes Fashion-MNIST's first N training images, then its last V (the
images --validation_examples=V holds out), and all its test images, in TFDS's
order, as gzipped IDX files (the format of the original download), so that a
machine without TensorFlow reads through `numpy_data.idx_images` exactly the
examples a TensorFlow run takes with --train_examples=N, with or without
--validation_examples=V (the last V of the file are the last V of the split).

    python benchmarks/gpu/fashion_mnist_subset.py .gpu/fashion-mnist --train_examples=9600 --validation_examples=5000
"""

import argparse
import gzip
import os

import numpy as np


def write_idx(folder, split, images, labels):
    """`images` uint8 (N, 28, 28, 1), `labels` (N,) as <split>-images-idx3-ubyte.gz and -labels-idx1-ubyte.gz."""
    n, rows, cols, _ = images.shape
    header = b"".join(int(v).to_bytes(4, "big") for v in (0x803, n, rows, cols))
    with gzip.open(os.path.join(folder, f"{split}-images-idx3-ubyte.gz"), "wb") as f:
        f.write(header + images.astype(np.uint8).tobytes())
    with gzip.open(os.path.join(folder, f"{split}-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(int(0x801).to_bytes(4, "big") + n.to_bytes(4, "big") + labels.astype(np.uint8).tobytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--train_examples", type=int, default=9600)
    parser.add_argument("--validation_examples", type=int, default=0)
    args = parser.parse_args()

    from keras_skipinit.data import numpy_data, sources
    def arrays(ds):
        return [np.stack(a) for a in zip(*sources.as_tf_data(ds).as_numpy_iterator())]

    dataset = sources.load("fashion_mnist", train_examples=args.train_examples)  # TensorFlow: TFDS, its order
    train = arrays(dataset.train)
    if args.validation_examples:
        held_out = arrays(sources.load("fashion_mnist", validation_examples=args.validation_examples).test)
        train = [np.concatenate(pair) for pair in zip(train, held_out)]
    os.makedirs(args.folder, exist_ok=True)
    for split, (images, labels) in (("train", train), ("t10k", arrays(dataset.test))):
        write_idx(args.folder, split, images, labels)
        back = numpy_data.idx_images(args.folder, split)
        assert np.array_equal(back[0], images) and np.array_equal(back[1], labels)
        print(f"{split}: {len(images)} images")


if __name__ == "__main__":
    main()
