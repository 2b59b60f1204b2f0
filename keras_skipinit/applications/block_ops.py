"""The building operations of a residual network under one `normalization.Recipe`:
norm, activation, conv, end of branch, merge, classifier head, stacks of
blocks. The blocks in `applications/` are written in these, so they never
branch on method names; nor do these: the method's record
(`normalization.METHODS`) supplies its norm layer and, as hooks, every
mechanism of its own (Fixup's scalar biases and initializations, NF's
analytic scales and weight-standardized convs).
"""

import math

import keras

from keras_skipinit import layers as ksl
from keras_skipinit.normalization import CONV_INITS, METHODS


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
        # For methods that scale by the signal's analytic variance (NF): Var[x] of the signal entering the
        # next block, for unit-variance inputs, which their hooks keep, and the names of the fixed
        # per-block scales made so far (`fixed_scale`), whose values a looped run stacks.
        self.expected_var = 1.0
        self.fixed_scales = []
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
        in weights, except fixed scales 1/sqrt(Var[x]) (NF's alpha): Var[x]
        grows by the same amount (NF: beta^2) in every identity block, so
        block j's scale is 1/sqrt(Var_0 + j * growth), passed as per-block
        initial values."""
        from keras_skipinit import looped
        n, var_in, scales_before = len(prefixes), self.expected_var, len(self.fixed_scales)
        template_input = keras.Input(shape=x.shape[1:], dtype=x.dtype)
        template = keras.Model(template_input, block(template_input, self, filters, 1, prefixes[0]),
                               name=prefixes[0] + "_template")
        growth = self.expected_var - var_in
        self.expected_var = var_in + n * growth
        alphas = [1.0 / math.sqrt(var_in + j * growth) for j in range(n)]
        initial_values = {looped.RepeatedBlocks.initial_value_key(name, prefixes[0], "alpha"): alphas
                          for name in self.fixed_scales[scales_before:]}
        return looped.RepeatedBlocks(template, prefixes, remat=self.recipe.remat, seed=self._seed,
                                     initial_values=initial_values, name=f"{prefixes[0]}_x{len(prefixes)}")(x)

    def init_seed(self):
        """The next seed of this model's initializers (None: unseeded); the methods' hooks draw theirs here too."""
        if self._seed is None:
            return None
        self._count += 1
        return self._seed * 100003 + self._count

    @property
    def _method(self):
        return METHODS[self.recipe.normalization]

    def _hook(self, point, x, name, **info):
        """The method's own layers at `point` (`normalization.Method.hooks`); the identity without."""
        hook = self._method.hooks.get(point)
        return x if hook is None else hook(self, x, name, **info)

    def norm(self, x, name):
        """The method's norm layer (BN, ghost BN: SkipInit App. A); the identity for the others."""
        layer = self._method.norm
        return x if layer is None else layer(self.recipe, name)(x)

    def act(self, x, name):
        """ReLU, with the method's layers before it ("act_input": Fixup's
        scalar bias, rule 3) and after it ("act_output": NF's gamma)."""
        x = self._hook("act_input", x, name)
        x = keras.layers.Activation("relu", name=name)(x)
        return self._hook("act_output", x, name)

    def preact(self, x, norm_name, act_name):
        """Pre-activation of a block input: norm-ReLU; a method's
        "preact_norm" hook replaces the norm (NF's analytic alpha)."""
        hook = self._method.hooks.get("preact_norm")
        x = self.norm(x, norm_name) if hook is None else hook(self, x, norm_name)
        return self.act(x, act_name)

    def fixed_scale(self, x, value, name):
        """A fixed (non-trainable) scalar weight `value` named `name`, kept in
        `fixed_scales` so that the looped form can stack per-block values."""
        self.fixed_scales.append(name)
        return ksl.SkipInitScale(value, trainable=False, name=name)(x)

    def scalar_bias(self, x, name):
        """The method's scalar bias ("scalar_bias": Fixup's, rule 3); the identity otherwise."""
        return self._hook("scalar_bias", x, name)

    def conv(self, x, filters, kernel_size, name, strides=1, bias=False, role="plain",
             fan_mode="fan_in", init="he_normal", input_bias=True):
        """Conv2D with the paper's fixed padding for strided convs (App. G).

        ``bias`` is the architecture's default (keras.applications parity);
        the recipe overrides it. ``role`` is 'branch' for a branch conv that is
        not the last, 'last' for the last conv of a branch, 'plain' otherwise:
        the method's "conv" hook may change the layer and its initializer by
        role (Fixup rules 1-2, NF's weight standardization); its scalar bias
        comes before every conv unless ``input_bias=False`` (the input already
        carries one, `scalar_bias`).
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
            scale, mode=mode or fan_mode, distribution=distribution, seed=self.init_seed()
        )
        conv = keras.layers.Conv2D
        hook = self._method.hooks.get("conv")
        if hook is not None:
            conv, initializer = hook(self, conv, initializer, role=role, fan_mode=fan_mode)
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
        """End of a residual branch: SkipInit's alpha (§2.2), then the
        method's "branch_end" layers (Fixup's multiplier and bias, rule 3;
        NF's beta); named ``{prefix}_branch_out``."""
        r = self.recipe
        if r.alpha is not None:
            x = ksl.SkipInitScale(r.alpha, name=name + "_skipinit")(x)
        x = self._hook("branch_end", x, name)
        return keras.layers.Identity(name=name + "_branch_out")(x)

    def merge(self, shortcut, branch, name, v1=False, projected=False):
        """x + f(x); divided by sqrt(2) for the sqrt2 baseline (SkipInit §2.1);
        on ResNet-V1, SkipInit's scalar bias after the merge (App. F); then
        the method's "merge" hook, told whether the shortcut is `projected`
        (NF's variance bookkeeping)."""
        r = self.recipe
        x = keras.layers.Add(name=name + "_add")([shortcut, branch])
        if r.merge_scale != 1.0:
            x = keras.layers.Rescaling(r.merge_scale, name=name + "_sqrt2")(x)
        if v1 and r.v1_merge_bias:
            x = ksl.FixupBias(name=name + "_merge_bias")(x)
        return self._hook("merge", x, name, projected=projected)

    def head(self, x, classes, classifier_activation, name="predictions"):
        """Dropout (Regularized SkipInit, §4) and the classifier, whose input
        and initializer a method's "classifier" hook may set (Fixup: a scalar
        bias before it, zero init; rules 1 and 3)."""
        r = self.recipe
        x = self._hook("head", x, name)
        if r.dropout > 0:
            x = keras.layers.Dropout(r.dropout, name="top_dropout")(x)
        hook = self._method.hooks.get("classifier")
        if hook is not None:
            x, init = hook(self, x, name)
        else:
            init = keras.initializers.HeNormal(seed=self.init_seed())
        x = keras.layers.Dense(classes, kernel_initializer=init, name=name)(x)
        # Outputs in float32 under mixed precision (keras mixed-precision guide).
        return keras.layers.Activation(classifier_activation, dtype="float32", name=name + "_activation")(x)
