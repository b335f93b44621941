"""JPEG 2000, TIFF and PNM/PAM decoding, the dtype/channels rules, hostile files and a quiet console.

Fixtures are written here by other encoders (OpenJPEG and libtiff through imagecodecs, tifffile, Pillow, and a
hand-built YCbCr 4:2:2 TIFF) and each decode is checked against a reference: the source array for lossless
files, the reference decoder's output (OpenJPEG called directly, Pillow) for lossy ones, the colour formulas for
YCbCr. The GPU tests (marked ``gpu``) compare nvJPEG2000 and nvTIFF against the CPU decoder: lossless JPEG 2000
and TIFF exactly, lossy JPEG 2000 within a mean of 1 level (the 9/7 wavelet in floating point on both sides).
"""

from __future__ import annotations

import io
import json
import logging
import struct
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import REALWORLD, encode, textured
from ingest import defaults
from ingest.decode import codecs, openjpeg
from ingest.decode import gpu as decode_gpu
from ingest.decode.cpu import CpuDecoder, jpeg_headers
from ingest.errors import ConfigError, DecodeError

imagecodecs = pytest.importorskip("imagecodecs")
tifffile = pytest.importorskip("tifffile")

requires_gpu = pytest.mark.skipif(not decode_gpu.available(),
                                  reason="needs CUDA and nvImageCodec (pip install ingest[gpu])")

RGB = textured(48, 64)
RGB16 = (RGB.astype(np.uint16) * 257) ^ np.arange(64, dtype=np.uint16)[None, :, None]   # low bits vary too


@pytest.fixture(scope="module")
def cpu():
    with CpuDecoder(threads=1) as decoder:
        yield decoder


def decoder(**options) -> CpuDecoder:
    return CpuDecoder(threads=1, **options)


def tiff(array: np.ndarray, **options) -> bytes:
    out = io.BytesIO()
    tifffile.imwrite(out, array, **options)
    return out.getvalue()


def j2k(array: np.ndarray, **options) -> bytes:
    return imagecodecs.jpeg2k_encode(array, **options)


def j2k_tiled(array: np.ndarray, tile: int = 64, jp2: bool = True) -> bytes:
    """Irreversible 9/7, 20:1, in tiles of ``tile`` pixels and 4 resolution levels (Pillow's OpenJPEG encoder:
    imagecodecs writes no tiles)."""
    return encode(Image.fromarray(array), "JPEG2000", irreversible=True, quality_mode="rates", quality_layers=[20],
                  tile_size=(tile, tile), num_resolutions=4, no_jp2=not jp2)


