"""Validation during training: the held-out loss equals a single-process computation of
the same objective on the same samples (the model's own forward, one sample at a time),
at worlds 1, 2 and 4, and validating never changes training (losses and final weights
bitwise those of the same run with ``every = 0``)."""

from __future__ import annotations

import json

import pytest
import torch
from run_config import small_config

from datacentric.data import StdlibCorpus, SyntheticTextDataset, SyntheticVideoDataset
from datacentric.data.base import SampleSubset
from datacentric.data.holdout import split_ids
from datacentric.models import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import launch, spawn
from datacentric.planning.sharding import ShardingSpec
from datacentric.shapes import SampleShape
from datacentric.train.checkpoints.checkpoint_load import read_model_state
from datacentric.train.checkpoints.checkpoint_verify import latest_checkpoint
from datacentric.train.data_centric import DataCentric
from datacentric.train.reporting.metrics import read_metrics
from datacentric.train.trainer import train_rank
from datacentric.train.validation.held_out import build_run_data

pytestmark = pytest.mark.usefixtures("one_thread")

#: video clips of mixed sizes (latent grids), and text of mixed lengths
VIDEO_SHAPES = [SampleShape.video(*g) for g in ((1, 3, 4), (2, 3, 3), (3, 2, 5), (1, 2, 2))]
VIDEO_SHAPES += [SampleShape.video(*g) for g in ((2, 4, 4), (1, 1, 3), (2, 2, 2))]
TEXT_SHAPES = [SampleShape.text(n) for n in (17, 40, 5, 64, 9, 33, 120, 3)]


def reference_loss(model: torch.nn.Module, dataset) -> float:
    """The objective on one process: the model's own forward on each sample alone; per
    token, the mean over every loss token of the set; per sample, the mean over samples
    of each one's mean token loss."""
    model.eval()
    sums, counts = [], []
    with torch.no_grad():
        for i in range(len(dataset)):
            batch = dataset.pack([i], 1)
            loss_S = model(batch).double()
            sums.append(float(loss_S[batch.loss_mask].sum()))
            counts.append(int(batch.loss_mask.sum()))
    if model.loss_mode == "token":
        return sum(sums) / sum(counts)
    means = [s / n for s, n in zip(sums, counts) if n]
    return sum(means) / len(means)


def _data(kind: str):
    if kind == "video":
        return SyntheticVideoDataset(VIDEO_SHAPES, seed=7)
    return SyntheticTextDataset(TEXT_SHAPES, seed=7)


def held_out_loss(kind: str, shard: str) -> float:
    """On this rank: the held-out loss of a fresh preset model (seed 0) under DataCentric."""
    groups = ProcessGroups() if torch.distributed.is_initialized() else ProcessGroups.local()
    torch.manual_seed(0)
    name = "dit" if kind == "video" else "llama"
    dataset = _data(kind)
    dc = DataCentric(
        build_model(name),
        dataset,
        preset=name,
        groups=groups,
        prefetch=0,
        check_model=False,
        shard=shard,
        tokens_per_iteration=128,
    )
    try:
        first = dc.evaluate(dataset)
        assert dc.evaluate(dataset) == first  # fixed noise and time: the same number again
        return first
    finally:
        dc.close()


@pytest.mark.parametrize(
    ("kind", "worlds", "shard"),
    [
        ("video", (1, 2, 4), "none"),
        ("text", (1, 2), "fsdp2"),
        ("video", (2,), "ddp"),
        ("text", (2,), ShardingSpec("fsdp2", reshard_after_forward=True)),
    ],
)
def test_held_out_loss_equals_one_process_on_any_world(kind, worlds, shard):
    torch.manual_seed(0)
    model = build_model("dit" if kind == "video" else "llama")
    want = reference_loss(model, _data(kind))
    for world in worlds:
        if world == 1:
            got = held_out_loss(kind, shard)
        else:
            ranks = launch(held_out_loss, kind, shard, nproc=world, collective_timeout_s=120.0)
            assert len({ranks[r] for r in range(world)}) == 1  # every rank has the number
            got = ranks[0]
        assert got == pytest.approx(want, rel=1e-5), (kind, world)


def test_split_is_seeded_disjoint_and_whole():
    kept, held = split_ids(50, 0.1, seed=3)
    assert len(held) == 5 and not set(kept) & set(held)
    assert sorted(kept + held) == list(range(50))
    assert split_ids(50, 0.1, seed=3) == (kept, held)
    assert split_ids(50, 0.1, seed=4)[1] != held
    with pytest.raises(ValueError, match="leaves none to train on"):
        split_ids(1, 0.5, seed=0)
    corpus = StdlibCorpus(max_tokens=64, limit=3)
    view = SampleSubset(corpus, [2, 0])
    assert view.shapes() == [corpus.shapes()[2], corpus.shapes()[0]]
    batch = view.pack([1, 0], 4)
    assert batch.sample_ids == (1, 0)
    torch.testing.assert_close(batch.inputs, corpus.pack([0, 2], 4).inputs)
    assert view.loss_tokens(0) == corpus.loss_tokens(2)


