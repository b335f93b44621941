"""nvJPEG2000 called directly (`ingest.decode.nvjpeg2k`): reduced-grid geometry and the level choice on the CPU, the
library's parse where it loads (it parses without a GPU), and decodes at reduced levels against OpenJPEG (gpu).

References: OpenJPEG through Pillow, whose ``reduce`` decodes a resolution level (its size is set here by the
ceil formula of ISO/IEC 15444-1 B.5: Pillow rounds it otherwise), and through imagecodecs at full resolution.
Fixtures: imagecodecs writes untiled codestreams (8 and 16 bits), Pillow tiled ones and image offsets.
"""

from __future__ import annotations

import functools
import io
import os
import struct
import warnings

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

import ingest
from ingest import defaults
from ingest.decode import nvjpeg2k as nj
from ingest.decode.codecs import finish
from ingest.errors import ConfigError, DecodeError

imagecodecs = pytest.importorskip("imagecodecs")

#: A test-only override of where the library is (the wheel's copy unpacked somewhere, on a machine without it).
LIBRARY = os.environ.get("INGEST_TEST_NVJPEG2K_LIBRARY")
#: Largest difference allowed between nvJPEG2000 and OpenJPEG on irreversible (9/7) codestreams, in 8-bit levels:
#: both run the inverse wavelet in floating point and round once.
LOSSY_MAX = 2


def siz(width, height, x0=0, y0=0, tile=None, tile_origin=(0, 0)):
    tw, th = tile or (width, height)
    return nj.Siz(width, height, x0, y0, tw, th, *tile_origin, ((1, 1),), (8,), False)


# -- geometry (CPU) ---------------------------------------------------------------------------------------------

def test_ceil_shift_and_tile_span():
    assert [nj.ceil_shift(v, 1) for v in (0, 1, 2, 5, 6)] == [0, 1, 1, 3, 3]
    assert nj.ceil_shift(37, 2) == 10 and nj.ceil_shift(36, 2) == 9 and nj.ceil_shift(7, 0) == 7
    assert nj.tile_span(0, 16, 0, 16) == (0, 1)
    assert nj.tile_span(15, 17, 0, 16) == (0, 2)
    assert nj.tile_span(20, 40, 4, 16) == (1, 3)   # tiles from 4: [4, 20) [20, 36) [36, 52)


def test_untiled_image_at_each_level():
    s = siz(53, 37)
    whole = nj.plan_region(s, None, 0)
    assert (whole.height, whole.width, whole.origin, whole.scale) == (37, 53, (0.0, 0.0), 1.0)
    one = nj.plan_region(s, None, 1)
    assert (one.height, one.width, one.scale) == (19, 27, 0.5)
    assert one.origin == (-0.5, -0.5)   # reduced pixel 0 is source pixel 0: centres 0.5 <-> (0.5 + 0.5) * 0.5
    two = nj.plan_region(s, None, 2)
    assert (two.height, two.width, two.origin) == (10, 14, (-1.5, -1.5))
    assert one.tiles == [(0, 0, 0, 27, 19)]
    # a region of an untiled image is still its one tile
    assert nj.plan_region(s, (10, 5, 30, 33), 1).tiles == [(0, 0, 0, 27, 19)]


def test_image_offset_moves_the_reduced_grid():
    # image on the grid from (5, 3) to (66, 48): 61 x 45 pixels, tiles of 16 from (0, 0)
    s = siz(66, 48, 5, 3, tile=(16, 16))
    r = nj.plan_region(s, None, 1)
    assert (r.width, r.height) == (33 - 3, 24 - 2)   # ceil(66/2) - ceil(5/2), ceil(48/2) - ceil(3/2)
    # reduced column u = 3 lies on grid 6, image column 1: its centre 1.5 maps to the buffer's first centre 0.5;
    # reduced row v = 2 on grid 4, image row 1, likewise
    assert r.origin == (0.5, 0.5)
    assert (1.5 - r.origin[0]) * r.scale == 0.5 and (1.5 - r.origin[1]) * r.scale == 0.5
    # tiles: the first is clipped to the image (grid 5..16 -> reduced 3..8), widths 5, 8, 8, 8, 1
    assert [t[3] for t in r.tiles[:5]] == [5, 8, 8, 8, 1]
    assert [t[1] for t in r.tiles[:5]] == [0, 5, 13, 21, 29]
    assert len(r.tiles) == 5 * 3