def ycbcr422_tiff(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> bytes:
    """An uncompressed little-endian YCbCr 4:2:2 TIFF (as cameras write them): y [H, W], cb and cr [H, W/2];
    each data unit is two luma samples then Cb, Cr."""
    h, w = y.shape
    pixels = np.concatenate([y.reshape(h, w // 2, 2), cb[:, :, None], cr[:, :, None]], axis=2).astype(np.uint8)
    raster = pixels.tobytes()
    entries = [(256, 3, 1, w), (257, 3, 1, h), (258, 3, 3, "bits"), (259, 3, 1, 1), (262, 3, 1, 6),
               (273, 4, 1, "data"), (277, 3, 1, 3), (278, 3, 1, h), (279, 4, 1, len(raster)), (284, 3, 1, 1),
               (530, 3, 2, "sub")]
    bits_at = 8 + 2 + 12 * len(entries) + 4
    data_at = bits_at + 6
    out = bytearray(b"II*\x00" + struct.pack("<IH", 8, len(entries)))
    for tag, kind, count, value in entries:
        field = {"bits": struct.pack("<I", bits_at), "data": struct.pack("<I", data_at),
                 "sub": struct.pack("<HH", 2, 1)}.get(value) if isinstance(value, str) else \
            struct.pack("<HH", value, 0) if kind == 3 else struct.pack("<I", value)
        out += struct.pack("<HHI", tag, kind, count) + field
    return bytes(out + struct.pack("<I3H", 0, 8, 8, 8) + raster)


# -- JPEG 2000 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codecformat", ["jp2", "j2k"])
def test_lossless_jpeg2k_equals_its_source(cpu, codecformat):
    """Reversible 5/3: every sample back, as a JP2 file and as a bare codestream; probe from the header."""
    data = j2k(RGB, level=0, codecformat=codecformat)
    assert codecs.sniff(memoryview(data)) == "jpeg2k"
    assert cpu.probe(data, "a.jp2") == RGB.shape[:2]
    np.testing.assert_array_equal(cpu.decode(data, "a.jp2"), RGB)


def test_lossy_jpeg2k_equals_openjpeg_and_pillow(cpu):
    """Irreversible 9/7 (many resolution levels, tiles): exactly what OpenJPEG and Pillow (also OpenJPEG) give."""
    big = textured(160, 200, seed=3)
    data = j2k_tiled(big)
    got = cpu.decode(data, "lossy.jp2")
    np.testing.assert_array_equal(got, imagecodecs.jpeg2k_decode(data))
    np.testing.assert_array_equal(got, np.array(Image.open(io.BytesIO(data)).convert("RGB")))
    assert 0 < np.abs(got.astype(int) - big).mean() < 4   # lossy, but the same picture


def test_jpeg2k_precision_kept_or_reduced_to_8_bits():
    """16-bit and 12-bit samples: uint16 keeps the stored values; uint8 keeps the top 8 bits of the precision."""
    gray12 = (RGB16[:, :, 0] >> 4)
    for source, bits in ((RGB16, 16), (gray12, 12)):
        data = j2k(source, level=0, codecformat="j2k", bitspersample=bits)
        wide = decoder(dtype=torch.uint16, channels=1 if source.ndim == 2 else 3).decode(data, "deep.j2k")
        np.testing.assert_array_equal(wide.reshape(source.shape), source)
        narrow = decoder().decode(data, "deep.j2k")
        expected = (source >> (bits - 8)).astype(np.uint8)
        np.testing.assert_array_equal(narrow, expected if source.ndim == 3 else np.repeat(expected[:, :, None], 3, 2))


def test_jp2_colour_boxes_decide_gpu_eligibility():
    """sRGB and greyscale JP2 files (and bare codestreams) go to nvJPEG2000; sYCC-coded or palette ones do not
    (OpenJPEG converts them on the CPU)."""
    srgb = bytearray(j2k(RGB, level=0, codecformat="jp2"))
    at = bytes(srgb).find(b"colr")
    assert srgb[at + 4] == 1 and struct.unpack_from(">I", srgb, at + 7)[0] == 16   # method 1, enumerated sRGB
    sycc = bytearray(srgb)
    struct.pack_into(">I", sycc, at + 7, 18)
    header = lambda data: codecs.read_header(memoryview(bytes(data)), "jpeg2k", "x")  # noqa: E731
    assert header(srgb).gpu and header(j2k(RGB, level=0, codecformat="j2k")).gpu and not header(sycc).gpu


def test_jpeg2k_with_an_image_or_tile_offset_goes_to_the_cpu(cpu):
    """nvJPEG2000 takes image and tile start coordinates of 0 only: a codestream placed elsewhere on its reference
    grid is decoded on the CPU (the pixels are the same picture either way)."""
    header = lambda data: codecs.read_header(memoryview(data), "jpeg2k", "x")  # noqa: E731
    image = Image.fromarray(RGB)
    plain = encode(image, "JPEG2000", tile_size=(16, 16), no_jp2=True)
    assert header(plain).gpu
    for options in ({"offset": (5, 3)}, {"offset": (20, 20), "tile_offset": (10, 10)}):
        data = encode(image, "JPEG2000", tile_size=(16, 16), no_jp2=True, **options)
        found = header(data)
        assert not found.gpu and (found.height, found.width) == RGB.shape[:2], options
        np.testing.assert_array_equal(cpu.decode(data, "placed.j2k"), RGB)


def _areas(h: int, w: int, seed: int) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    out = [(0, 0, 1, 1), (w - 1, h - 1, w, h), (0, 0, w, h // 2), (w // 3, 0, w, h)]
    for _ in range(6):
        x0, y0 = int(rng.integers(0, w - 1)), int(rng.integers(0, h - 1))
        out.append((x0, y0, int(rng.integers(x0 + 1, w + 1)), int(rng.integers(y0 + 1, h + 1))))
    return out


@pytest.mark.skipif(not openjpeg.available(), reason="no libopenjp2 (Pillow's wheels bundle one)")
def test_openjpeg_decodes_an_area_as_the_whole_decode_has_it():
    """OpenJPEG's decode area: exactly the whole decode's samples there, for reversible and irreversible, tiled
    and untiled, J2K and JP2, an image and tile offset on the grid, gray, RGB, RGBA and 12-bit samples."""
    big = textured(130, 170, seed=5)
    cases = {
        "lossless rgb jp2": j2k(big, level=0, codecformat="jp2"),
        "lossy tiled j2k": j2k_tiled(big, 32, jp2=False),
        "lossy tiled jp2": j2k_tiled(big, 48),
        "lossless gray": j2k(big[:, :, 0], level=0, codecformat="j2k"),
        "rgba codestream": j2k(np.dstack([big, big[:, :, :1]]), level=0, codecformat="j2k"),
        "12-bit gray": j2k((RGB16[:, :, 0] >> 4), level=0, codecformat="j2k", bitspersample=12),
        "offsets": encode(Image.fromarray(big), "JPEG2000", tile_size=(32, 32), no_jp2=True, offset=(20, 12),
                          tile_offset=(10, 5), irreversible=True),
    }
    for seed, (what, data) in enumerate(cases.items()):
        buf = memoryview(data)
        header = codecs.read_header(buf, "jpeg2k", what)
        assert header.region, what
        whole = imagecodecs.jpeg2k_decode(data)
        for x0, y0, x1, y1 in _areas(header.height, header.width, seed):
            out = np.zeros_like(whole)   # the area written into a view of a whole image, nothing around it
            openjpeg.decode_area(buf, (x0, y0, x1, y1), what, jp2=data[:12] == codecs.JP2_SIGNATURE,
                                 out=out[y0:y1, x0:x1])
            np.testing.assert_array_equal(out[y0:y1, x0:x1], whole[y0:y1, x0:x1], err_msg=f"{what} {(x0, y0, x1, y1)}")
            out[y0:y1, x0:x1] = 0
            assert not out.any(), what


@pytest.mark.skipif(not openjpeg.available(), reason="no libopenjp2 (Pillow's wheels bundle one)")
def test_a_region_decode_returns_the_whole_size_with_only_the_region_decoded(cpu):
    """`CpuDecoder.decode(region=...)`: a JPEG 2000 image comes back at its size, the region as decoded whole
    and zeros around it; one OpenJPEG cannot decode an area of as its whole decode (sYCC colours, cut short)
    comes back whole; a JPEG ignores the region."""
    data = j2k_tiled(textured(96, 128, seed=2), 32)
    whole = cpu.decode(data, "a.jp2")
    got = cpu.decode(data, "a.jp2", region=(40, 20, 90, 70))
    assert got.shape == whole.shape
    np.testing.assert_array_equal(got[20:70, 40:90], whole[20:70, 40:90])
    got[20:70, 40:90] = 0
    assert not got.any()
    srgb = bytearray(j2k(RGB, level=0, codecformat="jp2"))
    sycc = bytearray(srgb)
    struct.pack_into(">I", sycc, bytes(srgb).find(b"colr") + 7, 18)   # enumerated sYCC: OpenJPEG's tools convert
    for other in (bytes(sycc), encode(Image.fromarray(RGB), "JPEG")):
        np.testing.assert_array_equal(cpu.decode(other, "b"), cpu.decode(other, "b", region=(5, 5, 20, 20)))
    cut = bytes(j2k(RGB, level=0, codecformat="j2k"))[:-300]   # no EOC: imagecodecs' whole decode names the failure
    with pytest.raises(DecodeError, match="^cut.j2k: cannot decode JPEG 2000: opj_decode"):
        cpu.decode(cut, "cut.j2k", region=(5, 5, 20, 20))


@pytest.mark.skipif(not openjpeg.available(), reason="no libopenjp2 (Pillow's wheels bundle one)")
def test_openjpeg_area_refuses_an_output_that_cannot_hold_it():
    """What OpenJPEG decoded must fit the caller's array (components, sample size), which must have the area's
    shape, packed pixels and an unsigned 8- or 16-bit type; nothing is written otherwise."""
    rgb, deep = j2k(RGB, level=0, codecformat="j2k"), j2k(RGB16[:, :, 0], level=0, codecformat="j2k")
    for data, out, why in ((rgb, np.zeros((8, 8), np.uint8), "1 component asked"),
                           (deep, np.zeros((8, 8), np.uint8), "16-bit samples into uint8")):
        with pytest.raises(DecodeError, match=r"^x.j2k: cannot decode JPEG 2000 \(components\): "):
            openjpeg.decode_area(memoryview(data), (0, 0, 8, 8), "x.j2k", jp2=False, out=out)
        assert not out.any(), why
    for out in (np.zeros((8, 9, 3), np.uint8), np.zeros((8, 8, 3), np.int16), np.zeros((8, 16, 3), np.uint8)[:, ::2]):
        with pytest.raises(ValueError, match="out must be"):
            openjpeg.decode_area(memoryview(rgb), (0, 0, 8, 8), "x.j2k", jp2=False, out=out)
    with pytest.raises(ValueError, match="empty"):
        openjpeg.decode_area(memoryview(rgb), (4, 4, 4, 8), "x.j2k", jp2=False, out=np.zeros((0, 4, 3), np.uint8))


@pytest.mark.skipif(not openjpeg.available(), reason="no libopenjp2 (Pillow's wheels bundle one)")
def test_openjpeg_failure_names_the_file_and_says_what_openjpeg_said(capfd):
    """A codestream whose COD asks for more decomposition levels than allowed: a DecodeError naming the file with
    OpenJPEG's own message, nothing printed."""
    data = bytearray(j2k(RGB, level=0, codecformat="j2k"))
    cod = bytes(data).find(b"\xff\x52")
    data[cod + 9] = 40   # SPcod's first byte: the decomposition levels (at most 32)
    with pytest.raises(DecodeError) as err:
        openjpeg.decode_area(memoryview(bytes(data)), (0, 0, 8, 8), "bad.j2k", jp2=False,
                             out=np.zeros((8, 8, 3), np.uint8))
    assert str(err.value).startswith("bad.j2k: cannot decode JPEG 2000 (header): ") and "no message" not in str(err.value)
    assert capfd.readouterr() == ("", "")


@pytest.mark.skipif(not openjpeg.available(), reason="no libopenjp2 (Pillow's wheels bundle one)")
def test_cpu_loader_decodes_only_the_crop_of_jpeg2k_with_the_same_batches(tmp_path, monkeypatch):
    """The CPU decode stage asks for the region the ops read: random crops of JPEG 2000 images decode just that
    area, and the batches are the ones a whole decode gives, to the bit (the ops then read only the region)."""
    import ingest
    from ingest.ops import HorizontalFlip, Normalize, RandomResizedCrop
    write_tree(tmp_path, {f"{c}/{i}.{'jp2' if i % 2 else 'j2k'}": j2k_tiled(textured(150 + 10 * i, 200, seed=i), 32,
                                                                          jp2=bool(i % 2))
                          for c in ("a", "b") for i in range(4)})

    def batches():
        loader = ingest.Loader(tmp_path, batch_size=4, ops=[RandomResizedCrop(48, scale=(0.05, 0.3)),
                                                            HorizontalFlip(), Normalize(128, 64)],
                               shuffle=True, seed=4, num_threads=2, extensions=(".jp2", ".j2k"))
        return [(x.clone(), y.clone()) for x, y in loader]

    areas = []
    decode_area = openjpeg.decode_area
    monkeypatch.setattr(openjpeg, "decode_area", lambda *a, **k: areas.append(a[1]) or decode_area(*a, **k))
    cropped = batches()
    assert len(areas) >= 8 and all((x1 - x0) * (y1 - y0) < 200 * 150 for x0, y0, x1, y1 in areas)
    monkeypatch.setattr(openjpeg, "available", lambda: False)
    whole = batches()
    assert len(cropped) == len(whole) == 2
    for (x, y), (xw, yw) in zip(cropped, whole):
        assert torch.equal(x, xw) and torch.equal(y, yw)


def test_image_types_name_jpeg2k_bigtiff_and_pam():
    from ingest.formats._images import image_extension, image_type
    assert image_type(j2k(RGB, level=0, codecformat="jp2")) == "jp2"
    assert image_extension(j2k(RGB, level=0, codecformat="j2k")) == ".j2k"
    assert image_type(tiff(RGB, photometric="rgb", bigtiff=True)) == "tiff"
    assert image_extension(b"P7\nWIDTH 1\n") == ".pam"


def test_jpeg2k_with_alpha_keeps_it_on_request():
    rgba = np.dstack([RGB, RGB[:, :, :1] // 2])
    data = j2k(rgba, level=0, codecformat="jp2")
    np.testing.assert_array_equal(decoder(channels=4).decode(data, "a.jp2"), rgba)
    np.testing.assert_array_equal(decoder().decode(data, "a.jp2"), RGB)


# -- TIFF -----------------------------------------------------------------------------------------------------


TIFF_VARIANTS = {
    "none": {}, "lzw": {"compression": "lzw"}, "deflate": {"compression": "zlib"},
    "zstd": {"compression": "zstd"}, "webp": {"compression": "webp", "compressionargs": {"lossless": True}},
    "lzw_predictor": {"compression": "lzw", "predictor": True}, "packbits": {"compression": "packbits"},
    "tiled_deflate": {"tile": (16, 32), "compression": "zlib"},
    "tiled_webp": {"tile": (16, 16), "compression": "webp", "compressionargs": {"lossless": True}},
    "planar": {"planarconfig": "separate", "compression": "lzw"}, "bigtiff": {"bigtiff": True},
    "big_endian": {"byteorder": ">"},
}


@pytest.mark.parametrize("variant", sorted(TIFF_VARIANTS))
def test_lossless_tiff_variants_equal_their_source(cpu, variant):
    source = RGB.transpose(2, 0, 1) if variant == "planar" else RGB   # tifffile takes planar samples first
    data = tiff(source, photometric="rgb", **TIFF_VARIANTS[variant])
    assert cpu.probe(data, "a.tif") == RGB.shape[:2]
    np.testing.assert_array_equal(cpu.decode(data, f"{variant}.tif"), RGB)


def test_float_tiff_with_the_floating_point_predictor_is_clipped_and_scaled(cpu):
    values = np.linspace(-0.5, 1.5, 48 * 64 * 3, dtype=np.float32).reshape(48, 64, 3)
    data = tiff(values, compression="zlib", predictor=3, photometric="rgb")
    expected = np.rint(np.clip(values, 0, 1) * 255).astype(np.uint8)
    np.testing.assert_array_equal(cpu.decode(data, "float.tif"), expected)
    wide = decoder(dtype="uint16").decode(data, "float.tif")
    np.testing.assert_array_equal(wide, np.rint(np.clip(values, 0, 1) * 65535).astype(np.uint16))


def test_ycbcr_422_tiff_is_converted_with_the_tiff_coefficients(cpu):
    """libtiff's conversion of 4:2:2 YCbCr (ITU-R 601, full range ReferenceBlackWhite) against the formula;
    Pillow refuses this file."""
    rng = np.random.default_rng(1)
    y, cb, cr = rng.integers(16, 236, (32, 48)), rng.integers(16, 241, (32, 24)), rng.integers(16, 241, (32, 24))
    data = ycbcr422_tiff(y, cb, cr)
    cbf, crf = np.repeat(cb, 2, 1) - 128.0, np.repeat(cr, 2, 1) - 128.0
    expected = np.stack([y + 1.402 * crf, y - 0.344136 * cbf - 0.714136 * crf, y + 1.772 * cbf], -1)
    got = cpu.decode(data, "camera.tif")
    assert got.shape == (32, 48, 3)
    assert np.abs(got - np.clip(np.rint(expected), 0, 255)).max() <= 1


def test_tiff_16_bit_gray_palette_and_orientation(cpu):
    gray16 = RGB16[:, :, 1]
    data = tiff(gray16, compression="zlib")
    np.testing.assert_array_equal(cpu.decode(data, "g.tif"), np.repeat((gray16 >> 8).astype(np.uint8)[:, :, None], 3, 2))
    np.testing.assert_array_equal(decoder(dtype="uint16", channels=1).decode(data, "g.tif")[:, :, 0], gray16)
    palette = Image.fromarray(RGB).quantize(16)
    data = encode(palette, "TIFF")
    np.testing.assert_array_equal(cpu.decode(data, "p.tif"), np.array(palette.convert("RGB")))
    data = tiff(RGB, photometric="rgb", extratags=[(274, "H", 1, 6, True)])   # Orientation: rotate 90 cw
    assert cpu.probe(data, "o.tif") == (64, 48)
    np.testing.assert_array_equal(cpu.decode(data, "o.tif"), np.rot90(RGB, -1))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_tiff_orientation_is_applied_once_on_both_libtiff_paths(cpu, orientation):
    """Gray 8-bit samples come as stored, bilevel ones through libtiff's RGBA interface (which flips rows and
    columns by the Orientation tag itself): both give the stored image turned by the tag, like a JPEG."""
    from ingest.decode.cpu import _orient
    bits = (RGB[:, :, 0] > 128)
    for name, data, stored in (
            ("gray", tiff(RGB[:, :, 0], extratags=[(274, "H", 1, orientation, True)]), RGB[:, :, 0]),
            # tifffile writes booleans min-is-white: a set bit is black
            ("bilevel", tiff(bits, extratags=[(274, "H", 1, orientation, True)]), np.where(bits, 0, 255))):
        expected = _orient(np.repeat(stored[:, :, None], 3, axis=2), orientation)
        np.testing.assert_array_equal(cpu.decode(data, f"{name}{orientation}.tif"), expected)


def test_multi_page_tiff_gives_its_first_page(cpu):
    out = io.BytesIO()
    with tifffile.TiffWriter(out) as writer:
        writer.write(RGB, photometric="rgb")
        writer.write(RGB[::-1], photometric="rgb")
    np.testing.assert_array_equal(cpu.decode(out.getvalue(), "pages.tif"), RGB)


def test_jpeg_compressed_tiff_matches_pillow(cpu):
    data = encode(Image.fromarray(RGB), "TIFF", compression="jpeg", quality=90)
    got = cpu.decode(data, "j.tif")
    assert np.abs(got.astype(int) - np.array(Image.open(io.BytesIO(data)).convert("RGB"))).mean() < 1.0
    assert np.abs(got.astype(int) - RGB).mean() < 3


# -- PNM / PAM ------------------------------------------------------------------------------------------------


def test_16_bit_ppm_and_pgm(cpu):
    ppm = b"P6\n# a comment\n64 48\n65535\n" + RGB16.astype(">u2").tobytes()
    np.testing.assert_array_equal(decoder(dtype="uint16").decode(ppm, "a.ppm"), RGB16)
    np.testing.assert_array_equal(cpu.decode(ppm, "a.ppm"), (RGB16 >> 8).astype(np.uint8))
    pgm = b"P5 64 48 1023\n" + (RGB16[:, :, 0] >> 6).astype(">u2").tobytes()
    np.testing.assert_array_equal(decoder(dtype="uint16", channels=1).decode(pgm, "a.pgm")[:, :, 0],
                                  RGB16[:, :, 0] >> 6)
    np.testing.assert_array_equal(cpu.decode(pgm, "a.pgm")[:, :, 1], (RGB16[:, :, 0] >> 8).astype(np.uint8))


def test_8_bit_ppm_equals_pillow_and_small_maxval_is_scaled(cpu):
    ppm = encode(Image.fromarray(RGB), "PPM")
    np.testing.assert_array_equal(cpu.decode(ppm, "a.ppm"), RGB)
    pgm = b"P5\n5 1\n3\n" + bytes([0, 1, 2, 3, 200])   # 200: above the maxval (damaged), taken as 3
    assert cpu.decode(pgm, "small.pgm")[0, :, 0].tolist() == [0, 85, 170, 255, 255]


def test_pam_gray_alpha_and_rgba():
    rgba = np.dstack([RGB, RGB[:, :, 2:]])
    pam = b"P7\nWIDTH 64\nHEIGHT 48\nDEPTH 4\nMAXVAL 255\nTUPLTYPE RGB_ALPHA\nENDHDR\n" + rgba.tobytes()
    np.testing.assert_array_equal(decoder(channels=4).decode(pam, "a.pam"), rgba)
    np.testing.assert_array_equal(decoder().decode(pam, "a.pam"), RGB)
    ga = np.dstack([RGB[:, :, :1], RGB[:, :, 1:2]]).astype(">u2") * 257
    pam = b"P7\nWIDTH 64\nHEIGHT 48\nDEPTH 2\nMAXVAL 65535\nTUPLTYPE GRAYSCALE_ALPHA\nENDHDR\n" + ga.tobytes()
    out = decoder(dtype="uint16", channels=4).decode(pam, "ga.pam")
    np.testing.assert_array_equal(out[:, :, 3], ga[:, :, 1])
    np.testing.assert_array_equal(out[:, :, 0], out[:, :, 2])


# -- dtype and channels ---------------------------------------------------------------------------------------


def test_channels_and_dtype_for_pillow_formats():
    png16 = encode(Image.fromarray(RGB16[:, :, 0]), "PNG")   # Pillow: I;16
    np.testing.assert_array_equal(decoder(dtype=np.uint16, channels=1).decode(png16, "g.png")[:, :, 0],
                                  RGB16[:, :, 0])
    rgb16_png = imagecodecs.png_encode(RGB16)
    np.testing.assert_array_equal(decoder(dtype="uint16").decode(rgb16_png, "c.png"), RGB16)
    rgba = np.dstack([RGB, 255 - RGB[:, :, :1]])
    png = encode(Image.fromarray(rgba), "PNG")
    np.testing.assert_array_equal(decoder(channels=4).decode(png, "a.png"), rgba)
    jpeg = encode(Image.fromarray(RGB), "JPEG", quality=90)
    rgb = decoder().decode(jpeg, "a.jpg")
    np.testing.assert_array_equal(decoder(channels=1).decode(jpeg, "a.jpg")[:, :, 0],
                                  np.array(Image.fromarray(rgb).convert("L")))
    opaque = decoder(channels=4).decode(jpeg, "a.jpg")
    assert (opaque[:, :, 3] == 255).all() and (opaque[:, :, :3] == rgb).all()
    assert decoder(dtype=torch.uint16).decode(jpeg, "a.jpg").dtype == np.uint16


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="Unknown decode dtype .*float32.* Available: uint8, uint16"):
        CpuDecoder(threads=1, dtype=torch.float32)
    with pytest.raises(ConfigError, match="`channels` must be one of 1, 3, 4, got 2"):
        CpuDecoder(threads=1, channels=2)


# -- hostile and truncated files ------------------------------------------------------------------------------


def hostile() -> dict[str, bytes]:
    jp2 = j2k(RGB, level=0, codecformat="jp2")
    raw = j2k(RGB, level=0, codecformat="j2k")
    huge = bytearray(raw)
    struct.pack_into(">II", huge, 8, 60000, 60000)                 # SIZ: 60000 x 60000 in one tile
    struct.pack_into(">II", huge, 24, 60000, 60000)
    tiles = bytearray(raw)
    struct.pack_into(">IIII", tiles, 8, 4000, 4000, 0, 0)          # 16M pixels in 1x1 tiles
    struct.pack_into(">II", tiles, 24, 1, 1)
    comps = bytearray(raw)
    struct.pack_into(">H", comps, 40, 300)                          # 300 components
    lzw = tiff(RGB, photometric="rgb", compression="lzw")
    tiled = tiff(RGB, photometric="rgb", tile=(16, 16))
    floats = tiff(RGB.astype(np.float32), photometric="rgb", compression="zlib")
    return {
        "truncated.jp2": jp2[:len(jp2) // 2], "no_codestream.jp2": jp2[:40], "huge.j2k": bytes(huge),
        "tiny_tiles.j2k": bytes(tiles), "components.j2k": bytes(comps), "empty_siz.j2k": raw[:20],
        "truncated.tif": lzw[:len(lzw) // 2], "ifd_past_end.tif": b"II*\x00" + struct.pack("<I", 10 ** 6),
        "huge.tif": patch_tiff(lzw, {256: 60000, 257: 60000}),
        "huge_floats.tif": patch_tiff(floats, {256: 40000, 257: 1000}),   # 40M pixels, but 480 MB of floats
        "hostile_tiles.tif": patch_tiff(tiled, {322: 1 << 30}), "no_entries.tif": b"II*\x00\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00",
        "truncated.ppm": b"P6\n64 48\n255\n" + RGB.tobytes()[:100],
        "bad_header.ppm": b"P6\n64 x 255\n" + b"\x00" * 64, "huge.pam": b"P7\nWIDTH 99999\nHEIGHT 99999\n"
        b"DEPTH 3\nMAXVAL 255\nENDHDR\n", "no_endhdr.pam": b"P7\nWIDTH 2\n",
        "maxval_zero.pgm": b"P5 2 2 0\n\x00\x00\x00\x00",
    }


def patch_tiff(data: bytes, values: dict[int, int]) -> bytes:
    """``data`` (a little-endian TIFF) with the first directory's ``tag: value`` entries set (as LONGs)."""
    out = bytearray(data)
    ifd = struct.unpack_from("<I", out, 4)[0]
    for k in range(struct.unpack_from("<H", out, ifd)[0]):
        at = ifd + 2 + 12 * k
        tag = struct.unpack_from("<H", out, at)[0]
        if tag in values:
            struct.pack_into("<HHII", out, at, tag, 4, 1, values[tag])
    return bytes(out)


@pytest.mark.parametrize("name", sorted(hostile()))
def test_hostile_files_are_decode_errors_naming_the_file(cpu, name):
    data = hostile()[name]
    with pytest.raises(DecodeError) as caught:
        cpu.decode(data, name)
    assert caught.value.path == name and name in str(caught.value)
    if name.startswith("huge"):
        assert "max_pixels" in str(caught.value)   # refused from the header, before any allocation


def test_damaged_files_never_raise_anything_but_decode_error(cpu):
    """Bytes flipped all over valid files of each format: a decode or a DecodeError, nothing else."""
    rng = np.random.default_rng(7)
    sources = [j2k(RGB, level=0, codecformat="jp2"), j2k(RGB, level=30, codecformat="j2k", reversible=False),
               tiff(RGB, photometric="rgb", compression="lzw"), tiff(RGB, photometric="rgb", tile=(16, 16)),
               b"P6\n64 48\n255\n" + RGB.tobytes()]
    for source in sources:
        for _ in range(12):
            data = bytearray(source)
            spots = rng.integers(0, min(len(data), 400), 6)   # the headers, where damage matters most
            for spot, value in zip(spots.tolist(), rng.integers(0, 256, len(spots)).tolist()):
                data[spot] = value
            try:
                out = cpu.decode(bytes(data), "damaged")
            except DecodeError:
                continue
            assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3


def test_without_imagecodecs_jpeg2k_names_the_extra_and_tiff_goes_to_pillow(cpu, monkeypatch):
    monkeypatch.setattr(codecs, "imagecodecs", None)
    with pytest.raises(DecodeError, match=r"a\.jp2: decoding JPEG 2000 needs imagecodecs: pip install 'ingest\[codecs\]'"):
        cpu.decode(j2k(RGB, level=0, codecformat="jp2"), "a.jp2")
    with pytest.raises(DecodeError, match="needs imagecodecs"):   # a region alone would not need it: the same rule
        cpu.decode(j2k(RGB, level=0, codecformat="jp2"), "a.jp2", region=(0, 0, 8, 8))
    np.testing.assert_array_equal(cpu.decode(tiff(RGB, photometric="rgb"), "a.tif"), RGB)
    from ingest.decode.cpu import _orient
    for orientation in (2, 6):   # Pillow turns TIFFs as it loads them: turned once, as with imagecodecs
        data = tiff(RGB, photometric="rgb", extratags=[(274, "H", 1, orientation, True)])
        np.testing.assert_array_equal(cpu.decode(data, "o.tif"), _orient(RGB, orientation))


# -- console --------------------------------------------------------------------------------------------------


def noisy_tiff() -> bytes:
    """A TIFF libtiff warns about (an ImageDescription without its terminating NUL, a zero StripByteCounts)."""
    data = bytearray(tiff(np.zeros((8, 8), np.uint8), description="hellohello", metadata=None))
    ifd = struct.unpack_from("<I", data, 4)[0]
    for k in range(struct.unpack_from("<H", data, ifd)[0]):
        at = ifd + 2 + 12 * k
        tag, _, count = struct.unpack_from("<HHI", data, at)
        if tag == 270:
            struct.pack_into("<I", data, at + 4, count - 1)
        elif tag == 279:
            struct.pack_into("<I", data, at + 8, 0)
    return bytes(data)


def test_libtiff_warnings_are_emitted_only_with_debug_logging(cpu, capfd, caplog):
    """By default libtiff says nothing (not on the console, not to logging); with the ``ingest`` logger at DEBUG
    its warnings are logged (imagecodecs sends them to the ``imagecodecs`` logger)."""
    cpu.decode(noisy_tiff(), "noisy.tif")
    assert capfd.readouterr() == ("", "") and not caplog.records
    logger = logging.getLogger("ingest")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        cpu.decode(noisy_tiff(), "noisy.tif")
    finally:
        logger.setLevel(level)
    assert any("ImageDescription" in record.getMessage() for record in caplog.records)


def test_what_nvimgcodec_prints_while_loading_is_kept_and_logged_at_debug(capfd, caplog):
    """`captured_stderr` (around nvImageCodec's instance and decoder creation) keeps native stderr lines off the
    console; they reach the ``ingest`` logger's DEBUG records, so only a user who asks sees them."""
    import os
    from ingest.decode import _nvimgcodec as native
    with caplog.at_level(logging.DEBUG, logger="ingest"):
        with native.captured_stderr() as lines:
            os.write(2, b"[nvjpeg2k_ext] Failed to load nvjpeg2k library!\n")
    assert lines == ["[nvjpeg2k_ext] Failed to load nvjpeg2k library!"]
    assert capfd.readouterr().err == ""
    assert [r.getMessage() for r in caplog.records if r.name == "ingest"] == \
        ["nvImageCodec: [nvjpeg2k_ext] Failed to load nvjpeg2k library!"]


# -- GPU planning (no GPU needed) -----------------------------------------------------------------------------


def test_codec_rows_route_only_what_nvjpeg2k_and_nvtiff_decode_like_the_cpu():
    datas = [encode(Image.fromarray(RGB), "JPEG"), j2k(RGB, level=0, codecformat="jp2"),
             j2k(RGB16, level=0, codecformat="j2k"), tiff(RGB, photometric="rgb", compression="lzw"),
             tiff(RGB, photometric="rgb", compression="zstd"), tiff(RGB16, photometric="rgb"),
             tiff(RGB, photometric="rgb", extratags=[(274, "H", 1, 6, True)]), encode(Image.fromarray(RGB), "PNG"),
             b"II*\x00garbage"]
    cut_j2k, cut_tiff = j2k(RGB, level=0, codecformat="j2k"), tiff(RGB, photometric="rgb", compression="lzw")
    datas += [cut_j2k[:-10], cut_tiff[:-10]]   # truncated: left to the CPU decoder, which refuses them
    kinds = [1, decode_gpu.KIND_JPEG2K, 0, decode_gpu.KIND_TIFF, 0, 0, decode_gpu.KIND_TIFF, 0, 0, 0, 0]
    table = decode_gpu.codec_rows(jpeg_headers(datas), datas)
    assert table[:, 0].tolist() == kinds
    assert table[1, 1:5].tolist() == [48, 64, 3, 8] and table[6, 6] == 6
    assert decode_gpu.gpu_decodable(table, 10 ** 6).tolist() == [k > 0 for k in kinds]
    with CpuDecoder(threads=1) as cpu:   # the read stage's probe makes the same rows, sizes oriented
        sizes, probed = cpu.probe_batch(datas, [f"{k}" for k in range(len(datas))])
    np.testing.assert_array_equal(probed, table)
    np.testing.assert_array_equal(decode_gpu.codec_rows(probed, datas), table)
    assert sizes[6] == (64, 48) and isinstance(sizes[8], DecodeError) and sizes[10] == (48, 64)   # cut: data only
    regions = np.tile(np.array([[4, 4, 20, 20]]), (len(datas), 1))
    clipped = decode_gpu.clip_regions(regions, table)
    assert clipped[1].tolist() == [4, 4, 20, 20] and clipped[3].tolist() == [0, 0, 0, 0]   # TIFF: whole


def write_tree(root, files: dict[str, bytes]) -> None:
    """An ImageFolder tree: ``files`` maps "class/name" to bytes."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_loader_reads_jpeg2k_tiff_and_pam_file_trees(tmp_path):
    """The file tree lists .jp2, .tif and .pam files and the Loader decodes them through its ops (CPU)."""
    import ingest
    from ingest.ops import Normalize, RandomResizedCrop
    pam = b"P7\nWIDTH 64\nHEIGHT 48\nDEPTH 3\nMAXVAL 255\nTUPLTYPE RGB\nENDHDR\n" + RGB.tobytes()
    write_tree(tmp_path, {"a/0.jp2": j2k(RGB, level=0, codecformat="jp2"), "a/1.j2k": j2k_tiled(RGB, 16, False),
                          "b/2.tif": tiff(RGB, photometric="rgb", compression="zstd"), "b/3.pam": pam})
    loader = ingest.Loader(tmp_path, batch_size=4, ops=[RandomResizedCrop(32), Normalize(128, 64)], num_threads=1)
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 32, 32) and sorted(labels.tolist()) == [0, 0, 1, 1]
    assert set(loader.stats()["decode_paths"]) == {"cpu"}   # no failure, no other path


def test_native_engine_leaves_mostly_jpeg2k_or_tiff_trees_to_the_python_stages(tmp_path):
    from ingest import native
    from ingest.formats import FileTree
    write_tree(tmp_path / "j2k", {f"c/{k}.jp2": j2k(RGB, level=0, codecformat="jp2") for k in range(5)}
               | {"c/9.jpg": encode(Image.fromarray(RGB), "JPEG")})
    write_tree(tmp_path / "jpeg", {f"c/{k}.jpg": encode(Image.fromarray(RGB), "JPEG") for k in range(5)}
               | {"c/9.tif": tiff(RGB, photometric="rgb")})
    assert native.mostly_other_codecs(FileTree(tmp_path / "j2k").native_table())
    assert not native.mostly_other_codecs(FileTree(tmp_path / "jpeg").native_table())


# -- nvImageCodec's native loop, on its CPU backend (no GPU) ---------------------------------------------------


@pytest.fixture(params=["compiled", "ctypes"])
def host_decoder(request, monkeypatch):
    """nvImageCodec's CPU backends into host memory (as tests/test_nvimgcodec_native.py), by each loop."""
    from ingest.decode import _nvimgcodec as native
    from test_nvimgcodec_native import LIBRARY
    if not (LIBRARY and LIBRARY.exists()):
        pytest.skip("nvImageCodec's library not found")
    if request.param == "compiled" and native.LOOP is None:
        pytest.skip("ingest.decode._nvloop is not built here")
    if request.param == "ctypes":
        monkeypatch.setattr(native, "LOOP", None)
    decoder = native.BatchDecoder(native.load(str(LIBRARY)), native.DEVICE_CPU_ONLY, backends=["CPU_ONLY"])
    yield decoder
    decoder.close()


def test_native_loop_routes_tiff_and_jpeg2k_code_streams(host_decoder):
    """TIFF and JPEG 2000 reach the batch decode (libtiff's CPU extension decodes the TIFF exactly; the JPEG 2000
    needs a backend this machine may lack, but is never refused as "not routed"); PNG still is."""
    from test_nvimgcodec_native import _decode
    datas = [tiff(RGB, photometric="rgb", compression="lzw"), j2k(RGB, level=0, codecformat="jp2"),
             encode(Image.fromarray(RGB), "PNG")]
    outs, reasons = _decode(host_decoder, datas, [RGB.shape[:2]] * 3)
    assert reasons[0] is None, reasons
    np.testing.assert_array_equal(outs[0], RGB)
    assert reasons[1] != "NOT_JPEG" and reasons[2] == "NOT_JPEG", reasons


# -- real files -----------------------------------------------------------------------------------------------


@pytest.mark.realworld
@pytest.mark.parametrize("sub", ["jpeg2000", "tiff", "pnm"])
def test_realworld_files_decode_or_refuse_with_decode_error(cpu, sub):
    """Every file of ../shared/data/realworld/<sub> (where present) decodes or gives a DecodeError; where a
    ``<name>.npy`` reference output sits beside it, the pixels equal it."""
    folder = REALWORLD / sub
    if not folder.is_dir():
        pytest.skip(f"no {folder}")
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix not in (".txt", ".npy")):
        try:
            pixels = cpu.decode(path.read_bytes(), str(path))
        except DecodeError:
            continue
        reference = path.with_suffix(path.suffix + ".npy")
        if reference.exists():
            np.testing.assert_array_equal(pixels, np.load(reference))


# -- GPU ------------------------------------------------------------------------------------------------------


def gpu_batch() -> dict[str, bytes]:
    big = textured(200, 264, seed=5)
    return {"lossless.jp2": j2k(big, level=0, codecformat="jp2"),
            "lossy.j2k": j2k_tiled(big, jp2=False),
            "deep.j2k": j2k(RGB16, level=0, codecformat="j2k"),
            "lzw.tif": tiff(big, photometric="rgb", compression="lzw", predictor=True),
            "gray_tiled.tif": tiff(big[:, :, 0], compression="lzw", tile=(64, 64)),
            "deflate.tif": tiff(big, photometric="rgb", compression="zlib"),
            "webp.tif": tiff(big, photometric="rgb", compression="webp", compressionargs={"lossless": True}),
            "a.jpg": encode(Image.fromarray(big), "JPEG", quality=90), "a.png": encode(Image.fromarray(big), "PNG")}


def has_nvcomp() -> bool:
    """Whether nvTIFF can find nvCOMP (its Deflate): the wheel installed, or the library on the loader's path."""
    import ctypes
    from importlib import metadata
    try:
        return bool(metadata.version("nvidia-libnvcomp-cu13"))
    except metadata.PackageNotFoundError:
        pass
    for name in ("libnvcomp.so.5", "libnvcomp.so.4", "libnvcomp.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("engine", ["native", "python"])
def test_gpu_decodes_jpeg2k_and_tiff_beside_jpeg_with_cpu_fallback(engine):
    """One batch: JPEG 2000 and TIFF on nvJPEG2000 and nvTIFF, the rest (16-bit JPEG 2000, WebP TIFF, PNG) on
    the CPU decoder; lossless ones equal the CPU decode exactly, lossy JPEG 2000 within a mean of 1 level."""
    batch = gpu_batch()
    names, datas = list(batch), list(batch.values())
    with CpuDecoder(threads=2) as cpu, defaults.set(host_jpeg2k_share=0):   # every eligible image on the GPU
        try:
            gpu = decode_gpu.GpuDecoder("cuda", cpu, engine=engine)
        except ImportError as err:
            pytest.skip(str(err))
        with gpu:
            images, origins, paths = gpu.decode_batch(datas, names)
            got = dict(zip(names, paths))
            assert got["lossless.jp2"] == got["lossy.j2k"] == got["lzw.tif"] == got["gray_tiled.tif"] == "gpu", \
                (got, dict(gpu.fallbacks), gpu.messages)
            assert got["deep.j2k"] == got["webp.tif"] == got["a.png"] == "cpu-fallback"
            assert got["deflate.tif"] == ("gpu" if has_nvcomp() else "cpu-fallback"), got   # nvTIFF's Deflate
            for name, image in zip(names, images):
                expected = torch.from_numpy(cpu.decode(batch[name], name))
                image = image.cpu()
                assert image.shape == expected.shape, name
                if name in ("lossy.j2k", "a.jpg"):
                    assert (image.float() - expected.float()).abs().mean() < 1.0, name
                else:
                    assert torch.equal(image, expected), name


def test_deflate_tiff_whose_last_strip_inflates_past_the_image_goes_to_the_cpu():
    """A Deflate TIFF whose short last strip holds more rows than are due (libtiff's
    deflate-last-strip-extra-data.tiff; made here by cutting ImageLength of a 512-row file to 500) is not
    GPU-eligible: nvTIFF decoded it wrong in a batch. The same file of 512 rows is, and so is an LZW one."""
    pixels = textured(512, 64)[:, :, 0]
    whole = tiff(pixels, compression="zlib", rowsperstrip=16)
    assert codecs.read_header(memoryview(whole), "tiff", "t").gpu
    cut = cut_image_length(whole, 500)
    header = codecs.read_header(memoryview(cut), "tiff", "t")
    assert header.height == 500 and not header.gpu
    with CpuDecoder(threads=1) as cpu:   # libtiff ignores the extra rows
        np.testing.assert_array_equal(cpu.decode(cut, "t")[:, :, 0], pixels[:500])
    assert codecs.read_header(memoryview(cut_image_length(tiff(pixels, compression="lzw", rowsperstrip=16), 500)),
                              "tiff", "t").gpu


def cut_image_length(data: bytes, height: int) -> bytes:
    """A little-endian classic TIFF with its first directory's ImageLength set to ``height``."""
    out = bytearray(data)
    (ifd,) = struct.unpack_from("<I", out, 4)
    (count,) = struct.unpack_from("<H", out, ifd)
    for pos in range(ifd + 2, ifd + 2 + 12 * count, 12):
        tag, kind, _ = struct.unpack_from("<HHI", out, pos)
        if tag == 257:
            struct.pack_into("<H" if kind == 3 else "<I", out, pos + 8, height)
            return bytes(out)
    raise AssertionError("no ImageLength")


def test_host_share_fixed_and_auto_counts():
    from ingest.decode.share import AIM, FIRST, MOST, HostShare
    fixed = HostShare(0.25)
    assert [fixed.count(n) for n in (0, 1, 8, 256)] == [0, 0, 2, 64]
    fixed.record(1.0, 5.0)   # a fixed share never moves
    assert fixed.count(256) == 64
    assert HostShare(0.0).count(256) == 0
    auto = HostShare("auto")
    assert auto.count(256) == round(FIRST * 256) and auto.count(1) == 0 and auto.count(2) == 1
    auto.record(AIM * 0.1, 0.4)   # the CPU side took a quarter of the time aimed at: its share doubles
    assert auto.share == pytest.approx(2 * FIRST)
    auto.record(AIM * 0.4, 0.1)   # then four times as long: halved
    assert auto.share == pytest.approx(FIRST)
    auto.record(AIM * 0.3, 0.3)   # on the aim: unchanged
    assert auto.share == pytest.approx(FIRST)
    for _ in range(40):
        auto.record(0.01, 1.0)
    assert auto.share == MOST and auto.count(256) == round(MOST * 256)
    auto.record(0.0, 1.0)   # nothing measured: unchanged
    assert auto.share == MOST


def test_host_share_pauses_while_one_image_outlasts_the_gpu_side():
    """Very large images: one image on the CPU takes longer than the GPU side's batch, so "auto" gives the CPU none
    for 1, then 2, 4, ... batches (at most `LONGEST_PAUSE`), one image between pauses, until one fits again."""
    from ingest.decode.share import LONGEST_PAUSE, HostShare
    auto, n = HostShare("auto"), 32

    def batches(cpu_one: float, count: int, gpu: float = 0.5) -> list[int]:
        taken = []
        for _ in range(count):
            k = auto.count(n)
            taken.append(k)
            if k:
                auto.record(cpu_one * k, gpu, k)
        return taken

    # the first share (4 images) is cut to the one-image floor, which outlasts the GPU side: pauses of 1, 2, 4, 8
    assert batches(2.0, 20) == [4, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    batches(2.0, 2000)
    assert auto._pause == LONGEST_PAUSE   # the pauses stop growing there
    while auto.count(n) == 0:             # to the end of the pause: the next batch probes with one image
        pass
    auto.record(0.1, 0.5, 1)              # it fits: no more pauses, and the share grows from the floor
    after = batches(0.1, 8)
    assert 0 not in after and after == sorted(after) and after[-1] > 1 and auto._pause == 0
    fixed = HostShare(0.25)               # a fixed share never pauses
    fixed.record(2.0, 0.5, 1)
    assert fixed.count(n) == 8


def test_host_share_settles_where_the_cpu_side_ends_at_its_aim():
    """A CPU side of 16 threads at 10 ms an image beside a GPU side at 1,000 images/s: "auto" settles where the
    CPU side takes `AIM` of the GPU side's time (within the rounding of its image count to whole rounds)."""
    from ingest.decode.share import AIM, HostShare
    auto, n = HostShare("auto"), 256
    for _ in range(30):
        k = auto.count(n)
        cpu = -(-k // 16) * 0.010   # whole rounds of 16 images at once
        auto.record(cpu, (n - k) / 1000)
    k = auto.count(n)
    # k / 16 * 0.010 = AIM * (n - k) / 1000  ->  k = AIM * n / (0.625 + AIM)
    assert abs(k - AIM * n / (0.625 + AIM)) <= 16, k


def test_cpu_decoder_submit_gives_the_image_or_its_error_and_when_it_ended(cpu):
    """`CpuDecoder.submit` (what the GPU decoder's CPU share runs): the decode on the pool, a DecodeError as a
    value, and the `time.perf_counter` at which it ended."""
    import time
    data = j2k(textured(40, 56), level=0, codecformat="jp2")
    before = time.perf_counter()
    image, ended = cpu.submit(data, "a.jp2").result()
    np.testing.assert_array_equal(image, cpu.decode(data, "a.jp2"))
    assert before < ended < time.perf_counter()
    error, _ = cpu.submit(data[:len(data) // 3], "cut.jp2").result()
    assert isinstance(error, DecodeError) and "cut.jp2" in str(error)
    if openjpeg.available():   # with a region: just that area, as `decode` gives it
        area, _ = cpu.submit(data, "a.jp2", (8, 4, 30, 20)).result()
        np.testing.assert_array_equal(area, cpu.decode(data, "a.jp2", region=(8, 4, 30, 20)))
        np.testing.assert_array_equal(area[4:20, 8:30], image[4:20, 8:30])
        assert not area[:4].any() and not area[20:].any()


def test_host_share_picks_the_smallest_regions_first():
    from ingest.decode.share import pick
    assert pick(2, np.array([0.3, 1.0, 0.5, 0.3])).tolist() == [0, 3]
    assert pick(3, np.array([1.0, 0.3, 1.0, 0.5])).tolist() == [0, 1, 3]
    assert pick(0, np.array([1.0])).tolist() == []


def test_host_jpeg2k_share_setting_is_checked():
    assert defaults.get("host_jpeg2k_share") == "auto"
    with defaults.set(host_jpeg2k_share=0.5):
        assert defaults.get("host_jpeg2k_share") == 0.5
    with pytest.raises(ConfigError, match="host_jpeg2k_share"):
        defaults.set(host_jpeg2k_share=2)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("engine", ["native", "python"])
def test_gpu_batch_shares_jpeg2k_with_the_cpu_decoder(engine):
    """``host_jpeg2k_share`` 0.5: half of a batch's GPU-eligible JPEG 2000 images (the smallest regions first)
    decode on the CPU beside the GPU ("cpu-share"), which is asked for just their regions (OpenJPEG's area
    decode), the others and the TIFFs on the GPU; each equals the CPU decode (lossless), cropped to its region
    where it has one; "auto" keeps both sides busy over a few batches with the same pixels."""
    sources = [textured(120 + 8 * k, 160, seed=k) for k in range(8)]
    datas = [j2k(im, level=0, codecformat="jp2") for im in sources] + \
        [tiff(im, photometric="rgb", compression="lzw") for im in sources[:4]]
    names = [f"{k}.jp2" for k in range(8)] + [f"{k}.tif" for k in range(4)]
    # JPEG 2000 regions: images 0-3 small crops, 4-7 none (whole); TIFFs are decoded whole whatever the region
    rois = [(10, 10, 40, 40)] * 4 + [None] * 4 + [(10, 10, 40, 40)] * 4
    with CpuDecoder(threads=4) as cpu:
        with defaults.set(host_jpeg2k_share=0.5):
            try:
                gpu = decode_gpu.GpuDecoder("cuda", cpu, engine=engine)
            except ImportError as err:
                pytest.skip(str(err))
        asked, decode = [], cpu.decode

        def noted(data, name, **hints):
            asked.append((name, hints["region"]))
            return decode(data, name, **hints)

        with gpu:
            with mock.patch.object(cpu, "decode", noted):
                images, origins, paths = gpu.decode_batch(datas, names, rois=rois)
            assert paths[:8] == ["cpu-share"] * 4 + ["gpu"] * 4, (paths, dict(gpu.fallbacks))
            assert paths[8:] == ["gpu"] * 4, paths
            assert sorted(asked) == sorted(zip(names[:4], rois[:4])), asked
            for name, data, image, origin, roi, path in zip(names, datas, images, origins, rois, paths):
                # a region where one was asked for, except a TIFF (decoded whole on the GPU)
                assert origin == (roi[:2] if roi is not None and path != "gpu" else (0, 0)), (name, origin)
                assert_decoded_as_cpu(cpu, name, data, image, origin)
        with defaults.set(host_jpeg2k_share="auto"):
            gpu = decode_gpu.GpuDecoder("cuda", cpu, engine=engine)
        with gpu:
            first = gpu.host_share.share
            for _ in range(3):
                images, origins, paths = gpu.decode_batch(datas, names, rois=rois)
                assert "cpu-share" in paths[:8] and any(p.startswith("gpu") for p in paths[:8]), paths
                for name, data, image, origin in zip(names, datas, images, origins):
                    assert_decoded_as_cpu(cpu, name, data, image, origin)
            assert gpu.host_share.share != first


def assert_decoded_as_cpu(cpu, name, data, image, origin):
    """``image`` (on the GPU) is the CPU decode's part from ``origin`` of its size, exactly."""
    (x0, y0), (h, w) = origin, image.shape[:2]
    assert torch.equal(image.cpu(), torch.from_numpy(cpu.decode(data, name)[y0:y0 + h, x0:x0 + w])), name


@pytest.mark.gpu
@requires_gpu
def test_gpu_jpeg2k_region_equals_the_crop_of_the_cpu_decode():
    batch = gpu_batch()
    datas, names = [batch["lossless.jp2"], batch["lzw.tif"]], ["lossless.jp2", "lzw.tif"]
    with CpuDecoder(threads=1) as cpu, defaults.set(host_jpeg2k_share=0), decode_gpu.GpuDecoder("cuda", cpu) as gpu:
        images, origins, paths = gpu.decode_batch(datas, names, rois=[(30, 20, 150, 140), (30, 20, 150, 140)])
        assert paths == ["gpu-roi", "gpu"] and origins == [(30, 20), (0, 0)], (paths, dict(gpu.fallbacks))
        full = cpu.decode(batch["lossless.jp2"], "lossless.jp2")
        assert torch.equal(images[0].cpu(), torch.from_numpy(full[20:140, 30:150]))
        assert images[1].shape == (200, 264, 3)


@pytest.mark.gpu
@requires_gpu
def test_gpu_decoder_start_and_damaged_files_print_nothing(tmp_path, monkeypatch):
    """nvImageCodec's extensions (nvjpeg2k, nvtiff) print while loading, and decoders may complain about damaged
    data: none of it reaches the console; the damaged files come back as DecodeErrors."""
    lossless = j2k(textured(200, 264), level=0, codecformat="jp2")
    lzw = tiff(textured(200, 264), photometric="rgb", compression="lzw")
    damaged = [lossless[:len(lossless) // 2] + bytes(len(lossless) - len(lossless) // 2 - 2) + b"\xff\xd9",
               lzw[:200] + bytes(range(256)) * 8 + lzw[200 + 2048:]]   # header and EOC kept, data broken
    for k, data in enumerate(damaged + [lossless, lzw]):
        (tmp_path / f"{k}.bin").write_bytes(data)
    monkeypatch.setenv("INGEST_HOST_JPEG2K_SHARE", "0")   # every eligible image on the GPU
    script = ("import ingest, json, torch, pathlib, sys\n"
              "from ingest.decode.cpu import CpuDecoder\n"
              "from ingest.decode.gpu import GpuDecoder\n"
              "datas = [pathlib.Path(sys.argv[1], f'{k}.bin').read_bytes() for k in range(4)]\n"
              "with CpuDecoder(threads=1) as cpu, GpuDecoder('cuda', cpu) as gpu:\n"
              "    images, _, paths = gpu.decode_batch(datas, [str(k) for k in range(4)])\n"
              "    torch.cuda.synchronize()\n"
              "    kinds = [type(im).__name__ for im in images]\n"
              "pathlib.Path(sys.argv[1], 'out.json').write_text(json.dumps([kinds, paths]))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == "", (done.stdout, done.stderr)
    kinds, paths = json.loads((tmp_path / "out.json").read_text())
    assert kinds[2:] == ["Tensor", "Tensor"] and paths[2:] == ["gpu", "gpu"], (kinds, paths)
    assert all(kind in ("Tensor", "DecodeError") for kind in kinds[:2]), kinds


@pytest.mark.gpu
@requires_gpu
def test_gpu_decoder_with_uint16_or_gray_output_decodes_on_the_cpu_and_uploads_those_samples():
    batch = gpu_batch()
    names = ["lossless.jp2", "deep.j2k", "a.jpg"]
    datas = [batch[name] for name in names]
    with CpuDecoder(threads=1, dtype=torch.uint16, channels=1) as cpu, decode_gpu.GpuDecoder("cuda", cpu) as gpu:
        images, _, paths = gpu.decode_batch(datas, names)
        assert paths == ["cpu-fallback"] * 3
        for name, image in zip(names, images):
            assert image.is_cuda and image.dtype == torch.uint16 and image.shape[2] == 1, name
            np.testing.assert_array_equal(image.cpu().numpy(), cpu.decode(batch[name], name))   # uint16: numpy


def test_jpeg2k_settings_reach_the_decoder_options_and_are_checked():
    assert "nvjpeg2k" not in decode_gpu.decoder_options()
    with defaults.set(jpeg2k_device_padding=16 << 20):
        options = decode_gpu.decoder_options().split()
        assert options[-1] == "nvjpeg2k_cuda_decoder:device_memory_padding=16777216"   # after the global ones
        assert ":host_memory_padding=8388608" in options
    assert defaults.variable("jpeg2k_device_padding") == "INGEST_JPEG2K_DEVICE_PADDING"
    with pytest.raises(ConfigError, match="jpeg2k_device_padding"):
        defaults.set(jpeg2k_device_padding=-1)
    with pytest.raises(ConfigError, match="Unknown setting"):
        defaults.variable("jpeg2k_decoders")


def test_bench_codecs_runs_each_setting_against_the_same_dali():
    """bench_codecs.py's ``--setting``: ingest's loader once per setting (the first one first, DALI after it,
    then the others), the JPEG 2000 sets' longer windows, each setting's ratio over the one DALI run and the
    best; a variable that is not one of ingest's settings is refused before anything runs."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_codecs
    args = bench_codecs.parse_args(["--sets", "j2k_lossy,tiff", "--only", "i,d", "--setting", "default=",
                                    "--setting", "wide=INGEST_JPEG2K_DEVICE_PADDING=16777216,INGEST_GPU_DECODE_THREADS=15"])
    assert args.settings == [("default", {}), ("wide", {"INGEST_JPEG2K_DEVICE_PADDING": "16777216",
                                                        "INGEST_GPU_DECODE_THREADS": "15"})]
    assert args.j2k_seconds == 8.0 and args.j2k_min_batches == 20 and args.child_budget >= 60 + 16
    assert bench_codecs.plan(args) == [("j2k_lossy", "i", "default"), ("j2k_lossy", "d", None),
                                       ("j2k_lossy", "i", "wide"), ("tiff", "i", "default"), ("tiff", "d", None),
                                       ("tiff", "i", "wide")]
    label = bench_codecs.variant_label
    assert label("j2k_lossy", "i", "default", "default") == "j2k_lossy/ingest_mixed"
    assert label("j2k_lossy", "i", "wide", "default") == "j2k_lossy/ingest_mixed@wide"
    assert label("j2k_lossy", "i", "base", "base") == "j2k_lossy/ingest_mixed@base"
    assert label("j2k_lossy", "f", "default", "default") == "j2k_lossy/decode_only"
    results = {"j2k_lossy/ingest_mixed": {"img_s": 1800.0, "setting": "default", "setting_env": {}},
               "j2k_lossy/dali_mixed": {"img_s": 1500.0},
               "j2k_lossy/ingest_mixed@wide": {"img_s": 2100.0, "setting": "wide", "setting_env": {"X": "1"}}}
    derived = bench_codecs.derive(results)
    assert derived["j2k_lossy_ingest_over_dali"] == 1.2   # the first setting is the headline
    assert derived["j2k_lossy_settings"]["wide"] == {"img_s": 2100.0, "over_dali": 1.4, "env": {"X": "1"}}
    assert derived["j2k_lossy_best_setting"]["setting"] == "wide"
    assert derived["targets"]["j2k_lossy_ingest_over_dali"]["met"] is True
    for bad in (["--setting", "x=INGEST_NO_SUCH_SETTING=1"], ["--setting", "x=PATH=/tmp"],
                ["--setting", "a=", "--setting", "a=INGEST_GPU_DECODERS=2"], ["--setting", "a/b="]):
        with pytest.raises(SystemExit):
            bench_codecs.parse_args(bad)
