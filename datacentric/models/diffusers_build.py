"""Build a diffusers video transformer for training, and export it back.

- :func:`build_diffusers_model` takes a tiny name (:data:`TINY_DIFFUSERS`, random
  weights for tests and ``datacentric equivalence``) or a local folder: ``config.json``
  with weights loads them with ``from_pretrained`` (local files only, nothing
  downloaded); ``config.json`` alone builds random weights with ``from_config``. It
  returns the model under our contract (:class:`~.diffusers_generic.DiffusersVideoTransformer`),
  after checking the class and config first (a refused model is never built).
- :func:`export_diffusers` writes the trained diffusers model with ``save_pretrained``
  (safetensors): the folder ``from_pretrained`` loads.

Weights drawn at random come from the global torch RNG: seed it for the same model on
every rank.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from datacentric.models.attention import AttentionFn, varlen_attention
from datacentric.models.diffusers_generic import DiffusersVideoTransformer, check_supported
from datacentric.models.diffusers_plan import UnsupportedVideoModel

try:
    import diffusers
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "datacentric.models.diffusers_build needs diffusers: pip install 'datacentric[video]'"
    ) from _error

TINY_DIFFUSERS: dict[str, tuple[str, dict[str, Any]]] = {
    "wan": (
        "WanTransformer3DModel",
        {
            "patch_size": (1, 2, 2),
            "num_attention_heads": 4,
            "attention_head_dim": 16,
            "in_channels": 4,
            "out_channels": 4,
            "text_dim": 32,
            "freq_dim": 32,
            "ffn_dim": 128,
            "num_layers": 4,
            "cross_attn_norm": True,
            "rope_max_seq_len": 64,
        },
    ),
    "ltx": (
        "LTXVideoTransformer3DModel",
        {
            "in_channels": 4,
            "out_channels": 4,
            "patch_size": 1,
            "patch_size_t": 1,
            "num_attention_heads": 4,
            "attention_head_dim": 16,
            "cross_attention_dim": 64,
            "num_layers": 4,
            "caption_channels": 32,
        },
    ),
    # Wan-like: Wan's tiny config, 2 blocks
    "skyreels-v2": ("SkyReelsV2Transformer3DModel", {}),
    "cogvideox": (
        "CogVideoXTransformer3DModel",
        {
            "num_attention_heads": 4,
            "attention_head_dim": 16,
            "in_channels": 4,
            "out_channels": 4,
            "time_embed_dim": 32,
            "text_embed_dim": 32,
            "num_layers": 2,
            "sample_width": 8,
            "sample_height": 8,
            "sample_frames": 9,
            "patch_size": 2,
            "max_text_seq_length": 8,
            "use_rotary_positional_embeddings": True,
        },
    ),
    "hunyuan-video": (
        "HunyuanVideoTransformer3DModel",
        {
            "in_channels": 4,
            "out_channels": 4,
            "num_attention_heads": 4,
            "attention_head_dim": 16,
            "num_layers": 1,
            "num_single_layers": 1,
            "num_refiner_layers": 1,
            "mlp_ratio": 2.0,
            "patch_size": 2,
            "patch_size_t": 1,
            "guidance_embeds": True,
            "text_embed_dim": 32,
            "pooled_projection_dim": 16,
            "rope_axes_dim": (4, 6, 6),
        },
    ),
    "flux": (
        "FluxTransformer2DModel",
        {
            "patch_size": 1,
            "in_channels": 16,
            "num_layers": 1,
            "num_single_layers": 1,
            "attention_head_dim": 16,
            "num_attention_heads": 4,
            "joint_attention_dim": 32,
            "pooled_projection_dim": 16,
            "guidance_embeds": True,
            "axes_dims_rope": (4, 6, 6),
        },
    ),
    # Wan's blocks with ChronoEdit's temporal rotary skip: Wan's tiny config, 2 blocks
    "chronoedit": ("ChronoEditTransformer3DModel", {"rope_temporal_skip_len": 4}),
    # its own plan splits and gathers around each of its 40 blocks' attention
    "helios": (
        "HeliosTransformer3DModel",
        {
            "patch_size": (1, 2, 2),
            "num_attention_heads": 2,
            "attention_head_dim": 16,
            "in_channels": 4,
            "out_channels": 4,
            "text_dim": 32,
            "freq_dim": 32,
            "ffn_dim": 64,
            "num_layers": 40,
            "rope_dim": (4, 6, 6),
        },
    ),
    # Refused by the generic path (the build fails in one line naming what is missing):
    "ltx2": ("LTX2VideoTransformer3DModel", {}),
}
TINY_DIFFUSERS["skyreels-v2"][1].update(TINY_DIFFUSERS["wan"][1], ffn_dim=64, num_layers=2)
TINY_DIFFUSERS["chronoedit"][1].update(
    {**TINY_DIFFUSERS["wan"][1], "ffn_dim": 64, "num_layers": 2, "rope_temporal_skip_len": 4}
)
"""Tiny names: (diffusers class, random-weight config). ``wan``, ``ltx``, ``skyreels-v2``,
``cogvideox``, ``hunyuan-video``, ``flux`` (4 latent channels; Flux's tokens pack
2 x 2 of them), ``chronoedit`` and ``helios`` (its own 40 blocks, 2 heads of 16) train;
``ltx2`` is refused (its forward needs audio latents)."""

WEIGHT_SUFFIXES = (".safetensors", ".bin")


def text_width(config: Any) -> int:
    """Width of the text embeddings the model takes (Wan: ``text_dim``; LTX:
    ``caption_channels``; CogVideoX, HunyuanVideo: ``text_embed_dim``; Flux:
    ``joint_attention_dim``)."""
    fields = ("text_dim", "caption_channels", "text_embed_dim", "joint_attention_dim")
    for field in (*fields, "cross_attention_dim"):
        if config.get(field):
            return int(config.get(field))
    raise UnsupportedVideoModel("the config names no text width (text_dim, caption_channels)")


def _model_class(name: str, where: str) -> type:
    cls = getattr(diffusers, name, None)
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise UnsupportedVideoModel(
            f"{where}: diffusers {diffusers.__version__} has no model {name}"
        )
    return cls


def build_diffusers_model(
    name_or_path: str,
    *,
    dtype: torch.dtype = torch.float32,
    attention: AttentionFn = varlen_attention,
    device: torch.device | str | None = None,
    **config_overrides: Any,
) -> DiffusersVideoTransformer:
    """A diffusers video transformer under our model contract.

    ``name_or_path``: a tiny name of :data:`TINY_DIFFUSERS`, or a folder with
    ``config.json`` (its ``_class_name`` says the class) and, optionally, weights
    (``*.safetensors``/``*.bin``, sharded or not). ``config_overrides`` replace config
    fields. Raises :class:`UnsupportedVideoModel` for a model the generic path cannot
    train and ``ValueError`` for a name that is neither.
    """
    if name_or_path in TINY_DIFFUSERS:
        class_name, tiny = TINY_DIFFUSERS[name_or_path]
        cls = _model_class(class_name, f"diffusers:{name_or_path}")
        config = {**tiny, **config_overrides}
        check_supported(cls, config)  # unset fields take the class defaults (None for images)
        transformer = cls.from_config(config)
    else:
        folder = Path(name_or_path).expanduser()
        config_file = folder / "config.json"
        if not config_file.is_file():
            raise ValueError(
                f"diffusers:{name_or_path}: neither a tiny name ({', '.join(TINY_DIFFUSERS)}) "
                "nor a folder with config.json"
            )
        config = json.loads(config_file.read_text(encoding="utf-8"))
        cls = _model_class(str(config.get("_class_name")), f"diffusers:{name_or_path}")
        check_supported(cls, {**config, **config_overrides})
        weights = [p for p in folder.iterdir() if p.name.endswith(WEIGHT_SUFFIXES)]
        if weights:
            transformer = cls.from_pretrained(
                folder, local_files_only=True, torch_dtype=dtype, **config_overrides
            )
        else:
            transformer = cls.from_config({**config, **config_overrides})
    model = DiffusersVideoTransformer(transformer, attention=attention)
    return model.to(device=device, dtype=dtype)


def diffusers_model_of(model: nn.Module) -> nn.Module:
    """The diffusers model inside ``model`` (our adapter, or a DDP wrapper of it)."""
    inner = getattr(model, "module", model)  # DDP keeps the module as .module
    transformer = getattr(inner, "transformer", inner)
    if not hasattr(transformer, "save_pretrained"):
        raise ValueError(f"{type(model).__name__} holds no diffusers model")
    return transformer


def export_diffusers(
    model: nn.Module,
    out_dir: str | Path,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write the diffusers model of ``model`` to ``out_dir`` with ``save_pretrained``
    (safetensors): ``config.json`` and the weights, loadable by the class's
    ``from_pretrained``. ``state_dict`` (full tensors, names with or without the
    adapter's ``transformer.`` prefix, e.g. gathered from FSDP2 shards) replaces the
    model's own weights in the export."""
    transformer = diffusers_model_of(model)
    if state_dict is not None:
        prefix = "transformer."
        if any(k.startswith(prefix) for k in state_dict):
            state_dict = {k: v for k, v in state_dict.items() if k.startswith(prefix)}
        weights = {k.removeprefix(prefix): v for k, v in state_dict.items()}
        copy = type(transformer).from_config(transformer.config)
        copy.load_state_dict(weights, strict=True)
        transformer = copy
    out = Path(out_dir)
    transformer.save_pretrained(out, safe_serialization=True)
    return out
