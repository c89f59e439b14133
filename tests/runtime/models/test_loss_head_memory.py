"""The analytic model's price of the LM loss head against the head's measured memory.

The allocator's own events (``torch.profiler`` with ``profile_memory=True``) are replayed
in time order, counting only allocations of one tokens x vocab tensor (2 or 4 bytes a
logit): their highest sum is what the head really holds at once over a forward and
backward of the whole model.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from datacentric.data.text import pack_token_samples
from datacentric.models.configs import LlamaConfig
from datacentric.models.llama import Llama
from datacentric.planning.analytic import analytic_model
from datacentric.planning.hardware import get_hardware
from datacentric.planning.spec_derivation import spec_of_model

SAMPLE_TOKENS = (200, 120)  # 320 tokens: no other tensor of the models is tokens x vocab


def _llama(dtype: torch.dtype) -> torch.nn.Module:
    config = LlamaConfig(
        hidden_size=32, num_layers=1, num_heads=2, ffn_hidden_size=64, vocab_size=4096
    )
    return Llama(config).to(dtype)


def _gpt2(dtype: torch.dtype) -> torch.nn.Module:
    pytest.importorskip("transformers")
    from datacentric.models.hf import build_hf_model

    return build_hf_model("gpt2", dtype=dtype)  # a real vocabulary: 50,257


def _peak_logit_bytes(model: torch.nn.Module, vocab: int) -> int:
    """The most bytes held at once by tensors of tokens x ``vocab`` (any dtype of 2 or 4
    bytes) over one forward and backward of ``model`` on a packed batch."""
    torch.manual_seed(0)
    samples = [torch.randint(0, vocab, (n,)) for n in SAMPLE_TOKENS]
    batch = pack_token_samples(tuple(range(len(samples))), samples)
    logits = batch.inputs.numel() * vocab
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model(batch).sum().backward()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        if abs(event.nbytes()) in (2 * logits, 4 * logits):  # + allocated, - freed
            live += event.nbytes()
            peak = max(peak, live)
    assert live == 0, "a tokens x vocab tensor outlived the step"
    return peak


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama", "hf-gpt2"])
def test_the_loss_head_is_priced_at_what_it_holds(build, dtype: torch.dtype) -> None:
    model = build(dtype)
    spec = spec_of_model(model)
    cost = analytic_model(spec, get_hardware("cpu-local"), dtype_bytes=dtype.itemsize)
    measured = _peak_logit_bytes(model, spec.vocab_size)
    priced = cost._loss_head_bytes(sum(SAMPLE_TOKENS))
    # measured: 12 bytes a logit (three float32 tokens x vocab tensors in log_softmax's
    # backward); the price before was 4 + dtype bytes: 8 (fp32), 6 (bf16)
    assert measured <= priced <= 1.25 * measured, (measured, priced)
