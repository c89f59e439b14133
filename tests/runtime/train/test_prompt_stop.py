"""A stop signal while validation continues its text prompts is honoured before the next
token: the completions of prompts not finished are dropped, the run saves its last step
and exits with ``128 + signal`` as at any stop (before, every prompt ran to its last
token first: one forward a token, the whole sequence again each time)."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from cli_here import cli_here

pytest.importorskip("transformers")

from runtime.models.test_model_source import _pretrained_folder  # noqa: E402

from datacentric.parallel import evaluate  # noqa: E402

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

    def counted(runtime, count, run):
        def each(module, k):
            if not getattr(module, "_counted", False):
                module._counted = True
                for embedding in [m for m in module.modules() if isinstance(m, torch.nn.Embedding)]:
                    embedding.register_forward_hook(hook)
            return run(module, k)

        return real(runtime, count, each)

    monkeypatch.setattr(evaluate, "each_prompt_alone", counted)
    return calls


@pytest.mark.slow
def test_a_sigterm_during_prompt_completions_saves_the_last_step_at_once(
    tmp_path, capsys, monkeypatch
):
    """SIGTERM at the first token of the first validation (after step 2 of 4): no forward
    after the one it came in, the checkpoint holds step 2, no completion is written."""
    folder = tmp_path / "qwen"
    texts = _pretrained_folder(folder)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"text": "{t}"}}\n' for t in texts[:24]))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("document 3: word1\nword4 tok2\n")

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
