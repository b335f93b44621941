"""CpuDecoder against Pillow, the reference decoder, on generated images and on real files.

Reference = Pillow's decode, ``ImageOps.exif_transpose``, alpha dropped (``convert("RGBA")[..., :3]``) and
16-bit samples shifted right by 8. Tolerances: lossless formats must match exactly. JPEG goes through
simplejpeg's libjpeg-turbo and Pillow's own libjpeg; both use the accurate integer IDCT and fancy upsampling,
so they agree exactly in practice, but builds may differ in SIMD code: we allow a mean absolute difference
< 1.0 and at most 8 levels per sample (a wrong orientation or colour conversion is off by tens).
"""

from __future__ import annotations

import io
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from ingest.errors import ConfigError, CorruptRecordError, DecodeError
from ingest.decode.cpu import CpuDecoder
from conftest import REALWORLD, encode, textured

JPEG_MEAN_DIFF = 1.0
JPEG_MAX_DIFF = 8
TIMEOUT_S = 20.0

#: Real files Pillow decodes but CpuDecoder refuses on purpose, and why.
REFUSED_THOUGH_PILLOW_DECODES = {
    # libjpeg warns "premature end of data segment": blocks of a scan are missing (see _LOST_DATA).
    "jpeg/jpeg-decoder/1cbb1bb37d62c44f67374cd451643dc4.jpg",
}


# -- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def decoder():
    with CpuDecoder(threads=4) as dec:
        yield dec




def jpeg(h: int = 61, w: int = 83, **kw) -> bytes:
    return encode(Image.fromarray(textured(h, w)), "JPEG", quality=92, **kw)


def with_orientation(orientation: int, fmt: str = "JPEG", h: int = 40, w: int = 64) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(Image.fromarray(textured(h, w, seed=orientation)), fmt, exif=exif)


def png16_rgb(pixels: np.ndarray) -> bytes:
    """A 16-bit-per-channel RGB PNG (Pillow cannot write one), written chunk by chunk."""
    h, w, _ = pixels.shape

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    rows = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in pixels)  # filter 0 per row
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def reference(data: bytes) -> np.ndarray:
    """Pillow's decode, oriented, as RGB uint8 with alpha dropped and 16-bit >> 8."""
    with Image.open(io.BytesIO(data)) as img:
        img = ImageOps.exif_transpose(img)
        if img.mode.startswith("I;16"):
            return np.repeat((np.asarray(img) >> 8).astype(np.uint8)[:, :, None], 3, axis=2)
        return np.asarray(img.convert("RGBA"))[:, :, :3]


def assert_close(got: np.ndarray, want: np.ndarray, *, exact: bool) -> None:
    assert got.dtype == np.uint8 and got.ndim == 3 and got.shape[2] == 3
    assert got.shape == want.shape
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    if exact:
        assert diff.max() == 0, f"mean {diff.mean():.3f}, max {diff.max()}"
    else:
        assert diff.mean() < JPEG_MEAN_DIFF and diff.max() <= JPEG_MAX_DIFF, \
            f"mean {diff.mean():.3f}, max {diff.max()}"


def assert_decode_error(err: BaseException, name: str) -> None:
    assert isinstance(err, DecodeError) and isinstance(err, CorruptRecordError)
    assert err.path == name and name in str(err)


# -- generated images ----------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"progressive": True}, {"subsampling": 0}, {"subsampling": 1},
                                     {"restart_marker_blocks": 3}], ids=str)
def test_jpeg_matches_pillow(decoder, options):
    data = jpeg(**options)
    out = decoder.decode(data, "a.jpg")
    assert_close(out, reference(data), exact=False)
    assert out.flags.c_contiguous and out.flags.writeable
    assert decoder.probe(data, "a.jpg") == (61, 83)


