"""Ops on CPU: each against torchvision.transforms.v2.functional, the composed warp against op-by-op
execution, planning, and config validation.

Tolerances (levels of 0..255):
* eager CPU ops vs torchvision: exact for resize / crops / flips / rotate (same torch kernels, same float32
  steps); ColorJitter <= 1 per adjustment (torchvision's ``add_(alpha=)`` is a fused multiply-add, ours is
  not, so a truncation can land one level apart), <= 2 for all four chained.
* torch reference warp vs eager: one float resample vs torch's fixed-point uint8 kernels. Bilinear and
  nearest: max 1; bicubic: max 6, mean < 0.5 (torch's uint8 bicubic clamps to 0..255 between its two
  passes, so overshoot at sharp edges differs). Rotations are compared away from the rotated image's
  border, where torchvision blends towards ``fill`` and the warp does not.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from torchvision.transforms import InterpolationMode

from ingest.errors import ConfigError
from ingest.ops import (CenterCrop, ColorJitter, Flip, HorizontalFlip, Normalize, PadTo, RandomIoUCrop,
                        RandomResizedCrop, Resize, Rotate, VerticalFlip, ZoomOut, compose, plan, run_ops)
from ingest.ops.affine import Warp, identity
from ingest.ops.base import as_list, per_sample, sizes_of
from ingest.ops.color import _apply_flat
from ingest.ops.resample import reference, warp

from conftest import cpp_library

TV_MODE = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC,
           "nearest": InterpolationMode.NEAREST_EXACT}
IMAGENET = dict(mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375))


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small images: one intra-op thread is faster, and immune to OpenMP spinning on a loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def image(h: int, w: int, seed: int = 0, c: int = 3) -> torch.Tensor:
    """A photo-like [H, W, C] uint8 image: smooth colour fields plus texture noise."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(1, c, h // 8 + 2, w // 8 + 2, generator=g) * 255
    x = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=False)
    x = x + torch.rand(1, c, h, w, generator=g) * 40 - 20
    return x.clamp(0, 255).round().to(torch.uint8)[0].permute(1, 2, 0).contiguous()


def ragged(n: int = 5, seed: int = 0, lo: int = 40, hi: int = 180) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    return [image(int(h), int(w), seed + k) for k, (h, w) in enumerate(rng.integers(lo, hi, (n, 2)))]


def chw(im: torch.Tensor) -> torch.Tensor:
    return im.permute(2, 0, 1)


def hwc(x: torch.Tensor) -> torch.Tensor:
    return x.permute(1, 2, 0)


def diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.to(torch.int32) - b.to(torch.int32)).abs()


# --------------------------------------------------------------------------------------------------
# Each op vs torchvision


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest"])
@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize("form", ["hw_down", "hw_up", "shorter", "shorter_max", "longer"])
def test_resize_matches_torchvision(interpolation, antialias, form):
    kwargs, tv = {"hw_down": ({"size": (61, 83)}, dict(size=[61, 83])),
                  "hw_up": ({"size": (170, 150)}, dict(size=[170, 150])),
                  "shorter": ({"size": 50}, dict(size=50)),
                  "shorter_max": ({"shorter": 90, "max_size": 100}, dict(size=90, max_size=100)),
                  "longer": ({"longer": 64}, dict(size=None, max_size=64))}[form]
    op = Resize(**kwargs, interpolation=interpolation, antialias=antialias)
    ims = ragged(3)
    out = op(ims)
    for im, o in zip(ims, out):
        ref = hwc(TF.resize(chw(im), **tv, interpolation=TV_MODE[interpolation], antialias=antialias))
        assert diff(o, ref).max() == 0


def test_resize_sizes_match_torchvision():
    rng = np.random.default_rng(3)
    ops = [(Resize(224), dict(size=224)), (Resize(shorter=100, max_size=133), dict(size=100, max_size=133)),
           (Resize(longer=256), dict(size=None, max_size=256))]
    for h, w in rng.integers(1, 2000, (200, 2)):
        for op, tv in ops:
            expect = tuple(TF.resize(torch.empty(0, int(h), int(w), dtype=torch.uint8), **tv).shape[-2:])
            expect = tuple(max(1, v) for v in expect)  # torchvision rounds a sliver to 0 rows; we keep one
            assert op.output_size(int(h), int(w)) == expect, (h, w, op)


def test_resize_of_a_sliver_keeps_one_row():
    """Where the arithmetic rounds the short side to 0 (torchvision then fails), one row or column is kept."""
    assert Resize(800, max_size=1333).output_size(1, 2000) == (1, 1333)
    assert Resize(800, max_size=1333).output_size(3000, 1) == (1333, 1)
    assert Resize(longer=100).output_size(1, 500) == (1, 100)
    out = Resize(800, max_size=1333)([image(1, 2000)])[0]
    assert tuple(out.shape[:2]) == (1, 1333)


@pytest.mark.parametrize("size", [(64, 64), (101, 30), (150, 200), (31, 200), 57])
def test_center_crop_matches_torchvision_including_padding(size):
    for im in ragged(4, seed=1, lo=30, hi=160):
        out = CenterCrop(size)([im])[0]
        assert diff(out, hwc(TF.center_crop(chw(im), size if isinstance(size, int) else list(size)))).max() == 0


def test_center_crop_fill():
    im = image(20, 30)
    out = CenterCrop((24, 30), fill=(7, 8, 9))([im])[0]
    assert out[0].tolist() == [[7, 8, 9]] * 30 and out[-1].tolist() == [[7, 8, 9]] * 30
    assert torch.equal(out[2:22], im)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest"])
def test_random_resized_crop_matches_torchvision(interpolation):
    ims = ragged(6, seed=2)
    op = RandomResizedCrop((48, 40), interpolation=interpolation)
    params = op.draw(sizes_of(ims), np.random.default_rng(0))
    out = op.apply(ims, params)
    assert out.shape == (6, 48, 40, 3)
    for im, o, (top, left, h, w) in zip(ims, out, params.tolist()):
        ref = TF.resized_crop(chw(im), top, left, h, w, [48, 40], interpolation=TV_MODE[interpolation])
        assert diff(o, hwc(ref)).max() == 0


def test_random_resized_crop_params_follow_the_procedure():
    op = RandomResizedCrop(32, scale=(0.2, 0.6), ratio=(0.5, 2.0))
    sizes = [(int(h), int(w)) for h, w in np.random.default_rng(0).integers(50, 400, (500, 2))]
    p = op.draw(sizes, np.random.default_rng(1))
    top, left, h, w = p.T
    H, W = np.array(sizes).T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= H).all() and (left + w <= W).all()
    area = h * w / (H * W)
    assert area.min() > 0.15 and area.max() < 0.65  # rounding moves the area a little
    assert (w / h > 0.45).all() and (w / h < 2.2).all()
    # Impossible aspect: 10 failed attempts, then the central crop narrowed to the nearest allowed ratio.
    op = RandomResizedCrop(8, scale=(0.99, 1.0), ratio=(3.0, 4.0))
    (t, l, ch, cw), = op.draw([(100, 100)], np.random.default_rng(0))
    assert (cw, ch) == (100, 33) and (t, l) == (33, 0)


