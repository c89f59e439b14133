"""Every diffusers family, one declaration each: what prepare, training, render,
verification and the support table need to know of it, as data.

A family is one :class:`Family` in :data:`FAMILIES`, keyed by its diffusers transformer
class name (``transformer``). Adding a family is adding one record (in code, with
:func:`register_family`) and its test. Each record says:

- for training (:mod:`datacentric.models.diffusers_generic`, which runs the class's own
  ``forward`` once per group of same-shape clips and splits the video sequence across
  the SP group where a context-parallel plan says):

  - ``cp_plan``: where the video sequence is split and gathered, in diffusers' format
    (:class:`SplitInput`/:class:`GatherOutput` read like diffusers'
    ``ContextParallelInput``/``ContextParallelOutput``), for a class whose own
    ``_cp_plan`` is missing (SkyReels-V2, CogVideoX, HunyuanVideo) or splits the text
    (Flux); None: the class's own. The text always stays whole on every rank of an SP
    group;
  - ``text_first``: where the text sits in a joint attention (one attention over the
    text and video tokens joined): first (CogVideoX, Flux) or last (HunyuanVideo); None
    for a family without one. Under sequence parallelism :func:`joint_attention`
    gathers the video keys and values of the group and each rank attends with its own
    video queries and the whole text's;
  - ``layout``: how the latents enter ``forward``: ``"video"`` ``(B, C, F, H, W)``,
    ``"frames_first"`` ``(B, F, C, H, W)`` (CogVideoX), ``"tokens"`` the ``(B, S, C x
    4)`` packed tokens of an image pipeline (Flux: ``patch`` (1, 2, 2) latent pixels a
    token, its ``in_channels`` counts a token's values);
  - ``pooled``: ``pooled_projections`` (and a text mask) come from the text file: its
    first row holds the pooled projection (its first ``pooled_projection_dim`` values),
    the other rows the text tokens; a text row of zeros only is padding (masked where
    the model takes a mask). ``docs/data.md`` shows the files;
  - ``timestep_scale``: what ``forward`` takes for the rectified-flow time ``t``
    (``1000 t``; Flux multiplies by 1000 itself); ``guidance``: the guidance scale a
    guidance-distilled model is given (as its pipeline passes it);
  - ``blocks``: the lists of repeated blocks (recomputation), when the class names none;
  - ``refused``: config fields whose other values need inputs the latent files do not
    hold (``field -> (the value that runs, what is missing)``);
- for prepare and render: ``pipeline``, the diffusers pipeline class of the family, and
  ``encoding`` (:class:`PipelineFamily`): how it normalises latents and lays out its
  text (:mod:`~.diffusers_encode`, :mod:`~.diffusers_render`);
- for tests and ``datacentric equivalence``: ``tiny``, the name of a random-weight
  model (``diffusers:NAME``), and ``tiny_config``, its config (empty: refused, built
  only to show the refusal);
- for verification and the support table: ``pipeline_call``, how the family's pipeline
  calls the transformer beyond latents, timestep and text (a function name of
  :mod:`datacentric.verify.diffusers_calls`, the reference side, which shares no code
  with the adapters, or such a callable), and ``evidence``, the tests that show the
  family exact (pytest ids; the support table's ``exact`` rows).

The tables older modules named (``diffusers_plan.DECLARED_CP_PLANS``,
``diffusers_encode.PIPELINES``, ``diffusers_build.TINY_DIFFUSERS``,
``verify.diffusers_calls.PIPELINE_CALLS``, part of ``verify.support.EVIDENCE``) are
read-only views of :data:`FAMILIES` (:class:`FamilyView`), current at every read.

Nothing here imports diffusers: per-sample inputs built from diffusers functions
(rotary grids, image ids) import them when called.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class SplitInput:
    """A plan entry that splits an input (or, ``split_output``, an output) along
    ``split_dim`` when it has ``expected_dims`` dimensions (diffusers'
    ``ContextParallelInput``)."""

    split_dim: int
    expected_dims: int | None = None
    split_output: bool = False


@dataclass(frozen=True)
class GatherOutput:
    """A plan entry that gathers an output along ``gather_dim`` (diffusers'
    ``ContextParallelOutput``)."""

    gather_dim: int
    expected_dims: int | None = None


ExtraInputs = Callable[[Any, tuple[int, int, int], int, torch.Tensor], dict[str, Any]]
"""``(config, model grid (frames, rows, columns), clips, a hidden-states tensor) ->
keyword arguments`` a family's pipeline passes beside the latents."""


