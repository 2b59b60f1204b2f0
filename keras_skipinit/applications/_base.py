"""The keras.applications-style builder shared by every model in the zoo."""

import functools
import inspect
import math
import os
import sys
import textwrap

import keras

from keras_skipinit import compat, layers as ksl, normalization as norm_lib
from keras_skipinit.applications import block_ops

POOLINGS = (None, "avg", "max")


def _check_input_shape(input_shape, default):
    if input_shape is None:
        return default
    shape = tuple(input_shape)
    if len(shape) != 3 or any(d is not None and (not ksl._is_int(d) or d < 1) for d in shape):
        raise ValueError(
            "input_shape must be (height, width, channels) with positive ints "
            f"(or None for a dynamic spatial size), got {input_shape!r}."
        )
    if shape[-1] is None:
        raise ValueError(f"input_shape must fix the number of channels, got {input_shape!r}.")
    return tuple(None if d is None else int(d) for d in shape)


# keras.applications' arguments in its order, after a constructor's own leading ones (depth, ...).
APPLICATION_ARGS = {"include_top": True, "weights": None, "input_tensor": None, "input_shape": None, "pooling": None,
                    "classes": 1000, "classifier_activation": "softmax", "name": None}
# Keyword-only arguments every constructor takes after its own: the method's (`normalization.KEYWORDS`), then these.
KEYWORDS = {**norm_lib.KEYWORDS, "seed": None, "pyramid_outputs": False}
KEYWORD_DOCS = {
    **norm_lib.KEYWORD_DOCS,
    "seed": "seed for the weight initializers (reproducible models)",
    "pyramid_outputs": "with include_top=False and pooling=None, return the stage outputs as a dict "
                       "{'P<l>': feature map at stride 2**l} (keras-hub's names), a backbone for detection and "
                       "segmentation heads",
}


def _bound(fn, signature, apply_defaults=False):
    """`fn` behind `signature`: inspect, help() and IDEs show it, and a call
    that does not fit it is the TypeError of any Python function. `fn` gets
    every argument by keyword (with its default if `apply_defaults`)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        bound = signature.bind(*args, **compat.keywords(kwargs, caller=fn.__name__))
        if apply_defaults:
            bound.apply_defaults()
        return fn(**bound.arguments)

    call.__signature__ = signature
    return call


def constructor(classes):
    """Decorates `fn(<own arguments>, **arguments)` into a model constructor
    with keras.applications' arguments (`classes` its default) after its own
    positional ones and the shared `KEYWORDS` after its own keyword-only
    ones: one real signature written once for every model (documented at the
    end of each docstring). `fn` receives every argument, defaults applied."""
    P = inspect.Parameter

    def decorate(fn):
        own = [p for p in inspect.signature(fn).parameters.values() if p.kind is not P.VAR_KEYWORD]
        defaults = {**APPLICATION_ARGS, "classes": classes}
        signature = inspect.Signature(
            [p for p in own if p.kind is P.POSITIONAL_OR_KEYWORD]
            + [P(name, P.POSITIONAL_OR_KEYWORD, default=value) for name, value in defaults.items()]
            + [p for p in own if p.kind is P.KEYWORD_ONLY]
            + [P(name, P.KEYWORD_ONLY, default=value) for name, value in KEYWORDS.items()])

        make = _bound(fn, signature, apply_defaults=True)
        make.__doc__ = inspect.cleandoc(fn.__doc__ or "") + "\n\nKeyword-only arguments of every model:\n" + "".join(
            textwrap.fill(f"{name}: {doc}.", 100, initial_indent="  ", subsequent_indent="    ") + "\n"
            for name, doc in KEYWORD_DOCS.items()) + "\nReturns:\n  A Keras `Model` instance.\n"
        return make

    return decorate


def variant(make, **fixed):
    """`make` with the arguments `fixed` (ResNet50V2 is ResNet with depth 50
    and version 2): the signature without them."""
    signature = inspect.signature(make)
    signature = signature.replace(parameters=[p for p in signature.parameters.values() if p.name not in fixed])
    def fixed_make(**arguments):
        return make(**fixed, **arguments)

    fixed_make.__name__ = f"{make.__name__}({', '.join(f'{k}={v!r}' for k, v in fixed.items())})"
    return _bound(fixed_make, signature)


def allow_deep_graph(num_blocks):
    """Keras walks a functional graph recursively (a few frames per layer):
    1000-layer nets need far more than Python's default limit of 1000."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000 + 60 * num_blocks))


