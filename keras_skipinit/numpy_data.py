"""Input pipelines in NumPy, for the JAX backend without TensorFlow.

The same rules as `data`'s tf.data pipelines, for datasets of images up to
64 px: per-image standardization (or per-channel mean/std: `preprocessing`'s
entry named by `prep`), pad 4 + random crop,
left-right flip where the dataset allows it, mixup; evaluation batches padded
with weight-0 copies. Images come as uint8 arrays: the embedded digits
(`digits`) and Fashion-MNIST from its original files (`idx_images`, Debian's
dataset-fashion-mnist).

Resuming: a batch is a pure function of (seed, epoch, step). The order of an
epoch is the concatenation of permutations drawn from generators seeded by
(seed, epoch, pass); an image's augmentation comes from a generator seeded by
(seed, epoch, its place in the epoch), a batch's mixup from one seeded by (seed,
epoch, step). A run resumed at step k starts at batch k, with no
iterator state to save (grain's checkpointable iterators solve a problem this
design does not have; they would add a dependency for it). Several JAX
processes each feed their part of every global batch (`shard`). The order and the
augmentation draws differ from tf.data's (other generators): the same
distribution, not the same bits.
"""

import gzip
import os

import numpy as np

from keras_skipinit import preprocessing

PAD = preprocessing.CIFAR_PAD
# Class names by label of the datasets read from their original files (TFDS's ClassLabel names).
LABEL_NAMES = {
    "fashion_mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                      "Ankle boot"),
}


def idx_images(directory, split):
    """(images uint8 (N, 28, 28, 1), labels int64 (N,)) of MNIST-format files
    ('train' or 't10k' split, gzipped IDX, as Fashion-MNIST ships them)."""
    with gzip.open(os.path.join(directory, f"{split}-images-idx3-ubyte.gz")) as f:
        raw = f.read()
    count, rows, cols = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
    if int.from_bytes(raw[:4], "big") != 0x803 or len(raw) != 16 + count * rows * cols:
        raise ValueError(f"{directory}/{split}-images-idx3-ubyte.gz is not an IDX image file")
    images = np.frombuffer(raw, np.uint8, offset=16).reshape(count, rows, cols, 1)
    with gzip.open(os.path.join(directory, f"{split}-labels-idx1-ubyte.gz")) as f:
        raw = f.read()
    if int.from_bytes(raw[:4], "big") != 0x801 or len(raw) != 8 + count:
        raise ValueError(f"{directory}/{split}-labels-idx1-ubyte.gz is not an IDX label file for {count} images")
    return images, np.frombuffer(raw, np.uint8, offset=8).astype(np.int64)