def _rrc_params_all_attempts_at_once(op, sizes, rngs):
    """RandomResizedCrop's draw as it was written first: every sample's 10 attempts as [B, 10] arrays."""
    import math
    hw = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    h, w = hw[:, :1], hw[:, 1:]
    u, at = rngs.random(20), rngs.random(2)
    lo, hi = math.log(op.ratio[0]), math.log(op.ratio[1])
    area = h * w * (op.scale[0] + (op.scale[1] - op.scale[0]) * u[:, :10])
    aspect = np.exp(lo + (hi - lo) * u[:, 10:])
    cw = np.rint(np.sqrt(area * aspect)).astype(np.int64)
    ch = np.rint(np.sqrt(area / aspect)).astype(np.int64)
    ok = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
    rows, first = np.arange(len(hw)), ok.argmax(axis=1)
    cw, ch = cw[rows, first], ch[rows, first]
    h, w = hw[:, 0], hw[:, 1]
    found = ok.any(axis=1)
    in_ratio = w / h
    fw = np.where(in_ratio > op.ratio[1], np.rint(h * op.ratio[1]).astype(np.int64), w)
    fh = np.where(in_ratio < op.ratio[0], np.rint(w / op.ratio[0]).astype(np.int64), h)
    cw, ch = np.where(found, cw, fw), np.where(found, ch, fh)
    top = np.where(found, (at[:, 0] * (h - ch + 1)).astype(np.int64), (h - ch) // 2)
    left = np.where(found, (at[:, 1] * (w - cw + 1)).astype(np.int64), (w - cw) // 2)
    return np.stack([top, left, ch, cw], axis=1)


@pytest.mark.parametrize("engine", ["native", "numpy"])
@pytest.mark.parametrize("scale,ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 1.0), (2.0, 5.0)),
                                         ((0.9, 1.0), (0.1, 0.2))])
def test_random_resized_crop_draws_attempt_by_attempt_as_all_at_once(scale, ratio, engine, monkeypatch):
    """The draw (in one call of `ingest._random`, or numpy running the attempts one after another over the
    samples still without a fit) gives the parameters of the [B, 10] form, for batches above and below numpy's
    500-element GIL threshold, sizes from 1 pixel up and aspects that force the fallback."""
    import ingest.random as rnd
    from ingest.random import SampleRandom
    if engine == "native" and rnd.NATIVE is None:
        pytest.skip("ingest._random was not built")
    if engine == "numpy":
        monkeypatch.setattr(rnd, "NATIVE", None)
    op = RandomResizedCrop(16, scale=scale, ratio=ratio)
    rng = np.random.default_rng(3)
    for n in (1, 7, 256, 700):
        sizes = [(int(h), int(w)) for h, w in rng.integers(1, 900, (n, 2))]
        a, b = SampleRandom.keyed(9, n, np.arange(n)), SampleRandom.keyed(9, n, np.arange(n))
        assert np.array_equal(op.draw(sizes, a), _rrc_params_all_attempts_at_once(op, sizes, b))
        assert a.calls == b.calls == 2   # either engine takes the two calls: later ops draw the same numbers


def test_native_resized_crops_equal_numpys_and_check_their_buffers(monkeypatch):
    """`ingest._random.resized_crops` gives the numpy draw's regions on 20,000 samples of ImageNet-like and
    extreme sizes (1 pixel to 20,000), with a strided key view; and names what is wrong with its buffers or
    sizes instead of reading past them."""
    import ingest.random as rnd
    from ingest.random import SampleRandom
    if rnd.NATIVE is None:
        pytest.skip("ingest._random was not built")
    rng = np.random.default_rng(12)
    sizes = np.concatenate([rng.integers(1, 20_000, (10_000, 2)), rng.integers(200, 600, (10_000, 2))])
    op = RandomResizedCrop(224)
    keys = SampleRandom.keyed(3, 1, np.arange(2 * len(sizes))).keys[::2]    # not contiguous
    module, native = rnd.NATIVE, op.draw(sizes, SampleRandom(keys, calls=5))
    monkeypatch.setattr(rnd, "NATIVE", None)
    assert np.array_equal(native, op.draw(sizes, SampleRandom(keys, calls=5)))
    out, hw, k = np.empty((2, 4), np.int64), np.array([[5, 5], [0, 7]], np.int64), keys[:2].copy()
    with pytest.raises(ValueError, match="sample 1 is 0 x 7"):
        module.resized_crops(k, 0, hw, 0.08, 1.0, 0.75, 4 / 3, out)
    with pytest.raises(ValueError, match="resized_crops: 16 key bytes, 32 size bytes and 32 output bytes"):
        module.resized_crops(k, 0, hw, 0.08, 1.0, 0.75, 4 / 3, out[:1])


def test_bounds_corner_by_corner_equal_the_four_corners_at_once():
    """`affine.bounds` on (N,) arrays gives the boxes of the (N, 4) form, for N on both sides of numpy's
    500-element GIL threshold and maps that rotate, shear, flip and scale."""
    from ingest.ops.affine import bounds
    rng = np.random.default_rng(8)
    for n in (1, 130, 600):
        m = np.tile(np.eye(3), (n, 1, 1))
        m[:, :2, :] = rng.normal(0, 3, (n, 2, 3))
        region = rng.uniform(-50, 500, (n, 4))   # x0 y0 x1 y1 (either corner first: bounds does not care)
        xs, ys = region[:, [0, 2, 2, 0]], region[:, [1, 1, 3, 3]]
        px = m[:, 0, 0, None] * xs + m[:, 0, 1, None] * ys + m[:, 0, 2, None]
        py = m[:, 1, 0, None] * xs + m[:, 1, 1, None] * ys + m[:, 1, 2, None]
        assert np.array_equal(bounds(m, region), np.stack([px.min(1), py.min(1), px.max(1), py.max(1)], axis=1))


def test_stacked_matmul_and_compose_equal_the_whole_stack_forms():
    """`affine.stacked_matmul` (55 matrices per numpy call) gives ``a @ b`` bit for bit, and `compose` of a
    RandomResizedCrop, a Rotate and a Flip gives the box and matrix of the original (N, 4) / whole-stack
    formulation, at batch sizes on both sides of numpy's 500-element GIL threshold."""
    from ingest.ops.affine import bounds, compose, eye, stacked_matmul
    rng = np.random.default_rng(4)
    for n in (3, 55, 56, 300, 701):
        a, b = rng.normal(0, 2, (n, 3, 3)), rng.normal(0, 2, (n, 3, 3))
        assert np.array_equal(stacked_matmul(a, b), a @ b)
        sizes = [(int(h), int(w)) for h, w in rng.integers(20, 600, (n, 2))]
        ops = [RandomResizedCrop(64), Rotate((-30, 30)), Flip()]
        steps, cur = [], sizes
        for op in ops:
            st = op.steps(cur, op.draw(cur, rng))
            steps.append(st)
            cur = [tuple(x) for x in st.out_sizes.tolist()]
        src = np.asarray(sizes, dtype=np.int64)
        box = np.zeros((n, 4))
        box[:, 2], box[:, 3] = src[:, 1], src[:, 0]
        m, at = eye(n), src
        for st in steps:   # the original formulation
            if st.resamples.any():
                region = st.crop if st.crop is not None else np.stack(
                    [np.zeros(n), np.zeros(n), at[:, 1], at[:, 0]], axis=1).astype(np.float64)
                box = np.where(st.resamples[:, None], bounds(m, region), box)
            m, at = m @ st.matrix, st.out_sizes
        warp = compose(steps, sizes)
        assert np.array_equal(warp.matrix, m) and np.array_equal(warp.box, box)


def test_flips_match_torchvision():
    ims = ragged(6, seed=3)
    for op in [Flip(), HorizontalFlip(), VerticalFlip(), Flip(p=1.0, horizontal=True, vertical=True)]:
        params = op.draw(sizes_of(ims), np.random.default_rng(4))
        for im, o, (fx, fy) in zip(ims, op.apply(ims, params), params.tolist()):
            ref = chw(im)
            ref = TF.horizontal_flip(ref) if fx else ref
            ref = TF.vertical_flip(ref) if fy else ref
            assert torch.equal(o, hwc(ref))
    assert not Flip(p=0.0).draw([(5, 5)] * 10, np.random.default_rng(0)).any()
    assert Flip(p=1.0).draw([(5, 5)] * 10, np.random.default_rng(0))[:, 0].all()


@pytest.mark.parametrize("angle", [0, 17.5, -45, 90, 180, 270, 123.4])
@pytest.mark.parametrize("expand", [False, True])
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_rotate_matches_torchvision(angle, expand, interpolation):
    for im in [image(45, 70, 5), image(40, 40, 6)]:
        op = Rotate(angle, expand=expand, fill=(10, 200, 30), interpolation=interpolation)
        out = op([im])[0]
        ref = hwc(TF.rotate(chw(im), angle, interpolation=TV_MODE[interpolation] if interpolation != "nearest"
                            else InterpolationMode.NEAREST, expand=expand, fill=[10, 200, 30]))
        assert diff(out, ref).max() <= 1 and diff(out, ref).float().mean() < 0.01


def test_rotate_draws_angles_in_range():
    a = Rotate((-10, 30)).draw([(8, 8)] * 1000, np.random.default_rng(0))
    assert a.min() >= -10 and a.max() <= 30 and a.std() > 5
    assert (Rotate(12.0).draw([(8, 8)] * 3, np.random.default_rng(0)) == 12.0).all()


@pytest.mark.parametrize("which", ["brightness", "contrast", "saturation", "hue"])
def test_color_jitter_each_adjustment_matches_torchvision(which):
    ims = ragged(4, seed=7)
    op = ColorJitter(**{which: 0.4 if which != "hue" else 0.3})
    params = op.draw(sizes_of(ims), np.random.default_rng(1))
    fn = {"brightness": TF.adjust_brightness, "contrast": TF.adjust_contrast,
          "saturation": TF.adjust_saturation, "hue": TF.adjust_hue}[which]
    for n, (im, o) in enumerate(zip(ims, op.apply(ims, params))):
        ref = hwc(fn(chw(im), float(getattr(params, which)[n])))
        assert diff(o, ref).max() <= 1 and diff(o, ref).float().mean() < 0.01


def test_color_jitter_chain_matches_torchvision_in_fixed_order():
    ims = ragged(4, seed=8)
    op = ColorJitter(0.4, 0.4, 0.4, 0.1)
    p = op.draw(sizes_of(ims), np.random.default_rng(2))
    for n, (im, o) in enumerate(zip(ims, op.apply(ims, p))):
        x = TF.adjust_brightness(chw(im), float(p.brightness[n]))
        x = TF.adjust_contrast(x, float(p.contrast[n]))
        x = TF.adjust_saturation(x, float(p.saturation[n]))
        x = TF.adjust_hue(x, float(p.hue[n]))
        assert diff(o, hwc(x)).max() <= 2 and diff(o, hwc(x)).float().mean() < 0.02


def test_color_jitter_batch_forms_agree():
    ims = [im[:40, :50] for im in ragged(4, seed=9, lo=60)]
    op = ColorJitter(0.5, 0.5, 0.5, 0.2)
    p = op.draw(sizes_of(ims), np.random.default_rng(3))
    stacked = op.apply(torch.stack(ims), p)
    assert torch.equal(stacked, torch.stack(op.apply(ims, p)))
    flat = _apply_flat(ims, p)  # the CUDA path's formulation (concatenated pixels, segmented mean)
    assert max(diff(a, b).max() for a, b in zip(flat, stacked)) <= 1
    gray = [im[..., :1] for im in ims]
    out = ColorJitter(0.5, 0.5, 0.5, 0.2).apply(gray, p)  # saturation and hue skip 1-channel images
    assert out[0].shape == gray[0].shape


def test_color_jitter_p_leaves_unchosen_samples_alone():
    ims = ragged(40, seed=10, lo=8, hi=16)
    op = ColorJitter(0.5, hue=0.2, p=0.5)
    p = op.draw(sizes_of(ims), np.random.default_rng(0))
    untouched = (p.brightness == 1.0) & (p.hue == 0.0)
    assert 5 < untouched.sum() < 35
    out = op.apply(ims, p)
    assert all(torch.equal(o, im) for o, im, u in zip(out, ims, untouched) if u)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_normalize_matches_torchvision(layout, dtype):
    batch = torch.stack([im[:30, :40] for im in ragged(3, seed=11, lo=50)])
    out = Normalize(**IMAGENET, dtype=dtype, layout=layout).apply(batch)
    ref = TF.normalize(batch.permute(0, 3, 1, 2).float(), list(IMAGENET["mean"]), list(IMAGENET["std"]))
    ref = ref if layout == "NCHW" else ref.permute(0, 2, 3, 1)
    assert out.dtype == dtype and out.shape == ref.shape and out.is_contiguous()
    assert torch.allclose(out.float(), ref.to(dtype).float(), atol=1e-5 if dtype == torch.float32 else 2e-2)


def test_normalize_uint8_and_ragged():
    ims = ragged(3, seed=12)
    out = Normalize(127.5, 127.5, dtype=torch.uint8, scale=64, shift=128).apply(ims)
    for im, o in zip(ims, out):
        expect = ((chw(im).float() - 127.5) / 127.5 * 64 + 128).round().clamp(0, 255)
        assert o.dtype == torch.uint8 and torch.equal(o.float(), expect)


def test_normalize_validation():
    with pytest.raises(ConfigError, match="pixel units"):
        Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    with pytest.raises(ConfigError, match="`std` must be positive"):
        Normalize(0, (50, 0, 50))
    with pytest.raises(ConfigError, match="Unknown dtype"):
        Normalize(0, 50, dtype=torch.int32)
    with pytest.raises(ConfigError, match="Unknown layout"):
        Normalize(0, 50, layout="CHW")
    with pytest.raises(ConfigError, match="3 values but `std` has 2"):
        Normalize((1, 2, 3), (50, 60))
    with pytest.raises(ConfigError, match="for images of 1 channels"):
        Normalize((1, 2, 3), 50).apply([image(4, 4, c=1)])
    with pytest.raises(TypeError):
        Normalize(0, 50, mode="fast")  # unknown options are rejected


def test_config_validation_messages():
    cases = [(lambda: Resize(-3), "`size` must be positive, got -3"),
             (lambda: Resize((0, 5)), "`size` must be positive, got 0"),
             (lambda: Resize(), "exactly one of"),
             (lambda: Resize(10, longer=20), "exactly one of"),
             (lambda: Resize((10, 10), max_size=20), "max_size"),
             (lambda: Resize(100, max_size=100), "greater than `shorter`"),
             (lambda: Resize(10, interpolation="lanczos"), "Available: bicubic, bilinear, nearest"),
             (lambda: CenterCrop(2.5), "`size` must be an int"),
             (lambda: CenterCrop(4, fill=300), "`fill`"),
             (lambda: RandomResizedCrop(8, scale=(0.5, 0.1)), "`scale`"),
             (lambda: RandomResizedCrop(8, ratio=(0, 1)), "`ratio`"),
             (lambda: Flip(p=1.5), "`p` must be a probability"),
             (lambda: Flip(horizontal=False), "horizontal=True"),
             (lambda: Rotate("a lot"), "`angle`"),
             (lambda: Rotate((30, 10)), "`angle`"),
             (lambda: ColorJitter(brightness=-1), "`brightness` must be >= 0"),
             (lambda: ColorJitter(hue=0.7), "`hue` must lie in"),
             (lambda: ColorJitter(contrast=(2, 1)), "min <= max")]
    for make, message in cases:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            make()
    with pytest.raises(TypeError):
        Resize(10, antialiased=True)


# --------------------------------------------------------------------------------------------------
# Batch forms, determinism, the planner


def test_stacked_and_ragged_batches_give_the_same_result():
    ims = [image(60, 80, s) for s in range(4)]
    for op in [Resize(32), Resize((20, 30), interpolation="bicubic"), CenterCrop(50), CenterCrop((70, 90)),
               RandomResizedCrop(24), Flip(vertical=True), Rotate((-30, 30), fill=5)]:
        p = op.draw(sizes_of(ims), np.random.default_rng(0))
        a, b = op.apply(torch.stack(ims), p), op.apply(ims, p)
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b), op