def build(body_fn, arguments, *, context, default_name, default_input_shape, stem_stride, keras_application=None):
    """Validates the common arguments, resolves the recipe, builds the model.

    ``arguments``: `APPLICATION_ARGS` and `KEYWORDS`, as the constructor got
    them; ``context``: the architecture, for the method (`normalization.Context`).
    ``body_fn(inputs, ops)`` returns the final feature map (after the last
    activation); the head here is global pooling + the classifier. With
    `pyramid_outputs` (and include_top=False, pooling=None) the model returns
    the stage outputs instead, `pyramid(...)`; `stem_stride` is the stride of
    the body's first residual block input; `keras_application`: the name of
    the keras.applications constructor with this architecture, whose ImageNet
    weights `weights="imagenet"` loads (`imagenet_weights`).
    """
    method = dict(arguments)
    include_top, weights, input_tensor, input_shape, pooling, classes, classifier_activation, name = (
        method.pop(key) for key in APPLICATION_ARGS)
    seed, pyramid_outputs = method.pop("seed"), method.pop("pyramid_outputs")
    if not isinstance(include_top, bool):
        raise ValueError(f"include_top must be True or False, got {include_top!r}.")
    if not isinstance(pyramid_outputs, bool):
        raise ValueError(f"pyramid_outputs must be True or False, got {pyramid_outputs!r}.")
    if pyramid_outputs and (include_top or pooling is not None):
        raise ValueError("pyramid_outputs=True returns feature maps: pass include_top=False and pooling=None "
                         f"(got include_top={include_top!r}, pooling={pooling!r}).")
    if weights == "imagenet" and keras_application is None:
        raise ValueError(f"weights='imagenet': ImageNet weights exist for the ImageNet ResNets (keras.applications'), "
                         f"not for {default_name}; pass None or the path to a weights file (.weights.h5).")
    if weights not in (None, "imagenet") and not (isinstance(weights, (str, os.PathLike)) and os.path.isfile(weights)):
        raise ValueError(
            "weights must be None (random initialization), 'imagenet' (the ResNets: keras.applications' weights) "
            f"or the path to an existing weights file (.weights.h5), got {weights!r}."
        )
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}.")
    if include_top and (not ksl._is_int(classes) or classes < 1):
        raise ValueError(f"classes must be a positive int when include_top=True, got {classes!r}.")
    classes = int(classes) if include_top else classes
    normalization = method.pop("normalization")
    recipe = norm_lib.resolve(normalization, context, **method)
    if weights == "imagenet" and not norm_lib.METHODS[normalization].imagenet_weights:
        raise ValueError(f"weights='imagenet' are keras.applications.{keras_application}'s, a BatchNorm network: "
                         f"normalization={normalization!r} computes another function (Method.imagenet_weights); "
                         f"build it with normalization={' or '.join(map(repr, norm_lib.imagenet_methods()))}.")
    allow_deep_graph(recipe.num_blocks)

    if input_tensor is None:
        inputs = keras.Input(shape=_check_input_shape(input_shape, default_input_shape))
        x = inputs
    elif keras.backend.is_keras_tensor(input_tensor):
        inputs = keras.utils.get_source_inputs(input_tensor)
        x = input_tensor
    else:
        raise ValueError(f"input_tensor must be a Keras tensor (keras.Input), got {type(input_tensor).__name__}.")

    ops = block_ops.BlockOps(recipe, seed=seed)
    x = body_fn(x, ops)
    if pyramid_outputs:
        x = pyramid(ops.block_outputs, x, stem_stride)
    elif include_top:
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        x = ops.head(x, classes, classifier_activation)
    elif pooling == "avg":
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    elif pooling == "max":
        x = keras.layers.GlobalMaxPooling2D(name="max_pool")(x)
    model = keras.Model(inputs, x, name=name or default_name)
    if weights == "imagenet":
        imagenet_weights(model, keras_application, include_top=include_top, classes=classes,
                         classifier_activation=classifier_activation)
    elif weights is not None:
        model.load_weights(weights)
    return model


