"""keras_skipinit: deep residual networks with or without normalization.

SkipInit (De & Smith 2020), Fixup (Zhang et al. 2019) and Ghost Batch Norm
for Keras 3 on TensorFlow.
"""

# training and schedules register the optimizer and schedule saved in .keras files.
from keras_skipinit import applications, layers, normalization, schedules, training
from keras_skipinit.layers import FixupBias, GhostBatchNormalization, SkipInitScale

__version__ = "0.1.0"
__all__ = ["applications", "layers", "normalization", "schedules", "training", "FixupBias", "GhostBatchNormalization", "SkipInitScale"]
