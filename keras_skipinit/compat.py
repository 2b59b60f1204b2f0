"""Files and calls from before a setting took today's name, read here only.

The main paths know today's names alone; what older versions wrote (a run's
model_spec.json, a .keras file, results.json) and the keyword arguments they
documented are translated to them in this module. Imports nothing heavy.
"""

import os
import sys
import warnings

# Model keyword arguments (the constructors', and model_spec.json's "model" record): old name -> today's.
RENAMED_KEYWORDS = {"virtual_batch_size": "ghost_batch_size", "dropout_rate": "dropout"}


def keywords(kwargs, caller=None):
    """`kwargs` with old keyword names (`RENAMED_KEYWORDS`) under today's.
    With `caller` (a name), each old one given is a DeprecationWarning
    naming the new one; a keyword given under both names is a TypeError."""
    renamed = dict(kwargs)
    for old, new in RENAMED_KEYWORDS.items():
        if old not in renamed:
            continue
        if new in renamed:
            raise TypeError(f"{caller or 'the model'} got {old!r} and {new!r}, one setting under two names: "
                            f"pass {new!r} alone")
        renamed[new] = renamed.pop(old)
        if caller:
            warnings.warn(f"{caller}: {old!r} is now {new!r}", DeprecationWarning, stacklevel=_user_level())
    return renamed


def _user_level():
    """The `stacklevel` of the first caller outside this package: the user's
    line, however deep the call came in (create_model -> a constructor
    pointed at registry.py)."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(2), 2  # the caller of `keywords`
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def model_args(recorded):
    """A model_spec.json "model" record in today's names (runs written
    before the renames keep exporting and resuming)."""
    return keywords(recorded)


def ghost_batch_norm_config(config):
    """A saved `GhostBatchNormalization` config in today's names (.keras
    files saved when its argument was `virtual_batch_size`)."""
    if "virtual_batch_size" in config and "ghost_batch_size" in config:  # both: which one counts is unknowable
        raise ValueError(f"a saved GhostBatchNormalization {config.get('name', '')!r} names both 'virtual_batch_size' "
                         f"({config['virtual_batch_size']!r}) and 'ghost_batch_size' ({config['ghost_batch_size']!r}), "
                         "one setting under two names: the file was edited or written by another program")
    return keywords(config)