@pytest.mark.parametrize("mode", ["L", "CMYK"])
def test_jpeg_grayscale_and_cmyk(decoder, mode):
    data = encode(Image.fromarray(textured(37, 50)).convert(mode), "JPEG", quality=90)
    assert_close(decoder.decode(data, "x.jpg"), reference(data), exact=False)


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_exif_orientation(decoder, orientation, fmt):
    data = with_orientation(orientation, fmt)
    want = reference(data)
    assert want.shape[:2] == ((64, 40) if orientation >= 5 else (40, 64))
    assert_close(decoder.decode(data, "o"), want, exact=fmt == "PNG")
    assert decoder.probe(data, "o") == want.shape[:2]


def test_xmp_orientation_when_exif_has_none(decoder):
    xmp = b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'
    data = encode(Image.fromarray(textured(40, 64)), "JPEG", xmp=xmp)
    assert_close(decoder.decode(data, "x.jpg"), reference(data), exact=False)
    assert decoder.probe(data, "x.jpg") == (64, 40)


def test_png_modes_match_pillow(decoder):
    rgb = textured(30, 44)
    rgba = np.dstack([rgb, np.arange(30 * 44, dtype=np.uint8).reshape(30, 44)])  # alpha 0 in places
    images = {
        "rgb": Image.fromarray(rgb),
        "rgba": Image.fromarray(rgba),
        "la": Image.fromarray(rgba).convert("LA"),
        "gray": Image.fromarray(rgb).convert("L"),
        "1bit": Image.fromarray(rgb).convert("1"),
        "palette": Image.fromarray(rgb).quantize(16),
        "palette+trns": Image.fromarray(rgb).quantize(16),
    }
    for name, img in images.items():
        kw = {"transparency": 3} if name == "palette+trns" else {}
        data = encode(img, "PNG", **kw)
        assert_close(decoder.decode(data, name), reference(data), exact=True)
    out = decoder.decode(encode(images["rgba"], "PNG"), "rgba")
    assert np.array_equal(out, rgb), "alpha is dropped, colours kept as stored"


def test_16bit_png_keeps_the_high_byte(decoder):
    gray = np.array([[0x12FF, 0xFFFF, 0x0000, 0x80FE]], dtype=np.uint16)
    data = encode(Image.fromarray(gray), "PNG")  # mode I;16
    assert decoder.decode(data, "g16").tolist() == [[[v >> 8] * 3 for v in gray[0]]]
    rgb16 = np.array([[[0x12FF, 0x0100, 0xFFFF], [0x00FF, 0x7F80, 0x8000]]], dtype=np.uint16)
    out = decoder.decode(png16_rgb(rgb16), "rgb16")
    assert np.array_equal(out, (rgb16 >> 8).astype(np.uint8))


def test_format_is_sniffed_not_named(decoder):
    png = encode(Image.fromarray(textured(6, 6)), "PNG")
    assert np.array_equal(decoder.decode(png, "really_a_png.jpg"), textured(6, 6))


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, np.uint8)],
                         ids=["bytes", "bytearray", "memoryview", "ndarray"])
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_buffer_types(decoder, wrap, fmt):
    data = encode(Image.fromarray(textured(20, 30)), fmt)
    assert np.array_equal(decoder.decode(wrap(data), "b"), decoder.decode(data, "b"))
    assert decoder.probe(wrap(data), "b") == (20, 30)


def test_non_contiguous_buffer_is_a_type_error(decoder):
    with pytest.raises(TypeError, match="contiguous"):
        decoder.decode(np.frombuffer(jpeg(), np.uint8)[::2], "strided")


# -- DCT scaling -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("min_size, expected", [((480, 640), (480, 640)), ((239, 320), (240, 320)),
                                                 ((100, 100), (120, 160)), ((1, 1), (60, 80)),
                                                 ((1000, 1000), (480, 640))])
def test_min_size_downscales_in_the_dct(decoder, min_size, expected):
    data = jpeg(480, 640)
    out = decoder.decode(data, "big.jpg", min_size=min_size)
    assert out.shape[:2] == expected
    with Image.open(io.BytesIO(data)) as img:  # Pillow's draft() uses the same libjpeg scaling (1/2^k)
        img.draft("RGB", (expected[1], expected[0]))
        assert_close(out, np.asarray(img.convert("RGB")), exact=False)


