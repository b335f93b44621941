"""The native planner (ingest/_native/plan.c through ``ingest._plan``) against the Python planner: for every
chain it runs, the same draws, output sizes, regions to decode, composed warps and filter, and the same warp
kernel argument rows as `_warp_kernel.pack` makes for the decoded batch, whole, as regions (the GPU decoder's
origins) or downscaled.

Every number is compared exactly: integers, and doubles to the last bit (as values: the sign of a zero is not
compared, which no comparison of the kernel's can tell). Exact, not within a tolerance, because plan.c does
each double operation of the numpy code in the same order and rounds each on its own (-ffp-contract=off),
calls the same libm exp and log for RandomResizedCrop (``ingest._random`` is its Python draw), and numpy's
3 x 3 products of these maps (scales, translations, flips) equal the left-to-right sums it makes. CPU only:
arrays are compared, no pixels.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ingest import native, native_plan, random as rnd
from ingest.ops import _warp_kernel, affine, detection, planner, resample
from ingest.ops.base import ImageArena, ImageSpec, as_list, size_array_of
from ingest.ops.boxes import BoxBatch
from ingest.ops.color import ColorJitter
from ingest.decode.gpu import clip_regions
from ingest.ops.detection import PadTo, RandomIoUCrop, ZoomOut
from ingest.ops.geometry import (CenterCrop, Flip, HorizontalFlip, RandomResizedCrop, Resize, Rotate,
                                 VerticalFlip)
from ingest.ops.normalize import Normalize
from ingest.random import SampleRandom

pytestmark = pytest.mark.skipif(native_plan.NATIVE is None, reason="ingest._plan is not built")

MEAN, STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)

CHAINS = {
    "imagenet-train": [RandomResizedCrop(224), HorizontalFlip(), Normalize(MEAN, STD)],
    "imagenet-val": [Resize(256), CenterCrop(224), Normalize(MEAN, STD)],
    "rrc-bicubic-no-aa-both-flips": [RandomResizedCrop((160, 192), scale=(0.25, 1.0), ratio=(0.5, 2.0),
                                                       interpolation="bicubic", antialias=False),
                                     Flip(0.3, vertical=True)],
    "shorter-max-size-nearest-fill": [Resize(shorter=128, max_size=150, interpolation="nearest"),
                                      CenterCrop((100, 120), fill=(10, 20.5, 30)), VerticalFlip(0.7)],
    "longer-then-padding-crop": [Resize(longer=300, antialias=False), CenterCrop(350, fill=7)],
    "fixed-resize-rrc-fp16-nhwc": [Resize((64, 96), interpolation="bicubic"), RandomResizedCrop(32, scale=(0.5, 0.9)),
                                   HorizontalFlip(1.0),
                                   Normalize(MEAN, STD, dtype=torch.float16, layout="NHWC")],
    "crop-only": [CenterCrop(200)],
    # a crop, then a crop that pads past it: the padding is fill, and a later resize reads fill there (one fill:
    # the first crop pads small images too, which with another fill the native engine refuses, `_fill_clash`)
    "crop-then-padding-crop": [CenterCrop(150, fill=9), Flip(0.5), CenterCrop(400, fill=9)],
    "crop-padding-crop-resize": [CenterCrop(150, fill=(9, 9, 9)), CenterCrop(400, fill=9), Resize(120)],
    "rrc-crop-padding-crop": [RandomResizedCrop(96), CenterCrop(60), CenterCrop(128, fill=9)],
    "flips-rrc-resize-bf16": [Flip(horizontal=True, vertical=True), RandomResizedCrop(48),
                              Resize(64, antialias=False), Normalize(120.0, 60.0, dtype=torch.bfloat16)],
    # Resize(100) never resamples the 100 x 200 crops: the batch's filter is the crop's (affine.compose)
    "resize-that-keeps-size": [RandomResizedCrop((100, 200), interpolation="bicubic"),
                               Resize(100, interpolation="nearest")],
    "rrc-then-resize": [RandomResizedCrop(224, ratio=(1.0, 1.0)), Resize(200, interpolation="bicubic"),
                        Normalize(MEAN, STD, dtype=torch.uint8, scale=64, shift=128)],
}


def random_sizes(rng: np.random.Generator, n: int) -> np.ndarray:
    """Probed sizes: mostly photos, some tiny or extreme in aspect (RandomResizedCrop's fallback, Resize's
    one-row floor)."""
    hw = rng.integers(40, 1200, (n, 2))
    odd = rng.random(n)
    hw[odd < 0.1] = rng.integers(1, 5, (int((odd < 0.1).sum()), 2))
    thin = (odd >= 0.1) & (odd < 0.2)
    hw[thin, rng.integers(0, 2)] = rng.integers(1, 4, int(thin.sum()))
    return hw


def draw_batch(seed: int):
    """A batch's (seed, epoch, dataset indices, probed sizes)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    key = [0, 1, 2**63 + 5, 2**64 - 1, int(rng.integers(0, 2**62))][int(rng.integers(0, 5))]
    return key, int(rng.integers(0, 1000)), rng.integers(0, 2**40, n), random_sizes(rng, n)


