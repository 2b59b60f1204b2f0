"""Checks of plain values shared by the layers, the methods and the run
settings (no Keras here: the settings are read before it loads)."""

import math
import numbers


def is_int(value):
    """A Python or numpy integer (not a bool)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def finite_number(name, value):
    """`value` as a float, or a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite real number, got {value!r}.")
    return float(value)