def test_same_seed_same_output():
    ops = [RandomResizedCrop(32), Flip(), Rotate((-20, 20)), ColorJitter(0.3, 0.3, 0.3, 0.05), Normalize(**IMAGENET)]
    ims = ragged(5, seed=13)
    a = run_ops(ops, ims, np.random.default_rng(42))
    b = run_ops(ops, ims, np.random.default_rng(42))
    c = run_ops(ops, ims, np.random.default_rng(43))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (5, 3, 32, 32) and a.dtype == torch.float32


def test_plan_stages_and_draws_once_per_sample_in_op_order():
    ops = [RandomResizedCrop(32), Flip(), Normalize(**IMAGENET)]
    sizes = [(100, 120), (80, 60)]
    p = plan(ops, sizes, np.random.default_rng(7))
    rngs = per_sample(np.random.default_rng(7), 2)  # what plan keys the samples by, from a generator
    assert np.array_equal(p.drawn[0][1], ops[0].draw(sizes, rngs))
    assert np.array_equal(p.drawn[1][1], ops[1].draw([(32, 32)] * 2, rngs))  # the same source, continued
    (stage,) = p.stages
    assert stage.epilogue is ops[2] and [o for o, _ in stage.drawn] == ops[:2] and p.out_sizes == [(32, 32)] * 2
    assert p.output.dtype == torch.float32 and p.output.layout == "NCHW"
    assert p.warp.roi() == [(int(l), int(t), int(l + w), int(t + h)) for t, l, h, w in p.drawn[0][1]]
    p2 = plan([ColorJitter(0.2), Resize(16), ColorJitter(0.1), Normalize(**IMAGENET)], sizes, 0)
    assert p2.warp is None and [st.warp is not None for st in p2.stages] == [False, True, False, False]
    assert p2.stages[1].epilogue is None and p2.output.layout == "NCHW"
    norm = Normalize(**IMAGENET)
    p3 = plan([Resize(16), CenterCrop(16), ColorJitter(0.1), Flip(), norm], sizes, 0)  # every run is a warp
    assert [len(st.drawn) for st in p3.stages] == [2, 1, 1] and p3.stages[2].epilogue is norm
    assert [st.warp is not None for st in p3.stages] == [True, False, True]
    p4 = plan([Resize(16), ColorJitter(0.1)], sizes, 0)
    assert p4.output.dtype == torch.uint8 and p4.output.layout is None