def test_odd_tiles_abut_on_the_reduced_grid():
    s = siz(61, 45, tile=(15, 15))   # tile 1 spans grid 15..30: ceil(30/2) - ceil(15/2) = 7 at level 1
    r = nj.plan_region(s, None, 1)
    assert [t[3] for t in r.tiles[:5]] == [8, 7, 8, 7, 1]
    assert sum(t[3] for t in r.tiles[:5]) == r.width == 31
    # only the tiles a region touches, placed from the first one's corner
    part = nj.plan_region(s, (20, 20, 40, 40), 2)
    assert [t[0] for t in part.tiles] == [6, 7, 11, 12]   # 5 tiles a row; columns 1-2 (grid 15..45), rows 1-2
    assert part.tiles[0][1:3] == (0, 0)
    assert part.origin == (4 * (nj.ceil_shift(15, 2) - 0.5) + 0.5, 4 * (nj.ceil_shift(15, 2) - 0.5) + 0.5)


def test_region_is_clipped_and_empty_means_whole():
    s = siz(53, 37)
    assert nj.plan_region(s, (20, 20, 400, 400), 0) == nj.plan_region(s, (20, 20, 53, 37), 0)
    assert nj.plan_region(s, (10, 10, 10, 20), 1) == nj.plan_region(s, None, 1)


@pytest.mark.parametrize("step,cap,level", [(None, 5, 0), (1.0, 5, 0), (1.99, 5, 0), (2.0, 5, 1), (3.99, 5, 1),
                                            (4.0, 5, 2), (8.5, 5, 3), (100.0, 2, 2), (4.0, 0, 0),
                                            (float("inf"), 5, 0)])
def test_choose_level(step, cap, level):
    assert nj.choose_level(step, cap) == level


def test_choose_level_never_upscales_a_crop():
    # a 500 x 375 crop to 224: 375 / 224 < 2, so full resolution; a 1000 x 900 crop: level 2 (900/4 = 225 >= 224)
    assert nj.choose_level(nj.crop_step((375, 500), (224, 224)), 5) == 0
    assert nj.choose_level(nj.crop_step((900, 1000), (224, 224)), 5) == 2
    assert nj.choose_level(nj.crop_step((896, 1000), (224, 224)), 5) == 2
    assert nj.choose_level(nj.crop_step((895, 1000), (224, 224)), 5) == 1


def test_warp_steps():
    m = np.zeros((2, 3, 3))
    m[0] = [[3.0, 0, 5], [0, 2.0, 7], [0, 0, 1]]       # crop and resize: 3 and 2 source pixels per output pixel
    c, s = np.cos(0.3), np.sin(0.3)
    m[1] = [[4 * c, -4 * s, 0], [4 * s, 4 * c, 0], [0, 0, 1]]   # rotated, 4 source pixels per output pixel
    assert np.allclose(nj.warp_steps(m), [2.0, 4.0])


def test_warp_scaling_matches_openjpegs_reduced_samples():
    """A ramp decoded at level r by OpenJPEG: reduced pixel j holds the source pixel its origin and scale name."""
    h, w = 37, 53
    ramp = np.broadcast_to((np.arange(w) * 4 % 256).astype(np.uint8), (h, w)).copy()
    data = imagecodecs.jpeg2k_encode(ramp, level=0, reversible=True, resolutions=4, codecformat="J2K")
    for level in (1, 2):
        region = nj.plan_region(siz(w, h), None, level)
        reduced = reference(data, level)
        assert reduced.shape == (region.height, region.width)
        source = np.rint((np.arange(region.width) + 0.5) / region.scale + region.origin[0] - 0.5).astype(int)
        inner = source < w - (1 << level)   # away from the right edge's symmetric extension
        assert (reduced[0, inner] == ramp[0, source[inner]]).all()


# -- settings and loading (CPU) -----------------------------------------------------------------------------

def test_setting_defaults_to_auto_and_checks_its_value(monkeypatch):
    from ingest.decode import gpu
    assert defaults.get("jpeg2k_decoder") == "auto"
    monkeypatch.setattr(nj, "unavailable", lambda path=None: None)   # as where the library loads
    assert gpu._jpeg2k_level() == nj.AUTO_LEVEL
    for choice, level in (("nvjpeg2k", 1), ("nvimgcodec", 0), ("auto", nj.AUTO_LEVEL)):
        with defaults.set(jpeg2k_decoder=choice):
            assert defaults.get("jpeg2k_decoder") == choice and gpu._jpeg2k_level() == level
    with pytest.raises(ConfigError, match="jpeg2k_decoder"):
        defaults.set(jpeg2k_decoder="openjpeg")


