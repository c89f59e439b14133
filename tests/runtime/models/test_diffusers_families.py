"""The declared diffusers families (SkyReels-V2, CogVideoX, HunyuanVideo, Flux), and
ChronoEdit (its own plan; a 2-frame clip takes its temporal rotary skip), equal their own
``forward`` called as their pipelines call it.

The reference is the unmodified diffusers model (same config and seed, its own
attention, no hook of ours) run on each clip alone with the inputs its pipeline passes
(``verify.diffusers_calls``: CogVideoX's rotary grid, HunyuanVideo's text mask, pooled
projections and guidance, Flux's packed tokens and image ids). One process: a
micro-batch of several shapes, two clips of one shape stacked; two processes: SP 2,
two micro-batches, recomputation, through ``check_equivalence``; four processes: SP
sizes and accumulation mixed. Each world's cases run in one start of its ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

import diffusers  # noqa: E402
from test_diffusers import packed_loss  # noqa: E402

from datacentric.data.video import SyntheticVideoDataset, VideoSample  # noqa: E402
from datacentric.models.diffusers_build import (  # noqa: E402
    TINY_DIFFUSERS,
    build_diffusers_model,
    text_width,
)
from datacentric.models.diffusers_generic import DiffusersVideoTransformer  # noqa: E402
from datacentric.shapes import SampleShape  # noqa: E402
from datacentric.verify.reference import own_video_forward  # noqa: E402

# the repository (ranks import this module too, without tests/ on their path)
ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = ("skyreels-v2", "cogvideox", "hunyuan-video", "flux")
VIDEO_GRIDS = [(1, 3, 4), (2, 2, 3), (1, 3, 4), (3, 2, 2)]
IMAGE_GRIDS = [(1, 3, 4), (1, 2, 3), (1, 3, 4), (1, 2, 2)]  # images of several sizes


class MaskedText(SyntheticVideoDataset):
    """Odd samples' last two text rows are zeros: padding the model's text mask hides."""

    def sample(self, sample_id: int, epoch: int = 0) -> VideoSample:
        sample = super().sample(sample_id, epoch)
        if sample_id % 2 and sample.context is not None:
            sample.context[-2:] = 0
        return sample


def dataset(model, grids, cls=SyntheticVideoDataset) -> SyntheticVideoDataset:  # noqa: ANN001
    return cls(
        [SampleShape.video(*g) for g in grids],
        channels=model.channels,
        patch=(1, 2, 2),
        context_shape=(6, text_width(model.config)),
    )


def unpatchify(tokens: torch.Tensor, grid: tuple[int, int, int], channels: int) -> torch.Tensor:
    f, h, w = grid
    x = tokens.reshape(f, h, w, channels, 1, 2, 2).permute(3, 0, 4, 1, 5, 2, 6)
    return x.reshape(channels, f, h * 2, w * 2)


def reference_loss(model, data: SyntheticVideoDataset, grids) -> torch.Tensor:  # noqa: ANN001
    """Mean over clips of each clip's velocity MSE, each clip alone."""
    losses = []
    for i, grid in enumerate(grids):
        s = data.sample(i)
        noisy = unpatchify((1 - s.t) * s.x0 + s.t * s.noise, grid, data.channels)[None]
        target = unpatchify(s.noise - s.x0, grid, data.channels)[None]
        out = own_video_forward(model, noisy, torch.tensor([s.t * 1000.0]), s.context[None])
        losses.append((out - target).pow(2).mean())
    return torch.stack(losses).mean()


@pytest.mark.parametrize("name", [*FAMILIES, "chronoedit", "helios"])
def test_family_equals_its_own_forward_as_its_pipeline_calls_it(name: str) -> None:
    class_name, config = TINY_DIFFUSERS[name]
    grids = IMAGE_GRIDS if name == "flux" else VIDEO_GRIDS
    torch.manual_seed(0)
    reference = getattr(diffusers, class_name).from_config(config)
    torch.manual_seed(0)
    model = build_diffusers_model(name)
    data = dataset(model, grids, MaskedText if name == "hunyuan-video" else SyntheticVideoDataset)
    ref = reference_loss(reference, data, grids)
    ref.backward()
    ours = packed_loss(model, data, [0, 1, 2, 3])
    ours.backward()
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=0)
    ref_grads = dict(reference.named_parameters())
    for param_name, param in model.transformer.named_parameters():
        if ref_grads[param_name].grad is None:  # unused by the clips (Helios's history)
            assert name == "helios" and param.grad is None, param_name
            continue
        assert param.grad is not None, param_name
        torch.testing.assert_close(
            param.grad, ref_grads[param_name].grad, rtol=1e-4, atol=1e-6, msg=param_name
        )