def test_ops_after_normalize_are_rejected():
    with pytest.raises(ConfigError, match="put it before Normalize"):
        plan([Normalize(**IMAGENET), Flip()], [(10, 10)], 0)


# --------------------------------------------------------------------------------------------------
# The composed warp (torch reference) vs op-by-op execution


def warp_vs_eager(ops, ims, seed=0):
    p = plan(ops, sizes_of(ims), np.random.default_rng(seed))
    return reference(ims, p.warp), p.execute(ims), p


@pytest.mark.parametrize("interpolation,max_diff,mean_diff",
                         [("bilinear", 1, 0.3), ("bicubic", 6, 0.5), ("nearest", 1, 0.01)])
def test_warp_rrc_flip_matches_eager(interpolation, max_diff, mean_diff):
    ims = ragged(8, seed=14, lo=30, hi=200)
    w, e, _ = warp_vs_eager([RandomResizedCrop((40, 48), interpolation=interpolation), Flip()], ims)
    assert diff(w, e).max() <= max_diff and diff(w, e).float().mean() < mean_diff


@pytest.mark.parametrize("ops", [[Resize(64), CenterCrop(56)], [Resize((90, 40)), CenterCrop(56)],
                                 [CenterCrop(100), Resize(40)], [Resize(shorter=200, antialias=False)],
                                 [Resize(longer=50), Flip(p=1.0, vertical=True)]], ids=str)
