"""keras_skipinit: deep residual networks with or without normalization.

SkipInit (De & Smith 2020), Fixup (Zhang et al. 2019) and Ghost Batch Norm
for Keras 3 on TensorFlow.
"""

from keras_skipinit import applications, layers, normalization
from keras_skipinit.layers import FixupBias, GhostBatchNormalization, SkipInitScale

__version__ = "0.1.0"
__all__ = ["applications", "layers", "normalization", "FixupBias", "GhostBatchNormalization", "SkipInitScale"]