def test_the_text_mask_changes_hunyuan_videos_prediction() -> None:
    """The mask is read from the text file (rows of zeros), not ignored."""
    torch.manual_seed(0)
    model = build_diffusers_model("hunyuan-video")
    plain = dataset(model, VIDEO_GRIDS[:2])
    masked = dataset(model, VIDEO_GRIDS[:2], MaskedText)
    with torch.no_grad():
        a, b = model(plain.pack([1], 1)), model(masked.pack([1], 1))
    assert not torch.allclose(a, b)


def masked_hunyuan_case():  # noqa: ANN201
    """HunyuanVideo with padded text (its mask) on clips of 12, 12 and 6 tokens."""
    torch.manual_seed(0)
    model = build_diffusers_model("hunyuan-video")
    return model, dataset(model, [(1, 3, 4), (2, 2, 3), (1, 2, 3)], MaskedText)


def helios_case():  # noqa: ANN201
    """Helios with 4 blocks and its class's own plan for them (the entries of blocks 0-3;
    the plan splits and gathers around each block's attention and feed-forward, so a
    recomputed block replays hooks that read the clips' split)."""
    class_name, config = TINY_DIFFUSERS["helios"]
    cls = getattr(diffusers, class_name)
    plan = {
        key: entry
        for key, entry in cls._cp_plan.items()
        if not key.split(".")[1].isdigit() or int(key.split(".")[1]) < 4
    }
    torch.manual_seed(0)
    model = DiffusersVideoTransformer(cls.from_config({**config, "num_layers": 4}), cp_plan=plan)
    return model, dataset(model, VIDEO_GRIDS)


SP_2_CASES = [
    *("diffusers:skyreels-v2", "diffusers:cogvideox", "diffusers:flux", "diffusers:chronoedit"),
    "tests.runtime.models.test_diffusers_families:masked_hunyuan_case",
    "tests.runtime.models.test_diffusers_families:helios_case",
]


def _reports(cases: list[str], world: int) -> dict[str, dict]:
    """Each case's equivalence report, every case in one start of ``world`` ranks (a
    start imports the diffusers models in each rank: most of a case's time)."""
    from datacentric.verify.equivalence import check_equivalence

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT))
        return dict(zip(cases, check_equivalence(cases, world), strict=True))


@pytest.fixture(scope="module")
def sp_2_reports() -> dict[str, dict]:
    return _reports(SP_2_CASES, 2)


@pytest.fixture(scope="module")
def world_4_reports() -> dict[str, dict]:
    return _reports([f"diffusers:{name}" for name in FAMILIES], 4)


@pytest.mark.slow
@pytest.mark.parametrize("case", SP_2_CASES)
def test_sp_2_with_accumulation_and_recomputation_equals_one_process(
    case: str, sp_2_reports: dict[str, dict]
) -> None:
    report = sp_2_reports[case]
    assert report["model"] == case and report["world"] == 2, report
    assert report["sp_sizes"] == [2] and report["accumulation_counts"] == [2], report
    assert any(n for mbs in report["recomputed_blocks"] for n in mbs), report
    assert report["passed"] and report["max_rel_grad_err"] <= 1e-5, report


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_world_4_mixes_sp_sizes_and_accumulation_and_equals_one_process(
    name: str, world_4_reports: dict[str, dict]
) -> None:
    report = world_4_reports[f"diffusers:{name}"]
    assert report["model"] == f"diffusers:{name}" and report["world"] == 4, report
    assert max(report["sp_sizes"]) == 2 and max(report["accumulation_counts"]) > 1, report
    assert report["passed"] and report["max_rel_grad_err"] <= 1e-5, report


@pytest.mark.parametrize("name", FAMILIES)
def test_the_planner_counts_every_block_recomputation_wraps(name: str) -> None:
    """HunyuanVideo's and Flux's single-stream blocks count as blocks of the plan."""
    from datacentric.planning.spec_derivation import spec_of_model

    model = build_diffusers_model(name)
    assert len(spec_of_model(model).block_kinds) == len(model.blocks) >= 2