def test_warp_resize_crop_matches_eager(ops):
    ims = ragged(5, seed=15, lo=60, hi=180)
    w, e, _ = warp_vs_eager(ops, ims)
    for a, b in zip(w, e):
        assert diff(a, b).max() <= 1 and diff(a, b).float().mean() < 0.3


def test_warp_quarter_turn_then_resize_uses_the_antialiased_filter():
    ims = ragged(4, seed=16, lo=80, hi=160)
    w, e, p = warp_vs_eager([Rotate(90, expand=True), Resize((30, 40))], ims)
    assert diff(w, e).max() <= 1 and diff(w, e).float().mean() < 0.3


def border_band(w: Warp, n: int, size, margin: float = 1.5) -> torch.Tensor:
    """Output pixels whose source point lies within ``margin`` of the source border (where torchvision's
    rotate blends towards fill)."""
    (h, wd), (oh, ow) = size, w.out_sizes[n]
    ys, xs = np.meshgrid(np.arange(oh) + 0.5, np.arange(ow) + 0.5, indexing="ij")
    x = w.matrix[n, 0, 0] * xs + w.matrix[n, 0, 1] * ys + w.matrix[n, 0, 2]
    y = w.matrix[n, 1, 0] * xs + w.matrix[n, 1, 1] * ys + w.matrix[n, 1, 2]
    near = lambda v, lim: (np.abs(v) < margin) | (np.abs(v - lim) < margin)  # noqa: E731
    return torch.from_numpy((near(x, wd) & (y > -margin) & (y < h + margin))
                            | (near(y, h) & (x > -margin) & (x < wd + margin)))


@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
@pytest.mark.parametrize("expand", [False, True])
def test_warp_rotate_matches_eager_away_from_the_border(interpolation, expand):
    ims = ragged(4, seed=17, lo=50, hi=120)
    op = Rotate((-40, 40), expand=expand, fill=(250, 0, 120), interpolation=interpolation)
    w, e, p = warp_vs_eager([op], ims)
    for n, (a, b) in enumerate(zip(w, e)):
        d = diff(a, b)[~border_band(p.warp, n, ims[n].shape[:2])]
        assert d.max() <= 1 and d.float().mean() < 0.05
        corner = a[0, 0] if expand else None  # expanded corners lie outside the source: fill
        assert corner is None or corner.tolist() == [250, 0, 120]


def test_warp_fused_normalize_matches_eager():
    ims = ragged(4, seed=18)
    for dtype in [torch.float32, torch.float16, torch.bfloat16, torch.uint8]:
        for layout in ["NCHW", "NHWC"]:
            norm = Normalize(**IMAGENET, dtype=dtype, layout=layout, scale=1 if dtype != torch.uint8 else 50,
                             shift=0 if dtype != torch.uint8 else 128)
            p = plan([CenterCrop(40), Flip(), norm], sizes_of(ims), np.random.default_rng(0))
            fused = warp(ims, p.warp, epilogue=norm.epilogue(3))  # on CPU: the reference
            assert fused.dtype == dtype and torch.equal(fused, p.execute(ims))


def test_identity_warp_copies():
    ims = ragged(3, seed=19)
    assert all(torch.equal(a, b) for a, b in zip(reference(ims, identity(sizes_of(ims))), ims))


def test_shifted_warp_on_region_of_interest_decode():
    ims = ragged(5, seed=20, lo=100, hi=220)
    p = plan([RandomResizedCrop(40), Flip()], sizes_of(ims), np.random.default_rng(1))
    rois = p.warp.roi()
    crops = [im[y0:y1, x0:x1] for im, (x0, y0, x1, y1) in zip(ims, rois)]
    full = p.execute(ims)
    roi = p.execute(crops, origins=[(x0, y0) for x0, y0, _, _ in rois])
    assert diff(roi, full).max() <= 1 and diff(roi, full).float().mean() < 0.3


def test_plan_without_a_leading_warp_takes_whole_images():
    """The GPU decoder reports origins (0, 0) when it was given no regions; a plan starting with a colour op
    then runs as if none were given, and refuses real regions (it cannot map them)."""
    ims = ragged(3, seed=23)
    p = plan([ColorJitter(0.3), RandomResizedCrop(24), Flip()], sizes_of(ims), 4)
    assert p.warp is None and p.stages[1].warp is not None
    assert torch.equal(p.execute(ims, origins=[(0, 0)] * 3), p.execute(ims))
    with pytest.raises(ValueError, match="starts with geometry"):
        p.execute(ims, origins=[(0, 0), (2, 0), (0, 0)])


def test_rescaled_warp_on_downscaled_sources():
    big = [image(240, 320, 21), image(200, 150, 22)]
    p = plan([RandomResizedCrop(48, scale=(0.5, 1.0)), Flip()], sizes_of(big), np.random.default_rng(2))
    # What a JPEG decoder scaling by 1/2 returns: ceil(size / 2), each pixel the mean of its 2x2 block.
    small = [torch.nn.functional.avg_pool2d(chw(im)[None].float(), 2, ceil_mode=True)[0].round()
             .to(torch.uint8).permute(1, 2, 0).contiguous() for im in big]
    w = p.warp.rescaled(sizes_of(small))
    assert np.allclose(w.matrix[:, 0, 0], p.warp.matrix[:, 0, 0] / 2)
    out, full = p.execute(small), p.execute(big)  # CPU, sizes differ: the reference warp on the small ones
    assert out.shape == full.shape and diff(out, full).float().mean() < 4


def test_dct_scale_is_detected_exactly():
    w = plan([Resize((10, 10))], [(375, 500), (333, 500)]).warp
    r = w.rescaled([(47, 63), (167, 250)])  # 1/8 and 1/2 with the decoder's round-up
    assert np.allclose(r.matrix[:, 0, 0], [500 / 10 / 8, 500 / 10 / 2])
    assert np.allclose(r.matrix[:, 1, 1], [375 / 10 / 8, 333 / 10 / 2])


