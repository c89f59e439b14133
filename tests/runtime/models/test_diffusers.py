"""diffusers video transformers through the generic path equal their own ``forward``.

The reference is the unmodified diffusers model (built from the same config and seed,
its own attention, no hook of ours) run on each sample alone, its inputs laid out as
the diffusers pipelines lay them out; the generic path packs several shapes (two clips
of one shape stacked) into one micro-batch. Loss and every gradient are compared.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

import diffusers  # noqa: E402

from datacentric.data.video import SyntheticVideoDataset  # noqa: E402
from datacentric.models.diffusers_build import (  # noqa: E402
    TINY_DIFFUSERS,
    build_diffusers_model,
    export_diffusers,
    text_width,
)
from datacentric.models.diffusers_generic import TIMESTEP_SCALE  # noqa: E402
from datacentric.models.diffusers_plan import UnsupportedVideoModel  # noqa: E402
from datacentric.shapes import SampleShape  # noqa: E402
from datacentric.verify.model_contract import check_model_contract  # noqa: E402
from datacentric.verify.reference import own_video_forward  # noqa: E402

# the repository (ranks import this module too, without tests/ on their path)
ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.usefixtures("one_thread")

GRIDS = [(1, 3, 4), (2, 2, 3), (1, 3, 4), (3, 2, 2)]
DATA_PATCH = (1, 2, 2)


def dataset(model, grids=GRIDS) -> SyntheticVideoDataset:  # noqa: ANN001
    shapes = [SampleShape.video(*g) for g in grids]
    width = text_width(model.config)
    return SyntheticVideoDataset(
        shapes, channels=model.config.in_channels, patch=DATA_PATCH, context_shape=(5, width)
    )


def unpatchify(tokens: torch.Tensor, grid: tuple[int, int, int], channels: int) -> torch.Tensor:
    """``(S, C * 4)`` data tokens -> ``(C, F, H, W)``: the inverse of ``data.video.patchify``."""
    f, h, w = grid
    pf, ph, pw = DATA_PATCH
    x = tokens.reshape(f, h, w, channels, pf, ph, pw).permute(3, 0, 4, 1, 5, 2, 6)
    return x.reshape(channels, f * pf, h * ph, w * pw)


def own_forward(name: str, model, latents: torch.Tensor, t: float, text: torch.Tensor):  # noqa: ANN001, ANN201
    """The diffusers model's own forward on one clip ``(1, C, F, H, W)``, as its pipeline
    calls it (``verify.reference.own_video_forward``, which shares no code with the
    adapters); returns the prediction ``(1, C, F, H, W)``."""
    del name  # the reference tells Wan from LTX-Video by the forward's parameters
    return own_video_forward(model, latents, torch.tensor([t * TIMESTEP_SCALE]), text)


def reference_loss(name: str, model, data: SyntheticVideoDataset, grids) -> torch.Tensor:  # noqa: ANN001
    """Mean over samples of each sample's velocity MSE, each sample alone."""
    channels = model.config.in_channels
    losses = []
    for i, grid in enumerate(grids):
        s = data.sample(i)
        noisy = unpatchify((1 - s.t) * s.x0 + s.t * s.noise, grid, channels)[None]
        target = unpatchify(s.noise - s.x0, grid, channels)[None]
        out = own_forward(name, model, noisy, s.t, s.context[None])
        losses.append((out - target).pow(2).mean())
    return torch.stack(losses).mean()


def packed_loss(model, data: SyntheticVideoDataset, ids: list[int]) -> torch.Tensor:  # noqa: ANN001
    batch = data.pack(ids, 1)
    loss_S = model(batch)
    mask = batch.loss_mask
    sums = torch.zeros(len(ids)).index_add(0, batch.segment_ids[mask], loss_S[mask])
    counts = torch.bincount(batch.segment_ids[mask], minlength=len(ids))
    return (sums / counts).mean()


def tiny_reference(name: str):  # noqa: ANN201
    class_name, config = TINY_DIFFUSERS[name]
    return getattr(diffusers, class_name).from_config(config)


@pytest.mark.parametrize("name", ["wan", "ltx", "wan-packed"])
def test_generic_path_equals_the_models_own_forward(name: str) -> None:
    from datacentric.models.diffusers_video import build_wan

    family = name.removesuffix("-packed")
    torch.manual_seed(0)
    reference = tiny_reference(family)
    torch.manual_seed(0)
    model = build_wan() if name == "wan-packed" else build_diffusers_model(name)
    data = dataset(model)
    ref = reference_loss(family, reference, data, GRIDS)
    ref.backward()
    ours = packed_loss(model, data, [0, 1, 2, 3])  # three shapes, two clips of one stacked
    ours.backward()
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=0)
    ref_grads = dict(reference.named_parameters())
    for param_name, param in model.transformer.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, param_name
        torch.testing.assert_close(
            param.grad, ref_grads[param_name].grad, rtol=1e-4, atol=1e-6, msg=param_name
        )


