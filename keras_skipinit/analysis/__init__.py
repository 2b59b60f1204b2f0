"""Signal propagation at initialization and the one-step function change
(SkipInit §2, Fig. 1-2): `python -m keras_skipinit.analysis`.

- `propagation`: per-block statistics of a model and the toy ResNets (App. B-C)
- `step`: the one-step function change at initialization (Fixup §3)
- `command`: the command (`main`), each result written as it comes
- `flags`: the command's flags (no Keras: --help answers before it loads)

`keras_skipinit.analysis.block_statistics` etc. are these modules' names.
"""

from keras_skipinit import _lazy

__getattr__, __dir__ = _lazy.lend(__name__, "propagation", "step", "command")
