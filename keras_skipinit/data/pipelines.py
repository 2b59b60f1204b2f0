"""Batches for training and evaluation from a `sources.Dataset`: tf.data
pipelines on TensorFlow, `numpy_data`'s on other backends: a run's `Feed`,
chosen once (`feed`; the rule: `sources.numpy_feed`).

Augmentation randomness is stateless and keyed on (seed, epoch, example), and
the shuffle order on (seed, epoch), so an interrupted epoch can be replayed
exactly when a run resumes.
"""

import keras
import numpy as np

from keras_skipinit.data import numpy_data, preprocessing, sources


def _process_shard():
    """(index, count) of this JAX process: the NumPy feed gives each process
    its part of every global batch (`Distribution.feed_sharded_by_us`)."""
    import jax

    return jax.process_index(), jax.process_count()


def _element_seed(seed, epoch, index):
    import tensorflow as tf

    return tf.stack([tf.cast(seed * 1_000_003 + epoch, tf.int64), tf.cast(index, tf.int64)])


def mixup(images, labels, key, alpha):
    """Mixup (Zhang et al. 2017): one lambda ~ Beta(alpha, alpha) per batch,
    each example mixed with the batch in reverse order."""
    import tensorflow as tf

    k1, k2 = tf.unstack(tf.random.experimental.stateless_split(key, 2))
    a = tf.random.stateless_gamma([], seed=k1, alpha=alpha)
    b = tf.random.stateless_gamma([], seed=k2, alpha=alpha)
    lam = a / (a + b)
    return lam * images + (1 - lam) * images[::-1], lam * labels + (1 - lam) * labels[::-1]


MAX_PASSES = 10_000  # over the training set in one epoch (--steps_per_epoch): tf.data builds a pipeline per pass


def check_passes(dataset, batch_size, num_batches):
    """Refuses an epoch of `num_batches` batches that repeats the training
    data more than MAX_PASSES times (a typing error; longer runs take more
    --epochs), before a pipeline of that many passes is built."""
    if num_batches is not None and num_batches * batch_size > MAX_PASSES * dataset.num_train:
        raise ValueError(f"--steps_per_epoch={num_batches} of batches of {batch_size} repeats the "
                         f"{dataset.num_train} training examples over {MAX_PASSES:,} times in one epoch: "
                         "give more --epochs instead")


class Feed:
    """How a dataset's batches reach `fit`, chosen once (`feed`): tf.data
    pipelines (`TFData`) or `numpy_data`'s (`NumPy`), the same examples in
    the same order within each. `name` is recorded in mid-epoch checkpoints:
    a resume must take the epoch's examples in the same order."""

    name = None
    sharded_by_us = False  # each JAX process takes its own part of every global batch (`Distribution.feed_sharded_by_us`)

    def __init__(self, dataset):
        self.dataset = dataset

    def train(self, batch_size, epoch, seed=0, mixup_alpha=0.0, skip_batches=0, num_batches=None):
        """Batched, augmented, one-hot training data for one `epoch`.

        One pass over the shuffled training set (the last partial batch
        dropped), or exactly `num_batches` batches: when they need more than one
        pass, the data repeats, each pass in a new order with new augmentation.
        """
        raise NotImplementedError

    def eval(self, batch_size, whole_batches=False):
        """(image, one-hot label) batches of the evaluation split. whole_batches:
        (image, label, weight) with copies of weight 0 that fill the last batch
        (the metrics are weighted: they see only the real examples)."""
        raise NotImplementedError


class NumPy(Feed):
    """`keras.utils.PyDataset`s of `numpy_data`'s batches: the same
    distribution as `TFData`'s, not the same bits."""

    name = "NumPy"
    sharded_by_us = True

    def train(self, batch_size, epoch, seed=0, mixup_alpha=0.0, skip_batches=0, num_batches=None):
        dataset = self.dataset
        return numpy_data.train_batches(*sources.pair(dataset.train), dataset.num_classes, batch_size, epoch, seed,
                                        dataset.flip, mixup_alpha, skip_batches, num_batches, shard=_process_shard(),
                                        prep=dataset.prep)

    def eval(self, batch_size, whole_batches=False):
        dataset = self.dataset
        return numpy_data.eval_batches(*sources.pair(dataset.test), dataset.num_classes, batch_size, whole_batches,
                                       shard=_process_shard(), prep=dataset.prep)


