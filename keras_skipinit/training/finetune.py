"""A run started from another run's weights (`--init_from`), and a run that
trains the classifier only (`--freeze_backbone`, a linear probe).

The source is a train.py model_dir (its newest state), a `.keras` file, or a
weights file (`model.save_weights`, `.weights.h5`: weights without the model,
read into this run's architecture with the file's class count). Its layers'
weights are copied into the new model's layers of the same name:
every layer but the head must match, both ways (the same architecture, method, depth,
width, looping and input channels; the image size may differ), else one
line names what differs; a model_dir, and a .keras file train.py saved,
record their settings, checked before any work (methods whose layers
coincide, e.g. /sqrt(2) and no scaling, differ only there; a source that
records none, a weights file, is taken to be this run's method, and a note
says so). The head (the classifier, and Fixup's scalar bias
before it: `BlockOps.head`) is copied where its classes are this run's,
matched by name where both sides record names (another order, or a subset:
each class's column of the classifier is its own), by the class count where
one does not (a weights file); otherwise it keeps the method's own
initialization (zero for Fixup): a head of other classes that happened to
be as many would start every class from another class's weights. Only a
run's first start loads the source: a resumed run continues from its own
checkpoint.
"""

import dataclasses
import os
from typing import Callable

from keras_skipinit import normalization, spec

HEAD = ("predictions", "predictions_bias")  # BlockOps.head's layers
SAME = spec.WEIGHTS  # the settings a source must share (a model_dir or train.py's .keras file records them)
NEEDS = "the same " + ", ".join(f"--{name}" for name in SAME) + " and image channels"  # what a source must share


def check(config):
    """One line, before any work, for a source that is missing or was trained
    with another model (a model_dir records its settings)."""
    if config.freeze_backbone and not config.init_from:
        raise ValueError("freeze_backbone trains the classifier of a model started from --init_from: give that too")
    if not config.init_from:
        return
    if config.lsuv:
        raise ValueError("lsuv initializes a model from scratch; --init_from starts it from another run's weights")
    path = config.init_from
    if path != IMAGENET:
        own, source = os.path.realpath(config.model_dir), os.path.realpath(path)
        if os.path.commonpath([own, source]) == own:  # --restart deleted it before failing to read it (issue 91.11)
            raise ValueError(f"--init_from={path} is this run's own --model_dir{' (or in it)' if own != source else ''}"
                             ": a run starts from another run's weights" + (
                                 ", and --restart would delete them first" if config.restart else ""))
    kind = source_for(path)
    kind.check(config, path)
    recorded = kind.record(path).settings  # the model's settings (`SAME`) where the source records them
    differ = [f"--{k}={recorded.get(k)} there, {getattr(config, k)} here" for k in SAME
              if recorded.get(k, getattr(config, k)) != getattr(config, k)]
    if differ:
        raise ValueError(f"--init_from={path} was trained with another model: {'; '.join(differ)}")


WEIGHTS = ".weights.h5"  # model.save_weights' files
IMAGENET = spec.IMAGENET_WEIGHTS  # --init_from's keras.applications ImageNet weights


def _check_imagenet(config, path=IMAGENET):
    """--init_from=imagenet: keras.applications' weights exist for its
    networks, the ResNets with BatchNorm (or Ghost BatchNorm) blocks as they
    are, and take their own input scaling (`data.load_for` chooses it)."""
    architecture = spec.architecture(config.model)
    if spec.keras_application(config.model, config.depth) is None:
        raise ValueError(f"--init_from=imagenet: keras.applications has ImageNet weights for --model=resnet_v1 and "
                         f"resnet_v2 (depth 50, 101, 152), not for --model={config.model}")
    methods = normalization.imagenet_methods()
    if config.normalization not in methods or config.loop_blocks:
        raise ValueError(f"--init_from=imagenet: its weights are BatchNorm networks: --normalization="
                         f"{' or '.join(methods)} without --loop_blocks (got --normalization="
                         f"{config.normalization}{', --loop_blocks' if config.loop_blocks else ''})")
    if config.preprocessing is not None:
        raise ValueError(f"--init_from=imagenet preprocesses as its weights expect ({architecture.keras_preprocessing} "
                         f"for --model={config.model}); --preprocessing={config.preprocessing} would feed them "
                         "inputs scaled otherwise")


