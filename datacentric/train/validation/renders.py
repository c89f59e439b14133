"""Validation renders of diffusers models: the ``[validation]`` prompts through a pipeline.

:class:`PipelineSamples` renders each prompt of the ``prompts`` file with the
``pipeline`` folder's own pipeline class around the transformer being trained
(:mod:`datacentric.models.diffusers_render`), at each validation:

- prompts are spread over the ranks (prompt ``k`` on rank ``k % world``, alone, forward
  only: :func:`~datacentric.parallel.evaluate.each_prompt_alone`); each rank writes its
  prompts' files into the run folder, ``validation/step-N/PROMPT_ID.mp4`` (H.264 through
  PyAV, the ``video`` extra ``prepare`` reads clips with, at the ``fps`` setting) or
  ``.png`` for an image pipeline;
- each render's generator is seeded by the run's seed and the prompt only (or the
  prompt's own ``seed``: :func:`~datacentric.data.diffusion_draws.render_generator`),
  the same at every step and on a rerun: clips of one prompt differ only by what the
  model learned;
- a prompt's JSON line may set its own ``height``, ``width``, ``num_frames`` and
  ``negative_prompt`` (:mod:`datacentric.data.prompts`); the section's are the defaults;
- rank 0 writes ``validation/step-N/contact_sheet.png`` (a row per prompt: up to
  :data:`GRID_FRAMES` frames spread over the clip) and each record carries that row,
  the frame grid the TensorBoard image summary shows;
- rank 0 says before the first render what it renders (each prompt's size and frames,
  the steps) and, where the pipeline's defaults fill them in, which settings make it
  smaller;
- a stop signal ends the render under way before the transformer's next block and
  skips the prompts after it (nothing is written for them): the run's save does not wait.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from datacentric.data.diffusion_draws import render_generator
from datacentric.data.frame_sampling import even_frames
from datacentric.data.prompts import Prompt, read_prompts
from datacentric.log import quiet_loading
from datacentric.models.diffusers_encode import open_pipeline, read_model_index
from datacentric.models.diffusers_render import (
    WHERE,
    RenderSettings,
    check_negative_prompt,
    check_render_pipeline,
    render,
    render_size,
    render_transformer,
)
from datacentric.parallel.evaluate import each_prompt_alone
from datacentric.settings.sections import ValidationConfig

logger = logging.getLogger(__name__)

GRID_FRAMES = 4
"""Frames of a clip in its frame grid (the contact sheet's row, TensorBoard's image)."""

CONTACT_SHEET = "contact_sheet.png"

X264 = {"qp": "18", "threads": "1", "x264-params": "aq-mode=0:mbtree=0:psy=0"}
"""The encoder's settings: a constant quantiser, one thread (see :func:`write_pixels`)."""


