"""Precomputed video latents from a folder or a manifest, loaded lazily.

- Source ``latents:DIR``: ``DIR/manifest.jsonl`` if present (one JSON object per line:
  ``{"latent": PATH, "text": PATH}``, paths relative to the manifest, ``text``
  optional), else every ``.npy``/``.safetensors``/``.pt`` file below ``DIR`` (sorted).
  ``latents:FILE.jsonl`` reads that manifest. A latent ``NAME.EXT`` may have a text
  embedding ``NAME.text.EXT`` beside it (such files are never latents themselves). The
  listing and the files are read by :mod:`datacentric.data.latent_files`.
- A latent is ``frames x channels x height x width`` (latent pixels); all share
  ``channels``. Only headers are read up front.
- Shapes: without a bucket config a sample keeps its own size; with one
  (:mod:`datacentric.data.bucket_config`) it is cropped to its bucket's. Either way the
  height and width are padded with zeros to whole 1 x 2 x 2 patches.
- Prepared latents (a manifest line with ``frames``, the pixel frames ``prepare``
  encoded, and ``bucket``): a bucket's frames are pixel frames with the VAE's own
  latent-frame rule (``(frames - 1) // temporal + 1``, ``temporal`` read from the
  sample's pixel and latent frames). A sample whose ``bucket`` the config has stays
  in it whole (its keep probability was drawn by ``prepare``); otherwise it is assigned
  by that rule, and a bucket that would train fewer latent frames than were prepared
  is a :class:`~datacentric.data.base.DataError` naming the bucket and the sample
  (raised when the dataset opens, before ranks start): a prepared latent is never cut
  to a window. Other latents follow Open-Sora (``frames * 5 // 17`` latent frames).
- Per epoch, from a generator seeded by ``(seed, sample id, epoch)``: the diffusion time
  ``t``, the noise, then the first frame of the clip when the latent has more frames
  than its bucket (spatial crops are centred), then whether the caption is dropped
  (``[training] timestep_sampling`` and ``caption_dropout``:
  :mod:`datacentric.data.diffusion_draws`). A dropped caption trains on the folder's
  ``empty_prompt.text.safetensors``. A manifest line with ``logvar`` (``prepare
  --latent-dist sample``) holds the VAE's mean and log-variance: each epoch's latent is
  then drawn from them, last, with the same generator. Packing follows rectified flow, as for
  :class:`~datacentric.data.video.SyntheticVideoDataset`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from datacentric.batch import PackedBatch
from datacentric.data.base import DataError, check_sample_ids, sample_generator
from datacentric.data.bucket_config import BucketConfig, prepared_bucket
from datacentric.data.diffusion_draws import DiffusionDraws, sample_latent
from datacentric.data.latent_files import (
    as_float_tensor,
    open_latent,
    read_latent_listing,
    read_shape,
)
from datacentric.data.video import (
    PATCH,
    VideoSample,
    draw_time_and_noise,
    pack_video_samples,
    patchify,
)
from datacentric.shapes import SampleShape

EMPTY_PROMPT = "empty_prompt.text.safetensors"
"""The pipeline's embedding of the empty prompt, beside the manifest (``prepare`` writes
it): what a sample whose caption ``caption_dropout`` drops trains on."""


class LatentDataset:
    """Video latents from files; sample ids follow the listing (skipped latents removed)."""

    def __init__(
        self,
        source: str,
        *,
        bucket_config: str | None = None,
        seed: int = 0,
        limit: int | None = None,
        patch: tuple[int, int, int] = PATCH,
        draws: DiffusionDraws | None = None,
    ) -> None:
        self.source, self.seed, self.patch = source, int(seed), tuple(patch)
        self.draws = draws or DiffusionDraws()
        # the settings' bucket config first: a bad one is refused before the listing is read
        buckets = BucketConfig.load(bucket_config) if bucket_config else None
        entries = read_latent_listing(source)
        if limit is not None:
            entries = entries[: max(0, int(limit))]
        self.bucket_config = bucket_config
        self.files: list[Path] = []
        self.text_files: list[Path | None] = []
        self.sources: list[str | None] = []  # the manifest's source of each sample
        self.logvars: list[Path | None] = []  # the VAE's log-variance (latent_dist sample)
        self._full: list[tuple[int, int, int]] = []  # (frames, height, width) on disk
        self._crop: list[tuple[int, int, int]] = []  # (frames, height, width) sampled
        self.bucket_names: list[str] = []
        self.skipped: list[str] = []
        channels = None
        for index, entry in enumerate(entries):
            latent, text = entry.latent, entry.text
            shape = read_shape(latent)
            if len(shape) != 4 or min(shape) < 1:
                raise DataError(
                    f"{latent}: latent of shape {list(shape)}; want frames x channels x "
                    "height x width"
                )
            f, c, h, w = shape
            if entry.logvar is not None and read_shape(entry.logvar) != shape:
                raise DataError(
                    f"{entry.where}: logvar {entry.logvar.name} of shape "
                    f"{list(read_shape(entry.logvar))}; want its latent's {list(shape)}"
                )
            if channels is None:
                channels = c
            elif c != channels:
                raise DataError(f"{latent}: {c} channels, but {entries[0].latent} has {channels}")
            crop, name = (f, h, w), f"{f}x{h}x{w}"
            if buckets is not None:
                if entry.frames is not None:
                    rng = np.random.default_rng([self.seed, index])
                    recorded = (entry.bucket, entry.frames)
                    where = f"{entry.where}: {latent.name}"
                    bucket = prepared_bucket(buckets, (f, h, w), recorded, rng, where)
                else:
                    bucket = buckets.assign((f, h, w), np.random.default_rng([self.seed, index]))
                if bucket is None:
                    self.skipped.append(str(latent))
                    continue
                crop, name = (bucket.frames, bucket.height, bucket.width), bucket.name
            self.files.append(latent)
            self.text_files.append(text)
            self.sources.append(entry.source)
            self.logvars.append(entry.logvar)
            self._full.append((f, h, w))
            self._crop.append(crop)
            self.bucket_names.append(name)
        if not self.files:
            raise DataError(f"latents:{source}: the bucket config keeps no latent")
        self.channels = int(channels)
        self.empty_prompt = self._empty_prompt() if self.draws.caption_dropout > 0 else None

    def _empty_prompt(self) -> Path:
        """The empty-prompt embedding a dropped caption trains on (``caption_dropout``);
        :class:`DataError` when the samples have no text or the folder has no such file."""
        dropout = self.draws.caption_dropout
        if any(p is None for p in self.text_files):
            raise DataError(
                f"latents:{self.source}: training.caption_dropout {dropout:g} drops captions, "
                "but not every latent has a text embedding; set --training.caption_dropout 0"
            )
        root = Path(self.source).expanduser()
        path = (root.parent if root.is_file() else root) / EMPTY_PROMPT
        if not path.is_file():
            raise DataError(
                f"latents:{self.source}: training.caption_dropout {dropout:g} needs the "
                f"pipeline's empty-prompt embedding {path.name}, which this folder lacks "
                "(prepared before it was written): rerun datacentric prepare with the same "
                "settings and --out (it adds only that file), or set --training.caption_dropout 0"
            )
        return path

    @property
    def token_dim(self) -> int:
        """Values per token: channels x patch volume (the model's ``in_channels``)."""
        return self.channels * math.prod(self.patch)

    def grid(self, sample_id: int) -> tuple[int, int, int]:
        """Patch grid of a sample (partial patches padded)."""
        (i,) = check_sample_ids([sample_id], len(self))
        return tuple(-(-n // p) for n, p in zip(self._crop[i], self.patch))

    def __len__(self) -> int:
        return len(self.files)

    def shapes(self) -> list[SampleShape]:
        """Video shapes (patch grids) of every sample, by sample id."""
        return [SampleShape.video(*self.grid(i)) for i in range(len(self))]

    def loss_tokens(self, sample_id: int) -> int:
        """Every patch carries loss."""
        return math.prod(self.grid(sample_id))

    def sample_source(self, sample_id: int) -> str:
        """Where sample ``sample_id`` comes from: the media file its manifest line names
        (``source``), else its latent file."""
        (i,) = check_sample_ids([sample_id], len(self))
        return self.sources[i] or str(self.files[i])

    def text_embedding(self, sample_id: int) -> torch.Tensor | None:
        """The sample's text embedding (loaded now), or None if it has none."""
        (i,) = check_sample_ids([sample_id], len(self))
        path = self.text_files[i]
        return None if path is None else as_float_tensor(open_latent(path))

    def sample(self, sample_id: int, epoch: int = 0) -> VideoSample:
        """Read and crop the latent, patchify it, and draw time and noise for ``epoch``."""
        (i,) = check_sample_ids([sample_id], len(self))
        (f, h, w), (cf, ch, cw) = self._full[i], self._crop[i]
        # the draws in the order of data/diffusion_draws.py: time, noise, frame offset,
        # caption
        gen = sample_generator(self.seed, i, epoch)
        grid = self.grid(i)
        t, noise = draw_time_and_noise((math.prod(grid), self.token_dim), gen, self.draws)
        f0 = int(torch.randint(0, f - cf + 1, (), generator=gen))
        dropped = self.draws.caption_dropped(gen)
        h0, w0 = (h - ch) // 2, (w - cw) // 2
        crop = (slice(f0, f0 + cf), slice(None), slice(h0, h0 + ch), slice(w0, w0 + cw))
        x = as_float_tensor(open_latent(self.files[i])[crop]).permute(1, 0, 2, 3)  # (C, F, H, W)
        if self.logvars[i] is not None:  # the VAE's Gaussian: this epoch's draw from it
            logvar = as_float_tensor(open_latent(self.logvars[i])[crop]).permute(1, 0, 2, 3)
            x = sample_latent(x, logvar, gen)
        pads = [(-n) % p for n, p in zip((cf, ch, cw), self.patch)]
        x = torch.nn.functional.pad(x, (0, pads[2], 0, pads[1], 0, pads[0]))
        # when every sample has one, the text embedding travels with the sample: a
        # text-conditioned model (the diffusers path) reads ``PackedBatch.sample_context``
        every = all(p is not None for p in self.text_files)
        context = self.text_embedding(i) if every else None
        if dropped and self.empty_prompt is not None:
            context = as_float_tensor(open_latent(self.empty_prompt))
        return VideoSample(x0=patchify(x, self.patch), noise=noise, t=t, context=context)

    def pack(
        self, sample_ids: Sequence[int], pad_to_multiple: int = 1, *, epoch: int = 0
    ) -> PackedBatch:
        """Pack samples by rectified flow with this epoch's time and noise."""
        ids = check_sample_ids(sample_ids, len(self))
        samples = [self.sample(i, epoch) for i in ids]
        grids = [self.grid(i) for i in ids]
        return pack_video_samples(ids, grids, samples, self.token_dim, pad_to_multiple)

    def summary(self) -> dict[str, object]:
        """Facts of the dataset (JSON-able), skipped count included."""
        return {
            "source": f"latents:{self.source}",
            "samples": len(self),
            "channels": self.channels,
            "buckets": len(set(self.bucket_names)),
            "bucket_config": self.bucket_config,
            "with_text": sum(p is not None for p in self.text_files),
            "samples_skipped": len(self.skipped),
        }
