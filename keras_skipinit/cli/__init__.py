"""The command layer: every command's start, flags and errors.

- `parsing`: each entry point's start (`start`), `Command` (every command's
  flags, declared as data and parsed by absl's flags, the one flag library),
  one wording of errors
- `startup`: the backend chosen and Keras loaded, quietly, after the flags
- `train_cli`: `train.py` / `keras-skipinit-train`
- `export_cli`: `python -m export` / `keras-skipinit-export`

`python -m keras_skipinit.sweep`, `.predict` and `.analysis` declare their
flags on a `parsing.Command` beside their code and start through `parsing`.
"""
