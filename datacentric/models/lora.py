"""LoRA adapters on any model of ours, through ``peft`` (``pip install 'datacentric[lora]'``).

:func:`apply_lora` injects ``peft`` LoRA layers in place into the module that holds the
model's layers (a transformers model inside :class:`~datacentric.models.hf.HFCausalLM`,
the diffusers transformer inside a diffusers adapter, or a user's model itself) and
freezes every other parameter: only the adapters train, so they alone have gradients,
optimizer state and a gradient sync. The module tree keeps its names (``q_proj``
becomes a ``peft`` layer whose base weight is ``q_proj.base_layer.weight``), so our
attention routing, recomputation and sharding see the same blocks.

A model the user wrapped with ``peft.get_peft_model`` is unwrapped to the model it
adapts (:func:`unwrap_peft`): the ``PeftModel`` is a shell around the same parameters.

Dropout on the adapters' input (``dropout``) follows the model's dropout rule
(docs/huggingface.md, "Dropout"): it runs in training mode, recomputation replays it
exactly, and the equivalence checks run both sides in ``eval()`` mode.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence

import torch
from torch import nn

from datacentric.models.model_args import ALL_LINEAR, LoraError, LoraSpec, lora_spec

__all__ = ["ALL_LINEAR", "LoraError", "LoraSpec", "lora_spec"]  # defined in model_args

#: The attention projections LoRA adapts by default, by the module names a family uses.
DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "transformers": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "diffusers": ("to_q", "to_k", "to_v", "to_out.0"),
    "datacentric": ("wq", "wk", "wv", "wo"),  # our presets (llama, dit, their sizes)
}
ADAPTER = "default"
"""The peft adapter name our models carry."""


def peft_module():
    """The ``peft`` package, or one line saying how to install it."""
    try:
        return importlib.import_module("peft")
    except ImportError:
        raise LoraError("LoRA needs the 'peft' package: pip install 'datacentric[lora]'") from None


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (a shell around the model it adapts)."""
    return callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config")


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The model a ``peft.PeftModel`` adapts (its LoRA layers in place); other models as
    they are."""
    return model.get_base_model() if is_peft_model(model) else model


def lora_root(model: nn.Module) -> nn.Module:
    """The module LoRA is injected into: the wrapped transformers model (``.hf``), the
    wrapped diffusers transformer (``.transformer``), or the model itself."""
    for name in ("hf", "transformer"):
        inner = getattr(model, name, None)
        if isinstance(inner, nn.Module):
            return inner
    return model


def default_targets(root: nn.Module) -> tuple[str, ...]:
    """The family's attention projections present in ``root``."""
    names = {name for name, _ in root.named_modules()}
    for targets in DEFAULT_TARGETS.values():
        if any(n.endswith("." + targets[0]) or n == targets[0] for n in names):
            return targets
    families = "; ".join(f"{k}: {','.join(v)}" for k, v in DEFAULT_TARGETS.items())
    raise LoraError(
        f"{type(root).__name__} has none of the default LoRA targets ({families}); name its "
        "modules with --lora.targets NAMES"
    )


def apply_lora(model: nn.Module, spec: LoraSpec) -> nn.Module:
    """``model`` with LoRA adapters injected in place and every other parameter frozen;
    ``all-linear`` targets are chosen by peft and recorded by their full names."""
    peft = peft_module()
    root = lora_root(model)
    targets = spec.targets or default_targets(root)
    if targets != (ALL_LINEAR,):
        _check_targets(root, targets)
    config = peft_config(dataclasses.replace(spec, targets=tuple(targets)))
    peft.inject_adapter_in_model(config, root, adapter_name=ADAPTER)
    if targets == (ALL_LINEAR,):
        targets = adapted_modules(root)
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name)
    # what was injected, its targets resolved (export and the checks read it)
    model.lora_spec = dataclasses.replace(spec, targets=tuple(targets))
    return model


def adapted_modules(root: nn.Module) -> tuple[str, ...]:
    """Full names (in ``root``) of the modules peft put an adapter layer on."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return tuple(name for name, mod in root.named_modules() if isinstance(mod, BaseTunerLayer))


def peft_config(spec: LoraSpec, **extra: object):
    """The ``peft.LoraConfig`` of ``spec`` (its targets resolved); ``extra``: more of its
    fields (``task_type``, ``base_model_name_or_path``)."""
    return peft_module().LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha if spec.alpha is not None else spec.rank,
        lora_dropout=spec.dropout,
        target_modules=ALL_LINEAR if spec.targets == (ALL_LINEAR,) else list(spec.targets or ()),
        **extra,
    )


def draw_adapter_weights(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Give every adapter weight a seeded random value. peft starts ``B`` at zero, so
    the first step's ``A`` gradient is zero; an equivalence check draws both, so that
    every adapter gradient it compares is non-zero."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if ".lora_" in name:
                drawn = torch.randn(param.shape, generator=generator, dtype=torch.float64)
                param.copy_((drawn * std).to(param.dtype))


def _check_targets(root: nn.Module, targets: Sequence[str]) -> None:
    """Every target names a linear layer somewhere in ``root`` (peft would adapt none of
    a misspelled name silently when another target matches)."""
    found = {t: [] for t in targets}
    for name, module in root.named_modules():
        for target in targets:
            if name == target or name.endswith("." + target):
                found[target].append(module)
    missing = [t for t, mods in found.items() if not mods]
    if missing:
        raise LoraError(
            f"lora.targets: no module named {', '.join(missing)} in {type(root).__name__}; "
            "give the names of its linear layers (e.g. q_proj or to_q)"
        )
    wrong = [t for t, mods in found.items() if not all(isinstance(m, nn.Linear) for m in mods)]
    if wrong:
        raise LoraError(
            f"lora.targets: {', '.join(wrong)} in {type(root).__name__} is not an nn.Linear; "
            "LoRA adapts linear layers"
        )


def lora_parameter_names(model: nn.Module) -> list[str]:
    """Names of the adapters' parameters (what trains)."""
    return [n for n, _ in model.named_parameters() if ".lora_" in n]
