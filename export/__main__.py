"""Export a trained model as a TensorFlow Serving SavedModel.

  python -m export --source=runs/default --base_path=/tmp/serving --model_name=skipinit
  tensorflow_model_server --rest_api_port=8501 --model_name=skipinit \
      --model_base_path=/tmp/serving/skipinit

--source is a .keras file or a train.py model_dir (its model.keras, or its
latest checkpoint when training was interrupted). Writes
<base_path>/<model_name>/<version>/ with the next free version unless
--version is given; an existing version is never replaced without --overwrite.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

F = flags.FLAGS
flags.DEFINE_string("source", None, "A .keras file or a train.py model_dir.", required=True)
flags.DEFINE_string("base_path", None, "TF Serving model base path (parent of <model_name>/).", required=True)
flags.DEFINE_string("model_name", None, "Served model name (default: the source's base name).")
flags.DEFINE_integer("version", None, "Version number (default: the next free one).", lower_bound=1)
flags.DEFINE_bool("overwrite", False, "Replace an existing version.")
flags.DEFINE_enum("preprocessing", None, ["standardize", "imagenet"], "In-graph preprocessing (default: the training run's).")
flags.DEFINE_integer("top_k", 5, "Classes returned per image.", lower_bound=1)
flags.DEFINE_bool("fold", True, "Fold BN/SkipInit/Fixup affine layers into the convs (exact).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from keras_skipinit import serving

    try:
        model, preprocessing = serving.load_source(F.source)
        name = F.model_name or os.path.splitext(os.path.basename(os.path.normpath(F.source)))[0]
        path = serving.export(
            model,
            F.base_path,
            name,
            version=F.version,
            overwrite=F.overwrite,
            preprocessing=F.preprocessing or preprocessing,
            top_k=F.top_k,
            fold_layers=F.fold,
        )
    except ValueError as e:
        print(f"export: error: {e}", file=sys.stderr)
        return 2
    print(f"Exported {F.source} to {path} (signatures: serving_default, predict_image_bytes).")
    print(f"Inspect: saved_model_cli show --all --dir {path}")
    return 0


if __name__ == "__main__":
    app.run(main)
