"""Image preprocessing: one table, each entry in every form it is needed in.

| name        | training augmentation                         | evaluation                               |
|-------------|-----------------------------------------------|------------------------------------------|
| standardize | per-image standardization, pad 4 + random     | per-image standardization of the image   |
|             | crop, flip where allowed (SkipInit §2.3)      | as it is                                 |
| imagenet    | random-resized crop to 224 + flip, per-channel| shorter side to 256, center crop 224,    |
|             | ImageNet mean/std                             | per-channel ImageNet mean/std            |
| imagenet_tf | as imagenet, then x / 127.5 - 1               | as imagenet, then x / 127.5 - 1          |
| imagenet_   | as imagenet, then BGR, ImageNet's means       | as imagenet, then BGR, ImageNet's means  |
| caffe       | subtracted (keras.applications' V1 weights)   | subtracted                               |
| <dataset>_  | per-channel mean/std of the dataset's training| per-channel mean/std of the image as it  |
| mean_std    | split (`CHANNEL_STATS`), pad 4 + random crop, | is (the papers' CIFAR normalization;     |
|             | flip where allowed                            | `--preprocessing=mean_std`)              |

A `Preprocessing` holds the TensorFlow forms (training's augmentation, and
evaluation as `resize` then `normalize`, used by tf.data and by the
SavedModel's decode path), the whole-batch form in built-in ops that the
SavedModel/LiteRT/ONNX graphs carry (`batch`), and a NumPy form of
`normalize` (analysis, on any Keras backend). `for_images` says which one a
dataset's images need. TensorFlow is imported only by the TensorFlow forms.
"""

import dataclasses
import functools
import re

import numpy as np

IMAGENET_SIZE = 224
IMAGENET_RESIZE = 256
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
CIFAR_PAD = 4
CIFAR_MAX_SIZE = 64  # larger images are ImageNet-style
STANDARDIZE, IMAGENET, MEAN_STD = "standardize", "imagenet", "mean_std"
IMAGENET_TF, IMAGENET_CAFFE = "imagenet_tf", "imagenet_caffe"  # keras.applications' preprocess_input modes
CAFFE_MEAN_BGR = (103.939, 116.779, 123.68)  # keras.applications' 'caffe' mode: blue, green, red
# Per-channel mean and std of the pixels (0-255) of a dataset's whole training split: the statistics of its
# '<dataset>_mean_std' entry (the papers' CIFAR normalization). A dataset gets the
# choice by a line here (tests recompute each from the data where it is at hand).
CHANNEL_STATS = {
    "fashion_mnist": ((72.94,), (90.02,)),  # 60,000 images
    "fashion_mnist_rgb32": ((55.84,) * 3, (84.61,) * 3),  # the same, zero-padded to 32x32, gray repeated
    "mnist_embedded": ((33.42,), (78.61,)),  # its 4,000 training digits
}


def _standardize_train(image, key, flip):
    """Per-image standardization, pad-and-random-crop, optional flip (§2.3)."""
    import tensorflow as tf

    return _pad_crop_flip(tf.image.per_image_standardization(image), key, flip)


def _pad_crop_flip(image, key, flip):
    """Pad 4 with zeros (the mean of a normalized image), crop back at a
    random offset, optional left-right flip (SkipInit §2.3's augmentation)."""
    import tensorflow as tf

    height, width, channels = image.shape
    padded = tf.pad(image, [[CIFAR_PAD, CIFAR_PAD], [CIFAR_PAD, CIFAR_PAD], [0, 0]])
    crop_key, flip_key = tf.unstack(tf.random.experimental.stateless_split(key, 2))
    image = tf.image.stateless_random_crop(padded, [height, width, channels], seed=crop_key)
    if flip:
        image = tf.image.stateless_random_flip_left_right(image, seed=flip_key)
    return image


def _standardize(images):
    import tensorflow as tf

    return tf.image.per_image_standardization(images)


def _standardize_batch(images):
    """Per-image standardization of a uint8 batch in built-in ops:
    (x - mean) / max(std, 1/sqrt(N)), N = H*W*C, tf.image's formula."""
    import tensorflow as tf

    x = tf.cast(images, tf.float32)
    count = float(np.prod(images.shape[1:]))
    mean = tf.reduce_mean(x, axis=[1, 2, 3], keepdims=True)
    std = tf.sqrt(tf.reduce_mean(tf.square(x - mean), axis=[1, 2, 3], keepdims=True))
    return (x - mean) / tf.maximum(std, 1.0 / np.sqrt(count))


