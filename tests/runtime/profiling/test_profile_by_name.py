"""The ``profile`` command reads a model that is not a preset (the identity its profile's
fingerprint records, the spec its profile records) off one build on the meta device."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import datacentric.models.source as model_source
import datacentric.profiling.profiler as profiler
from datacentric.cli.main import main
from datacentric.profiling import factory
from datacentric.profiling.store import load_profile, model_identity

pytestmark = pytest.mark.usefixtures("one_thread")

NAME, ARGS = "tests.user_models:tiny_gpt", {"width": 64}


def measured_without_ranks(cases, settings):
    """What the profiler's ranks would measure, made up and started nowhere: times and
    bytes that grow with the tokens and the blocks run (and recomputed)."""
    results = []
    for case in cases:
        tokens = sum(shape.tokens for shape in case.shapes)
        time_s = 1e-5 * tokens * (1 + case.depth + sum(case.flags()) / 2)
        memory = tokens * (100 + 10 * case.depth)
        results.append(profiler.RunResult(case, time_s, (time_s,), memory))
    return results


def test_the_profile_command_builds_a_model_not_a_preset_once_on_meta(
    tmp_path, monkeypatch, capsys
):
    identity, spec = model_identity(NAME, ARGS), factory.named_spec(NAME, ARGS)  # by name
    factory._built_spec.cache_clear()  # as in a command's own process: nothing found yet
    built: Counter = Counter()
    build_source = model_source._build_source

    def counted(source, *, device, **kwargs):
        built["on meta" if str(device) == "meta" else "with weights"] += 1
        return build_source(source, device=device, **kwargs)

    monkeypatch.setattr(model_source, "_build_source", counted)
    monkeypatch.setattr(profiler, "measure", measured_without_ranks)
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in (40, 100, 250)) + "\n", encoding="utf-8")
    folder = tmp_path / "profile"
    argv = ["profile", "--model", NAME, "--model-arg", "width=64", "--lengths", str(lengths)]
    argv += ["--world", "1", "--memory-gb", "1", "--profile-dir", str(folder), "--validate", "0"]
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["profile_reused"] is False
    # one build for its identity and its spec, as each found by name alone
    assert built == {"on meta": 1}
    saved = load_profile(folder)
    assert saved.fingerprint["model_config"] == identity
    assert (saved.num_blocks, saved.attention_kind) == (spec.num_blocks, spec.kinds[0])
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err  # reused: its identity only
    assert json.loads(capsys.readouterr().out)["profile_reused"] is True
    assert built == {"on meta": 2}


def on_this_process(fn, world_size, *args, **_):
    """:func:`~datacentric.parallel.launch.spawn` of one rank, run here (no process
    started; its groups those of one local process)."""
    assert world_size == 1
    return [fn(*args)]


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_a_model_of_fewer_than_256_token_ids_is_profiled_on_ids_it_holds(
    tmp_path, monkeypatch, capsys
):
    """The profile command's synthetic samples draw their ids below the model's
    vocabulary (they were bytes whatever the model: an hf: folder of 128 ids failed on
    its ranks with ``IndexError: index out of range in self``); a vocabulary of 256 or
    more keeps the byte ids it was profiled on; none is refused before the ranks start."""
    from runtime.models.test_model_source import _pretrained_folder

    from datacentric.parallel.groups import ProcessGroups

    model = tmp_path / "qwen"
    _pretrained_folder(model)  # a vocabulary of 128
    monkeypatch.setattr(profiler, "spawn", on_this_process)
    monkeypatch.setattr(profiler, "ProcessGroups", ProcessGroups.local)
    drawn: list[int] = []
    draw = profiler.SyntheticTextDataset.sample
    monkeypatch.setattr(
        profiler.SyntheticTextDataset,
        "sample",
        lambda self, i: drawn.append(int(draw(self, i).max())) or draw(self, i),
    )
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("40\n100\n", encoding="utf-8")
    argv = ["profile", "--model", f"hf:{model}", "--lengths", str(lengths), "--world", "1"]
    argv += ["--memory-gb", "1", "--validate", "0", "--repeats", "1", "--max-points", "1"]
    folder = tmp_path / "profile"
    assert main([*argv, "--profile-dir", str(folder), "--json"]) == 0, capsys.readouterr().err
    assert drawn and max(drawn) < 128
    assert len(load_profile(folder).points) == 2
    wide = factory.named_spec("llama", {"vocab_size": 1000})
    settings = profiler.ProfileSettings(model="llama", world_size=1, spec=wide)
    assert profiler.synthetic_token_ids(settings) == profiler.BYTE_IDS == 256

    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    (model / "config.json").write_text(json.dumps({**config, "vocab_size": 0}), encoding="utf-8")
    capsys.readouterr()
    assert main([*argv, "--profile-dir", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("datacentric profile: model ") and "no vocabulary size" in err
    assert f"set vocab_size in {model / 'config.json'}" in err


def test_a_run_s_own_profile_draws_ids_below_its_model_s_vocabulary(tmp_path, monkeypatch):
    """A training run's profile (:func:`ensure_profile`, synthetic samples for a preset)
    draws its ids below the vocabulary of the spec the run found: a preset of 120 ids
    failed on its ranks as the profile command did."""
    from datacentric.parallel.groups import ProcessGroups
    from datacentric.profiling.autoprofile import ensure_profile
    from datacentric.settings.sections import CostConfig
    from datacentric.shapes import SampleShape

    monkeypatch.setattr(profiler, "spawn", on_this_process)
    monkeypatch.setattr(profiler, "ProcessGroups", ProcessGroups.local)
    args = {"vocab_size": 120, "num_layers": 2}
    settings = profiler.ProfileSettings(
        model="llama",
        model_args=args,
        world_size=1,
        cost=CostConfig(warmup=2, repeats=1),
        spec=factory.named_spec("llama", args),
    )
    profile = ensure_profile(tmp_path, settings, [SampleShape.text(48)], max_points=1)
    assert len(profile.points) == 2