def test_compose_box_rule():
    sizes = [(100, 200)]
    crop_then_resize = compose([CenterCrop(50).steps(sizes, None), Resize((25, 25)).steps([(50, 50)], None)], sizes)
    assert crop_then_resize.box.tolist() == [[75.0, 25.0, 125.0, 75.0]]
    assert plan([CenterCrop(50), Resize((25, 25))], sizes).warp.box.tolist() == crop_then_resize.box.tolist()
    resize_then_crop = plan([Resize((50, 100)), CenterCrop(20)], sizes).warp
    assert resize_then_crop.box.tolist() == [[0.0, 0.0, 200.0, 100.0]]
    assert resize_then_crop.interpolation == "bilinear" and resize_then_crop.antialias
    exact = compose([CenterCrop(20).steps(sizes, None), Flip().steps([(20, 20)], np.array([[True, False]]))], sizes)
    assert exact.interpolation == "nearest" and exact.out_sizes == [(20, 20)]
    step = Resize((50, 100)).steps([(100, 200)], None)
    assert step.resamples[0] and step.out_sizes[0].tolist() == [50, 100]
    assert np.allclose(step.matrix[0], np.diag([2.0, 2.0, 1.0]))


def test_warp_rejects_a_mismatched_batch():
    w = identity(sizes_of(ragged(2)))
    with pytest.raises(ValueError, match="warp is for 2 samples"):
        warp(ragged(3), w)


@pytest.mark.parametrize("ops", [
    [RandomResizedCrop(12), Flip(), Normalize(**IMAGENET, dtype=torch.float16, layout="NCHW")],
    [RandomResizedCrop((10, 14)), Flip(), Rotate(20)],
], ids=["normalized NCHW", "pixels"])
def test_a_large_batch_planned_in_slices_gets_what_one_plan_gives(ops):
    """`plan_sliced` plans a batch of more than `SLICE` samples in slices (numpy gives the GIL up on more than
    500 items): every sample draws from its own key, so the slices draw and write what one plan would."""
    from ingest.ops.planner import SLICE, Sliced, plan_sliced
    from ingest.random import SampleRandom
    n = SLICE + 44
    ims = torch.stack([image(20, 24, i) for i in range(n)])
    keys = np.arange(1000, 1000 + n)
    sizes = [(20, 24)] * n
    sliced = plan_sliced(ops, sizes, lambda a, b: SampleRandom.keyed(5, 1, keys[a:b]))
    whole = plan(ops, sizes, SampleRandom.keyed(5, 1, keys))
    assert isinstance(sliced, Sliced) and sliced.bounds == [(0, n // 2), (n // 2, n)]
    assert sliced.sizes == whole.sizes and sliced.out_sizes == whole.out_sizes and sliced.output == whole.output
    got, want = sliced.execute(ims), whole.execute(ims)
    assert got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)
    assert not isinstance(plan_sliced(ops, sizes[:SLICE], lambda a, b: SampleRandom.keyed(5, 1, keys[a:b])), Sliced)
    with pytest.raises(ValueError, match="whole images"):
        sliced.execute(ims, origins=[(0, 0)] * n)
    assert torch.equal(sliced.execute(ims, scales=None), want)   # what the ops stage passes for a raw batch
    with pytest.raises(ValueError, match="full resolution"):
        sliced.execute(ims, scales=[0.5] * n)


def test_execute_and_warp_write_into_out_of_the_batchs_shape():
    ims = torch.stack([image(20, 24, i) for i in range(4)])
    p = plan([CenterCrop(16), Flip()], sizes_of(ims), 0)
    out = torch.zeros((4, 16, 16, 3), dtype=torch.uint8)
    assert p.execute(ims, out=out) is out and torch.equal(out, p.execute(ims))
    with pytest.raises(ValueError, match="`out` is"):
        p.execute(ims, out=torch.empty((4, 15, 16, 3), dtype=torch.uint8))
    out = torch.zeros((4, 16, 16, 3), dtype=torch.uint8)
    assert warp(ims, p.warp, out=out) is out and torch.equal(out, warp(ims, p.warp))
    with pytest.raises(ValueError, match="`out` is"):
        warp(ims, p.warp, out=torch.empty((4, 16, 16, 3), dtype=torch.float32))


# --------------------------------------------------------------------------------------------------
# The CUDA kernel's own source, compiled as C++ and run on the CPU (one loop over blocks and threads), so
# that its indexing, argument packing, filters and epilogue are checked against the reference in CI.
# Only the CUDA built-ins are stand-ins (__ldg is a plain load; float -> half is _Float16).

_PRELUDE = r"""
#include <math.h>
#include <string.h>
#define INGEST_HOST_EMULATION
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(n)
struct Dim3 { unsigned x, y, z; };
static Dim3 blockIdx, threadIdx, blockDim;
template <class T> static inline T __ldg(const T* p) { return *p; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline unsigned short half_bits(float v) {
    _Float16 h = (_Float16)v;
    unsigned short u;
    memcpy(&u, &h, 2);
    return u;
}
"""
_DRIVER = r"""
typedef void (*Kernel)(const long long*, const double*, unsigned char*, int, int, int, int);
extern "C" void run(int which, int gx, int gy, int gz, const long long* ip, const double* fp,
                    unsigned char* out, int C, int kind, int nchw, int normalize) {
    Kernel k = which == 0 ? warp_nearest : (which == 1 ? warp_bilinear : warp_bicubic);
    blockDim = {32, 8, 1};
    for (unsigned z = 0; z < (unsigned)gz; ++z)
        for (unsigned y = 0; y < (unsigned)gy; ++y)
            for (unsigned x = 0; x < (unsigned)gx; ++x)
                for (unsigned t = 0; t < 256; ++t) {
                    blockIdx = {x, y, z};
                    threadIdx = {t % 32, t / 32, 0};
                    k(ip, fp, out, C, kind, nchw, normalize);
                }
}
"""


@pytest.fixture(scope="module")
def kernel_on_cpu(tmp_path_factory):
    import ctypes

    from ingest.ops import _warp_kernel
    from ingest.ops.resample import _fill_values, _setup

    lib = ctypes.CDLL(str(cpp_library(tmp_path_factory.mktemp("kernel"), _PRELUDE + _warp_kernel.SOURCE + _DRIVER,
                                      "-std=c++17", "-Wno-unknown-pragmas")))
    lib.run.argtypes = [ctypes.c_int] * 4 + [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4

    def run(ims, w, normalize=None):
        c = ims[0].shape[2]
        coefficients = normalize.epilogue(c)[:2] if normalize else None
        packed = _warp_kernel.pack(ims, w.out_sizes, _setup(w, sizes_of(ims)), _fill_values(w.fill, c),
                                   coefficients)
        dtype = normalize.dtype if normalize else torch.uint8
        nchw = normalize is not None and normalize.layout == "NCHW"
        out, result = _warp_kernel.output(packed, dtype, "cpu", nchw)
        lib.run(["nearest", "bilinear", "bicubic"].index(w.interpolation), *packed.grid,
                packed.ip.ctypes.data, packed.fp.ctypes.data, out.data_ptr(), c,
                _warp_kernel._KINDS[dtype], int(nchw), int(normalize is not None))
        return result

    return run


def kernel_test_batch() -> list[torch.Tensor]:
    """Ragged sources, two of them strided views (a crop and a transpose) as the kernel reads them."""
    big = image(200, 260, 30)
    return ragged(5, seed=31, lo=30, hi=160) + [big[10:150, 40:230], big.transpose(0, 1)[:120]]


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear", "bicubic"])
@pytest.mark.parametrize("antialias", [True, False])
def test_kernel_source_matches_reference(kernel_on_cpu, interpolation, antialias):
    ims = kernel_test_batch()
    for ops in [[RandomResizedCrop((40, 36), interpolation=interpolation, antialias=antialias), Flip()],
                [Resize(48, interpolation=interpolation, antialias=antialias), CenterCrop((60, 40), fill=(9, 99, 199))],
                [Rotate((-40, 40), expand=True, fill=(250, 0, 120), interpolation=interpolation)],
                [Rotate(90, expand=True), Resize((30, 44), interpolation=interpolation, antialias=antialias)]]:
        p = plan(ops, sizes_of(ims), np.random.default_rng(1))
        for a, b in zip(kernel_on_cpu(ims, p.warp), reference(ims, p.warp)):
            d = diff(a, b)  # float32 vs float64 coordinates: rounding and nearest-neighbour ties only
            assert (d > 1).float().mean() < 1e-3 and d.float().mean() < 0.01, ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.uint8])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_kernel_source_fused_normalize(kernel_on_cpu, dtype, layout):
    ims = kernel_test_batch()
    norm = Normalize(**IMAGENET, dtype=dtype, layout=layout, scale=50 if dtype == torch.uint8 else 1,
                     shift=128 if dtype == torch.uint8 else 0)
    p = plan([RandomResizedCrop(32), Flip(), norm], sizes_of(ims), np.random.default_rng(2))
    a, b = kernel_on_cpu(ims, p.warp, norm), reference(ims, p.warp, epilogue=norm.epilogue(3))
    assert a.dtype == dtype and a.shape == b.shape
    step = 1.0 if dtype == torch.uint8 else 1.01 / min(IMAGENET["std"])  # one level apart, at most
    assert (a.float() - b.float()).abs().max() <= step + (0.02 if dtype == torch.bfloat16 else 0.002)


