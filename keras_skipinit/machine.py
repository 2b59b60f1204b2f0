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


def cpu_has_native_bfloat16(cpuinfo="/proc/cpuinfo"):
    """Whether this CPU computes bfloat16 in hardware (x86 AVX512_BF16 or
    AMX; ARM's BF16 extension), from /proc/cpuinfo's flags; None if unknown.
    Without it bfloat16 is emulated: WRN-16-1 trained at 0.17x the speed of
    float32 on an AVX2-only CPU, 1.14x with AVX512_BF16 (benchmarks/README.md)."""
    try:
        with open(cpuinfo) as f:
            flags = {word for line in f if line.startswith(("flags", "Features")) for word in line.split()}
    except OSError:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def describe():
    """One line for results files: CPU, cores, bfloat16 hardware."""
    bf16 = {True: "bfloat16 instructions", False: "no bfloat16 instructions", None: "bfloat16 unknown"}
    return f"{cpu_name()}, {os.cpu_count()} cores, {bf16[cpu_has_native_bfloat16()]}"