class TFData(Feed):
    """tf.data pipelines."""

    name = "tf.data"

    def train(self, batch_size, epoch, seed=0, mixup_alpha=0.0, skip_batches=0, num_batches=None):
        import tensorflow as tf

        dataset = self.dataset
        num_classes = dataset.num_classes
        augment = dataset.prep.train
        shuffle_buffer = min(dataset.num_train, 10_000)
        per_pass = dataset.num_train // batch_size
        passes = 1 if num_batches is None else max(1, -(-num_batches * batch_size // dataset.num_train))

        def one_pass(p):
            # Pass 0 keeps the seeds of a plain epoch; pass p is a fresh order.
            order = sources.as_tf_data(dataset.train).enumerate().shuffle(
                shuffle_buffer, seed=seed * 1009 + epoch + 100_003 * p, reshuffle_each_iteration=False
            )
            return order.map(lambda index, example: (index + p * dataset.num_train, example))

        ds = one_pass(0)
        for p in range(1, passes):  # at most MAX_PASSES (`check_passes`)
            ds = ds.concatenate(one_pass(p))

        def prep(index, example):
            image, label = example
            image = augment(image, _element_seed(seed, epoch, index), dataset.flip)
            return image, tf.one_hot(label, num_classes)

        ds = ds.map(prep, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        ds = ds.batch(batch_size, drop_remainder=True).take(per_pass if num_batches is None else num_batches)
        if mixup_alpha > 0:
            ds = ds.enumerate().map(
                lambda i, batch: mixup(*batch, _element_seed(seed + 7919, epoch, i), mixup_alpha),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )
        return ds.skip(skip_batches).prefetch(tf.data.AUTOTUNE)

    def eval(self, batch_size, whole_batches=False):
        import tensorflow as tf

        dataset = self.dataset
        prep = dataset.prep
        ds = sources.as_tf_data(dataset.test).map(
            lambda image, label: (prep.eval(image), tf.one_hot(label, dataset.num_classes)),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        if whole_batches:
            fill = -dataset.num_test % batch_size
            ds = ds.map(lambda image, label: (image, label, 1.0)).concatenate(
                ds.repeat().take(fill).map(lambda image, label: (image, label, 0.0))
            )
        return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def feed(dataset):
    """The dataset's `Feed`: `NumPy` where `sources.numpy_feed` says so, else `TFData`."""
    return (NumPy if sources.numpy_feed(dataset) else TFData)(dataset)


def train_pipeline(dataset, batch_size, epoch, seed=0, mixup_alpha=0.0, skip_batches=0, num_batches=None):
    """`Feed.train` of the dataset's feed."""
    return feed(dataset).train(batch_size, epoch, seed, mixup_alpha, skip_batches, num_batches)


def eval_pipeline(dataset, batch_size, whole_batches=False):
    """`Feed.eval` of the dataset's feed."""
    return feed(dataset).eval(batch_size, whole_batches)


def num_batches(batches):
    """The number of batches of a pipeline above (None where unknown)."""
    if isinstance(batches, keras.utils.PyDataset):
        return len(batches)
    count = int(batches.cardinality())
    return count if count > 0 else None


def first_batch(batches):
    return batches[0] if isinstance(batches, keras.utils.PyDataset) else next(iter(batches))


def sample_images(dataset, split, count, preprocessing_name):
    """`count` uint8 images and labels of a Dataset split, as a client sends
    them (at the model's size: resized where the preprocessing resizes), class-balanced:
    at most ceil(count / classes) of each class, in the split's order, topped
    up in order where a class has fewer. Splits may be stored sorted by class
    (the embedded digits' test split is): its first 500 are digits 0-4."""
    import tensorflow as tf

    ds = sources.as_tf_data(dataset.test if split == "eval" else dataset.train)
    quota = -(-count // dataset.num_classes)
    taken, spare, per_class = [], [], {}
    for image, label in ds:
        label = int(label)
        if per_class.get(label, 0) < quota:
            per_class[label] = per_class.get(label, 0) + 1
            taken.append((image, label))
        elif len(spare) < count:
            spare.append((image, label))
        if len(taken) == count:
            break
    taken += spare[: count - len(taken)]
    resize, images = preprocessing.get(preprocessing_name).resize, []
    for image, _ in taken:
        if resize is not None:
            image = tf.cast(tf.round(tf.clip_by_value(resize(image), 0, 255)), tf.uint8)
        images.append(image.numpy())
    return np.stack(images), np.array([label for _, label in taken])
