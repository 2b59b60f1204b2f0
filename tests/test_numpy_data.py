"""The NumPy input pipeline (JAX without TensorFlow): a batch is a function
of (seed, epoch, step), the augmentation is the paper's, evaluation pads with
weight-0 copies, and Fashion-MNIST's original files read as TFDS reads them."""

import numpy as np
import pytest

from conftest import require_fashion_mnist
from keras_skipinit.data import digits, numpy_data, preprocessing


def test_a_batch_is_a_function_of_seed_epoch_and_step_and_each_pass_sees_every_example_once():
    images, labels = digits.load()
    images, labels = images[:50], labels[:50]
    order = numpy_data.EpochOrder(50, 8, epoch=3, seed=1).array()
    assert order.shape == (6, 8) and len(set(order.ravel())) == 48  # one pass, the partial batch dropped
    long = numpy_data.EpochOrder(50, 8, epoch=3, seed=1, num_batches=13).array()  # 104 examples: three passes
    assert np.array_equal(long[:6], order)  # a plain epoch is the first pass
    assert sorted(long.ravel()[50:100]) == list(range(50))  # the second pass: every example once
    assert not np.array_equal(numpy_data.EpochOrder(50, 8, epoch=4, seed=1).array(), order)
    # An epoch of any length costs one pass's memory: its order is made per batch.
    endless = numpy_data.EpochOrder(50, 8, epoch=3, seed=1, num_batches=10**13)
    assert len(endless) == 10**13 and len(endless[10**13 - 1]) == 8
    # Resuming at step k gives what the uninterrupted epoch gave at k: nothing else is state.
    whole = numpy_data.train_batches(images, labels, 10, 8, epoch=3, seed=1, flip=True, mixup_alpha=0.4)
    resumed = numpy_data.train_batches(images, labels, 10, 8, epoch=3, seed=1, flip=True, mixup_alpha=0.4,
                                       skip_batches=4)
    assert len(whole) == 6 and len(resumed) == 2
    for a, b in zip(whole[4], resumed[0]):
        np.testing.assert_array_equal(a, b)
    x, y = whole[0]
    assert x.shape == (8, 28, 28, 1) and x.dtype == np.float32 and np.allclose(y.sum(axis=1), 1.0)
    assert not np.array_equal(whole[0][0], whole[1][0])


def test_augmentation_is_a_random_crop_of_the_padded_standardized_image_and_flips_only_where_allowed():
    images, _ = digits.load()
    batch = images[:64]
    standardized = preprocessing.get(preprocessing.STANDARDIZE).numpy(batch)
    padded = np.pad(standardized, ((0, 0), (4, 4), (4, 4), (0, 0)))
    windows = {(i, j): padded[:, i:i + 28, j:j + 28] for i in range(9) for j in range(9)}

    def offsets(out, mirrored):
        found = []
        for k in range(len(out)):
            match = [key for key, w in windows.items()
                     if np.array_equal(out[k], w[k][:, ::-1] if mirrored else w[k])]
            found.append(match)
        return found

    plain = numpy_data.augment(batch, [np.random.default_rng([0, i]) for i in range(64)], flip=False)
    assert all(offsets(plain, mirrored=False))  # every image a 28x28 window of its padded self
    assert len({m[0] for m in offsets(plain, mirrored=False)}) > 20  # at random offsets
    flipped = numpy_data.augment(batch, [np.random.default_rng([0, i]) for i in range(64)], flip=True)
    mirrored = sum(bool(m) and not p for m, p in zip(offsets(flipped, True), offsets(flipped, False)))
    assert 15 < mirrored < 50  # about half of 64


def test_evaluation_batches_are_standardized_and_padded_with_weight_zero_copies():
    images, labels = digits.load()
    batches = numpy_data.eval_batches(images[:10], labels[:10], 10, 4, whole_batches=True)
    assert [len(b[0]) for b in batches] == [4, 4, 4]
    weights = np.concatenate([b[2] for b in batches])
    assert weights.tolist() == [1.0] * 10 + [0.0] * 2
    x = np.concatenate([b[0] for b in batches])
    np.testing.assert_allclose(x[:10], preprocessing.get(preprocessing.STANDARDIZE).numpy(images[:10]))
    assert [len(b[0]) for b in numpy_data.eval_batches(images[:10], labels[:10], 10, 4)] == [4, 4, 2]