@dataclass(frozen=True)
class PipelineFamily:
    """How one pipeline class normalises latents and lays out its text."""

    normalise: str
    """``mean_std``: ``(z - latents_mean) / latents_std`` (Wan); ``scale``: ``z x
    scaling_factor`` (HunyuanVideo); ``shift_scale``: ``(z - shift_factor) x
    scaling_factor`` (Flux)."""
    text: tuple[str | None, ...]
    """What ``encode_prompt`` returns, in order: ``embeds``, ``pooled``, ``mask`` or None."""
    length_tokenizer: str = "tokenizer"
    """The tokenizer whose length ``max_sequence_length`` caps."""
    images: bool = False
    """Takes images (one frame) through ``image_processor``."""


@dataclass(frozen=True, kw_only=True)
class Family:
    """One family's declaration (see the module docstring)."""

    transformer: str
    """The diffusers transformer class name: the key of :data:`FAMILIES`."""
    cp_plan: dict[str, Any] | None = None
    text_first: bool | None = None
    layout: str = "video"
    patch: tuple[int, int, int] | None = None
    pooled: bool = False
    timestep_scale: float = 1000.0
    guidance: float | None = None
    blocks: tuple[str, ...] = ()
    refused: dict[str, tuple[Any, str]] = field(default_factory=dict)
    extra_inputs: ExtraInputs | None = None
    fills: tuple[str, ...] = ()
    """``forward`` arguments without a default that the family fills."""
    pipeline: str | None = None
    """The diffusers pipeline class that prepare encodes with and render renders with."""
    encoding: PipelineFamily | None = None
    """How ``pipeline`` normalises latents and lays out its text (set with ``pipeline``)."""
    tiny: str | None = None
    """The tiny random-weight model's name (``diffusers:NAME``)."""
    tiny_config: dict[str, Any] = field(default_factory=dict)
    """The tiny model's config (empty: the class's defaults, refused by the pre-check)."""
    pipeline_call: str | Callable[..., torch.Tensor] | None = None
    """How its pipeline calls the transformer on one clip, for the reference side (a
    function name of :mod:`datacentric.verify.diffusers_calls`, or such a function);
    None: latents, timestep and text only."""
    evidence: tuple[str, ...] = ()
    """The tests that show the family exact (pytest ids, relative to the repository)."""
    model_class: type | None = None
    """The class itself, for one that diffusers does not export (a subclass declared
    elsewhere); None: ``diffusers.<transformer>``."""


def _cogvideox_rotary(config: Any, grid: tuple[int, int, int], clips: int, x: torch.Tensor):
    """CogVideoX's rotary angles for one clip grid, as its pipeline builds them (the
    grid of the clip itself, cropped from the base size the model was trained at)."""
    if not config.get("use_rotary_positional_embeddings"):
        return {}
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

    frames, rows, cols = grid
    patch = int(config.patch_size)
    base_rows = int(config.sample_height) // patch
    base_cols = int(config.sample_width) // patch
    dim = int(config.attention_head_dim)
    if config.get("patch_size_t") is None:
        crop = get_resize_crop_region_for_grid((rows, cols), base_cols, base_rows)
        cos, sin = get_3d_rotary_pos_embed(dim, crop, (rows, cols), frames, device=x.device)
    else:
        cos, sin = get_3d_rotary_pos_embed(
            dim, None, (rows, cols), frames, "slice", (base_rows, base_cols), device=x.device
        )
    return {"image_rotary_emb": (cos.to(x.device), sin.to(x.device))}


def _flux_ids(config: Any, grid: tuple[int, int, int], clips: int, x: torch.Tensor):
    """Flux's image ids (0, row, column) per token and zero text ids, as ``FluxPipeline``
    passes them (``txt_ids`` has as many rows as the text; filled in by the adapter)."""
    _, rows, cols = grid
    r, c = torch.meshgrid(
        torch.arange(rows, device=x.device), torch.arange(cols, device=x.device), indexing="ij"
    )
    img_ids = torch.stack([torch.zeros_like(r), r, c], dim=-1).reshape(-1, 3)
    return {"img_ids": img_ids.to(x.dtype)}


