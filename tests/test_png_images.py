"""The native engine's PNG image decode (``ingest/_native/png_decode.h`` as an RGB image, `ingest._engine.png_image`)
against Pillow on PNGs written here row by row: every colour type at every 8-bit-or-lower depth, all five filter
types, palettes of every size (full and short), tRNS chunks, odd sizes; it must give exactly what the Python stages'
CPU decode gives (`ingest.decode.cpu`, Pillow's ``convert("RGB")``, the transparency dropped), leave to Pillow what it
does not take (16 bits, Adam7, an eXIf chunk, an index past the palette, a short colour tRNS) and refuse damage
with a message."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from ingest import native
from ingest.decode.cpu import CpuDecoder
from ingest.errors import DecodeError

pytestmark = pytest.mark.skipif(native.ENGINE is None, reason="ingest._engine was not built")
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def filtered(raw: np.ndarray, bpp: int, filters: list[int]) -> bytes:
    """Each scanline of ``raw`` ([H, row bytes] uint8) filtered with ``filters[y % len(filters)]`` (0-4)."""
    out, prev = [], np.zeros(raw.shape[1], np.int64)
    for y, row in enumerate(raw.astype(np.int64)):
        f = filters[y % len(filters)]
        left = np.concatenate([np.zeros(bpp, np.int64), row[:-bpp]]) if bpp < len(row) else np.zeros_like(row)
        up_left = np.concatenate([np.zeros(bpp, np.int64), prev[:-bpp]]) if bpp < len(row) else np.zeros_like(row)
        if f == 0:
            pred = np.zeros_like(row)
        elif f == 1:
            pred = left
        elif f == 2:
            pred = prev
        elif f == 3:
            pred = (left + prev) >> 1
        else:
            pred = np.array([paeth(a, b, c) for a, b, c in zip(left, prev, up_left)], np.int64)
        out.append(bytes([f]) + ((row - pred) % 256).astype(np.uint8).tobytes())
        prev = row
    return b"".join(out)


def write_png(values: np.ndarray, ctype: int, depth: int, *, filters=(0, 1, 2, 3, 4), palette: bytes | None = None,
              trns: bytes | None = None, before_idat: tuple[bytes, ...] = (), interlace: int = 0,
              split: int = 0) -> bytes:
    """A PNG of ``values`` ([H, W, channels] sample values at ``depth``), its IDAT split in pieces of ``split``
    bytes where given, ``before_idat`` chunks (whole, with their CRCs) put before it."""
    h, w, c = values.shape
    if depth < 8:
        bits = np.unpackbits(values.astype(np.uint8)[..., None], axis=-1)[..., 8 - depth:].reshape(h, -1)
        pad = (-bits.shape[1]) % 8
        raw = np.packbits(np.pad(bits, ((0, 0), (0, pad))), axis=1)
    elif depth == 16:
        raw = values.astype(">u2").view(np.uint8).reshape(h, -1)
    else:
        raw = values.astype(np.uint8).reshape(h, -1)
    bpp = max(1, c * depth // 8)
    data = zlib.compress(filtered(raw, bpp, list(filters)))
    pieces = [data[k:k + split] for k in range(0, len(data), split)] if split else [data]
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, interlace))
    out += b"".join(before_idat)
    if palette is not None:
        out += chunk(b"PLTE", palette)
    if trns is not None:
        out += chunk(b"tRNS", trns)
    return out + b"".join(chunk(b"IDAT", p) for p in pieces) + chunk(b"IEND", b"")


def sample(h: int, w: int, ctype: int, depth: int, seed: int, entries: int | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    top = (entries if ctype == 3 and entries else 1 << depth) - 1
    values = rng.integers(0, top + 1, (h, w, CHANNELS[ctype]))
    values[0, 0] = top   # (the largest value, at least once)
    return values


def pillow(data: bytes) -> np.ndarray:
    """Pillow's ``convert("RGB")``, its transparency dropped first (as `ingest.decode.cpu` does)."""
    im = Image.open(io.BytesIO(data))
    im.info.pop("transparency", None)
    return np.asarray(im.convert("RGB"))


