"""``[training] caption_dropout`` and ``timestep_sampling``, and latents drawn from the
VAE's Gaussian (``prepare --latent-dist sample``): every draw comes from the sample's
generator ``sample_generator(seed, sample id, epoch)`` in the documented order (a plain
diffusers / torch reference gives the same ``t``, noise, caption and latent), the
dropped share is the probability, and a Wan fine-tune's loss is the same at worlds 1, 2
and 4 under two policies."""

from __future__ import annotations

import json
import math

import pytest
import torch
from cli_here import cli_here

from datacentric.data.base import DataError, sample_generator
from datacentric.data.diffusion_draws import DiffusionDraws
from datacentric.data.latents import EMPTY_PROMPT, LatentDataset
from datacentric.data.video import patchify

pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

SEED = 7
DRAWS = DiffusionDraws(caption_dropout=0.5, timestep_sampling="logit_normal", logit_std=1.3)


def _latents(folder, count: int = 6, empty: bool = True, logvar: bool = False) -> str:
    """``count`` Wan latents (4 channels) of two sizes with their text rows, and the
    empty-prompt embedding ``prepare`` writes; ``logvar``: each latent a mean with its
    log-variance, listed by a manifest (as ``prepare --latent-dist sample`` writes)."""
    from safetensors.torch import save_file

    folder.mkdir()
    generator = torch.Generator().manual_seed(0)
    lines = []
    for i in range(count):
        latent = torch.randn(1 + i % 2, 4, 4, 4 + 2 * (i % 2), generator=generator)
        save_file({"latent": latent}, str(folder / f"c{i:02d}.safetensors"))
        text = torch.randn(5, 32, generator=generator)
        save_file({"latent": text}, str(folder / f"c{i:02d}.text.safetensors"))
        line = {"latent": f"c{i:02d}.safetensors", "text": f"c{i:02d}.text.safetensors"}
        if logvar:
            spread = torch.randn(latent.shape, generator=generator) * 0.5 - 2.0
            save_file({"logvar": spread}, str(folder / f"c{i:02d}.logvar.safetensors"))
            line["logvar"] = f"c{i:02d}.logvar.safetensors"
        lines.append(json.dumps(line))
    if logvar:
        (folder / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    if empty:
        save_file({"latent": torch.randn(5, 32, generator=generator)}, str(folder / EMPTY_PROMPT))
    return str(folder)


def test_each_draw_is_the_documented_generators(tmp_path):
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
    from diffusers.training_utils import compute_density_for_timestep_sampling
    from safetensors.torch import load_file

    folder = _latents(tmp_path / "latents")
    sampled = _latents(tmp_path / "sampled", logvar=True)
    shift = DiffusionDraws(timestep_sampling="shift", flow_shift=3.0)
    for draws, where in ((DRAWS, folder), (shift, folder), (DRAWS, sampled)):
        ds = LatentDataset(where, seed=SEED, draws=draws)
        empty = load_file(f"{where}/{EMPTY_PROMPT}")["latent"]
        for epoch in (0, 3):
            for i in range(len(ds)):
                batch = ds.pack([i], epoch=epoch)
                gen = sample_generator(SEED, i, epoch)  # the documented generator
                if draws.timestep_sampling == "logit_normal":
                    t = compute_density_for_timestep_sampling(
                        "logit_normal", 1, logit_mean=0.0, logit_std=1.3, generator=gen
                    )
                else:
                    u = torch.rand((), generator=gen)
                    t = 3.0 * u / (1 + 2.0 * u)
                noise = torch.randn(batch.inputs.shape, generator=gen)
                torch.randint(0, 1, (), generator=gen)  # the frame offset (whole latents)
                dropped = bool(torch.rand((), generator=gen) < draws.caption_dropout)
                latent = load_file(str(ds.files[i]))["latent"].permute(1, 0, 2, 3)
                if ds.logvars[i] is not None:  # diffusers' own draw from the VAE's Gaussian
                    logvar = load_file(str(ds.logvars[i]))["logvar"].permute(1, 0, 2, 3)
                    dist = DiagonalGaussianDistribution(torch.cat([latent, logvar])[None])
                    latent = dist.sample(generator=gen)[0]
                x0 = patchify(latent)
                assert float(batch.sample_cond[0]) == pytest.approx(float(t), abs=1e-7)
                t = float(batch.sample_cond[0])
                torch.testing.assert_close(batch.inputs, (1 - t) * x0 + t * noise)
                torch.testing.assert_close(batch.targets, noise - x0)
                text = load_file(str(ds.text_files[i]))["latent"]
                assert torch.equal(batch.sample_context[0], empty if dropped else text)
    # the shift is the flow-matching scheduler's own: its sigmas, shifted, are this map
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    plain = torch.linspace(1, 1000, 1000, dtype=torch.float64).flip(0) / 1000
    shifted = (3 * plain / (1 + 2 * plain)).float()
    torch.testing.assert_close(scheduler.sigmas.float(), shifted, rtol=1e-6, atol=1e-6)


def test_the_dropped_share_is_the_probability(tmp_path):
    from safetensors.torch import load_file

    ds = LatentDataset(_latents(tmp_path / "latents", count=40), seed=SEED, draws=DRAWS)
    empty = load_file(str(ds.empty_prompt))["latent"]
    drawn = [
        torch.equal(ds.sample(i, epoch).context, empty) for epoch in range(6) for i in range(40)
    ]
    n = len(drawn)
    assert n >= 200
    assert abs(sum(drawn) / n - 0.5) <= 3 * math.sqrt(0.25 / n), sum(drawn)
    # without dropout no sample trains on the empty prompt, and uniform t is unchanged
    plain = LatentDataset(ds.source, seed=SEED)
    assert plain.empty_prompt is None
    u = float(torch.rand((), generator=sample_generator(SEED, 3, 2)))
    assert float(plain.pack([3], epoch=2).sample_cond[0]) == pytest.approx(u, abs=0)


def test_the_settings_are_refused_off_latents():
    from datacentric.data.sources import open_dataset

    for spec in ("opensora-short", "stdlib"):
        with pytest.raises(DataError, match="apply to latents:DIR datasets only"):
            open_dataset(spec, draws=DRAWS)
    assert len(open_dataset("opensora-short", draws=DiffusionDraws())) > 0  # the defaults


def test_a_folder_without_the_empty_prompt_is_refused(tmp_path, capsys):
    folder = _latents(tmp_path / "latents", empty=False)
    with pytest.raises(DataError, match="rerun datacentric prepare with the same settings"):
        LatentDataset(folder, draws=DRAWS)
    LatentDataset(folder, draws=DiffusionDraws(timestep_sampling="logit_normal"))  # no dropout
    argv = ["train", "--model", "diffusers:wan", "--model-arg", "num_attention_heads=2"]
    argv += ["--dataset", f"latents:{folder}", "--no-progress", "--out", str(tmp_path / "run")]
    status, _, err = cli_here([*argv, "--training.caption_dropout", "0.5"], capsys)
    assert status == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("datacentric train: latents:") and "empty_prompt" in line, err
    assert not (tmp_path / "run" / "config.json").exists()  # no rank started
    status, _, err = cli_here([*argv, "--caption-dropout", "1.5"], capsys)
    assert status == 2 and "training.caption_dropout: a probability from 0 to 1" in err


POLICIES = ("static", "dcp-pac")


def train_policies(folder: str, steps: int = 2) -> dict[str, list[float]]:
    """On this rank: ``steps`` steps of a 2-head Wan transformer on ``folder`` under each
    policy, from the same weights; the losses per policy."""
    from datacentric.models.source import build_from_source, resolve_model
    from datacentric.parallel.groups import ProcessGroups
    from datacentric.train.data_centric import DataCentric

    groups = ProcessGroups() if torch.distributed.is_initialized() else ProcessGroups.local()
    torch.set_num_threads(1)
    dataset = LatentDataset(folder, seed=SEED, draws=DRAWS)
    out = {}
    for policy in POLICIES:
        torch.manual_seed(0)
        source = resolve_model("diffusers:wan", ["num_attention_heads=2"])
        model, _ = build_from_source(source, dataset=dataset)
        dc = DataCentric(
            model,
            dataset,
            policy=policy,
            tokens_per_iteration=96,
            seed=SEED,
            groups=groups,
            prefetch=0,
            check_model=False,
        )
        optimizer = torch.optim.AdamW(dc.model.parameters(), lr=1e-3)
        losses = []
        for step in dc.steps(epochs=None, iterations=steps):
            for micro in step:
                micro.backward(dc.model(micro.batch))
            losses.append(step.finish())
            optimizer.step()
            optimizer.zero_grad()
        dc.close()
        out[policy] = losses
    return out


@pytest.mark.slow
def test_the_loss_does_not_depend_on_world_or_policy(tmp_path):
    from datacentric.parallel.launch import launch

    folder = _latents(tmp_path / "latents", count=8, logvar=True)
    runs = {(1, p): losses for p, losses in train_policies(folder).items()}
    for world in (2, 4):
        ranks = launch(train_policies, folder, nproc=world, collective_timeout_s=120.0)
        for policy, losses in ranks[0].items():
            runs[(world, policy)] = losses
    reference = runs[(1, "static")]
    assert len(reference) == 2 and all(math.isfinite(x) for x in reference)
    for key, losses in runs.items():
        torch.testing.assert_close(
            torch.tensor(losses, dtype=torch.float64),
            torch.tensor(reference, dtype=torch.float64),
            rtol=0.0,
            atol=1e-5,
            msg=lambda m, key=key: f"{key}: {m}",
        )
    # the draws move the loss: the same run with uniform t and captions kept differs
    plain = LatentDataset(folder, seed=SEED)
    assert any(
        float(plain.pack([i]).sample_cond[0])
        != float(LatentDataset(folder, seed=SEED, draws=DRAWS).pack([i]).sample_cond[0])
        for i in range(8)
    )


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"caption_dropout": 0.1}, "training.caption_dropout (0.5 -> 0.1)"),
        ({"timestep_sampling": "uniform"}, "training.timestep_sampling ('logit_normal' -> "),
        ({"logit_std": 1.0}, "training.logit_std (1.3 -> 1.0)"),
    ],
)
def test_a_resume_with_other_draws_is_refused(tmp_path, changed, named):
    """The draws are the sample stream: a resume with another caption dropout or
    timestep sampling is refused naming the setting (before, it trained on with other
    draws, as the learning rate may change); the learning rate still may."""
    from datacentric.settings import load_config
    from datacentric.train.checkpoints.checkpoint_folders import CheckpointError
    from datacentric.train.checkpoints.resume import check_unchanged

    draws = dict(caption_dropout=0.5, timestep_sampling="logit_normal", logit_std=1.3)
    saved = load_config(None, out=str(tmp_path), **draws).to_json()
    state = {"config": saved, "dataset_fingerprint": "f"}
    path = tmp_path / "checkpoints" / "step-00000002"
    check_unchanged(
        path, state, load_config(None, out=str(tmp_path), lr=0.5, **draws).to_json(), "f"
    )
    now = load_config(None, out=str(tmp_path), **{**draws, **changed}).to_json()
    with pytest.raises(CheckpointError, match="changed since it was saved") as refused:
        check_unchanged(path, state, now, "f")
    assert named in str(refused.value), refused.value
