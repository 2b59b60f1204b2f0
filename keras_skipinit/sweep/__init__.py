"""The papers' depth experiments, run through `training.train`.

Protocols over one runner; a preset (``presets.py``) fills in the paper's settings:

- ``--preset=skipinit_table1`` (SkipInit §2.3, Table 1; App. D, Table 3): for
  each (method, depth) cell, train at every learning rate of a log2 grid with
  n seeds; at each learning rate take the mean and std of the best k of the n
  test accuracies (a diverged or at-chance run counts as failed); the cell
  reports the learning rate with the highest mean. With ``--extend_grid`` a
  cell whose best learning rate sits at the edge of the grid gets the next
  one beyond it, until the optimum is interior or reaches the paper's range
  2^-10..2^2; a cell where every run failed is extended downwards. The
  training cross-entropy table selects the lowest losses the same way.
- ``--preset=fixup_fig3`` (Fixup §4.1, Fig. 3): one epoch at the fixed
  learning rate 0.1 for each (method, depth) and n seeds; the mean and std of
  the test accuracy over all seeds and how many runs trained (beat chance).
- ``--protocol=converged``: each cell's rate chosen on --validation_examples
  held out, then --final_seeds runs on all training images (test set).
- ``--preset=batch_scaling_fashion_mnist`` (SkipInit §3, Fig. 3): the
  converged protocol with batch size as a cell's axis (--batch_sizes): each
  cell's grid centred on the batch-proportional rate, ghost batch norm over
  --ghost_batch_size, batches accumulated from --micro_batch_size.

    python -m keras_skipinit.sweep --preset=fixup_fig3 --out=docs/fixup_fig3
    python -m keras_skipinit.sweep --preset=fixup_fig3_cifar_resnet --out=docs/fixup_fig3/cifar_resnet
    python -m keras_skipinit.sweep --preset=skipinit_table1 --out=docs/skipinit_table1

Every run's results.json is one line of ``runs.jsonl`` under --out, and
each run keeps its model_dir under --runs_dir, so an interrupted sweep
resumes where it stopped (a run cut off midway resumes from its checkpoint).
``--dry_run`` prints the runs it would start now, how many are left as far as
known, and their time at their cells' recorded runs so far; it runs nothing.

``--executor=processes`` runs each run in a fresh child process of this
machine, --processes at a time (cores or one GPU shared); ``--executor=ray``
runs each run as a Ray task (a local Ray instance, or the
cluster at --ray_address / RAY_ADDRESS) with --cpus_per_run/--gpus_per_run:
all runs that do not wait on another's result go out at once (a round), and
the next round is decided from their results by the same `pending_runs`.

Modules: presets (the experiments, as data), protocol (what runs next: pure
functions of the results), log (runs.jsonl), runner (runs and records),
report (tables, summary.json), plots (figures), cli (flags), quantization (the
int8 study: exports of a sweep's runs, python -m keras_skipinit.sweep.quantization).
"""

from keras_skipinit.sweep.cli import main, parse_args
from keras_skipinit.sweep.presets import METHOD_SETTINGS, PRESETS
from keras_skipinit.sweep.protocol import grid_edge, lr_label, next_log2_lr, pending_runs, summarize
from keras_skipinit.sweep.plots import arch
from keras_skipinit.sweep.report import report
from keras_skipinit.machine import resolve_precision
from keras_skipinit.sweep.runner import run_sweep

__all__ = ["METHOD_SETTINGS", "PRESETS", "arch", "grid_edge", "lr_label", "main", "next_log2_lr", "parse_args",
           "pending_runs", "report", "resolve_precision", "run_sweep", "summarize"]