def _standardize_numpy(images):
    x = np.asarray(images, np.float64)
    axes = tuple(range(1, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    std = np.maximum(x.std(axis=axes, keepdims=True), 1.0 / np.sqrt(np.prod(x.shape[1:])))
    return ((x - mean) / std).astype("float32")


def _imagenet_train(image, key, flip, normalize):
    """Random-resized crop (area 8-100%, aspect 3/4-4/3) to 224 and flip,
    then the entry's `normalize`."""
    import tensorflow as tf

    crop_key, flip_key = tf.unstack(tf.random.experimental.stateless_split(key, 2))
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=crop_key,
        min_object_covered=0.0,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    channels = image.shape[-1]
    image = tf.slice(image, begin, size)  # of a dynamic size: the channel count is lost, and `normalize`
    image.set_shape([None, None, channels])  # then broadcast a gray image to 3 channels (issue 91.13)
    image = tf.image.resize(image, [IMAGENET_SIZE, IMAGENET_SIZE])
    if flip:
        image = tf.image.stateless_random_flip_left_right(image, seed=flip_key)
    return normalize(image)


def _mean_std_train(image, key, flip, mean, std):
    """Per-channel normalization by the dataset's statistics, then pad 4 +
    random crop and flip where allowed (as 'standardize' does after its own)."""
    return _pad_crop_flip(_channels(image, mean, std), key, flip)


def _imagenet_resize(image):
    """Resize the shorter side to 256, center-crop 224 (float pixels)."""
    import tensorflow as tf

    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = IMAGENET_RESIZE / tf.reduce_min(shape)
    image = tf.image.resize(image, tf.cast(tf.round(shape * scale), tf.int32))
    return tf.image.resize_with_crop_or_pad(image, IMAGENET_SIZE, IMAGENET_SIZE)


def _channels(images, mean, std):
    """(x - mean) / std per channel, of an image or a batch (channels last)."""
    import tensorflow as tf

    channels = images.shape[-1]
    return (tf.cast(images, tf.float32) - mean[:channels]) / std[:channels]


def _channels_numpy(images, mean, std):
    """`_channels` in NumPy, in float32 as it computes it. The statistics are
    tiled along a row (W x C values): broadcast over a last axis of 3, NumPy's
    loops run ~4x slower."""
    x = np.array(images, np.float32)  # a copy: the caller's array is not changed
    channels, row = x.shape[-1], x.shape[-2] * x.shape[-1]
    out = x.reshape(-1, row)
    out -= np.tile(np.float32(mean[:channels]), row // channels)
    out /= np.tile(np.float32(std[:channels]), row // channels)
    return out.reshape(x.shape)


def resize_bilinear(image, height, width):
    """`tf.image.resize`'s bilinear resize (half-pixel centers, no
    antialiasing) of one HxWxC image in NumPy, float32. The four corner
    pixels are gathered before the cast (a uint8 crop is not copied whole)."""
    x = np.asarray(image)

    def taps(out, size):
        where = (np.arange(out, dtype=np.float32) + 0.5) * np.float32(size / out) - 0.5
        low = np.floor(where)
        return (np.clip(low, 0, size - 1).astype(int), np.clip(low + 1, 0, size - 1).astype(int),
                (where - low).astype(np.float32))

    (top, bottom, dy), (left, right, dx) = taps(height, x.shape[0]), taps(width, x.shape[1])
    dx = dx[None, :, None]
    above, below = x[top], x[bottom]
    top_left, top_right, bottom_left, bottom_right = (
        rows[:, cols].astype(np.float32) for rows in (above, below) for cols in (left, right))
    upper = top_left + (top_right - top_left) * dx  # TF's order: along each row first, then between the rows
    lower = bottom_left + (bottom_right - bottom_left) * dx
    return upper + (lower - upper) * dy[:, None, None]


def _imagenet_resize_numpy(image):
    """`_imagenet_resize` in NumPy: shorter side to 256 (TF's float32
    arithmetic and round-half-to-even), center crop 224."""
    shape = np.array(image.shape[:2], np.float32)
    height, width = np.round(shape * (np.float32(IMAGENET_RESIZE) / shape.min())).astype(int)
    resized = resize_bilinear(image, height, width)
    top, left = (height - IMAGENET_SIZE) // 2, (width - IMAGENET_SIZE) // 2
    return resized[top : top + IMAGENET_SIZE, left : left + IMAGENET_SIZE]


def _bgr_channels(images, mean, std):
    """`_channels` of the channels reversed (RGB to BGR, caffe's order)."""
    import tensorflow as tf

    return _channels(tf.reverse(tf.cast(images, tf.float32), [-1]), mean, std)


def _bgr_channels_numpy(images, mean, std):
    return _channels_numpy(np.asarray(images)[..., ::-1], mean, std)


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """One preprocessing in its forms (see the module docstring).

    - train(image, key, flip): training's augmentation of one uint8 image
      (stateless randomness keyed on `key`), in TensorFlow.
    - resize(image): one image to the model's size; None: images must come
      at the model's size (`input_size` None).
    - normalize(images): pixels of model-sized images (one or a batch).
    - batch(images): `normalize` of a uint8 batch in built-in ops only.
    - numpy(images): `normalize` of a batch in NumPy.
    - numpy_resize(image): `resize` in NumPy (None where `resize` is).
    """

    name: str
    train: object
    resize: object
    normalize: object
    batch: object
    numpy: object
    input_size: int | None  # the model's input size it makes; None: the images' own
    numpy_resize: object = None

    def eval(self, image):
        """Evaluation preprocessing of one uint8 image, as in tf.data."""
        return self.normalize(image if self.resize is None else self.resize(image))

    def numpy_eval(self, images):
        """`eval` of a batch (an array, or a list of images of any size where
        the preprocessing resizes them) in NumPy."""
        if self.numpy_resize is not None:
            images = np.stack([self.numpy_resize(image) for image in images])
        return self.numpy(images)

    def input_shape(self, image_shape):
        """The model's input shape for images of `image_shape` (H, W, C)."""
        if self.input_size is None:
            return tuple(image_shape)
        return (self.input_size, self.input_size, image_shape[-1])


def _mean_std_entry(name, mean, std):
    normalize = functools.partial(_channels, mean=mean, std=std)
    return Preprocessing(name, functools.partial(_mean_std_train, mean=mean, std=std), None, normalize, normalize,
                         functools.partial(_channels_numpy, mean=mean, std=std), None)


def _imagenet_entry(name, mean, std, bgr=False):
    """ImageNet-style (random-resized crop / resize-256 and centre 224), then
    (x - mean) / std per channel, of the channels reversed where `bgr`."""
    normalize = functools.partial(_bgr_channels if bgr else _channels, mean=mean, std=std)
    numpy = functools.partial(_bgr_channels_numpy if bgr else _channels_numpy, mean=mean, std=std)
    return Preprocessing(name, functools.partial(_imagenet_train, normalize=normalize), _imagenet_resize, normalize,
                         normalize, numpy, IMAGENET_SIZE, _imagenet_resize_numpy)


PREPROCESSINGS = {
    STANDARDIZE: Preprocessing(STANDARDIZE, _standardize_train, None, _standardize, _standardize_batch,
                                 _standardize_numpy, None),
    IMAGENET: _imagenet_entry(IMAGENET, IMAGENET_MEAN, IMAGENET_STD),
    # keras.applications' ImageNet weights' own input scaling (its preprocess_input modes), for
    # `weights="imagenet"`: 'tf' (ResNet-V2: [-1, 1]) and 'caffe' (ResNet-V1: BGR, ImageNet's means subtracted).
    IMAGENET_TF: _imagenet_entry(IMAGENET_TF, (127.5,) * 3, (127.5,) * 3),
    IMAGENET_CAFFE: _imagenet_entry(IMAGENET_CAFFE, CAFFE_MEAN_BGR, (1.0,) * 3, bgr=True),
}
for _dataset, (_mean, _std) in CHANNEL_STATS.items():
    PREPROCESSINGS[f"{_dataset}_{MEAN_STD}"] = _mean_std_entry(f"{_dataset}_{MEAN_STD}", _mean, _std)
NAMES = tuple(PREPROCESSINGS)
CHOICES = (STANDARDIZE, MEAN_STD)  # what a run of images up to 64 px may choose (`choose`)
KERAS_WEIGHTS = (IMAGENET_TF, IMAGENET_CAFFE)  # what --init_from=imagenet chooses (`spec.Architecture.keras_preprocessing`)
# A dataset without a CHANNEL_STATS line (a folder of your own images) carries its statistics in the name:
# 'mean_std(m1,m2,m3/s1,s2,s3)', so the run's record and every export made from it hold them.
_INLINE = re.compile(r"mean_std\((?P<mean>[^/()]+)/(?P<std>[^/()]+)\)")


def stats_name(mean, std):
    """The preprocessing name of per-channel `mean` and `std` (0-255 pixels)."""
    return f"{MEAN_STD}({','.join(f'{m:.4f}' for m in mean)}/{','.join(f'{s:.4f}' for s in std)})"


def channel_stats(chunks):
    """Per-channel mean and std of uint8 images [N, H, W, C] given in
    `chunks` (arrays), as the papers' CIFAR normalization takes them from the
    training split."""
    total, mean, square = 0, 0.0, 0.0
    for images in chunks:
        pixels = np.asarray(images).reshape(-1, np.shape(images)[-1])
        for start in range(0, len(pixels), 1 << 22):  # float64 in slices: no copy of the whole split
            chunk = pixels[start : start + (1 << 22)].astype(np.float64)
            total, mean, square = total + len(chunk), mean + chunk.sum(0), square + (chunk**2).sum(0)
    mean = mean / total
    return tuple(map(float, mean)), tuple(map(float, np.sqrt(np.maximum(square / total - mean**2, 0.0))))


def get(name):
    """The `Preprocessing` called `name` (a `PREPROCESSINGS` entry, or a
    `stats_name`), or a ValueError naming the choices; a `Preprocessing`
    is itself (resolved once, passed on)."""
    if isinstance(name, Preprocessing):
        return name
    if name in PREPROCESSINGS:
        return PREPROCESSINGS[name]
    match = _INLINE.fullmatch(name) if isinstance(name, str) else None
    if match:
        try:
            mean, std = (tuple(float(v) for v in match[k].split(",")) for k in ("mean", "std"))
        except ValueError:
            mean = std = ()
        if mean and len(mean) == len(std) and all(s > 0 for s in std):
            return _mean_std_entry(name, mean, std)
    raise ValueError(f"preprocessing must be one of {NAMES} or mean_std(<means>/<stds>), got {name!r}.")


def for_images(image_shape):
    """The name of the preprocessing that images of `image_shape` (H, W, C;
    None where sizes vary) need: CIFAR-style up to 64 px, ImageNet-style above."""
    fixed = None not in image_shape[:2] and max(image_shape[:2]) <= CIFAR_MAX_SIZE
    return STANDARDIZE if fixed else IMAGENET


def choose(choice, dataset, image_shape, stats=None):
    """The entry a run on `dataset` uses: its images' own (`for_images`)
    where `choice` is None, else 'standardize' or 'mean_std' (the dataset's
    `CHANNEL_STATS`, else `stats()`, (mean, std) of its training images, as
    a `stats_name`: called only when the choice stands, since it reads the
    whole split) for images up to 64 px, or keras.applications' input
    scaling (`KERAS_WEIGHTS`) for ImageNet-style images; one line for anything else."""
    if choice is not None and choice not in CHOICES + KERAS_WEIGHTS:
        raise ValueError(f"preprocessing must be one of {CHOICES} (or unset: the dataset's own), got {choice!r}.")
    own = for_images(image_shape)
    if choice is None:
        return own
    if choice in KERAS_WEIGHTS:  # --init_from=imagenet's: the weights' own input scaling
        if own != IMAGENET:
            raise ValueError(f"--init_from=imagenet: keras.applications' ImageNet weights take ImageNet-style images "
                             f"(over {CIFAR_MAX_SIZE} px, resized and cropped to {IMAGENET_SIZE}); {dataset} has "
                             f"{'x'.join(map(str, image_shape))} images (a folder's --image_size={IMAGENET_SIZE} "
                             "makes them so).")
        return choice
    if own != STANDARDIZE:
        raise ValueError(f"--preprocessing={choice} is for images up to {CIFAR_MAX_SIZE} px; {dataset} has "
                         f"{'x'.join(map(str, image_shape))} images, which take {own}.")
    if choice == MEAN_STD and dataset not in CHANNEL_STATS:
        if stats is not None:
            mean, std = stats()
            flat = [c for c, s in enumerate(std) if round(s, 4) <= 0]  # the name holds 4 decimals
            if flat:  # it was refused as "preprocessing must be one of ..." (issue 91.22)
                raise ValueError(f"--preprocessing={MEAN_STD}: channel {flat[0]} of {dataset}'s training images is "
                                 f"constant (mean {mean[flat[0]]:.4g}, std {std[flat[0]]:.2g}): per-channel "
                                 f"statistics cannot scale it; use --preprocessing={STANDARDIZE}")
            return stats_name(mean, std)
        raise ValueError(f"--preprocessing={MEAN_STD}: no channel statistics for {dataset!r} "
                         f"(preprocessing.CHANNEL_STATS has {', '.join(CHANNEL_STATS)}; add its line there).")
    return f"{dataset}_{MEAN_STD}" if choice == MEAN_STD else choice