def test_kernel_source_on_a_batch_tensor_matches_its_list(kernel_on_cpu):
    """A fixed-size batch goes to the kernel as one tensor (pointers computed, not read per image)."""
    from ingest.ops import _warp_kernel
    from ingest.ops.resample import _setup

    batch = torch.stack(ragged(6, seed=5, lo=64, hi=65))[:, 3:60, 2:, :]  # strided: a crop of each image
    p = plan([RandomResizedCrop(24), Flip()], sizes_of(batch), 4)
    setup = _setup(p.warp, sizes_of(batch))
    a, b = (_warp_kernel.pack(x, p.warp.out_sizes, setup, (0.0,) * 3, None) for x in (batch, list(batch.unbind(0))))
    assert np.array_equal(a.buf, b.buf)
    assert torch.equal(kernel_on_cpu(batch, p.warp), kernel_on_cpu(list(batch.unbind(0)), p.warp))


def crop_then_pad_chains() -> list[list]:
    """Chains where an op that only moves pixels (a crop) cuts the image and a later one pads past the cut:
    the padding maps back inside the source, where its pixels must not show."""
    return [[CenterCrop((48, 40)), PadTo((64, 64), fill=(9, 99, 199))],
            [CenterCrop(30), Flip(p=1.0), ZoomOut((1.5, 2.0), p=1.0, fill=(9, 99, 199))],
            [RandomIoUCrop(min_ious=(0.0,)), PadTo(batch=True, fill=(9, 99, 199))],
            [ZoomOut((1.5, 2.0), p=1.0), CenterCrop(36), PadTo((50, 60), center=True)],
            [CenterCrop((40, 30)), PadTo((64, 64), fill=(9, 99, 199)), Resize((32, 40))],
            [CenterCrop(36), PadTo((56, 48)), Resize(20, antialias=False)]]


def centre_boxes(ims) -> list[np.ndarray]:
    """One box per image, about its centre (what RandomIoUCrop's draw needs)."""
    return [np.array([[0.3 * im.shape[1], 0.3 * im.shape[0], 0.6 * im.shape[1], 0.7 * im.shape[0]]]) for im in ims]


def through_warps(run, ims, p):
    """The plan's warps, stage after stage, each on the one before's output, by ``run`` (the kernel's source on
    the CPU, or `reference`); every stage of ``p`` must be a warp."""
    assert all(stage.warp is not None for stage in p.stages)
    for stage in p.stages:
        ims = run(ims, stage.warp)
    return ims


@pytest.mark.parametrize("ops", crop_then_pad_chains(), ids=str)
def test_crop_then_pad_fills_past_the_crop(kernel_on_cpu, ops):
    """The warps (the kernel's source on the CPU and the torch reference) give what op-by-op execution gives:
    fill, not the source, where the padding maps outside the crop, and a later resize reads fill there. Ragged
    sources (some smaller than a crop, which then pads with its own fill), and a fixed-size batch tensor of
    strided views (its source pointers are computed)."""
    ragged_batch = ragged(4, seed=33, lo=40, hi=70) + [image(50, 47, 34), image(24, 70, 36)]
    fixed = torch.stack([image(60, 64, 35 + k) for k in range(3)])[:, 2:52, 5:, :]
    for ims in (ragged_batch, fixed):
        p = plan(ops, sizes_of(ims), np.random.default_rng(3), boxes=centre_boxes(ims))
        eager = as_list(p.execute(ims))
        for a, b, c in zip(as_list(through_warps(kernel_on_cpu, ims, p)), as_list(through_warps(reference, ims, p)),
                           eager):
            assert a.shape == b.shape == c.shape
            assert diff(a, c).max() <= 1 and diff(b, c).max() <= 1, ops


FILL = (9, 99, 199)