def test_contract_check_passes_and_recomputation_is_exact() -> None:
    from datacentric.parallel.recompute import BlockRecompute

    torch.manual_seed(0)
    model = build_diffusers_model("ltx")
    data = dataset(model)
    check_model_contract(model, data)
    plain = packed_loss(model, data, [3, 0])
    plain.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    switch = BlockRecompute.apply(model)
    with switch.use((True, False, True, True)):
        again = packed_loss(model, data, [3, 0])
        again.backward()
    torch.testing.assert_close(again, plain)
    for got, want in zip((p.grad for p in model.parameters()), grads):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        ("skyreels-v2", {"inject_sample_info": True}, "fps conditioning"),
        ("skyreels-v2", {"num_frame_per_block": 2}, "diffusion forcing"),
        ("hunyuan-video", {"image_condition_type": "token_replace"}, "image conditioning"),
        ("cogvideox", {"ofs_embed_dim": 32}, "image-to-video offsets"),
        ("ltx2", {}, "its forward needs audio_hidden_states, audio_encoder_hidden_states"),
        ("wan", {"image_dim": 16, "added_kv_proj_dim": 64}, "image_dim is set"),
    ],
)
def test_unsupported_models_are_refused_in_one_line(name, overrides, message) -> None:  # noqa: ANN001
    with pytest.raises(UnsupportedVideoModel, match=message) as caught:
        build_diffusers_model(name, **overrides)
    assert "\n" not in str(caught.value)