_WAN_LIKE_PLAN: dict[str, Any] = {
    "rope": {0: SplitInput(1, 4, True), 1: SplitInput(1, 4, True)},
    "blocks.0": {"hidden_states": SplitInput(1, 3)},
    "proj_out": GatherOutput(1, 3),
}

_TINY_WAN: dict[str, Any] = {
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
}

_GENERIC_TEST = "tests/runtime/models/test_diffusers.py::"
_FAMILY_TEST = "tests/runtime/models/test_diffusers_families.py::"
_OWN_FORWARD = f"{_FAMILY_TEST}test_family_equals_its_own_forward_as_its_pipeline_calls_it"
_SP_2 = f"{_FAMILY_TEST}test_sp_2_with_accumulation_and_recomputation_equals_one_process"
_WORLD_4 = f"{_FAMILY_TEST}test_world_4_mixes_sp_sizes_and_accumulation_and_equals_one_process"
_CASE = "tests.runtime.models.test_diffusers_families:"

FAMILIES: dict[str, Family] = {}
"""Declared families, by diffusers transformer class name (in declaration order)."""


def register_family(family: Family) -> Family:
    """Add ``family`` to :data:`FAMILIES` (a class, tiny name or pipeline declared by
    another family is a ``ValueError``); returns it."""
    for other in FAMILIES.values():
        for what in ("transformer", "tiny", "pipeline"):
            mine = getattr(family, what)
            if mine is not None and mine == getattr(other, what):
                raise ValueError(f"diffusers family {what} {mine!r} is declared twice")
    if (family.pipeline is None) != (family.encoding is None):
        raise ValueError(f"{family.transformer}: declare pipeline and encoding together")
    FAMILIES[family.transformer] = family
    return family