@dataclass
class PipelineSamples:
    """The ``[validation]`` prompts rendered through its ``pipeline`` (see the module doc)."""

    prompts: list[Prompt]
    folder: str
    settings: RenderSettings
    fps: int
    seed: int
    out: Path
    images: bool | None = None
    """An image pipeline (``.png``), once :meth:`check` has read the folder."""
    _pipes: dict[int, Any] = field(default_factory=dict)
    _said: bool = False

    @classmethod
    def of(cls, validation: ValidationConfig, seed: int, out: Path) -> PipelineSamples | None:
        """The section's renders (None: no ``pipeline``)."""
        if validation.pipeline is None:
            return None
        settings = RenderSettings.of(validation)
        prompts = read_prompts(validation.prompts) if validation.prompts else []
        return cls(prompts, validation.pipeline, settings, validation.fps, seed, Path(out))

    def check(self, module: torch.nn.Module) -> None:
        """Raise ``ValueError`` unless the pipeline renders for ``module``'s transformer,
        at the section's settings and at each prompt's."""
        name = type(render_transformer(module)).__name__
        self.images = check_render_pipeline(self.folder, name, self.settings)
        for prompt in self.prompts:
            try:
                check_render_pipeline(self.folder, name, self.settings_of(prompt))
                if prompt.negative_prompt is not None:
                    check_negative_prompt(self.folder, self.settings)
            except ValueError as err:
                raise type(err)(f"prompt {prompt.index}: {err}") from None

    def written(self, step: int) -> bool:
        """Whether ``validation/step-N/`` holds every prompt's render after step ``step``
        and the contact sheet (a stop before the last render finished leaves some
        missing)."""
        folder = self.out / "validation" / f"step-{step}"
        names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
        rendered = all(f"{p.index}.mp4" in names or f"{p.index}.png" in names for p in self.prompts)
        return rendered and (not self.prompts or CONTACT_SHEET in names)

    def settings_of(self, prompt: Prompt) -> RenderSettings:
        """What ``prompt`` is rendered with: its own size and frames, else the section's."""
        own = {k: getattr(prompt, k) for k in ("height", "width", "num_frames")}
        return replace(self.settings, **{k: v for k, v in own.items() if v is not None})

    def run(
        self,
        dc: Any,
        step: int,
        *,
        autocast: AbstractContextManager | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Every prompt's render after step ``step`` (collective: every rank calls it; each
        gets every record: ``prompt_id``, ``prompt``, ``path``, ``grid``). Once ``stop()``
        is True (a stop signal) the render under way ends and no later prompt renders, on
        any rank (agreed before each round of prompts): the records are those rendered
        until then."""
        folder = self.out / "validation" / f"step-{step}"
        folder.mkdir(parents=True, exist_ok=True)
        device = dc.runtime.groups.device
        if dc.runtime.groups.rank == 0:
            self._say(dc.module, device)

        def one(module: torch.nn.Module, k: int) -> dict[str, Any] | None:
            prompt = self.prompts[k]
            if stop is not None and stop():
                return None
            generator = render_generator(self.seed, prompt.index, prompt.seed)
            with autocast or nullcontext():
                pixels = render(
                    self._pipeline(module, device),
                    prompt.text,
                    self.settings_of(prompt),
                    generator,
                    negative_prompt=prompt.negative_prompt,
                    stop=stop,
                )
            if pixels is None:
                return None
            path = folder / f"{prompt.index}{'.png' if self.images else '.mp4'}"
            write_pixels(path, pixels, self.fps)
            return {
                "prompt_id": prompt.index,
                "prompt": prompt.text,
                "path": str(path),
                "grid": frame_grid(pixels),
            }

        done = each_prompt_alone(dc.runtime, len(self.prompts), one, stop)
        records = [r for r in done if r is not None]
        if dc.runtime.groups.rank == 0 and records:
            contact_sheet([r["grid"] for r in records]).save(folder / CONTACT_SHEET)
        return records

    def _say(self, module: torch.nn.Module, device: torch.device) -> None:
        """Once, before the first render: what it renders, and how to render smaller
        where the pipeline's defaults fill the size, frames or steps in (a video
        pipeline's default, 480 x 832 x 81 frames for Wan, takes many minutes a prompt
        on a CPU)."""
        if self._said or not self.prompts:
            return
        self._said = True
        if self.images is None:
            self.check(module)
        name = read_model_index(self.folder, WHERE)["_class_name"]
        size, defaults = self._sizes(name)
        how = ""
        if defaults:
            keys = ["height", "width", "num_frames", "num_inference_steps"]
            keys = [f"validation.{k}" for k in keys if not (self.images and k == "num_frames")]
            how = f" (the pipeline's defaults; set {', '.join(keys)} to render smaller)"
        count = len(self.prompts)
        logger.info("validation renders %d prompt(s) at %s on %s%s", count, size, device.type, how)

    def _sizes(self, name: str) -> tuple[str, bool]:
        """What pipeline class ``name`` renders the prompts at, each at its own size and
        frames (``48 x 32, 5 frames, 2 steps``; ``...; ... (prompts 1, 2)`` where they
        differ), and whether the pipeline's defaults fill any of them in."""
        sizes: dict[str, list[int]] = {}
        defaults = False
        for prompt in self.prompts:
            settings = self.settings_of(prompt)
            size, default = render_size(name, settings, images=bool(self.images))
            sizes.setdefault(size, []).append(prompt.index)
            defaults = defaults or default
        if len(sizes) == 1:
            return next(iter(sizes)), defaults
        named = [
            f"{size} (prompt{'s' * (len(ids) > 1)} {', '.join(map(str, ids))})"
            for size, ids in sizes.items()
        ]
        return "; ".join(named), defaults

    def _pipeline(self, module: torch.nn.Module, device: torch.device) -> Any:
        """The pipeline around ``module``'s transformer (loaded once per module)."""
        key = id(module)
        if self.images is None:
            self.check(module)
        if key not in self._pipes:
            transformer = render_transformer(module)
            with quiet_loading():
                self._pipes[key] = open_pipeline(
                    self.folder, device, transformer=transformer, where=WHERE
                )
        return self._pipes[key]


