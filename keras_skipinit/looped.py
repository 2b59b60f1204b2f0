"""Depth-independent graphs: runs of identical residual blocks as one loop.

A stage of a deep ResNet repeats one block: after its first (projecting)
block every block maps [H, W, C] to [H, W, C] with the same layers. In the
looped form (`loop_blocks=True` on the model constructors, `BlockOps.stack`)
each such run is one `RepeatedBlocks` layer: a *template* block, built once
by the same block function as the unrolled form, and the weights of all the
blocks of the run stacked on a leading axis. Its call is one
`keras.ops.scan` over the stacked trainable weights (one `while` op on
TensorFlow, a `lax.scan` on JAX) in which block i runs the template
statelessly with slice i of the weights and writes its updated BN moving
statistics back to slice i of the stacked statistics it carries.
So graph size, build time and trace time do not grow with the number of
blocks. With `remat=True` each block's inside is recomputed in the backward
pass (`keras.remat`): activation memory is about one tensor per block.

`transfer_weights` copies weights between the two forms (block i of a loop
<-> the unrolled layers named with block i's prefix) and `unroll` rebuilds a
looped model as the unrolled graph, e.g. for `keras_skipinit.analysis`,
which reads each block's output.
"""

import keras
import numpy as np
from keras import ops


@keras.saving.register_keras_serializable(package="keras_skipinit")
class RepeatedBlocks(keras.layers.Layer):
    """`len(prefixes)` copies of the residual block `block` (a functional
    model whose layers are named with `prefixes[0]`), applied in sequence,
    with per-block weights stacked on a leading axis.

    Block i is initialized from the template's initializers with a seed of
    its own (derived from a seeded initializer's seed, or fresh where it has
    none), so the looped and the unrolled model draw from the same
    distributions. `initial_values`
    {"<layer suffix>/<weight name>": [value of block 0, block 1, ...]} sets
    weights whose initial value depends on the block's position instead
    (NF-ResNets' fixed alpha = 1/sqrt(Var[x]), `BlockOps._repeat`).
    """

    def __init__(self, block, prefixes, remat=False, seed=None, initial_values=None, **kwargs):
        super().__init__(**kwargs)
        if isinstance(block, dict):
            block = keras.saving.deserialize_keras_object(block)
        if not isinstance(block, keras.Model):
            raise ValueError(f"block must be a functional keras.Model, got {type(block).__name__}.")
        prefixes = list(prefixes)
        if len(prefixes) < 1 or any(not isinstance(p, str) for p in prefixes):
            raise ValueError(f"prefixes must be a non-empty list of block names, got {prefixes!r}.")
        # The template is a function of the stacked weights, not a holder of
        # weights: keep it out of Keras' tracking (its own weights are unused).
        object.__setattr__(self, "_block", block)
        self.prefixes = prefixes
        self.remat = bool(remat)
        self.seed = seed
        self.initial_values = {k: [float(v) for v in values] for k, values in (initial_values or {}).items()}
        wrong = {k: len(v) for k, v in self.initial_values.items() if len(v) != len(prefixes)}
        if wrong:
            raise ValueError(f"initial_values need one value per block ({len(prefixes)}), got lengths {wrong}.")

    @property
    def block(self):
        return self._block

    @property
    def template_prefix(self):
        return self.prefixes[0]

    @staticmethod
    def initial_value_key(layer_name, template_prefix, weight_name):
        """The `initial_values` key of weight `weight_name` of the template's
        layer `layer_name`: "<layer suffix>/<weight name>"."""
        return f"{layer_name[len(template_prefix):]}/{weight_name}"

    def slots(self):
        """(template layer, index into its weights, template variable) for every
        per-block weight, in the order of the template's variables."""
        owner = {}
        for layer in self._block.layers:
            for k, variable in enumerate(layer.weights):
                owner[id(variable)] = (layer, k)
        return [(*owner[id(v)], v) for v in self._block.trainable_variables + self._block.non_trainable_variables]

    def build(self, input_shape):
        n = len(self.prefixes)
        self._stacked = []
        unused = set(self.initial_values)
        for index, (layer, _, variable) in enumerate(self.slots()):
            key = self.initial_value_key(layer.name, self.template_prefix, variable.name)
            if key in self.initial_values:
                unused.discard(key)
                values = np.asarray(self.initial_values[key], dtype=variable.dtype).reshape((n, *variable.shape))
            else:
                values = np.stack([self._initial_value(layer, variable, block, index) for block in range(n)])
            suffix = layer.name[len(self.template_prefix):].lstrip("_")
            self._stacked.append(self.add_weight(
                name=f"{suffix}_{variable.name}",
                shape=values.shape,
                dtype=variable.dtype,
                initializer=lambda shape, dtype, values=values: ops.cast(values, dtype),
                trainable=variable.trainable,
                aggregation=getattr(variable, "aggregation", "none"),
            ))
        if unused:
            raise ValueError(f"initial_values name no weight of the block: {sorted(unused)}.")

    def _initial_value(self, layer, variable, block, index):
        """A fresh draw of `variable` for block `block`: from its layer's
        `<name>_initializer` (reseeded per block if seeded), else its constant value.
        An unseeded Keras 3 initializer fixes a seed when it is made, so each
        call of one instance returns the same values: each block gets a new
        instance (a seed of its own) instead, or all its blocks would start as
        copies of one, a different network from the unrolled one."""
        initializer = getattr(layer, f"{variable.name}_initializer", None)
        if initializer is None:
            return keras.ops.convert_to_numpy(variable.value)
        initializer = keras.initializers.get(initializer)
        config = initializer.get_config()
        if "seed" in config:
            if config["seed"] is not None:
                config["seed"] = (int(config["seed"]) * 1_000_003 + block * 101 + index + 1) % 2**31
            initializer = initializer.__class__.from_config(config)
        return keras.ops.convert_to_numpy(initializer(tuple(variable.shape), dtype=variable.dtype))

    def call(self, inputs, training=None):
        num_trainable = len(self._block.trainable_variables)
        trainable = [w.value for w in self._stacked[:num_trainable]]
        non_trainable = [w.value for w in self._stacked[num_trainable:]]
        update = bool(training) and bool(non_trainable)

        def run_block(x, block_trainable, block_non_trainable):
            return self._block.stateless_call(block_trainable, block_non_trainable, x, training=training)

        if self.remat:
            run_block = keras.remat(run_block)

        def body(state, block_trainable):
            x, stacked, i = state
            y, updated = run_block(x, list(block_trainable), [ops.take(w, i, axis=0) for w in stacked])
            if update:
                # Moving statistics carry no gradient; scatter_update has one
                # on every backend (TF's slice_update lowers to an op without).
                stacked = [
                    ops.scatter_update(w, ops.reshape(i, (1, 1)), ops.expand_dims(ops.stop_gradient(ops.cast(u, w.dtype)), 0))
                    for w, u in zip(stacked, updated)
                ]
            return (ops.cast(y, x.dtype), stacked, i + 1), None

        # scan hands block i its slice of the stacked trainable weights (a
        # TensorArray on TensorFlow), so the backward pass writes one slice of
        # their gradient per block; `take(w, i)` inside a fori_loop has a
        # dense stack-sized gradient per iteration, O(blocks^2) time
        # (benchmarks/README.md, "Depth scaling").
        (outputs, stacked, _), _ = ops.scan(body, (inputs, non_trainable, ops.convert_to_tensor(0, "int32")), trainable)
        if update:
            for variable, value in zip(self._stacked[num_trainable:], stacked):
                variable.assign(value)
        return outputs

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "block": keras.saving.serialize_keras_object(self._block),
            "prefixes": self.prefixes,
            "remat": self.remat,
            "seed": self.seed,
            "initial_values": self.initial_values,
        }


