"""A factor's size on the survival curves (--compare_to): per method and
depth, how far the settings this sweep changed move the rate where half the
seeds train, against another survival sweep (its folder's summary.json),
with a 95% interval (`protocol.half_rate_shift`). The budget issue's item 2:
factor sizes with intervals, not grid steps."""

from keras_skipinit import spec
from keras_skipinit.sweep import log
from keras_skipinit.sweep.presets import METHOD_SETTINGS
from keras_skipinit.sweep.protocol import EXPERIMENT, SURVIVAL, half_rate_shift, log2_label

SAME_CRITERIA = ("protocol", "chance", "classes", "batch_sizes", "micro_batch_size")  # else not one curve's kind


def load(folder, args):
    """--compare_to's sweep: {"folder", "factor" (what differs, as text),
    "cells"}; None without the flag. A folder that is not a survival sweep,
    or one that counts "trained" otherwise, is refused (before any run)."""
    if not folder:
        return None
    if args.protocol != SURVIVAL:
        raise ValueError(f"--compare_to: only --protocol={SURVIVAL} sweeps compare half-train rates, "
                         f"not --protocol={args.protocol}")
    settings, cells = log.read_summary(folder, "--compare_to")
    if settings.get("protocol") != SURVIVAL:
        raise ValueError(f"--compare_to: {folder} holds a --protocol={settings.get('protocol')} sweep, not a "
                         f"{SURVIVAL} one")
    differ = [f"--{k}={settings.get(k)} there, {getattr(args, k)} here" for k in SAME_CRITERIA
              if k in settings and settings[k] != getattr(args, k)]
    if differ:
        raise ValueError(f"--compare_to: {folder} counts seeds otherwise ({'; '.join(differ)})")
    factor = [f"{k} {_shown(settings.get(k), k, settings.get('methods', []))} -> "
              f"{_shown(getattr(args, k), k, args.methods)}" for k in EXPERIMENT
              if hasattr(args, k) and k in settings and settings[k] != getattr(args, k)]
    return {"folder": folder, "factor": ", ".join(factor) or "none (the same settings)", "cells": cells}


def _shown(value, name, methods):
    """A setting as the runs had it: a flag left unset is the method's value, else train.py's default."""
    if value is not None:
        return value
    used = {str(METHOD_SETTINGS[m][1].get(name, spec.FIELDS[name].default)) for m in methods if m in METHOD_SETTINGS}
    if len(used) > 1:
        return "each method's default"
    return "default" if used <= {"None"} else f"{used.pop()} (default)"


INTERVAL = ("95% interval from 4,000 draws of each rate's fraction from its Jeffreys posterior, Beta(k + 1/2, "
            "n - k + 1/2); beyond the grids: —")
HEADER = ["| {} | depth | half train {} (acc.) | shift | 95% interval | {} (acc. and loss) | shift | 95% interval |",
          "|---|---|---|---|---|---|---|---|"]


def table(details, compared):
    """The factor's rows (and each cell's `shift_log2`, `shift_log2_by_loss`
    added to `details`): per cell both sweeps ran, the half-train rates there
    and here and the shift with its interval, by accuracy and by accuracy
    and loss."""
    lines = [f"The factor against {compared['folder']} ({compared['factor']}): how far the rate where half the seeds "
             f"train moves, in octaves (here minus there; {INTERVAL})", "",
             HEADER[0].format("method", "there / here", "there / here"), HEADER[1]]
    for name, cell in details.items():
        base = compared["cells"].get(name)
        if base and "rates" in base:
            key, depth = name.split("/depth")
            row, shifts = _row(METHOD_SETTINGS[key][0], depth, cell, base)
            cell["shift_log2"], cell["shift_log2_by_loss"] = shifts
            lines.append(row)
    return "\n".join(lines) + "\n"


def between_methods(details, methods, depths):
    """Per depth and pair of methods (in `methods`' order), how far apart
    their half-train rates lie, with the same interval as a factor's."""
    lines = [f"Between methods: how far apart their rates where half the seeds train lie, in octaves (the second "
             f"minus the first; {INTERVAL})", "", HEADER[0].format("methods", "first / second", "first / second"),
             HEADER[1]]
    for depth in depths:
        cells = [(key, details[f"{key}/depth{depth}"]) for key in methods if f"{key}/depth{depth}" in details]
        for i, (first, there) in enumerate(cells):
            for second, here in cells[i + 1 :]:
                label = f"{METHOD_SETTINGS[second][0]} - {METHOD_SETTINGS[first][0]}"
                lines.append(_row(label, depth, here, there)[0])
    return "\n".join(lines) + "\n"


def _row(label, depth, cell, base):
    """A table row of `cell`'s half-train rates against `base`'s, by
    accuracy and by accuracy and loss, and the two (shift, low, high)."""
    row, shifts = f"| {label} | {depth} |", []
    for by_loss, half in ((False, "half_log2"), (True, "half_log2_by_loss")):
        shift = half_rate_shift(cell["rates"], base["rates"], by_loss)
        shifts.append(list(shift))
        row += (f" {log2_label(base[half][0])} / {log2_label(cell[half][0])} | {_octaves(shift[0])} | "
                f"{_octaves(shift[1])} .. {_octaves(shift[2])} |")
    return row, shifts


def _octaves(value):
    return "—" if value is None else f"{value:+.2f}"
