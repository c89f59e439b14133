"""What an HEIF or AVIF file's container states of its primary image, read from its
ISOBMFF boxes (the ``meta`` box's ``pitm``, ``iprp``/``ipco`` and ``ipma``), for
:mod:`datacentric.data.media_images`: the colours an ``nclx`` box states
(:func:`nclx_box`; Pillow's AVIF reader reads none) and whether the container turns or
mirrors the picture (:func:`container_turned`: pillow-heif applies ``irot`` and ``imir``
and reports neither).

Only box headers and the ``meta`` box's properties are read, each size checked against
the box around it; nothing in the file is run. A file without a ``meta`` box, a primary
item or the property states nothing (None, False); one whose boxes do not fit each
other is a :class:`BoxError` naming the file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from datacentric.regular_files import open_regular

#: the most bytes of a ``meta`` box read: its item properties and locations take a few
#: kilobytes (a photo's Exif and pixels lie in ``mdat``; an ``idat`` of 16 MiB is none
#: a camera writes)
META_LIMIT = 16 << 20


class BoxError(ValueError):
    """A container whose boxes do not fit each other: the file and what is wrong."""


class _Boxes:
    """The bytes of one box's body and the file they come from, read within bounds."""

    def __init__(self, data: bytes, path: Path) -> None:
        self.data, self.path = data, path

    def fail(self, what: str) -> BoxError:
        """A :class:`BoxError` naming the file and ``what`` is wrong."""
        return BoxError(
            f"{self.path.name}: malformed HEIF/AVIF container ({what}): "
            "save the picture again (an image editor, avifenc, heif-enc) to read it"
        )

    def unpack(self, layout: str, at: int, end: int, box: str) -> tuple[int, ...]:
        """``struct.unpack`` of big-endian ``layout`` at ``at``, which must end by ``end``."""
        size = struct.calcsize(">" + layout)
        if at + size > end:
            raise self.fail(f"a {box} box ends before its fields")
        return struct.unpack_from(">" + layout, self.data, at)

    def children(self, start: int, end: int, box: str) -> Iterator[tuple[str, int, int]]:
        """Each box between ``start`` and ``end`` (inside ``box``): its type, body's start
        and end. A size of 0 runs to ``end``; 1 is followed by a 64-bit size."""
        at = start
        while at < end:
            size, kind = self.unpack("I4s", at, end, box)
            header = 8
            if size == 1:
                (size,), header = self.unpack("Q", at + 8, end, box), 16
            elif size == 0:
                size = end - at
            if size < header or at + size > end:
                raise self.fail(f"a box of {size} bytes at byte {at} of {box}")
            yield kind.decode("latin-1"), at + header, at + size
            at += size


def _meta(path: Path) -> bytes | None:
    """The body of ``path``'s top-level ``meta`` box (None when it has none), found by
    reading box headers alone."""
    with open_regular(path, "rb") as file:
        end = file.seek(0, 2)
        at = 0
        while at + 8 <= end:
            file.seek(at)
            head = file.read(16)
            size, kind = struct.unpack_from(">I4s", head)
            header = 8
            if size == 1 and len(head) == 16:
                size, header = struct.unpack_from(">Q", head, 8)[0], 16
            elif size == 0:
                size = end - at
            if size < header or at + size > end:
                raise _Boxes(b"", path).fail(f"a box of {size} bytes at byte {at} of the file")
            if kind == b"meta":
                if size > META_LIMIT:
                    raise _Boxes(b"", path).fail(f"a meta box of {size} bytes")
                file.seek(at + header)
                return file.read(size - header)
            at += size
    return None


def _primary_item(boxes: _Boxes, start: int, end: int) -> int | None:
    """The primary item's ID (``pitm``), None when the ``meta`` box names none."""
    for kind, body, stop in boxes.children(start, end, "meta"):
        if kind == "pitm":
            (version,) = boxes.unpack("B", body, stop, kind)
            return boxes.unpack("H" if version == 0 else "I", body + 4, stop, kind)[0]
    return None


def _associations(boxes: _Boxes, body: int, stop: int, item: int) -> list[int]:
    """The property indices (1 for ``ipco``'s first) an ``ipma`` box gives ``item``."""
    (word,) = boxes.unpack("I", body, stop, "ipma")  # version (high byte) and flags
    wide_ids, wide_indices = word >> 24 >= 1, bool(word & 1)
    (count,), at, found = boxes.unpack("I", body + 4, stop, "ipma"), body + 8, []
    for _ in range(count):
        (owner,) = boxes.unpack("I" if wide_ids else "H", at, stop, "ipma")
        (links,) = boxes.unpack("B", at + (4 if wide_ids else 2), stop, "ipma")
        at += (4 if wide_ids else 2) + 1
        layout, mask = ("H", 0x7FFF) if wide_indices else ("B", 0x7F)
        indices = boxes.unpack(layout * links, at, stop, "ipma")
        at += struct.calcsize(">" + layout * links)
        found += [i & mask for i in indices] if owner == item else []
    return found


def primary_properties(path: Path) -> list[tuple[str, bytes]]:
    """The item properties (type, body) the container of ``path`` associates with its
    primary image, in the order it lists them; none for a file without a ``meta`` box,
    primary item or ``iprp`` box. Raises :class:`BoxError` where the boxes do not fit."""
    meta = _meta(path)
    if meta is None:
        return []
    boxes = _Boxes(meta, path)
    item = _primary_item(boxes, 4, len(meta))  # past the meta box's version and flags
    if item is None:
        return []
    listed, wanted = [], []
    for kind, body, stop in boxes.children(4, len(meta), "meta"):
        if kind != "iprp":
            continue
        for inner, start, end in boxes.children(body, stop, "iprp"):
            if inner == "ipco":
                listed += [(k, meta[s:e]) for k, s, e in boxes.children(start, end, "ipco")]
            elif inner == "ipma":
                wanted += _associations(boxes, start, end, item)
    if any(index > len(listed) for index in wanted):
        raise boxes.fail(f"property {max(wanted)} of {len(listed)} associated")
    return [listed[index - 1] for index in wanted if index]


def nclx_box(path: Path) -> dict[str, Any] | None:
    """The colours the primary image's ``colr`` box of type ``nclx`` states (primaries,
    transfer and matrix by H.273's numbers, full range), as pillow-heif names them
    (``info["nclx_profile"]``); None when it has none."""
    for kind, body in primary_properties(path):
        if kind == "colr" and body[:4] == b"nclx":
            if len(body) < 11:
                raise _Boxes(body, path).fail(f"an nclx colr box of {len(body)} bytes")
            primaries, transfer, matrix, flags = struct.unpack_from(">HHHB", body, 4)
            return {
                "color_primaries": primaries,
                "transfer_characteristics": transfer,
                "matrix_coefficients": matrix,
                "full_range_flag": flags >> 7,
            }
    return None


def container_turned(path: Path) -> bool:
    """Whether the container turns (``irot`` of a quarter turn or more) or mirrors
    (``imir``) the primary image as it is shown."""
    for kind, body in primary_properties(path):
        if kind == "imir" or (kind == "irot" and body[:1] and body[0] & 3):
            return True
    return False
