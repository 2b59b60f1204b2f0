"""Test set-up: quiet TF logs and two logical CPU devices for tf.distribute tests.

The logical devices must be configured before TensorFlow initializes its
runtime, so this runs at import time of the test session.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)


@pytest.fixture(autouse=True)
def _clean_keras_state():
    keras.backend.clear_session()
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
