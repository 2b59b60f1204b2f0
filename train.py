"""Train a keras_skipinit model: `python train.py --help` (the same
command as the installed `keras-skipinit-train`; see keras_skipinit/cli/train_cli.py)."""

from keras_skipinit.cli.train_cli import run

if __name__ == "__main__":
    run()
