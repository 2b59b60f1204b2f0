"""A folder of your own images as a dataset: `--dataset=PATH`.

The layout timm, TFDS's `ImageFolder` and torchvision's `ImageFolder` share:
``PATH/<split>/<class>/<image>`` (images in a class's subfolders count as
that class), with a ``train`` split and a ``test`` split
(else ``validation`` or ``val``, evaluated instead). Without an evaluated
split (``PATH/train`` alone, or class folders directly in PATH, as Keras'
`image_dataset_from_directory` reads a folder) a run evaluates on held-out
training images (`held_out`: --validation_examples), else it is refused.
Class names are the class folders' names, sorted (label i is the i-th); every
split has the same classes. JPEG, PNG, BMP, GIF (its first frame) and WebP, in any mode and size:

- channels: `channels` (1 or 3), else the majority's: grayscale images
  (modes 1, L, LA, I;16) against colour ones (RGB, RGBA, P, CMYK, ...); a tie
  is colour. Alpha is dropped, palettes are expanded. 16-bit grayscale (a
  16-bit PNG or TIFF) is scaled to 8 bits (x * 255 / 65535, as TensorFlow's
  decode_png does), not clipped at 255 as PIL's convert would; 32-bit
  integer or float pixels (modes I, F: no fixed range) are refused.
- size: `image_size` (square), else the images' own size when they all share
  one, else `default_size` (the model's: 32 for the CIFAR-style nets, 224
  for the ResNets). Resized as evaluation does it: the shorter side to the
  size (bilinear), then the centre square. No image is too small to crop: a
  smaller one is scaled up (as timm, torchvision and Keras' loaders do).

The images are decoded by PIL (no TensorFlow: the same arrays on every
backend and feed): once, in threads, into memory (`data` then feeds them as
any in-memory dataset), or, where they would take more than half the memory
available, each time a batch needs them (`numpy_data.Records` over `Files`:
the NumPy feed's reader threads, or tf.data's parallel map on TensorFlow).
The train split's images are in one fixed shuffled order (`ORDER_SEED`),
so a held-out tail (--validation_examples) or a head (--train_examples)
holds every class, as a TFDS split's or Keras' seeded shuffle would.
Bad folders are one line (ValueError) before any training: a missing folder
or split, a class folder without images, an evaluated split whose classes
differ from train's (unless held out: the split goes unread), a file that
is not a readable image (`skip_bad`: skipped and counted instead; a
streamed folder's files are checked by their headers first, and a file
whose data is cut is named when a batch reads it).
Nothing is written into the folder.
"""

import concurrent.futures
import dataclasses
import os

import numpy as np

SPLITS = ("train", "test", "validation", "val")
LAYOUT = ("a folder of images: PATH/train/<class>/<image> and PATH/test/<class>/<image>, or PATH/<class>/<image> "
          "with --validation_examples")  # said where --dataset is no folder (here and in tfds_prepare)
# The train split's images come in one fixed shuffled order (the same for every run, as a TFDS split's is), so that
# --validation_examples (the last N) and --train_examples (the first N) span the classes, not the last or first ones.
ORDER_SEED = 0
_SIXTEEN_BIT = {"I;16", "I;16B", "I;16L", "I;16N"}
_NO_RANGE = {"I": "32-bit integer", "F": "32-bit float"}  # pixels with no fixed range to scale to 8 bits
_GRAY_MODES = {"1", "L", "LA", *_SIXTEEN_BIT}


def _mode(image):
    """An opened image's mode; a 16-bit grayscale PNG's as I;16 (Pillows before 11 open it as I)."""
    return "I;16" if image.mode == "I" and image.format == "PNG" else image.mode


@dataclasses.dataclass
class Folder:
    train: object  # (uint8 images (N, H, W, C), int64 labels (N,)), or a `numpy_data.Records` of `Files`
    test: object
    eval_split: str | None  # the split folder evaluated: "test", "validation", "val", or None (test is None)
    classes: tuple
    skipped: tuple = ()  # the files skipped as unreadable (skip_bad)


def looks_like_folder(name):
    """Whether --dataset names a folder, not a TFDS dataset: an existing
    directory, or a path (/, ./, ../, ~) that does not exist or an existing
    file (both refused by name in `layout`)."""
    return os.path.exists(os.path.expanduser(name)) or name.startswith(("/", "./", "../", "~"))