def _per_block_weights(model):
    """{unrolled layer name: [weights]} of a model in either form."""
    weights = {}
    for layer in model.layers:
        if isinstance(layer, RepeatedBlocks):
            slots = layer.slots()
            stacked = [keras.ops.convert_to_numpy(w.value) for w in layer._stacked]
            for j, prefix in enumerate(layer.prefixes):
                for (template_layer, k, _), values in zip(slots, stacked):
                    name = prefix + template_layer.name[len(layer.template_prefix):]
                    entry = weights.setdefault(name, [None] * len(template_layer.weights))
                    entry[k] = values[j]
        elif layer.weights:
            weights[layer.name] = layer.get_weights()
    return weights


def transfer_weights(source, target):
    """Copies every weight of `source` into `target`, the same architecture
    in the same or the other form (unrolled <-> looped)."""
    weights = _per_block_weights(source)
    used = set()

    def take(name):
        if name not in weights:
            raise ValueError(f"{target.name}: layer {name!r} has no counterpart in {source.name}")
        used.add(name)
        return weights[name]

    for layer in target.layers:
        if isinstance(layer, RepeatedBlocks):
            if not layer.built:
                raise ValueError(f"{layer.name} is not built; call the model once first")
            for variable, (template_layer, k, _) in zip(layer._stacked, layer.slots()):
                suffix = template_layer.name[len(layer.template_prefix):]
                variable.assign(np.stack([take(prefix + suffix)[k] for prefix in layer.prefixes]))
        elif layer.weights:
            layer.set_weights(take(layer.name))
    unused = sorted(set(weights) - used)
    if unused:
        raise ValueError(f"{source.name} has layers {unused[:5]} without counterpart in {target.name}")


def _replay(model, inputs, rename, tensors):
    """Calls fresh copies of `model`'s layers (renamed by `rename`) on
    `inputs`, in the model's topological order; returns its output."""
    for old, new in zip(model.inputs, keras.tree.flatten(inputs)):
        tensors[id(old)] = new
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        args = keras.tree.map_structure(lambda t: tensors[id(t)], layer.input)
        if isinstance(layer, RepeatedBlocks):
            x = args
            for prefix in layer.prefixes:
                x = _replay(layer.block, x, lambda n, p=prefix: p + n[len(layer.template_prefix):], tensors)
        else:
            x = layer.__class__.from_config({**layer.get_config(), "name": rename(layer.name)})(args)
        tensors[id(layer.output)] = x
    return keras.tree.map_structure(lambda t: tensors[id(t)], model.output)


def unroll(model):
    """The unrolled form of a model with `RepeatedBlocks` (the model itself if
    it has none): one layer per block layer, named as the unrolled
    constructor names them, with the same weights."""
    if not any(isinstance(layer, RepeatedBlocks) for layer in model.layers):
        return model
    inputs = [keras.Input(shape=t.shape[1:], dtype=t.dtype) for t in model.inputs]
    outputs = _replay(model, inputs, lambda name: name, {})
    unrolled = keras.Model(inputs if len(inputs) > 1 else inputs[0], outputs, name=model.name)
    transfer_weights(model, unrolled)
    return unrolled
