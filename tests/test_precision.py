"""Precision and channels on request: ``Loader(decode_dtype=torch.uint16, channels=1|3|4)`` through the ops.

Each loader batch is checked against numpy on the source arrays: exactly where no value is computed (no ops, a
crop, a flip), within one level of 65535 where a resize is (against `ingest.ops.resample.reference`, the warp's
torch implementation, and against torch's float resize), and Normalize's float output to float32 precision. The
default (8-bit RGB) is checked beside it; ops that cannot take the pixels asked for are ConfigErrors at
construction. The ``gpu`` tests run the same on a CUDA device (decode on the CPU, ops on the GPU).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from conftest import encode, textured
from ingest import defaults, native
from ingest.engine import Pipeline
from ingest.errors import ConfigError
from ingest.formats.memory import MemorySource
from ingest.ops import (CenterCrop, ColorJitter, GaussianBlur, HorizontalFlip, Normalize, RandomGrayscale,
                        MixUp, RandomResizedCrop, Resize, VerticalFlip)
from ingest.ops import planner, resample
from ingest.sampler import Sampler
from ingest.torch import Loader

imagecodecs = pytest.importorskip("imagecodecs")
tifffile = pytest.importorskip("tifffile")

H, W = 24, 32
RGB16 = (textured(H, W).astype(np.uint16) * 257) ^ np.arange(W, dtype=np.uint16)[None, :, None]   # low bits vary
GRAY16 = RGB16[:, :, 1].copy()
RGBA8 = np.concatenate([textured(H, W, seed=1), np.arange(H * W, dtype=np.uint8).reshape(H, W, 1)], axis=2)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def png16(array: np.ndarray) -> bytes:
    return bytes(imagecodecs.png_encode(array))


def tiff(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    tifffile.imwrite(buf, array, photometric="rgb" if array.ndim == 3 else "minisblack")
    return buf.getvalue()


def first_batch(images: list[bytes], **kw) -> torch.Tensor:
    with Loader(images, batch_size=len(images), **kw) as loader:
        x, _ = next(iter(loader))
    return x


def hwc(x: torch.Tensor) -> np.ndarray:
    """One ``[C, H, W]`` sample as an ``[H, W, C]`` numpy array on the host."""
    return x.permute(1, 2, 0).cpu().numpy()


# -- defaults and plain 16-bit decode -------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
@pytest.mark.parametrize("writer", [png16, tiff])
def test_uint16_kept_without_ops(writer, device):
    x = first_batch([writer(RGB16), writer(RGB16[::-1].copy())], decode_dtype=torch.uint16, device=device)
    assert x.dtype == torch.uint16 and tuple(x.shape) == (2, 3, H, W) and x.device.type == device
    np.testing.assert_array_equal(hwc(x[0]), RGB16)
    np.testing.assert_array_equal(hwc(x[1]), RGB16[::-1])


def test_default_is_rgb8_high_bits():
    x = first_batch([png16(RGB16), tiff(GRAY16)])
    assert x.dtype == torch.uint8 and tuple(x.shape) == (2, 3, H, W)
    np.testing.assert_array_equal(hwc(x[0]), RGB16 >> 8)
    np.testing.assert_array_equal(hwc(x[1]), np.repeat((GRAY16 >> 8)[:, :, None], 3, axis=2))


def test_uint16_of_an_8bit_file_keeps_its_values():
    rgb = textured(H, W)
    x = first_batch([encode(Image.fromarray(rgb), "PNG")], decode_dtype="uint16")
    assert x.dtype == torch.uint16
    np.testing.assert_array_equal(hwc(x[0]), rgb)


# -- through the ops --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
def test_uint16_crop_and_flip_exact(device):
    ops = [CenterCrop((16, 20)), HorizontalFlip(1.0), VerticalFlip(1.0)]
    x = first_batch([tiff(RGB16)], decode_dtype=torch.uint16, ops=ops, device=device)
    assert x.dtype == torch.uint16 and tuple(x.shape) == (1, 3, 16, 20)
    np.testing.assert_array_equal(hwc(x[0]), RGB16[4:20, 6:26][::-1, ::-1])


def test_uint16_center_crop_pads_with_fill_in_16bit_levels():
    x = first_batch([tiff(RGB16)], decode_dtype=torch.uint16, ops=[CenterCrop((H + 4, W), fill=255)])
    out = hwc(x[0])
    assert (out[:2] == 65535).all() and (out[-2:] == 65535).all()
    np.testing.assert_array_equal(out[2:-2], RGB16)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest"])
def test_uint16_resize_within_one_level(interpolation, device):
    size = (16, 64)   # down along y, up along x; no output centre maps onto a pixel edge (a nearest tie)
    x = first_batch([png16(RGB16)], decode_dtype=torch.uint16, device=device,
                    ops=[Resize(size, interpolation=interpolation)])
    assert x.dtype == torch.uint16 and tuple(x.shape) == (1, 3, *size)
    got = hwc(x[0]).astype(np.int64)
    image = torch.from_numpy(RGB16)
    warp = planner.plan([Resize(size, interpolation=interpolation)], [(H, W)]).warp
    ref = resample.reference([image], warp)[0]
    assert ref.dtype == torch.uint16
    assert np.abs(got - ref.numpy().astype(np.int64)).max() <= 1
    # and torch's own float resize (the eager op's arithmetic), rounded
    src = torch.from_numpy(RGB16.astype(np.float64)).permute(2, 0, 1)[None]
    mode = "nearest-exact" if interpolation == "nearest" else interpolation
    kw = {} if interpolation == "nearest" else {"antialias": True, "align_corners": False}
    want = F.interpolate(src, size=size, mode=mode, **kw)[0].permute(1, 2, 0).round().clamp(0, 65535).numpy()
    assert np.abs(got - want).max() <= 1


def test_uint16_random_resized_crop_within_one_level_of_the_reference():
    """The pipeline's crops (CPU eager op: torch's float resize) against the warp's torch implementation on the
    same drawn plan, on the source arrays."""
    arrays = [RGB16, RGB16[::-1, ::-1].copy(), RGB16[:, ::-1].copy()]
    pipe = Pipeline(MemorySource([tiff(a) for a in arrays], labels=[0, 1, 2]), num_threads=1, decode_dtype="uint16",
                    ops=[RandomResizedCrop((12, 20), scale=(0.2, 0.7)), HorizontalFlip()])
    try:
        bp = next(Sampler(3, 3, shuffle=True, seed=4).batches(epoch=0))
        work = pipe.read(bp)
        plan = work.ops_plan
        batch = pipe.transform(pipe.decode(work))
    finally:
        pipe.close()
    assert batch.images.dtype == torch.uint16 and tuple(batch.images.shape) == (3, 3, 12, 20)
    ref = resample.reference([torch.from_numpy(arrays[i]) for i in batch.indices.tolist()], plan.warp)
    diff = (batch.images.permute(0, 2, 3, 1).to(torch.int64) - ref.to(torch.int64)).abs()
    assert ref.dtype == torch.uint16 and int(diff.max()) <= 1


def test_uint16_random_resized_crop_follows_the_8bit_draws():
    """The same seed draws the same crops whatever the dtype: 16-bit output / 257 is the 8-bit output within
    a level, on an image whose 16-bit samples are its 8-bit ones times 257."""
    rgb = textured(H, W)
    ops = [RandomResizedCrop(12, scale=(0.2, 0.6)), HorizontalFlip()]
    images = [tiff(rgb.astype(np.uint16) * 257) for _ in range(4)]
    x16 = first_batch(images, decode_dtype=torch.uint16, ops=ops, seed=3)
    x8 = first_batch(images, ops=ops, seed=3)
    assert x16.dtype == torch.uint16 and tuple(x16.shape) == (4, 3, 12, 12)
    diff = (x16.to(torch.float64) / 257 - x8.to(torch.float64)).abs()
    assert diff.max() <= 1.0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
def test_uint16_normalize_scales_by_65535(device):
    mean, std = (120.0, 115.0, 100.0), (60.0, 58.0, 57.0)
    x = first_batch([png16(RGB16)], decode_dtype=torch.uint16, device=device,
                    ops=[HorizontalFlip(1.0), Normalize(mean, std)])
    assert x.dtype == torch.float32 and tuple(x.shape) == (1, 3, H, W)
    want = (RGB16[:, ::-1].astype(np.float64) / 65535 * 255 - np.array(mean)) / np.array(std)
    np.testing.assert_allclose(hwc(x[0]), want, rtol=0, atol=1e-4)


# -- channels -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
def test_gray_channels_1_through_ops(device):
    gray = textured(H, W)[:, :, 0]
    data = encode(Image.fromarray(gray, "L"), "PNG")
    x = first_batch([data], channels=1, device=device, ops=[CenterCrop((20, 24)), HorizontalFlip(1.0)])
    assert x.dtype == torch.uint8 and tuple(x.shape) == (1, 1, 20, 24)
    np.testing.assert_array_equal(x[0, 0].cpu().numpy(), gray[2:22, 4:28][:, ::-1])
    y = first_batch([data], channels=1, device=device, ops=[Resize((12, 16)), Normalize(127.5, 64.0)])
    assert y.dtype == torch.float32 and tuple(y.shape) == (1, 1, 12, 16)
    x16 = first_batch([png16(GRAY16)], channels=1, decode_dtype=torch.uint16, device=device,
                      ops=[VerticalFlip(1.0)])
    assert x16.dtype == torch.uint16 and tuple(x16.shape) == (1, 1, H, W)
    np.testing.assert_array_equal(x16[0, 0].cpu().numpy(), GRAY16[::-1])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
def test_rgba_channels_4_through_ops(device):
    data = encode(Image.fromarray(RGBA8, "RGBA"), "PNG")
    x = first_batch([data], channels=4, device=device, ops=[CenterCrop((16, 16)), HorizontalFlip(1.0)])
    assert tuple(x.shape) == (1, 4, 16, 16)
    np.testing.assert_array_equal(hwc(x[0]), RGBA8[4:20, 8:24][:, ::-1])
    mean, std = (10.0, 20.0, 30.0, 40.0), (50.0, 60.0, 70.0, 80.0)
    y = first_batch([data], channels=4, device=device, ops=[Normalize(mean, std)])
    assert tuple(y.shape) == (1, 4, H, W)
    np.testing.assert_allclose(hwc(y[0]), (RGBA8 - np.array(mean)) / np.array(std), rtol=0, atol=1e-5)
    # the default drops alpha
    assert tuple(first_batch([data]).shape) == (1, 3, H, W)


# -- refusals ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, op, words", [
    ({"channels": 1}, ColorJitter(saturation=0.4), "3 channels"),
    ({"channels": 4}, ColorJitter(brightness=0.4), "1 or 3 channels"),
    ({"channels": 4}, RandomGrayscale(0.5), "3 channels"),
    ({"decode_dtype": torch.uint16}, GaussianBlur(3), "8-bit"),
    ({"decode_dtype": torch.uint16}, ColorJitter(brightness=0.4), "8-bit"),
    ({"channels": 1}, Normalize((1.0, 2.0, 3.0), 60.0), "3 channel values"),
])
def test_ops_that_cannot_take_the_pixels_refuse_at_construction(kw, op, words):
    with pytest.raises(ConfigError, match=words):
        Loader([png16(RGB16)], batch_size=1, ops=[op], **kw)


def test_brightness_on_gray_is_allowed():
    gray = textured(H, W)[:, :, 0]
    x = first_batch([encode(Image.fromarray(gray, "L"), "PNG")], channels=1, ops=[ColorJitter(brightness=0.3)])
    assert tuple(x.shape) == (1, 1, H, W)


@pytest.mark.parametrize("kw, words", [({"decode_dtype": torch.float32}, "uint8, uint16"),
                                       ({"channels": 2}, "1, 3, 4")])
def test_bad_settings_name_the_choices(kw, words):
    with pytest.raises(ConfigError, match=words):
        Loader([png16(RGB16)], batch_size=1, **kw)


def test_native_engine_refuses_other_pixels():
    chain, why = native.why_not([], [], device=torch.device("cuda"), decode="mixed", workers=0, streamed=False,
                                tuple_output=True, pipeline=None, decode_dtype="uint16", channels=3)
    assert chain is None and "decode_dtype='uint16'" in why
    chain, why = native.why_not([], [], device=torch.device("cuda"), decode="mixed", workers=0, streamed=False,
                                tuple_output=True, pipeline=None, decode_dtype="uint8", channels=4)
    assert chain is None and "channels=4" in why
    with Loader([png16(RGB16)], batch_size=1, decode_dtype=torch.uint16) as loader:
        assert loader.engine == "python"


def test_native_setting_says_why_not():
    with defaults.set(engine="native"), pytest.raises(ConfigError, match="decode_dtype='uint16'"):
        Loader([png16(RGB16)], batch_size=1, decode_dtype=torch.uint16)


def test_worker_processes_decode_as_asked():
    with Loader([tiff(RGB16)] * 2, batch_size=2, decode_dtype=torch.uint16, channels=1, num_workers=1,
                ops=[HorizontalFlip(1.0)]) as loader:
        x, _ = next(iter(loader))
    assert x.dtype == torch.uint16 and tuple(x.shape) == (2, 1, H, W)
    r, g, b = (RGB16[..., k].astype(np.uint64) for k in range(3))
    luma = (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16   # Pillow's ITU-R 601 weights
    np.testing.assert_array_equal(x[1, 0].numpy(), luma[:, ::-1].astype(np.uint16))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
def test_mixup_blends_uint16_in_its_own_range(device):
    images = torch.from_numpy(np.stack([RGB16, RGB16[::-1].copy()])).permute(0, 3, 1, 2).to(device)
    before = images.to(torch.float64)
    mixed, _ = MixUp(alpha=1.0, num_classes=2)(images.clone(), np.array([0, 1]), rng=5)
    assert mixed.dtype == torch.uint16
    # each row a blend of itself and the row before, rounded: between the two, never clipped at 255
    lo, hi = torch.minimum(before, before.roll(1, 0)), torch.maximum(before, before.roll(1, 0))
    got = mixed.to(torch.float64)
    assert bool(((got >= lo - 1) & (got <= hi + 1)).all()) and got.max() > 255


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
def test_a_failed_sample_is_dropped_from_a_uint16_batch(device):
    """The blank stand-in of a file that fails to decode has the batch's dtype and channels, and its row goes."""
    good, bad = tiff(RGB16), tiff(RGB16)[:200]   # a TIFF whose strips end early
    x = first_batch([good, bad, tiff(RGB16[::-1].copy())], decode_dtype=torch.uint16, channels=4, device=device,
                    ops=[CenterCrop((16, 16))], max_failures=1)
    assert x.dtype == torch.uint16 and tuple(x.shape) == (2, 4, 16, 16)
    np.testing.assert_array_equal(hwc(x[0])[..., :3], RGB16[4:20, 8:24])
    np.testing.assert_array_equal(hwc(x[1])[..., :3], RGB16[::-1][4:20, 8:24])
    assert (hwc(x[1])[..., 3] == 65535).all()   # opaque alpha at 16 bits