def test_missing_library_is_unavailable_with_a_reason():
    why = nj.unavailable("/nonexistent/libnvjpeg2k.so.0")
    assert why is not None and "/nonexistent/libnvjpeg2k.so.0" in why
    with pytest.raises(nj.Unavailable):
        nj.load("/nonexistent/libnvjpeg2k.so.0")


def test_gpu_decoder_without_the_library_warns_and_leaves_jpeg2k_to_nvimgcodec(monkeypatch):
    from ingest.decode import gpu

    def missing(path=None):
        raise nj.Unavailable("cannot load libnvjpeg2k.so.0: not here")

    monkeypatch.setattr(nj, "load", missing)
    with defaults.set(jpeg2k_decoder="nvjpeg2k"), pytest.warns(RuntimeWarning, match="not here"):
        assert gpu._jpeg2k_level() == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gpu._jpeg2k_level() == 0   # the default ("auto"): not asked for by name, so no warning


def test_a_failure_says_why_in_a_word():
    """A failed call and an unreadable header raise Failed: a DecodeError naming the file, its `why` the word the
    decoder's fallback counts use."""
    with pytest.raises(nj.Failed) as err:
        nj._check(4, "DecodeTile", "scan.jp2")
    assert isinstance(err.value, DecodeError) and err.value.why == "JPEG_NOT_SUPPORTED"
    assert str(err.value) == "scan.jp2: nvJPEG2000 DecodeTile failed: JPEG_NOT_SUPPORTED"
    with pytest.raises(nj.Failed) as err:
        nj.screen(memoryview(b"\xff\x4f\xff\x51" + bytes(8)), "cut.j2k", None)
    assert err.value.why == "UNREADABLE_HEADER" and str(err.value).startswith("cut.j2k: unreadable JPEG 2000 header")


def test_read_siz():
    data = pillow_j2k(np.zeros((45, 61), np.uint8), offset=(5, 3), tile_size=(16, 16), num_resolutions=3)
    s = nj.read_siz(memoryview(data))
    assert (s.width, s.height, s.x0, s.y0, s.tile_width, s.tile_height) == (66, 48, 5, 3, 16, 16)
    assert (s.tiles_x, s.tiles_y, s.steps, s.precisions, s.signed) == (5, 3, ((1, 1),), (8,), False)
    with pytest.raises(ValueError):
        nj.read_siz(memoryview(b"\xff\x4f\xff\x51" + bytes(60)))


# -- the library's parse (CPU, where it loads) --------------------------------------------------------------

@pytest.fixture(scope="module")
def parser():
    """(library, handle, bitstream): nvJPEG2000 creates a handle and parses without a GPU."""
    import ctypes
    why = nj.unavailable(LIBRARY)
    if why:
        pytest.skip(why)
    lib = nj.load(LIBRARY)
    handle, bitstream = ctypes.c_void_p(), ctypes.c_void_p()
    if lib.nvjpeg2kCreateSimple(ctypes.byref(handle)) != 0:
        pytest.skip("nvjpeg2kCreateSimple failed here")
    assert lib.nvjpeg2kStreamCreate(ctypes.byref(bitstream)) == 0
    yield lib, handle.value, bitstream.value
    lib.nvjpeg2kStreamDestroy(bitstream.value)
    lib.nvjpeg2kDestroy(handle.value)


@pytest.mark.parametrize("shape,tile", [((37, 53), None), ((40, 50), (16, 16)), ((45, 61), (15, 15)),
                                        ((45, 61), (15, 17))])
def test_library_tile_sizes_match_the_reduced_grid(parser, shape, tile):
    """nvJPEG2000's own tile sizes at each level are the plan's (else `inspect` declines TILE_SIZE_MISMATCH), and the
    plan's whole-image size is OpenJPEG's reduced image."""
    pixels = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    data = pillow_j2k(pixels, num_resolutions=3, **({"tile_size": tile} if tile else {}))
    for level in (0, 1, 2):
        found = nj.inspect(*parser, data, "t.j2k", None, float(1 << level))
        assert not isinstance(found, str), found
        region, _, resolutions = found
        assert region.level == level and set(resolutions.values()) == {3}
        assert (region.height, region.width) == reference(data, level).shape[:2]


