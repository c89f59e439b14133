"""``prepare``'s caption lists read as users write them: CSV as RFC 4180 (quoted line
breaks, commas and quotes kept; BOM and CRLF accepted), JSONL split at ``\\n`` only,
``NAME.txt`` captions kept as written, Hugging Face's ``metadata.jsonl`` /
``metadata.csv`` with ``file_name``; every malformed list is one error naming the file
(and line). No media is decoded here."""

from __future__ import annotations

import csv
import io
import json
import os

import pytest

from datacentric.data.base import DataError
from datacentric.data.media_sources import read_media_source

#: every character Python's ``str.splitlines`` splits at, and what a caption may hold
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
CAPTIONS = [
    f"a cat{LINE_BREAKS}runs, then stops",
    'she said "hi, there", twice',
    "  leading and trailing spaces  ",
    "x\r\ny\u2028z\x85",
    "🐈 猫, ü",
]


def _csv_text(rows: list[tuple[str, str]], *, bom: bool = False, crlf: bool = False) -> str:
    out = io.StringIO(newline="")
    writer = csv.writer(out, lineterminator="\r\n" if crlf else "\n")
    writer.writerow(["path", "caption"])
    writer.writerows(rows)
    return ("\ufeff" if bom else "") + out.getvalue()


@pytest.mark.parametrize("bom,crlf", [(False, False), (True, True)])
def test_csv_captions_are_kept_exactly(tmp_path, bom, crlf):
    rows = [(f"c{n}.mp4", caption) for n, caption in enumerate(CAPTIONS)]
    listing = tmp_path / "list.csv"
    listing.write_bytes(_csv_text(rows, bom=bom, crlf=crlf).encode())
    items = read_media_source(listing)
    assert [(i.source, i.caption) for i in items] == rows
    # the first caption's "\n" and "\r" each end a physical line: it spans lines 2 to 4
    assert items[1].where == f"{listing}:5"


def test_jsonl_splits_at_newline_only(tmp_path):
    listing = tmp_path / "list.jsonl"
    lines = [json.dumps({"path": f"c{n}.mp4", "caption": c}) for n, c in enumerate(CAPTIONS)]
    # a raw U+2028 / U+0085 inside a JSON string is valid JSON: written unescaped here
    lines.append('{"path": "raw.mp4", "caption": "a\u2028b\x85c"}')
    listing.write_bytes(("\ufeff" + "\r\n".join(lines) + "\r\n").encode())
    items = read_media_source(listing)
    assert [i.caption for i in items] == [*CAPTIONS, "a\u2028b\x85c"]
    assert items[-1].where == f"{listing}:{len(lines)}"


def test_caption_files_are_kept_as_written(tmp_path):
    for n, caption in enumerate(CAPTIONS):
        (tmp_path / f"c{n}.mp4").write_bytes(b"")
        (tmp_path / f"c{n}.txt").write_bytes(caption.encode() + b"\n")  # an editor's line end
    (tmp_path / "bom.png").write_bytes(b"")
    (tmp_path / "bom.txt").write_bytes("\ufeffa photo\r\n".encode())
    items = {i.source: i.caption for i in read_media_source(tmp_path)}
    assert items == {"bom.png": "a photo", **{f"c{n}.mp4": c for n, c in enumerate(CAPTIONS)}}


