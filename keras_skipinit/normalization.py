"""The `normalization=` switch, resolved in one place into what a block needs.

`METHODS` holds one record per method (`Method`: its options, the recipe
fields it sets, its norm layer, what training and LSUV need to know, the
paper section it implements); a new method is one record (and its layer).
`resolve()` turns a method name and its options into a `Recipe` (plain data);
`block_ops.BlockOps` turns the recipe into the few operations every residual
block is made of, so neither the blocks in `applications/` nor training and
the sweep compare method names.
"""

import dataclasses
import math
import numbers

from keras_skipinit._checks import finite_number

ALPHA_INIT_NAMES = {"zero": 0.0, "one": 1.0, "inv_sqrt_depth": None}
# Conv kernel initializations: VarianceScaling (scale, mode (None: the
# caller's fan mode), distribution). He et al. 2015 as Keras' HeNormal;
# PyTorch's default kaiming_uniform(a=sqrt(5)) is U(+-1/sqrt(fan_in)).
CONV_INITS = {
    "he_normal": (2.0, None, "truncated_normal"),
    "pytorch_default": (1.0 / 3.0, "fan_in", "uniform"),
}


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything a residual block needs to know about the method."""

    normalization: str
    num_blocks: int  # d (SkipInit) = L (Fixup): number of residual branches
    branch_layers: int  # m (Fixup): weight layers per residual branch
    ghost_batch_size: int | None = None
    bn_momentum: float = 0.99  # Keras' default; PyTorch's momentum=0.1 is 0.9 here
    alpha: float | None = None  # SkipInit multiplier init; None: no multiplier
    conv_bias: bool | None = None  # None: the architecture's default per conv
    dropout: float = 0.0
    merge_scale: float = 1.0  # 1/sqrt(2) for the sqrt2 baseline
    v1_merge_bias: bool = False  # SkipInit App. F scalar bias before the final ReLU
    nf_beta: float | None = None  # the nf_beta option's value (NF-ResNet branch scale beta)
    loop_blocks: bool = False  # runs of identical blocks as one loop (`looped`)
    remat: bool = False  # recompute the looped blocks' insides in the backward pass


@dataclasses.dataclass(frozen=True)
class Context:
    """What an architecture tells a method: its number of residual branches
    and weight layers per branch, whether it is post-activation (V1), and its
    defaults for the ghost batch size and Regularized SkipInit's dropout
    (CIFAR and ImageNet values)."""

    num_blocks: int
    branch_layers: int
    v1: bool
    default_ghost_batch_size: int
    default_regularized_dropout: float


_ANY_ARCHITECTURE = Context(num_blocks=1, branch_layers=2, v1=False, default_ghost_batch_size=1,
                            default_regularized_dropout=0.0)


def resolve_alpha(alpha_init, num_blocks):
    """SkipInit's initial alpha (§2.2, Table 1): a float, or one of
    'zero', 'one', 'inv_sqrt_depth' (1/sqrt(d), d = number of residual blocks)."""
    if isinstance(alpha_init, str):
        if alpha_init not in ALPHA_INIT_NAMES:
            raise ValueError(
                f"alpha_init must be a float or one of {sorted(ALPHA_INIT_NAMES)}, got {alpha_init!r}."
            )
        value = ALPHA_INIT_NAMES[alpha_init]
        return 1.0 / math.sqrt(num_blocks) if value is None else value
    return finite_number("alpha_init", alpha_init)


def _ghost_batch_size(value, context):
    vbs = context.default_ghost_batch_size if value is None else value
    if isinstance(vbs, bool) or not isinstance(vbs, numbers.Integral) or vbs < 1:
        raise ValueError(f"ghost_batch_size must be a positive int, got {vbs!r}.")
    return {"ghost_batch_size": int(vbs)}


def _bn_momentum(value, context):
    if value is None:
        return {}
    value = finite_number("bn_momentum", value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"bn_momentum must be in [0, 1), got {value}.")
    return {"bn_momentum": value}


def _alpha_init(value, context):
    return {"alpha": resolve_alpha(0.0 if value is None else value, context.num_blocks)}


def _nf_beta(value, context):
    beta = finite_number("nf_beta", 0.2 if value is None else value)
    if beta <= 0:
        raise ValueError(f"nf_beta must be > 0, got {beta}.")
    return {"nf_beta": beta}


@dataclasses.dataclass(frozen=True)
class Option:
    """A keyword of its own that some methods take (None: the default).
    `resolve(value, context)` checks it and returns the `Recipe` fields it
    sets; its name in `OPTIONS` is also train.py's flag and the
    `spec.Config` field."""

    type: type  # the flag's: int, float or str
    resolve: object
    doc: str


OPTIONS = {
    "ghost_batch_size": Option(int, _ghost_batch_size,
                               "ghost batch size (default 64 on CIFAR nets, 256 on ImageNet ResNets; §3, §5)"),
    "bn_momentum": Option(float, _bn_momentum,
                          "moving-average momentum of the BN statistics (default Keras' 0.99; PyTorch's "
                          "default momentum=0.1 is 0.9 here)"),
    "alpha_init": Option(str, _alpha_init,
                         "SkipInit's alpha: a float or 'zero' (default), 'one', 'inv_sqrt_depth' (1/sqrt(d), "
                         "d = number of residual blocks)"),
    "nf_beta": Option(float, _nf_beta, "NF-ResNet branch scale beta (default 0.2)"),
}


def _batchnorm(recipe, name):
    import keras  # here: the method table is read before Keras loads (flags, help)

    return keras.layers.BatchNormalization(momentum=recipe.bn_momentum, epsilon=1.001e-5, name=name)


def _ghost_batchnorm(recipe, name):
    from keras_skipinit import layers as ksl
    return ksl.GhostBatchNormalization(recipe.ghost_batch_size, momentum=recipe.bn_momentum, epsilon=1.001e-5,
                                       name=name)


def _merge_batchnorm(ops, x, name, **_):
    return _batchnorm(ops.recipe, name + "_merge_bn")(x)


def _head_batchnorm(ops, x, name):
    return _batchnorm(ops.recipe, name + "_head_bn")(x)


# Fixup (Zhang et al. 2019, §3): its rules as hooks of its record.
def _fixup_bias(ops, x, name):
    """Rule 3: a scalar bias (before each conv, activation and the classifier; footnote 3: scalar, not per channel)."""
    from keras_skipinit import layers as ksl
    return ksl.FixupBias(name=name)(x)


def _fixup_conv(ops, conv, initializer, role, fan_mode):
    """Rules 1-2: a branch's inner convs He-init scaled by L^(-1/(2m-2)), its last conv zero."""
    from keras_skipinit import layers as ksl
    if role == "branch":
        r = ops.recipe
        initializer = ksl.fixup_kernel_initializer(r.num_blocks, r.branch_layers, seed=ops.init_seed(), mode=fan_mode)
    elif role == "last":
        initializer = "zeros"
    return conv, initializer