def test_library_caps_the_level_at_the_codestreams_levels(parser):
    data = pillow_j2k(np.zeros((64, 64), np.uint8), num_resolutions=2)   # one decomposition level
    region, _, _ = nj.inspect(*parser, data, "t.j2k", None, 16.0)
    assert region.level == 1


def test_library_declines_below_the_asked_level(parser):
    """``min_level`` (the GPU decoder asks 1): a crop no level applies to is left to nvImageCodec."""
    data = pillow_j2k(np.zeros((64, 64), np.uint8), num_resolutions=3)
    assert nj.inspect(*parser, data, "t.j2k", None, 1.5, None, 1) == "FULL_RESOLUTION"
    assert nj.inspect(*parser, data, "t.j2k", None, None, None, 1) == "FULL_RESOLUTION"
    region, _, _ = nj.inspect(*parser, data, "t.j2k", None, 2.0, None, 1)
    assert region.level == 1


def test_a_step_no_level_could_take_is_declined_before_the_library_parses():
    """Crops no level applies to are most of a training batch: their headers are read, the library not called."""
    data = pillow_j2k(np.zeros((64, 64), np.uint8), num_resolutions=3)
    assert nj.inspect(None, None, None, data, "t.j2k", None, 1.9, None, 1) == "FULL_RESOLUTION"
    with pytest.raises(AttributeError):   # a level could apply: the library is asked
        nj.inspect(None, None, None, data, "t.j2k", None, 2.0, None, 1)


@pytest.mark.parametrize("make,why", [
    (lambda: pillow_j2k(np.zeros((45, 61), np.uint8), offset=(5, 3), tile_size=(16, 16)), "OFFSET"),
    (lambda: imagecodecs.jpeg2k_encode(np.zeros((16, 16, 4), np.uint8), level=0, codecformat="J2K"), "COMPONENTS"),
    (lambda: imagecodecs.jpeg2k_encode(np.zeros((16, 16), np.uint8), level=0, codecformat="J2K")[:-2],
     "INCOMPLETE"),
])
def test_library_declines(parser, make, why):
    assert nj.inspect(*parser, make(), "t.j2k", None, None) == why


def test_a_tile_with_no_sample_at_the_level_is_declined(parser):
    """A 30 px image in 24 px tiles, 4 levels down: the second column and row of tiles (6 px, starting at 24, not a
    multiple of 16) reduce to no sample. A region touching them is left to nvImageCodec; one inside the first tile
    is decoded at that level."""
    data = pillow_j2k(np.zeros((30, 30), np.uint8), tile_size=(24, 24), num_resolutions=5)
    empty = [t for t in nj.plan_region(nj.read_siz(memoryview(data)), None, 4).tiles if 0 in t[3:]]
    assert [t[0] for t in empty] == [1, 2, 3]
    assert nj.inspect(*parser, data, "t.j2k", None, 16.0) == "EMPTY_TILE"
    region, _, _ = nj.inspect(*parser, data, "t.j2k", (0, 0, 20, 20), 16.0)
    assert region.level == 4 and [t[0] for t in region.tiles] == [0] and (region.height, region.width) == (2, 2)


def test_library_refusal_is_a_decode_error_naming_the_file_and_call(parser):
    data = bytearray(imagecodecs.jpeg2k_encode(np.zeros((32, 32), np.uint8), level=0, codecformat="J2K"))
    cod = bytes(data).find(b"\xff\x52")   # COD: its length and contents garbled
    data[cod + 2:cod + 14] = b"\xff" * 12
    with pytest.raises(DecodeError, match=r"bad\.j2k.*nvJPEG2000 StreamParse") as info:
        nj.inspect(*parser, bytes(data), "bad.j2k", None, None)
    assert info.value.path == "bad.j2k"
    with pytest.raises(DecodeError, match="bad.j2k"):
        nj.inspect(*parser, b"\xff\x4f\xff\x51\x00", "bad.j2k", None, None)


def test_library_on_hostile_files_declines_or_raises_naming_the_file(parser):
    from test_codecs import hostile
    for name, data in hostile().items():
        if not name.endswith((".j2k", ".jp2")):
            continue
        try:
            found = nj.inspect(*parser, data, name, None, 4.0, 1 << 26)
        except DecodeError as err:
            assert name in str(err)
            continue
        assert isinstance(found, str), name   # declined: the CPU decoder then names the problem