SETTINGS = dict(
    iterations=3,
    dataset_limit=2,
    max_tokens=256,
    tokens_per_iteration=512,
    lr_schedule="constant",
    warmup_iterations=0,
    validation_dataset="split=0.25",
)


def _train(out, world: int, **overrides):
    config = small_config(out, **{**SETTINGS, **overrides})
    if world == 1:
        return train_rank(config), config
    return spawn(train_rank, world, config, timeout_s=300)[0], config


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_validation_is_exact_and_never_changes_training(tmp_path, world):
    plain, _ = _train(tmp_path / "plain", world, validation_every=0)
    result, config = _train(tmp_path / "val", world, validation_every=2)
    assert result.losses == plain.losses  # bitwise
    assert result.weights_sha256 == plain.weights_sha256
    assert plain.val_losses == [] and [s for s, _ in result.val_losses] == [2, 3]
    records = read_metrics(tmp_path / "val")
    assert [r["iteration"] for r in records if "val_loss" in r] == [1, 2]
    assert all(r["val_time_s"] > 0 for r in records if "val_loss" in r)
    # the last one against one process, on the final weights and the held-out samples
    train_set, held = build_run_data(config.data, config.validation, config.job.seed)
    whole = len(StdlibCorpus(max_tokens=256, limit=2))
    assert len(train_set) + len(held) == whole and len(held) == round(whole / 4)
    torch.manual_seed(0)
    model = build_model("llama")
    model.load_state_dict(read_model_state(latest_checkpoint(tmp_path / "val")))
    assert result.val_losses[-1][1] == pytest.approx(reference_loss(model, held), rel=1e-5)
    best = min(result.val_losses, key=lambda p: p[1])
    assert (result.best_val_step, result.best_val_loss) == best
    if world == 1:  # TensorBoard holds the same keys, at the records' iterations
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(tmp_path / "val" / "tb"))
        events.Reload()
        scalars = {e.step: e.value for e in events.Scalars("val_loss")}
        assert scalars == pytest.approx({s - 1: v for s, v in result.val_losses})
        assert "val_time_s" in events.Tags()["scalars"]
        assert (tmp_path / "val" / "plots" / "loss.png").is_file()


@pytest.mark.slow
def test_keep_best_keeps_the_best_checkpoint_past_keep_last(tmp_path):
    """A learning rate far too high: the held-out loss is best early, then worse; with
    ``keep_last = 1`` only ``keep_best`` keeps that step's checkpoint."""
    overrides = dict(validation_every=1, checkpoint_every=1, keep_last=1, lr=0.5, iterations=4)
    result, _ = _train(tmp_path / "best", 1, keep_best=True, **overrides)
    best = min(result.val_losses, key=lambda p: p[1])[0]
    assert best < 4 and result.best_val_step == best
    saved = (tmp_path / "best/checkpoints").glob("step-*")
    steps = sorted(int(p.name.split("-")[1]) for p in saved)
    assert steps == [best, 4]
    record = json.loads((tmp_path / "best/validation/best.json").read_text())
    assert record == {"step": best, "val_loss": result.best_val_loss}
    _train(tmp_path / "last", 1, **overrides)
    assert [p.name for p in (tmp_path / "last/checkpoints").glob("step-*")] == ["step-00000004"]


