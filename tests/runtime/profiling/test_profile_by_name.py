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