def test_hugging_face_metadata_with_file_name(tmp_path):
    (tmp_path / "train").mkdir()
    rows = [{"file_name": "train/a.mp4", "text": "a, b"}, {"file_name": "b.png", "text": "c"}]
    (tmp_path / "metadata.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "a.txt").write_text("ignored: the metadata file lists the folder")
    items = read_media_source(tmp_path)
    assert [(i.source, i.caption, i.path) for i in items] == [
        ("train/a.mp4", "a, b", (tmp_path / "train" / "a.mp4").resolve()),
        ("b.png", "c", (tmp_path / "b.png").resolve()),
    ]
    assert items[0].where == f"{tmp_path / 'metadata.jsonl'}:1"
    csv_folder = tmp_path / "csv"
    csv_folder.mkdir()
    (csv_folder / "metadata.csv").write_text('file_name,caption\nx.mp4,"one, two"\n')
    assert [(i.source, i.caption) for i in read_media_source(csv_folder)] == [("x.mp4", "one, two")]
    assert read_media_source(csv_folder / "metadata.csv")[0].source == "x.mp4"
    (csv_folder / "metadata.jsonl").write_text('{"file_name": "x.mp4", "text": "y"}\n')
    with pytest.raises(DataError, match="holds both metadata.jsonl, metadata.csv"):
        read_media_source(csv_folder)


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("a.csv", b"path,text\na.mp4,a cat, running\n", r"a.csv:2: 3 fields, the header has 2"),
        ("a.csv", b'path,text\na.mp4,"never closed\n', r"a.csv:2: not CSV"),
        ("a.csv", b"path\na.mp4\n", r"a.csv:1: no caption column .* header reads 'path'"),
        ("a.csv", b"name,caption\na.mp4,x\n", r"a.csv:1: no media path column"),
        ("a.csv", b"\x89PNG\r\n\x1a\n\xff\xfe", r"a.csv: not a text file \(byte 0 is not UTF-8\)"),
        ("a.csv", b"path,text\x00\n", r"a.csv: not a text file \(it holds NUL bytes\)"),
        ("a.csv", b"", r"a.csv: empty"),
        ("a.csv", b"path,text,text\na.mp4,x,y\n", r"a.csv:1: the header names the column .text."),
        ("a.jsonl", b'{"path": "a.mp4", "text": "x", "text": "y"}\n', r"a.jsonl:1: .*'text' twice"),
        ("a.jsonl", b'{"path": "a.mp4"}\n', r"a.jsonl: no line has a caption"),
        ("a.jsonl", b'{"path": "a.mp4", "text": 3}\n', r"a.jsonl:1: .* must be strings"),
        ("a.jsonl", b'{"path": "a.mp4", "text": "x"}\n{"path"\n', r"a.jsonl:2: not JSON"),
        ("a.jsonl", b'{"path": "a.mp4", "text": "\\ud83d"}\n', r"a.jsonl:1: holds .ud83d, half"),
        ("a.jsonl", b'{"path": "\\udce9.mp4", "text": "x"}\n', r"a.jsonl:1: holds .udce9, half"),
    ],
)
def test_malformed_lists_are_one_error_naming_file_and_line(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=message):
        read_media_source(tmp_path / name)


def test_a_fifo_list_or_caption_file_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "list.csv")
    with pytest.raises(DataError, match="list.csv: cannot read it .*FIFO"):
        read_media_source(tmp_path / "list.csv")
    folder = tmp_path / "clips"
    folder.mkdir()
    (folder / "a.mp4").write_bytes(b"")
    os.mkfifo(folder / "a.txt")
    with pytest.raises(DataError, match="a.txt: cannot read it .*FIFO"):
        read_media_source(folder)


def test_a_clip_whose_name_is_not_utf8_is_named_not_a_crash(tmp_path):
    from datacentric.data.video_geometry import Geometry
    from datacentric.prepare.plan import PrepareJob, plan_task

    folder = os.fsencode(tmp_path)
    for name, data in ((b"caf\xe9.mp4", b""), (b"caf\xe9.txt", b"a cat"), (b"ok.mp4", b"")):
        with open(os.path.join(folder, name), "wb") as handle:
            handle.write(data)
    (tmp_path / "ok.txt").write_text("a dog")
    items = read_media_source(tmp_path)
    assert [(i.source, i.caption, i.unread) for i in items] == [
        ("caf\udce9.mp4", None, "its name is not UTF-8 (byte 0xe9): rename it in UTF-8"),
        ("ok.mp4", "a dog", None),
    ]
    assert items[0].name.startswith("caf_-")  # its record's name: no UnicodeEncodeError
    job = PrepareJob(pipeline="p", media=str(tmp_path), out="o")
    task = plan_task(items[0], Geometry(4, 16), None, job, None, {})
    assert (task.plan, task.skip) == (None, items[0].unread)


def test_a_caption_file_of_an_upper_case_suffix_is_read(tmp_path):
    for name, data in (("UP.MP4", b""), ("UP.TXT", b"a cat\r\n"), ("low.png", b"")):
        (tmp_path / name).write_bytes(data)
    (tmp_path / "low.Txt").write_text("a dog")
    (tmp_path / "two.mp4").write_bytes(b"")
    (tmp_path / "two.txt").write_text("read")
    (tmp_path / "two.TXT").write_text("not read")
    items = read_media_source(tmp_path)
    assert [(i.source, i.caption, i.where, i.unread) for i in items] == [
        ("UP.MP4", "a cat", str(tmp_path / "UP.TXT"), None),
        ("low.png", "a dog", str(tmp_path / "low.Txt"), None),
        (
            "two.TXT",
            None,
            str(tmp_path / "two.TXT"),
            "a second caption of two: two.txt is read; keep one",
        ),
        ("two.mp4", "read", str(tmp_path / "two.txt"), None),
    ]


def test_a_symlinked_folder_s_clips_are_listed_once_and_a_loop_ends(tmp_path):
    shard = tmp_path / "shard"
    shard.mkdir()
    (shard / "s.mp4").write_bytes(b"")
    (shard / "s.txt").write_text("a cat")
    folder = tmp_path / "clips"
    folder.mkdir()
    (folder / "linked").symlink_to(shard)
    (folder / "loop").symlink_to(folder)  # a link to the folder itself: walked once
    assert [(i.source, i.caption) for i in read_media_source(folder)] == [("linked/s.mp4", "a cat")]