def python_plan(ops, seed, epoch, idx, hw):
    return planner.plan(ops, hw, SampleRandom.keyed(seed, epoch, idx))


@pytest.mark.parametrize("engine", ["native", "numpy"])
@pytest.mark.parametrize("name", sorted(CHAINS))
def test_plan_matches_the_python_planner(name, engine, monkeypatch):
    if engine == "numpy":   # the Python planner's numpy draws, not ingest._random's
        monkeypatch.setattr(rnd, "NATIVE", None)
    ops = CHAINS[name]
    desc = native_plan.describe(ops)
    assert desc is not None
    for trial in range(12):
        seed, epoch, idx, hw = draw_batch(1000 * trial + len(name))
        p = python_plan(ops, seed, epoch, idx, hw)
        q = native_plan.plan(desc, seed, epoch, idx, hw)
        w, s = p.warp, q.samples
        assert len(p.stages) == 1
        np.testing.assert_array_equal(s["region"], w.regions())
        np.testing.assert_array_equal(s["out_hw"], np.array(p.out_sizes).reshape(-1, 2))
        np.testing.assert_array_equal(s["src_hw"], hw)
        np.testing.assert_array_equal(s["matrix"].reshape(-1, 2, 3), w.matrix[:, :2])
        np.testing.assert_array_equal(w.matrix[:, 2], np.tile([0.0, 0.0, 1.0], (len(hw), 1)))
        np.testing.assert_array_equal(s["box"], w.box)
        assert (q.interpolation, q.antialias) == (w.interpolation, w.antialias)
        for k, ((op, params), steps) in enumerate(zip(p.stages[0].drawn, p.stages[0].steps)):
            got = q.params[:, k]
            if isinstance(op, RandomResizedCrop):
                np.testing.assert_array_equal(got[:, :4], params)
            elif isinstance(op, Flip):
                np.testing.assert_array_equal(got[:, :2], params.astype(np.int64))
            else:
                np.testing.assert_array_equal(got[:, :2], steps.out_sizes)


def decoded_batch(planned, rng, case):
    """What a decoder returned for the plan's regions: (origins or None, decoded sizes), as
    `Stage.run` takes them. "regions": the GPU decoder (a region where it is worth decoding alone, else the
    whole image, origin (0, 0)); "dct": whole images downscaled by k/8 or to another size; "stand-ins": origins
    and sizes that fit nothing (a failed decode's blank)."""
    hw = planned["src_hw"]
    n = len(hw)
    if case == "regions":
        table = np.zeros((n, 7), dtype=np.int64)
        table[:, 1], table[:, 2], table[:, 6] = hw[:, 0], hw[:, 1], 1
        regions = clip_regions(planned["region"], table)
        cropped = regions[:, 2] > regions[:, 0]
        origins = np.where(cropped[:, None], regions[:, :2], 0)
        decoded = np.where(cropped[:, None], np.stack([regions[:, 3] - regions[:, 1],
                                                       regions[:, 2] - regions[:, 0]], 1), hw)
        return origins, decoded
    if case == "dct":
        k = rng.integers(1, 9, n)[:, None]
        decoded = np.maximum(np.ceil(hw * k / 8), 1).astype(np.int64)
        other = rng.random(n) < 0.3
        decoded[other] = rng.integers(1, 900, (int(other.sum()), 2))
        return None, decoded
    return rng.integers(-50, 400, (n, 2)), rng.integers(1, 600, (n, 2))


