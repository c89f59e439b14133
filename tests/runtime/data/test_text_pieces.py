"""A ``text:`` file read in pieces (``text_file.text_utf8``, the UTF-8 bytes tokenizer's
read) gives the token cache of the file read whole, byte for byte, whatever the piece
size: pieces of 1, 2, 3, 5 and 7 bytes cut inside every multi-byte character, CRLF pair
and byte-order mark of the inputs; a file that is not text is refused with the same
line, naming the byte in the whole file. And the read holds no whole-file string."""

from __future__ import annotations

import codecs
import random
import tracemalloc

import pytest

import datacentric.data.text_file as text_file
from datacentric.data import DataConfig, open_dataset
from datacentric.data.base import DataError
from datacentric.data.documents import read_documents
from datacentric.data.text_file import text_codec

#: Piece sizes that cut everywhere, one larger than the files, and the default.
SIZES = (1, 2, 3, 5, 7, 4096, text_file.TEXT_PIECE_BYTES)
#: The cache entry's files, compared byte for byte.
CACHE_FILES = ("meta.json", "offsets.npy", "origins.npy", "tokens.bin", "mask.bin")


def _mixed(seed: int, count: int) -> str:
    """Text of 1- to 4-byte characters, every line end, empty lines and a BOM inside."""
    parts = ["a", "é", "日", "\U0001f431", "\r\n", "\n", "\r", " ", "\u2028", "\ufeff"]
    draw = random.Random(seed)
    return "".join(draw.choice(parts) for _ in range(count))


TEXT = _mixed(0, 1500)
INPUTS = {
    "utf-8": TEXT.encode(),
    "utf-8 with its mark": codecs.BOM_UTF8 + TEXT.encode(),
    "utf-8 with two marks": codecs.BOM_UTF8 * 2 + TEXT.encode(),
    "utf-16 le with its mark": ("\ufeff" + TEXT).encode("utf-16-le"),
    "utf-16 be with its mark": ("\ufeff" + TEXT).encode("utf-16-be"),
    "utf-32 le with its mark": ("\ufeff" + TEXT).encode("utf-32-le"),
    "utf-32 be with its mark": ("\ufeff" + TEXT).encode("utf-32-be"),
    "crlf lines": "line é\r\n".encode() * 200,
    "empty lines": b"\n\n\r\n\r\n\r\r\n" * 100 + b"end",
    "one long line": ("word \U0001f431 caf\u00e9 " * 300).encode(),
    "only a mark": codecs.BOM_UTF8 + b"x",
}
NOT_TEXT = {
    "a bad byte": TEXT.encode()[:1001] + b"\xff" + TEXT.encode()[1001:],
    "a cut character at the end": "ab\U0001f431".encode()[:-1],
    "a surrogate in utf-8": b"abc\xed\xa0\x80def",
    "utf-16 of an odd length": ("\ufeff" + TEXT).encode("utf-16-le") + b"x",
    "a lone utf-16 surrogate": "ab".encode("utf-16") + b"\x00\xd8a\x00",
    "a utf-16 pair cut at the end": "ab".encode("utf-16") + b"\x3d\xd8",
    "a utf-32 code point out of range": "ab".encode("utf-32") + b"\x00\x00\x11\x00",
    "an empty file": b"",
}


def _whole(raw: bytes) -> bytes:
    """The document's UTF-8 bytes as the file read whole gives them."""
    return raw.decode(text_codec(raw)).removeprefix("\ufeff").encode()


def _cache(path, size: int, folder, monkeypatch) -> dict[str, bytes]:
    """The cache entry's files of ``text:path`` read ``size`` bytes at a time."""
    monkeypatch.setattr(text_file, "TEXT_PIECE_BYTES", size)
    monkeypatch.setenv("DATACENTRIC_CACHE", str(folder / f"cache-{size}"))
    ds = open_dataset(f"text:{path}", DataConfig(max_tokens=64))
    return {name: (ds.cache_dir / name).read_bytes() for name in CACHE_FILES}


@pytest.mark.parametrize("name", list(INPUTS))
def test_a_text_file_read_in_pieces_caches_the_tokens_of_the_file_read_whole(
    name, tmp_path, monkeypatch
):
    raw = INPUTS[name]
    path = tmp_path / "doc.txt"
    path.write_bytes(raw)
    want = _whole(raw)
    (document,) = read_documents("text", [str(path)], "text")  # a tokenizer's read
    assert document.text.encode() == want
    caches = {size: _cache(path, size, tmp_path, monkeypatch) for size in SIZES}
    assert caches[1]["tokens.bin"] == want
    for size, cache in caches.items():
        assert cache == caches[text_file.TEXT_PIECE_BYTES], size


@pytest.mark.parametrize("name", list(NOT_TEXT))
def test_a_file_that_is_not_text_is_refused_alike_in_pieces(name, tmp_path, monkeypatch):
    raw = NOT_TEXT[name]
    path = tmp_path / "doc.txt"
    path.write_bytes(raw)
    try:
        _whole(raw)
        want = f"text:{path}: no document has any token"  # the empty file
    except UnicodeDecodeError as err:
        codec = text_codec(raw).upper()
        want = (
            f"{path}: not {codec} text ({err.reason} at byte {err.start}); save it as UTF-8 "
            "(or UTF-16 with its byte-order mark)"
        )
    said = []
    if raw:  # a tokenizer's read (an empty file is an empty document)
        with pytest.raises(DataError) as whole:
            list(read_documents("text", [str(path)], "text"))
        said.append(str(whole.value))
    for size in SIZES:
        with pytest.raises(DataError) as err:
            _cache(path, size, tmp_path, monkeypatch)
        said.append(str(err.value))
    assert said == [want] * len(said)


def test_a_large_text_file_is_read_without_a_whole_file_string(tmp_path, monkeypatch):
    """2.9 MB of 1- to 4-byte characters: read whole, the file, its text as one string
    (4 bytes a character) and copies of its UTF-8 bytes peaked at 20.6 MB, 7 times the
    file; in 64 KiB pieces, 3.9 MB (the bytes kept and one piece)."""
    raw = _mixed(1, 1_400_000).encode()
    path = tmp_path / "big.txt"
    path.write_bytes(raw)
    monkeypatch.setattr(text_file, "TEXT_PIECE_BYTES", 1 << 16)
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    tracemalloc.start()
    try:
        ds = open_dataset(f"text:{path}", DataConfig(max_tokens=4096))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ds.summary()["total_tokens"] == len(raw)
    assert peak < 2 * len(raw), f"peak {peak / 1e6:.1f} MB for a {len(raw) / 1e6:.1f} MB file"
