"""Model specs of the runnable presets, and the registry of every named model spec.

Lives above ``planning/`` (which never imports ``models/``): the widths, depth and
vocabulary of each preset are read from its config in :mod:`datacentric.models.presets`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from datacentric.models.dit import DiTConfig
from datacentric.models.llama import LlamaConfig
from datacentric.models.presets import model_config
from datacentric.planning.model_specs import ModelSpec, stdit_1_1b

#: Operators outside the blocks in one forward + backward (aten calls less views,
#: counted under bf16 autocast as 2 * ops(2 blocks) - ops(4 blocks)).
LLAMA_OUTER_OPS = 62
DIT_OUTER_OPS = 131


def spec_from_model_preset(name: str) -> ModelSpec:
    """The spec of a runnable model preset (:mod:`datacentric.models.presets`).

    Widths, depth and vocabulary come from the preset's config, so the two never drift
    apart; parameters are counted from the layer structure of ``models/llama.py`` and
    ``models/dit.py`` (without building the model, which takes seconds at 13B; a test
    checks the count against the built small models).
    """
    return spec_from_model_config(model_config(name), name)


def spec_from_model_config(config: LlamaConfig | DiTConfig, name: str) -> ModelSpec:
    """The spec of one of our models from its config (see :func:`spec_from_model_preset`)."""
    h, f = config.hidden_size, config.ffn_hidden_size
    if isinstance(config, LlamaConfig):
        return ModelSpec(
            name=name,
            hidden=h,
            heads=config.num_heads,
            ffn_hidden=f,
            gated_mlp=True,
            block_kinds=("causal",) * config.num_layers,
            vocab_size=config.vocab_size,
            per_sample_block_params=2 * h,  # the two RMSNorm weights
            extra_outer_params=h,  # final RMSNorm
            # approximate, read from models/common.py: each RMSNorm also keeps its
            # normalised value before the weight (2 x h), the rotary embedding keeps the
            # un-rotated q and k (2h).
            extra_saved_per_token=4 * h,
            outer_ops=LLAMA_OUTER_OPS,
            source=f"datacentric.models.presets {name!r}",
        )
    c, freq = config.in_channels, config.timestep_freq_dim
    return ModelSpec(
        name=name,
        hidden=h,
        heads=config.num_heads,
        ffn_hidden=f,
        block_kinds=("full",) * config.num_layers,
        patch_channels=c,
        # per-block adaLN MLP (6h x h, runs once per sample) and the biases of q, k, v,
        # o, both feed-forward layers and adaLN
        per_sample_block_params=6 * h * h + 4 * h + f + h + 6 * h,
        # generic count has patch in/out (2ch), timestep MLP (256h + h^2); add the
        # actual frequency width, the final adaLN (2h^2 + 2h) and biases
        extra_outer_params=(freq - 256) * h + 2 * h * h + 2 * h + h + 2 * h + c,
        # approximate, read from models/dit.py: the per-token gathered modulation rows
        # (6h), both LayerNorm outputs kept for the scale product (2h), the un-rotated
        # q and k (2h), the attention and MLP outputs kept for their gates (2h).
        extra_saved_per_token=12 * h,
        per_token_modulation=6 * h,  # shift, scale, gate of attention and MLP
        outer_per_token_modulation=2 * h,  # final adaLN: shift, scale
        outer_ops=DIT_OUTER_OPS,
        source=f"datacentric.models.presets {name!r}",
    )


_PRESETS: dict[str, Callable[[], ModelSpec]] = {
    "stdit-1.1b": stdit_1_1b,
    # Our runnable model classes at realistic sizes (see datacentric/models/presets.py):
    # llama-7b/13b follow the LLaMA paper (Touvron et al. 2023, Table 2: 32 layers x 4096,
    # 32 heads; 40 x 5120, 40 heads; SwiGLU 11008 / 13824; 32k vocabulary); dit3d-1b is
    # a full-3D-attention DiT of 28 blocks x 1536 with per-block adaLN.
    "llama-7b": lambda: spec_from_model_preset("llama-7b"),
    "llama-13b": lambda: spec_from_model_preset("llama-13b"),
    "dit3d-1b": lambda: spec_from_model_preset("dit3d-1b"),
    # The small runnable presets profiled on this machine.
    "llama": lambda: spec_from_model_preset("llama"),
    "dit": lambda: spec_from_model_preset("dit"),
}


def list_model_specs() -> list[str]:
    """Names of the analytic model presets."""
    return sorted(_PRESETS)


@cache
def get_model_spec(name: str) -> ModelSpec:
    """The analytic model preset called ``name``."""
    try:
        return _PRESETS[name]()
    except KeyError:
        raise KeyError(f"unknown model {name!r}; choose one of {sorted(_PRESETS)}") from None
