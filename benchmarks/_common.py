"""Shared helpers: interleaved timing, machine description, result output."""

import json
import os
import platform
import statistics
import time

from keras_skipinit.cli import startup

startup.quiet_start()  # before Keras loads TensorFlow: none of its C++ start-up lines

import keras  # noqa: E402  (KERAS_BACKEND picks tensorflow, jax or torch)

from keras_skipinit.machine import cpu_has_native_bfloat16, cpu_name  # noqa: E402

BACKEND = keras.backend.backend()
if BACKEND == "tensorflow":  # the benchmarks build many models on purpose: no tf.function retracing warnings
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")


def accelerators():
    """The GPUs the current backend sees (names)."""
    if BACKEND == "jax":
        import jax

        return [str(d) for d in jax.devices() if d.platform == "gpu"]
    if BACKEND == "torch":
        import torch

        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    import tensorflow as tf

    return [d.name for d in tf.config.list_physical_devices("GPU")]


def machine():
    info = {"cpu": cpu_name(), "cores": os.cpu_count(), "cpu_bfloat16": cpu_has_native_bfloat16(),
            "gpus": accelerators(), "backend": BACKEND, "keras": keras.__version__,
            "python": platform.python_version()}
    if BACKEND == "jax":
        import jax

        info["jax"] = jax.__version__
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        info["tensorflow"] = tf.__version__
    return info


def device():
    return "gpu" if accelerators() else "cpu"


def interleaved(fns, rounds, steps):
    """Times each callable `steps` times per round, alternating between them
    every round (noise hits all alike); returns the median seconds per call."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(steps):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def write(name, payload):
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    suffix = "" if BACKEND == "tensorflow" else f"_{BACKEND}"  # TensorFlow keeps the earlier file names
    path = os.path.join(os.path.dirname(__file__), "results", f"{name}{suffix}.json")
    with open(path, "w") as f:
        json.dump({"machine": machine(), **payload}, f, indent=2)
    return path


def table(header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows])