def test_min_size_uses_eighths(decoder):
    """libjpeg-turbo scales by M/8: 5/8 here. Pillow has no such draft; compare with a box-filtered resize
    (a different filter: mean difference < 3 levels)."""
    data = jpeg(480, 640)
    out = decoder.decode(data, "big.jpg", min_size=(300, 361))
    assert out.shape[:2] == (300, 400)
    want = np.asarray(Image.fromarray(reference(data)).resize((400, 300), Image.Resampling.BOX))
    assert np.abs(out.astype(np.int16) - want).mean() < 3


def test_min_size_is_in_oriented_coordinates(decoder):
    data = with_orientation(6, h=160, w=320)  # displayed 320 high, 160 wide
    out = decoder.decode(data, "o6.jpg", min_size=(80, 40))
    assert out.shape[:2] == (80, 40)
    assert decoder.decode(data, "o6.jpg", min_size=(81, 40)).shape[:2] == (120, 60)  # 3/8


def test_min_size_rounds_sides_up():
    with CpuDecoder(threads=1) as dec:
        out = dec.decode(jpeg(149, 227), "odd.jpg", min_size=(70, 100))
    assert out.shape[:2] == (75, 114)  # ceil(149 / 2), ceil(227 / 2)


# -- failures ----------------------------------------------------------------------------------------------


def _patch_sof(data: bytes, height: int, width: int) -> bytes:
    at = data.index(b"\xff\xc0") + 5  # marker, length (2), precision (1)
    return data[:at] + struct.pack(">HH", height, width) + data[at + 4:]


