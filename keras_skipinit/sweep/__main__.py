from keras_skipinit.cli import parsing

parsing.start("python -m keras_skipinit.sweep", "keras_skipinit.sweep.cli:parse_args", training=True)

from keras_skipinit.sweep.cli import main  # noqa: E402  (after the start: flags answered before Keras loads)

main()
