"""``datacentric tiny --out DIR``: tiny random inputs to try every command on, offline.

Written under the names the README and docs use for a user's own inputs, so that their
commands run as written from inside ``DIR``:

- ``my-model/``: a Hugging Face model folder (a 2-layer Qwen2 of width 32, random
  weights) with its tokenizer (a byte-level BPE trained here) and a chat template that
  marks the assistant's tokens; ``tokenizer.json``: that tokenizer alone;
- ``data/train.jsonl`` and ``heldout.jsonl`` (text under ``"text"``),
  ``data/train.parquet`` (text in column ``content``) and ``chat.jsonl`` (conversations
  under ``"messages"``);
- ``my-wan-pipeline/`` and ``my-flux-pipeline/``: diffusers pipeline folders (the tiny
  Wan and Flux transformers, a 4-channel VAE, T5 / CLIP text encoders of width 32 / 16);
- ``clips/``: four short clips (PyAV) and ``captions.csv`` (``path,text``).

Every file comes from a seeded generator; nothing is downloaded. A part already in
``DIR`` is kept (``--overwrite`` writes it again).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from datacentric.cli.flag_groups import add_out_flag, check_out_folder
from datacentric.cli.flags import config_option
from datacentric.cli.ranks import announce

WORDS = (
    "a cat walks on the grass under blue sky while red car drives past green trees and the "
    "sun sets over hills with birds flying slowly near water hello how are you the user asks "
    "and the assistant answers briefly"
).split()
#: the extra that installs a module a part needs
EXTRAS = {
    "transformers": "hf",
    "tokenizers": "data",
    "pyarrow": "data",
    "diffusers": "video",
    "av": "video",
}
#: marks the assistant's content with ``{% generation %}``, as Qwen2's and TRL's
#: training templates do (the loss on the assistant's tokens only)
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{% else %}{{ m['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\\n' }}{% endfor %}"
)
#: a 2-layer T5 / umT5 encoder of width 32 (the tiny transformers' text width)
T5_SIZES = {
    "d_model": 32,
    "d_kv": 8,
    "d_ff": 64,
    "num_layers": 2,
    "num_heads": 4,
    "relative_attention_num_buckets": 8,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "decoder_start_token_id": 0,
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tiny",
        help="write tiny random inputs (a model folder, pipelines, clips, jsonl) to try "
        "every command on",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_out_flag(parser, note="here: the folder of tiny inputs")
    config_option(parser, key="overwrite", note="here: write again the parts already in --out")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_out_folder(args.out)
    out = Path(args.out)
    announce("tiny", f"writing a model folder, two pipelines, clips and jsonl into {out}")
    parts: dict[str, Callable[[Path], Any]] = {
        "data/train.jsonl": write_text_records,
        "heldout.jsonl": lambda path: write_text_records(path, count=12, seed=3),
        "data/train.parquet": write_parquet_records,
        "chat.jsonl": write_conversations,
        "my-model": save_chat_model,
        "tokenizer.json": lambda path: copy_tokenizer(out / "my-model", path),
        "my-wan-pipeline": save_wan_pipeline,
        "my-flux-pipeline": save_flux_pipeline,
        "clips": write_clips,
    }
    for name, write in parts.items():
        path = out / name
        if path.exists() and not args.overwrite:
            print(f"{path}: already there (--overwrite writes it again)")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            write(partial)
        except ImportError as err:  # an extra not installed: the other parts still come
            extra = EXTRAS.get((err.name or "").split(".")[0], "hf,video,data")
            print(f"{path}: skipped, {err.name} is not installed (pip install "
                  f"'datacentric[{extra}]')")  # fmt: skip
            continue
        if not partial.exists():  # skipped: the writer said why
            continue
        if path.is_dir():
            shutil.rmtree(path)
        partial.replace(path)
        print(f"wrote {path}")
    print(
        f"try, from {out}: datacentric train --model hf:my-model --dataset jsonl:chat.jsonl "
        "--lora.rank 4 --iterations 2; datacentric prepare --pipeline my-wan-pipeline "
        "--media clips/captions.csv --out data/latents (docs/model-folders.md)"
    )
    return 0


def copy_tokenizer(model: Path, path: Path) -> None:
    """``model``'s ``tokenizer.json`` copied to ``path`` (skipped, saying so, without it)."""
    if (model / "tokenizer.json").is_file():
        shutil.copy(model / "tokenizer.json", path)
    else:
        final = path.with_name(path.name.removesuffix(".partial"))
        print(f"{final}: skipped, {model} holds no tokenizer.json")


