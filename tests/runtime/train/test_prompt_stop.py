"""A stop signal while validation continues its text prompts is honoured before the next
token: the completions of prompts not finished are dropped, the run saves its last step
and exits with ``128 + signal`` as at any stop (before, every prompt ran to its last
token first: one forward a token, the whole sequence again each time). Where only one
rank is signalled (one node of several), the ranks agree on the stop before each round
of prompts, so the others start no further prompt."""

from __future__ import annotations

import os
import signal
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from cli_here import cli_here

pytest.importorskip("transformers")

from runtime.models.test_model_source import _pretrained_folder  # noqa: E402

from datacentric.parallel import evaluate  # noqa: E402
from datacentric.parallel.groups import ProcessGroups  # noqa: E402
from datacentric.parallel.launch import spawn  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

#: tokens each prompt asks for: a stop that waited for them all ran 2 x this many forwards
NEW_TOKENS = 40


def count_forwards(monkeypatch, on_call) -> list[int]:
    """A list that grows by one as each forward of the prompts' model reaches its token
    embedding (``on_call(n)`` then), counted from the first prompt validation runs."""
    calls: list[int] = []
    real = evaluate.each_prompt_alone

    def hook(module, args, output):
        calls.append(len(calls) + 1)
        on_call(len(calls))

    def counted(runtime, count, run, *stop):
        def each(module, k):
            if not getattr(module, "_counted", False):
                module._counted = True
                for embedding in [m for m in module.modules() if isinstance(m, torch.nn.Embedding)]:
                    embedding.register_forward_hook(hook)
            return run(module, k)

        return real(runtime, count, each, *stop)

    monkeypatch.setattr(evaluate, "each_prompt_alone", counted)
    return calls


def _run_inputs(tmp_path, prompt_lines: str):
    """A tiny Qwen2 folder, 24 of its documents as a JSON-lines training set, and a
    prompts file of ``prompt_lines``."""
    folder = tmp_path / "qwen"
    texts = _pretrained_folder(folder)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"text": "{t}"}}\n' for t in texts[:24]))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(prompt_lines)
    return folder, data, prompts


@pytest.mark.slow
def test_a_sigterm_during_prompt_completions_saves_the_last_step_at_once(
    tmp_path, capsys, monkeypatch
):
    """SIGTERM at the first token of the first validation (after step 2 of 4): no forward
    after the one it came in, the checkpoint holds step 2, no completion is written. Its
    resume continues the prompts of step 2 first: the completions of steps 2 and 4 are
    the uninterrupted run's (before: step 2's were never written)."""
    folder, data, prompts = _run_inputs(tmp_path, "document 3: word1\nword4 tok2\n")

    def sigterm_at_first(n: int) -> None:
        if n == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    calls = count_forwards(monkeypatch, sigterm_at_first)
    out = tmp_path / "run"
    argv = ["train", "--model", f"hf:{folder}", "--dataset", f"jsonl:{data}"]
    argv += ["--tokenizer", str(folder / "tokenizer.json"), "--iterations", "4"]
    argv += ["--validation.every", "2", "--validation.prompts", str(prompts)]
    argv += ["--validation.max_new_tokens", str(NEW_TOKENS), "--cost-model", "analytic"]
    argv += ["--no-progress", "--no-plots", "--out", str(out)]
    status, _, err = cli_here(argv, capsys)
    assert status == 128 + signal.SIGTERM, err[-3000:]
    assert calls == [1], f"{len(calls)} forwards"  # the one the signal came in, no other
    assert (out / "checkpoints" / "step-00000002").is_dir(), sorted((out / "checkpoints").iterdir())
    assert not (out / "checkpoints" / "step-00000004").exists()
    assert not (out / "validation" / "step-2.jsonl").exists()
    assert "stopped by SIGTERM after step 2" in err, err[-3000:]
    assert cli_here([*argv, "--resume"], capsys)[0] == 0
    straight = tmp_path / "straight"
    assert cli_here([*argv[:-1], str(straight)], capsys)[0] == 0
    for step in (2, 4):
        name = Path("validation") / f"step-{step}.jsonl"
        assert (out / name).is_file(), sorted((out / "validation").iterdir())
        assert (out / name).read_text() == (straight / name).read_text()


class NextToken(torch.nn.Module):
    """Next-token logits that always choose token 1."""

    def logits(self, batch) -> torch.Tensor:
        logits = torch.zeros(len(batch.inputs), 4)
        logits[:, 1] = 1.0
        return logits


def _one_rank_signalled(count: int) -> dict:
    """A rank of 2 continuing ``count`` prompts of 3 tokens; rank 0 alone is signalled,
    once its first prompt is done: the prompts each rank ran, and what it got."""
    groups = ProcessGroups()
    ran: list[int] = []
    uses = SimpleNamespace(use=lambda *a: nullcontext())
    runtime = SimpleNamespace(groups=groups, model=NextToken(), attention=uses, recompute=uses)
    settings = [(3, 0.0, torch.Generator()) for _ in range(count)]

    def stop() -> bool:  # this rank's signal: rank 0's after its first prompt
        return groups.rank == 0 and len(ran) >= 1

    real = evaluate._continue

    def counted(module, ids, *args):
        done = real(module, ids, *args)
        ran.append(len(ran))  # once finished
        return done

    evaluate._continue = counted
    got = evaluate.generate_tokens(runtime, [[0]] * count, settings, stop=stop)
    return {"ran": len(ran), "got": got}


@pytest.mark.slow
def test_a_rank_not_signalled_starts_no_prompt_after_the_round_the_stop_came_in():
    """6 prompts on 2 ranks (3 rounds): rank 0 is signalled after its first prompt; rank
    1 finishes the prompt of that round and runs none after it (before: all 3 of its
    prompts), and both ranks get the first round's completions alone."""
    results = spawn(_one_rank_signalled, 2, 6, timeout_s=120)
    assert [r["ran"] for r in results] == [1, 1], results
    for r in results:
        assert r["got"] == [[1, 1, 1], [1, 1, 1], None, None, None, None], r


@pytest.mark.slow
def test_fewer_prompts_than_ranks_leave_the_next_step_running(tmp_path, capsys):
    """One prompt on 2 ranks (FSDP2), validated after step 2 of 3: step 3 runs (before:
    FSDP2 kept the order of the prompt's forwards on rank 0 alone, whose next backward
    then prefetched an all-gather rank 1 never joined: the step hung until the collective
    timeout; seen too with 2 prompts at world 4)."""
    folder, data, prompts = _run_inputs(tmp_path, "document 3: word1\n")
    out = tmp_path / "run"
    argv = ["train", "--model", f"hf:{folder}", "--dataset", f"jsonl:{data}", "--world", "2"]
    argv += ["--tokenizer", str(folder / "tokenizer.json"), "--iterations", "3"]
    argv += ["--validation.every", "2", "--validation.prompts", str(prompts)]
    argv += ["--validation.max_new_tokens", "2", "--cost-model", "analytic"]
    argv += ["--collective-timeout-s", "20", "--no-progress", "--no-plots", "--out", str(out)]
    status, _, err = cli_here(argv, capsys)
    assert status == 0, err[-3000:]
    assert (out / "validation" / "step-2.jsonl").is_file()
    assert (out / "checkpoints" / "step-00000003").is_dir()