def imagenet_weights(model, keras_application, **top):
    """Copies the ImageNet weights of keras.applications' `keras_application`
    (e.g. "ResNet50V2"; downloaded by Keras on first use, then cached) into
    `model`, layer by layer by name. The BatchNorm ResNets here are
    keras.applications' networks layer for layer (names, shapes, and outputs
    for the same weights); a model whose weights differ from it in any name
    or shape (`loop_blocks`, `use_bias`) is refused before the download, as
    is a method whose record says the weights do not apply to it (`build`).
    The weights expect keras.applications' input scaling
    (`keras.applications.resnet_v2.preprocess_input`: [-1, 1] for V2;
    `resnet.preprocess_input`: BGR, ImageNet means subtracted, for V1)."""
    if top["include_top"] and top["classes"] != 1000:
        raise ValueError(f"weights='imagenet' with include_top=True has ImageNet's 1000 classes, got classes="
                         f"{top['classes']}: pass include_top=False for a backbone (and put a new classifier on it).")
    make = getattr(keras.applications, keras_application)
    shape = tuple(model.input_shape[1:])
    ours, theirs = _weight_shapes(model), _weight_shapes(make(weights=None, input_shape=shape, **top))
    if ours != theirs:
        differing = sorted(name for name in ours.keys() | theirs.keys() if ours.get(name) != theirs.get(name))
        raise ValueError(f"weights='imagenet' are keras.applications.{keras_application}'s, a BatchNorm network: this "
                         f"model's weights differ from it in {len(differing)} layer(s), e.g. {differing[0]!r} "
                         "(loop_blocks or use_bias): build it without them.")
    source = keras_imagenet(keras_application, input_shape=shape, **top)
    for layer in model.layers:
        if layer.weights:
            layer.set_weights(source.get_layer(layer.name).get_weights())


def keras_imagenet(keras_application, **arguments):
    """keras.applications' `keras_application` with its ImageNet weights
    (Keras downloads them once into ~/.keras/models, KERAS_HOME); where they
    cannot be fetched (offline), one line saying where to put them (it was
    a 98-line traceback; issue 91.14)."""
    try:
        return getattr(keras.applications, keras_application)(weights="imagenet", **arguments)
    except Exception as e:  # Keras' get_file raises a bare Exception ("URL fetch failure ...") or an OSError
        cache = os.path.join(os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras"), "models")
        raise ValueError(f"keras.applications.{keras_application}'s ImageNet weights could not be fetched "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__}): connect once (Keras keeps them "
                         f"in {cache}), or copy keras.applications' weights file there from a machine that has "
                         "it") from None


def _weight_shapes(model):
    """{layer name: its weights' shapes} of the layers that have weights."""
    return {layer.name: [tuple(w.shape) for w in layer.weights] for layer in model.layers if layer.weights}


def pyramid(block_outputs, features, stem_stride):
    """The stage outputs as keras-hub's `pyramid_outputs`: {"P<l>": the last
    block output at stride 2**l} for each stride the blocks reach, the
    deepest level being `features`, the body's final map (after the closing
    norm-ReLU of pre-activation nets; the other levels are the residual
    stream, as timm's `features_only` takes them). Strides 4/8/16/32 (P2..P5)
    for the ImageNet ResNets, 1/2/4 (P0..P2) for the CIFAR nets."""
    base = int(math.log2(stem_stride))
    levels = {}
    for level, tensor in block_outputs:
        levels[f"P{base + level}"] = tensor
    levels[f"P{base + block_outputs[-1][0]}"] = features
    return levels