def python_pack(p, images, origins, channels):
    """The kernel arguments `Plan.execute` gives the warp kernel on CUDA: the first stage's warp fitted to what
    the decoder returned (`Stage.run`), then `resample.warp`'s own steps into `_warp_kernel.pack`."""
    seen = []

    def warp(images, w, *, epilogue=None, out=None):
        seen.append((w, epilogue))
        return images

    planned = origins is None and size_array_of(images).tolist() == np.array(p.sizes).reshape(-1, 2).tolist()
    if planned:   # Stage.run on CUDA uses the plan's warp as it is
        stage = p.stages[0]
        seen.append((stage.warp, stage.epilogue.epilogue(channels) if stage.epilogue else None))
    else:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(resample, "warp", warp)
            p.execute(images, origins=None if origins is None else [tuple(o) for o in origins.tolist()])
    (w, epilogue), = seen
    setup = resample._setup(w, size_array_of(images))
    packed = _warp_kernel.pack(images, w.out_sizes, setup, resample._fill_values(w.fill, channels),
                               epilogue[:2] if epilogue else None)
    return w, epilogue, packed


def arena(decoded: np.ndarray, channels: int) -> ImageArena:
    """A batch of images of ``decoded`` sizes as the GPU decoder's arena returns it (dense, one buffer); only
    its addresses are read, so the buffer is one byte."""
    sizes = decoded[:, 0] * decoded[:, 1] * channels
    return ImageArena(torch.zeros(1, dtype=torch.uint8), np.concatenate([[0], np.cumsum(sizes)[:-1]]), decoded,
                      channels)


def strided(decoded: np.ndarray, channels: int, rng) -> list[torch.Tensor]:
    """Images of ``decoded`` sizes with strides of every kind (broadcast rows and columns, a channel-reversed
    view), each its own small allocation."""
    out = []
    for h, w in decoded.tolist():
        base = torch.zeros(1, 1, channels + 2, dtype=torch.uint8)
        im = base[..., :channels].expand(h, w, channels)
        out.append(im.flip(2) if rng.random() < 0.5 else im)
    return out


@pytest.mark.parametrize("case", ["planned", "regions", "dct", "stand-ins"])
@pytest.mark.parametrize("name", sorted(CHAINS))
def test_pack_matches_the_warp_kernel_arguments(name, case):
    ops = CHAINS[name]
    desc = native_plan.describe(ops)
    rng = np.random.default_rng(len(name) + 7 * len(case))
    for trial in range(6):
        seed, epoch, idx, hw = draw_batch(777 * trial + len(name))
        p = python_plan(ops, seed, epoch, idx, hw)
        q = native_plan.plan(desc, seed, epoch, idx, hw)
        origins, decoded = (None, hw) if case == "planned" else decoded_batch(q.samples, rng, case)
        if trial % 2:
            images, strides = strided(decoded, 3, rng), None
            src = np.array([im.data_ptr() for im in images], dtype=np.uint64)
            strides = np.array([im.stride() for im in images], dtype=np.int64)
        else:
            images, strides = arena(decoded, 3), None
            src = images.pointers().astype(np.uint64)
        w, epilogue, want = python_pack(p, images, origins, 3)
        ip, fp, grid = native_plan.pack(desc, q, decoded, src, origins, strides)
        np.testing.assert_array_equal(ip, want.ip)
        np.testing.assert_array_equal(fp, want.fp)
        assert grid == want.grid
        # what launch passes besides the rows: the kernel, dtype, layout and whether to normalize
        assert q.interpolation == w.interpolation
        kind, nchw = (_warp_kernel._KINDS[epilogue.dtype], epilogue.layout == "NCHW") if epilogue else (0, False)
        assert (desc[3], desc[4], desc[5]) == (epilogue is not None, kind, nchw)


@pytest.mark.parametrize("channels", [1, 2, 4])
def test_other_channel_counts(channels):
    ops = [Resize(40), CenterCrop(32, fill=9.5), HorizontalFlip(), Normalize(100.0, 50.0)]
    desc = native_plan.describe(ops, channels)
    seed, epoch, idx, hw = draw_batch(channels)
    p = python_plan(ops, seed, epoch, idx, hw)
    q = native_plan.plan(desc, seed, epoch, idx, hw)
    images = arena(hw, channels)
    want = python_pack(p, images, np.zeros((len(hw), 2), dtype=np.int64), channels)[2]
    ip, fp, grid = native_plan.pack(desc, q, hw, images.pointers(), np.zeros((len(hw), 2)))
    np.testing.assert_array_equal(ip, want.ip)
    np.testing.assert_array_equal(fp, want.fp)
    assert grid == want.grid