def corrupt_samples() -> dict[str, bytes]:
    good = jpeg(64, 96)
    png = encode(Image.fromarray(textured(64, 96)), "PNG")
    sos = good.index(b"\xff\xda")
    return {
        "empty": b"",
        "garbage": bytes(range(256)) * 4,
        "soi_only": b"\xff\xd8\xff",
        "header_only": good[:sos],
        "truncated_in_scan": good[:sos + (len(good) - sos) // 2],
        "missing_eoi": good[:-2],
        "progressive_truncated": jpeg(64, 96, progressive=True)[:-200],
        "zero_height": _patch_sof(good, 0, 96),
        "bomb_65535": _patch_sof(good, 65535, 65535),
        "no_sof": good[:2] + good[sos:],
        "png_truncated": png[: len(png) // 2],
        "png_bad_crc": png[:40] + bytes([png[40] ^ 0xFF]) + png[41:],
    }


@pytest.mark.parametrize("kind", list(corrupt_samples()))
def test_corrupt_data_raises_decode_error(decoder, kind):
    name = f"bad/{kind}.jpg"
    data = corrupt_samples()[kind]
    start = time.perf_counter()
    with pytest.raises(DecodeError) as info:
        decoder.decode(data, name)
    assert time.perf_counter() - start < 1.0
    assert_decode_error(info.value, name)
    found_by_our_checks = {"empty", "soi_only", "zero_height", "bomb_65535", "no_sof"}  # nothing to chain
    assert info.value.__cause__ is not None or kind in found_by_our_checks


def test_bomb_is_refused_by_probe_too(decoder):
    with pytest.raises(DecodeError, match="max_pixels"):
        decoder.probe(corrupt_samples()["bomb_65535"], "bomb.jpg")


def test_max_pixels_option():
    with CpuDecoder(threads=1, max_pixels=64 * 95) as dec:
        with pytest.raises(DecodeError, match="max_pixels=6080"):
            dec.decode(jpeg(64, 96), "a.jpg")
        with pytest.raises(DecodeError, match="max_pixels"):
            dec.decode(encode(Image.fromarray(textured(64, 96)), "PNG"), "a.png")
        assert dec.decode(jpeg(64, 95), "b.jpg").shape == (64, 95, 3)


@pytest.mark.parametrize("options", [{}, {"restart_marker_blocks": 4}], ids=["plain", "restarts"])
def test_scan_cut_short_is_an_error_not_grey_rows(decoder, options):
    """The middle of the scan is missing but the file still ends in EOI: Pillow returns grey rows, we refuse."""
    good = jpeg(128, 128, **options)
    sos = good.index(b"\xff\xda")
    data = good[:sos + (len(good) - sos) // 3] + good[-2:]
    with Image.open(io.BytesIO(data)) as img:
        assert (np.asarray(img)[-16:] == 128).all(), "premise: Pillow fills the lost rows with grey"
    with pytest.raises(DecodeError, match="corrupt JPEG data"):
        decoder.decode(data, "cut.jpg")


def test_flipped_bits_never_raise_anything_else(decoder):
    """Bits flipped inside the scan data: decoded (JPEG has no checksum, much damage is undetectable) or
    DecodeError; nothing else, and nothing slow."""
    good = jpeg(128, 128, progressive=True)
    start = good.index(b"\xff\xda") + 20
    rng = np.random.default_rng(1)
    for _ in range(100):
        data = bytearray(good)
        data[int(rng.integers(start, len(good) - 2))] ^= 1 << int(rng.integers(0, 8))
        try:
            assert decoder.decode(bytes(data), "flip.jpg").shape == (128, 128, 3)
        except DecodeError as err:
            assert_decode_error(err, "flip.jpg")


def test_decode_batch_keeps_order_and_returns_errors(decoder):
    datas = [jpeg(20 + i, 30) for i in range(6)]
    datas[2] = b"not an image"
    names = [f"{i}.jpg" for i in range(6)]
    out = decoder.decode_batch(datas, names, min_sizes=[None] * 5 + [(1, 1)])
    assert_decode_error(out[2], "2.jpg")
    for i in (0, 1, 3, 4):
        assert out[i].shape == (20 + i, 30, 3)
    assert out[5].shape == (4, 4, 3)  # 25x30 at 1/8, sides rounded up
    with pytest.raises(ValueError, match="names"):
        decoder.decode_batch(datas, names[:3])


def test_close_and_config():
    dec = CpuDecoder(threads=2)
    with dec:
        assert dec.decode_batch([jpeg()], ["a"])[0].shape == (61, 83, 3)
    with pytest.raises(RuntimeError):
        dec.decode_batch([jpeg()], ["a"])
    with pytest.raises(ConfigError, match="`threads` must be >= 1, got 0"):
        CpuDecoder(threads=0)
    with pytest.raises(ConfigError, match="max_pixels"):
        CpuDecoder(max_pixels=0)


# -- real files written by other tools ---------------------------------------------------------------


def _real_files() -> list:
    files = sorted(p for sub in ("jpeg", "png") for p in (REALWORLD / sub).rglob("*")
                   if p.suffix in (".jpg", ".png"))
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"real-world data not found at {REALWORLD}"))]
    return [pytest.param(p, id=str(p.relative_to(REALWORLD))) for p in files]


def _with_timeout(fn, *args):
    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(fn, *args).result(timeout=TIMEOUT_S)
    except FutureTimeout:
        pytest.fail(f"{fn.__name__} took more than {TIMEOUT_S} s")
    finally:
        pool.shutdown(wait=False)


def _pillow_or_error(data: bytes):
    try:
        return reference(data)
    except Exception as err:  # whatever Pillow raises on a bad file is the answer "cannot decode"
        return err


@pytest.mark.realworld
@pytest.mark.parametrize("path", _real_files())
def test_real_file(decoder, path: Path):
    name = str(path.relative_to(REALWORLD))
    data = path.read_bytes()
    want = _pillow_or_error(data)

    def decode_or_error():
        try:
            return decoder.decode(data, name)
        except DecodeError as err:
            return err

    got = _with_timeout(decode_or_error)
    if isinstance(want, Exception) or name in REFUSED_THOUGH_PILLOW_DECODES:
        assert isinstance(got, DecodeError), f"Pillow fails ({want!r}) but we decoded" \
            if isinstance(want, Exception) else "expected to be refused"
        assert_decode_error(got, name)
        return
    assert not isinstance(got, DecodeError), f"Pillow decodes it, we raised {got}"
    assert_close(got, want, exact=data[:4] == b"\x89PNG")
    assert _with_timeout(decoder.probe, data, name) == got.shape[:2]