def test_a_utf16_caption_or_list_as_windows_writes_it_is_read_as_written(tmp_path):
    # PowerShell 5's `"..." > clip.txt` and Notepad's "Unicode": UTF-16 LE, its BOM, CRLF
    (tmp_path / "clip.mp4").write_bytes(b"")
    (tmp_path / "clip.txt").write_bytes("\ufeffa cat, 猫 🐈\r\n".encode("utf-16-le"))
    assert [i.caption for i in read_media_source(tmp_path)] == ["a cat, 猫 🐈"]
    listing = tmp_path / "list.csv"
    listing.write_bytes('path,caption\r\nclip.mp4,"x, y"\r\n'.encode("utf-16"))  # BOM first
    assert [(i.source, i.caption) for i in read_media_source(listing)] == [("clip.mp4", "x, y")]
    listing.write_bytes(b"\xfe\xff\x00p\xd8\x00")  # big-endian, then half a pair
    with pytest.raises(DataError, match=r"list.csv: not a text file \(byte 4 is not UTF-16\)"):
        read_media_source(listing)


def test_a_json_list_of_one_array_is_read_as_json_dump_writes_it(tmp_path):
    rows = [{"path": "a.mp4", "caption": "a cat,\n runs"}, {"video": "b.png", "text": "🐈"}]
    listing = tmp_path / "list.json"
    listing.write_text(json.dumps(rows, indent=2, ensure_ascii=False), encoding="utf-8")
    items = read_media_source(listing)
    assert [(i.source, i.caption, i.where) for i in items] == [
        ("a.mp4", "a cat,\n runs", f"{listing}: entry 1"),
        ("b.png", "🐈", f"{listing}: entry 2"),
    ]
    listing.write_text('[{"path": "a.mp4", "caption": "x"}, 3]')
    with pytest.raises(DataError, match=r"list.json: entry 2: want an object with path"):
        read_media_source(listing)
    listing.write_text('[{"path": "a.mp4", "caption": "x"},\n')
    with pytest.raises(DataError, match=r"list.json: the file is not JSON"):
        read_media_source(listing)


def test_lone_cr_line_ends_end_a_jsonl_line_and_a_caption_file(tmp_path):
    listing = tmp_path / "list.jsonl"
    listing.write_bytes(
        b'{"path": "a.mp4", "caption": "x\\ry"}\r{"path": "b.mp4", "caption": "z"}\r'
    )
    items = read_media_source(listing)
    assert [(i.caption, i.where) for i in items] == [
        ("x\ry", f"{listing}:1"),
        ("z", f"{listing}:2"),
    ]
    folder = tmp_path / "clips"
    folder.mkdir()
    (folder / "a.mp4").write_bytes(b"")
    (folder / "a.txt").write_bytes(b"one\rtwo\r")  # an old Mac editor's line ends
    assert [i.caption for i in read_media_source(folder)] == ["one\rtwo"]


def test_a_clip_the_folder_s_metadata_does_not_list_is_named(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("a.mp4", "sub/b.PNG", "c.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.mp4", "text": "a cat"}\n')
    items = read_media_source(tmp_path)
    listing = tmp_path / "metadata.jsonl"
    assert [(i.source, i.caption, i.where, i.unread) for i in items] == [
        ("a.mp4", "a cat", f"{listing}:1", None),
        (
            "sub/b.PNG",
            None,
            str(listing),
            "not listed in metadata.jsonl, the folder's list: add a line for it",
        ),
    ]


#: the start of an AppleDouble file, as macOS writes ``._NAME`` beside a copied file
APPLE_DOUBLE = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        \x00\x02"


def test_the_apple_double_files_a_mac_writes_beside_a_copy_are_no_media(tmp_path):
    folder = tmp_path / "clips"
    (folder / "__MACOSX").mkdir(parents=True)
    (folder / "a.mp4").write_bytes(b"")
    (folder / "a.txt").write_text("a cat")
    for name in ("._a.mp4", "._a.txt", "._b.png", "__MACOSX/._a.mp4"):
        (folder / name).write_bytes(APPLE_DOUBLE)
    assert [(i.source, i.caption, i.unread) for i in read_media_source(folder)] == [
        ("a.mp4", "a cat", None)
    ]
    (folder / "metadata.jsonl").write_text(json.dumps({"file_name": "a.mp4", "text": "a cat"}))
    assert [(i.source, i.unread) for i in read_media_source(folder)] == [("a.mp4", None)]
