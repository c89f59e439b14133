"""A start-up check that a model follows the packed contract, on two real samples.

A model trained data-centrically sees packed micro-batches and sequence shards. It
is exact only if (1) positions come from ``batch.position_ids`` (global positions
within each sample, also on a shard) and (2) attention stays within the samples
that ``batch.cu_seqlens`` delimits. A model that keeps its own ``arange``
positions, or attends across samples, still trains, with a plausible loss and
wrong gradients. Both mistakes show on one forward pass of two samples:

- *boundaries*: a sample's per-token losses packed after another sample equal its
  losses alone;
- *positions*: with an attention callable that returns the queries (so each
  token's output depends only on that token and its position), the rows of a
  sequence shard equal the same rows of the whole sequence.

:func:`check_model_contract` raises :class:`ModelContractError` naming the check.
It costs three small forward passes, without gradients, in ``eval()`` mode; afterwards
each module's own ``training`` flag is what it was (a model the user put in ``eval()``,
or one with some layers in ``eval()``, comes back as the user set it). A model that declares
``rebuilds_whole_samples = True`` gathers every shard's samples whole from its SP group
and takes positions from its own ``forward`` (the diffusers adapter); a shard without its
group has no meaning there, so only the boundary check runs; the same for a model that
declares ``max_sp_size = 1`` (it never runs on a shard).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from datacentric.batch import PER_TOKEN_FIELDS
from datacentric.data.base import DataError, Dataset


class ModelContractError(ValueError):
    """A model that would train with wrong gradients under packing or sharding."""


# The rules as docs/models.md states them ("The model contract, as the check enforces
# it"); every error quotes the rule it found broken, and a test keeps the two equal.
ATTENTION_RULE = (
    "`set_attention(fn)` stores `fn` as `self.attention`, on the model or on its attention layers"
)
BOUNDARY_RULE = "a sample's per-token losses are the same packed after another sample as alone"
POSITION_RULE = (
    "on a sequence shard, each token's output equals its output in the whole sample, "
    "with an attention callable that returns the queries"
)
ATTENTION_FIX = "store fn as `self.attention`"
#: the dataset protocol's rule the boundary check rests on (docs/data.md, "Packing")
PACK_RULE = "A sample's rows are the same whatever it is packed with and however it is padded."
OLD_FORM_UNTIL = "0.3.0"


def _queries(q_SHD, k_SHD, v_SHD, cu_seqlens, causal, *, window=None):  # noqa: ANN001
    """An attention callable whose output is its queries (per token, position-aware),
    cut or zero-padded to the value head dim (multi-head latent attention has values
    of another width than queries and keys)."""
    width = v_SHD.shape[-1] - q_SHD.shape[-1]
    return q_SHD[..., : v_SHD.shape[-1]] if width <= 0 else F.pad(q_SHD, (0, width))


def current_attention(model: nn.Module):  # noqa: ANN201
    """The attention callable ``model`` uses now (to restore it after the check).

    Read from the first module, the model first, that has an ``attention`` property or a
    callable ``attention`` attribute. A model whose ``set_attention`` stores ``fn`` under
    another name (the contract before 0.2.0 did not say where) is found by what its
    ``set_attention`` writes, with a ``FutureWarning``, until 0.3.0.
    """
    for sub in model.modules():  # the model first, then its layers
        exposed = isinstance(getattr(type(sub), "attention", None), property)
        if exposed or callable(sub.__dict__.get("attention")):
            return sub.attention
    name = type(model).__name__
    found = _stored_elsewhere(model)
    if found is None:
        raise ModelContractError(
            f"{name}: no attention callable found: {ATTENTION_FIX} in set_attention(fn) "
            f'(docs/models.md, the model contract: "{ATTENTION_RULE}")'
        )
    previous, where = found
    warnings.warn(
        f"{name}.set_attention(fn) stores fn as `{where}`: {ATTENTION_FIX} instead "
        f'(docs/models.md, the model contract: "{ATTENTION_RULE}"); the old form is '
        f"accepted until {OLD_FORM_UNTIL}",
        FutureWarning,
        stacklevel=2,
    )
    return previous


class _Probe:
    """A callable no model holds yet, to see where ``set_attention`` stores it."""

    def __call__(self, q_SHD, k_SHD, v_SHD, cu_seqlens, causal, *, window=None):  # noqa: ANN001, ANN204
        return q_SHD


def _stored_elsewhere(model: nn.Module) -> tuple[object, str] | None:
    """``(the callable stored now, where)`` for a ``set_attention`` that stores ``fn``
    as a plain attribute under another name than ``attention``; ``None`` if it stores
    it nowhere that can be read back. Leaves the model as it found it."""
    set_attention = getattr(model, "set_attention", None)
    if set_attention is None:
        return None

    def attributes() -> dict[tuple[str, str], object]:
        return {
            (path, attr): value
            for path, sub in model.named_modules()
            for attr, value in vars(sub).items()
        }

    before = attributes()
    probe = _Probe()
    set_attention(probe)
    places = [key for key, value in attributes().items() if value is probe]
    previous = before.get(places[0]) if places else None
    if not callable(previous):
        return None  # cannot be restored; the error names the fix
    set_attention(previous)
    path, attr = places[0]
    return previous, ".".join(["self", *filter(None, [path]), attr])


def _never_sharded(model: nn.Module) -> bool:
    """The model declares ``max_sp_size = 1``: it never runs on a sequence shard (its
    loss needs whole samples, e.g. a per-sample router loss), so the shard check has no
    meaning for it."""
    return getattr(model, "max_sp_size", None) == 1


def _pick_samples(dataset: Dataset, count: int) -> list[int]:
    shapes = dataset.shapes()
    order = sorted(range(len(shapes)), key=lambda i: shapes[i].tokens)
    usable = [i for i in order if shapes[i].tokens >= 4]
    if len(usable) < count:
        raise ModelContractError(f"the check needs {count} samples of 4 tokens or more")
    return usable[:count]


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float) -> bool:
    scale = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) <= rtol * max(scale, 1e-12)


def check_pack_rows(dataset: Dataset, first: int, second: int) -> None:
    """Raise :class:`~datacentric.data.DataError` if ``dataset`` packs sample ``second``
    into other rows after sample ``first`` than alone (a ``pack`` that draws anew on each
    call, or mixes the samples it packs), or into another length than ``shapes()`` says,
    or counts other loss tokens (``loss_tokens``) than its ``loss_mask`` holds: the
    checks of the model below rest on the first two, and would blame the model; the last
    would weight every step's loss wrong, found at its first micro-batch."""
    name = type(dataset).__name__
    alone, both = dataset.pack([second], 1), dataset.pack([first, second], 1)
    tokens = dataset.shapes()[second].tokens
    if alone.num_tokens != tokens:
        raise DataError(
            f"{name}: shapes() gives sample {second} {tokens} tokens and pack([{second}]) "
            f"{alone.num_tokens}; shapes() must give each sample's packed length (docs/data.md)"
        )
    counted = getattr(dataset, "loss_tokens", None)
    masked = int(alone.loss_mask.sum())
    if callable(counted) and int(counted(second)) != masked:
        raise DataError(
            f"{name}: loss_tokens({second}) gives {int(counted(second))} and pack([{second}]) "
            f"has {masked} loss tokens (loss_mask); loss_tokens must count them (docs/data.md)"
        )
    start = int(both.cu_seqlens[1])
    for field in PER_TOKEN_FIELDS:
        if field != "segment_ids" and not torch.equal(
            getattr(alone, field), getattr(both, field)[start : start + tokens]
        ):
            raise DataError(
                f"{name}: sample {second} packed after sample {first} gets other {field} than "
                f"packed alone; pack must give a sample the same rows on every call, whatever "
                f'it is packed with (per-epoch draws from its epoch; docs/data.md: "{PACK_RULE}")'
            )