def test_an_empty_batch():
    desc = native_plan.describe(CHAINS["imagenet-train"])
    q = native_plan.plan(desc, 1, 0, [], np.zeros((0, 2)))
    ip, fp, grid = native_plan.pack(desc, q, np.zeros((0, 2)), np.zeros(0))
    assert ip.shape == (0, 16) and grid == (0, 0, 0)
    np.testing.assert_array_equal(fp[0, :3], 0.0)
    np.testing.assert_array_equal(fp[0, 4:7], np.array(1.0) / STD)


class MyResize(Resize):
    pass


@pytest.mark.parametrize("ops", [
    [],
    [Normalize(MEAN, STD)],
    [RandomResizedCrop(224), ColorJitter(0.4, 0.4, 0.4), Normalize(MEAN, STD)],
    [Rotate(10)],
    [RandomResizedCrop(224), Rotate((-5, 5))],
    [MyResize(256), CenterCrop(224)],
    [CenterCrop(224, fill=(1, 2))],                      # two fill values for three channels
    [CenterCrop(224), Normalize((1.0, 2.0), (60.0, 60.0))],  # two means for three channels
    [Resize(8)] * 17,                                    # more ops than ING_MAX_OPS
], ids=lambda ops: "+".join(type(op).__name__ for op in ops) or "none")
def test_unsupported_chains_are_not_described(ops):
    assert native_plan.describe(ops) is None


def test_channel_counts_past_the_kernels_are_not_described():
    assert native_plan.describe([CenterCrop(8)], channels=5) is None
    assert native_plan.describe([CenterCrop(8)], channels=0) is None


def test_constants_match_the_header():
    c = native_plan.NATIVE
    assert native_plan.SAMPLE.itemsize == c.SAMPLE_BYTES
    assert (native_plan.RECORD, native_plan.MAX_OPS, native_plan.DESC_VERSION) == (c.RECORD, c.MAX_OPS,
                                                                                     c.DESC_VERSION)
    assert (native_plan.RESIZE, native_plan.CENTER_CROP, native_plan.RANDOM_RESIZED_CROP, native_plan.FLIP) == (
        c.RESIZE, c.CENTER_CROP, c.RANDOM_RESIZED_CROP, c.FLIP)
    assert (native_plan.ZOOM_OUT, native_plan.IOU_CROP, native_plan.PAD_TO, native_plan.PARAMS,
            native_plan.MAX_IOUS) == (c.ZOOM_OUT, c.IOU_CROP, c.PAD_TO, c.PARAMS, c.MAX_IOUS)
    assert (native_plan.RESIZE_SIZE, native_plan.RESIZE_SHORTER, native_plan.RESIZE_LONGER) == (
        c.RESIZE_SIZE, c.RESIZE_SHORTER, c.RESIZE_LONGER)
    assert native_plan.INTERPOLATIONS == {"nearest": c.NEAREST, "bilinear": c.BILINEAR, "bicubic": c.BICUBIC}


def test_bad_arguments_are_errors():
    desc = native_plan.describe(CHAINS["imagenet-val"])
    with pytest.raises(RuntimeError, match="size below 1"):
        native_plan.plan(desc, 0, 0, [1, 2], [[10, 10], [0, 10]])
    with pytest.raises(RuntimeError, match="negative dataset index"):
        native_plan.plan(desc, 0, 0, [-1], [[10, 10]])
    with pytest.raises(ValueError, match="seed"):
        native_plan.plan(desc, 2**64, 0, [1], [[10, 10]])
    broken = desc.copy()
    broken[0] = 99
    with pytest.raises(RuntimeError, match="does not run"):
        native_plan.plan(broken, 0, 0, [1], [[10, 10]])
    broken = desc.copy()
    broken[2 * native_plan.RECORD + 1] = 7   # no such Resize mode
    with pytest.raises(ValueError, match="malformed"):
        native_plan.plan(broken, 0, 0, [1], [[10, 10]])
    with pytest.raises(ValueError, match="bytes"):
        native_plan.NATIVE.plan(desc, 0, 2, np.zeros(1, np.int64), 0, np.ones((2, 2), np.int64),
                                np.zeros(2, native_plan.SAMPLE), None)


@pytest.mark.parametrize("sizes", [[[50, 80], [120, 50], [50, 50]], [[50, 80], [121, 60], [50, 50]]],
                         ids=["none-resamples", "one-resamples"])
