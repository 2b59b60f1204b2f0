"""The `normalization=` switch, resolved in one place into what a block needs.

`resolve()` turns a method name and its options into a `Recipe` (plain data);
`BlockOps` turns the recipe into the few operations every residual block is
made of (norm, activation, conv, end of branch, merge, classifier head), so the
blocks in `applications/` never branch on method names.

| method                 | source                     |
|------------------------|----------------------------|
| batchnorm              | He et al.; SkipInit §2     |
| ghost_batchnorm        | SkipInit §3, §5, App. A    |
| skipinit               | SkipInit §2.2, Table 1     |
| regularized_skipinit   | SkipInit §4, §5, App. G    |
| fixup                  | Fixup §3, rules 1-3        |
| sqrt2                  | SkipInit §2.1, Table 1     |
| none                   | SkipInit §2.1              |
| nf                     | NF-ResNets (Brock et al. 2021a; blog seed) |
"""

import dataclasses
import math
import numbers

import keras

from keras_skipinit import layers as ksl

NORMALIZATIONS = (
    "batchnorm",
    "ghost_batchnorm",
    "skipinit",
    "regularized_skipinit",
    "fixup",
    "sqrt2",
    "none",
    "nf",
)
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
    virtual_batch_size: int | None = None
    bn_momentum: float = 0.99  # Keras' default; PyTorch's momentum=0.1 is 0.9 here
    alpha: float | None = None  # SkipInit multiplier init; None: no multiplier
    conv_bias: bool | None = None  # None: the architecture's default per conv
    dropout_rate: float = 0.0
    merge_scale: float = 1.0  # 1/sqrt(2) for the sqrt2 baseline
    v1_merge_bias: bool = False  # SkipInit App. F scalar bias before the final ReLU
    fixup: bool = False
    nf_beta: float | None = None  # NF-ResNet branch scale beta; None: not an NF model
    loop_blocks: bool = False  # runs of identical blocks as one loop (`looped`)
    remat: bool = False  # recompute the looped blocks' insides in the backward pass

    @property
    def normalized(self):
        return self.normalization in ("batchnorm", "ghost_batchnorm")


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
    return ksl._check_finite_number("alpha_init", alpha_init)


# The method options and the methods each belongs to.
OPTION_METHODS = {
    "virtual_batch_size": ("ghost_batchnorm",),
    "bn_momentum": ("batchnorm", "ghost_batchnorm"),
    "alpha_init": ("skipinit", "regularized_skipinit"),
    "nf_beta": ("nf",),
}