@torch.no_grad()
def check_model_contract(
    model: nn.Module,
    dataset: Dataset,
    *,
    sample_ids: Sequence[int] | None = None,
    rtol: float = 1e-4,
) -> None:
    """Raise :class:`ModelContractError` if ``model`` ignores sample boundaries or
    the batch's positions (see the module docstring). ``sample_ids`` picks the two
    samples (default: the two shortest with at least 4 tokens)."""
    first, second = sample_ids if sample_ids is not None else _pick_samples(dataset, 2)
    check_pack_rows(dataset, first, second)
    name = type(model).__name__
    device = next(model.parameters()).device

    def pack(ids: list[int], multiple: int):  # noqa: ANN202
        return dataset.pack(ids, multiple).to(device)

    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        alone = model(pack([second], 1)).float()
        packed_batch = pack([first, second], 1)
        packed = model(packed_batch).float()
        start = int(packed_batch.cu_seqlens[1])
        if not _close(packed[start : start + alone.shape[0]], alone, rtol):
            raise ModelContractError(
                f"{name}: sample {second}'s loss changes when packed after sample {first}: "
                "the model attends across samples, mixes them otherwise (a norm or mean "
                "over the batch's tokens, a loss averaged over it) or ignores "
                "batch.position_ids; route attention through set_attention(fn) with "
                "batch.cu_seqlens, keep every other layer per token and per sample, return "
                "the loss unreduced and take positions from batch.position_ids "
                f'(docs/models.md: "{BOUNDARY_RULE}")'
            )
        if getattr(model, "rebuilds_whole_samples", False) or _never_sharded(model):
            return
        previous = current_attention(model)
        model.set_attention(_queries)
        try:
            batch = pack([first], 2)
            half = batch.num_tokens // 2
            whole = model(batch).float()
            shard = model(batch.slice_tokens(half, batch.num_tokens)).float()
        finally:
            model.set_attention(previous)
        if not _close(shard, whole[half:], rtol):
            raise ModelContractError(
                f"{name}: a sequence shard of sample {first} gives other values than the "
                "same tokens of the whole sample: the model computes positions itself "
                "instead of reading batch.position_ids (global positions within each "
                "sample, also on a shard), or mixes tokens outside attention (a norm or "
                f'mean over the batch\'s tokens); docs/models.md: "{POSITION_RULE}"'
            )
    finally:  # each module's own flag, as the user set it (model.train() would reset all)
        for module, training in modes.items():
            module.training = training