def missing_folder(path):
    """The line for a folder --dataset that does not exist (`layout`'s, and train.py's flags' before Keras loads)."""
    return f"--dataset={path}: no such folder ({LAYOUT})"


def _class_folders(split_folder):
    return sorted(entry.name for entry in os.scandir(split_folder) if not entry.name.startswith(".") and entry.is_dir())


def files_under(folder, suffixes=None):
    """The files in `folder` and its subfolders, in sorted order, names
    starting with "." left out (.DS_Store, .ipynb_checkpoints/); `suffixes`:
    only names ending so (any case). A class's images may sit in subfolders,
    as torchvision's ImageFolder and Keras' image_dataset_from_directory read them;
    a linked subfolder is followed, as torchvision does, once (a link loop ends)."""
    found, walked = [], set()
    for parent, subfolders, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(parent)
        if real in walked:  # reached again through a link: a loop, or the same images twice
            subfolders[:] = []
            continue
        walked.add(real)
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        found += [os.path.join(parent, n) for n in sorted(names) if not n.startswith(".")
                  and (suffixes is None or n.lower().endswith(suffixes))]
    for file in found:
        _check_regular(file)
    return found


def _check_regular(file):
    """One line for a name that is no regular file: a FIFO, socket or device
    (opening a FIFO waits for a writer: train.py hung, deaf to SIGTERM;
    issue 91.18) or a link to nothing."""
    import stat

    try:
        mode = os.stat(file).st_mode
    except OSError:
        raise ValueError(f"{file}: a link to nothing ({os.readlink(file) if os.path.islink(file) else 'gone'}): "
                         "remove it or point it at an image") from None
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise ValueError(f"{file}: {kind}, not an image file: move it out of the folder")


def _split_folders(root):
    return [s for s in SPLITS if os.path.isdir(os.path.join(root, s))]


def _evaluated(splits):
    return next((s for s in splits if s != "train"), None)


def evaluated_split(path):
    """The split folder a run on the folder `path` evaluates on ("test", else
    "validation", else "val"), or None; only the folder's names are read."""
    return _evaluated(_split_folders(os.path.expanduser(path)))


def layout(path, held_out=False):
    """{split: {class: [file paths]}} of the train and evaluated splits, the
    evaluated split's name (None: no split folder beside the training images,
    which `held_out` allows; also None with `held_out`: the run evaluates on
    training images, so a split folder goes unread and unchecked) and
    {split: its folder}; checked, nothing decoded."""
    root = os.path.expanduser(path)
    if not os.path.isdir(root):
        if os.path.exists(root):
            raise ValueError(f"--dataset={path} is a file, not a folder (unpack an archive first; {LAYOUT})")
        raise ValueError(missing_folder(path))
    splits = _split_folders(root)
    if splits and "train" not in splits:
        raise ValueError(f"--dataset={path} has no train/ folder: images go in {path}/train/<class>/<image> and "
                         f"{path}/test/<class>/<image>")
    evaluated = None if held_out else _evaluated(splits)
    where = {"train": os.path.join(path, "train") if splits else path}  # no split folders: PATH holds the classes
    if evaluated:
        where[evaluated] = os.path.join(path, evaluated)
    elif not held_out:
        raise ValueError(
            f"--dataset={path} has no test/ (or validation/, val/) folder beside train/: the images a run is evaluated "
            "on; or pass --validation_examples=N to hold out N of its training images" if splits else
            f"--dataset={path} has no train/ and test/ folders, so its folders are read as the classes of training "
            f"images: pass --validation_examples=N to evaluate on N of them held out, or put them in "
            f"{path}/train/<class>/<image> and {path}/test/<class>/<image>")
    found = {}
    for split, folder in where.items():
        classes = _class_folders(os.path.expanduser(folder))
        if not classes:
            raise ValueError(f"{folder} holds no class folders: images go in "
                             f"{os.path.join(folder, '<class>', '<image>')}")
        if split == "train" and len(classes) < 2:  # it "trained to 100%" (issue 89.2)
            raise ValueError(f"{folder} holds one class folder ({classes[0]}): a classifier needs two classes or more, "
                             f"each in its own folder, {os.path.join(folder, '<class>', '<image>')}")
        broken = [name for name in classes if "\n" in name or "\r" in name]
        if broken:  # a labels file holds one name a line (issue 91.20)
            raise ValueError(f"{os.path.join(folder, broken[0])!r}: a class name with a line break, which no labels "
                             "file (one name a line) can hold: rename the folder")
        found[split] = {}
        for name in classes:
            files = files_under(os.path.expanduser(os.path.join(folder, name)))
            if not files:
                raise ValueError(f"{os.path.join(folder, name)} holds no images")
            found[split][name] = files
    if evaluated and list(found[evaluated]) != list(found["train"]):
        missing = sorted(set(found["train"]) - set(found[evaluated]))
        extra = sorted(set(found[evaluated]) - set(found["train"]))
        raise ValueError(f"{where[evaluated]} and {where['train']} have different classes"
                         + (f"; missing from {evaluated}/: {', '.join(missing)}" if missing else "")
                         + (f"; not in train/: {', '.join(extra)}" if extra else ""))
    return found, evaluated, where