def check_method(normalization, *, preactivation=True, names=None, **options):
    """The method rules, checked here only (models and train.py alike): the
    method exists, each option given (not None) belongs to it, and 'nf' gets
    pre-activation blocks. `names` maps an option to the caller's name for it
    in the message (train.py's --ghost_batch_size is `virtual_batch_size`)."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}.")
    names = names or {}
    for option, value in options.items():
        if option not in OPTION_METHODS:
            raise TypeError(f"check_method() got an unknown method option {option!r}")
        if value is not None and normalization not in OPTION_METHODS[option]:
            owners = " or ".join(repr(m) for m in OPTION_METHODS[option])
            raise ValueError(f"{names.get(option, option)} applies only to normalization={owners}, "
                             f"got normalization={normalization!r}.")
    if normalization == "nf" and not preactivation:
        raise ValueError(
            "normalization='nf' needs pre-activation blocks: use ResNet-V2 or WideResNet, "
            "not a post-activation (V1) ResNet such as ResNet-V1 or CifarResNet."
        )


def resolve(
    normalization,
    *,
    num_blocks,
    branch_layers,
    virtual_batch_size=None,
    default_virtual_batch_size,
    bn_momentum=None,
    alpha_init=None,
    use_bias=None,
    dropout_rate=None,
    default_regularized_dropout,
    v1=False,
    nf_beta=None,
    loop_blocks=False,
    remat=False,
):
    """Validates the method options and returns the `Recipe` for a model."""
    check_method(normalization, preactivation=not v1, virtual_batch_size=virtual_batch_size,
                 bn_momentum=bn_momentum, alpha_init=alpha_init, nf_beta=nf_beta)
    skipinit = normalization in ("skipinit", "regularized_skipinit")
    if not isinstance(loop_blocks, bool) or not isinstance(remat, bool):
        raise ValueError(f"loop_blocks and remat must be True or False, got {loop_blocks!r}, {remat!r}.")
    if remat and not loop_blocks:
        raise ValueError("remat applies to the looped blocks: pass loop_blocks=True too.")
    if use_bias is not None and not isinstance(use_bias, bool):
        raise ValueError(f"use_bias must be None (method default), True or False, got {use_bias!r}.")
    if dropout_rate is not None:
        dropout_rate = ksl._check_finite_number("dropout_rate", dropout_rate)
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}.")
    options = {}
    if bn_momentum is not None:
        bn_momentum = ksl._check_finite_number("bn_momentum", bn_momentum)
        if not 0.0 <= bn_momentum < 1.0:
            raise ValueError(f"bn_momentum must be in [0, 1), got {bn_momentum}.")
        options["bn_momentum"] = bn_momentum
    if normalization == "ghost_batchnorm":
        vbs = default_virtual_batch_size if virtual_batch_size is None else virtual_batch_size
        if isinstance(vbs, bool) or not isinstance(vbs, numbers.Integral) or vbs < 1:
            raise ValueError(f"virtual_batch_size must be a positive int, got {vbs!r}.")
        options["virtual_batch_size"] = int(vbs)
    if skipinit:
        options["alpha"] = resolve_alpha(0.0 if alpha_init is None else alpha_init, num_blocks)
        options["v1_merge_bias"] = v1
    if normalization == "regularized_skipinit":
        options["conv_bias"] = True
        options["dropout_rate"] = default_regularized_dropout
    if normalization == "fixup":
        options["fixup"] = True
        options["conv_bias"] = False  # Fixup footnote 3: scalar biases replace per-channel ones
    if normalization == "sqrt2":
        options["merge_scale"] = 1.0 / math.sqrt(2.0)
    if normalization == "nf":
        beta = ksl._check_finite_number("nf_beta", 0.2 if nf_beta is None else nf_beta)
        if beta <= 0:
            raise ValueError(f"nf_beta must be > 0, got {beta}.")
        options["nf_beta"] = beta
        options["conv_bias"] = True
    if use_bias is not None:
        options["conv_bias"] = use_bias
    if dropout_rate is not None:
        options["dropout_rate"] = dropout_rate
    return Recipe(normalization, num_blocks, branch_layers, loop_blocks=loop_blocks, remat=remat, **options)


class BlockOps:
    """The building operations of a residual network under one `Recipe`.

    Layer names follow keras.applications (``{prefix}_1_conv`` ...); each
    residual block ends in ``{prefix}_branch_out`` (end of the residual branch,
    after any scalar multiplier) and ``{prefix}_out`` (the block output), which
    `keras_skipinit.analysis` reads.
    """

    def __init__(self, recipe, seed=None):
        self.recipe = recipe
        self._seed = seed
        self._count = 0
        # NF-ResNets: analytic Var[x] of the signal entering the next block,
        # for unit-variance inputs (the stem's WS conv preserves variance),
        # and the names of the alpha = 1/sqrt(Var[x]) layers made so far.
        self.expected_var = 1.0
        self._nf_alphas = []
        # (octaves of downsampling since the stack's input, tensor) after each block or looped run:
        # the stage outputs `pyramid_outputs` take.
        self.block_outputs = []

    def stack(self, x, specs, block, expansion=1):
        """Residual blocks `specs` [(prefix, filters, stride)] built by
        `block(x, ops, filters, stride, prefix)`. In the looped form
        (`recipe.loop_blocks`), each run of two or more consecutive identity
        blocks (stride 1, input channels = expansion * filters) is one
        `looped.RepeatedBlocks` layer over a template built by `block`."""
        i, level = 0, 0
        while i < len(specs):
            prefix, filters, stride = specs[i]
            end = i + 1
            if self.recipe.loop_blocks and stride == 1 and x.shape[-1] == expansion * filters:
                while end < len(specs) and tuple(specs[end][1:]) == (filters, 1):
                    end += 1
            if end - i >= 2:
                x = self._repeat(x, [p for p, _, _ in specs[i:end]], block, filters)
            else:
                x = block(x, self, filters, stride, prefix)
            level += int(math.log2(stride))
            self.block_outputs.append((level, x))
            i = end
        return x

    def _repeat(self, x, prefixes, block, filters):
        """One `RepeatedBlocks` over a template block. The blocks differ only
        in weights, except NF's fixed alpha = 1/sqrt(Var[x]): Var[x] grows by
        the same amount (beta^2) in every identity block, so block j's alpha
        is 1/sqrt(Var_0 + j * beta^2), passed as per-block initial values."""
        from keras_skipinit import looped

        n, var_in, alphas_before = len(prefixes), self.expected_var, len(self._nf_alphas)
        template_input = keras.Input(shape=x.shape[1:], dtype=x.dtype)
        template = keras.Model(template_input, block(template_input, self, filters, 1, prefixes[0]),
                               name=prefixes[0] + "_template")
        growth = self.expected_var - var_in
        self.expected_var = var_in + n * growth
        alphas = [1.0 / math.sqrt(var_in + j * growth) for j in range(n)]
        initial_values = {looped.RepeatedBlocks.initial_value_key(name, prefixes[0], "alpha"): alphas
                          for name in self._nf_alphas[alphas_before:]}
        return looped.RepeatedBlocks(template, prefixes, remat=self.recipe.remat, seed=self._seed,
                                     initial_values=initial_values, name=f"{prefixes[0]}_x{len(prefixes)}")(x)

    def _init_seed(self):
        if self._seed is None:
            return None
        self._count += 1
        return self._seed * 100003 + self._count

    def norm(self, x, name):
        """BN or ghost BN (SkipInit App. A); the identity without normalization."""
        r = self.recipe
        if r.normalization == "batchnorm":
            return keras.layers.BatchNormalization(momentum=r.bn_momentum, epsilon=1.001e-5, name=name)(x)
        if r.normalization == "ghost_batchnorm":
            return ksl.GhostBatchNormalization(
                r.virtual_batch_size, momentum=r.bn_momentum, epsilon=1.001e-5, name=name
            )(x)
        return x

    def act(self, x, name):
        """ReLU, preceded by a scalar bias under Fixup (rule 3); scaled by
        gamma = sqrt(2/(1-1/pi)) for NF-ResNets (unit-variance output)."""
        if self.recipe.fixup:
            x = ksl.FixupBias(name=name + "_bias")(x)
        x = keras.layers.Activation("relu", name=name)(x)
        if self.recipe.nf_beta is not None:
            x = keras.layers.Rescaling(ksl.NF_RELU_GAMMA, name=name + "_gamma")(x)
        return x

    def preact(self, x, norm_name, act_name):
        """Pre-activation of a block input: norm-ReLU; for NF-ResNets the
        norm is the analytic ``alpha = 1/sqrt(Var[x])`` (blog: y = x + beta
        f(alpha x)), a fixed (non-trainable) scalar weight, so that the
        looped form can stack its per-block values."""
        if self.recipe.nf_beta is not None:
            name = norm_name + "_nf_alpha"
            x = ksl.SkipInitScale(1.0 / math.sqrt(self.expected_var), trainable=False, name=name)(x)
            self._nf_alphas.append(name)
        else:
            x = self.norm(x, norm_name)
        return self.act(x, act_name)

    def scalar_bias(self, x, name):
        """Fixup's scalar bias (rule 3) under Fixup; the identity otherwise."""
        return ksl.FixupBias(name=name)(x) if self.recipe.fixup else x

    def conv(self, x, filters, kernel_size, name, strides=1, bias=False, role="plain",
             fan_mode="fan_in", init="he_normal", input_bias=True):
        """Conv2D with the paper's fixed padding for strided convs (App. G).

        ``bias`` is the architecture's default (keras.applications parity);
        the recipe overrides it. ``role`` is 'branch' for a branch conv that is
        not the last, 'last' for the last conv of a branch, 'plain' otherwise:
        Fixup scales 'branch' kernels by L^(-1/(2m-2)) and zero-inits 'last'
        (rules 1-2) and puts a scalar bias before every conv (rule 3) unless
        ``input_bias=False`` (the input already carries one, `scalar_bias`).
        Kernels are He-normal by ``fan_mode`` ('fan_in', Keras' HeNormal, or
        'fan_out', PyTorch ResNets'), or PyTorch's default conv init
        U(+-1/sqrt(fan_in)) with ``init='pytorch_default'``.
        """
        r = self.recipe
        if input_bias:
            x = self.scalar_bias(x, name + "_bias")
        if init not in CONV_INITS:
            raise ValueError(f"init must be one of {tuple(CONV_INITS)}, got {init!r}.")
        scale, mode, distribution = CONV_INITS[init]
        initializer = keras.initializers.VarianceScaling(
            scale, mode=mode or fan_mode, distribution=distribution, seed=self._init_seed()
        )
        if r.fixup and role == "branch":
            initializer = ksl.fixup_kernel_initializer(r.num_blocks, r.branch_layers, seed=self._init_seed(),
                                                       mode=fan_mode)
        elif r.fixup and role == "last":
            initializer = "zeros"
        conv = keras.layers.Conv2D
        if r.nf_beta is not None:
            conv, initializer = ksl.ScaledWSConv2D, keras.initializers.RandomNormal(seed=self._init_seed())
        padding = "same"
        if strides > 1 and kernel_size > 1:
            pad_total = kernel_size - 1
            x = keras.layers.ZeroPadding2D(
                ((pad_total // 2, pad_total - pad_total // 2),) * 2, name=name + "_pad"
            )(x)
            padding = "valid"
        return conv(
            filters,
            kernel_size,
            strides=strides,
            padding=padding,
            use_bias=bias if r.conv_bias is None else r.conv_bias,
            kernel_initializer=initializer,
            name=name,
        )(x)

    def branch_end(self, x, name):
        """End of a residual branch: SkipInit's alpha (§2.2) or Fixup's
        multiplier and bias (rule 3); named ``{prefix}_branch_out``."""
        r = self.recipe
        if r.alpha is not None:
            x = ksl.SkipInitScale(r.alpha, name=name + "_skipinit")(x)
        elif r.fixup:
            x = ksl.SkipInitScale(1.0, name=name + "_fixup_scale")(x)
            x = ksl.FixupBias(name=name + "_fixup_bias")(x)
        elif r.nf_beta is not None:
            x = keras.layers.Rescaling(r.nf_beta, name=name + "_nf_beta")(x)
        return keras.layers.Identity(name=name + "_branch_out")(x)

    def merge(self, shortcut, branch, name, v1=False, projected=False):
        """x + f(x); divided by sqrt(2) for the sqrt2 baseline (SkipInit §2.1);
        on ResNet-V1, SkipInit's scalar bias after the merge (App. F).

        NF-ResNets: Var[x_{l+1}] = Var[x_l] + beta^2, reset to 1 + beta^2 at
        a transition block, whose `projected` shortcut sees alpha * x too.
        """
        r = self.recipe
        if r.nf_beta is not None:
            self.expected_var = (1.0 if projected else self.expected_var) + r.nf_beta**2
        x = keras.layers.Add(name=name + "_add")([shortcut, branch])
        if r.merge_scale != 1.0:
            x = keras.layers.Rescaling(r.merge_scale, name=name + "_sqrt2")(x)
        if v1 and r.v1_merge_bias:
            x = ksl.FixupBias(name=name + "_merge_bias")(x)
        return x

    def head(self, x, classes, classifier_activation, name="predictions"):
        """Dropout (Regularized SkipInit, §4) and the classifier; Fixup
        zero-inits it and adds a scalar bias before it (rules 1 and 3)."""
        r = self.recipe
        if r.dropout_rate > 0:
            x = keras.layers.Dropout(r.dropout_rate, name="top_dropout")(x)
        if r.fixup:
            x = ksl.FixupBias(name=name + "_bias")(x)
            init = "zeros"
        else:
            init = keras.initializers.HeNormal(seed=self._init_seed())
        x = keras.layers.Dense(classes, kernel_initializer=init, name=name)(x)
        # Outputs in float32 under mixed precision (keras mixed-precision guide).
        return keras.layers.Activation(classifier_activation, dtype="float32", name=name + "_activation")(x)
