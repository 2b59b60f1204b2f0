"""ImageNet-style training images/s of the input feeds alone (no model).

JAX without TensorFlow reads an ImageNet-style TFDS dataset prepared as
array_record batch by batch (`numpy_data.Records`: PIL decodes, crops and
resizes, NumPy normalizes); where TensorFlow is installed, tf.data's pipeline
(`pipelines.train_pipeline`) reads it instead. This measures both on the same
synthetic photographs (smooth random fields plus noise, JPEG, 500x375 and
375x500, ImageNet's commonest sizes): random-resized crop to 224, flip,
per-channel normalization, batch 64, one pass per round; the NumPy feed
read in order (one thread) and as `fit` reads it (its reader threads), rounds
interleaved, the median per feed. The same photos as JPEG files in a folder
(`--dataset=PATH`, streamed: decoded per batch), fed both ways, are compared
with each other.

    python benchmarks/records_feed.py --images=512 --rounds=3     # ~3 min on 2 cores

Needs TensorFlow (it prepares the data and is the comparison) and `.[tfds]`.
"""

import argparse
import logging
import os
import statistics
import tempfile
import time

import _common
import numpy as np

from keras_skipinit.data import image_folder, numpy_data, pipelines, sources, tfds_prepare

BATCH = 64


def _photos(count, seed=0):
    """Smooth random fields (a 12x16 grid upsampled) plus pixel noise, uint8."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    for i in range(count):
        shape = (375, 500) if i % 2 else (500, 375)
        coarse = rng.uniform(0, 255, (1, 12, 16, 3) if i % 2 else (1, 16, 12, 3)).astype(np.float32)
        smooth = tf.image.resize(coarse, shape, method="bicubic")[0].numpy()
        yield np.clip(smooth + rng.normal(0, 8, smooth.shape), 0, 255).astype(np.uint8), int(rng.integers(10))


def _builder(count):
    import tensorflow_datasets as tfds

    class Photos(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, supervised_keys=("image", "label"), features=tfds.features.FeaturesDict(
                {"image": tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg"),
                 "label": tfds.features.ClassLabel(num_classes=10)}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i, (image, label) in enumerate(_photos(count)):
                yield i, {"image": image, "label": label}

    Photos.name = "photo_sample"
    return Photos


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    logging.getLogger("absl").addFilter(tfds_prepare._not_a_note)
    folder = tempfile.mkdtemp(prefix="records_feed_")
    photos = _builder(args.images)
    photos(data_dir=f"{folder}/array_record", file_format="array_record").download_and_prepare()
    photos(data_dir=f"{folder}/tfrecord").download_and_prepare()
    import tensorflow_datasets as tfds

    source = photos(data_dir=f"{folder}/array_record").as_data_source(  # as sources.load reads it: images encoded
        split="train", decoders={"image": tfds.decode.SkipDecoding()})
    records = numpy_data.Records(source, (None, None, 3))
    tf_split = photos(data_dir=f"{folder}/tfrecord").as_dataset(split="train", as_supervised=True)
    dataset = sources.Dataset("photo_sample", tf_split, None, args.images, 0, 10, (None, None, 3), "imagenet", flip=True)

    def numpy_feed(epoch):
        return numpy_data.train_batches(records, None, 10, BATCH, epoch, flip=True, prep="imagenet")

    def in_order(epoch):
        batches = numpy_feed(epoch)
        for i in range(len(batches)):
            batches[i]

    def as_fit_reads(epoch):
        for _ in PyDatasetAdapter(numpy_feed(epoch), shuffle=False).get_numpy_iterator():
            pass

    def tf_data(epoch):
        for _ in pipelines.train_pipeline(dataset, BATCH, epoch).as_numpy_iterator():
            pass

    # The same photos as JPEG files in a folder (--dataset=PATH), streamed (decoded per batch, as a folder larger
    # than half the memory is): the NumPy feed as fit reads it against tf.data's parallel map of the same files.
    from PIL import Image

    for i, (image, label) in enumerate(_photos(args.images)):
        os.makedirs(f"{folder}/images/train/{label}", exist_ok=True)
        Image.fromarray(image).save(f"{folder}/images/train/{label}/{i}.jpg", quality=90)
    for label in range(10):  # every class in test/ too
        os.makedirs(f"{folder}/images/test/{label}", exist_ok=True)
        Image.fromarray(image).save(f"{folder}/images/test/{label}/0.jpg")
    image_folder._fits_in_memory = lambda need: False
    streamed = sources.load(f"{folder}/images", folder=dict(image_size=224))

    def folder_numpy(epoch):
        for _ in PyDatasetAdapter(numpy_data.train_batches(streamed.train, None, streamed.num_classes, BATCH, epoch,
                                                           flip=True, prep=streamed.preprocessing),
                                  shuffle=False).get_numpy_iterator():
            pass

    def folder_tf_data(epoch):
        for _ in pipelines.train_pipeline(streamed, BATCH, epoch).as_numpy_iterator():
            pass

    feeds = {"NumPy (Records), in order": in_order,
             f"NumPy (Records), as fit reads it ({numpy_data._workers(None)} threads)": as_fit_reads,
             "tf.data (pipelines.train_pipeline)": tf_data,
             "folder, NumPy as fit reads it": folder_numpy,
             "folder, tf.data": folder_tf_data}
    seconds = {name: [] for name in feeds}
    for r in range(args.rounds):
        for name, feed in feeds.items():
            start = time.perf_counter()
            feed(r)
            seconds[name].append(time.perf_counter() - start)
            print(f"round {r + 1} {name}: {args.images // BATCH * BATCH / seconds[name][-1]:.0f} img/s", flush=True)
    rates = {name: args.images // BATCH * BATCH / statistics.median(seconds[name]) for name in feeds}
    print(f"\n| feed ({args.images} JPEG photos, 224 crops, batch {BATCH}) | img/s | vs tf.data |\n|---|---|---|")
    results = []
    for name, rate in rates.items():
        base = rates["folder, tf.data" if name.startswith("folder") else "tf.data (pipelines.train_pipeline)"]
        results.append({"feed": name, "img_per_s": rate, "rounds_s": seconds[name]})
        print(f"| {name} | {rate:.0f} | {rate / base:.2f}x |")
    print("\nwrote", _common.write("records_feed_" + _common.device(), {"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
