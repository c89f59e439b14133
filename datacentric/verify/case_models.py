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
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from datacentric.data import StdlibCorpus, SyntheticVideoDataset
from datacentric.data.base import Dataset
from datacentric.models.presets import build_model
from datacentric.shapes import SampleShape
from datacentric.verify.reference import (
    Reference,
    causal_lm_sample_loss,
    packed_model_sample_loss,
    unmodified_copy,
    video_sample_loss,
)

PRESETS = ("llama", "dit")
HF_PREFIX = "hf:"
DIFFUSERS_MODELS = ("diffusers:wan",)

# Latent grids (frames, rows, columns) of the DiT case: images and short clips.
_VIDEO_GRIDS = ((1, 4, 6), (2, 4, 4), (3, 4, 6), (1, 8, 8), (4, 4, 6), (2, 6, 8), (5, 4, 4))


def known_models() -> list[str]:
    """Names that need no code of the user's (``pkg.module:factory`` works too)."""
    names = list(PRESETS)
    try:
        from datacentric.models.hf import TINY_CONFIGS

        names += [HF_PREFIX + name for name in TINY_CONFIGS]
    except ImportError:  # transformers not installed
        pass
    if importlib.util.find_spec("diffusers") is not None:
        names += list(DIFFUSERS_MODELS)
    return names


def _text_corpus() -> StdlibCorpus:
    return StdlibCorpus(max_tokens=128, limit=60)


def _factory(name: str) -> Callable[[], Any]:
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"model {name!r}: cannot import {module_name!r} ({error})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"model {name!r}: {module_name} has no callable {attr!r}")
    return factory


def _wan_dataset(seed: int) -> Dataset:
    from datacentric.models.diffusers_video import TINY_WAN

    shapes = [SampleShape.video(*_VIDEO_GRIDS[i % len(_VIDEO_GRIDS)]) for i in range(64)]
    return SyntheticVideoDataset(
        shapes,
        channels=TINY_WAN["in_channels"],
        seed=seed,
        patch=tuple(TINY_WAN["patch_size"]),
        context_shape=(5, TINY_WAN["text_dim"]),
    )


def _preset_dataset(name: str, seed: int) -> Dataset:
    if name == "llama":
        return _text_corpus()
    shapes = [SampleShape.video(*_VIDEO_GRIDS[i % len(_VIDEO_GRIDS)]) for i in range(64)]
    return SyntheticVideoDataset(shapes, seed=seed)


def _factory_case(name: str) -> tuple[nn.Module, Dataset]:
    """Call the user's factory (after the caller seeded the RNG)."""
    made = _factory(name)()
    model, dataset = made if isinstance(made, tuple) else (made, None)
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"model {name!r}: the factory returned {type(model).__name__}, not a module"
        )
    if dataset is None:
        if getattr(model, "loss_mode", None) != "token":
            raise ValueError(
                f"model {name!r} is not a causal LM (loss_mode 'token'): return "
                "(model, dataset) from the factory"
            )
        dataset = _text_corpus()
    return model, dataset


def build_case(name: str, seed: int, dtype: torch.dtype) -> tuple[nn.Module, Dataset]:
    """The model (seeded weights) and dataset of the case ``name``."""
    torch.manual_seed(seed)  # the same initial weights on every rank and in the reference
    if name in PRESETS:
        return build_model(name, dtype=dtype), _preset_dataset(name, seed)
    if name.startswith(HF_PREFIX):
        from datacentric.models.hf import build_hf_model

        try:
            model = build_hf_model(name.removeprefix(HF_PREFIX), dtype=dtype)
        except KeyError as error:
            raise ValueError(str(error).strip("\"'")) from None
        return model, _text_corpus()
    if name in DIFFUSERS_MODELS:
        from datacentric.models.diffusers_video import build_wan

        return build_wan(dtype=dtype), _wan_dataset(seed)
    if ":" not in name:
        raise ValueError(
            f"no equivalence case for model {name!r}; choose one of "
            f"{', '.join(known_models())}, or pkg.module:factory"
        )
    model, dataset = _factory_case(name)
    return model.to(dtype=dtype), dataset


def build_reference(name: str, seed: int, dtype: torch.dtype) -> tuple[Reference, Dataset]:
    """The independent side of case ``name``: a fresh, unmodified model built from the
    same seed as :func:`build_case`'s (never the instance the distributed side wraps),
    with how one sample's loss is computed alone (:mod:`datacentric.verify.reference`).
    The model is in ``eval()`` mode: every dropout is off."""
    torch.manual_seed(seed)  # the same draws as build_case's
    if name in PRESETS:
        model = build_model(name, dtype=dtype)
        dataset = _preset_dataset(name, seed)
        reference = _packed_reference(model, dataset, f"{type(model).__name__}.forward")
    elif name.startswith(HF_PREFIX):
        from transformers import AutoModelForCausalLM

        from datacentric.models.hf import tiny_hf_config

        hf_model = AutoModelForCausalLM.from_config(
            tiny_hf_config(name.removeprefix(HF_PREFIX)), attn_implementation="sdpa"
        ).to(dtype=dtype)
        dataset = _text_corpus()
        reference = _causal_lm_reference(hf_model, dataset)
    elif name in DIFFUSERS_MODELS:
        from diffusers import WanTransformer3DModel

        from datacentric.models.diffusers_video import TINY_WAN

        transformer = WanTransformer3DModel(**TINY_WAN)
        if dtype != torch.float32:  # (diffusers warns about casting float32 modules)
            transformer = transformer.to(dtype=dtype)
        dataset = _wan_dataset(seed)
        reference = _video_reference(transformer, dataset, "transformer.")
    else:
        model, dataset = build_case(name, seed, dtype)  # a fresh call of the factory
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


def _causal_lm_reference(hf_model: nn.Module, dataset: Dataset) -> Reference:
    return Reference(
        module=hf_model,
        prefix="hf.",
        loss_mode="token",
        sample_loss=causal_lm_sample_loss(hf_model, dataset),
        description=(
            f"transformers {type(hf_model).__name__}.forward on each sample's input_ids "
            f"alone ({hf_model.config._attn_implementation} attention), cross-entropy of "
            "its logits"
        ),
    )


def _video_reference(transformer: nn.Module, dataset: Dataset, prefix: str) -> Reference:
    """The hook of a diffusers case: its unmodified transformer, one clip at a time."""
    from datacentric.models.diffusers_video import TIMESTEP_SCALE

    config = transformer.config
    return Reference(
        module=transformer,
        prefix=prefix,
        loss_mode="sample",
        sample_loss=video_sample_loss(
            transformer,
            dataset,
            channels=int(config.in_channels),
            patch=tuple(int(p) for p in config.patch_size),
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
    if kind == "HFCausalLM":
        inner = model.hf
        config = copy.deepcopy(inner.config)
        fresh = unmodified_copy(
            inner, lambda: type(inner)._from_config(config, attn_implementation="sdpa")
        )
        return _causal_lm_reference(fresh.to(dtype=next(inner.parameters()).dtype), dataset)
    if kind == "DiffusersVideoModel":
        inner = model.transformer
        fresh = unmodified_copy(inner, lambda: type(inner).from_config(inner.config))
        return _video_reference(
            fresh.to(dtype=next(inner.parameters()).dtype), dataset, "transformer."
        )
    return _packed_reference(model, dataset, f"{kind}.forward")


def num_blocks(model: nn.Module, name: str) -> int:
    """The model's block count (recomputation patterns have one entry per block)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise ValueError(f"model {name!r} has no .blocks: see docs/models.md for the contract")
    return len(blocks)
