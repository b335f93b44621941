"""Property tests: mutated JPEG 2000, TIFF and PNM files fed to the header readers the GPU decoder routes by
(`codecs.read_header`, `codecs.pnm_size`, the nvJPEG2000 route's `nvjpeg2k.screen` and `plan_region`) and to the
CPU decoder. Each may only give a valid result or a `DecodeError` naming the file: never another exception, a
hang, or a result that disagrees with the header it came from."""

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image

from ingest.decode import codecs
from ingest.decode import nvjpeg2k as nj
from ingest.decode.cpu import CpuDecoder
from ingest.errors import DecodeError
from conftest import textured
from test_fuzz_containers import mutated
from test_nvjpeg2k import parser  # noqa: F401 - the fixture: nvJPEG2000's parse, where the library loads

imagecodecs = pytest.importorskip("imagecodecs")
tifffile = pytest.importorskip("tifffile")

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PIXELS = textured(24, 40)
NAME = "fuzz.img"


def _pillow(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def _tiff(array: np.ndarray, **options) -> bytes:
    out = io.BytesIO()
    tifffile.imwrite(out, array, **options)
    return out.getvalue()


#: One file of each layout the readers walk: JP2 boxes, a tiled bare codestream, TIFF strips and tiles, PNM, PAM.
SEEDS = {
    "jp2": _pillow(Image.fromarray(PIXELS), "JPEG2000", num_resolutions=3),
    "j2k-tiled": _pillow(Image.fromarray(PIXELS), "JPEG2000", no_jp2=True, tile_size=(16, 16), num_resolutions=3,
                         irreversible=True),
    "tiff-lzw": _pillow(Image.fromarray(PIXELS), "TIFF", compression="tiff_lzw"),
    "tiff-tiled-deflate": _tiff(PIXELS, tile=(16, 16), compression="zlib"),
    "tiff-strips-deflate": _tiff(PIXELS, rowsperstrip=5, compression="zlib", predictor=True),
    "tiff-float": _tiff(PIXELS.astype(np.float32) / 255, photometric="rgb", compression="zlib", predictor=True),
    "tiff-16bit-lzw": _tiff(PIXELS.astype(np.uint16) * 257, compression="lzw"),
    "ppm": b"P6\n40 24\n255\n" + PIXELS.tobytes(),
    "pam": b"P7\nWIDTH 40\nHEIGHT 24\nDEPTH 3\nMAXVAL 255\nTUPLTYPE RGB\nENDHDR\n" + PIXELS.tobytes(),
}
IMAGE_SEEDS = st.sampled_from(sorted(SEEDS))


def broken(data: bytes):
    """``data`` mutated anywhere (`test_fuzz_containers.mutated`), or with up to 8 bytes changed among its first
    160, where the boxes, markers and tags the readers walk lie."""
    head = min(len(data), 160)
    early = st.lists(st.tuples(st.integers(0, head - 1), st.integers(0, 255)), min_size=1, max_size=8).map(
        lambda changes: bytes(_set(bytearray(data), changes)))
    return st.one_of(mutated(data), early)


def _set(out: bytearray, changes) -> bytearray:
    for pos, value in changes:
        out[pos] = value
    return out


@pytest.fixture(scope="module")
def cpu():
    with CpuDecoder(threads=1) as decoder:
        yield decoder


def _names_the_file(err: DecodeError) -> None:
    assert NAME in str(err), str(err)


@FUZZ
@given(st.data())
def test_headers_of_mutated_files(data):
    """`read_header` (JPEG 2000, TIFF) and `pnm_size` give a header of positive size or a DecodeError naming the
    file."""
    kind = data.draw(IMAGE_SEEDS)
    buf = memoryview(data.draw(broken(SEEDS[kind])))
    codec = "pnm" if kind in ("ppm", "pam") else "tiff" if kind.startswith("tiff") else "jpeg2k"
    try:
        if codec == "pnm":
            h, w = codecs.pnm_size(buf, NAME)
        else:
            header = codecs.read_header(buf, codec, NAME)
            h, w = header.height, header.width
    except DecodeError as err:
        _names_the_file(err)
        return
    assert h > 0 and w > 0


@FUZZ
@given(st.data())
def test_nvjpeg2k_screen_and_plan_of_mutated_codestreams(data):
    """The nvJPEG2000 route's header screen gives a SIZ, a reason to decline, or a DecodeError naming the file;
    a SIZ's region plan at any level lays its tiles inside the reduced image, without gaps or overlaps."""
    buf = memoryview(data.draw(broken(SEEDS[data.draw(st.sampled_from(["jp2", "j2k-tiled"]))])))
    step = data.draw(st.sampled_from([None, 1.0, 2.5, 4.0, 8.0, 64.0]))
    try:
        siz = nj.screen(buf, NAME, step, max_pixels=1 << 24)
    except DecodeError as err:
        _names_the_file(err)
        return
    if isinstance(siz, str):
        return
    w, h = siz.width - siz.x0, siz.height - siz.y0
    level = data.draw(st.integers(0, 6))
    x0, y0 = data.draw(st.integers(-5, w + 5)), data.draw(st.integers(-5, h + 5))
    roi = (x0, y0, x0 + data.draw(st.integers(0, w + 5)), y0 + data.draw(st.integers(0, h + 5)))
    region = nj.plan_region(siz, roi, level)
    assert region.tiles and region.width >= 0 and region.height >= 0   # a narrow tile may reduce to nothing
    area = 0
    for tile, x, y, tw, th in region.tiles:
        assert 0 <= tile < siz.tiles_x * siz.tiles_y
        assert 0 <= x and 0 <= y and x + tw <= region.width and y + th <= region.height and tw >= 0 and th >= 0
        area += tw * th
    assert area == region.width * region.height


@FUZZ
@given(st.data())
def test_nvjpeg2k_parse_of_mutated_codestreams(parser, data):
    """What the nvJPEG2000 route does on the host before a decode (the library's parse and queries, the plan):
    a region whose tiles nvJPEG2000 agrees on, a reason to decline, or a DecodeError naming the file."""
    buf = data.draw(broken(SEEDS[data.draw(st.sampled_from(["jp2", "j2k-tiled"]))]))
    step = data.draw(st.sampled_from([2.0, 4.0, 16.0]))
    try:
        found = nj.inspect(*parser, buf, NAME, None, step, 1 << 24)
    except DecodeError as err:
        _names_the_file(err)
        return
    if isinstance(found, str):
        return
    region, siz, resolutions = found
    assert region.width > 0 and region.height > 0 and set(resolutions) == {t[0] for t in region.tiles}
    assert 2 ** region.level <= step and region.level < min(resolutions.values())


@FUZZ
@given(st.data())
def test_cpu_decode_of_mutated_files(cpu, data):
    """The CPU decoder gives an RGB uint8 image or a DecodeError naming the file."""
    kind = data.draw(IMAGE_SEEDS)
    blob = data.draw(broken(SEEDS[kind]))
    try:
        image = cpu.decode(blob, NAME)
    except DecodeError as err:
        _names_the_file(err)
        return
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3 and min(image.shape[:2]) > 0


@FUZZ
@given(st.data())
def test_cpu_region_decode_of_mutated_jpeg2k(cpu, data):
    """A region of a mutated JPEG 2000 file (OpenJPEG's decode area where the header allows it, else the whole
    decode): an RGB uint8 image of the header's size, or a DecodeError naming the file."""
    blob = data.draw(broken(SEEDS[data.draw(st.sampled_from(["jp2", "j2k-tiled"]))]))
    x0, y0 = data.draw(st.integers(-3, 30)), data.draw(st.integers(-3, 20))
    region = (x0, y0, x0 + data.draw(st.integers(0, 45)), y0 + data.draw(st.integers(0, 30)))
    try:
        size = cpu.probe(blob, NAME)
        image = cpu.decode(blob, NAME, region=region)
    except DecodeError as err:
        _names_the_file(err)
        return
    assert image.dtype == np.uint8 and image.shape == (*size, 3)
