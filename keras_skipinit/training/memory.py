"""Will one training step fit in memory? A CPU run whose activations alone
exceed the memory available is refused before it starts (the kernel's OOM
killer would end it, maybe others too)."""

import math

import keras

from keras_skipinit import machine
from keras_skipinit.training import distribute


def activation_bytes(model, batch):
    """A lower bound on a training step's activation memory: every layer's
    output, kept for the backward pass, at the compute dtype (a looped stage
    counts one output per block)."""
    itemsize = 2 if keras.config.dtype_policy().compute_dtype in ("bfloat16", "float16") else 4
    total = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        outputs = layer.output if isinstance(layer.output, (list, tuple)) else [layer.output]
        blocks = len(getattr(layer, "prefixes", ())) or 1  # looped.RepeatedBlocks
        total += blocks * sum(math.prod(o.shape[1:]) for o in outputs)
    return total * batch * itemsize


def check_memory(model, per_replica_batch, ignore=False):
    """Refuses (ValueError) a CPU run whose step's activations alone exceed
    the memory available, unless `ignore` (--ignore_memory_check): then a
    warning. Returns the warning, or None."""
    if distribute.current().on_gpu():
        return None
    why = machine.memory_shortfall(activation_bytes(model, per_replica_batch), per_replica_batch)
    if why is None:
        return None
    if not ignore:
        raise ValueError(f"{why}; --ignore_memory_check runs it anyway")
    return f"Warning: {why}: it will likely be killed."
