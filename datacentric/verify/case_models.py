"""The models an equivalence case can name, and the small dataset each one runs on.

- ``llama``, ``dit``: our presets (stdlib chunks; synthetic video latents);
- ``hf:NAME``: a tiny random-weight transformers model, unmodified
  (:data:`datacentric.models.hf.TINY_CONFIGS`: ``hf:llama``, ``hf:mistral`` with a
  sliding window shorter than the samples, ``hf:qwen2`` with grouped K/V heads,
  ``hf:gpt2`` with learned positions);
- ``diffusers:wan``: a tiny random-weight diffusers ``WanTransformer3DModel``,
  unmodified (:mod:`datacentric.models.diffusers_video`), on synthetic latents with
  text embeddings;
- ``pkg.module:factory``: a user's own model. ``factory()`` returns the model, or
  ``(model, dataset)``; with a model alone, a causal LM (``loss_mode == "token"``)
  runs on stdlib chunks of byte tokens (vocabulary 256).

Every rank calls :func:`build_case` after seeding the global RNG, so they hold the same
weights. :func:`build_reference` builds the independent side of the check
(:mod:`datacentric.verify.reference`): a fresh, unmodified model from the same seed.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from datacentric.data import StdlibCorpus, SyntheticVideoDataset
from datacentric.data.base import Dataset
from datacentric.models.dit import VideoDiT
from datacentric.models.lora import LoraSpec, draw_adapter_weights
from datacentric.models.source import ModelSource, build_from_source, resolve_model, tiny_names
from datacentric.shapes import SampleShape
from datacentric.verify.reference import (
    Reference,
    causal_lm_sample_loss,
    packed_model_sample_loss,
    peft_copy,
    reference_lora_config,
    unmodified_copy,
    video_sample_loss,
)

PRESETS = ("llama", "dit")
HF_PREFIX = "hf:"
DIFFUSERS_PREFIX = "diffusers:"

# Latent grids (frames, rows, columns) of the DiT case: images and short clips.
_VIDEO_GRIDS = ((1, 4, 6), (2, 4, 4), (3, 4, 6), (1, 8, 8), (4, 4, 6), (2, 6, 8), (5, 4, 4))
# Image grids of several sizes (aspect-ratio buckets) for an image model (Flux).
_IMAGE_GRIDS = ((1, 4, 6), (1, 4, 4), (1, 6, 4), (1, 8, 8), (1, 3, 5), (1, 6, 8), (1, 5, 5))


def known_models() -> list[str]:
    """Names that need no code of the user's (``pkg.module:factory`` and model folders
    work too)."""
    names = list(PRESETS)
    names += [HF_PREFIX + name for name in tiny_names("hf")]
    names += [DIFFUSERS_PREFIX + name for name in tiny_names("diffusers")]
    return names


def _text_corpus() -> StdlibCorpus:
    return StdlibCorpus(max_tokens=128, limit=60)


def _video_shapes(count: int = 64, grids: tuple = _VIDEO_GRIDS) -> list[SampleShape]:
    return [SampleShape.video(*grids[i % len(grids)]) for i in range(count)]


def small_dataset(model: nn.Module, seed: int = 0) -> Dataset:
    """A small dataset ``model`` takes, the one ``datacentric equivalence`` runs it on:
    byte-token stdlib chunks for a causal LM (``loss_mode == "token"``), synthetic
    latents with text embeddings of its width for a wrapped diffusers model, synthetic
    video latents for our ``VideoDiT``. Raises ``ValueError`` for any other model."""
    inner = getattr(model, "module", model)  # a DDP wrapper keeps it as .module
    if hasattr(getattr(inner, "transformer", None), "save_pretrained"):  # diffusers
        return diffusers_dataset(model, seed)
    if getattr(inner, "loss_mode", None) == "token":
        return _text_corpus()
    if isinstance(inner, VideoDiT):
        return SyntheticVideoDataset(_video_shapes(), seed=seed)
    raise ValueError(
        f"{type(inner).__name__} is neither a causal LM (loss_mode 'token'), a diffusers "
        "model nor a VideoDiT: give it a dataset of your own (docs/data.md)"
    )


def _case_dataset(source: ModelSource, model: nn.Module, seed: int) -> Dataset:
    """The small dataset a case runs on (:func:`small_dataset`); a factory's model that
    is not a causal LM must bring its own."""
    if source.kind in ("diffusers", "preset") or getattr(model, "loss_mode", None) == "token":
        return small_dataset(model, seed)
    raise ValueError(
        f"model {source.name!r} is not a causal LM (loss_mode 'token'): return "
        "(model, dataset) from the factory"
    )


def diffusers_dataset(model: nn.Module, seed: int, count: int = 64) -> Dataset:
    """Synthetic latents and text embeddings (5 tokens) that a diffusers video model
    built by :func:`~datacentric.models.diffusers_build.build_diffusers_model` takes:
    its latent channels, its text width, clips of the equivalence grids (images of
    several sizes for a model that takes images)."""
    from datacentric.models.diffusers_build import diffusers_model_of, text_width
    from datacentric.models.diffusers_generic import DATA_PATCH

    config = diffusers_model_of(model).config
    inner = getattr(model, "module", model)
    images = getattr(inner, "layout", None) == "tokens"
    return SyntheticVideoDataset(
        _video_shapes(count, _IMAGE_GRIDS if images else _VIDEO_GRIDS),
        channels=int(getattr(inner, "channels", config.in_channels)),
        seed=seed,
        patch=DATA_PATCH,
        context_shape=(5, text_width(config)),
    )


def build_case(
    name: str,
    seed: int,
    dtype: torch.dtype,
    model_args: Mapping[str, Any] | None = None,
    lora: LoraSpec | None = None,
) -> tuple[nn.Module, Dataset]:
    """The model (seeded weights) and dataset of the case ``name``
    (:func:`~datacentric.models.source.resolve_model`: a preset, ``hf:``/``diffusers:``
    a tiny name or a folder, ``pkg.module:factory``); ``model_args`` are the model's
    keyword arguments (``--model-arg``); ``lora``: adapters injected, their weights
    drawn at random (:func:`~datacentric.models.lora.draw_adapter_weights`)."""
    torch.manual_seed(seed)  # the same initial weights on every rank and in the reference
    source = dataclasses.replace(resolve_model(name, model_args), lora=lora)
    model, dataset = build_from_source(source, dtype=dtype)
    if lora is not None:
        draw_adapter_weights(model, seed)
    if dataset is None:
        dataset = _case_dataset(source, model, seed)
    return model, dataset


def build_reference(
    name: str,
    seed: int,
    dtype: torch.dtype,
    model_args: Mapping[str, Any] | None = None,
    lora: LoraSpec | None = None,
) -> tuple[Reference, Dataset]:
    """The independent side of case ``name``: a fresh, unmodified model built from the
    same seed as :func:`build_case`'s (never the instance the distributed side wraps),
    with how one sample's loss is computed alone (:mod:`datacentric.verify.reference`).
    An adapter of ours (Hugging Face, diffusers) is replaced by a fresh instance of the
    model it wraps, holding the same weights. The model is in ``eval()`` mode: every
    dropout is off."""
    model, dataset = build_case(name, seed, dtype, model_args, lora)  # a fresh build
    reference = _factory_reference(model, dataset)
    reference.module.eval()
    return reference, dataset


def _packed_reference(model: nn.Module, dataset: Dataset, what: str) -> Reference:
    return Reference(
        module=model,
        prefix="",
        loss_mode=model.loss_mode,
        sample_loss=packed_model_sample_loss(model, dataset),
        description=f"{what} on each sample alone, with the attention it was built with",
    )


def _causal_lm_reference(
    hf_model: nn.Module, dataset: Dataset, peft_model: nn.Module | None = None
) -> Reference:
    """``peft_model``: a ``peft.PeftModel`` adapting ``hf_model``, whose own forward runs."""
    router = getattr(hf_model.config, "output_router_logits", False)
    return Reference(
        module=hf_model,
        prefix="hf.",
        loss_mode="token",
        sample_loss=causal_lm_sample_loss(peft_model or hf_model, dataset),
        description=(
            f"transformers {type(hf_model).__name__}.forward on each sample's input_ids "
            f"alone ({hf_model.config._attn_implementation} attention), cross-entropy of "
            "its logits"
            + (" plus its own router auxiliary loss" if router else "")
            + (" (LoRA by peft.get_peft_model)" if peft_model is not None else "")
        ),
    )


def _video_reference(transformer: nn.Module, dataset: Dataset, prefix: str) -> Reference:
    """The hook of a diffusers case: its unmodified transformer, one clip at a time."""
    from datacentric.models.diffusers_generic import DATA_PATCH
    from datacentric.models.diffusers_video import TIMESTEP_SCALE

    config = transformer.config
    return Reference(
        module=transformer,
        prefix=prefix,
        loss_mode="sample",
        sample_loss=video_sample_loss(
            transformer,
            dataset,
            channels=int(getattr(dataset, "channels", config.in_channels)),
            patch=DATA_PATCH,
            timestep_scale=TIMESTEP_SCALE,
        ),
        description=(
            f"diffusers {type(transformer).__name__}.forward on each clip alone, squared "
            "error against the velocity"
        ),
    )


def _factory_reference(model: nn.Module, dataset: Dataset) -> Reference:
    """A factory's model: an adapter we provide is replaced by a fresh instance of the
    model it wraps (the adapter patched the one it holds); anything else is the fresh
    model the factory just returned, run through its own forward."""
    kind = type(model).__name__
    lora = getattr(model, "lora_spec", None)
    if kind == "HFCausalLM":
        inner = model.hf
        config = copy.deepcopy(inner.config)

        def build() -> nn.Module:  # eager where the class has no SDPA path (Gemma2)
            own = "sdpa" if getattr(type(inner), "_supports_sdpa", False) else "eager"
            return type(inner)._from_config(config, attn_implementation=own)

        dtype = next(inner.parameters()).dtype
        if lora is not None:
            wrapped = peft_copy(inner, build, lora).to(dtype=dtype)
            return _causal_lm_reference(wrapped.get_base_model(), dataset, wrapped)
        return _causal_lm_reference(unmodified_copy(inner, build).to(dtype=dtype), dataset)
    if kind in ("DiffusersVideoModel", "DiffusersVideoTransformer"):
        inner = model.transformer
        fresh = unmodified_copy(inner, lambda: _diffusers_fresh(inner, lora))
        return _video_reference(
            fresh.to(dtype=next(inner.parameters()).dtype), dataset, "transformer."
        )
    return _packed_reference(model, dataset, f"{kind}.forward")


def _diffusers_fresh(inner: nn.Module, lora: LoraSpec | None) -> nn.Module:
    """A fresh diffusers transformer of ``inner``'s config; with ``lora``, adapted the way
    diffusers users do it (``add_adapter``, peft underneath)."""
    fresh = type(inner).from_config(inner.config)
    if lora is not None:
        fresh.add_adapter(reference_lora_config(lora))
    return fresh


def num_blocks(model: nn.Module, name: str) -> int:
    """The model's block count (recomputation patterns have one entry per block)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise ValueError(f"model {name!r} has no .blocks: see docs/models.md for the contract")
    return len(blocks)