def _header(file):
    """(mode, (width, height)) of an image file without decoding it, or None
    where PIL cannot read it as an image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(file) as image:
            return _mode(image), image.size
    except (UnidentifiedImageError, OSError, ValueError):
        return None


def _bad(file, why, skip_bad):
    if not skip_bad:
        raise ValueError(f"{file}: {why} (pass --skip_bad_images to skip such files)")


def decode(file, mode, size, crop=None):
    """One image as a uint8 (H, W, C) array in `mode` ("L" or "RGB"), the
    shorter side resized to `size` and the centre `crop` square kept (crop
    None: `size`; size None: as it is); `size` and `crop` (height, width)
    pairs: resized to cover that rectangle, its centre kept (a model of
    non-square images); None where decoding fails (a truncated or corrupt
    file, or pixels of no fixed range: `_NO_RANGE`)."""
    from PIL import Image

    try:
        with Image.open(file) as image:
            image.seek(0)  # a GIF's first frame
            if size is not None:
                width, height = image.size
                cover_h, cover_w = _pair(size)
                scale = max(cover_w / width, cover_h / height)  # a square: size / the shorter side
                new = (max(cover_w, round(width * scale)), max(cover_h, round(height * scale)))
                image.draft(None, new)  # a JPEG decodes at 1/2, 1/4 or 1/8 scale where that is still >= new
            image.load()
            found = _mode(image)
            if found in _NO_RANGE:
                return None
            if found in _SIXTEEN_BIT:  # to 8 bits by scaling: PIL's convert clips at 255
                wide = np.asarray(image).astype(np.int64)
                image = Image.fromarray(((wide * 255 + 32767) // 65535).astype(np.uint8), "L")
            image = image.convert(mode)
    except (OSError, ValueError, SyntaxError):
        return None
    if size is not None:
        if new != image.size:
            image = image.resize(new, Image.BILINEAR)
        crop_h, crop_w = _pair(crop or size)
        left, top = (new[0] - crop_w) // 2, (new[1] - crop_h) // 2
        image = image.crop((left, top, left + crop_w, top + crop_h))
    array = np.asarray(image, np.uint8)
    return array[..., None] if array.ndim == 2 else array


def _pair(size):
    """(height, width) of a size `decode` takes: a square's side, or the pair itself."""
    return size if isinstance(size, tuple) else (size, size)


def decode_all(files, mode, size, crop=None, threads=None):
    """`decode` of each file, in their order, in threads (PIL releases the
    GIL while it decodes)."""
    return _in_threads(lambda file: decode(file, mode, size, crop), files, threads)


def _in_threads(function, items, threads=None):
    """[function(item) for item in items], in `threads` threads (default: the cores, at most 8)."""
    with concurrent.futures.ThreadPoolExecutor(threads or min(8, os.cpu_count() or 1)) as pool:
        return list(pool.map(function, items))


class Files:
    """A split's image files decoded when read (`numpy_data.Records`' source):
    `__getitems__(indices)` -> [{"image", "label"}]."""

    def __init__(self, files, labels, mode, size):
        self.files, self.labels, self.mode, self.size = files, labels, mode, size

    def __len__(self):
        return len(self.files)

    def __getitems__(self, indices):
        records = []
        for i in indices:
            array = decode(self.files[i], self.mode, self.size)
            if array is None:
                raise ValueError(f"{self.files[i]}: truncated or corrupt: PIL cannot decode it (read as a batch "
                                 "needed it: the folder is streamed, its files checked by their headers only)")
            records.append({"image": array, "label": self.labels[i]})
        return records


