"""Input pipelines in NumPy, for the JAX backend without TensorFlow.

The same rules as `data`'s tf.data pipelines (`preprocessing`'s entry named
by `prep`): for images up to 64 px, per-image standardization (or per-channel
mean/std), pad 4 + random crop; ImageNet-style, a random-resized crop to 224
(cut by PIL; evaluation: `preprocessing.resize_bilinear`, the same pixels as
TensorFlow's); left-right flip where the dataset allows it, mixup; evaluation
batches padded with weight-0 copies. Images come as uint8 arrays (the embedded digits,
Fashion-MNIST from its original files: `idx_images`, small TFDS datasets read
whole) or, too large for memory, as `Records` of a random-access source read
and decoded per batch (ImageNet-style TFDS datasets prepared as array_record).

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
import io
import os
import zlib

import numpy as np

from keras_skipinit.data import preprocessing

PAD = preprocessing.CIFAR_PAD
# Class names by label of the datasets read from their original files (TFDS's ClassLabel names).
LABEL_NAMES = {
    "fashion_mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                      "Ankle boot"),
}


def _gunzip(path):
    """A gzipped file's bytes; a missing, unreadable, truncated or corrupt
    one is a one-line ValueError naming it (a read error, not a write error)."""
    try:
        with gzip.open(path) as f:
            return f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"cannot read {path} ({type(e).__name__}: {e}): a missing, truncated or corrupt file; "
                         "get the dataset's original files again") from None


def idx_images(directory, split):
    """(images uint8 (N, 28, 28, 1), labels int64 (N,)) of MNIST-format files
    ('train' or 't10k' split, gzipped IDX, as Fashion-MNIST ships them)."""
    raw = _gunzip(os.path.join(directory, f"{split}-images-idx3-ubyte.gz"))
    count, rows, cols = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
    if int.from_bytes(raw[:4], "big") != 0x803 or len(raw) != 16 + count * rows * cols:
        raise ValueError(f"{directory}/{split}-images-idx3-ubyte.gz is not an IDX image file")
    images = np.frombuffer(raw, np.uint8, offset=16).reshape(count, rows, cols, 1)
    raw = _gunzip(os.path.join(directory, f"{split}-labels-idx1-ubyte.gz"))
    if int.from_bytes(raw[:4], "big") != 0x801 or len(raw) != 8 + count:
        raise ValueError(f"{directory}/{split}-labels-idx1-ubyte.gz is not an IDX label file for {count} images")
    return images, np.frombuffer(raw, np.uint8, offset=8).astype(np.int64)


class Records:
    """Examples [start, stop) of a random-access source of {'image', 'label'}
    records (`tfds.data_source`), read and decoded per batch. Sliced like an
    array (`records[:n]`: a view); `image_shape`: the dataset's (H, W, C),
    None where sizes vary."""

    def __init__(self, source, image_shape, start=0, stop=None):
        self.source, self.image_shape = source, tuple(image_shape)
        self.start, self.stop = start, len(source) if stop is None else stop

    def __len__(self):
        return self.stop - self.start

    def __getitem__(self, part):
        start, stop, step = part.indices(len(self))
        if step != 1:
            raise ValueError("Records slices are contiguous")
        return Records(self.source, self.image_shape, self.start + start, self.start + max(start, stop))

    def take(self, index, pil=False):
        """(list of images, int64 labels) at positions `index`: uint8 arrays,
        or PIL images where `pil`. A source that gives images encoded (TFDS's
        `SkipDecoding`) has them decoded here by PIL, which a training crop
        then cuts without a copy to NumPy and back."""
        records = self.source.__getitems__([self.start + int(i) for i in index])
        channels = self.image_shape[-1]
        return ([_image(r["image"], channels, pil) for r in records],
                np.array([r["label"] for r in records], np.int64))


def _image(value, channels, pil):
    """A record's image (an array, or encoded bytes) as a uint8 (H, W, C)
    array, or as a PIL image where `pil`."""
    from PIL import Image

    if isinstance(value, bytes):
        image = Image.open(io.BytesIO(value))
        mode = {1: "L", 3: "RGB"}.get(channels, image.mode)
        image = image if image.mode == mode else image.convert(mode)
        if pil:
            return image
        value = np.asarray(image)
        return value[..., None] if value.ndim == 2 else value
    value = np.asarray(value, np.uint8)
    return Image.fromarray(value[..., 0] if value.shape[-1] == 1 else value) if pil else value


def _take(images, labels, index, pil=False):
    """Images and labels at `index`: of arrays, or (`labels` None) of
    `Records` (PIL images where `pil`)."""
    return images.take(index, pil) if labels is None else (images[index], labels[index])


def random_resized_crop(image, rng, size, flip):
    """'imagenet' training augmentation of one image (a uint8 array or a PIL
    image): a crop of 8-100% of the area and aspect ratio 3/4-4/3 (10 tries,
    else the whole image), resized to size x size by PIL's bilinear filter,
    flipped with probability 1/2 where `flip`; a uint8 (size, size, C)
    array. The distribution of `_imagenet_train`'s crop, drawn by NumPy; PIL
    antialiases a crop it shrinks (as torchvision's RandomResizedCrop), where
    `tf.image.resize` does not (as TensorFlow's ResNet): the price of a feed
    ~4x faster than NumPy's resize. Evaluation pixels are TensorFlow's."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        image = _image(image, None, pil=True)
    width, height = image.size
    top, left, crop_h, crop_w = 0, 0, height, width
    for _ in range(10):
        area = rng.uniform(0.08, 1.0) * height * width
        aspect = rng.uniform(3 / 4, 4 / 3)
        h, w = int(round(np.sqrt(area / aspect))), int(round(np.sqrt(area * aspect)))
        if 0 < h <= height and 0 < w <= width:
            top, left, crop_h, crop_w = rng.integers(0, height - h + 1), rng.integers(0, width - w + 1), h, w
            break
    out = np.asarray(image.resize((size, size), Image.Resampling.BILINEAR,
                                  box=(int(left), int(top), int(left + crop_w), int(top + crop_h))))
    out = out[..., None] if out.ndim == 2 else out
    return out[:, ::-1] if flip and rng.random() < 0.5 else out


class EpochOrder:
    """Example indices of an epoch's batches: one pass in a seeded order (the
    last partial batch dropped), or exactly `num_batches` batches over as
    many passes as they need, each pass in a new order. `order[step]` is the
    batch's indices, made when asked (one pass's permutation at a time), so
    an epoch of any length costs the memory of one pass."""

    def __init__(self, num_examples, batch_size, epoch, seed=0, num_batches=None):
        self.num_examples, self.batch_size, self.epoch, self.seed = num_examples, batch_size, epoch, seed
        self.batches = num_examples // batch_size if num_batches is None else num_batches
        self._pass = (None, None)

    def __len__(self):
        return self.batches

    def _permutation(self, p):
        if self._pass[0] != p:
            self._pass = (p, np.random.default_rng([self.seed, self.epoch, p]).permutation(self.num_examples))
        return self._pass[1]

    def __getitem__(self, step):
        if not 0 <= step < self.batches:
            raise IndexError(step)
        n, start = self.num_examples, step * self.batch_size
        stop = start + self.batch_size
        return np.concatenate([self._permutation(p)[max(start - p * n, 0):min(stop - p * n, n)]
                               for p in range(start // n, (stop - 1) // n + 1)])

    def array(self):
        """The whole order, (batches, batch_size)."""
        return np.stack([self[i] for i in range(self.batches)])


def augment(images, rngs, flip, prep=preprocessing.STANDARDIZE):
    """`preprocessing`'s training augmentation (`prep`: an entry or its name) of a uint8 batch:
    normalize each image, pad 4 with zeros (the mean), crop back at a random
    offset, flip left-right with probability 1/2 where `flip`. `rngs`: one
    generator per image (its draws depend on the image's place in the epoch
    only, so micro-batches of an accumulated step equal the whole batch).
    Where `prep` resizes (ImageNet-style; `images` may then be a list of
    any sizes): `random_resized_crop` each, then normalize."""
    prep = preprocessing.get(prep)
    if prep.input_size is not None:
        return prep.numpy(np.stack([random_resized_crop(image, rng, prep.input_size, flip)
                                    for image, rng in zip(images, rngs)]))
    x = prep.numpy(images)
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
    """Batch `step` of an epoch whose `EpochOrder` is `order`: (float32
    images, float32 one-hot labels), a function of (seed, epoch, step) only.
    `images`, `labels`: arrays, or `Records` and None."""
    index, prep = order[step], preprocessing.get(prep)
    first = step * len(index)  # the batch's place in the epoch
    images, labels = _take(images, labels, index, pil=prep.input_size is not None)
    x = augment(images, [np.random.default_rng([seed, epoch, first + i, 1]) for i in range(len(index))], flip,
                prep)
    y = np.eye(num_classes, dtype=np.float32)[labels]
    if mixup_alpha > 0:
        x, y = mixup(x, y, np.random.default_rng([seed, epoch, step, 2]), mixup_alpha)
    return x.astype(np.float32), y.astype(np.float32)


def eval_batches(images, labels, num_classes, batch_size, whole_batches=False, shard=(0, 1),
                 prep=preprocessing.STANDARDIZE):
    """The evaluation split's batches, as a `keras.utils.PyDataset`:
    normalized images (`preprocessing` entry `prep`) and one-hot labels; with `whole_batches`, (images,
    labels, weights) with copies of weight 0 filling the last batch (the
    metrics see only real examples). `shard`: (index, count) of this process
    among JAX's, which feeds its part of every batch (`_part`). `images`,
    `labels`: arrays, or `Records` and None (read per batch)."""
    normalize = preprocessing.get(prep).numpy_eval
    if labels is not None:  # arrays: normalized once here, not each time an epoch evaluates
        images, normalize = normalize(images), None
    count = len(images)
    index = np.arange(count + (-count % batch_size if whole_batches else 0))
    weights = (index < count).astype(np.float32)

    def batch(i):
        rows = index[i * batch_size : (i + 1) * batch_size]
        x, y = _take(images, labels, rows % count)
        x, y = x if normalize is None else normalize(x), np.eye(num_classes, dtype=np.float32)[y]
        return _part((x, y, weights[rows]) if whole_batches else (x, y), shard)

    return _batches(-(-len(index) // batch_size), batch, workers=_workers(labels))


def _workers(labels):
    """Threads that read batches: several where each batch decodes images
    (`Records`: PIL releases the GIL), else one."""
    return min(8, os.cpu_count() or 1) if labels is None else 1


def _batches(count, batch, workers=1):
    """`count` batches, batch(i) the i-th, as a `keras.utils.PyDataset` (what
    `fit` and `evaluate` take on every backend). Batches are read in order,
    `workers` of them ahead in threads of our own (`_Ahead`), never by Keras'
    enqueuer: its stop at an epoch's end keeps the batches it had read ahead
    and serves them first at the next start, so after fit's peek at batch 0
    (JAX's symbolic build) an epoch trained batches 1..k twice and the last
    ones never (issue 91.1); a batch depends on i only, so threads change no
    result."""
    import keras

    class Batches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__(workers=1)  # 1: no Keras enqueuer
            self._ahead = _Ahead(batch, count, workers) if workers > 1 else None

        def __len__(self):
            return count

        def __getitem__(self, i):
            if not 0 <= i < count:
                raise IndexError(i)
            return batch(i) if self._ahead is None else self._ahead.get(i)

    return Batches()


class _Ahead:
    """Batch i of `batch(i)`, with the next `depth` batches read meanwhile in
    as many threads: whatever order batches are asked in (a peek, a restart
    at 0, a resume at step k), `get(i)` returns batch(i) itself; batches read
    ahead and not asked for next are dropped."""

    def __init__(self, batch, count, depth):
        import concurrent.futures

        self.batch, self.count, self.depth = batch, count, depth
        self.pool = concurrent.futures.ThreadPoolExecutor(depth, thread_name_prefix="batches-ahead")
        self.pending = {}  # index -> Future

    def get(self, i):
        future = self.pending.pop(i, None) or self.pool.submit(self.batch, i)
        for j in [j for j in self.pending if not i < j <= i + self.depth]:
            self.pending.pop(j).cancel()
        for j in range(i + 1, min(i + 1 + self.depth, self.count)):
            if j not in self.pending:
                self.pending[j] = self.pool.submit(self.batch, j)
        return future.result()


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
    order, prep = EpochOrder(len(images), batch_size, epoch, seed, num_batches), preprocessing.get(prep)  # once
    return _batches(len(order) - skip_batches, lambda i: _part(
        train_batch(images, labels, num_classes, order, skip_batches + i, epoch, seed, flip, mixup_alpha, prep),
        shard), workers=_workers(labels))