def cases() -> dict[str, bytes]:
    out = {}
    sizes = [(1, 1), (3, 5), (13, 17), (7, 33)]
    for ctype, depths in ((0, (1, 2, 4, 8)), (2, (8,)), (3, (1, 2, 4, 8)), (4, (8,)), (6, (8,))):
        for depth in depths:
            for k, (h, w) in enumerate(sizes):
                seed = 100 * ctype + 10 * depth + k
                palette = trns = None
                if ctype == 3:   # a full palette, or a short one the indices stay inside
                    entries = (1 << depth) if k % 2 else max(1, (1 << depth) - 1 - k)
                    palette = np.random.default_rng(seed).integers(0, 256, 3 * entries, np.uint8).tobytes()
                    trns = bytes(range(0, 255, 37))[:entries] if k >= 2 else None
                    values = sample(h, w, ctype, depth, seed, entries)
                else:
                    values = sample(h, w, ctype, depth, seed)
                    if k >= 2 and ctype in (0, 2):   # a colour key (dropped, as the Python stages drop it)
                        trns = struct.pack(">H", 1) if ctype == 0 else struct.pack(">HHH", 1, 2, 3)
                filters = [(k + f) % 5 for f in range(5)]
                out[f"type{ctype}-{depth}bit-{h}x{w}"] = write_png(values, ctype, depth, filters=filters,
                                                                     palette=palette, trns=trns, split=7 * k)
    return out


CASES = cases()


@pytest.mark.parametrize("name", list(CASES))
def test_an_image_png_decodes_as_the_python_stages_decode_it(name):
    data = CASES[name]
    got = native.ENGINE.png_image(data)
    assert isinstance(got, tuple), (name, got)
    h, w, pixels = got
    want = CpuDecoder().decode(data, name)
    assert (h, w) == want.shape[:2]
    assert np.array_equal(np.frombuffer(pixels, np.uint8).reshape(h, w, 3), want), name
    assert np.array_equal(want, pillow(data)), name   # (the Python stages' decode is Pillow's convert("RGB"))


def test_pillow_made_pngs_decode_as_pillow_decodes_them():
    rng = np.random.default_rng(3)
    for mode in ("RGB", "RGBA", "L", "LA", "P", "1"):
        for h, w in ((1, 7), (29, 31), (64, 3)):
            rgb = Image.fromarray(rng.integers(0, 256, (h, w, 3), np.uint8))
            im = rgb.convert(mode) if mode != "P" else rgb.quantize(colors=13)
            buf = io.BytesIO()
            im.save(buf, "PNG", optimize=(h == 29))
            h2, w2, pixels = native.ENGINE.png_image(buf.getvalue())
            assert np.array_equal(np.frombuffer(pixels, np.uint8).reshape(h2, w2, 3), pillow(buf.getvalue())), mode


def test_what_it_leaves_to_pillow_and_what_it_refuses():
    values = sample(6, 9, 2, 8, 1)
    exif = chunk(b"eXIf", b"MM\x00\x2a\x00\x00\x00\x08\x00\x00")
    palette = bytes(range(3 * 4))
    left = {
        "16-bit": write_png(sample(6, 9, 2, 16, 1), 2, 16),
        "16-bit gray": write_png(sample(6, 9, 0, 16, 1), 0, 16),
        "interlaced": write_png(values, 2, 8, interlace=1),
        "eXIf": write_png(values, 2, 8, before_idat=(exif,)),
        "index past the palette": write_png(np.full((3, 4, 1), 5), 3, 4, palette=palette),
        "palette of part entries": write_png(np.zeros((3, 4, 1)), 3, 8, palette=palette + b"\x01"),
        "short colour tRNS": write_png(values, 2, 8, trns=b"\x00\x01"),
        "no signature": b"GIF89a" + bytes(40),
    }
    for name, data in left.items():
        assert native.ENGINE.png_image(data) is None, name
    good = write_png(values, 2, 8)
    at = good.index(b"IDAT")
    damaged = {"an IDAT CRC": good[:at + 6] + bytes([good[at + 6] ^ 1]) + good[at + 7:],
               "truncated": good[:at + 20], "a bad filter type": write_png(values, 2, 8, filters=(5,))}
    for name, data in damaged.items():
        got = native.ENGINE.png_image(data)
        assert isinstance(got, str) and "PNG" in got, (name, got)


