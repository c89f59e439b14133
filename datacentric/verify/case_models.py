"""The models an equivalence case can name, and the small dataset each one runs on.

- ``llama``, ``dit``: our presets (stdlib chunks; synthetic video latents);
- ``hf:NAME``: a tiny random-weight transformers model, unmodified
  (:data:`datacentric.models.hf.TINY_CONFIGS`: ``hf:llama``, ``hf:mistral`` with a
  sliding window shorter than the samples, ``hf:qwen2`` with grouped K/V heads,
  ``hf:gpt2`` with learned positions);
- ``diffusers:NAME_OR_PATH``: a diffusers video transformer, unmodified, through the
  generic path (:mod:`datacentric.models.diffusers_generic`): a tiny random-weight
  ``diffusers:wan`` or ``diffusers:ltx``
  (:data:`datacentric.models.diffusers_build.TINY_DIFFUSERS`) or a local model folder,
  on synthetic latents with text embeddings (:func:`diffusers_dataset`);
- ``pkg.module:factory``: a user's own model. ``factory()`` returns the model, or
  ``(model, dataset)``; with a model alone, a causal LM (``loss_mode == "token"``)
  runs on stdlib chunks of byte tokens (vocabulary 256).

Every rank and the reference call the builder after seeding the global RNG, so they
hold the same weights.
"""

from __future__ import annotations

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

PRESETS = ("llama", "dit")
HF_PREFIX = "hf:"
DIFFUSERS_PREFIX = "diffusers:"
DIFFUSERS_MODELS = ("diffusers:wan", "diffusers:ltx")

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


def build_case(name: str, seed: int, dtype: torch.dtype) -> tuple[nn.Module, Dataset]:
    """The model (seeded weights) and dataset of the case ``name``."""
    torch.manual_seed(seed)  # the same initial weights on every rank and in the reference
    if name in PRESETS:
        model = build_model(name, dtype=dtype)
        if name == "llama":
            return model, _text_corpus()
        shapes = [SampleShape.video(*_VIDEO_GRIDS[i % len(_VIDEO_GRIDS)]) for i in range(64)]
        return model, SyntheticVideoDataset(shapes, seed=seed)
    if name.startswith(HF_PREFIX):
        from datacentric.models.hf import build_hf_model

        try:
            model = build_hf_model(name.removeprefix(HF_PREFIX), dtype=dtype)
        except KeyError as error:
            raise ValueError(str(error).strip("\"'")) from None
        return model, _text_corpus()
    if name.startswith(DIFFUSERS_PREFIX):
        from datacentric.models.diffusers_build import build_diffusers_model

        model = build_diffusers_model(name.removeprefix(DIFFUSERS_PREFIX), dtype=dtype)
        return model, diffusers_dataset(model, seed)
    if ":" not in name:
        raise ValueError(
            f"no equivalence case for model {name!r}; choose one of "
            f"{', '.join(known_models())}, or pkg.module:factory"
        )
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
    return model.to(dtype=dtype), dataset


def diffusers_dataset(model: nn.Module, seed: int, count: int = 64) -> SyntheticVideoDataset:
    """Synthetic latents and text embeddings (5 tokens) that a diffusers video model
    built by ``build_diffusers_model`` takes: its channels, its text width, clips of the
    equivalence grids (``count`` samples, deterministic in ``seed``)."""
    from datacentric.models.diffusers_build import text_width
    from datacentric.models.diffusers_generic import DATA_PATCH

    shapes = [SampleShape.video(*_VIDEO_GRIDS[i % len(_VIDEO_GRIDS)]) for i in range(count)]
    return SyntheticVideoDataset(
        shapes,
        channels=int(model.config.in_channels),
        seed=seed,
        patch=DATA_PATCH,
        context_shape=(5, text_width(model.config)),
    )


def num_blocks(model: nn.Module, name: str) -> int:
    """The model's block count (recomputation patterns have one entry per block)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise ValueError(f"model {name!r} has no .blocks: see docs/models.md for the contract")
    return len(blocks)