def read(path, image_size=None, channels=None, skip_bad=False, default_size=32, threads=None, held_out=False,
         stream=False):
    """The `Folder` at `path` (see the module docstring); its `test` is None
    where the run holds out its own evaluation images (`held_out`; then the
    folder may lack an evaluated split). `stream`: read per batch whatever
    the folder's size (train.py's --stream_images)."""
    if channels not in (None, 1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels!r}")
    if image_size is not None and image_size < 1:
        raise ValueError(f"image_size must be a positive integer, got {image_size!r}")
    found, evaluated, where = layout(path, held_out)  # held out: evaluated is None, its split not decoded
    read_splits = ("train", evaluated) if evaluated else ("train",)
    files = [(split, label, f) for split in read_splits
             for label, name in enumerate(found[split]) for f in found[split][name]]
    trained = sum(split == "train" for split, _, _ in files)  # the train split first, in class order: mix it
    files = [files[i] for i in np.random.default_rng(ORDER_SEED).permutation(trained)] + files[trained:]
    headers = _in_threads(_header, [f for _, _, f in files], threads)
    skipped = []
    kept = []
    for (split, label, file), header in zip(files, headers):
        if header is None or header[0] in _NO_RANGE:
            _bad(file, "not an image file (JPEG, PNG, BMP, GIF or WebP) that PIL can read" if header is None else
                 f"{_NO_RANGE[header[0]]} pixels (mode {header[0]}) have no fixed range to scale to 8 bits: save it "
                 "with 8 or 16 bits a channel", skip_bad)
            skipped.append(file)
        else:
            kept.append((split, label, file, header))
    _check_no_class_emptied(found, where, [(split, label) for split, label, _, _ in kept])
    gray = sum(mode in _GRAY_MODES for *_, (mode, _) in kept)
    channels = channels or (1 if gray > len(kept) - gray else 3)
    sizes = {size for *_, (_, size) in kept}
    shared = next(iter(sizes)) if len(sizes) == 1 else None
    size = image_size or (None if shared else default_size)
    height, width = (size, size) if size else (shared[1], shared[0])
    mode = "L" if channels == 1 else "RGB"
    if stream or not _fits_in_memory(len(kept) * height * width * channels):
        from keras_skipinit.data import numpy_data
        train, test = (numpy_data.Records(Files([f for s, _, f, _ in kept if s == split],
                                                [label for s, label, _, _ in kept if s == split], mode, size),
                                          (height, width, channels)) if split else None for split in ("train", evaluated))
        return Folder(train, test, evaluated, tuple(found["train"]), tuple(skipped))
    arrays = decode_all([f for _, _, f, _ in kept], mode, size, threads=threads)
    splits = {split: ([], []) for split in read_splits}
    for (split, label, file, _), array in zip(kept, arrays):
        if array is None:
            _bad(file, "truncated or corrupt: PIL cannot decode it", skip_bad)
            skipped.append(file)
            continue
        splits[split][0].append(array)
        splits[split][1].append(label)
    _check_no_class_emptied(found, where, [(split, label) for split in splits for label in splits[split][1]])
    train, test = ((np.stack(splits[split][0]), np.asarray(splits[split][1], np.int64)) if split else None
                   for split in ("train", evaluated))
    return Folder(train, test, evaluated, tuple(found["train"]), tuple(skipped))


def _check_no_class_emptied(found, where, kept):
    """One line where --skip_bad_images left a class of a split read without
    images (`kept`: (split, label) of each image kept): it trained with a
    class that had none (issue 91.7), as an empty class folder is refused."""
    have = set(kept)
    for split in where:
        for label, name in enumerate(found.get(split, ())):
            if (split, label) not in have:
                raise ValueError(f"{os.path.join(where[split], name)}: every image was skipped as unreadable "
                                 "(--skip_bad_images): a class without images; fix its files or remove the folder")


def _fits_in_memory(need):
    """Whether `need` bytes of decoded images take at most half the memory available."""
    from keras_skipinit import machine
    have = machine.available_memory_bytes()
    return have is None or need <= have // 2
