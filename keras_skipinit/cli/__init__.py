"""The command layer: every command's start, flags and errors.

- `parsing`: each entry point's start (`start`), flags, one wording of errors
- `startup`: the backend chosen and Keras loaded, quietly, after the flags
- `train_cli`: `train.py` / `keras-skipinit-train`
- `export_cli`: `python -m export` / `keras-skipinit-export`

`python -m keras_skipinit.sweep`, `.predict` and `.analysis` keep their
own flag declarations beside their code and start through `parsing`.
"""
