"""What the machine is, for run records and for choices that depend on it
(no TensorFlow or Keras here: benchmarks on any backend use it too)."""

import os
import platform


def cpu_name():
    """The CPU model as /proc/cpuinfo names it."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def cpu_count():
    """The cores this process may run on (its affinity where the OS says)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # macOS


def intra_op_threads():
    """The intra-op threads TensorFlow computes a run's ops with here:
    TF_NUM_INTRAOP_THREADS where set, else every core (TensorFlow's default).
    A run's numbers depend on it (a convolution's weight gradient and a
    matmul sum in per-thread blocks), so the sweep gives every run this many
    whatever its executor (issue 89.4)."""
    value = os.environ.get("TF_NUM_INTRAOP_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else cpu_count()


def cpu_has_native_bfloat16(cpuinfo="/proc/cpuinfo"):
    """Whether this CPU computes bfloat16 in hardware (x86 AVX512_BF16 or
    AMX; ARM's BF16 extension), from /proc/cpuinfo's flags; None if unknown.
    Without it bfloat16 is emulated, and far slower than float32
    (benchmarks/README.md, "Speed for long CPU runs")."""
    try:
        with open(cpuinfo) as f:
            flags = {word for line in f if line.startswith(("flags", "Features")) for word in line.split()}
    except OSError:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def describe():
    """One line for results files: CPU, cores, bfloat16 hardware, and the
    GPUs the Keras backend trains on (`accelerator`), if any."""
    bf16 = {True: "bfloat16 instructions", False: "no bfloat16 instructions", None: "bfloat16 unknown"}
    gpus = accelerator()
    return f"{cpu_name()}, {os.cpu_count()} cores, {bf16[cpu_has_native_bfloat16()]}" + (f"; {gpus}" if gpus else "")


def accelerator():
    """The GPUs the Keras backend sees, as '1x NVIDIA H100 80GB HBM3', or None.
    Asked after training (the backend's runtime is up by then)."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        names = [d.device_kind for d in jax.devices() if d.platform == "gpu"]
    elif keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        names = [tf.config.experimental.get_device_details(d).get("device_name", "GPU")
                 for d in tf.config.list_physical_devices("GPU")]
    else:
        return None
    return f"{len(names)}x {names[0]}" if names else None


def available_memory_bytes():
    """MemAvailable of /proc/meminfo (Linux), else None."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def memory_shortfall(need, batch):
    """Why a training step whose activations alone need `need` bytes cannot
    run here (more than the memory available: the kernel's OOM killer would
    end it, perhaps with other processes), or None when it fits or the
    memory is unknown."""
    have = available_memory_bytes()
    if have is None or need <= have:
        return None
    return (f"a training step at batch {batch} needs at least {need / 2**30:.1f} GiB for activations, more than "
            f"the {have / 2**30:.1f} GiB of memory available. Lower --batch_size, or raise --accumulation_steps "
            "(same updates, smaller micro-batches)")


def bfloat16_warning(mixed_precision, on_gpu):
    """A warning when bfloat16 runs on a CPU without bfloat16 hardware:
    emulated, it is several times slower than float32 (benchmarks/README.md)."""
    if mixed_precision != "bfloat16" or on_gpu or cpu_has_native_bfloat16() is not False:
        return None
    return ("Warning: --mixed_precision=bfloat16 on a CPU without bfloat16 instructions (no AVX512_BF16/AMX in "
            "/proc/cpuinfo): it is emulated and several times slower than float32 here; use --mixed_precision=none.")


def resolve_precision(mixed_precision):
    """--mixed_precision=auto: bfloat16 where this CPU has bfloat16
    instructions (faster than float32 there), float32 ('none') elsewhere
    (emulated bfloat16 is several times slower); benchmarks/README.md, "Speed
    for long CPU runs". Each run records the precision it used (results.json
    config)."""
    if mixed_precision != "auto":
        return mixed_precision
    return "bfloat16" if cpu_has_native_bfloat16() else "none"


def wait_for_port(address, timeout):
    """Waits until `address` ('host:port') accepts a TCP connection; returns
    the seconds left of `timeout`, or raises the last OSError once
    `timeout` seconds have passed (for the JAX coordinator and a Ray
    cluster, whose own clients abort or retry without end)."""
    import socket
    import time

    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=min(5, timeout)):
                return max(1, int(deadline - time.monotonic()))
        except OSError:
            if time.monotonic() + 1 > deadline:
                raise
            time.sleep(1)