#: what a model's own code raises when it cannot run as the ranks run it
_MODEL_ERRORS = (
    AssertionError,
    AttributeError,
    IndexError,
    KeyError,
    NotImplementedError,
    RuntimeError,  # torch's CheckpointError among them
    TypeError,
)


def check_small_copy(model: nn.Module, dataset: Dataset) -> list[int]:
    """For a Hugging Face model (:class:`~datacentric.models.hf.HFCausalLM`, possibly on
    the meta device): :func:`check_model_contract` on a small CPU copy that keeps every
    layer type and its per-layer config (:func:`~datacentric.models.hf.small_copy`), then
    one step of two packed samples with every block recomputed (the ranks' recomputation
    path), so that the refusals that show only when the model runs (attention sinks, a
    mask of the layer's own, layers that drop the packed layout, a layer that does not
    recompute as it ran) happen before ranks start. Raises ``ValueError`` (a refusal
    naming the feature, or :class:`ModelContractError`); other models pass. Returns how
    many times the copy's forward called each block (:func:`block_calls`; empty for
    other models), which the holding of the model must allow."""
    if type(model).__name__ != "HFCausalLM":
        return []
    from datacentric.models.hf import small_copy

    name = type(model.hf).__name__
    copy = small_copy(model)
    try:
        check_model_contract(copy, dataset)
    except _MODEL_ERRORS as err:  # raised in the model's own code (a refusal propagates)
        raise ModelContractError(
            f"{name} fails a forward pass of two packed samples: {type(err).__name__}: {err}"
        ) from err
    try:
        _recomputed_step(copy, dataset)
    except _MODEL_ERRORS as err:
        raise ModelContractError(
            f"{name} fails a step of two packed samples with its blocks recomputed (as the "
            f"ranks recompute them): {type(err).__name__}: {str(err).splitlines()[0]}"
        ) from err
    return block_calls(copy, dataset)


