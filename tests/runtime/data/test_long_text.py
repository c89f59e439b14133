"""A long text encoded in pieces (``data/tokenizer_files.py``) gives the ids of encoding it
whole, special tokens included, for tokenizers trained here: GPT-2 style byte-level BPE,
Llama-3 style (a Split regex, then byte-level), WordPiece with per-character normalizers,
WordPiece with BertNormalizer and Unigram with Metaspace (those two stay whole); texts of
mixed scripts, line ends, CRLF, runs of spaces and added tokens inside, with the piece
size lowered so that a text crosses many cuts. The cache's tokens are those of the whole
encoding, and no piece given to the tokenizer is much longer than the piece size."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from tokenizers import (  # noqa: E402
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from datacentric.data import DataConfig, open_dataset, tokenizer_files  # noqa: E402
from datacentric.data.tokenizer_files import TextCodec  # noqa: E402

#: Llama 3's pre-tokenizer pattern.
LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Special strings placed inside the texts; ``<mask>`` strips the whitespace before it.
SPECIALS = ["<|bos|>", "<|eos|>", "<|user|>"]
WORDS = ["the", "Data", "café", "日本語", "naïve", "Straße", "ΣΟΦΊΑ", "İstanbul", "e\u0301"]
WORDS += ["\U0001f431", "x1", "42", "3.14", ",", "--", "'s", "don't", "ﬁ", "٣٤"]
JOINS = ["\n", "\r\n", "\n\n", "  \n", " ", "      ", "\t", "\n   ", "\n\u3000", "\r"]


def _corpus(seed: int, count: int) -> list[str]:
    draw = random.Random(seed)
    return [" ".join(draw.choice(WORDS) for _ in range(draw.randint(1, 9))) for _ in range(count)]


def _text(seed: int, length: int, specials: list[str]) -> str:
    """Words of mixed scripts joined by every kind of line end and space run, with the
    added tokens inside (at line starts too, where cuts are tried)."""
    draw, out, size = random.Random(seed), [], 0
    while size < length:
        piece = draw.choice(WORDS) + draw.choice(JOINS + [""] * 4)
        if draw.random() < 0.05:
            piece += draw.choice(specials)
        out.append(piece)
        size += len(piece)
    return "".join(out)


def _specials(tok: Tokenizer) -> None:
    tok.add_special_tokens(SPECIALS + [AddedToken("<mask>", lstrip=True, special=True)])
    tok.add_tokens(["<tool>"])


def _byte_level(split: bool) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    if split:  # Llama 3: the regex splits, byte-level only maps the bytes
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_corpus(1, 400), trainer)
    _specials(tok)
    if split:
        bos = tok.token_to_id("<|bos|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|bos|> $A", special_tokens=[("<|bos|>", bos)]
        )
    return tok


def _wordpiece(bert: bool) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    if bert:
        tok.normalizer = normalizers.BertNormalizer()
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    else:
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Whitespace()]
        )
    specials = ["[UNK]", "[CLS]", "[SEP]"]
    trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials)
    tok.train_from_iterator(_corpus(2, 400), trainer)
    _specials(tok)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    return tok


def _unigram() -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=["<unk>"], unk_token="<unk>")
    tok.train_from_iterator(_corpus(3, 400), trainer)
    _specials(tok)
    return tok


#: name: (tokenizer maker, whether its texts are cut into pieces)
TOKENIZERS = {
    "gpt2 byte-level bpe": (lambda: _byte_level(False), True),
    "llama3 split regex + byte-level, bos": (lambda: _byte_level(True), True),
    "wordpiece nfkc lowercase, cls sep": (lambda: _wordpiece(False), True),
    "wordpiece bert normalizer": (lambda: _wordpiece(True), False),
    "unigram metaspace": (_unigram, False),
}


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def case(request):
    make, splits = TOKENIZERS[request.param]
    return make(), splits


class Recording:
    """A tokenizer that records the length of every text it is given to encode."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok, self.lengths = tok, []

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def encode(self, text, *args, **kwargs):
        self.lengths.append(len(text))
        return self.tok.encode(text, *args, **kwargs)

    def encode_batch(self, texts, *args, **kwargs):
        self.lengths += [len(t) for t in texts]
        return self.tok.encode_batch(texts, *args, **kwargs)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("piece, window", [(150, 40), (400, 4096), (1000, 8)])
def test_pieces_give_the_whole_encoding(case, seed, piece, window) -> None:
    tok, splits = case
    text = _text(seed, 3000, SPECIALS + ["<mask>", "<tool>"])
    whole = tok.encode(text).ids
    recording = Recording(tok)
    got = tokenizer_files.encode_in_pieces(
        recording, lambda t: tok.encode(t).ids, text, np.dtype(np.int64), piece, window
    )
    assert (got is not None) == splits
    if got is not None:
        assert got.tolist() == whole
        cuts = list(tokenizer_files.cuts(tok, text, piece, window))
        assert len(cuts) >= len(text) // (3 * piece)  # several cuts accepted
        if 2 * window < len(text):
            assert max(recording.lengths) < len(text)  # never the whole text at once


def test_a_cut_where_an_added_token_strips_the_line_end_is_refused() -> None:
    tok = _byte_level(False)
    text = "words here\n" * 30 + "<mask> more\n" + "words there\n" * 30
    cut = text.index("<mask>")
    assert not tokenizer_files.cut_fits(tok, text, cut, 64)
    assert tokenizer_files.cut_fits(tok, text, cut + len("<mask> more\n"), 64)


