"""`python -m keras_skipinit.analysis`: flags answered before Keras loads, then `command.main`."""

from keras_skipinit.cli import parsing

parsing.start("python -m keras_skipinit.analysis", "keras_skipinit.analysis.flags:parse")

from keras_skipinit.analysis import command  # noqa: E402

command.main()