# -- decoding (GPU) ---------------------------------------------------------------------------------------------



@pytest.fixture(scope="module")
def decoder():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    why = nj.unavailable(LIBRARY)
    if why:
        pytest.skip(why)
    d = nj.Decoder(torch.device("cuda", 0), lib=nj.load(LIBRARY))
    yield d
    d.close()


@functools.cache
def fixtures() -> dict[str, tuple[bytes, bool]]:
    """name: (data, lossless), made once."""
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:150, 0:200]
    smooth = np.stack([x, y, (x + y) // 2], -1).astype(np.uint8) + rng.integers(0, 8, (150, 200, 3), dtype=np.uint8)
    gray16 = (x * 300 + y * 40).astype(np.uint16)
    ic = dict(codecformat="J2K", resolutions=4)
    return {
        "rgb-lossless": (imagecodecs.jpeg2k_encode(smooth, level=0, reversible=True, **ic), True),
        "gray-lossless": (imagecodecs.jpeg2k_encode(smooth[..., 0], level=0, reversible=True, **ic), True),
        "gray16-lossless": (imagecodecs.jpeg2k_encode(gray16, level=0, reversible=True, **ic), True),
        "rgb-lossy": (imagecodecs.jpeg2k_encode(smooth, level=40, reversible=False, **ic), False),
        "rgb-tiled-lossless": (pillow_j2k(smooth, tile_size=(64, 64), num_resolutions=4), True),
        "gray-tiled-lossless": (pillow_j2k(smooth[..., 1], tile_size=(48, 40), num_resolutions=3), True),
        "rgb-tiled-lossy": (pillow_j2k(smooth, tile_size=(64, 64), num_resolutions=4, irreversible=True,
                                       quality_mode="rates", quality_layers=[8]), False),
        "jp2-rgb-tiled-lossless": (pillow_j2k(smooth, tile_size=(64, 64), num_resolutions=4, no_jp2=False), True),
    }



@pytest.mark.gpu
@pytest.mark.parametrize("name", ["rgb-lossless", "gray-lossless", "gray16-lossless", "rgb-lossy",
                                  "rgb-tiled-lossless", "gray-tiled-lossless", "rgb-tiled-lossy",
                                  "jp2-rgb-tiled-lossless"])
@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("roi", [None, (70, 30, 150, 120)])
def test_decode_matches_openjpeg_at_each_level(decoder, name, level, roi):
    data, lossless = fixtures()[name]
    stream = torch.cuda.Stream()
    done = decoder.decode(data, name, roi, float(1 << level), stream)
    assert done is not None, dict(decoder.declined)
    stream.synchronize()
    assert done.level == level and done.scale == 2.0 ** -level
    got = done.image.cpu().numpy()
    ref = finish(reference(data, level), 16 if "16" in name else 8, "uint8", 3)
    # the decoded window: its corner's reduced sample from the origin (module doc, Geometry; no image offset)
    x0 = round((done.origin[0] - 0.5) / 2 ** level + 0.5)
    y0 = round((done.origin[1] - 0.5) / 2 ** level + 0.5)
    want = ref[y0:y0 + got.shape[0], x0:x0 + got.shape[1]]
    assert got.shape == want.shape and got.dtype == np.uint8
    if roi is not None:   # the window holds the region, reduced
        assert x0 <= roi[0] >> level and y0 <= roi[1] >> level
        assert x0 + got.shape[1] >= -(-roi[2] >> level) and y0 + got.shape[0] >= -(-roi[3] >> level)
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() == 0 if lossless else diff.max() <= LOSSY_MAX, (name, level, diff.max())


@pytest.mark.gpu
def test_decode_refusal_names_the_file(decoder):
    data = bytearray(fixtures()["rgb-lossless"][0])
    cod = bytes(data).find(b"\xff\x52")
    data[cod + 2:cod + 14] = b"\xff" * 12
    with pytest.raises(DecodeError, match="broken.j2k"):
        decoder.decode(bytes(data), "broken.j2k", None, None, torch.cuda.current_stream())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_decoder_routes_jpeg2k_and_truncated_fails_naming_the_file():
    from ingest.decode.cpu import CpuDecoder
    from ingest.decode.gpu import GpuDecoder
    if nj.unavailable():
        pytest.skip(nj.unavailable())
    data = fixtures()["rgb-tiled-lossless"][0]   # 150 x 200
    cut = data[:len(data) // 2]
    with defaults.set(jpeg2k_decoder="nvjpeg2k"), CpuDecoder(threads=1) as cpu, GpuDecoder("cuda", cpu) as g:
        assert g.jpeg2k_level == 1 and g.jpeg2k is None   # made at the first image it takes
        images, origins, scales, paths = g.decode_batch_reduced(
            [data, data, data, cut], ["a.j2k", "b.j2k", "c.j2k", "cut.j2k"],
            rois=[(70, 30, 150, 120), None, None, None], warps=scalings([2.0, 4.0, 1.5, 2.0]))
        assert g.jpeg2k is not None
        assert paths[:2] == ["gpu-nvjpeg2k", "gpu-nvjpeg2k"] and scales[:3] == [0.5, 0.25, 1.0]
        assert tuple(images[1].shape) == (38, 50, 3)   # ceil(150 / 4) x ceil(200 / 4)
        # no level applies: nvImageCodec's, passed over without a fallback counted
        assert paths[2] in ("gpu", "gpu-roi") and "nvjpeg2k: FULL_RESOLUTION" not in g.fallbacks
        assert origins[2] == (0, 0) and tuple(images[2].shape) == (150, 200, 3)
        assert isinstance(images[3], DecodeError) and "cut.j2k" in str(images[3])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_loader_with_nvjpeg2k_matches_nvimgcodec(tmp_path):
    """Same seed, same crops: reduced-resolution decodes resampled to the output agree with full-resolution ones
    within the difference of a box-filtered pyramid level and the warp's antialiasing."""
    from ingest.ops import RandomResizedCrop
    if nj.unavailable():
        pytest.skip(nj.unavailable())
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:600, 0:800]   # every RandomResizedCrop(64) of these is downscaled 2x or more: a level applies
    for k in range(12):
        folder = tmp_path / "train" / ("a" if k % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        # smooth content (no wrapping gradients, whose hard edges a box-filtered level and the warp's
        # antialiasing place differently) with a little noise
        waves = [np.sin((x + 9 * k) / 37.0), np.cos(y / 23.0), np.sin((x + y) / 51.0)]
        pixels = np.stack([100 + 60 * w for w in waves], -1) + rng.integers(0, 16, (600, 800, 3))
        pixels = pixels.astype(np.uint8)
        (folder / f"{k}.j2k").write_bytes(pillow_j2k(pixels, tile_size=(128, 128), num_resolutions=5))
    kw = dict(batch_size=6, device="cuda", ops=[RandomResizedCrop(64)], shuffle=True, seed=11, num_workers=0)
    with defaults.set(jpeg2k_decoder="nvimgcodec"):
        off = [x.cpu().float() for x, _ in ingest.Loader(tmp_path / "train", **kw)]
    with defaults.set(jpeg2k_decoder="nvjpeg2k"):
        loader = ingest.Loader(tmp_path / "train", **kw)
        on = [x.cpu().float() for x, _ in loader]
        paths = loader.stats()["decode_paths"]
    assert paths.get("gpu-nvjpeg2k", 0) == 12, paths
    for a, b in zip(off, on):
        assert a.shape == b.shape
        assert (a - b).abs().mean() < 3.0 and (a - b).abs().max() < 48


@pytest.mark.parametrize("level", [1, 2])
def test_the_images_it_takes_are_picked_from_their_headers_before_any_decode(level):
    """`GpuDecoder._start_jpeg2k` (no GPU needed: the decoder's threads stand in): of a batch, only the JPEG 2000
    images whose header it accepts and whose crop allows the decoder's `jpeg2k_level` are queued, each with its
    region and step; JPEGs are not looked at, and the others are counted by why and left to nvImageCodec."""
    from collections import Counter
    from concurrent.futures import Future
    from types import SimpleNamespace
    from ingest.decode.gpu import GpuDecoder
    pixels = np.zeros((64, 64), np.uint8)
    taken = pillow_j2k(pixels, num_resolutions=3)
    placed = pillow_j2k(pixels, num_resolutions=3, offset=(4, 4), tile_size=(32, 32))
    datas = [b"\xff\xd8 a JPEG", taken, taken, placed, b"not an image"]
    table = np.zeros((len(datas), 8), np.int64)
    table[0, 0] = 1                               # the JPEG's row
    wanted = np.array([[0, 0, 0, 0], [8, 4, 40, 36], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    steps = np.array([4.0, 2.5, 1.5, 4.0, 4.0])   # image 2: no level applies
    queued = []

    def submit(fn, *args):
        queued.append(args)
        done = Future()
        done.set_result(None)
        return done

    g = GpuDecoder.__new__(GpuDecoder)
    g.fallbacks, g.cpu = Counter(), SimpleNamespace(max_pixels=None)
    g._jpeg2k_threads, g.jpeg2k, g.jpeg2k_level = SimpleNamespace(submit=submit), object(), level
    pending = g._start_jpeg2k(datas, [f"{k}.j2k" for k in range(5)], wanted, steps, table, "stream")
    # image 2 (and at level 2 image 1: 2.5 source pixels per output pixel allow one level, not two) is passed
    # over without reading its header, so it counts as no fallback; image 3's header sends it elsewhere
    assert g.fallbacks == Counter({"nvjpeg2k: OFFSET": 1})
    if level == 2:
        assert pending == {} and queued == []
        return
    assert list(pending) == [1]
    (buf, name, roi, step, stream), = queued
    assert bytes(buf) == taken and name == "1.j2k" and roi == (8, 4, 40, 36) and step == 2.5 and stream == "stream"


def test_a_decoder_that_cannot_start_turns_the_route_off(monkeypatch):
    """nvJPEG2000 is made at the first image it would take; where it cannot start, that batch's images and every
    later one go the nvImageCodec way, with a warning only where the setting named nvjpeg2k."""
    from collections import Counter
    from types import SimpleNamespace
    from ingest.decode.gpu import GpuDecoder

    def refuse(*args, **kwargs):
        raise nj.Unavailable("nvjpeg2kCreateSimple failed: NOT_INITIALIZED")

    monkeypatch.setattr(nj, "Decoder", refuse)
    data = pillow_j2k(np.zeros((64, 64), np.uint8), num_resolutions=3)
    table = np.zeros((2, 8), np.int64)
    for choice in ("auto", "nvjpeg2k"):
        g = GpuDecoder.__new__(GpuDecoder)
        g.fallbacks, g.cpu, g.device = Counter(), SimpleNamespace(max_pixels=None), "cuda:0"
        g.jpeg2k, g._jpeg2k_threads, g.jpeg2k_level = None, None, 1
        with defaults.set(jpeg2k_decoder=choice), warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            pending = g._start_jpeg2k([data, data], ["a.j2k", "b.j2k"], np.zeros((2, 4), np.int64),
                                      np.array([4.0, 4.0]), table, "stream")
        assert pending == {} and g.jpeg2k is None and g.jpeg2k_level == 0
        assert [str(w.message) for w in seen if "NOT_INITIALIZED" in str(w.message)] != [] or choice == "auto"
        assert choice == "nvjpeg2k" or not seen


# -- helpers ----------------------------------------------------------------------------------------------------

def scalings(steps: list[float]) -> np.ndarray:
    """Output-to-source warps ((N, 3, 3)) that take ``steps[i]`` source pixels per output pixel on both axes."""
    out = np.tile(np.eye(3), (len(steps), 1, 1))
    out[:, 0, 0] = out[:, 1, 1] = steps
    return out


def pillow_j2k(pixels: np.ndarray, **options) -> bytes:
    """A lossless J2K codestream written by Pillow (OpenJPEG): tiles, offsets and levels as ``options`` say."""
    options = {"irreversible": False, "no_jp2": True, **options}
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG2000", **options)
    return out.getvalue()


def reference(data: bytes, level: int) -> np.ndarray:
    """OpenJPEG's decode at reduction ``level`` (Pillow's ``reduce``, its size set by the ceil formula)."""
    image = Image.open(io.BytesIO(data))
    if level:
        start = data.find(b"\xff\x4f\xff\x51")
        xs, ys, xo, yo = struct.unpack_from(">4I", data, start + 8)
        w = nj.ceil_shift(xs, level) - nj.ceil_shift(xo, level)
        h = nj.ceil_shift(ys, level) - nj.ceil_shift(yo, level)
        t = image.tile[0]
        image.tile = [ImageFile._Tile(t[0], (0, 0, w, h), t[2], (t[3][0], level, 0, t[3][3], t[3][4]))]
        image._size = (w, h)
        ImageFile.ImageFile.load(image)
    return np.asarray(image)