def check_text_rows(model: nn.Module, dataset: Dataset) -> None:
    """Raise ``ValueError`` naming the file, the tensor and its size when the model adds
    positions over a fixed number of text rows (a diffusers patch embedding with fixed
    or learned positions: CogVideoX with ``use_rotary_positional_embeddings=False`` adds
    its position table to ``max_text_seq_length`` text rows and the video tokens after
    them) and a sample's text embedding (``NAME.text.EXT``) holds another number of rows.
    Reads the files' headers only; other models pass."""
    from datacentric.data.latent_files import read_shape
    from datacentric.models.source import inner_pretrained

    inner = inner_pretrained(model)
    embed = getattr(inner, "patch_embed", None)
    fixed = getattr(embed, "use_positional_embeddings", False)
    if not (fixed or getattr(embed, "use_learned_positional_embeddings", False)):
        return
    rows = int(getattr(embed, "max_text_seq_length", 0) or 0)
    for path in getattr(dataset, "text_files", None) or ():
        if path is None or not rows:
            continue
        shape = read_shape(path)
        if shape[0] != rows:
            raise ValueError(
                f"{path}: the text embedding is {' x '.join(map(str, shape))}, and "
                f"{type(inner).__name__} adds fixed positions (use_rotary_positional_embeddings"
                f"=False) to max_text_seq_length={rows} text rows before the video tokens: "
                f"write every text file with {rows} rows, padded as its pipeline pads them "
                "(datacentric prepare does), or train a model with rotary positions"
            )


def check_latent_patches(model: nn.Module, dataset: Dataset) -> None:
    """Raise ``ValueError`` naming the sample, its file and the model's patch setting when
    a sample's latent (frames, height and width, padded to whole patches of the data:
    the dataset's ``patch``) is not whole patches of the model's own (``model.patch``,
    from its config's ``patch_size`` / ``patch_size_t``): the model's forward could not
    cut it (it failed inside the ranks). Reads the shapes only; models without a patch
    of their own, or whose tokens are the data's, pass."""
    patch, data_patch = getattr(model, "patch", None), getattr(model, "data_patch", None)
    if patch is None or data_patch is None:
        return
    shapes = dataset.shapes()
    bad = [
        (i, tuple(n * p for n, p in zip(shape.grid, data_patch)))
        for i, shape in enumerate(shapes)
        if shape.grid is not None
        and any(n * p % q for n, p, q in zip(shape.grid, data_patch, patch))
    ]
    if not bad:
        return
    (first, dims), more = bad[0], len(bad) - 1
    axes = [a for a, d, q in zip(("frames", "height", "width"), dims, patch) if d % q]
    source = getattr(dataset, "sample_source", None)
    where = f"sample {first} ({source(first)})" if callable(source) else f"sample {first}"
    config = getattr(model, "config", None)
    setting = (
        "patch_size_t" if axes == ["frames"] and _has(config, "patch_size_t") else "patch_size"
    )
    others = f" (and {more} other sample(s))" if more else ""
    raise ValueError(
        f"{where}{others}: a latent of {' x '.join(map(str, dims))} (frames x height x width, "
        f"padded to whole {' x '.join(map(str, data_patch))} patches) is not whole patches of "
        f"the model's {' x '.join(map(str, patch))} ({setting}): its {' and '.join(axes)} "
        f"must be multiples of the patch; give latents that are (a --bucket-config crops "
        f"them), or a model whose {setting} divides them (--model-arg {setting}=...)"
    )


def _has(config: object, key: str) -> bool:
    """Whether a diffusers config (a dict-like ``FrozenDict``) sets ``key``."""
    getter = getattr(config, "get", None)
    return callable(getter) and getter(key) is not None


def block_calls(model: nn.Module, dataset: Dataset) -> list[int]:
    """How many times each of ``model.blocks`` runs in one forward of two packed samples
    (without gradients, in ``eval()`` mode): 1 each, unless the model calls a block
    again (a recurrent-depth model looping over its layers)."""
    counts = [0] * len(model.blocks)

    def count(index: int, *_: object) -> None:
        counts[index] += 1

    hooks = [
        block.register_forward_pre_hook(functools.partial(count, index))
        for index, block in enumerate(model.blocks)
    ]
    training = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            model(dataset.pack(_pick_samples(dataset, 2), 1))
    finally:
        for hook in hooks:
            hook.remove()
        for module, mode in training.items():
            module.training = mode
    return counts


def _recomputed_step(model: nn.Module, dataset: Dataset) -> None:
    """Forward and backward of two packed samples with every block recomputed, in
    ``eval()`` mode (the copy, every parameter trained, is thrown away after)."""
    from datacentric.parallel.recompute import BlockRecompute

    model.eval()
    switch = BlockRecompute.apply(model)
    with switch.use((True,) * switch.num_blocks):
        loss = model(dataset.pack(_pick_samples(dataset, 2), 1)).float().sum()
        loss.backward()