def _fixup_branch_end(ops, x, name):
    """Rule 3: a scalar multiplier (init 1) and a scalar bias at the end of each branch."""
    from keras_skipinit import layers as ksl
    x = ksl.SkipInitScale(1.0, name=name + "_fixup_scale")(x)
    return ksl.FixupBias(name=name + "_fixup_bias")(x)


def _fixup_classifier(ops, x, name):
    """Rules 1 and 3: a scalar bias before the classifier, which starts at zero."""
    return _fixup_bias(ops, x, name + "_bias"), "zeros"


# NF-ResNets (Brock et al. 2021a; blog: y = x + beta f(alpha x)): its mechanism as hooks of its record.
def _nf_preact_norm(ops, x, name):
    """The norm of a pre-activation is the analytic alpha = 1/sqrt(Var[x]), a fixed scalar."""
    return ops.fixed_scale(x, 1.0 / math.sqrt(ops.expected_var), name + "_nf_alpha")


def _nf_gamma(ops, x, name):
    """ReLU's output scaled by gamma = sqrt(2/(1-1/pi)): unit variance again."""
    import keras

    from keras_skipinit import layers as ksl
    return keras.layers.Rescaling(ksl.NF_RELU_GAMMA, name=name + "_gamma")(x)


def _nf_conv(ops, conv, initializer, role, fan_mode):
    """Scaled weight-standardized convs, from N(0, 1) kernels."""
    import keras

    from keras_skipinit import layers as ksl
    return ksl.ScaledWSConv2D, keras.initializers.RandomNormal(seed=ops.init_seed())


def _nf_branch_end(ops, x, name):
    import keras

    return keras.layers.Rescaling(ops.recipe.nf_beta, name=name + "_nf_beta")(x)


def _nf_merge(ops, x, name, projected=False):
    """Var[x_{l+1}] = Var[x_l] + beta^2, reset to 1 + beta^2 at a transition
    block, whose `projected` shortcut sees alpha * x too."""
    ops.expected_var = (1.0 if projected else ops.expected_var) + ops.recipe.nf_beta ** 2
    return x


def _skipinit(context):
    return {"v1_merge_bias": context.v1}


