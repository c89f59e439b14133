"""Render prompts with a diffusers pipeline around a transformer being trained.

A validation render runs the family's own pipeline class (``model_index.json``'s
``_class_name``, a declared family's ``pipeline``: :mod:`~.diffusers_families`) loaded
from its folder with local files only and no code from the folder
(:func:`~.diffusers_encode.read_model_index` refuses a component of any other library),
its ``transformer`` replaced by the one being trained: its LoRA layers, attention
routing and weights are the run's, as they are now.

- :func:`check_render_pipeline`: before anything loads, the folder's pipeline is of the
  trained transformer's class and the requested size and frame count are ones the
  pipeline renders as asked (:class:`~.diffusers_encode.PipelineError` else);
  :func:`check_negative_prompt`: a prompt's negative prompt is one the pipeline uses;
- :func:`render`: one prompt, with a caller's generator (a fixed seed per prompt gives
  the same pixels on a rerun), as ``(frames, height, width, 3)`` ``uint8`` pixels (an
  image pipeline: one frame); a caller's ``stop`` ends it before the transformer's
  next block (a run's stop signal: its save must not wait for the render);
- :func:`render_size`: the size, frames and steps a render takes, the pipeline's
  defaults where the settings leave them unset.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from datacentric.models.diffusers_encode import (
    PipelineError,
    pipeline_encoding,
    pipeline_geometry,
    read_model_index,
)

WHERE = "validation.pipeline"
"""The setting that names a render pipeline folder (messages start with it)."""


@dataclass(frozen=True)
class RenderSettings:
    """What one render asks of the pipeline (``None``: the pipeline's own default)."""

    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    true_cfg_scale: float | None = None

    @classmethod
    def of(cls, section: Any) -> RenderSettings:
        """The settings of an object with these attributes (the ``[validation]`` section)."""
        return cls(**{key: getattr(section, key) for key in cls.__dataclass_fields__})

    def arguments(self) -> dict[str, Any]:
        """The pipeline's keyword arguments that are set."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def render_transformer(module: torch.nn.Module) -> torch.nn.Module:
    """The diffusers transformer a run's model holds (our adapter's ``transformer``),
    else ``ValueError`` naming the setting."""
    transformer = getattr(module, "transformer", None)
    if not hasattr(transformer, "save_pretrained"):
        raise ValueError(
            f"{WHERE}: the run's model ({type(module).__name__}) holds no diffusers "
            "transformer to render with (a diffusers:DIR model); leave it unset"
        )
    return transformer  # type: ignore[return-value]


def check_render_pipeline(
    folder: str | Path, transformer_class: str, settings: RenderSettings
) -> bool:
    """Check a render pipeline folder for a trained transformer of class
    ``transformer_class``; True for an image pipeline (one frame, ``.png``)."""
    index = read_model_index(folder, WHERE)
    name = index["_class_name"]
    entry = index.get("transformer")
    expected = entry[1] if isinstance(entry, list) and len(entry) == 2 else None
    if expected != transformer_class:
        raise PipelineError(
            f"{WHERE} {folder}: a {name} for a {expected}, and the run trains a "
            f"{transformer_class}; give the pipeline folder of the trained transformer's family"
        )
    images = pipeline_encoding(name).images
    temporal, multiple = pipeline_geometry(folder)
    for key in ("height", "width"):
        value = getattr(settings, key)
        if value is not None and value % multiple:
            raise PipelineError(
                f"validation.{key}: {value} is not a multiple of {multiple} ({name}'s VAE "
                f"down-sampling x its 2 x 2 patch); use {max(1, value // multiple) * multiple}"
            )
    takes = pipeline_arguments(name)
    if settings.true_cfg_scale is not None and takes is not None and "true_cfg_scale" not in takes:
        raise PipelineError(
            f"validation.true_cfg_scale: {name} has no true_cfg_scale (its guidance_scale "
            "is classifier-free guidance); leave it unset"
        )
    frames = settings.num_frames
    if frames is not None and images:
        raise PipelineError(f"validation.num_frames: {name} renders images; leave it unset")
    if frames is not None and (frames - 1) % temporal:
        raise PipelineError(
            f"validation.num_frames: {frames} is not 1 + a multiple of {temporal} ({name}'s "
            f"temporal compression); use {(frames - 1) // temporal * temporal + 1}"
        )
    return images


def pipeline_arguments(name: str) -> dict[str, Any] | None:
    """The keyword arguments diffusers' pipeline class ``name`` renders with, and their
    defaults (``None`` where it has none); ``None`` for a class diffusers does not ship
    (a declared family's own name: nothing is checked against it)."""
    import diffusers

    cls = getattr(diffusers, name, None)
    if cls is None:
        return None
    parameters = inspect.signature(cls.__call__).parameters
    empty = inspect.Parameter.empty
    return {k: None if p.default is empty else p.default for k, p in parameters.items()}


def check_negative_prompt(folder: str | Path, settings: RenderSettings) -> None:
    """Raise :class:`~.diffusers_encode.PipelineError` unless the folder's pipeline uses a
    negative prompt at ``settings``, by diffusers' rules: a pipeline that takes none;
    a distilled-guidance one (Flux, HunyuanVideo) uses it only with a ``true_cfg_scale``
    above 1, the others only with a ``guidance_scale`` above 1 (theirs by default)."""
    name = read_model_index(folder, WHERE)["_class_name"]
    takes = pipeline_arguments(name)
    if takes is None:
        return
    if "negative_prompt" not in takes:
        raise PipelineError(f"negative_prompt: {name} takes none; drop it from the line")
    key = "true_cfg_scale" if "true_cfg_scale" in takes else "guidance_scale"
    scale = getattr(settings, key)
    scale = takes.get(key) if scale is None else scale
    if isinstance(scale, int | float) and scale <= 1.0:
        kind = "true classifier-free" if key == "true_cfg_scale" else "classifier-free"
        raise PipelineError(
            f"negative_prompt: {name} uses it only with {kind} guidance, and {key} is "
            f"{scale}; set validation.{key} above 1 (e.g. 4.0) or drop it from the line"
        )


class _RenderStopped(Exception):
    """Raised before a transformer's forward to leave the pipeline's loop at once."""


def render(
    pipe: Any,
    prompt: str,
    settings: RenderSettings,
    generator: torch.Generator,
    *,
    negative_prompt: str | None = None,
    stop: Callable[[], bool] | None = None,
) -> np.ndarray | None:
    """``prompt`` rendered by ``pipe`` (its progress bar off): ``(F, H, W, 3)`` ``uint8``;
    ``negative_prompt`` passed when set (the pipeline's default else). ``stop``: asked
    before each forward of the pipeline's transformers and of their blocks; once it is
    True the render ends there and returns None, its latents never decoded. A block, not
    a denoising step: a step of classifier-free guidance is two forwards (of the tests'
    tiny Wan at its default size, 23 s each on one CPU thread), and diffusers' own
    ``interrupt`` skips the steps left but still runs the VAE (130 s more)."""
    pipe.set_progress_bar_config(disable=True)
    extra = {} if negative_prompt is None else {"negative_prompt": negative_prompt}
    arguments = {**settings.arguments(), **extra}

    def check(_module: torch.nn.Module, _args: Any) -> None:
        if stop is not None and stop():
            raise _RenderStopped

    hooks = [m.register_forward_pre_hook(check) for m in _stop_points(pipe)] if stop else []
    try:
        out = pipe(prompt=prompt, generator=generator, output_type="np", **arguments)
    except _RenderStopped:
        return None
    finally:
        for hook in hooks:
            hook.remove()
    frames = getattr(out, "frames", None)
    pixels = np.asarray(frames[0] if frames is not None else out.images[0][None])
    return (np.clip(pixels, 0.0, 1.0) * 255.0).round().astype(np.uint8)


def _stop_points(pipe: Any) -> list[torch.nn.Module]:
    """Where a render checks for a stop: the pipeline's transformers (Wan 2.2's second
    one too) and each block of their top-level module lists (``blocks``,
    ``transformer_blocks``, ``single_transformer_blocks``)."""
    models = [getattr(pipe, k, None) for k in ("transformer", "transformer_2")]
    points = []
    for model in (m for m in models if isinstance(m, torch.nn.Module)):
        points.append(model)
        for child in model.children():
            if isinstance(child, torch.nn.ModuleList):
                points.extend(child)
    return points


def render_size(name: str, settings: RenderSettings, *, images: bool) -> tuple[str, bool]:
    """What pipeline class ``name`` (``images``: an image pipeline) renders at
    ``settings`` (``64 x 64, 5 frames, 2 steps``: the settings, else the pipeline's own
    defaults, "its default" where it derives one), and whether any is its default."""
    takes = pipeline_arguments(name) or {}
    keys = ("height", "width", "num_frames", "num_inference_steps")
    if images:
        keys = tuple(k for k in keys if k != "num_frames")
    chosen = {k: getattr(settings, k) for k in keys}
    values = {k: takes.get(k, None) if v is None else v for k, v in chosen.items()}
    shown = {k: "its default" if v is None else str(v) for k, v in values.items()}
    text = f"{shown['height']} x {shown['width']}"
    if "num_frames" in shown:
        text += f", {shown['num_frames']} frames"
    text += f", {shown['num_inference_steps']} steps"
    return text, any(v is None for v in chosen.values())
