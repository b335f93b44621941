"""A detection batch's box work as whole-batch arrays equals the per-sample reference (`detection_reference`):
the same draws (RandomIoUCrop's crops included), the same boxes to the last bit, the same kept boxes and
per-box fields, with and without the compiled `ingest.ops._boxes`, on random batches that include empty
batches, samples without boxes, degenerate boxes, boxes outside their image and batches whose every box
is dropped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import detection_reference as ref
from ingest.ops import (CenterCrop, ColorJitter, Flip, HorizontalFlip, PadTo, RandomIoUCrop, Resize, Rotate, ZoomOut,
                        affine, detection, plan)
from ingest.ops.boxes import BoxBatch, from_ltrb, to_ltrb
from ingest.random import SampleRandom

CHAINS = [
    lambda: [ZoomOut(), RandomIoUCrop(), HorizontalFlip(), Resize(800, max_size=1333)],
    lambda: [RandomIoUCrop(min_ious=(0.9,), attempts=3, rounds=2), Flip(horizontal=True, vertical=True)],
    lambda: [RandomIoUCrop(min_ious=(None, 0.0, 1.0), scale=(0.1, 0.5), aspect=(0.2, 5.0))],
    lambda: [CenterCrop(20), RandomIoUCrop(), Resize(64)],   # a small crop first: many samples lose every box
    lambda: [Rotate((-40, 40), expand=True), RandomIoUCrop(), PadTo(multiple=32)],
    lambda: [ZoomOut(p=1.0), ColorJitter(0.2), RandomIoUCrop(attempts=1), PadTo(100, center=True, batch=True)],
]


def _coordinate(limit: int):
    # inside, on the border, outside, and a few exact repeats (degenerate boxes come from equal ends)
    return st.one_of(st.integers(-20, limit + 20).map(float), st.floats(-30, limit + 30, allow_nan=False))


@st.composite
def batches(draw, max_samples: int = 10, max_boxes: int = 12):
    n = draw(st.integers(0, max_samples))
    sizes = [(draw(st.integers(1, 400)), draw(st.integers(1, 400))) for _ in range(n)]
    boxes = []
    for h, w in sizes:
        k = draw(st.integers(0, max_boxes))
        rows = []
        for _ in range(k):
            x0, x1 = sorted((draw(_coordinate(w)), draw(_coordinate(w))))
            y0, y1 = sorted((draw(_coordinate(h)), draw(_coordinate(h))))
            rows.append([x0, y0, x1, y1])
        boxes.append(np.array(rows, dtype=np.float64).reshape(-1, 4))
    return sizes, boxes, draw(st.integers(0, 2 ** 63 - 1))


@pytest.fixture(params=["native", "numpy"])
def engine(request, monkeypatch):
    if request.param == "native":
        if detection.NATIVE is None:
            pytest.skip("ingest.ops._boxes was not built")
    else:
        monkeypatch.setattr(detection, "NATIVE", None)
        monkeypatch.setattr(affine, "_boxes", None)
    return request.param


def _keys(seed: int, n: int) -> np.ndarray:
    return SampleRandom.keyed(seed, 0, np.arange(n)).keys


def _same(a, b) -> None:
    a, b = (x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in (a, b))
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


def _same_params(a, b) -> None:
    if isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same_params(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same_params(a[k], b[k])
    elif a is None or isinstance(a, (int, float, str)):
        assert a == b
    else:
        _same(a, b)


def _targets(boxes, seed: int, kinds: str) -> list[dict]:
    """Targets with per-box fields of the kinds named (n: numpy, t: tensor, l: list)."""
    g = np.random.default_rng(seed % (1 << 32))
    out = []
    for n, b in enumerate(boxes):
        k = len(b)
        kind = kinds[n % len(kinds)]
        labels = g.integers(0, 90, k)
        area = g.random(k).astype(np.float32)
        t = {"boxes": b, "image_id": n, "iscrowd": np.zeros(k, np.int64)}
        t["labels"] = (labels if kind == "n" else torch.from_numpy(labels) if kind == "t" else labels.tolist())
        t["area"] = area if kind != "l" else area.tolist()
        out.append(t)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=batches(), chain=st.integers(0, len(CHAINS) - 1), min_size=st.sampled_from([0.0, 0.0, 3.0]),
       kinds=st.sampled_from(["n", "t", "l", "nt", "ntl"]))
def test_batch_targets_equal_the_per_sample_reference(engine, batch, chain, min_size, kinds):
    sizes, boxes, seed = batch
    ops = CHAINS[chain]()
    keys = _keys(seed, len(sizes))
    p = plan(ops, sizes, SampleRandom(keys), boxes=boxes)
    for (_, got), want in zip(p.drawn, ref.drawn(ops, sizes, SampleRandom(keys), boxes)):
        _same_params(got, want)
    targets = _targets(boxes, seed, kinds)
    want = ref.targets(p, targets, min_size=min_size)
    got = p.targets(targets, min_size=min_size)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for name in ("boxes", "labels", "iscrowd"):
            if isinstance(w[name], list):
                assert g[name] == w[name]
            else:
                _same(g[name], w[name])
        assert list(np.asarray(g["area"])) == list(np.asarray(w["area"]))
    mapped, keep = p.map_boxes(boxes, min_size=min_size)
    want_mapped, want_keep = ref.map_boxes_plan(p, boxes, min_size=min_size)
    for a, b, c, d in zip(mapped, want_mapped, keep, want_keep):
        _same(a, b)
        _same(c, d)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=batches(), fmt=st.sampled_from(["ltrb", "xywh"]), relative=st.booleans())
def test_the_pipelines_batch_form_equals_its_per_sample_form(engine, batch, fmt, relative):
    """`Pipeline._plan` and `_targets`: boxes of the reader's format to absolute ltrb, the plan drawn on
    them, the targets mapped back, as the per-sample conversions and `Plan.targets` gave them."""
    sizes, boxes, seed = batch
    ops = CHAINS[0]()
    source = [(b / np.array([w, h, w, h]) if relative else b).astype(np.float32) for b, (h, w) in zip(boxes, sizes)]
    keys = _keys(seed, len(sizes))
    ltrb = [ref.to_ltrb(b, s, fmt, relative) for b, s in zip(source, sizes)]
    batch_ltrb = to_ltrb(BoxBatch.of(source), np.array(sizes, dtype=np.int64).reshape(-1, 2), fmt, relative)
    for a, b in zip(batch_ltrb.per_sample(), ltrb):
        _same(a, b)
    fields = [{"categories": np.arange(len(b)), "image_id": 1} for b in boxes]
    p_ref = plan(ops, sizes, SampleRandom(keys), boxes=ltrb)
    want = ref.targets(p_ref, [dict(f, boxes=b) for f, b in zip(fields, ltrb)], per_box=["categories"])
    p = plan(ops, sizes, SampleRandom(keys), boxes=batch_ltrb)
    got = p.batch_targets(fields, batch_ltrb, per_box=["categories"], box_format=fmt, relative=relative)
    for g, w, size in zip(got, want, p.out_sizes):
        _same(g["boxes"], ref.from_ltrb(w["boxes"], size, fmt, relative))
        _same(g["categories"], w["categories"])
        assert g["image_id"] == 1


@settings(max_examples=50, deadline=None)
@given(batch=batches(max_samples=16, max_boxes=20), attempts=st.integers(1, 60), rounds=st.integers(1, 12),
       min_ious=st.lists(st.one_of(st.none(), st.floats(0, 1)), min_size=1, max_size=8))
def test_iou_crop_draws_equal_the_reference_natively_and_in_numpy(batch, attempts, rounds, min_ious):
    sizes, boxes, seed = batch
    op = RandomIoUCrop(min_ious=tuple(min_ious), attempts=attempts, rounds=rounds)
    keys = _keys(seed, len(sizes))
    want = ref.iou_crop_draw(op, sizes, SampleRandom(keys), boxes)
    native = detection.NATIVE
    try:
        for engine in ([native] if native is not None else []) + [None]:
            detection.NATIVE = engine
            rngs = SampleRandom(keys)
            _same(op.draw(sizes, rngs, boxes=BoxBatch.of(boxes)), want)
            assert rngs.calls == 1   # one call of the batch's stream, whatever the rounds took
    finally:
        detection.NATIVE = native


@pytest.mark.parametrize("engine_", ["native", "numpy"])
def test_a_batch_whose_every_box_is_dropped(engine_, monkeypatch):
    if engine_ == "numpy":
        monkeypatch.setattr(detection, "NATIVE", None)
        monkeypatch.setattr(affine, "_boxes", None)
    sizes = [(50, 60), (40, 40), (30, 70)]
    boxes = [np.array([[-30.0, -30, -10, -10], [100, 0, 120, 10]]), np.zeros((0, 4)), np.array([[5.0, 5, 5, 9]])]
    targets = [{"boxes": b, "labels": np.arange(len(b)), "area": np.ones(len(b), np.float32)} for b in boxes]
    p = plan([RandomIoUCrop(), Flip(p=1.0)], sizes, 7, boxes=boxes)
    got, want = p.targets(targets), ref.targets(p, targets)
    for g, w in zip(got, want):
        for name in ("boxes", "labels", "area"):
            _same(g[name], w[name])
            assert len(g[name]) == 0


def test_box_batches_join_convert_and_select():
    b = BoxBatch.of([np.zeros((0,)), np.array([[1, 2, 3, 4]], np.float32), [[0, 0, 1, 1], [2, 2, 3, 3]]])
    assert b.flat.dtype == np.float64 and b.starts.tolist() == [0, 0, 1, 3] and b.counts.tolist() == [0, 1, 2]
    assert b.owner.tolist() == [1, 2, 2]
    kept = b.select(np.array([True, False, True]))
    assert kept.starts.tolist() == [0, 0, 1, 2] and kept.flat.tolist() == [[1, 2, 3, 4], [2, 2, 3, 3]]
    assert [len(x) for x in b.per_sample()] == [0, 1, 2]
    assert BoxBatch.of(b) is b and len(BoxBatch.of([])) == 0
    xywh = from_ltrb(b, np.array([[10, 20]] * 3), "xywh", relative=True)
    assert xywh.dtype == np.float32
    np.testing.assert_array_equal(xywh[0], np.float32([1 / 20, 2 / 10, 2 / 20, 2 / 10]))
    with pytest.raises(ValueError, match=r"boxes must be \[K, 4\]"):
        BoxBatch.of([np.zeros((2, 3))])


def test_native_map_boxes_keeps_nan_and_the_clip_of_numpy():
    if affine._boxes is None:
        pytest.skip("ingest.ops._boxes was not built")
    steps = Rotate(30, expand=True).steps([(50, 80)] * 2, np.array([30.0, 30.0]))
    boxes = np.array([[np.nan, 0, 10, 10], [-5, -5, 200, 200], [10, 10, 10, 20], [1, 2, 3, 4]])
    owner = np.array([0, 0, 1, 1])
    got, kept = affine.map_boxes_kept(steps, boxes, owner)
    want = affine.map_boxes(steps, boxes, owner)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(kept, affine.nonempty(want))
    with pytest.raises(ValueError, match="belongs to sample 2"):
        affine._boxes.map_boxes(boxes, np.array([0, 0, 1, 2]), np.linalg.inv(steps.matrix), steps.out_sizes,
                                np.empty((4, 4)), np.empty(4, dtype=bool))


@pytest.mark.parametrize("chain", [1, 4, 5])
def test_the_batched_mask_warp_equals_the_per_sample_one(chain):
    """The CUDA path's arithmetic of planes and offsets (one buffer for the batch's masks, one warp per stage),
    run here on the CPU through the resample reference, against the CPU path (a gather per sample)."""
    from ingest.ops.planner import _MaskBatch
    g = np.random.default_rng(chain)
    sizes = [(int(h), int(w)) for h, w in g.integers(5, 60, (5, 2))]
    counts = [3, 0, 1, 4, 2]
    masks = [(g.random((k, h, w)) < 0.3).astype(np.uint8) for k, (h, w) in zip(counts, sizes)]
    p = plan(CHAINS[chain](), sizes, 11, boxes=[np.zeros((0, 4))] * len(sizes))
    batch = _MaskBatch.of(masks, torch.device("cpu"))
    for stage in p.stages:
        if stage.warp is not None:
            batch = batch.warped(stage.warp.for_masks())
    got = batch.per_sample()
    want = p.warp_masks(masks)
    for a, b in zip(got, want):
        _same(a, b)
    with pytest.raises(ValueError, match="masks must be uint8"):
        _MaskBatch.of([m.astype(np.float32) for m in masks], torch.device("cpu"))