def test_a_shard_without_its_group_is_refused() -> None:
    torch.manual_seed(0)
    model = build_diffusers_model("wan")
    batch = dataset(model).pack([0], 2)
    with pytest.raises(ValueError, match="without its SP group"):
        model(batch.slice_tokens(0, batch.num_tokens // 2))


def test_folders_load_pretrained_weights_and_export_round_trips(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_diffusers_model("ltx", num_layers=2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)  # "trained": far from any fresh draw
    out = export_diffusers(model, tmp_path / "export")
    assert (out / "config.json").is_file() and list(out.glob("*.safetensors"))
    loaded = diffusers.LTXVideoTransformer3DModel.from_pretrained(out, local_files_only=True)
    want = model.transformer.state_dict()
    assert loaded.state_dict().keys() == want.keys()
    for key, value in loaded.state_dict().items():
        torch.testing.assert_close(value, want[key], rtol=0, atol=0)
    torch.manual_seed(1)
    again = build_diffusers_model(str(out))  # config + weights: the weights, not a draw
    for (key, value), (_, original) in zip(again.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(value, original, rtol=0, atol=0, msg=key)
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_text((out / "config.json").read_text())
    fresh = build_diffusers_model(str(config_only))  # config alone: random weights
    assert json.loads((config_only / "config.json").read_text())["num_layers"] == 2
    assert not torch.equal(fresh.transformer.proj_in.weight, model.transformer.proj_in.weight)
    halved = {k: v / 2 for k, v in model.state_dict().items()}
    export_diffusers(model, tmp_path / "from-state", state_dict=halved)
    reloaded = diffusers.LTXVideoTransformer3DModel.from_pretrained(tmp_path / "from-state")
    torch.testing.assert_close(reloaded.proj_in.weight, model.transformer.proj_in.weight / 2)


def test_a_folder_that_is_neither_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither a tiny name"):
        build_diffusers_model(str(tmp_path))


def test_a_folder_named_as_a_tiny_model_is_trained_as_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``diffusers:wan`` with a folder ``wan`` here is the folder, as resolve_model reads
    it, both in the pre-check's meta build and in the build that trains (which built the
    tiny Wan instead: 4 blocks, where the folder's config says 1)."""
    from datacentric.models.diffusers_families import family_of_tiny
    from datacentric.models.source import build_from_source, resolve_model

    tiny = family_of_tiny("wan")
    assert tiny is not None and tiny.tiny_config["num_layers"] != 1
    (tmp_path / "wan").mkdir()
    config = {"_class_name": tiny.transformer, **tiny.tiny_config, "num_layers": 1}
    (tmp_path / "wan" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    source = resolve_model("diffusers:wan")
    assert source.folder == Path("wan")
    for device in ("meta", None):
        model, _ = build_from_source(source, device=device)
        assert model.transformer.config.num_layers == 1


def padded_wan_case():  # noqa: ANN201
    """Wan on clips of 10 and 9 tokens: at SP 2 one is padded, and in one micro-batch
    both would pad to 10 (the adapter pads the 9 to 12)."""
    torch.manual_seed(0)
    model = build_diffusers_model("wan")
    return model, dataset(model, [(1, 3, 3), (1, 2, 5), (1, 3, 3)])


@pytest.mark.slow
def test_sp_2_with_padding_and_accumulation_equals_one_process(monkeypatch) -> None:  # noqa: ANN001
    from datacentric.verify.equivalence import check_equivalence

    monkeypatch.syspath_prepend(str(ROOT))
    (report,) = check_equivalence(["tests.runtime.models.test_diffusers:padded_wan_case"], 2)
    assert report["sp_sizes"] == [2] and report["accumulation_counts"] == [2]
    assert report["samples_per_micro_batch"] == [[2, 1]]
    assert report["passed"] and report["max_rel_grad_err"] <= 1e-5, report


def test_the_generic_path_is_offered_and_runs_no_ring_split(capsys) -> None:  # noqa: ANN001
    """The planner never offers a ring split for the generic path (its spec says Ulysses
    only; the packed Wan path, which shards like our own models, is offered rings), and
    ``equivalence --sp-split`` with a ring is refused in one line before ranks start."""
    from datacentric.cli.main import main
    from datacentric.models.diffusers_video import build_wan
    from datacentric.planning.bucket_options import split_candidates
    from datacentric.planning.spec_derivation import spec_of_model
    from datacentric.profiling.factory import analytic_cost_model, named_spec

    generic = analytic_cost_model(
        named_spec("diffusers:wan", {"num_attention_heads": 2}), "h200-sxm"
    )
    packed = analytic_cost_model(spec_of_model(build_wan(num_attention_heads=2)), "h200-sxm")
    assert split_candidates(packed, 16) == [8, 16]  # Ulysses 2 x ring 8, ring 16
    assert split_candidates(generic, 16) == []
    assert split_candidates(generic, 2) == [1]
    argv = ["equivalence", "--model", "diffusers:wan", "--model-arg", "num_attention_heads=2"]
    for split in ("1,4", "2,2"):
        assert main([*argv, "--world", "4", "--sp-split", split]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "runs rings of at most 1 position" in err, err


def _saved(folder: Path, class_name: str, config: dict) -> str:
    """A random-weight model of ``class_name`` saved as a diffusers folder."""
    torch.manual_seed(0)
    getattr(diffusers, class_name).from_config(config).save_pretrained(folder)
    return f"diffusers:{folder}"


#: image models whose tokens no family declares, and a Helios shorter than its own plan
REFUSED_FOLDERS = {
    "flux2": (
        "Flux2Transformer2DModel",
        {
            "in_channels": 16,
            "num_layers": 1,
            "num_single_layers": 1,
            "attention_head_dim": 16,
            "num_attention_heads": 2,
            "joint_attention_dim": 32,
            "timestep_guidance_channels": 32,
            "axes_dims_rope": (4, 4, 4, 4),
        },
        "Flux2Transformer2DModel is an image model",
    ),
    "qwenimage": (
        "QwenImageTransformer2DModel",
        {
            "in_channels": 16,
            "out_channels": 4,
            "num_layers": 1,
            "attention_head_dim": 16,
            "num_attention_heads": 2,
            "joint_attention_dim": 32,
            "axes_dims_rope": (4, 6, 6),
        },
        "QwenImageTransformer2DModel is an image model",
    ),
    "helios-2-blocks": (
        "HeliosTransformer3DModel",
        {**TINY_DIFFUSERS["helios"][1], "num_layers": 2},
        "it is written for 40 blocks, and this config has num_layers = 2",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED_FOLDERS))
def test_saved_folders_are_refused_by_the_pre_check_naming_the_cause(
    tmp_path: Path, name: str
) -> None:
    """What ``train`` builds before any rank starts (the model on the meta device, its
    class and config checked first) refuses the folder in one line naming the cause."""
    from datacentric.models.source import build_from_source, resolve_model

    class_name, config, cause = REFUSED_FOLDERS[name]
    source = resolve_model(_saved(tmp_path / name, class_name, config))
    with pytest.raises(UnsupportedVideoModel, match=cause) as caught:
        build_from_source(source, device="meta")
    assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_train_refuses_an_image_model_before_ranks_start(tmp_path: Path, capsys) -> None:
    """``train`` on a saved QwenImage folder: exit 2, one line naming the cause, no
    traceback, no rank started (it failed inside the ranks with a shape error). The
    command runs in this process: the check runs before any rank starts."""
    from datacentric.cli.main import main

    class_name, config, cause = REFUSED_FOLDERS["qwenimage"]
    model = _saved(tmp_path / "qwenimage", class_name, config)
    status = main(["train", "--model", model, "--world", "2", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert status == 2, err[-2000:]
    lines = [line for line in err.strip().splitlines() if line.startswith("datacentric")]
    assert len(lines) == 1 and cause in lines[0], err[-2000:]
    assert "Traceback" not in err and not (tmp_path / "run" / "checkpoints").exists()
