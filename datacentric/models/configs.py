"""The shapes of our model classes and the named presets, as plain dataclasses (no torch).

:class:`LlamaConfig` (:class:`~datacentric.models.llama.Llama`) and :class:`DiTConfig`
(:class:`~datacentric.models.dit.VideoDiT`) describe a model without building it, so the
planner and the simulator price a preset (``llama-7b``, ``dit3d-1b``) without loading
torch. :data:`MODEL_PRESETS` names every preset; :func:`model_config` reads one.
Building a model from a config is :mod:`datacentric.models.presets`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


def rope_3d_pairs(head_dim: int) -> tuple[int, int, int]:
    """Rotary pairs of a head given to (frame, row, column): rows and columns get a
    third each (rounded down), frames the rest."""
    if head_dim % 2:
        raise ValueError(f"rotary embeddings need an even head dim, got {head_dim}")
    pairs = head_dim // 2
    spatial = pairs // 3
    if spatial < 1:
        raise ValueError(f"head dim {head_dim} is too small for 3D rotary embeddings (need >= 6)")
    return pairs - 2 * spatial, spatial, spatial


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """Shape of a :class:`Llama` model."""

    hidden_size: int
    """Model width D."""
    num_layers: int
    """Number of transformer blocks."""
    num_heads: int
    """Attention heads; must divide ``hidden_size`` (and, at run time, the SP size divides it)."""
    ffn_hidden_size: int
    """Inner width of the SwiGLU feed-forward."""
    vocab_size: int = 256
    """Vocabulary; 256 is one token per byte."""
    rope_theta: float = 10000.0
    """Base of the rotary frequencies."""
    norm_eps: float = 1e-5
    """Epsilon of RMSNorm."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of weights."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
            )
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"head dim {self.hidden_size // self.num_heads} must be even (RoPE)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True, kw_only=True)
class DiTConfig:
    """Shape of a :class:`VideoDiT` model."""

    hidden_size: int
    """Model width D."""
    num_layers: int
    """Number of transformer blocks."""
    num_heads: int
    """Attention heads; must divide ``hidden_size``."""
    ffn_hidden_size: int
    """Inner width of the GELU feed-forward (DiT uses 4 x hidden_size)."""
    in_channels: int = 16
    """Features per token: latent channels x patch volume (4 x 1 x 2 x 2)."""
    timestep_freq_dim: int = 256
    """Width of the sinusoidal timestep features before the timestep MLP."""
    rope_theta: float = 10000.0
    """Base of the rotary frequencies of each axis."""
    norm_eps: float = 1e-6
    """Epsilon of the LayerNorms."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of weights (also of adaLN and
    the output layer: no zero init, so every parameter gets a gradient at step 0)."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
            )
        rope_3d_pairs(self.head_dim)  # validates the head dim

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def vocab_size(self) -> int:
        """No vocabulary: a diffusion model regresses ``in_channels`` values per token."""
        return 0


PresetConfig = LlamaConfig | DiTConfig
"""The configuration of a preset model (``ModelConfig`` before 0.2.0, a name that now
means only the settings' ``[model]`` section)."""


@dataclass(frozen=True)
class ModelPreset:
    """A named configuration of one of the model classes."""

    name: str
    config: PresetConfig
    description: str


def _presets() -> dict[str, ModelPreset]:
    presets = [
        ModelPreset(
            "llama",
            LlamaConfig(hidden_size=128, num_layers=8, num_heads=4, ffn_hidden_size=352),
            "tiny byte-level Llama for CPU tests and the demo",
        ),
        ModelPreset(
            "llama-7b",
            LlamaConfig(
                hidden_size=4096,
                num_layers=32,
                num_heads=32,
                ffn_hidden_size=11008,
                vocab_size=32000,
            ),
            "Llama-7B shape (32k vocabulary, as the original; bytes are ids < 256)",
        ),
        ModelPreset(
            "llama-13b",
            LlamaConfig(
                hidden_size=5120,
                num_layers=40,
                num_heads=40,
                ffn_hidden_size=13824,
                vocab_size=32000,
            ),
            "Llama-13B shape (32k vocabulary)",
        ),
        ModelPreset(
            "dit",
            DiTConfig(hidden_size=128, num_layers=8, num_heads=4, ffn_hidden_size=512),
            "tiny video DiT for CPU tests and the demo",
        ),
        ModelPreset(
            "dit3d-1b",
            DiTConfig(hidden_size=1536, num_layers=28, num_heads=24, ffn_hidden_size=6144),
            "1.2B video DiT, full 3D attention, 28 blocks of width 1536 (24 heads of 64)",
        ),
    ]
    return {p.name: p for p in presets}


MODEL_PRESETS: dict[str, ModelPreset] = _presets()
"""Every named model, by name."""


def list_models() -> list[str]:
    """Names of the model presets, in definition order."""
    return list(MODEL_PRESETS)


def model_config(name: str, **overrides: object) -> PresetConfig:
    """The config of preset ``name`` with fields replaced by ``overrides``."""
    if name not in MODEL_PRESETS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
    config = MODEL_PRESETS[name].config
    known = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(
            f"model {name!r} ({type(config).__name__}) has no field(s) {unknown}; "
            f"fields: {sorted(known)}"
        )
    return dataclasses.replace(config, **overrides)


def __getattr__(name: str) -> object:
    if name == "ModelConfig":  # deprecated: the settings' [model] section has the name
        import warnings

        warnings.warn(
            f"{__name__}.ModelConfig is deprecated and will be removed in 0.3.0: the "
            "configuration of a preset model is PresetConfig (ModelConfig is the "
            "settings' [model] section)",
            DeprecationWarning,
            stacklevel=2,
        )
        return PresetConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
