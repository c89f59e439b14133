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

#: The attention projections LoRA adapts by default, by the module names a family uses;
#: a transformers model with none of them gets peft's own default for its ``model_type``
#: (:func:`peft_default_targets`: GPT-2's ``c_attn``, NeoX's ``query_key_value``...).
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
    """The family's attention projections present in ``root`` (:data:`DEFAULT_TARGETS`),
    else peft's default for its ``config.model_type`` (those of them it holds)."""
    names = {name for name, _ in root.named_modules()}
    for targets in DEFAULT_TARGETS.values():
        if any(_names(n, targets[0]) for n in names):
            return targets
    model_type = getattr(getattr(root, "config", None), "model_type", None)
    peft_default = peft_default_targets(model_type)
    held = tuple(t for t in peft_default or () if any(_names(n, t) for n in names))
    if held:
        return held
    families = "; ".join(f"{k}: {','.join(v)}" for k, v in DEFAULT_TARGETS.items())
    if model_type is not None:
        families += f"; peft's default for model type {model_type!r}: " + (
            ",".join(peft_default) if peft_default else "none"
        )
    attention = _attention_linears(root)
    named = f"--lora.targets {','.join(attention)}" if attention else "--lora.targets NAMES"
    seen = f"; its attention's linear layers: {', '.join(attention)}" if attention else ""
    raise LoraError(
        f"{type(root).__name__} has none of the default LoRA targets ({families}){seen}; "
        f"name its modules with {named} or adapt every linear layer with "
        f"--lora.targets {ALL_LINEAR}"
    )


def peft_default_targets(model_type: str | None) -> tuple[str, ...] | None:
    """peft's default LoRA targets of a transformers ``model_type`` (what
    ``peft.get_peft_model`` adapts when ``target_modules`` is unset); None where peft
    has none."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    targets = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type)
    return tuple(targets) if targets else None


def _names(name: str, target: str) -> bool:
    """Whether module ``name`` is one a target ``target`` names (peft's rule)."""
    return name == target or name.endswith("." + target)


def _attention_linears(root: nn.Module, most: int = 4) -> list[str]:
    """The last names of the first ``most`` distinct linear layers inside an attention
    module of ``root`` (``qkv_proj``, ``o_proj``), what a refusal suggests to adapt."""
    found: list[str] = []
    for name, module in root.named_modules():
        leaf = name.rpartition(".")[2]
        inside = name[: -len(leaf)].lower()
        if _is_linear(module) and ("attn" in inside or "attention" in inside):
            if leaf not in found:
                found.append(leaf)
    return found[:most]


def _transposed(root: nn.Module, targets: Sequence[str]) -> bool:
    """Whether every module ``targets`` names in ``root`` is a transposed linear layer
    (transformers' ``Conv1D``), not an ``nn.Linear``."""
    named = [m for n, m in root.named_modules() if any(_names(n, t) for t in targets)]
    return bool(named) and not any(isinstance(m, nn.Linear) for m in named)


def _is_linear(module: nn.Module) -> bool:
    """An ``nn.Linear``, or transformers' ``Conv1D`` (GPT-2's transposed linear layer),
    which peft adapts too."""
    if isinstance(module, nn.Linear):
        return True
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return False
    return isinstance(module, Conv1D)


def apply_lora(model: nn.Module, spec: LoraSpec) -> nn.Module:
    """``model`` with LoRA adapters injected in place and every other parameter frozen;
    ``all-linear`` targets are chosen by peft and recorded by their full names."""
    peft = peft_module()
    root = lora_root(model)
    targets = spec.targets or default_targets(root)
    if targets != (ALL_LINEAR,):
        _check_targets(root, targets)
    # transformers' Conv1D (GPT-2) keeps its weight in x out: peft's fan_in_fan_out
    extra = {"fan_in_fan_out": True} if _transposed(root, targets) else {}
    config = peft_config(dataclasses.replace(spec, targets=tuple(targets)), **extra)
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
            if _names(name, target):
                found[target].append(module)
    missing = [t for t, mods in found.items() if not mods]
    if missing:
        raise LoraError(
            f"lora.targets: no module named {', '.join(missing)} in {type(root).__name__}; "
            "give the names of its linear layers (e.g. q_proj or to_q)"
        )
    wrong = [t for t, mods in found.items() if not all(_is_linear(m) for m in mods)]
    if wrong:
        raise LoraError(
            f"lora.targets: {', '.join(wrong)} in {type(root).__name__} is not an nn.Linear; "
            "LoRA adapts linear layers"
        )


def lora_parameter_names(model: nn.Module) -> list[str]:
    """Names of the adapters' parameters (what trains)."""
    return [n for n, _ in model.named_parameters() if ".lora_" in n]
