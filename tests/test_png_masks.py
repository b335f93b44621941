"""The native PNG mask decoder (``ingest.decode._png``): Pillow's values for every colour type and bit depth it
takes, under every filter type, in PNGs written here byte by byte, by Pillow and by other tools; the PNGs it
leaves to Pillow come out as they did; damaged ones are refused with a `DecodeError` naming the sample and the
byte offset; a batch decodes on the pool as it does mask by mask."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from ingest.decode import masks
from ingest.decode.masks import MaskDecoder, decode_mask
from ingest.errors import DecodeError

from conftest import realworld

needs_native = pytest.mark.skipif(masks.NATIVE_PNG is None, reason="ingest.decode._png not built or no libz.so.1")
BIG = 10**9

# -- PNGs written byte by byte -----------------------------------------------------------------------------------

SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: (colour type, bit depth) the native decoder takes
KINDS = [(3, 1), (3, 2), (3, 4), (3, 8), (0, 1), (0, 8), (0, 16), (4, 8)]


def chunk(kind: bytes, data: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(kind + data) if crc is None else crc
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def ihdr(w: int, h: int, depth: int, ctype: int, interlace: int = 0) -> bytes:
    return chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, interlace))


def scanlines(values: np.ndarray, depth: int, ctype: int) -> list[bytes]:
    """Each row of ``values`` as PNG stores it (no filter byte): packed most significant bits first below 8
    bits, big-endian at 16, with an alpha sample after each gray one for colour type 4."""
    rows = []
    for row in values:
        if depth == 16:
            rows.append(row.astype(">u2").tobytes())
        elif ctype == 4:
            rows.append(np.stack([row, 255 - row], axis=1).astype(np.uint8).tobytes())
        elif depth == 8:
            rows.append(row.astype(np.uint8).tobytes())
        else:
            bits = "".join(format(int(v), f"0{depth}b") for v in row)
            bits += "0" * (-len(bits) % 8)
            rows.append(bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8)))
    return rows


def paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def filtered(rows: list[bytes], bpp: int, filters: list[int]) -> bytes:
    """The rows filtered as a PNG encoder does, row k with filter type filters[k] (its byte in front; a type
    above 4 leaves the row as it is)."""
    out, prev = bytearray(), bytes(len(rows[0]))
    for x, f in zip(rows, filters):
        y = bytearray([f])
        for i in range(len(x)):
            a, b = (x[i - bpp] if i >= bpp else 0), prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            y.append((x[i] - (0, a, b, (a + b) // 2, paeth(a, b, c), 0)[min(f, 5)]) & 0xFF)   # 5+: not a type
        out += y
        prev = x
    return bytes(out)


def build(values: np.ndarray, depth: int, ctype: int, filters=None, *, idats: int = 1, plte: bool = True,
          interlace: int = 0, data: bytes | None = None, before_end: bytes = b"") -> bytes:
    """A PNG of ``values`` with the given per-row filter types (default: row k gets k % 5), its zlib stream
    split into ``idats`` IDAT chunks (``data``: this stream instead)."""
    h, w = values.shape
    channels = 2 if ctype == 4 else 1
    bpp = max(1, channels * depth // 8)
    filters = [k % 5 for k in range(h)] if filters is None else filters
    stream = zlib.compress(filtered(scanlines(values, depth, ctype), bpp, filters)) if data is None else data
    cuts = np.linspace(0, len(stream), idats + 1).astype(int)
    png = SIGNATURE + ihdr(w, h, depth, ctype, interlace)
    if ctype == 3 and plte:
        png += chunk(b"PLTE", bytes((i * 37 + c * 101) % 256 for i in range(1 << depth) for c in range(3)))
    png += b"".join(chunk(b"IDAT", stream[a:b]) for a, b in zip(cuts[:-1], cuts[1:]))
    return png + before_end + chunk(b"IEND", b"")


def values_for(h: int, w: int, depth: int, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    return g.integers(0, 1 << depth, (h, w)).astype(np.uint16 if depth == 16 else np.uint8)


def native(buf: bytes, limit: int = BIG, threads: int = 1):
    return masks.NATIVE_PNG.decode([buf], limit, threads)[0]


def pillow(buf: bytes) -> np.ndarray:
    return masks._pillow(buf, "pillow", BIG)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


# -- the values: Pillow's ------------------------------------------------------------------------------------

@needs_native
@pytest.mark.parametrize("ctype,depth", KINDS)
@pytest.mark.parametrize("filters", [0, 1, 2, 3, 4, "mixed"])
def test_every_kind_under_every_filter_gives_pillows_values(ctype, depth, filters):
    values = values_for(9, 13, depth, seed=depth * 7 + ctype)
    png = build(values, depth, ctype, None if filters == "mixed" else [filters] * 9, idats=3)
    assert native(png) is not None                      # decoded natively, not handed to Pillow
    got, want = decode_mask(png, "m"), pillow(png)
    assert same(got, want)
    assert np.array_equal(got, values)                  # the stored values (indices, levels, 0/1, the gray band)
    assert got.dtype == (np.uint16 if depth == 16 else np.uint8) and got.flags.writeable


@needs_native
@pytest.mark.parametrize("ctype,depth", KINDS)
@pytest.mark.parametrize("h,w", [(1, 1), (1, 17), (17, 1), (3, 5), (2, 9)])
def test_odd_sizes(ctype, depth, h, w):
    values = values_for(h, w, depth, seed=h * 31 + w)
    png = build(values, depth, ctype)
    assert native(png) is not None
    assert same(decode_mask(png, "m"), pillow(png)) and np.array_equal(decode_mask(png, "m"), values)


def pillow_png(values: np.ndarray, mode: str, **save) -> bytes:
    img = Image.fromarray(values) if mode != "P" else Image.fromarray(values).convert("P")
    if mode == "P":
        img.putpalette([(i * 53 + c * 91) % 256 for i in range(256) for c in range(3)])
    elif mode != img.mode:
        img = img.convert(mode)
    out = io.BytesIO()
    img.save(out, "PNG", **save)
    return out.getvalue()


@needs_native
@pytest.mark.parametrize("mode", ["P", "L", "I;16", "1", "LA"])
@pytest.mark.parametrize("h,w", [(1, 40), (40, 1), (37, 29), (300, 310)])
@pytest.mark.parametrize("save", [{}, {"optimize": True}, {"compress_level": 0}], ids=["default", "opt", "stored"])
def test_pillow_written(mode, h, w, save):
    g = np.random.default_rng(h + w)
    if mode == "I;16":
        values = g.integers(0, 65536, (h, w)).astype(np.uint16)
    else:
        values = (g.integers(0, 256, (h, w)) // (1 if mode != "1" else 128 / 255)).astype(np.uint8)
        values = np.kron(values[::4, ::4], np.ones((4, 4), np.uint8))[:h, :w] if h > 4 and w > 4 else values
    png = pillow_png(values, mode, **save)
    if mode == "P" and save.get("optimize"):   # Pillow may write fewer bits for few colours: still native
        assert png[25] == 3
    assert native(png) is not None
    assert same(decode_mask(png, "m"), pillow(png))


@needs_native
def test_palette_bit_depths_pillow_writes():
    g = np.random.default_rng(5)
    for colours in (2, 4, 16):
        values = g.integers(0, colours, (23, 19)).astype(np.uint8)
        img = Image.fromarray(values, "L").convert("P")
        img.putpalette([v % 256 for i in range(colours) for v in (i * 10, i * 20, i * 30)])
        out = io.BytesIO()
        img.save(out, "PNG", bits=int(np.log2(colours)))
        png = out.getvalue()
        assert (png[24], png[25]) == (int(np.log2(colours)), 3)
        assert same(decode_mask(png, "m"), pillow(png)) and np.array_equal(decode_mask(png, "m"), values)


REAL = {  # file: decoded natively (True) or left to Pillow (False)
    "pillow/p_trns_single.png": True, "pillow/i_trns.png": True, "pillow/uncompressed_la.png": True,
    "pillow/hopper_bw_500.png": True, "libjpeg-turbo/testorig.png": True, "pillow/pil123p.png": False,
    "pillow/hopper.png": False, "pillow/transparent.png": False, "pillow/mode_16bit.png": False,
    "pillow/truncated_image.png": False, "pillow/broken_data_stream.png": False,
    "libjpeg-turbo/monkey16.png": False,
}


@needs_native
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_pngs_come_out_as_with_pillow(name, monkeypatch):
    png = (realworld("png") / name).read_bytes()
    got = native(png)
    assert (got is not None) == REAL[name]
    assert got is None or len(got) == 4            # none of them refused by the native decoder
    ours = outcome(png, name)
    monkeypatch.setattr(masks, "NATIVE_PNG", None)
    theirs = outcome(png, name)
    if isinstance(theirs, DecodeError):
        assert isinstance(ours, DecodeError) and str(ours) == str(theirs)
    else:
        assert same(ours, theirs)


# -- what stays Pillow's -------------------------------------------------------------------------------------

@needs_native
def test_left_to_pillow_gives_todays_results(monkeypatch):
    g = np.random.default_rng(3)
    values = g.integers(0, 4, (6, 7)).astype(np.uint8)
    cases = {
        "gray 2-bit": build(values, 2, 0),                                   # Pillow scales the levels
        "gray 4-bit": build(values, 4, 0),
        "palette without PLTE": build(values, 2, 3, plte=False),
        "short gray tRNS": build(values, 8, 0, before_end=b"")[:33] + chunk(b"tRNS", b"\x00")
        + build(values, 8, 0)[33:],
        "no IEND": build(values, 8, 0)[:-12],
        "unknown critical chunk": build(values, 8, 0)[:33] + chunk(b"ABCD", b"x") + build(values, 8, 0)[33:],
    }
    apng = io.BytesIO()
    frames = [Image.fromarray(values * k).convert("P") for k in (1, 2)]
    frames[0].save(apng, "PNG", save_all=True, append_images=frames[1:])
    cases["animated"] = apng.getvalue()
    gif, bmp = io.BytesIO(), io.BytesIO()
    Image.fromarray(values).convert("P").save(gif, "GIF")
    Image.fromarray(values * 40).save(bmp, "BMP")
    cases["gif"], cases["bmp"] = gif.getvalue(), bmp.getvalue()
    ours = {k: outcome(v, k) for k, v in cases.items()}
    for name in ("gray 2-bit", "gray 4-bit", "palette without PLTE", "short gray tRNS", "no IEND",
                 "unknown critical chunk", "animated"):
        assert native(cases[name]) is None, name
    assert np.array_equal(ours["gray 2-bit"], values * 85)                     # Pillow's scaling, as today
    assert isinstance(ours["short gray tRNS"], DecodeError)                  # Pillow's "Truncated tRNS chunk"
    monkeypatch.setattr(masks, "NATIVE_PNG", None)
    for name, png in cases.items():
        theirs = outcome(png, name)
        if isinstance(theirs, DecodeError):
            assert str(ours[name]) == str(theirs), name
        else:
            assert same(ours[name], theirs), name


def outcome(data, name: str) -> np.ndarray | DecodeError:
    try:
        return decode_mask(data, name)
    except DecodeError as err:
        return err


@needs_native
def test_ancillary_chunks_pillow_refuses_are_left_to_it():
    """A mask Pillow refuses for an ancillary chunk (test_png_images.pillow_refused_chunks) is left to it, which
    names the problem; the same chunks whole are skipped."""
    from test_png_images import pillow_refused_chunks, pillow_taken_chunks
    values = np.random.default_rng(5).integers(0, 4, (6, 7)).astype(np.uint8)
    plain = build(values, 8, 3)
    for name, extra in {**pillow_refused_chunks(), **pillow_taken_chunks()}.items():
        for png in (plain[:33] + extra + plain[33:], plain[:-12] + extra + plain[-12:]):   # before IDAT, after
            if name in pillow_taken_chunks():
                buf, h, w, _ = native(png)
                assert same(np.frombuffer(buf, np.uint8).reshape(h, w), decode_mask(png, name)), name
                continue
            assert native(png) is None, name
            with pytest.raises(DecodeError):
                decode_mask(png, name)


@needs_native
def test_a_palette_of_more_than_256_entries_is_left_to_pillow():
    """Pillow refuses a palette of 257 entries or more ("invalid palette size") and takes 256 and a part one."""
    values = np.random.default_rng(6).integers(0, 4, (5, 6)).astype(np.uint8)
    plain = build(values, 8, 3, plte=False)
    big, full = (plain[:33] + chunk(b"PLTE", bytes(n)) + plain[33:] for n in (771, 770))
    assert native(big) is None
    with pytest.raises(DecodeError):
        decode_mask(big, "big")
    buf, h, w, _ = native(full)
    assert same(np.frombuffer(buf, np.uint8).reshape(h, w), decode_mask(full, "full"))


@needs_native
def test_interlaced_is_pillows():
    png = SIGNATURE + ihdr(4, 4, 8, 3, interlace=1) + chunk(b"IEND", b"")
    assert native(png) is None


def test_colour_pngs_are_refused_as_today():
    g = np.random.default_rng(4)
    for mode, values in (("RGB", g.integers(0, 256, (5, 6, 3))), ("RGBA", g.integers(0, 256, (5, 6, 4)))):
        png = pillow_png(values.astype(np.uint8), mode)
        with pytest.raises(DecodeError, match=f"{mode} image: a mask must be single-channel") as err:
            decode_mask(png, "sample-3")
        assert "sample-3" in str(err.value)
    gray_alpha_16 = build(g.integers(0, 65536, (4, 5)).astype(np.uint16), 16, 0)
    gray_alpha_16 = gray_alpha_16[:25] + b"\x04" + gray_alpha_16[26:]   # colour type 4 (the CRC is now wrong)
    gray_alpha_16 = gray_alpha_16[:8] + ihdr(5, 4, 16, 4) + gray_alpha_16[33:]
    with pytest.raises(DecodeError, match="RGBA image"):                 # Pillow makes 16-bit LA into RGBA
        decode_mask(gray_alpha_16, "la16")


def test_without_the_native_decoder_pillow_decodes_everything(monkeypatch):
    values = values_for(7, 9, 8)
    png = build(values, 8, 3)
    monkeypatch.setattr(masks, "NATIVE_PNG", None)
    assert not masks._native_png(png)
    assert np.array_equal(decode_mask(png, "m"), values)
    decoder = MaskDecoder(threads=2)
    try:
        got = decoder.decode_batch([png, png], ["a", "b"])
    finally:
        decoder.close()
    assert all(np.array_equal(g, values) for g in got)


# -- damaged files ---------------------------------------------------------------------------------------------

def refused(png: bytes, match: str, name: str = "voc/2007_000032.png", **kw) -> DecodeError:
    with pytest.raises(DecodeError, match=match) as err:
        decode_mask(png, name, **kw)
    assert name in str(err.value)
    return err.value


@needs_native
def test_damaged_pngs_are_refused_with_the_offset():
    values = values_for(20, 30, 8)
    good = build(values, 8, 3, idats=2)
    idat = good.index(b"IDAT") - 4
    length = struct.unpack(">I", good[idat:idat + 4])[0]
    crc_at = idat + 8 + length
    bad_crc = good[:crc_at] + bytes([good[crc_at] ^ 1]) + good[crc_at + 1:]
    assert refused(bad_crc, "'IDAT' fails its CRC check").offset == idat
    assert refused(good[:idat + 8 + length // 2], "'IDAT' of .* runs past the end").offset == idat   # cut
    # inside the first IDAT
    stream = zlib.compress(filtered(scanlines(values, 8, 3), 1, [0] * 20))
    assert "in row" in str(refused(build(values, 8, 3, data=stream[:len(stream) // 2]), "truncated"))
    refused(build(values, 8, 3, data=stream[:-4]), "stops before its zlib stream ends")   # no Adler-32
    long = zlib.compress(filtered(scanlines(values_for(21, 30, 8), 8, 3), 1, [0] * 21))
    refused(build(values, 8, 3, data=long), "more than its 20 rows")
    short = zlib.compress(filtered(scanlines(values_for(19, 30, 8), 8, 3), 1, [0] * 19))
    refused(build(values, 8, 3, data=short), "ends in row 19 of 20")
    refused(build(values, 8, 3, filters=[0] * 7 + [5] + [0] * 12), "row 7 has filter type 5")
    flipped = bytearray(stream)
    flipped[len(flipped) // 2] ^= 0xFF
    refused(build(values, 8, 3, data=bytes(flipped)), "corrupt|ends|more than|filter type")
    refused(build(values, 8, 3, data=b"\x00" * 20), "corrupt")
    refused(SIGNATURE + ihdr(30, 20, 8, 3)[:-1] + b"\x00", "'IHDR' fails its CRC check")
    refused(SIGNATURE + ihdr(30, 20, 8, 3) + chunk(b"PLTE", bytes(3)) + chunk(b"IEND", b""), "no IDAT")
    two = build(values, 8, 3, idats=2)
    second = two.index(b"IDAT", two.index(b"IDAT") + 1) - 4
    refused(two[:second] + chunk(b"tEXt", b"a\x00b") + two[second:], "not consecutive")
    refused(good[:33] + ihdr(30, 20, 8, 3) + good[33:], "second IHDR")
    refused(good[:33] + struct.pack(">I", 1 << 31) + b"IDAT" + good[41:], "exceeds 2\\^31-1")
    refused(good[:33] + struct.pack(">I", 0) + b"ID4T" + good[41:], "four ASCII letters")


@needs_native
def test_bad_headers_are_refused():
    refused(SIGNATURE + ihdr(0, 5, 8, 3) + chunk(b"IEND", b""), "width and height must be")
    refused(SIGNATURE + ihdr(5, 1 << 31, 8, 0) + chunk(b"IEND", b""), "width and height must be")
    bad_method = SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", 5, 5, 8, 3, 1, 0, 0)) + chunk(b"IEND", b"")
    refused(bad_method, "compression method 1")
    assert "13-byte IHDR" in native(SIGNATURE + chunk(b"IHDR", bytes(12)) + chunk(b"IEND", b""))[0]
    assert "runs past the end" in native(SIGNATURE + ihdr(5, 5, 8, 3)[:20])[0]
    assert "ends inside a chunk header" in native(SIGNATURE + ihdr(5, 5, 8, 3)[:10])[0]


@needs_native
def test_oversized_header_is_refused_before_allocating():
    huge = SIGNATURE + ihdr(100_000, 100_000, 16, 0) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) \
        + chunk(b"IEND", b"")
    err = refused(huge, "mask of 100000x100000 pixels exceeds max_pixels=89478485")   # the default limit
    assert err.offset is None
    values = values_for(20, 30, 8)
    refused(build(values, 8, 3), "mask of 30x20 pixels exceeds max_pixels=599", max_pixels=599)
    assert np.array_equal(decode_mask(build(values, 8, 3), "m", max_pixels=600), values)


# -- batches ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("threads", [1, 3])
def test_a_batch_decodes_as_mask_by_mask(threads):
    g = np.random.default_rng(9)
    rgb = pillow_png(g.integers(0, 256, (4, 4, 3)).astype(np.uint8), "RGB")
    bmp = io.BytesIO()
    Image.fromarray(values_for(5, 6, 8)).save(bmp, "BMP")
    good = [build(values_for(10 + k, 7 + k, d, seed=k), d, c) for k, (c, d) in enumerate(KINDS)]
    datas = good[:3] + [rgb, bmp.getvalue(), np.arange(6, dtype=np.uint8).reshape(2, 3), b"",
                        good[3][:-20], memoryview(good[4]), np.frombuffer(good[5], np.uint8)] + good[6:]
    names = [f"s{k}" for k in range(len(datas))]
    decoder = MaskDecoder(threads=threads)
    try:
        got = decoder.decode_batch(datas, names)
    finally:
        decoder.close()
    assert len(got) == len(datas)
    for data, name, g_ in zip(datas, names, got):
        try:
            want = decode_mask(data, name)
        except DecodeError as err:
            assert isinstance(g_, DecodeError) and str(g_) == str(err)
        else:
            assert same(g_, want), name
    assert sum(isinstance(g_, DecodeError) for g_ in got) == 3      # the RGB, the empty, the truncated


@needs_native
def test_native_threads_split_a_batch():
    native_png = masks.NATIVE_PNG
    pngs = [build(values_for(30, 40, 8, seed=k), 8, 3) for k in range(12)]
    pngs += [b"junk", build(values_for(3, 3, 8), 8, 3)[:-30]]   # left to Pillow, refused
    one = native_png.decode(pngs, BIG, 1)
    four = native_png.decode(pngs, BIG, 4)
    pending = native_png.start(pngs, BIG, 3)
    started = native_png.finish(pending)
    with pytest.raises(ValueError):
        native_png.finish(pending)                          # finished with
    assert one[-2] is None and four[-2] is None and started[-2] is None
    assert one[-1] == four[-1] == started[-1] and "IDAT" in one[-1][0]
    for a, b, c, k in zip(one, four, started, range(12)):
        assert a[1:] == b[1:] == c[1:] == (30, 40, 1) and a[0] == b[0] == c[0]
        assert np.array_equal(np.frombuffer(a[0], np.uint8).reshape(30, 40), values_for(30, 40, 8, seed=k))
    for _ in range(3):   # dropped unfinished: its threads are waited for when it is freed
        native_png.start(pngs * 4, BIG, 4)
    assert native_png.finish(native_png.start([], BIG, 4)) == []


@needs_native
def test_damaged_bytes_give_values_or_a_decode_error():
    g = np.random.default_rng(11)
    seeds = [build(values_for(9 + k, 11, d, seed=k), d, c, idats=2) for k, (c, d) in enumerate(KINDS)]
    for k in range(400):
        png = bytearray(seeds[k % len(seeds)])
        if k % 3 == 0:
            png = png[:int(g.integers(8, len(png)))]
        else:
            for at in g.integers(8, len(png), 1 + k % 4):
                png[at] = int(g.integers(0, 256))
            if k % 3 == 2:   # CRCs made right again, so the damage reaches IHDR's checks and the inflater
                png = recrc(bytes(png))
        got = masks.NATIVE_PNG.decode([bytes(png)], 10**6, 1)[0]
        assert got is None or (len(got) == 2 and isinstance(got[0], str)) or len(got[0]) == got[1] * got[2] * got[3]


def recrc(png: bytes) -> bytes:
    """``png`` with every whole chunk's CRC recomputed."""
    out, pos = bytearray(png[:8]), 8
    while pos + 12 <= len(png):
        length = struct.unpack(">I", png[pos:pos + 4])[0]
        if pos + 12 + length > len(png):
            break
        out += png[pos:pos + 8 + length] + struct.pack(">I", zlib.crc32(png[pos + 4:pos + 8 + length]))
        pos += 12 + length
    return bytes(out + png[pos:])