def pillow_refused_chunks() -> dict[str, bytes]:
    """Ancillary chunks (whole, with their CRCs) for which Pillow refuses the PNG that holds them, before or after
    its pixel data: fields cut short, an unknown compression method, text that inflates past Pillow's limits."""
    bomb = zlib.compress(bytes(2 << 20), 9)   # 2 MiB of text in about 2 KiB
    text = zlib.compress(bytes((1 << 20) - 1), 9)   # as much as Pillow inflates
    return {
        "short gAMA": chunk(b"gAMA", b"\x00\x01"), "short cHRM": chunk(b"cHRM", bytes(31)),
        "empty sRGB": chunk(b"sRGB", b""), "short pHYs": chunk(b"pHYs", bytes(8)),
        "iCCP of method 1": chunk(b"iCCP", b"icc\x00\x01" + zlib.compress(b"x")),
        "iCCP without a method": chunk(b"iCCP", b"icc\x00"), "empty iCCP": chunk(b"iCCP", b""),
        "iCCP past 1 MiB": chunk(b"iCCP", b"icc\x00\x00" + bomb),
        "zTXt of method 1": chunk(b"zTXt", b"key\x00\x01" + zlib.compress(b"x")),
        "zTXt past 1 MiB": chunk(b"zTXt", b"key\x00\x00" + bomb),
        "iTXt past 1 MiB": chunk(b"iTXt", b"key\x00\x01\x00en\x00key\x00" + bomb),
        "text past 64 MiB": b"".join(chunk(b"zTXt", b"k%d\x00\x00" % k + text) for k in range(65)),
    }


def pillow_taken_chunks() -> dict[str, bytes]:
    """The same chunks as Pillow takes them (whole, damaged text it ignores): the PNG decodes natively."""
    return {
        "gAMA": chunk(b"gAMA", struct.pack(">I", 45455)), "cHRM": chunk(b"cHRM", bytes(32)),
        "sRGB": chunk(b"sRGB", b"\x00"), "pHYs": chunk(b"pHYs", bytes(9)),
        "iCCP": chunk(b"iCCP", b"icc\x00\x00" + zlib.compress(bytes(3000))),
        "iCCP of damaged data": chunk(b"iCCP", b"icc\x00\x00garbage"),
        "zTXt": chunk(b"zTXt", b"key\x00\x00" + zlib.compress(b"text")), "zTXt without a NUL": chunk(b"zTXt", b"key"),
        "iTXt": chunk(b"iTXt", b"key\x00\x01\x00en\x00key\x00" + zlib.compress(b"text")),
        "tEXt": chunk(b"tEXt", b"key\x00\xff text"),
    }


@pytest.mark.parametrize("where", ["before", "after"])
def test_ancillary_chunks_pillow_refuses_are_left_to_it(where):
    """A PNG Pillow refuses for an ancillary chunk is left to Pillow (the Python stages' decode then names the
    problem), wherever the chunk is; the same chunks whole are skipped and the PNG decoded."""
    values, refused = sample(5, 7, 2, 8, 4), pillow_refused_chunks()
    for name, extra in {**refused, **pillow_taken_chunks()}.items():
        data = write_png(values, 2, 8, before_idat=(extra,))
        if where == "after":   # between the last IDAT and IEND
            plain = write_png(values, 2, 8)
            data = plain[:-12] + extra + plain[-12:]
        got = native.ENGINE.png_image(data)
        if name in refused:
            assert got is None, name
            with pytest.raises(DecodeError):
                CpuDecoder().decode(data, name)
        else:
            h, w, pixels = got
            assert np.array_equal(np.frombuffer(pixels, np.uint8).reshape(h, w, 3), CpuDecoder().decode(data, name))