def test_the_batch_filter_is_the_last_op_that_resamples_any_sample(sizes):
    ops = [HorizontalFlip(), Resize(50, interpolation="bicubic", antialias=False), Normalize(MEAN, STD)]
    hw = np.array(sizes)
    p = python_plan(ops, 3, 1, [4, 5, 6], hw)
    q = native_plan.plan(native_plan.describe(ops), 3, 1, [4, 5, 6], hw)
    assert (q.interpolation, q.antialias) == (p.warp.interpolation, p.warp.antialias)
    assert q.interpolation == ("nearest" if sizes[1] == [120, 50] else "bicubic")
    np.testing.assert_array_equal(q.samples["box"], p.warp.box)


@pytest.mark.parametrize("ops,clash", [
    ([CenterCrop(150), Flip(0.5), CenterCrop(400, fill=9)], True),          # the first crop pads small images
    ([CenterCrop(400, fill=9), CenterCrop(100)], True),                     # the last fill would paint the pad
    ([Resize(longer=256), CenterCrop(224), CenterCrop(300, fill=9)], True),   # 224 may not fit a wide image
    ([RandomResizedCrop(96), CenterCrop(60), CenterCrop(128, fill=9)], False),   # 60 always fits in 96
    ([Resize((64, 64)), HorizontalFlip(), CenterCrop(64), CenterCrop(80, fill=9)], False),
    ([CenterCrop(150, fill=(9, 9, 9)), CenterCrop(400, fill=9), Resize(120)], False),   # one colour
    ([CenterCrop(150), Resize(120), Normalize(MEAN, STD)], False),
], ids=lambda v: "+".join(type(op).__name__ for op in v) if isinstance(v, list) else str(v))
def test_the_native_engine_refuses_fills_one_warp_cannot_give(ops, clash):
    """The native planner fills a batch's one warp with the chain's last fill, as the Python planner's warps
    before it split a run where an op of another fill follows one that padded: such chains stay on the Python
    engine, with the reason."""
    assert native_plan.describe(ops) is not None
    chain, why = native.chain_for(object(), ops)   # no table: refused for that, after the chain's own checks
    assert chain is None
    assert ("one warp has one fill" in why) == clash, why
    if clash:
        small = planner.plan(ops, [(40, 30), (500, 600)], 0)
        assert len([st for st in small.stages if st.warp is not None]) == 2   # what the Python planner does


# -- detection chains, with boxes --------------------------------------------------------------------------------

DETECTION = {
    "ssd": [ZoomOut(), RandomIoUCrop(), HorizontalFlip(), Resize(800, max_size=1333)],
    "bench-detection": [RandomIoUCrop(min_ious=(None, 0.0, 0.1, 0.3, 0.5, 0.7, 0.9), attempts=50), Flip(0.5),
                        Resize(800, max_size=1333), PadTo(multiple=32)],
    "zoom-pad-normalize": [ZoomOut((1.0, 2.5), fill=(10, 20, 30), p=0.7), RandomIoUCrop((None, 0.0, 0.5, 0.9)),
                           Flip(0.5, vertical=True), Resize(300, max_size=400, interpolation="bicubic"),
                           PadTo(multiple=32, fill=(10, 20, 30)), Normalize(MEAN, STD)],
    "letterbox": [RandomIoUCrop(attempts=3, rounds=2), Resize(longer=320), PadTo(320, center=True),
                  PadTo(multiple=7)],
    "batch-padded": [ZoomOut(p=0.3), RandomIoUCrop(), Flip(0.5), Resize(300, max_size=500),
                     PadTo(multiple=32, batch=True), Normalize(MEAN, STD)],
    "batch-padded-first": [PadTo(batch=True, center=True), RandomIoUCrop(), PadTo((50, 60), multiple=16, batch=True)],
    "rrc-then-iou": [RandomResizedCrop(300), RandomIoUCrop(scale=(0.5, 1.0)), PadTo((310, 330), multiple=8)],
    # a high threshold, few trials: most samples give up and stay whole
    "iou-gives-up": [Resize(200), ZoomOut(p=1.0), RandomIoUCrop((0.95,), attempts=1, rounds=1), HorizontalFlip()],
}


