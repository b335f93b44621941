"""The batch JPEG header table (`ingest.decode.cpu.jpeg_headers`): the compiled scan (``ingest.formats._jpeg``)
reads every byte string exactly as `read_jpeg_header` does — real files, hostile ones, crafted segments and
random mutations — and `CpuDecoder.probe_batch` gives `probe`'s sizes and errors."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from ingest.errors import DecodeError
from ingest.decode import cpu as decode
from ingest.decode.cpu import HEADER_COLUMNS, CpuDecoder, header_of, jpeg_headers, read_jpeg_header
from conftest import encode, realworld, textured

native = pytest.mark.skipif(decode.NATIVE_HEADERS is None, reason="ingest.formats._jpeg was not built")


def python_table(datas) -> np.ndarray:
    saved, decode.NATIVE_HEADERS = decode.NATIVE_HEADERS, None
    try:
        return jpeg_headers(datas)
    finally:
        decode.NATIVE_HEADERS = saved


def segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def tiff(orientation: int, *, order: str = "<", kind: int = 3) -> bytes:
    head = (b"II" if order == "<" else b"MM") + struct.pack(order + "HI", 42, 8)
    value = struct.pack(order + ("HH" if kind == 3 else "I"), orientation, 0) if kind == 3 else \
        struct.pack(order + "I", orientation)
    return head + struct.pack(order + "H", 1) + struct.pack(order + "HHI", 0x0112, kind, 1) + value


def with_segments(*segments: bytes) -> bytes:
    """A real baseline JPEG with ``segments`` inserted right after SOI."""
    data = encode(Image.fromarray(textured(24, 40)), "JPEG")
    return data[:2] + b"".join(segments) + data[2:]


XMP = b"http://ns.adobe.com/xap/1.0/\x00"
CRAFTED = {
    "plain": with_segments(),
    "exif 6 little-endian": with_segments(segment(0xE1, b"Exif\0\0" + tiff(6))),
    "exif 8 big-endian long": with_segments(segment(0xE1, b"Exif\0\0" + tiff(8, order=">", kind=4))),
    "exif 0 gives way to xmp": with_segments(segment(0xE1, b"Exif\0\0" + tiff(0)),
                                             segment(0xE1, XMP + b'<a tiff:Orientation="3"/>')),
    "exif 9 is ignored": with_segments(segment(0xE1, b"Exif\0\0" + tiff(9))),
    "exif ifd past the end": with_segments(segment(0xE1, b"Exif\0\0II*\0\xff\xff\0\0")),
    "second exif after an unreadable one": with_segments(segment(0xE1, b"Exif\0\0MM"),
                                                         segment(0xE1, b"Exif\0\0" + tiff(5))),
    "xmp element form": with_segments(segment(0xE1, XMP + b"<tiff:Orientation>7</tiff:Orientation>")),
    "xmp key without a value, then one": with_segments(segment(0xE1, XMP + b'tiff:Orientation tiff:Orientation="2"')),
    "adobe transform 0": with_segments(segment(0xEE, b"Adobe\0\x64\0\0\0\0\0")),
    "adobe transform 1": with_segments(segment(0xEE, b"Adobe\0\x64\0\0\0\0\1")),
    "fill bytes and junk": with_segments(b"\xff\xff\xff", b"junk\x00\xff\x00", segment(0xFE, b"comment")),
    "zero-length segment": with_segments(b"\xff\xe5\x00\x00"),
    "truncated in a segment": with_segments()[:30],
    "soi only": b"\xff\xd8\xff",
    "no frame header": b"\xff\xd8" + segment(0xE0, b"JFIF\0") + b"\xff\xda\x00\x02\xff\xd9",
    "png": encode(Image.fromarray(textured(8, 8)), "PNG"),
    "empty": b"",
}


def rgb_ids_jpeg() -> bytes:
    """A 3-component SOF whose component ids spell R, G, B (no Adobe segment)."""
    data = bytearray(with_segments())
    at = data.index(b"\xff\xc0") + 4 + 6          # marker, length, then precision/height/width/count
    data[at], data[at + 3], data[at + 6] = ord("R"), ord("G"), ord("B")
    return bytes(data)


CRAFTED["component ids RGB"] = rgb_ids_jpeg()


def test_python_rows_say_what_read_jpeg_header_says():
    table = python_table(list(CRAFTED.values()))
    assert table.shape == (len(CRAFTED), len(HEADER_COLUMNS))
    for row, data in zip(table, CRAFTED.values()):
        header = read_jpeg_header(memoryview(data)) if data[:3] == b"\xff\xd8\xff" else None
        assert header_of(row) == header
        assert row[HEADER_COLUMNS.index("eoi")] == data.endswith(b"\xff\xd9")
    by_name = dict(zip(CRAFTED, table.tolist()))
    orientation, rgb = HEADER_COLUMNS.index("orientation"), HEADER_COLUMNS.index("rgb")
    assert by_name["exif 6 little-endian"][orientation] == 6
    assert by_name["exif 8 big-endian long"][orientation] == 8
    assert by_name["exif 0 gives way to xmp"][orientation] == 3
    assert by_name["exif 9 is ignored"][orientation] == 1
    assert by_name["second exif after an unreadable one"][orientation] == 5
    assert by_name["xmp element form"][orientation] == 7
    assert by_name["xmp key without a value, then one"][orientation] == 2
    assert by_name["adobe transform 0"][rgb] == 1 and by_name["adobe transform 1"][rgb] == 0
    assert by_name["component ids RGB"][rgb] == 1
    assert by_name["no frame header"][0] == 2 and by_name["png"][0] == 0 and by_name["empty"][0] == 0


@native
def test_native_scan_equals_python_on_crafted_segments():
    datas = list(CRAFTED.values())
    assert np.array_equal(jpeg_headers(datas), python_table(datas))


@native
def test_native_scan_equals_python_on_real_files():
    files = sorted(p for sub in ("jpeg", "png") for p in realworld(sub).rglob("*") if p.is_file())
    datas = [p.read_bytes() for p in files]
    got, want = jpeg_headers(datas), python_table(datas)
    for path, g, w in zip(files, got, want):
        assert g.tolist() == w.tolist(), path.name
    assert (got[:, 0] == 1).sum() > 30   # most of them are JPEGs with a frame header


@native
def test_native_scan_takes_every_buffer_type():
    data = CRAFTED["exif 6 little-endian"]
    arena = np.frombuffer(b"xx" + data + b"yy", np.uint8)
    datas = [data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8), memoryview(arena)[2:-2]]
    table = jpeg_headers(datas)
    assert (table == table[0]).all() and table[0, 0] == 1


@native
def test_native_scan_refuses_what_is_not_a_buffer():
    with pytest.raises(TypeError):
        jpeg_headers([b"\xff\xd8\xff", 42])


@native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_native_scan_equals_python_on_mutations(data):
    """Random edits of crafted JPEGs (bytes flipped, inserted, cut) and random bytes after SOI."""
    base = bytearray(data.draw(st.sampled_from(list(CRAFTED.values())[:12])))
    for _ in range(data.draw(st.integers(0, 6))):
        if not base:
            break
        at = data.draw(st.integers(0, len(base) - 1))
        what = data.draw(st.sampled_from(("flip", "insert", "cut")))
        value = data.draw(st.sampled_from((0x00, 0xFF, 0xD8, 0xD9, 0xDA, 0xE1, 0xEE, 0xC0, 0xC2, 0x01, 0x42)))
        if what == "flip":
            base[at] = value
        elif what == "insert":
            base[at:at] = bytes([0xFF, value])
        else:
            del base[at:at + data.draw(st.integers(1, 40))]
    noise = b"\xff\xd8\xff" + data.draw(st.binary(max_size=200))
    datas = [bytes(base), noise]
    assert np.array_equal(jpeg_headers(datas), python_table(datas))


def test_probe_batch_gives_probe_sizes_and_errors():
    cpu = CpuDecoder(threads=1, max_pixels=10_000)
    big = encode(Image.fromarray(textured(120, 100)), "JPEG")              # 12,000 pixels: over the limit
    datas = [CRAFTED["exif 6 little-endian"], CRAFTED["png"], CRAFTED["no frame header"], big, CRAFTED["plain"]]
    names = [f"s{k}" for k in range(len(datas))]
    sizes, table = cpu.probe_batch(datas, names)
    assert sizes[0] == (40, 24)          # orientation 6 turns the 24x40 (h x w) image
    assert sizes[1] == (8, 8) and sizes[4] == (24, 40)
    for k in (2, 3):
        assert isinstance(sizes[k], DecodeError) and names[k] in str(sizes[k])
        with pytest.raises(DecodeError) as err:
            cpu.probe(datas[k], names[k])
        assert str(err.value) == str(sizes[k])
    assert np.array_equal(table, jpeg_headers(datas))