def _classes_in_weights(path):
    """The class count of a weights file's classifier (Keras names a model's
    one Dense layer 'dense' there)."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return int(f["layers/dense/vars/0"].shape[-1])
    except (OSError, KeyError):
        raise ValueError(f"--init_from={path} is not a weights file of a keras_skipinit classifier "
                         "(model.save_weights of a model with its top)") from None


def _imagenet(path, rebuild, keras_application):
    from keras_skipinit.applications import _base  # downloaded by Keras on first use, then cached (~/.keras/models)

    return _base.keras_imagenet(keras_application), f"keras.applications.{keras_application}'s ImageNet weights"


def _model_dir(path, rebuild, keras_application):
    from keras_skipinit.training import model_files

    model, _, description = model_files.newest_model(path)
    return model, f"{path} ({description})"


def _weights_file(path, rebuild, keras_application):
    model = rebuild(_classes_in_weights(path))
    _check_weights_layout(path, model)
    try:
        model.load_weights(path)
    except ValueError as e:  # another architecture's layers
        raise ValueError(f"--init_from={path} holds the weights of another model ({str(e).splitlines()[0]}): "
                         f"it needs {NEEDS}") from None
    return model, path


def _keras_file(path, rebuild, keras_application):
    from keras_skipinit.training import model_files

    return model_files.load_keras(path), path


def _weights_layout(path):
    """{kind of layer: sorted shapes of its variables} in a weights file. Keras
    keys a layer there by its class (skip_init_scale_3), not its name, and
    `load_weights` fills layers by position whatever their kinds: SkipInit's
    alphas were dropped going into a model without them, Fixup's multipliers
    read as alphas (issue 91.3)."""
    import re

    import h5py

    layout = {}

    def note(name, item):
        if isinstance(item, h5py.Dataset) and name.startswith("layers/"):
            kind = re.sub(r"_\d+$", "", name.split("/")[1])
            layout.setdefault(kind, []).append(tuple(item.shape))

    with h5py.File(path, "r") as f:
        f.visititems(note)
    return {kind: sorted(shapes) for kind, shapes in layout.items()}


def _check_weights_layout(path, model):
    """One line where a weights file holds layers of other kinds or shapes
    than `model` (this run's architecture with the file's classes): another
    method or model, whose weights would load into the wrong places."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        mine = os.path.join(folder, "this" + WEIGHTS)
        model.save_weights(mine)
        here = _weights_layout(mine)
    there = _weights_layout(path)
    differ = [kind for kind in sorted(set(here) | set(there)) if here.get(kind) != there.get(kind)]
    if differ:
        counts = "; ".join(f"{kind}: {len(there.get(kind, []))} weights there, {len(here.get(kind, []))} here"
                           for kind in differ)
        raise ValueError(f"--init_from={path} holds the weights of another model or method ({counts}): "
                         f"it needs {NEEDS}")


def class_order(theirs, mine, their_count, my_count):
    """The source's class index for each of this run's classes (see the
    module docstring), or None where the head cannot be copied: `theirs`,
    `mine`: the class names each side records (None where unknown)."""
    if theirs and mine:
        return [list(theirs).index(name) for name in mine] if set(mine) <= set(theirs) else None
    return list(range(my_count)) if their_count == my_count else None


