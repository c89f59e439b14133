"""An unmodified diffusers Wan transformer under the packed contract equals its own
``forward``, sample by sample (loss and every gradient)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")

from diffusers import WanTransformer3DModel  # noqa: E402

from datacentric.data.video import SyntheticVideoDataset  # noqa: E402
from datacentric.models.diffusers_video import (  # noqa: E402
    TIMESTEP_SCALE,
    TINY_WAN,
    UnsupportedVideoModel,
    build_wan,
)
from datacentric.shapes import SampleShape  # noqa: E402
from datacentric.verify.model_contract import check_model_contract  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

GRIDS = [(1, 3, 4), (2, 2, 3), (3, 2, 2)]
PATCH = tuple(TINY_WAN["patch_size"])


def dataset() -> SyntheticVideoDataset:
    shapes = [SampleShape.video(*g) for g in GRIDS]
    channels = TINY_WAN["in_channels"]
    return SyntheticVideoDataset(
        shapes, channels=channels, patch=PATCH, context_shape=(5, TINY_WAN["text_dim"])
    )


def unpatchify(tokens: torch.Tensor, grid: tuple[int, int, int], channels: int) -> torch.Tensor:
    """``(S, C * patch volume)`` -> ``(C, F, H, W)``: the inverse of ``data.video.patchify``."""
    f, h, w = grid
    pf, ph, pw = PATCH
    x = tokens.reshape(f, h, w, channels, pf, ph, pw).permute(3, 0, 4, 1, 5, 2, 6)
    return x.reshape(channels, f * pf, h * ph, w * pw)


def reference_loss(model: WanTransformer3DModel, data: SyntheticVideoDataset) -> torch.Tensor:
    """The model's own forward on each sample alone; mean over samples of their MSE."""
    channels = TINY_WAN["in_channels"]
    losses = []
    for i, grid in enumerate(GRIDS):
        s = data.sample(i)
        noisy = unpatchify((1 - s.t) * s.x0 + s.t * s.noise, grid, channels)[None]
        target = unpatchify(s.noise - s.x0, grid, channels)[None]
        out = model(
            hidden_states=noisy,
            timestep=torch.tensor([s.t * TIMESTEP_SCALE]),
            encoder_hidden_states=s.context[None],
        ).sample
        losses.append((out - target).pow(2).mean())
    return torch.stack(losses).mean()


def packed_loss(model, data: SyntheticVideoDataset, ids: list[int]) -> torch.Tensor:  # noqa: ANN001
    batch = data.pack(ids, 1)
    loss_S = model(batch)
    sums = torch.zeros(len(ids)).index_add(
        0, batch.segment_ids[batch.loss_mask], loss_S[batch.loss_mask]
    )
    counts = torch.bincount(batch.segment_ids[batch.loss_mask], minlength=len(ids))
    return (sums / counts).mean()


def test_packed_adapter_equals_the_models_own_forward() -> None:
    data = dataset()
    torch.manual_seed(0)
    reference = WanTransformer3DModel(**TINY_WAN)
    torch.manual_seed(0)
    adapter = build_wan()
    ref = reference_loss(reference, data)
    ref.backward()
    ours = packed_loss(adapter, data, [0, 1, 2])  # three shapes packed in one micro-batch
    ours.backward()
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=0)
    ref_grads = dict(reference.named_parameters())
    for name, param in adapter.transformer.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
        torch.testing.assert_close(param.grad, ref_grads[name].grad, rtol=1e-4, atol=1e-6)


def test_contract_check_passes_and_recomputation_is_exact() -> None:
    from datacentric.parallel.recompute import BlockRecompute

    data = dataset()
    torch.manual_seed(0)
    model = build_wan()
    check_model_contract(model, data)
    plain = packed_loss(model, data, [2, 0])
    plain.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    switch = BlockRecompute.apply(model)
    with switch.use((True, False, True, True)):
        again = packed_loss(model, data, [2, 0])
        again.backward()
    torch.testing.assert_close(again, plain)
    for got, want in zip((p.grad for p in model.parameters()), grads):
        torch.testing.assert_close(got, want)


def test_unsupported_configs_are_refused() -> None:
    with pytest.raises(UnsupportedVideoModel, match="image conditioning"):
        build_wan(image_dim=16, added_kv_proj_dim=64)
    with pytest.raises(UnsupportedVideoModel, match="frame patches"):
        build_wan(patch_size=(2, 2, 2))
    model = build_wan(rope_max_seq_len=2)
    with pytest.raises(UnsupportedVideoModel, match="rope_max_seq_len of 2"):
        model(dataset().pack([0], 1))