def _sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def _documents(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [_sentence(rng, 5, 200) for _ in range(count)]


def write_text_records(path: Path, count: int = 48, seed: int = 0) -> None:
    """``count`` documents of 5 to 200 words, one ``{"text": ...}`` a line."""
    lines = [json.dumps({"text": text}) for text in _documents(count, seed)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_parquet_records(path: Path, count: int = 48, seed: int = 4) -> None:
    """``count`` documents of 5 to 200 words in a Parquet file's ``content`` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": _documents(count, seed)}), path)


def write_conversations(path: Path, count: int = 32) -> None:
    """``count`` conversations of one or two exchanges, some with a system turn."""
    rng = random.Random(1)
    lines = []
    for number in range(count):
        turns = [{"role": "system", "content": "answer briefly"}] if number % 3 == 0 else []
        for _ in range(1 + number % 2):
            turns.append({"role": "user", "content": _sentence(rng, 3, 20)})
            turns.append({"role": "assistant", "content": _sentence(rng, 2, 40)})
        lines.append(json.dumps({"messages": turns}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def bpe_tokenizer(
    words: Sequence[str] = WORDS, vocab_size: int = 400, template: str = CHAT_TEMPLATE
) -> Any:
    """A byte-level BPE fast tokenizer trained on ``words`` with the chat ``template``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # its blank lines on stdout
    )
    tok.train_from_iterator([" ".join(words)] * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>"
    )
    fast.chat_template = template
    return fast


def tiny_qwen2_config(vocab_size: int = 64) -> Any:
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


def save_chat_model(folder: Path, tokenizer: Any = None, seed: int = 0) -> Path:
    """``tokenizer`` (default: :func:`bpe_tokenizer`'s) and a :func:`tiny_qwen2_config`
    model of its vocabulary (random weights from ``seed``) saved together in ``folder``.
    The vocabulary is counted with the config already there: a folder whose
    ``config.json`` says Qwen2 loads its tokenizer as Qwen2's class, which adds
    ``<|endoftext|>``, so the model covers every id the folder's tokenizer gives."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (tokenizer or bpe_tokenizer()).save_pretrained(folder)
    tiny_qwen2_config().save_pretrained(folder)
    torch.manual_seed(seed)
    vocab = len(AutoTokenizer.from_pretrained(folder))
    AutoModelForCausalLM.from_config(tiny_qwen2_config(vocab)).save_pretrained(folder)
    return folder


def word_tokenizer(model_max_length: int, bos: bool = False, words: Sequence[str] = WORDS) -> Any:
    """A word-level fast tokenizer of ``words`` (``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2,
    ``<s>`` 3) appending ``</s>`` as T5's does (and prepending ``<s>`` with ``bos``, as
    CLIP's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<pad>", "</s>", "<unk>", "<s>"]
    tok.train_from_iterator(
        [" ".join(words)], trainers.WordLevelTrainer(special_tokens=specials, show_progress=False)
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>" if bos else "$A </s>", special_tokens=[("</s>", 1), ("<s>", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        bos_token="<s>",
        model_max_length=model_max_length,
    )


def _tiny_transformer(family: str) -> Any:
    import diffusers

    from datacentric.models.diffusers_build import TINY_DIFFUSERS

    class_name, config = TINY_DIFFUSERS[family]
    return getattr(diffusers, class_name).from_config(config)


def save_wan_pipeline(folder: Path) -> None:
    """A ``WanPipeline``: umT5 of width 32, a 4-channel Wan VAE, the tiny Wan transformer."""
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
    )  # fmt: skip
    tokenizer = word_tokenizer(512)
    WanPipeline(
        tokenizer=tokenizer,
        text_encoder=UMT5EncoderModel(UMT5Config(**T5_SIZES, vocab_size=len(tokenizer))),
        transformer=_tiny_transformer("wan"),
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    ).save_pretrained(folder)


def save_flux_pipeline(folder: Path) -> None:
    """A ``FluxPipeline``: CLIP (width 16) and T5 (width 32) text encoders, a 4-channel
    VAE of 8x down-sampling, the tiny Flux transformer."""
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(0)
    vae = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 8, 8), layers_per_block=1, latent_channels=4,
        norm_num_groups=4, shift_factor=0.1159, scaling_factor=0.3611,
        use_quant_conv=False, use_post_quant_conv=False,
    )  # fmt: skip
    clip_tokenizer, t5_tokenizer = word_tokenizer(77, bos=True), word_tokenizer(512)
    clip = CLIPTextConfig(
        vocab_size=len(clip_tokenizer), hidden_size=16, intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=77,
        projection_dim=16, bos_token_id=3, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=CLIPTextModel(clip),
        tokenizer=clip_tokenizer,
        text_encoder_2=T5EncoderModel(T5Config(**T5_SIZES, vocab_size=len(t5_tokenizer))),
        tokenizer_2=t5_tokenizer,
        transformer=_tiny_transformer("flux"),
    ).save_pretrained(folder)


def write_clips(folder: Path) -> None:
    """Four clips of smooth colour waves (lossless H.264 RGB, 8 fps) of 5 to 17 frames at
    32x32 to 48x64, and ``captions.csv`` listing them (Open-Sora's ``path,text``)."""
    import av
    import numpy as np

    folder.mkdir(parents=True)
    sizes = [(5, 32, 32), (9, 32, 48), (13, 48, 64), (17, 32, 32)]
    rng = random.Random(2)
    rows = []
    for number, (frames, height, width) in enumerate(sizes):
        name = f"clip-{number}.mp4"
        y, x = np.mgrid[0:height, 0:width]
        with av.open(str(folder / name), "w") as container:
            stream = container.add_stream("libx264rgb", rate=8)
            stream.width, stream.height, stream.pix_fmt = width, height, "rgb24"
            stream.options = {"crf": "0", "preset": "ultrafast"}
            for t in range(frames):
                waves = [
                    127.5 + 120 * np.sin(x / (5 + c) + y / (7 + c) + t * 0.3) for c in range(3)
                ]
                pixels = np.stack(waves, axis=-1).astype(np.uint8)
                for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        rows.append({"path": name, "text": _sentence(rng, 4, 12)})
    with open(folder / "captions.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["path", "text"])
        writer.writeheader()
        writer.writerows(rows)
