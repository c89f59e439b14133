"""Encode frames and captions with a diffusers pipeline's own VAE and text encoders, into
the files ``latents:DIR`` reads for its family.

:func:`open_pipeline` reads a pipeline folder (``model_index.json``) with
``local_files_only`` and without its transformer; every component must be a class that
diffusers or transformers ship (a component naming any other library would import code
from the folder, so it is refused before anything loads). :class:`PipelineEncoder` then
does what the pipeline does before denoising, and nothing else:

- frames: the pipeline's own processor (``video_processor.preprocess_video``, Flux's
  ``image_processor.preprocess``) resizes and centre-crops them (``resize_mode="crop"``)
  and scales them to [-1, 1];
- latents: the VAE's ``encode`` and its distribution's mode, normalised as the family's
  pipeline normalises them (the family's ``encoding``, :mod:`~.diffusers_families`),
  stored ``frames x channels x height x width``;
- text: the pipeline's own ``encode_prompt`` with its ``__call__``'s
  ``max_sequence_length``; Wan and SkyReels-V2 store its embeddings ``L x D`` as it pads
  them; HunyuanVideo and Flux ``(1 + L) x D``, row 0 the pooled projection (zeros after
  it), the rows its attention mask drops set to zero (HunyuanVideo).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from datacentric.models.diffusers_families import (
    FAMILIES,
    FamilyView,
    PipelineFamily,
    family_of_pipeline,
)
from datacentric.models.source import pickled_only
from datacentric.regular_files import read_json_file

ALLOWED_LIBRARIES = ("diffusers", "transformers")


class PipelineError(ValueError):
    """A pipeline folder that ``prepare`` cannot read: the message says why and the fix."""


PIPELINES: Mapping[str, PipelineFamily] = FamilyView(
    lambda family: (family.pipeline, family.encoding) if family.pipeline else None
)
"""Pipelines ``prepare`` encodes for, by diffusers class name: a view of the families'
``pipeline`` and ``encoding`` (:mod:`~.diffusers_families`)."""


def pipeline_encoding(name: str) -> PipelineFamily:
    """How the pipeline class ``name`` encodes (``KeyError`` for one no family declares)."""
    family = family_of_pipeline(name)
    if family is None or family.encoding is None:
        raise KeyError(name)
    return family.encoding


def pipeline_names() -> list[str]:
    """The pipeline classes the declared families name, in declaration order."""
    return [f.pipeline for f in FAMILIES.values() if f.pipeline is not None]


def read_model_index(folder: str | Path, where: str = "--pipeline") -> dict[str, Any]:
    """``model_index.json`` of a pipeline folder, checked: a known pipeline class, and
    every component a diffusers or transformers class (:class:`PipelineError` else, its
    message starting with ``where``, the setting that named the folder)."""
    path = Path(folder).expanduser() / "model_index.json"
    if not path.is_file():
        raise PipelineError(
            f"{where} {folder}: no model_index.json (a diffusers pipeline folder, as "
            "save_pretrained writes it)"
        )
    try:
        index = read_json_file(path, error=PipelineError)
    except (PipelineError, OSError) as err:
        raise PipelineError(f"{where} {err}") from None
    name = index.get("_class_name")
    if not isinstance(name, str) or name not in pipeline_names():
        raise PipelineError(
            f"{where} {path}: _class_name is {str(name)[:80]!r}, not a pipeline datacentric "
            f"reads; it takes {', '.join(pipeline_names())} folders"
        )
    for key, value in index.items():
        if key.startswith("_") or not isinstance(value, list) or not value or value[0] is None:
            continue
        if len(value) != 2 or not all(isinstance(part, str) for part in value):
            raise PipelineError(
                f"{where} {path}: component {key} is {str(value)[:80]}, not [library, class] "
                "as save_pretrained writes it"
            )
        if value[0] not in ALLOWED_LIBRARIES:
            raise PipelineError(
                f"{where} {path}: component {key} is {value[0]}.{value[1]}: only diffusers "
                "and transformers classes load (other code in the folder never runs)"
            )
        pickled = pickled_only(path.parent / key)
        if pickled:
            raise PipelineError(
                f"{where} {path.parent / key}: the {key} has only pickled weights "
                f"({pickled[0].name}), which can run code when read; save it as safetensors "
                "(save_pretrained(..., safe_serialization=True))"
            )
    return index


def open_pipeline(
    folder: str | Path,
    device: str | torch.device = "cpu",
    *,
    transformer: torch.nn.Module | None = None,
    where: str = "--pipeline",
) -> Any:
    """The pipeline of ``folder`` on ``device``, in eval mode: without its transformer, or
    with ``transformer`` in its place (a model already placed, left where and as it is);
    ``where`` names the setting that named the folder in messages."""
    import diffusers

    index = read_model_index(folder, where)
    cls = getattr(diffusers, index["_class_name"])
    given = {"transformer": transformer} if "transformer" in index else {}
    try:
        pipe = cls.from_pretrained(str(Path(folder).expanduser()), local_files_only=True, **given)
    except (OSError, ValueError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PipelineError(f"{where} {folder}: cannot load ({first})") from None
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module) and module is not transformer:
            module.to(device)
            module.eval()
    return pipe


def pipeline_geometry(folder: str | Path) -> tuple[int, int]:
    """``(temporal, multiple)`` of a pipeline folder, from its VAE's config: frames per
    latent frame after the first (1 for images), and the pixels a size is a multiple of
    (the VAE's spatial down-sampling x the transformer's 2 x 2 patch)."""
    index = read_model_index(folder)
    family = pipeline_encoding(index["_class_name"])
    path = Path(folder).expanduser() / "vae" / "config.json"
    try:
        config = read_json_file(path, error=PipelineError)
    except OSError as err:
        raise PipelineError(f"{path}: the VAE's config is unreadable ({err})") from None
    try:
        return _vae_geometry(config, family)
    except (TypeError, ValueError, OverflowError) as err:
        raise PipelineError(
            f"{path}: the VAE's config holds no usable compression ratios ({err})"
        ) from None


def _vae_geometry(config: dict[str, Any], family: PipelineFamily) -> tuple[int, int]:
    if family.images:
        return 1, 2 ** (len(config.get("block_out_channels", [0] * 4)) - 1) * 2
    if "temporal_compression_ratio" in config or "spatial_compression_ratio" in config:
        return int(config.get("temporal_compression_ratio", 4)), 2 * int(
            config.get("spatial_compression_ratio", 8)
        )
    temporal = config.get("scale_factor_temporal") or 2 ** sum(
        config.get("temperal_downsample", [False, True, True])
    )
    spatial = config.get("scale_factor_spatial") or 8
    return int(temporal), 2 * int(spatial)


def text_length(folder: str | Path) -> int:
    """The pipeline's own ``max_sequence_length`` (its ``__call__``'s default)."""
    import diffusers

    cls = getattr(diffusers, read_model_index(folder)["_class_name"])
    return int(inspect.signature(cls.__call__).parameters["max_sequence_length"].default)


class CaptionLength:
    """Counts a caption's tokens in the tokenizer whose length the pipeline caps
    (loaded alone: a transformers class from ``model_index.json``, local files only)."""

    def __init__(self, folder: str | Path, limit: int | None = None) -> None:
        import transformers

        index = read_model_index(folder)
        name = pipeline_encoding(index["_class_name"]).length_tokenizer
        library, cls_name = index[name]
        cls = getattr(transformers, cls_name, None) if library == "transformers" else None
        if cls is None:
            raise PipelineError(f"--pipeline {folder}: tokenizer {library}.{cls_name} is unknown")
        sub = Path(folder).expanduser() / name
        self.tokenizer = cls.from_pretrained(str(sub), local_files_only=True)
        self.limit = int(limit or text_length(folder))

    def __call__(self, caption: str) -> int:
        """Tokens of ``caption`` (special tokens included), never truncated."""
        return len(self.tokenizer(caption, truncation=False)["input_ids"])


class PipelineEncoder:
    """One pipeline's latents and text files (see the module docstring)."""

    def __init__(
        self, pipe: Any, *, max_text_tokens: int | None = None, vae_tiling: bool = False
    ) -> None:
        self.pipe = pipe
        self.family = pipeline_encoding(type(pipe).__name__)
        default = inspect.signature(type(pipe).__call__).parameters["max_sequence_length"].default
        self.max_text_tokens = int(max_text_tokens or default)
        if vae_tiling:
            pipe.vae.enable_tiling()

    def pixels(self, frames: list[Any], height: int, width: int) -> torch.Tensor:
        """Frames (``PIL.Image``) as the pipeline preprocesses them: ``(1, 3, F, H, W)``
        in [-1, 1] (an image pipeline: ``(1, 3, H, W)``)."""
        if self.family.images:
            return self.pipe.image_processor.preprocess(
                frames[0], height=height, width=width, resize_mode="crop"
            )
        return self.pipe.video_processor.preprocess_video(
            frames, height=height, width=width, resize_mode="crop"
        )

    @torch.no_grad()
    def latent(self, pixels: torch.Tensor) -> torch.Tensor:
        """The VAE's mode of ``pixels``, normalised as the pipeline does, ``(F, C, H, W)``."""
        vae = self.pipe.vae
        z = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist.mode()
        shift, scale = self._normalisation(z)
        return _frames_first((z - shift) * scale)

    @torch.no_grad()
    def latent_distribution(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's Gaussian of ``pixels`` in the pipeline's normalised units, ``(F, C, H,
        W)`` each: its mean (the :meth:`latent`) and log-variance (the VAE's, clamped to
        [-30, 20] as diffusers' ``DiagonalGaussianDistribution`` does, plus ``2 log
        scale``), so ``mean + exp(logvar / 2) * eps`` is a normalised sample."""
        vae = self.pipe.vae
        dist = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist
        shift, scale = self._normalisation(dist.mean)
        logvar = dist.logvar + 2.0 * torch.log(torch.as_tensor(scale).to(dist.mean))
        return _frames_first((dist.mean - shift) * scale), _frames_first(logvar)

    def _normalisation(self, z: torch.Tensor) -> tuple[Any, Any]:
        """``(shift, scale)`` of the pipeline's normalisation, ``(z - shift) * scale``."""
        config = self.pipe.vae.config
        if self.family.normalise == "mean_std":
            shape = (1, -1) + (1,) * (z.ndim - 2)
            mean = torch.tensor(config.latents_mean).view(shape).to(z)
            return mean, 1.0 / torch.tensor(config.latents_std).view(shape).to(z)
        if self.family.normalise == "shift_scale":
            return config.shift_factor, config.scaling_factor
        return 0.0, config.scaling_factor

    @torch.no_grad()
    def text(self, caption: str) -> torch.Tensor:
        """The pipeline's ``encode_prompt`` of ``caption`` in the family's layout."""
        method = self.pipe.encode_prompt
        accepted = inspect.signature(method).parameters
        wanted = {
            "prompt": [caption],
            "do_classifier_free_guidance": False,
            "max_sequence_length": self.max_text_tokens,
            "device": self.pipe.vae.device,
        }
        out = method(**{k: v for k, v in wanted.items() if k in accepted})
        parts = dict(zip(self.family.text, out if isinstance(out, tuple) else (out,)))
        embeds = parts["embeds"][0].float()
        if "mask" in parts:
            embeds = embeds * parts["mask"][0].to(embeds).unsqueeze(-1)
        if "pooled" in parts:
            pooled = parts["pooled"][0].float()
            if pooled.numel() > embeds.shape[1]:
                raise PipelineError(
                    f"pooled projection of {pooled.numel()} values is wider than the "
                    f"text's {embeds.shape[1]}: row 0 of the text file cannot hold it"
                )
            row = embeds.new_zeros(1, embeds.shape[1])
            row[0, : pooled.numel()] = pooled
            embeds = torch.cat([row, embeds])
        return embeds.cpu().contiguous()


def _frames_first(z: torch.Tensor) -> torch.Tensor:
    """A VAE batch of one, ``(1, C, F, H, W)`` or ``(1, C, H, W)``, as ``(F, C, H, W)``
    float32 on the CPU."""
    z = z[0].float().cpu()
    return z.unsqueeze(0) if z.ndim == 3 else z.permute(1, 0, 2, 3).contiguous()
