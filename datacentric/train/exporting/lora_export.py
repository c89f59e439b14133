"""LoRA adapters out of a run, in the formats their libraries load (``datacentric export``).

A run trained with ``[lora]`` holds the frozen base weights and the adapters (peft's
names: ``q_proj.base_layer.weight``, ``q_proj.lora_A.default.weight``, ...). Export
writes, by default, the adapters alone:

- a transformers model: a PEFT adapter folder (``adapter_config.json``,
  ``adapter_model.safetensors``) that ``PeftModel.from_pretrained(base, OUT)`` loads onto
  the base model the run started from, with the run's tokenizer files beside them (its
  ``--tokenizer``, else the model folder's; as transformers' ``Trainer`` saves a
  tokenizer beside an adapter), so ``AutoTokenizer.from_pretrained(OUT)`` gives the ids
  the adapters were trained on;
- a diffusers transformer: ``pytorch_lora_weights.safetensors``, keys prefixed with the
  pipeline component (``transformer.``), which a diffusers pipeline's
  ``load_lora_weights(OUT)`` loads, with ``adapter_config.json`` beside it. That loader
  reads no ``alpha`` from our files and runs every adapter at scale 1, so the trained
  scale ``alpha / rank`` is baked into ``lora_B`` (and ``adapter_config.json`` says
  ``lora_alpha = r``): the pipeline runs the trained model;
- any other model: ``adapter_model.safetensors`` with the adapters under the model's
  own names and ``adapter_config.json``.

``--merge`` folds every adapter into its base weight (``W + alpha / r * B @ A``, the
update peft's ``merge_and_unload`` applies) and exports the merged model as a model
trained without LoRA would be.

A layer whose weight is stored transposed, ``in x out`` (transformers' ``Conv1D``:
GPT-2's ``c_attn``), is adapted by peft with ``fan_in_fan_out``: its update is
``(B @ A)^T``, and the adapter folder says ``fan_in_fan_out: true`` (as
``peft.get_peft_model`` records it). Which layers are so is read off the model
(:func:`transposed_layers`), not guessed from shapes: a square layer's shapes say nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from datacentric.models.lora import ADAPTER, LoraSpec, peft_config

#: what a peft layer inserts into its base layer's names
BASE = ".base_layer."
ADAPTER_SEGMENT = f".{ADAPTER}."
#: file names of the three adapter formats
PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_CONFIG = "adapter_config.json"
DIFFUSERS_WEIGHTS = "pytorch_lora_weights.safetensors"


def lora_from_settings(settings: dict[str, Any]) -> LoraSpec | None:
    """The LoRA spec a run recorded (its ``[lora]`` section of ``{section: {field:
    value}}``, converted by :func:`~datacentric.models.model_args.lora_of`); ``None`` for a full
    fine-tune."""
    from datacentric.models.model_args import lora_of
    from datacentric.settings.sections import LoraConfig

    recorded = settings.get("lora", {})
    return lora_of(LoraConfig(**{k: v for k, v in recorded.items() if v is not None}))


def adapter_tensors(state: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """The adapters of a model state under ``prefix`` (removed), without peft's adapter
    name (``lora_A.default.weight`` -> ``lora_A.weight``, as peft and diffusers save them)."""
    out = {}
    for name, tensor in state.items():
        if ".lora_" in name and name.startswith(prefix):
            out[name[len(prefix) :].replace(ADAPTER_SEGMENT, ".")] = tensor.contiguous()
    if not out:
        raise ValueError("the checkpoint holds no LoRA adapter weights (lora_A / lora_B)")
    return out


def transposed_layers(model: nn.Module) -> frozenset[str]:
    """Full names (in ``model``) of the adapted layers whose base weight is stored ``in x
    out`` (peft's ``fan_in_fan_out``, which it sets for transformers' ``Conv1D``)."""
    return frozenset(
        name
        for name, module in model.named_modules(remove_duplicate=False)
        if getattr(module, "fan_in_fan_out", False) is True
    )


def merged_state(
    state: dict[str, torch.Tensor], spec: LoraSpec, transposed: frozenset[str] = frozenset()
) -> dict[str, torch.Tensor]:
    """The state with every adapter folded into its base layer: ``X.base_layer.weight +
    alpha / rank * X.lora_B @ X.lora_A`` (transposed for a layer ``X`` in ``transposed``,
    :func:`transposed_layers`) becomes ``X.weight`` (and ``X.base_layer.bias``
    ``X.bias``); the adapters are dropped."""
    scale = lora_scale(spec)
    merged = {}
    for name, tensor in state.items():
        if ".lora_" in name:
            continue
        if BASE not in name:
            merged[name] = tensor
            continue
        layer, _, leaf = name.partition(BASE)
        weight = tensor
        if leaf == "weight":
            a = state[f"{layer}.lora_A{ADAPTER_SEGMENT}weight"].double()
            b = state[f"{layer}.lora_B{ADAPTER_SEGMENT}weight"].double()
            update = (b @ a).T if layer in transposed else b @ a
            if update.shape != tensor.shape:
                raise ValueError(
                    f"{layer}: its LoRA update is {tuple(update.shape)} and its weight "
                    f"{tuple(tensor.shape)}; the model built does not match the checkpoint"
                )
            weight = (tensor.double() + scale * update).to(tensor.dtype)
        merged[f"{layer}.{leaf}"] = weight
    return merged


def scale_baked(
    tensors: dict[str, torch.Tensor], spec: LoraSpec
) -> tuple[dict[str, torch.Tensor], LoraSpec]:
    """``tensors`` with the scale ``alpha / rank`` folded into every ``lora_B`` (computed
    in float64), and the spec that describes them (``alpha = rank``: scale 1), for a
    loader that runs each adapter at scale 1 (a diffusers pipeline's
    ``load_lora_weights``). Unchanged when the scale is 1."""
    scale = lora_scale(spec)
    if scale == 1.0:
        return tensors, spec
    baked = {
        name: (t.double() * scale).to(t.dtype) if ".lora_B." in name else t
        for name, t in tensors.items()
    }
    return baked, dataclasses.replace(spec, alpha=float(spec.rank))


def lora_scale(spec: LoraSpec) -> float:
    """What an adapter's ``B A x`` is multiplied by: ``alpha / rank`` (``alpha`` defaults
    to the rank)."""
    return (spec.alpha if spec.alpha is not None else spec.rank) / spec.rank


def save_adapter_config(
    spec: LoraSpec, base: str, task_type: str | None, out: Path, fan_in_fan_out: bool = False
) -> None:
    """``adapter_config.json``, written by ``peft.LoraConfig`` itself."""
    config = peft_config(
        spec, task_type=task_type, base_model_name_or_path=base, fan_in_fan_out=fan_in_fan_out
    )
    config.save_pretrained(str(out))


def write_adapter(
    state: dict[str, torch.Tensor],
    spec: LoraSpec,
    kind: str,
    base: str,
    out: Path,
    transposed: frozenset[str] = frozenset(),
) -> int:
    """Write the adapters of ``state`` (the run's names) for a model of ``kind``
    (``hf``, ``diffusers``, else ours) into ``out``; returns how many values they hold.
    ``transposed`` (:func:`transposed_layers`): when every adapted layer is one, the
    config says ``fan_in_fan_out`` (peft's record of a GPT-2 ``c_attn`` adapter)."""
    from safetensors.torch import save_file

    adapted = {name.partition(".lora_A")[0] for name in state if ".lora_A." in name}
    fan_in_fan_out = bool(adapted) and adapted <= transposed

    if kind == "hf":
        tensors = {f"base_model.model.{k}": v for k, v in adapter_tensors(state, "hf.").items()}
        file, task = PEFT_WEIGHTS, "CAUSAL_LM"
    elif kind == "diffusers":
        tensors = {f"transformer.{k}": v for k, v in adapter_tensors(state, "transformer.").items()}
        tensors, spec = scale_baked(tensors, spec)
        file, task = DIFFUSERS_WEIGHTS, None
    else:
        tensors, file, task = adapter_tensors(state), PEFT_WEIGHTS, None
    save_file(tensors, str(out / file), metadata={"format": "pt"})
    save_adapter_config(spec, base, task, out, fan_in_fan_out)
    return sum(t.numel() for t in tensors.values())
