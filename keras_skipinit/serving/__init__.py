"""Serving: a trained model as files others run.

- `savedmodel`: TF Serving's SavedModel (signatures, warm-up requests, versions)
- `deploy`: LiteRT and ONNX files, float or int8, checked against the model
- `inference`: the model for inference (BatchNorm and scalar layers folded)
- `runtimes`: the LiteRT and ONNX runtimes that answer from those files
- `publish`: files moved into place whole, with their class labels

`keras_skipinit.serving.export` etc. are `savedmodel`'s names.
"""

from keras_skipinit import _lazy

__getattr__, __dir__ = _lazy.lend(__name__, "savedmodel")