def _bad(tmp_path, capsys, *flags: str) -> str:
    """``datacentric train`` with ``flags``: exit 2 and one line on stderr, no run."""
    from run_config import SMALL_TRAIN_FLAGS

    from datacentric.cli.main import main

    out = tmp_path / "run"
    assert main(["train", *SMALL_TRAIN_FLAGS, "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("datacentric train: "), err
    assert not (out / "metrics.jsonl").exists()
    return err


def test_bad_validation_input_is_one_line_before_ranks_start(tmp_path, capsys):
    err = _bad(tmp_path, capsys, "--validation.dataset", "split=1.5")
    assert "validation.dataset: split= takes a fraction between 0 and 1" in err
    err = _bad(tmp_path, capsys, "--validation-dataset", "split=0.1", "--validation-every", "9")
    assert "validation.every: 9 is more than the run's" in err
    err = _bad(tmp_path, capsys, "--validation.every", "2", "--iterations", "4")
    assert "validation.every: nothing to validate; set validation.dataset" in err
    err = _bad(tmp_path, capsys, "--keep-best")
    assert "checkpoint.keep_best: needs a validation loss" in err
    err = _bad(tmp_path, capsys, "--validation.dataset", "jsonl:" + str(tmp_path / "none.jsonl"))
    assert "none.jsonl" in err
    err = _bad(tmp_path, capsys, "--validation.dataset", "split=0.999")
    assert "leaves none to train on" in err
    binary = tmp_path / "prompts.bin"
    binary.write_bytes(bytes(range(256)))
    err = _bad(tmp_path, capsys, "--validation.prompts", str(binary))
    assert f"validation.prompts {binary}: not a text file" in err
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("once upon a time\n")
    err = _bad(tmp_path, capsys, "--validation.prompts", str(prompts))
    assert "validation.prompts: llama has no next-token logits" in err
    err = _bad(tmp_path, capsys, "--validation.height", "32")
    assert "validation.height: only a pipeline render uses it" in err
    err = _bad(tmp_path, capsys, "--validation.pipeline", str(tmp_path))
    assert "validation.pipeline: nothing to render; set validation.prompts" in err
    render = ("--validation.pipeline", str(tmp_path), "--validation.prompts", str(prompts))
    err = _bad(tmp_path, capsys, *render)
    assert "validation.pipeline: the run's model (Llama) holds no diffusers" in err
    # a held-out sample longer than every training one, which the plan cannot fit
    short, long = tmp_path / "short.jsonl", tmp_path / "long.jsonl"
    short.write_text("".join(json.dumps({"text": f"short text {i}"}) + "\n" for i in range(4)))
    long.write_text(json.dumps({"text": "a long document " * 40}) + "\n")
    err = _bad(
        tmp_path,
        capsys,
        *("--dataset", f"jsonl:{short}", "--validation.dataset", f"jsonl:{long}"),
        *("--memory-gb", "0.02", "--tokens-per-iteration", "64"),
    )
    assert "a held-out sample cannot be planned" in err


def test_prompt_files_read_as_lines_or_json_lines(tmp_path):
    from datacentric.data.base import DataError
    from datacentric.data.prompts import Prompt, read_prompts

    path = tmp_path / "prompts.txt"
    path.write_text('plain line\n\n{"prompt": "x", "max_new_tokens": 3, "temperature": 0.5}\n')
    assert read_prompts(path) == [Prompt(0, "plain line"), Prompt(1, "x", 3, 0.5)]
    for line, message in (
        ('{"prompt": 3}', 'line 1: a JSON line needs a "prompt" string'),
        ('{"prompt": "x", "top_p": 1}', "line 1: unknown key(s) top_p"),
        ('{"prompt": "x", "max_new_tokens": 0}', "max_new_tokens must be an integer >= 1"),
        ("{not json", "line 1: not JSON"),
        ("\n\n", "holds no prompt"),
    ):
        path.write_text(line)
        with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
            read_prompts(path)


@pytest.mark.slow
def test_a_resumed_run_keeps_its_best_validation_step(tmp_path):
    overrides = dict(validation_every=1, checkpoint_every=1, lr=0.5)
    first, _ = _train(tmp_path / "run", 1, iterations=2, **overrides)
    resumed, _ = _train(tmp_path / "run", 1, iterations=4, resume=True, **overrides)
    assert [s for s, _ in resumed.val_losses] == [3, 4]
    records = read_metrics(tmp_path / "run")
    losses = {r["iteration"] + 1: r["val_loss"] for r in records}
    assert losses[1] == first.val_losses[0][1] and sorted(losses) == [1, 2, 3, 4]
    best = min(losses, key=losses.get)
    assert (resumed.best_val_step, resumed.best_val_loss) == (best, losses[best])
    record = json.loads((tmp_path / "run/validation/best.json").read_text())
    assert record == {"step": best, "val_loss": losses[best]}


@pytest.mark.parametrize(
    ("was", "now", "named"),
    [
        ("split=0.2", "split=0.3", "validation.dataset ('split=0.2' -> 'split=0.3')"),
        ("split=0.2", "stdlib", "validation.dataset ('split=0.2' -> 'stdlib')"),
        ("split=0.2", "split=0.20", None),  # the same share
        ("stdlib", None, None),  # another held-out set trains the same samples
    ],
)
def test_a_resume_holding_out_another_share_names_the_setting(tmp_path, was, now, named):
    """A resume whose ``split=`` holds out another share of the training set is refused
    naming ``validation.dataset`` with both values (before: only "the dataset's
    samples"); a held-out set that trains the same samples passes."""
    from datacentric.settings import load_config
    from datacentric.train.checkpoints.checkpoint_folders import CheckpointError
    from datacentric.train.checkpoints.resume import check_unchanged

    def settings(dataset):
        return load_config(None, out=str(tmp_path), validation_dataset=dataset).to_json()

    state = {"config": settings(was), "dataset_fingerprint": "f"}
    path = tmp_path / "checkpoints" / "step-00000002"
    if named is None:
        check_unchanged(path, state, settings(now), "f")
        return
    with pytest.raises(CheckpointError, match="changed since it was saved") as refused:
        check_unchanged(path, state, settings(now), "f")
    assert named in str(refused.value), refused.value


def wan_held_out_loss(folder: str, latents: str) -> float:
    """On this rank: the held-out loss of a saved Wan transformer on latents (FSDP2)."""
    from datacentric.data.sources import open_dataset
    from datacentric.models.source import build_model_named

    groups = ProcessGroups() if torch.distributed.is_initialized() else ProcessGroups.local()
    dataset = open_dataset(f"latents:{latents}", seed=5)
    model = build_model_named(f"diffusers:{folder}", dataset=dataset)
    dc = DataCentric(model, dataset, groups=groups, prefetch=0, check_model=False, shard="fsdp2")
    try:
        return dc.evaluate(dataset)
    finally:
        dc.close()


@pytest.mark.slow
def test_a_diffusers_held_out_loss_is_the_same_at_worlds_1_2_and_4(tmp_path):
    """A saved Wan transformer on latents of mixed sizes: noise and time per sample from
    the seed and its id, the same loss at every world, and one process's own forward."""
    diffusers = pytest.importorskip("diffusers")
    from runtime.models.test_model_source import _latent_folder

    from datacentric.data.sources import open_dataset
    from datacentric.models.diffusers_build import TINY_DIFFUSERS, text_width
    from datacentric.models.source import build_model_named

    class_name, config = TINY_DIFFUSERS["wan"]
    torch.manual_seed(2)
    getattr(diffusers, class_name).from_config(config).save_pretrained(tmp_path / "wan")
    _latent_folder(tmp_path / "latents", config["in_channels"], text_width(config))
    folder, latents = str(tmp_path / "wan"), str(tmp_path / "latents")
    dataset = open_dataset(f"latents:{latents}", seed=5)
    want = reference_loss(build_model_named(f"diffusers:{folder}", dataset=dataset), dataset)
    assert wan_held_out_loss(folder, latents) == pytest.approx(want, rel=1e-5)
    for world in (2, 4):
        ranks = launch(wan_held_out_loss, folder, latents, nproc=world, collective_timeout_s=120.0)
        assert ranks[0] == pytest.approx(want, rel=1e-5), world


def test_validation_shows_progress_lines(monkeypatch):
    """Off a terminal, ``progress: validation K/N (P%)`` lines, then a last one at N/N."""
    import functools
    import io

    import datacentric.train.validation.held_out as validation

    stream = io.StringIO()
    shown = functools.partial(validation.Progress, stream=stream, terminal=False, every_s=1e-4)
    monkeypatch.setattr(validation, "Progress", shown)
    torch.manual_seed(0)
    dataset = _data("text")
    dc = DataCentric(
        build_model("llama"),
        dataset,
        preset="llama",
        groups=ProcessGroups.local(),
        prefetch=0,
        check_model=False,
        shard="none",
        tokens_per_iteration=128,
    )
    batches = len(dc.prepare_evaluation(dataset).schedule.iterations)
    dc.evaluate(dataset, progress=True)
    lines = stream.getvalue().splitlines()
    assert lines and all(line.startswith("progress: validation ") for line in lines)
    assert lines[-1].startswith(f"progress: validation {batches}/{batches} (100%)")


def test_a_dataset_object_is_a_held_out_set_in_python(tmp_path):
    """``ValidationConfig.dataset`` given a dataset object: its first ``limit`` samples are
    the held-out set (the loss of one process on them), and the run folder's settings
    describe it."""
    held = SyntheticTextDataset(TEXT_SHAPES, seed=7)
    result, _ = _train(tmp_path / "obj", 1, validation_dataset=held, validation_limit=5)
    torch.manual_seed(0)
    model = build_model("llama")
    model.load_state_dict(read_model_state(latest_checkpoint(tmp_path / "obj")))
    first = SampleSubset(held, range(5))
    assert result.val_losses[-1][1] == pytest.approx(reference_loss(model, first), rel=1e-5)
    saved = json.loads((tmp_path / "obj" / "config.json").read_text())
    assert saved["validation"]["dataset"] == "<SyntheticTextDataset object>"