def random_boxes(rng: np.random.Generator, hw: np.ndarray) -> list[np.ndarray]:
    """Per sample 0 to 12 ltrb boxes in pixels of its size: most inside, some empty, inverted, thin or past the
    image; a fifth of the samples have none."""
    out = []
    for h, w in hw.tolist():
        k = 0 if rng.random() < 0.2 else int(rng.integers(1, 13))
        x = np.sort(rng.uniform(-0.2, 1.2, (k, 2)) * w, axis=1)
        y = np.sort(rng.uniform(-0.2, 1.2, (k, 2)) * h, axis=1)
        b = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], axis=1)
        odd = rng.random(k)
        b[odd < 0.1, 2] = b[odd < 0.1, 0]                       # empty
        b[(odd >= 0.1) & (odd < 0.2)] = b[(odd >= 0.1) & (odd < 0.2)][:, [2, 3, 0, 1]]   # inverted
        b[(odd >= 0.2) & (odd < 0.3)] += 5 * max(h, w)          # wholly outside
        b[(odd >= 0.3) & (odd < 0.4)] = np.round(b[(odd >= 0.3) & (odd < 0.4)])   # whole pixels
        out.append(b)
    return out


def detection_sizes(rng, n):
    hw = rng.integers(20, 900, (n, 2))
    hw[rng.random(n) < 0.1] = rng.integers(1, 4, 2)   # tiny
    return hw


def check_detection(ops, seed, epoch, idx, hw, boxes, min_size=0.0):
    """The native plan of ``ops`` with ``boxes`` equals the Python planner's: draws, sizes, warp, kept boxes."""
    desc = native_plan.describe(ops, batch_wide=True)
    assert desc is not None
    given = None if boxes is None else BoxBatch.of(boxes)
    p = planner.plan(ops, hw, SampleRandom.keyed(seed, epoch, idx), boxes=given)
    q = native_plan.plan(desc, seed, epoch, idx, hw, given, min_size=min_size)
    (stage,) = p.stages   # one warp (the chains have one fill)
    w, s = stage.warp, q.samples
    np.testing.assert_array_equal(s["out_hw"], np.array(p.out_sizes).reshape(-1, 2))
    content = p.content_sizes if p.content_sizes is not None else p.out_sizes
    np.testing.assert_array_equal(s["content_hw"], np.array(content).reshape(-1, 2))
    np.testing.assert_array_equal(s["region"], w.regions())
    np.testing.assert_array_equal(s["matrix"].reshape(-1, 2, 3), w.matrix[:, :2])
    np.testing.assert_array_equal(s["box"], w.box)
    np.testing.assert_array_equal(s["inside"], w.inside)
    np.testing.assert_array_equal(s["readable"], w.readable)
    np.testing.assert_array_equal(s["valid"], w.valid)
    assert (q.interpolation, q.antialias) == (w.interpolation, w.antialias)
    for k, ((op, params), steps) in enumerate(zip(stage.drawn, stage.steps)):
        got = q.params[:, k]
        if isinstance(op, (RandomResizedCrop, RandomIoUCrop, ZoomOut, Flip)):
            params = np.asarray(params, dtype=np.int64)
            np.testing.assert_array_equal(got[:, :params.shape[1]], params)
            np.testing.assert_array_equal(got[:, params.shape[1]:], 0)
        else:
            np.testing.assert_array_equal(got[:, :2], steps.out_sizes)
    if given is None:
        assert q.boxes is None and q.kept is None
        return p, q
    mapped, keep = p.map_box_batch(given, min_size=min_size)
    np.testing.assert_array_equal(q.boxes.starts, mapped.starts)
    np.testing.assert_array_equal(q.boxes.flat, mapped.flat)
    np.testing.assert_array_equal(q.kept, np.flatnonzero(keep))
    return p, q


@pytest.mark.parametrize("engine", ["native", "numpy"])
@pytest.mark.parametrize("name", sorted(DETECTION))
def test_detection_plan_matches_the_python_planner(name, engine, monkeypatch):
    """Draws (RandomIoUCrop's on the boxes as ZoomOut and the ops before it left them), output and content
    sizes, the warp, and the boxes kept, with their rows, for random batches; "numpy": against the Python
    planner's numpy draws and box maps, not ingest.ops._boxes (whose core plan.c shares)."""
    if engine == "numpy":
        monkeypatch.setattr(rnd, "NATIVE", None)
        monkeypatch.setattr(detection, "NATIVE", None)
        monkeypatch.setattr(affine, "_boxes", None)
    ops = DETECTION[name]
    rng = np.random.default_rng(len(name))
    kept = given = gave_up = 0
    for trial in range(10):
        n = int(rng.integers(1, 40))
        seed, epoch, idx = int(rng.integers(0, 2**63)), int(rng.integers(0, 100)), rng.integers(0, 2**40, n)
        hw = detection_sizes(rng, n)
        boxes = random_boxes(rng, hw)
        p, q = check_detection(ops, seed, epoch, idx, hw, boxes, min_size=[0.0, 2.5][trial % 2])
        kept, given = kept + len(q.kept), given + sum(map(len, boxes))
        crops = [params for op, params in p.drawn if isinstance(op, RandomIoUCrop)]
        gave_up += int(((crops[0][:, 4] == 0) & (np.array(list(map(len, boxes))) > 0)).sum())
    assert 0 < kept < given   # boxes both kept and dropped
    if name == "iou-gives-up":
        assert gave_up > 0