@dataclasses.dataclass(frozen=True)
class Method:
    """One normalization method: all that code outside this module asks about it.

    - title: its name in tables and plots; source: what it implements.
    - options: the `OPTIONS` it takes (each given to another method is refused).
    - recipe: the `Recipe` fields it fixes, a dict or a function of the `Context`.
    - norm: `(recipe, name) -> layer` where blocks normalize; None: the identity.
    - normalizes: its blocks see normalized signals (batch statistics, weight
      standardization): LSUV, which initializes unnormalized nets, refuses it.
    - preactivation_only: post-activation (V1) networks are refused.
    - scalar_lr: the default learning-rate multiplier of scalar parameters.
    - imagenet_weights: its ImageNet ResNets are keras.applications' networks
      (the same layers and the same function), so keras.applications'
      ImageNet weights apply (``weights="imagenet"``, ``--init_from=imagenet``).
      The same weights alone are not enough: bn_sqrt2 has them and divides
      every block's output by sqrt(2).
    - hooks: its own mechanism at a block's points, which `block_ops.BlockOps`
      calls; {point: (ops, x, name) -> x} for "branch_end" (the branch, before
      its ``_branch_out``), "merge" (the block's output, after the add; also
      given ``projected=``), "head" (the pooled features, before dropout and
      the classifier), "act_input" / "act_output" (around each ReLU),
      "preact_norm" (replaces the norm of a pre-activation), "scalar_bias"
      (where Fixup puts its scalar biases); "conv": (ops, layer class,
      initializer, role=, fan_mode=) -> (layer class, initializer);
      "classifier": (ops, x, name) -> (x, kernel initializer). A mechanism
      the `Recipe` fields do not have is a hook, not a new field: Fixup and
      NF are records of hooks, and nothing outside this module asks which
      method it is.
    """

    title: str
    source: str
    options: tuple = ()
    recipe: object = dataclasses.field(default_factory=dict)
    norm: object = None
    normalizes: bool = False
    preactivation_only: bool = False
    scalar_lr: float = 1.0
    imagenet_weights: bool = False
    hooks: dict = dataclasses.field(default_factory=dict)

    def fields(self, context):
        return dict(self.recipe(context) if callable(self.recipe) else self.recipe)


METHODS = {
    "batchnorm": Method("Batch Normalization", "He et al.; SkipInit §2", ("bn_momentum",), norm=_batchnorm,
                        normalizes=True, imagenet_weights=True),
    "ghost_batchnorm": Method("Ghost Batch Normalization", "SkipInit §3, §5, App. A",
                              ("ghost_batch_size", "bn_momentum"), norm=_ghost_batchnorm, normalizes=True,
                              imagenet_weights=True),
    "skipinit": Method("SkipInit (alpha = 0)", "SkipInit §2.2, Table 1", ("alpha_init",), _skipinit),
    "regularized_skipinit": Method(
        "Regularized SkipInit", "SkipInit §4, §5, App. G", ("alpha_init",),
        lambda c: {**_skipinit(c), "conv_bias": True, "dropout": c.default_regularized_dropout}),
    # Fixup footnote 3: scalar biases replace per-channel ones. Its authors train scalars at lr/10 (CIFAR and
    # ImageNet code); with the full rate WRN-16-1 diverged at lr 0.1 on Fashion-MNIST in 3 of 3 seeds.
    "fixup": Method("Fixup", "Fixup §3, rules 1-3", recipe={"conv_bias": False}, scalar_lr=0.1,
                    hooks={"scalar_bias": _fixup_bias, "act_input": lambda ops, x, name: _fixup_bias(ops, x, name + "_bias"),
                           "conv": _fixup_conv, "branch_end": _fixup_branch_end, "classifier": _fixup_classifier}),
    "sqrt2": Method("Divide residual block by sqrt(2)", "SkipInit §2.1, Table 1",
                    recipe={"merge_scale": 1.0 / math.sqrt(2.0)}),
    "none": Method("No normalization, no scaling", "SkipInit §2.1"),
    # SkipInit App. D.2, Table 4: normalized networks that do not downscale the residual branch at init
    # (none trains WRN-1000 there): BN with the block's output divided by sqrt(2); BN in the branch and at
    # the end of every block (after the add: Table 4's heading); no BN in the blocks, one before the classifier.
    "bn_sqrt2": Method("BatchNorm, block output / sqrt(2)", "SkipInit App. D.2, Table 4", ("bn_momentum",),
                       recipe={"merge_scale": 1.0 / math.sqrt(2.0)}, norm=_batchnorm, normalizes=True),
    "bn_block_end": Method("BatchNorm, also at the end of each block", "SkipInit App. D.2, Table 4",
                           ("bn_momentum",), norm=_batchnorm, normalizes=True, hooks={"merge": _merge_batchnorm}),
    "bn_head_only": Method("One BatchNorm, before the classifier", "SkipInit App. D.2, Table 4", ("bn_momentum",),
                           hooks={"head": _head_batchnorm}),
    "nf": Method("NF-ResNet", "NF-ResNets (Brock et al. 2021a; blog seed)", ("nf_beta",), {"conv_bias": True},
                 normalizes=True, preactivation_only=True,
                 hooks={"preact_norm": _nf_preact_norm, "act_output": _nf_gamma, "conv": _nf_conv,
                        "branch_end": _nf_branch_end, "merge": _nf_merge}),
}
NORMALIZATIONS = tuple(METHODS)  # the built-in methods, in the order tables list them