def load_into(model, path, rebuild, labels=None, keras_application=None):
    """Copies the source's weights into `model` (see the module docstring);
    returns one line saying what was loaded. `rebuild(classes)` makes this
    run's architecture with another class count (for a weights file);
    `labels`: this run's class names; `keras_application`: the
    keras.applications network whose ImageNet weights `path` "imagenet" names."""
    from keras_skipinit.training import model_files

    kind = source_for(path)
    record = kind.record(path)
    source, description = kind.load(path, rebuild, keras_application)
    their_labels = model_files.naming(record.labels, source.output_shape[-1])
    order = class_order(their_labels, labels, source.output_shape[-1], model.output_shape[-1])
    theirs = {layer.name: layer.get_weights() for layer in source.layers}
    body, head = [], []
    for layer in model.layers:
        mine = layer.get_weights()
        if not mine:
            continue
        same = layer.name in theirs and [w.shape for w in theirs[layer.name]] == [w.shape for w in mine]
        if layer.name in HEAD:
            head.append(layer)
        elif not same:
            found = ("has no such layer" if layer.name not in theirs else
                     f"{[w.shape for w in theirs[layer.name]]} there, {[w.shape for w in mine]} here")
            raise ValueError(f"--init_from={path}: layer {layer.name!r} differs ({found}): the source needs {NEEDS}")
        else:
            body.append(layer)
    mine = {layer.name for layer in model.layers}
    left_out = [name for name, w in theirs.items() if w and name not in mine and name not in HEAD]
    if left_out:  # e.g. SkipInit's alphas into a model without them: another function, not a start from it
        raise ValueError(f"--init_from={path}: its layer {left_out[0]!r}"
                         + (f" and {len(left_out) - 1} more have" if len(left_out) > 1 else " has")
                         + f" no place in this model: the source needs {NEEDS}")
    for layer in body:
        layer.set_weights(theirs[layer.name])
    unchecked = ("" if record.known else  # a weights file, a .keras file not from train.py
                 f"\nNote: --init_from={path} records no settings or preprocessing: its layers match this model's, "
                 "so its method (methods whose layers coincide, /sqrt(2) and no scaling, differ only in settings) "
                 "and preprocessing are taken to be this run's.")
    copied = order is not None and [_head_weights(layer, theirs, order) for layer in head]
    if head and copied and all(w is not None for w in copied):
        for layer, w in zip(head, copied):
            layer.set_weights(w)
        matched = "" if order == list(range(source.output_shape[-1])) else (
            f", its {len(order)} classes matched by name among the {source.output_shape[-1]} there")
        return f"Started from {description}: {len(body)} layers and the classifier{matched}.{unchecked}"
    shared = [name for name in (labels or ()) if name in (their_labels or ())]
    if head and shared and _copy_shared_columns(head, theirs, list(their_labels), list(labels), shared):
        return (f"Started from {description}: {len(body)} layers and the classifier's columns of the "
                f"{len(shared)} classes both have ({_names(shared)}); the other {len(labels) - len(shared)} "
                f"re-initialized ({_names([n for n in labels if n not in shared])}).{unchecked}")
    other = (f"other classes: {_names(their_labels)} there; {_names(labels)} here" if their_labels and labels
             else f"{source.output_shape[-1]} classes there, {model.output_shape[-1]} here")
    return f"Started from {description}: {len(body)} layers; the classifier re-initialized ({other}).{unchecked}"


def _copy_shared_columns(head, theirs, their_labels, labels, shared):
    """Copies the classifier's columns of the classes both sides name (a
    partial overlap re-initialized the whole classifier; issue 89.6), the
    others keeping their new initialization; the head's other layers
    (Fixup's scalar bias) are copied where they fit. False where the
    classifier's shapes do not allow it (nothing copied then)."""
    classifier = next((layer for layer in head if layer.name == HEAD[0]), None)
    if classifier is None or HEAD[0] not in theirs:
        return False
    mine = classifier.get_weights()
    if [w.shape[:-1] for w in theirs[HEAD[0]]] != [w.shape[:-1] for w in mine]:
        return False
    for name in shared:
        for new, old in zip(mine, theirs[HEAD[0]]):
            new[..., labels.index(name)] = old[..., their_labels.index(name)]
    classifier.set_weights(mine)
    for layer in head:
        if layer is not classifier and layer.name in theirs and \
                [w.shape for w in theirs[layer.name]] == [w.shape for w in layer.get_weights()]:
            layer.set_weights(theirs[layer.name])
    return True


