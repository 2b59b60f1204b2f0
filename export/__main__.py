"""Export a trained model for TF Serving, LiteRT or ONNX Runtime: `python -m export --help` (the
same command as the installed `keras-skipinit-export`; see keras_skipinit/cli/export_cli.py)."""

from keras_skipinit.cli.export_cli import run

if __name__ == "__main__":
    run()