def epoch_order(num_examples, batch_size, epoch, seed=0, num_batches=None):
    """Example indices of an epoch's batches, (batches, batch_size): one pass
    in a seeded order (the last partial batch dropped), or exactly
    `num_batches` batches over as many passes as they need, each pass in a
    new order."""
    batches = num_examples // batch_size if num_batches is None else num_batches
    passes = max(1, -(-batches * batch_size // num_examples))
    order = np.concatenate([np.random.default_rng([seed, epoch, p]).permutation(num_examples)
                            for p in range(passes)])
    return order[: batches * batch_size].reshape(batches, batch_size)


def augment(images, rngs, flip, prep=preprocessing.STANDARDIZE):
    """`preprocessing`'s training augmentation (entry `prep`) of a uint8 batch:
    normalize each image, pad 4 with zeros (the mean), crop back at a random
    offset, flip left-right with probability 1/2 where `flip`. `rngs`: one
    generator per image (its draws depend on the image's place in the epoch
    only, so micro-batches of an accumulated step equal the whole batch)."""
    x = preprocessing.get(prep).numpy(images)
    n, height, width, _ = x.shape
    padded = np.pad(x, ((0, 0), (PAD, PAD), (PAD, PAD), (0, 0)))
    u = np.array([rng.random(3) for rng in rngs]).reshape(n, 3)
    top, left = (np.floor(u[:, :2] * (2 * PAD + 1)).astype(int)).T
    rows = top[:, None] + np.arange(height)
    cols = left[:, None] + np.arange(width)
    if flip:
        cols = np.where(u[:, 2:] < 0.5, cols[:, ::-1], cols)
    return padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]


def mixup(images, labels, rng, alpha):
    """Mixup (Zhang et al. 2017): one lambda ~ Beta(alpha, alpha) per batch,
    each example mixed with the batch in reverse order."""
    lam = rng.beta(alpha, alpha)
    return lam * images + (1 - lam) * images[::-1], lam * labels + (1 - lam) * labels[::-1]


def train_batch(images, labels, num_classes, order, step, epoch, seed=0, flip=True, mixup_alpha=0.0,
                prep=preprocessing.STANDARDIZE):
    """Batch `step` of an epoch whose `epoch_order` is `order`: (float32
    images, float32 one-hot labels), a function of (seed, epoch, step) only."""
    index = order[step]
    first = step * len(index)  # the batch's place in the epoch
    x = augment(images[index], [np.random.default_rng([seed, epoch, first + i, 1]) for i in range(len(index))], flip,
                prep)
    y = np.eye(num_classes, dtype=np.float32)[labels[index]]
    if mixup_alpha > 0:
        x, y = mixup(x, y, np.random.default_rng([seed, epoch, step, 2]), mixup_alpha)
    return x.astype(np.float32), y.astype(np.float32)


def eval_batches(images, labels, num_classes, batch_size, whole_batches=False, shard=(0, 1),
                 prep=preprocessing.STANDARDIZE):
    """The evaluation split's batches, as a `keras.utils.PyDataset`:
    normalized images (`preprocessing` entry `prep`) and one-hot labels; with `whole_batches`, (images,
    labels, weights) with copies of weight 0 filling the last batch (the
    metrics see only real examples). `shard`: (index, count) of this process
    among JAX's, which feeds its part of every batch (`_part`)."""
    x = preprocessing.get(prep).numpy(images)
    y = np.eye(num_classes, dtype=np.float32)[labels]
    weights = np.ones(len(x), np.float32)
    if whole_batches:
        fill = -len(x) % batch_size
        take = np.arange(fill) % len(x)
        x, y = np.concatenate([x, x[take]]), np.concatenate([y, y[take]])
        weights = np.concatenate([weights, np.zeros(fill, np.float32)])

    def batch(i):
        rows = slice(i * batch_size, (i + 1) * batch_size)
        return _part((x[rows], y[rows], weights[rows]) if whole_batches else (x[rows], y[rows]), shard)

    return _batches(-(-len(x) // batch_size), batch)


def _batches(count, batch):
    """`count` batches, batch(i) the i-th, as a `keras.utils.PyDataset` (what
    `fit` and `evaluate` take on every backend)."""
    import keras

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return count

        def __getitem__(self, i):
            return batch(i)

    return Batches()


def _part(batch, shard):
    """Process `index`'s rows of a global batch, split in `count` equal parts
    in order: what `jax.make_array_from_process_local_data` puts back
    together, so several processes train on one process's global batches."""
    index, count = shard
    if count == 1:
        return batch
    size = len(batch[0]) // count
    return tuple(a[index * size:(index + 1) * size] for a in batch)


def train_batches(images, labels, num_classes, batch_size, epoch, seed=0, flip=True, mixup_alpha=0.0, skip_batches=0,
                  num_batches=None, shard=(0, 1), prep=preprocessing.STANDARDIZE):
    """An epoch's training batches from `skip_batches` on, as a
    `keras.utils.PyDataset` that `fit` takes on every backend. `shard`:
    (index, count) of this process among JAX's; it gets its part of each
    global batch (`_part`), mixup included."""
    order = epoch_order(len(images), batch_size, epoch, seed, num_batches)
    return _batches(len(order) - skip_batches, lambda i: _part(
        train_batch(images, labels, num_classes, order, skip_batches + i, epoch, seed, flip, mixup_alpha, prep),
        shard))