def _head_weights(layer, theirs, order):
    """The source's weights of a head layer for this run's classes (the
    classifier's last axis is the classes': kernel [features, classes] and
    bias), or None where they do not fit."""
    if layer.name not in theirs:
        return None
    weights = [w[..., order] if layer.name == HEAD[0] else w for w in theirs[layer.name]]
    return weights if [w.shape for w in weights] == [w.shape for w in layer.get_weights()] else None


def _names(labels, shown=4):
    return ", ".join(map(str, labels[:shown])) + (f", ... {len(labels) - shown} more" if len(labels) > shown else "")


def preprocessing_note(path, preprocessing):
    """A line where the source (a model_dir, or a .keras file train.py saved)
    was trained on other input preprocessing than this run's, else None: its
    first layers learned inputs scaled otherwise (a weights file records none;
    ImageNet's is the run's own: `data.load_for`)."""
    theirs = source_for(path).record(path).preprocessing
    if theirs is None or theirs == preprocessing:
        return None
    return (f"Note: --init_from={path} was trained on inputs preprocessed by {theirs}; this run's are by "
            f"{preprocessing} (--preprocessing chooses).")


# --- the kinds of source, as a table ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Record:
    """What a source records of the run that made it: the model's settings (`SAME`), its preprocessing and class
    names; `known`: whether it records settings at all (a weights file, a .keras file not saved by train.py: no)."""

    settings: dict
    preprocessing: str | None = None
    labels: list | None = None
    known: bool = True


def _spec_record(path):
    from keras_skipinit.training import run_dir

    spec = run_dir.read_spec(path)
    return Record(spec["config"], spec.get("preprocessing"), spec.get("labels"))


def _keras_record(path):
    from keras_skipinit.training import model_files

    metadata = model_files.keras_metadata(path) or {}
    settings = metadata.get("settings") or {}
    return Record(settings, metadata.get("preprocessing"), metadata.get("labels"), known=bool(settings))


def _no_spec(config, path):
    from keras_skipinit.training import run_dir

    if not os.path.exists(os.path.join(path, run_dir.SPEC)):
        raise ValueError(f"--init_from={path} is not a train.py model_dir (no {run_dir.SPEC})")


def _a_file(config, path):
    if not os.path.isfile(path):
        _nothing(config, path)


def _nothing(config, path):
    raise ValueError(f"--init_from={path}: no such train.py model_dir, .keras or {WEIGHTS} file")


@dataclasses.dataclass(frozen=True)
class Source:
    """A kind of --init_from source: which paths it takes (`takes`), its
    check before any work (`check(config, path)`), its model and a line
    naming it (`load(path, rebuild, keras_application)`: the module
    docstring) and what it records (`record(path)`)."""

    kind: str
    takes: Callable
    check: Callable
    load: Callable
    record: Callable


SOURCES = (  # the first that takes a path is its kind
    Source("imagenet", lambda path: path == IMAGENET, _check_imagenet, _imagenet, lambda path: Record({})),
    Source("model_dir", os.path.isdir, _no_spec, _model_dir, _spec_record),
    Source("weights", lambda path: path.endswith(WEIGHTS), _a_file, _weights_file,
           lambda path: Record({}, known=False)),
    Source(".keras", lambda path: path.endswith(".keras"), _a_file, _keras_file, _keras_record),
    Source("none", lambda path: True, _nothing, lambda path, *_: _nothing(None, path),
           lambda path: Record({}, known=False)),
)


def source_for(path):
    """The `SOURCES` entry of an --init_from value."""
    return next(source for source in SOURCES if source.takes(path))


def freeze_backbone(model):
    """Every layer but the head stops training (BatchNorm then uses its moving statistics)."""
    for layer in model.layers:
        if layer.name not in HEAD:
            layer.trainable = False
