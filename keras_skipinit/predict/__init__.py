"""`python -m keras_skipinit.predict` (`keras-skipinit-predict`): what is in
these images, answered by a trained run or an exported file (`cli`)."""

from keras_skipinit.predict.cli import build_parser, main

__all__ = ["build_parser", "main"]
