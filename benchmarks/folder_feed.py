"""The folder feed (`--dataset=PATH`) against TFDS's tf.data route, on the
same images: the issue's "folder feed >= 0.8x TFDS's tf.data route".

The first --images Fashion-MNIST training images (Debian's
dataset-fashion-mnist) are written as PNG files into a temporary
`train/<class>/` folder (and 100 of its test images under `test/`); TFDS's
fashion_mnist is prepared offline from the same files. Each route's training
feed alone (`pipelines.train_pipeline`: shuffled, augmented, one-hot batches
of --batch, no model), interleaved round by round: img/s and the ratio; the
folder both in memory and streamed (decoded per batch, as a folder larger
than half the memory is read). The in-memory folder's one-time decode
(`image_folder.read`) is timed apart: a run pays it once, before its first
epoch.

    python benchmarks/folder_feed.py                  # ~3 min on 2 cores

TensorFlow (the comparison is with tf.data); run it alone.
"""

import argparse
import os
import tempfile
import time

import _common  # noqa: F401  (quiet start, before Keras)

from keras_skipinit.data import image_folder, numpy_data, pipelines, sources as data_lib, tfds_prepare  # noqa: E402


def write_folder(root, images, labels, test_images, test_labels):
    from PIL import Image

    for split, (x, y) in (("train", (images, labels)), ("test", (test_images, test_labels))):
        for i, (image, label) in enumerate(zip(x, y)):
            folder = os.path.join(root, split, f"class{int(label)}")
            os.makedirs(folder, exist_ok=True)
            Image.fromarray(image[..., 0]).save(os.path.join(folder, f"{i}.png"))


def feed_rate(dataset, batch, steps):
    """Seconds per batch of the training feed, over `steps` batches after one."""
    batches = iter(pipelines.train_pipeline(dataset, batch, epoch=0, seed=0, num_batches=steps + 1))
    next(batches)
    start = time.perf_counter()
    for _ in range(steps):
        next(batches)
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=9600)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data_dir", default=None, help="TFDS data dir (default: a temporary one)")
    args = parser.parse_args()

    manual = tfds_prepare.LOCAL_COPIES["fashion_mnist"].directory
    x, y = numpy_data.idx_images(manual, "train")
    xt, yt = numpy_data.idx_images(manual, "t10k")
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "images")
        write_folder(folder, x[: args.images], y[: args.images], xt[:100], yt[:100])
        start = time.perf_counter()
        image_folder.read(folder)
        decode_s = time.perf_counter() - start
        routes = {"folder": data_lib.load(folder),
                  "tfds": data_lib.load("fashion_mnist", data_dir=args.data_dir or os.path.join(tmp, "tfds"),
                                        train_examples=args.images)}
        fits, image_folder._fits_in_memory = image_folder._fits_in_memory, lambda need: False
        routes["folder, streamed"] = data_lib.load(folder)  # as a folder larger than half the memory is read
        image_folder._fits_in_memory = fits
        seconds = {name: [] for name in routes}
        for _ in range(args.rounds):
            for name, dataset in routes.items():
                seconds[name].append(feed_rate(dataset, args.batch, args.steps))
    median = {name: sorted(s)[len(s) // 2] for name, s in seconds.items()}
    rates = {name: args.batch / s for name, s in median.items()}
    rows = [(name, f"{rate:,.0f}", f"{rate / rates['tfds']:.2f}x") for name, rate in rates.items()]
    ratios = {name: rate / rates["tfds"] for name, rate in rates.items()}
    print(_common.table(("feed (TensorFlow, no model)", "img/s", "vs tfds"), rows))
    print(f"folder's one-time decode of {args.images + 100} PNG files into memory: {decode_s:.1f} s "
          f"({(args.images + 100) / decode_s:,.0f} img/s)")
    path = _common.write("folder_feed", {"args": vars(args), "img_per_s": rates, "vs_tfds": ratios,
                                         "decode_s": decode_s})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