@pytest.mark.parametrize("name", sorted(DETECTION))
def test_detection_pack_matches_the_warp_kernel_arguments(name):
    ops = DETECTION[name]
    desc = native_plan.describe(ops, batch_wide=True)
    rng = np.random.default_rng(3)
    for trial in range(3):
        n = int(rng.integers(1, 20))
        hw = detection_sizes(rng, n)
        idx = rng.integers(0, 1000, n)
        p, q = check_detection(ops, trial, 2, idx, hw, random_boxes(rng, hw))
        images = arena(hw, 3)
        w, epilogue, want = python_pack(p, images, None, 3)
        ip, fp, grid = native_plan.pack(desc, q, hw, images.pointers().astype(np.uint64))
        np.testing.assert_array_equal(ip, want.ip)
        np.testing.assert_array_equal(fp, want.fp)
        assert grid == want.grid


def test_detection_edge_cases():
    ops = DETECTION["ssd"]
    hw = np.array([[300, 400], [50, 60], [1, 1], [640, 480]])
    idx = np.arange(4)
    # no boxes given: RandomIoUCrop keeps every image whole, as the Python planner does without boxes
    _, q = check_detection(ops, 5, 0, idx, hw, None)
    assert (q.params[:, 1, 4] == 0).all()
    # samples without boxes
    _, q = check_detection(ops, 5, 0, idx, hw, [np.zeros((0, 4))] * 4)
    assert len(q.kept) == 0 and (q.params[:, 1, 4] == 0).all()
    # every box pruned: outside every image (before a ZoomOut could bring it in), or narrower than min_size
    outside = [np.array([[5000.0, 5000, 5100, 5100], [-50, -50, -1, -1]])] * 4
    _, q = check_detection(DETECTION["bench-detection"], 5, 0, idx, hw, outside)
    assert len(q.kept) == 0 and q.boxes.starts.tolist() == [0] * 5
    inside = [np.array([[0.0, 0, 1, 1], [0, 0, w / 2, h / 2]]) for h, w in hw.tolist()]
    _, q = check_detection(ops, 5, 0, idx, hw, inside, min_size=1e6)
    assert len(q.kept) == 0
    # degenerate boxes: empty and a point (dropped by the first map), inverted (the map's corners right it)
    odd = [np.array([[10.0, 10, 10, 40], [40, 40, 10, 10], [7, 7, 7, 7], [0, 0, w, h]]) for h, w in hw.tolist()]
    _, q = check_detection(ops, 9, 3, idx, hw, odd)
    assert set(q.kept.tolist()) <= {1, 3, 5, 7, 9, 11, 13, 15} and {1, 5, 9, 13} & set(q.kept.tolist())


def test_detection_chains_not_described():
    # a batch-wide pad only where asked: the native engine sizes its output ring once
    assert native_plan.describe([RandomIoUCrop(), PadTo(multiple=32, batch=True)]) is None
    assert native_plan.describe([RandomIoUCrop(), PadTo(multiple=32, batch=True)], batch_wide=True) is not None
    chain, why = native.chain_for(object(), [Resize(100), PadTo(batch=True)])
    assert chain is None and "not one the native planner runs" in why
    assert native_plan.describe([RandomIoUCrop(tuple(v / 10 for v in range(9)))]) is None   # 9 thresholds
    assert native_plan.describe([RandomIoUCrop(tuple(v / 10 for v in range(8)))]) is not None


def test_boxes_must_match_the_batch():
    desc = native_plan.describe(DETECTION["ssd"])
    with pytest.raises(ValueError, match="boxes for 1 samples"):
        native_plan.plan(desc, 0, 0, [1, 2], [[10, 10], [10, 10]], [np.zeros((1, 4))])
    samples = np.zeros(1, native_plan.SAMPLE)
    with pytest.raises(ValueError, match="sum to 2"):
        native_plan.NATIVE.plan(desc, 0, 1, np.zeros(1, np.int64), 0, np.ones((1, 2), np.int64), samples, None,
                                np.zeros((1, 4)), np.array([2]), 0.0, np.zeros((1, 4)), np.zeros(1, np.int64),
                                np.zeros(1, np.int64))