def write_pixels(path: Path, pixels: np.ndarray, fps: int) -> Path:
    """``(F, H, W, 3)`` ``uint8`` pixels as ``path``: a PNG of the first frame, or an H.264
    MP4 (``yuv420p``, PyAV) at ``fps``; written beside and renamed (never half a file).

    The same pixels give the same file: x264 runs at a constant quantiser (:data:`X264`)
    on one thread. Under its default rate control (``crf``, adaptive quantisation,
    macroblock tree, psychovisual tuning) the same pixels, rendered mid-run on rank 1,
    decoded differently in 5 of 6 reruns; the frames are converted to YUV here
    (:func:`yuv420p`), not by the encoder's scaler."""
    from PIL import Image

    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".png":
        Image.fromarray(pixels[0]).save(tmp, format="PNG")
    else:
        import av

        with av.open(str(tmp), "w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=int(fps))
            stream.height, stream.width = (n + n % 2 for n in pixels.shape[1:3])
            stream.pix_fmt = "yuv420p"
            stream.options = dict(X264)
            stream.codec_context.thread_count = 1
            # every frame and its array alive until the encoder is flushed: it keeps frames
            # for its look-ahead after encode() returns
            planes = [yuv420p(frame) for frame in pixels]
            frames = [av.VideoFrame.from_ndarray(p, format="yuv420p") for p in planes]
            for frame in frames:
                container.mux(stream.encode(frame))
            container.mux(stream.encode())
    tmp.replace(path)
    return path


def yuv420p(rgb: np.ndarray) -> np.ndarray:
    """An ``(H, W, 3)`` RGB frame as the ``(3 H / 2, W)`` planes of ``yuv420p`` (BT.601,
    limited range, as ffmpeg's scaler converts by default; an odd side repeats its last
    row or column; chroma is the mean of each 2 x 2 block)."""
    rgb = np.pad(rgb, ((0, rgb.shape[0] % 2), (0, rgb.shape[1] % 2), (0, 0)), mode="edge")
    r, g, b = (rgb[..., c].astype(np.float64) for c in range(3))
    y = 16.0 + 0.256788 * r + 0.504129 * g + 0.097906 * b
    u = 128.0 - 0.148223 * r - 0.290993 * g + 0.439216 * b
    v = 128.0 + 0.439216 * r - 0.367788 * g - 0.071427 * b
    h, w = y.shape

    def half(plane: np.ndarray) -> np.ndarray:
        return plane.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3)).reshape(h // 4, w)

    planes = np.concatenate([y, half(u), half(v)])
    return np.clip(np.rint(planes), 0, 255).astype(np.uint8)


def frame_grid(pixels: np.ndarray) -> np.ndarray:
    """Up to :data:`GRID_FRAMES` frames spread over a clip, side by side: ``(H, W', 3)``."""
    picked = even_frames(len(pixels), min(GRID_FRAMES, len(pixels)))
    return np.concatenate([pixels[i] for i in picked], axis=1)


def contact_sheet(grids: list[np.ndarray]) -> Any:
    """The prompts' frame grids stacked top to bottom (black where a row is narrower), as
    a ``PIL.Image``."""
    from PIL import Image

    width = max(g.shape[1] for g in grids)
    rows = [np.pad(g, ((0, 0), (0, width - g.shape[1]), (0, 0))) for g in grids]
    return Image.fromarray(np.concatenate(rows, axis=0))
