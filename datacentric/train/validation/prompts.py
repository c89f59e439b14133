"""The ``[validation]`` prompts of a text model: continued at each validation (greedy,
or sampled from a generator seeded by the seed, the step and the prompt), spread over
the ranks, written to ``validation/step-N.jsonl``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from datacentric.data.base import sample_generator
from datacentric.data.prompts import Prompt
from datacentric.parallel.evaluate import generate_tokens
from datacentric.train.reporting.metrics import read_jsonl


@dataclass
class PromptSamples:
    """The ``[validation]`` section's prompts, tokenized as the ``[data]`` section's
    tokenizer does, and how to continue them (built with the run's validation,
    :meth:`~datacentric.train.validation.driver.RunValidation.of`)."""

    prompts: list[Prompt]
    codec: Any
    max_new_tokens: int
    temperature: float
    seed: int

    def check(self, module: torch.nn.Module, model: str) -> None:
        """Refuse a ``module`` (the model ``model`` names) without next-token logits to
        generate with."""
        if not callable(getattr(module, "logits", None)):
            raise ValueError(
                f"validation.prompts: {model} has no next-token logits to "
                "generate with (a text model: hf:DIR); leave validation.prompts unset"
            )

    def written(self, out: Path, step: int) -> bool:
        """Whether ``validation/step-N.jsonl`` of the run folder ``out`` holds every
        prompt's completion after step ``step`` (a stop before the last prompt finished
        leaves it missing or short)."""
        done = {r.get("prompt_id") for r in read_jsonl(samples_path(out, step))}
        return all(p.index in done for p in self.prompts)

    def run(
        self,
        dc: Any,
        step: int,
        *,
        autocast: AbstractContextManager | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Every prompt's completion after step ``step`` (collective: every rank calls
        it; each gets every record: ``prompt_id``, ``prompt``, ``completion``, ``tokens``).
        ``stop()`` true (a stop signal) ends the generation before its next token: the
        records are those of the prompts finished until then."""
        ids = [list(map(int, e)) for e in self.codec.encode([p.text for p in self.prompts])]
        settings = [
            (
                p.max_new_tokens or self.max_new_tokens,
                self.temperature if p.temperature is None else p.temperature,
                sample_generator(self.seed, p.index, step),
            )
            for p in self.prompts
        ]
        tokens = generate_tokens(dc.runtime, ids, settings, autocast=autocast, stop=stop)
        return [
            {
                "prompt_id": p.index,
                "prompt": p.text,
                "completion": self.codec.decode(new),
                "tokens": new,
            }
            for p, new in zip(self.prompts, tokens)
            if new is not None
        ]


def write_samples(out: Path, step: int, records: list[dict[str, Any]]) -> Path:
    """``validation/step-N.jsonl`` of the run folder ``out``: one record per prompt."""
    path = samples_path(out, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def samples_path(out: Path, step: int) -> Path:
    """The prompts' completions after step ``step`` in the run folder ``out``."""
    return out / "validation" / f"step-{step}.jsonl"