register_family(
    Family(
        transformer="WanTransformer3DModel",
        pipeline="WanPipeline",
        encoding=PipelineFamily("mean_std", ("embeds", None)),
        tiny="wan",
        tiny_config=_TINY_WAN,
        evidence=(
            f"{_GENERIC_TEST}test_generic_path_equals_the_models_own_forward[wan]",
            f"{_GENERIC_TEST}test_sp_2_with_padding_and_accumulation_equals_one_process",
        ),
    )
)
register_family(
    Family(
        transformer="LTXVideoTransformer3DModel",
        tiny="ltx",
        tiny_config={
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
        evidence=(
            f"{_GENERIC_TEST}test_generic_path_equals_the_models_own_forward[ltx]",
            f"{_GENERIC_TEST}test_contract_check_passes_and_recomputation_is_exact",
        ),
    )
)
register_family(
    Family(
        transformer="SkyReelsV2Transformer3DModel",
        cp_plan=_WAN_LIKE_PLAN,
        refused={
            "inject_sample_info": (False, "fps conditioning (inject_sample_info)"),
            "num_frame_per_block": (1, "diffusion forcing's causal frame blocks"),
        },
        pipeline="SkyReelsV2Pipeline",
        encoding=PipelineFamily("mean_std", ("embeds", None)),
        tiny="skyreels-v2",
        tiny_config={**_TINY_WAN, "ffn_dim": 64, "num_layers": 2},  # Wan's, 2 blocks
        evidence=(
            f"{_OWN_FORWARD}[skyreels-v2]",
            f"{_SP_2}[diffusers:skyreels-v2]",
            f"{_WORLD_4}[skyreels-v2]",
        ),
    )
)
register_family(
    Family(
        transformer="CogVideoXTransformer3DModel",
        cp_plan={
            "": {"image_rotary_emb": [SplitInput(0, 2), SplitInput(0, 2)]},
            "transformer_blocks.0": {"hidden_states": SplitInput(1, 3)},
            "proj_out": GatherOutput(1, 3),
        },
        text_first=True,
        layout="frames_first",
        blocks=("transformer_blocks",),
        refused={"ofs_embed_dim": (None, "image-to-video offsets (ofs_embed_dim)")},
        extra_inputs=_cogvideox_rotary,
        tiny="cogvideox",
        tiny_config={
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
        pipeline_call="cogvideox_call",
        evidence=(
            f"{_OWN_FORWARD}[cogvideox]",
            f"{_SP_2}[diffusers:cogvideox]",
            f"{_WORLD_4}[cogvideox]",
        ),
    )
)
register_family(
    Family(
        transformer="HunyuanVideoTransformer3DModel",
        cp_plan={
            "rope": {0: SplitInput(0, 2, True), 1: SplitInput(0, 2, True)},
            "transformer_blocks.0": {"hidden_states": SplitInput(1, 3)},
            "proj_out": GatherOutput(1, 3),
        },
        text_first=False,
        pooled=True,
        guidance=6.0 * 1000.0,
        fills=("pooled_projections",),
        blocks=("transformer_blocks", "single_transformer_blocks"),
        refused={"image_condition_type": (None, "image conditioning (image_condition_type)")},
        pipeline="HunyuanVideoPipeline",
        encoding=PipelineFamily("scale", ("embeds", "pooled", "mask")),
        tiny="hunyuan-video",
        tiny_config={
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
        pipeline_call="hunyuan_video_call",
        evidence=(
            f"{_OWN_FORWARD}[hunyuan-video]",
            f"{_SP_2}[{_CASE}masked_hunyuan_case]",
            f"{_WORLD_4}[hunyuan-video]",
        ),
    )
)
register_family(
    Family(
        transformer="FluxTransformer2DModel",
        cp_plan={
            "": {
                "hidden_states": SplitInput(1, 3),
                "img_ids": SplitInput(0, 2),
            },
            "proj_out": GatherOutput(1, 3),
        },
        text_first=True,
        layout="tokens",
        patch=(1, 2, 2),
        pooled=True,
        timestep_scale=1.0,
        guidance=3.5,
        blocks=("transformer_blocks", "single_transformer_blocks"),
        extra_inputs=_flux_ids,
        pipeline="FluxPipeline",
        encoding=PipelineFamily(
            "shift_scale", ("embeds", "pooled", None), length_tokenizer="tokenizer_2", images=True
        ),
        tiny="flux",  # 4 latent channels; its tokens pack 2 x 2 of them
        tiny_config={
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
        pipeline_call="flux_call",
        evidence=(f"{_OWN_FORWARD}[flux]", f"{_SP_2}[diffusers:flux]", f"{_WORLD_4}[flux]"),
    )
)
register_family(
    Family(
        transformer="ChronoEditTransformer3DModel",
        tiny="chronoedit",
        # Wan's blocks with ChronoEdit's temporal rotary skip: Wan's tiny config, 2 blocks
        tiny_config={
            "rope_temporal_skip_len": 4,
            **_TINY_WAN,
            "ffn_dim": 64,
            "num_layers": 2,
        },
        evidence=(f"{_OWN_FORWARD}[chronoedit]", f"{_SP_2}[diffusers:chronoedit]"),
    )
)
register_family(
    Family(
        transformer="HeliosTransformer3DModel",
        tiny="helios",  # its own plan splits and gathers around each of its 40 blocks
        tiny_config={
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
        evidence=(f"{_OWN_FORWARD}[helios]", f"{_SP_2}[{_CASE}helios_case]"),
    )
)
# Refused by the generic path (its build fails in one line naming what is missing):
# its forward needs audio latents
register_family(Family(transformer="LTX2VideoTransformer3DModel", tiny="ltx2"))

LAYOUTS = ("video", "frames_first", "tokens")


def declare_plan(transformer: str, cp_plan: dict[str, Any]) -> Family:
    """Give the family of ``transformer`` the context-parallel plan ``cp_plan``
    (declaring a family of that plan alone if there is none); returns it."""
    family = FAMILIES.get(transformer)
    if family is None:
        return register_family(Family(transformer=transformer, cp_plan=cp_plan))
    FAMILIES[transformer] = dataclasses.replace(family, cp_plan=cp_plan)
    return FAMILIES[transformer]


def family_named(class_name: str) -> Family | None:
    """The declaration of the transformer class ``class_name`` (the key of
    :data:`FAMILIES`: the one lookup of a family's declaration), or None."""
    return FAMILIES.get(class_name)


def family_of_pipeline(pipeline: str) -> Family | None:
    """The family whose pipeline class is named ``pipeline``, or None."""
    return next((f for f in FAMILIES.values() if f.pipeline == pipeline), None)


def family_of_tiny(name: str) -> Family | None:
    """The family whose tiny model is named ``name``, or None."""
    return next((f for f in FAMILIES.values() if f.tiny == name), None)


class FamilyView(Mapping[str, Any]):
    """A table read from :data:`FAMILIES` at every access: ``entry(family)`` gives a
    ``(key, value)`` pair or None (the family has no entry); ``extra`` entries follow
    the families'. Read-only, unless ``store`` says how an older name's assignment
    (``table[key] = value``) declares it, which then warns."""

    def __init__(
        self,
        entry: Callable[[Family], tuple[str, Any] | None],
        extra: Mapping[str, Any] | None = None,
        *,
        name: str = "this table",
        store: Callable[[str, Any], None] | None = None,
    ) -> None:
        self._entry = entry
        self._extra = extra or {}
        self._name = name
        self._store = store

    def __setitem__(self, key: str, value: Any) -> None:
        if self._store is None:
            raise TypeError(
                f"{self._name} is read from the family declarations; declare the family "
                "with diffusers_families.register_family(Family(...))"
            )
        warnings.warn(
            f"{self._name}[{key!r}] = ... is deprecated; declare the family with "
            "datacentric.models.diffusers_families.register_family(Family(...))",
            DeprecationWarning,
            stacklevel=2,
        )
        self._store(key, value)

    def _table(self) -> dict[str, Any]:
        table = dict(pair for f in FAMILIES.values() if (pair := self._entry(f)) is not None)
        return {**table, **self._extra}

    def __getitem__(self, key: str) -> Any:
        return self._table()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return f"FamilyView({self._table()!r})"


def text_inputs(
    family: Family | None, config: Any, context: torch.Tensor, takes_mask: bool
) -> dict[str, Any]:
    """``forward``'s text arguments from the clips' text files ``(B, L, D)``: the
    embeddings; for a ``pooled`` family the pooled projections (row 0), the text mask
    where ``forward`` takes one (``takes_mask``; rows of zeros only are padding), the
    guidance and Flux's text ids."""
    if family is None or not family.pooled:
        return {"encoder_hidden_states": context}
    text = context[:, 1:]
    kwargs: dict[str, Any] = {
        "encoder_hidden_states": text,
        "pooled_projections": context[:, 0, : int(config.pooled_projection_dim)],
    }
    if takes_mask:
        kwargs["encoder_attention_mask"] = (text != 0).any(dim=-1).to(text.dtype)
    if family.guidance is not None and config.get("guidance_embeds"):
        kwargs["guidance"] = text.new_full((text.shape[0],), family.guidance)
    if family.layout == "tokens":
        kwargs["txt_ids"] = text.new_zeros(text.shape[1], 3)
    return kwargs


def joint_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    scale: float | None,
    *,
    text_len: int,
    text_first: bool,
    gather: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """One attention over the text and the group's video, ``(B, H, L + n, D)`` queries
    of this rank (the whole text's and its ``n`` video tokens') in the model's joined
    order. The video keys and values of every rank are joined (``gather(x)``: along the
    sequence, in group order, without padding) to the text's, so every query sees the
    clip's whole joint sequence as in the model's own ``forward``; a key mask
    ``(B, 1, 1, L + S)`` (HunyuanVideo's text mask, built by ``forward`` for the whole
    clip) applies unchanged."""

    def whole(x: torch.Tensor) -> torch.Tensor:
        if text_first:
            return torch.cat([x[:, :, :text_len], gather(x[:, :, text_len:])], dim=2)
        cut = x.shape[2] - text_len
        return torch.cat([gather(x[:, :, :cut]), x[:, :, cut:]], dim=2)

    key, value = whole(key), whole(value)
    if attn_mask is not None and (attn_mask.shape[-1] != key.shape[2] or attn_mask.shape[-2] != 1):
        raise ValueError(
            f"a joint attention mask of shape {tuple(attn_mask.shape)}: only a key mask over "
            f"the whole clip's {key.shape[2]} tokens runs under sequence parallelism"
        )
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, scale=scale
    )
