"""Where a transformers causal LM keeps its decoder layers: the one list of
``num_hidden_layers`` layers that becomes the model's ``blocks``
(:func:`decoder_layers`), the layout named where there is none (parallel stacks, stacks
run in recurrent cycles, several attention sublayers in one layer), and what makes a
layer a type of its own (:func:`_layer_signature`, for a small copy that keeps each).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from datacentric.models.hf_attention import UnsupportedModelFeature


def decoder_layers(hf_model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a ``*ForCausalLM``, wherever the architecture keeps them:
    the shallowest ``nn.ModuleList`` whose length is the config's layer count
    (``model.layers``, ``transformer.h``, ``gpt_neox.layers``, ...), which must be unique."""
    count = int(hf_model.config.num_hidden_layers)
    lists = [
        (name.count("."), name, m)
        for name, m in hf_model.named_modules()
        if isinstance(m, nn.ModuleList) and len(m) == count
    ]
    shallowest = [entry for entry in lists if entry[0] == min((e[0] for e in lists), default=0)]
    if len(shallowest) != 1:
        feature = _layer_layout(hf_model, count, [e[1] for e in shallowest])
        raise UnsupportedModelFeature(
            f"{type(hf_model).__name__}: {feature}, which data-centric parallel cannot run "
            "(it holds, prices and recomputes one list of num_hidden_layers decoder layers, "
            "a block each); use a causal LM whose decoder layers are one such list"
        )
    return shallowest[0][2]


def _layer_layout(hf_model: nn.Module, count: int, same_depth: list[str]) -> str:
    """The layer layout that keeps a model's decoder layers from being one list of
    ``num_hidden_layers`` (``count``) blocks, as a feature: parallel lists of ``count``
    layers (``same_depth``), stacks run in recurrent cycles (HRM), layers holding several
    attention sublayers each (LongCat-Flash), or layers kept outside any list."""
    if same_depth:
        return f"{len(same_depth)} parallel stacks of {count} layers ({', '.join(same_depth)})"
    stacks = [
        (name, m)
        for name, m in hf_model.named_modules()
        if isinstance(m, nn.ModuleList)
        and len(m)
        and all(type(layer).__name__.endswith(("Layer", "Block")) for layer in m)
    ]
    depth = min((name.count(".") for name, _ in stacks), default=0)
    stacks = [(name, m) for name, m in stacks if name.count(".") == depth]
    total = sum(len(m) for _, m in stacks)
    listed = ", ".join(f"{name} of {len(m)}" for name, m in stacks)
    if len(stacks) > 1 and count > total:
        return (
            f"layer stacks run in recurrent cycles ({listed}: num_hidden_layers={count} "
            f"layer calls of {total} layers)"
        )
    if len(stacks) == 1 and count % total == 0:
        inner = [
            f"{stacks[0][0]}.0.{name}, a list of {len(m)}"
            for name, m in stacks[0][1][0].named_children()
            if isinstance(m, nn.ModuleList) and ("attn" in name or "attention" in name)
        ]
        held = f"; {inner[0]}" if inner else ""
        return (
            f"decoder layers holding {count // total} layers each ({listed}, counted as "
            f"num_hidden_layers={count}{held}): several attention sublayers in one layer"
        )
    if stacks:
        return f"layer stacks ({listed}) that are not num_hidden_layers={count} layers"
    return f"decoder layers kept outside a module list (num_hidden_layers={count})"


def _layer_signature(config: Any, layer: nn.Module, index: int) -> tuple:
    """What makes decoder layer ``index`` a type of its own: its modules' classes and
    parameter shapes, and its entry of every per-layer list of the config
    (``layer_types``, ...)."""
    count = int(config.num_hidden_layers)
    per_layer = tuple(
        (key, repr(value[index]))
        for key, value in sorted(vars(config).items())
        if isinstance(value, (list, tuple)) and len(value) == count
    )
    modules = tuple((name, type(m).__name__) for name, m in layer.named_modules())
    shapes = tuple((name, tuple(p.shape)) for name, p in layer.named_parameters())
    return modules, shapes, per_layer