@pytest.mark.parametrize("name", sorted(DETECTION))
def test_the_native_planner_makes_the_python_planners_plan(name):
    """`native_plan.Planner.plan` in place of `planner.plan`: the same Plan where the pipeline reads it (draws,
    sizes, the warp), so the same images on the CPU's op-by-op path and through the warp, boxes and masks."""
    ops = DETECTION[name]
    pixels = ImageSpec(torch.uint8, None, 3)
    native = native_plan.Planner.of(ops, pixels)
    rng = np.random.default_rng(11)
    for trial in range(3):
        n = int(rng.integers(1, 6))
        hw = rng.integers(8, 90, (n, 2))
        given = BoxBatch.of(random_boxes(rng, hw))
        idx = rng.integers(0, 1000, n)
        p = planner.plan(ops, hw, SampleRandom.keyed(trial, 1, idx), boxes=given, pixels=pixels)
        q = native.plan(hw, SampleRandom.keyed(trial, 1, idx), given)
        assert (q.sizes, q.out_sizes, q.content_sizes, q.output) == (p.sizes, p.out_sizes, p.content_sizes, p.output)
        for (op, a), (op2, b) in zip(p.drawn, q.drawn):
            assert op is op2 and (a is None) == (b is None)
            if a is not None:
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(a, b)
        (ps,), (qs,) = p.stages, q.stages
        assert [op for op, _ in ps.drawn] == [op for op, _ in qs.drawn] and ps.epilogue is qs.epilogue
        for f in ("matrix", "box", "valid", "readable", "inside"):
            np.testing.assert_array_equal(getattr(qs.warp, f), getattr(ps.warp, f))
        assert (qs.warp.out_sizes, qs.warp.source_sizes, qs.warp.fill, qs.warp.interpolation, qs.warp.antialias) == (
            ps.warp.out_sizes, ps.warp.source_sizes, ps.warp.fill, ps.warp.interpolation, ps.warp.antialias)
        images = [torch.from_numpy(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in hw.tolist()]
        for want, got in zip(as_list(p.execute(images)), as_list(q.execute(images))):
            assert torch.equal(want, got)
        smaller = [im[: max(1, im.shape[0] // 2), : max(1, im.shape[1] // 2)] for im in images]   # the warp's path
        for want, got in zip(as_list(p.execute(smaller)), as_list(q.execute(smaller))):
            assert torch.equal(want, got)
        for a, b in zip(p.map_box_batch(given, min_size=1.5), q.map_box_batch(given, min_size=1.5)):
            np.testing.assert_array_equal(getattr(a, "flat", a), getattr(b, "flat", b))
        masks = [torch.from_numpy(rng.integers(0, 2, (2, h, w), dtype=np.uint8)) for h, w in hw.tolist()]
        for want, got in zip(p.warp_masks(masks), q.warp_masks(masks)):
            assert torch.equal(want, got)


def test_the_native_planner_takes_chains_of_one_fill():
    spec = ImageSpec(torch.uint8, None, 3)
    assert native_plan.Planner.of([ZoomOut(fill=3), RandomIoUCrop(), PadTo(multiple=32, fill=3)], spec) is not None
    assert native_plan.Planner.of([ZoomOut(fill=3), RandomIoUCrop(), PadTo(multiple=32)], spec) is None
    assert native_plan.Planner.of([Rotate(10)], spec) is None
    assert native_plan.Planner.of([ZoomOut()], ImageSpec(torch.uint16, None, 3)) is None


def test_a_native_plan_moves_only_what_it_was_planned_with():
    """It keeps no per-op steps: other boxes and polygons are refused, not left where they were."""
    ops = DETECTION["ssd"]
    hw = np.array([[40, 50], [60, 30]])
    given = BoxBatch.of([np.array([[1.0, 2, 20, 30]]), np.zeros((0, 4))])
    q = native_plan.Planner.of(ops, ImageSpec(torch.uint8, None, 3)).plan(hw, SampleRandom.keyed(0, 0, [1, 2]), given)
    q.map_box_batch(given)
    with pytest.raises(ValueError, match="no per-op steps"):
        q.map_box_batch(BoxBatch.of([np.array([[1.0, 2, 20, 30]]), np.zeros((0, 4))]))
    with pytest.raises(ValueError, match="no per-op steps"):
        q.map_polygons([[[[1, 2, 10, 2, 10, 10]]], []])