def imagenet_methods():
    """The methods keras.applications' ImageNet weights apply to
    (`Method.imagenet_weights`), read from `METHODS` as it is now."""
    return tuple(name for name, method in METHODS.items() if method.imagenet_weights)


def methods_taking(option):
    """The names of the methods that take `option` (an `OPTIONS` key)."""
    return [name for name, method in METHODS.items() if option in method.options]


def check_method(normalization, *, preactivation=True, **options):
    """The method rules, checked here only (models and train.py alike): the
    method exists, each option given (not None) belongs to it, and
    pre-activation-only methods get pre-activation blocks."""
    if normalization not in METHODS:
        raise ValueError(f"normalization must be one of {tuple(METHODS)}, got {normalization!r}.")
    for option, value in options.items():
        if option not in OPTIONS:
            raise TypeError(f"check_method() got an unknown method option {option!r}")
        if value is not None and option not in METHODS[normalization].options:
            owners = " or ".join(repr(n) for n in methods_taking(option))
            raise ValueError(f"{option} applies only to normalization={owners}, "
                             f"got normalization={normalization!r}.")
        if value is not None:  # its value too, before any work (its default may depend on the architecture)
            OPTIONS[option].resolve(value, _ANY_ARCHITECTURE)
    if METHODS[normalization].preactivation_only and not preactivation:
        raise ValueError(
            f"normalization={normalization!r} needs pre-activation blocks: use ResNet-V2 or WideResNet, "
            "not a post-activation (V1) ResNet such as ResNet-V1 or CifarResNet."
        )


# The keyword-only arguments every model constructor takes (`applications._base`), in order, and their defaults.
KEYWORDS = {"normalization": "batchnorm", **{name: None for name in OPTIONS}, "dropout": None, "use_bias": None,
            "loop_blocks": False, "remat": False}
KEYWORD_DOCS = {
    "normalization": f"one of {', '.join(repr(n) for n in METHODS)} (`keras_skipinit.normalization.METHODS`)",
    **{name: f"for {' and '.join(repr(n) for n in methods_taking(name))}: {option.doc}"
       for name, option in OPTIONS.items()},
    "dropout": "dropout before the classifier (default 0.6 on CIFAR nets, 0.2 on ImageNet ResNets for "
                    "'regularized_skipinit', §4; 0 otherwise)",
    "use_bias": "force biases on (True) or off (False) in every conv; default: keras.applications' choice, all "
                "convs for 'regularized_skipinit' (§5), none for 'fixup' (scalar biases instead)",
    "loop_blocks": "run each stage's identical blocks as one loop over stacked weights (`keras_skipinit.looped`): "
                   "graph size independent of depth",
    "remat": "with loop_blocks, recompute each looped block in the backward pass",
}


def resolve(normalization, context, *, dropout=None, use_bias=None, loop_blocks=False,
            remat=False, **options):
    """Validates the method and its options (`OPTIONS`) and returns the
    `Recipe` for a model whose architecture is described by `context`."""
    check_method(normalization, preactivation=not context.v1, **options)
    if not isinstance(loop_blocks, bool) or not isinstance(remat, bool):
        raise ValueError(f"loop_blocks and remat must be True or False, got {loop_blocks!r}, {remat!r}.")
    if remat and not loop_blocks:
        raise ValueError("remat applies to the looped blocks: pass loop_blocks=True too.")
    if use_bias is not None and not isinstance(use_bias, bool):
        raise ValueError(f"use_bias must be None (method default), True or False, got {use_bias!r}.")
    if dropout is not None:
        dropout = finite_number("dropout", dropout)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}.")
    method = METHODS[normalization]
    fields = {}
    for name in method.options:
        fields.update(OPTIONS[name].resolve(options.get(name), context))
    fields.update(method.fields(context))
    if use_bias is not None:
        fields["conv_bias"] = use_bias
    if dropout is not None:
        fields["dropout"] = dropout
    return Recipe(normalization, context.num_blocks, context.branch_layers, loop_blocks=loop_blocks, remat=remat, **fields)