def test_fashion_mnist_files_read_as_their_format_says():
    directory = require_fashion_mnist()
    train, train_labels = numpy_data.idx_images(directory, "train")
    test, test_labels = numpy_data.idx_images(directory, "t10k")
    assert train.shape == (60000, 28, 28, 1) and test.shape == (10000, 28, 28, 1) and train.dtype == np.uint8
    assert np.bincount(train_labels).tolist() == [6000] * 10 and np.bincount(test_labels).tolist() == [1000] * 10
    assert 70 < train.mean() < 80  # Fashion-MNIST's mean pixel is 72.9 (digits: 33)


def test_missing_truncated_or_corrupt_idx_files_are_one_read_error_naming_the_file(tmp_path):
    """A truncated .gz was an EOFError traceback, and a missing file (an
    empty --manual_dir) an OSError that train.py reported as a full disk."""
    import gzip

    images, labels = digits.load()
    with gzip.open(tmp_path / "train-images-idx3-ubyte.gz", "wb") as f:
        f.write((0x803).to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in (100, 28, 28))
                + images[:100].tobytes())
    with gzip.open(tmp_path / "train-labels-idx1-ubyte.gz", "wb") as f:
        f.write((0x801).to_bytes(4, "big") + (100).to_bytes(4, "big") + labels[:100].astype(np.uint8).tobytes())
    read, _ = numpy_data.idx_images(str(tmp_path), "train")
    np.testing.assert_array_equal(read, images[:100])
    whole = (tmp_path / "train-images-idx3-ubyte.gz").read_bytes()
    for damaged in (whole[: len(whole) // 2], b"not gzip at all"):
        (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(damaged)
        with pytest.raises(ValueError, match="cannot read .*train-images-idx3-ubyte.gz .*truncated or corrupt"):
            numpy_data.idx_images(str(tmp_path), "train")
    with pytest.raises(ValueError, match="cannot read .*t10k-images-idx3-ubyte.gz .*FileNotFoundError"):
        numpy_data.idx_images(str(tmp_path), "t10k")


class _Source:
    """A random-access source of {'image', 'label'} records, as tfds.data_source gives; counts reads."""

    def __init__(self, images, labels):
        self.images, self.labels, self.reads = images, labels, 0

    def __len__(self):
        return len(self.images)

    def __getitems__(self, index):
        self.reads += len(index)
        return [{"image": self.images[i], "label": self.labels[i]} for i in index]


def test_records_read_per_batch_give_the_batches_arrays_give():
    """Datasets too large for memory (`Records`, ImageNet-style TFDS data) are
    read per batch, a slice is a view, and the batches equal those of the
    same examples held as arrays (training and padded evaluation)."""
    images, labels = digits.load()
    source = _Source(images[:60], labels[:60])
    records = numpy_data.Records(source, (28, 28, 1))[10:50]
    assert len(records) == 40 and source.reads == 0
    arrays = images[10:50], labels[10:50]
    kwargs = dict(epoch=2, seed=3, flip=False, mixup_alpha=0.2)
    lazy = numpy_data.train_batches(records, None, 10, 8, **kwargs)
    assert len(lazy) == 5 and source.reads == 0
    for a, b in zip(lazy[3], numpy_data.train_batches(*arrays, 10, 8, **kwargs)[3]):
        np.testing.assert_array_equal(a, b)
    assert 8 <= source.reads <= 16  # batch 3, and batch 4 where it was read ahead meanwhile (its last)
    for a, b in zip(numpy_data.eval_batches(records, None, 10, 16, whole_batches=True)[2],
                    numpy_data.eval_batches(*arrays, 10, 16, whole_batches=True)[2]):
        np.testing.assert_array_equal(a, b)
    # --validation_examples and --train_examples over records: the same examples as over arrays.
    from keras_skipinit.data import sources
    whole = numpy_data.Records(source, (28, 28, 1))
    held = sources._in_memory("s", whole, whole, train_examples=20, held_out=10, flip=False, label_names=tuple("abcdefghij"))
    assert (held.num_train, held.num_test, held.raw_shape, held.eval_split) == (20, 10, (28, 28, 1), "validation")
    assert (held.train.start, held.train.stop, held.test.start, held.test.stop) == (0, 20, 50, 60)


def test_batches_read_ahead_are_the_batches_asked_for_in_any_order():
    """Records are read ahead in threads (`_Ahead`), not by Keras' enqueuer, which after fit's peek at batch 0
    served the batches it had read ahead first (issue 91.1): asked in fit's order (a peek, then the epoch), a
    resume's (from step 3) or backwards, each batch is the one asked for."""
    images, labels = digits.load()
    records = numpy_data.Records(_Source(images[:96], labels[:96]), (28, 28, 1))
    lazy = numpy_data.train_batches(records, None, 10, 8, epoch=1, seed=2, flip=True)
    direct = numpy_data.train_batches(images[:96], labels[:96], 10, 8, epoch=1, seed=2, flip=True)
    if numpy_data._workers(None) < 2:
        pytest.skip("one core: nothing is read ahead")
    for order in ([0, *range(12)], [*range(3, 12)], [*range(11, -1, -1)]):
        for i in order:
            for a, b in zip(lazy[i], direct[i]):
                np.testing.assert_array_equal(a, b, err_msg=f"batch {i} of {order}")
    with pytest.raises(IndexError):
        lazy[12]


def test_random_resized_crop_is_a_resized_window_flipped_about_half_the_time():
    """'imagenet' training augmentation in NumPy: a window of 8-100% of the
    area (aspect 3/4-4/3) resized to the model's size, mirrored with
    probability 1/2 (the image's column index as its pixel value shows both)."""
    height, width = 60, 80
    image = np.broadcast_to(np.arange(width, dtype=np.uint8)[None, :, None], (height, width, 3)).copy()
    spans, flips = [], 0
    for i in range(64):
        out = numpy_data.random_resized_crop(image, np.random.default_rng([0, i]), 32, flip=True)
        assert out.shape == (32, 32, 3) and out.dtype == np.uint8
        row = out[0, :, 0].astype(int)
        flipped = row[0] > row[-1]
        flips += flipped
        assert np.all(np.diff(row[::-1] if flipped else row) >= 0)  # one window, no wrap
        spans.append((row.max() - row.min() + 1) / width)
    assert 15 < flips < 50
    assert min(spans) < 0.5 and max(spans) > 0.8  # windows of many widths


def test_records_of_encoded_images_give_the_batches_of_their_decoded_arrays():
    """ImageNet-style TFDS data is read with its images still encoded
    (`SkipDecoding`): `Records` decodes them with PIL, and a training crop
    cuts the PIL image itself. Batches equal those of the same images as
    arrays (training crops and evaluation pixels), for RGB and grayscale."""
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    for channels in (3, 1):
        arrays = [rng.integers(0, 256, (h, w, channels), dtype=np.uint8) for h, w in ((90, 120), (130, 70), (100, 100))]
        encoded = []
        for a in arrays:
            buffer = io.BytesIO()
            Image.fromarray(a[..., 0] if channels == 1 else a).save(buffer, "PNG")  # as TFDS stores them
            encoded.append(buffer.getvalue())
        labels = np.arange(3)
        plain, packed = (numpy_data.Records(_Source(images, labels), (None, None, channels))
                         for images in (arrays, encoded))
        for read in (lambda r: numpy_data.train_batches(r, None, 3, 3, epoch=1, seed=2, prep="imagenet")[0],
                     lambda r: numpy_data.eval_batches(r, None, 3, 3, prep="imagenet")[0]):
            for a, b in zip(read(plain), read(packed)):
                np.testing.assert_array_equal(a, b)
        images, _ = packed.take([1], pil=True)
        assert isinstance(images[0], Image.Image) and images[0].size == (70, 130)


def test_the_preprocessing_is_resolved_once_per_feed_not_per_batch(monkeypatch):
    """Issue 88.5: a folder's inline statistics name ('mean_std(m/s)') was parsed again for every batch (three
    times a training batch); a feed resolves it once and its batches use that entry."""
    made = []
    entry = preprocessing._mean_std_entry
    monkeypatch.setattr(preprocessing, "_mean_std_entry", lambda *a: made.append(a) or entry(*a))
    name = preprocessing.stats_name((120.0, 110.0, 100.0), (60.0, 55.0, 50.0))
    images = np.random.default_rng(0).integers(0, 256, (12, 8, 8, 3), dtype=np.uint8)
    train = numpy_data.train_batches(images, np.arange(12) % 3, 3, 4, epoch=0, prep=name)
    x = [train[i][0] for i in range(3)]
    evaluation = numpy_data.eval_batches(images, np.arange(12) % 3, 3, 4, prep=name)
    x += [evaluation[i][0] for i in range(3)]
    assert len(made) == 2  # once for each feed
    want = (images[:4].astype(np.float32) - np.float32([120, 110, 100])) / np.float32([60, 55, 50])
    np.testing.assert_allclose(x[3], want, rtol=1e-5)
