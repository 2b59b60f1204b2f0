"""Command line of `python -m export` and keras-skipinit-export. It runs on
TensorFlow (SavedModels are TensorFlow graphs): started under another Keras
backend, it runs itself again with KERAS_BACKEND=tensorflow."""

import sys

import keras
from absl import app, flags, logging

from keras_skipinit import _cli

USAGE = """Export a trained model as a TensorFlow Serving SavedModel.

  keras-skipinit-export --source=runs/default --base_path=/tmp/serving --model_name=skipinit
  tensorflow_model_server --rest_api_port=8501 --model_name=skipinit \\
      --model_base_path=/tmp/serving/skipinit

--source is a train.py model_dir (its newest state: the newest checkpoint,
else model.keras) or a .keras file (train.py records the preprocessing
inside; for other files pass --preprocessing). Writes
<base_path>/<model_name>/<version>/ with the next free version unless
--version is given; an existing version is never replaced without --overwrite.
`python -m export` in a checkout and the installed `keras-skipinit-export`
are the same command.
"""

F = flags.FLAGS
flags.DEFINE_string("source", None, "A train.py model_dir or a .keras file.", required=True)
flags.DEFINE_string("base_path", None, "TF Serving model base path (parent of <model_name>/).", required=True)
flags.DEFINE_string("model_name", None, "Served model name, one path component (default: the source's name).")
flags.DEFINE_integer("version", None, "Version number (default: the next free one).", lower_bound=1)
flags.DEFINE_bool("overwrite", False, "Replace an existing version.")
flags.DEFINE_enum(
    "preprocessing", None, ["standardize", "imagenet"],
    "In-graph preprocessing (default: the one recorded by train.py; required for other .keras files).",
)
flags.DEFINE_integer("top_k", 5, "Classes returned per image.", lower_bound=1)
flags.DEFINE_bool("fold", True, "Fold BN/SkipInit/Fixup affine layers into the convs (exact).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not F["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    from keras_skipinit import serving

    try:
        name = F.model_name if F["model_name"].present else serving.model_name_for(F.source)
        serving.check_target(F.base_path, name)
        model, preprocessing, source = serving.load_source(F.source, F.preprocessing)
        path = serving.export(
            model,
            F.base_path,
            name,
            version=F.version,
            overwrite=F.overwrite,
            preprocessing=preprocessing,
            top_k=F.top_k,
            fold_layers=F.fold,
        )
    except ValueError as e:
        print(f"{_cli.program('export')}: error: {e}", file=sys.stderr)
        return 2
    print(f"Exported {source} to {path} (signatures: serving_default, predict_image_bytes; {preprocessing}).")
    print(f"Inspect: saved_model_cli show --all --dir {path}")
    return 0


def run():
    """Console entry point (keras-skipinit-export); `python -m export` calls it too."""
    if keras.backend.backend() != "tensorflow":
        _cli.rerun_on_tensorflow()
    _cli.run(main, USAGE)