def test_the_cache_holds_the_whole_encoding(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tokenizer_files, "PIECE_CHARS", 300)
    tok = _byte_level(True)
    tok.save(str(tmp_path / "tokenizer.json"))
    texts = [_text(seed, 2500 + 700 * seed, SPECIALS + ["<mask>"]) for seed in range(3)]
    for index, text in enumerate(texts):
        (tmp_path / f"doc{index}.txt").write_bytes(text.encode())
    settings = DataConfig(tokenizer=str(tmp_path / "tokenizer.json"))
    data = open_dataset(f"text:{tmp_path}/doc*.txt", settings)
    stored = np.fromfile(data.cache_dir / "tokens.bin", dtype=TextCodec(settings.tokenizer).dtype)
    assert stored.tolist() == [i for t in texts for i in tok.encode(t).ids]


@pytest.mark.parametrize("bert", [False, True])
def test_a_transformers_tokenizer_gives_its_own_ids(tmp_path, monkeypatch, bert) -> None:
    transformers = pytest.importorskip("transformers")
    monkeypatch.setattr(tokenizer_files, "PIECE_CHARS", 300)
    if bert:  # WordPiece, [CLS] and [SEP] around
        tok, names = _wordpiece(False), {"cls_token": "[CLS]", "sep_token": "[SEP]"}
    else:  # Llama 3 style, a BOS before
        tok, names = _byte_level(True), {"bos_token": "<|bos|>", "eos_token": "<|eos|>"}
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **names)
    fast.save_pretrained(tmp_path / "tok")
    codec = TextCodec(str(tmp_path / "tok"))
    texts = [_text(seed, 2000, SPECIALS + ["<tool>"]) for seed in range(3)] + ["short"]
    expected = [codec.hf(t)["input_ids"] for t in texts]
    assert expected[0] != tok.encode(texts[0], add_special_tokens=False).ids  # specials added
    assert [ids.tolist() for ids in codec.encode(texts)] == expected
    backend, whole = codec.hf.backend_tokenizer, lambda t: codec.hf(t)["input_ids"]
    dtype = np.dtype(np.int64)
    assert tokenizer_files.encode_in_pieces(backend, whole, texts[0], dtype, 300) is not None
    # ids that are not the text's own within fixed special tokens: encoded whole
    assert tokenizer_files.encode_in_pieces(backend, lambda t: [], texts[0], dtype, 300) is None


def test_a_long_text_reaches_the_tokenizer_in_pieces(tmp_path, monkeypatch) -> None:
    """Memory follows the longest piece given to the tokenizer (a whole 20 MB text took
    3.3 GB): no piece is longer than the piece size, a line, and a window."""
    monkeypatch.setattr(tokenizer_files, "PIECE_CHARS", 2000)
    tok = _byte_level(False)
    tok.save(str(tmp_path / "tokenizer.json"))
    codec = TextCodec(str(tmp_path / "tokenizer.json"))
    codec._tok = recording = Recording(codec._tok)
    text = _text(5, 100_000, SPECIALS)
    (ids,) = codec.encode([text])
    assert ids.tolist() == tok.encode(text).ids
    longest_line = max(len(line) for line in text.split("\n"))
    assert max(recording.lengths) <= 2000 + longest_line + 2 * tokenizer_files.WINDOW_CHARS


def _pieces_or_whole(tok: Tokenizer, text: str, piece: int) -> list[int]:
    """The ids encode_in_pieces gives (the whole encoding where it declines)."""
    got = tokenizer_files.encode_in_pieces(
        tok, lambda t: tok.encode(t).ids, text, np.dtype(np.int64), piece
    )
    return tok.encode(text).ids if got is None else got.tolist()


def _split_bpe(pattern: str) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(['say "hello world"\nx\n'] * 50, trainer)
    return tok


@pytest.mark.parametrize(
    "pattern, text",
    [  # pairs counted from the text's start; a quoted string over many lines
        (r"[\s\S][\s\S]", "a" + "hello world\n" * 1000),
        (r'"[^"]*"|\s+|[^\s"]+', 'say "' + "hello world\n" * 1000 + 'end" x\n' + "ab\n" * 9),
    ],
)
def test_a_split_pattern_whose_matches_cross_the_window_keeps_the_ids(pattern, text) -> None:
    """A match reaching past the checked window decides the pieces at a cut."""
    tok = _split_bpe(pattern)
    assert _pieces_or_whole(tok, text, 50) == tok.encode(text).ids


def test_an_added_token_holding_a_line_end_keeps_the_ids() -> None:
    """Of the overlapping ``\\nx`` and ``x\\n``, the first from the text's start is
    taken: a window starting one character later takes the other."""
    tok = _split_bpe(LLAMA3)
    tok.add_tokens(["\nx", "x\n"])
    text = "\nx" * 6000
    assert _pieces_or_whole(tok, text, 50) == tok.encode(text).ids


def test_llama_3_and_qwen_2_split_patterns_are_cut() -> None:
    qwen2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
    text = _text(0, 3000, SPECIALS)
    for pattern in (LLAMA3, qwen2):
        tok = _split_bpe(pattern)
        got = tokenizer_files.encode_in_pieces(
            tok, lambda t, tok=tok: tok.encode(t).ids, text, np.dtype(np.int64), 300
        )
        assert got is not None and got.tolist() == tok.encode(text).ids