def fill_chains() -> list[list]:
    """Chains whose geometry ops fill differently, where an earlier op pads on small images (a crop larger than
    the image, a pad, a rotation) and a later one has another fill."""
    return [[CenterCrop((48, 40)), PadTo((64, 64), fill=FILL)],
            [CenterCrop((40, 30)), PadTo((64, 64), fill=FILL), Resize((32, 40))],
            [PadTo((56, 56), fill=FILL, center=True), CenterCrop(40)],
            [Rotate(30, fill=FILL, interpolation="nearest"), Flip(p=1.0), CenterCrop(70, fill=5)]]


@pytest.mark.parametrize("ops", fill_chains(), ids=str)
def test_each_warp_fills_as_its_ops_on_images_smaller_than_the_crop(kernel_on_cpu, ops):
    """Images smaller than the crop: each op pads with its own fill op by op, and the plan splits the run where
    an op of another fill follows one that padded, so the kernel's source (stage after stage) gives the same."""
    ims = [image(30, 26, 40), image(44, 20, 41), image(36, 38, 42)]
    p = plan(ops, sizes_of(ims), np.random.default_rng(4))
    eager = as_list(p.execute(ims))
    warped = as_list(through_warps(kernel_on_cpu, ims, p))
    for a, c in zip(warped, eager):
        assert a.shape == c.shape
        far = diff(a, c) > 1
        if isinstance(ops[0], Rotate):   # nearest: float32 against float64 coordinates, ties along the edges
            assert far.float().mean() < 0.01, ops
        else:
            assert not far.any(), ops
    if isinstance(ops[0], CenterCrop):   # the crop's own padding is its fill (0), the pad's is FILL
        assert warped[0][0, 0].tolist() == [0, 0, 0] and warped[0][-1, -1].tolist() == list(FILL)
    assert len(p.stages) == 2


def test_a_warp_ends_before_another_fill_only_after_an_op_padded():
    small, large = [(30, 26), (70, 90)], [(70, 90), (64, 48)]

    def runs(ops, sizes):
        return [[type(op).__name__ for op, _ in stage.drawn] for stage in plan(ops, sizes, 0).stages]

    crop_pad = [CenterCrop((48, 40)), PadTo((64, 64), fill=FILL)]
    assert runs(crop_pad, large) == [["CenterCrop", "PadTo"]]           # the crop never pads: one warp
    assert runs(crop_pad, small) == [["CenterCrop"], ["PadTo"]]
    assert runs([CenterCrop((48, 40), fill=FILL), PadTo((64, 64), fill=FILL)], small) == [["CenterCrop", "PadTo"]]
    assert runs([CenterCrop(48), PadTo(64, fill=(0, 0, 0))], small) == [["CenterCrop", "PadTo"]]  # one colour
    assert runs([PadTo(100, fill=FILL), Resize(50), Flip(), CenterCrop(40)], large) == [
        ["PadTo", "Resize", "Flip"], ["CenterCrop"]]                     # the crop's fill would paint the pad's
    assert runs([Resize(32), Flip(), CenterCrop(24, fill=FILL)], small) == [["Resize", "Flip", "CenterCrop"]]
    assert runs([Rotate(0, fill=FILL), CenterCrop(20)], small) == [["Rotate", "CenterCrop"]]  # no corner moves
    assert runs([Rotate(10, fill=FILL), CenterCrop(20)], small) == [["Rotate"], ["CenterCrop"]]
    assert runs([CenterCrop(48), PadTo(64, fill=FILL), Normalize(**IMAGENET)], small) == [
        ["CenterCrop"], ["PadTo"]]
    assert plan([CenterCrop(48), PadTo(64, fill=FILL), Normalize(**IMAGENET)], small, 0).stages[1].epilogue


def test_split_warps_move_boxes_and_masks_as_one_warp_does():
    """Boxes and masks have no fill of the images': through the split plan boxes land where one warp of every op
    (the same ops with one fill) puts them, and masks (pixels only moved, on the CPU) as that warp and as the ops
    one by one move them, the mask's fill wherever an op padded."""
    from ingest.ops.planner import _warp_masks
    sizes = [(30, 26), (44, 20), (70, 90)]
    boxes = [np.array([[2.0, 3.0, 20.0, 25.0]]), np.array([[1.0, 30.0, 15.0, 40.0]]), np.array([[10.0, 5, 80, 60]])]
    masks = [torch.from_numpy(np.random.default_rng(k).integers(1, 255, (2, h, w), dtype=np.uint8))
             for k, (h, w) in enumerate(sizes)]
    for ops, one, on_masks in [
            ([CenterCrop((40, 30)), PadTo((64, 64), fill=FILL), Resize((32, 40))],
             [CenterCrop((40, 30), fill=FILL), PadTo((64, 64), fill=FILL), Resize((32, 40))], None),
            ([CenterCrop((40, 30)), Flip(p=1.0), PadTo((64, 64), fill=FILL)],
             [CenterCrop((40, 30), fill=FILL), Flip(p=1.0), PadTo((64, 64), fill=FILL)],
             [CenterCrop((40, 30), fill=7), Flip(p=1.0), PadTo((64, 64), fill=7)]),
            ([PadTo(100, fill=FILL), Resize(50), Flip(p=1.0), CenterCrop(40)],
             [PadTo(100, fill=FILL), Resize(50), Flip(p=1.0), CenterCrop(40, fill=FILL)], None)]:
        split, joined = plan(ops, sizes, 5), plan(one, sizes, 5)
        assert len(split.stages) == 2 and len(joined.stages) == 1
        for a, b in zip(split.map_boxes(boxes)[0], joined.map_boxes(boxes)[0]):
            np.testing.assert_array_equal(a, b)
        if on_masks is not None:   # only moves pixels: no resampling, so no ties at a crop's edge
            eager = plan(on_masks, sizes, 5).execute([m.permute(1, 2, 0) for m in masks])
            for a, b, c in zip(split.warp_masks(masks, fill=7), _warp_masks(masks, joined.warp, 7), as_list(eager)):
                assert torch.equal(a, b) and torch.equal(a, c.permute(2, 0, 1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_split_warps_move_masks_on_cuda_as_on_the_cpu():
    """The CUDA path of `Plan.warp_masks` (one launch per stage) through a plan split by fill (whole-pixel moves:
    no sample point lands on a pixel's edge, where float32 and float64 coordinates could round apart)."""
    sizes = [(30, 26), (44, 20), (70, 90)]
    masks = [torch.from_numpy(np.random.default_rng(k).integers(1, 255, (2, h, w), dtype=np.uint8))
             for k, (h, w) in enumerate(sizes)]
    p = plan([CenterCrop((40, 30)), Flip(p=1.0), PadTo((64, 64), fill=FILL)], sizes, 5)
    assert len(p.stages) == 2
    for a, b in zip(p.warp_masks(masks, device="cuda", fill=7), p.warp_masks(masks, fill=7)):
        assert a.is_cuda and torch.equal(a.cpu(), b)
