"""A tiny chat tokenizer folder and conversation files for the chat-data tests.

The tokenizer is a byte-level BPE trained here on a few words (nothing is downloaded),
saved with ``save_pretrained`` as a transformers fast tokenizer whose chat template
marks the assistant's content with ``{% generation %}`` (as Qwen2's and TRL's
training templates do).
"""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{% else %}{{ m['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\\n' }}{% endfor %}"
)
#: The same rendering with no markers: the assistant's tokens are unknown.
UNMARKED_TEMPLATE = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
WORDS = "hello world how are you the user asks and the assistant answers briefly"


def tiny_qwen2_config(vocab_size: int = 64):
    """A 2-layer Qwen2 config of width 32 with grouped key/value heads (4 query, 2 kv)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


def save_chat_tokenizer(folder: Path, template: str = CHAT_TEMPLATE) -> Path:
    """A fast tokenizer with ``template`` saved in ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([WORDS] * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>"
    )
    fast.chat_template = template
    fast.save_pretrained(folder)
    return folder


def conversations(count: int) -> list[list[dict[str, str]]]:
    """``count`` conversations of varied lengths (some with a system turn, some with two
    exchanges)."""
    words = WORDS.split()
    out = []
    for i in range(count):
        turns = [{"role": "system", "content": "be brief"}] if i % 3 == 0 else []
        for exchange in range(1 + i % 2):
            ask = " ".join(words[(i + exchange + k) % len(words)] for k in range(2 + i % 5))
            answer = " ".join(words[(2 * i + k) % len(words)] for k in range(1 + (i * 7) % 9))
            turns += [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}]
        out.append(turns)
    return out


def write_records(path: Path, records: list[dict]) -> Path:
    """One JSON record per line."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path
