"""Polygon segmentations follow the geometry ops like boxes: vertices mapped through each op's map, parts
clipped to each op's output (Sutherland-Hodgman), degenerate parts dropped, objects pruned with their boxes;
RLE entries warped like masks. Checked against coordinates computed by hand and against the boxes."""

import json

import numpy as np
import pytest
import torch
from conftest import realworld
from hypothesis import given, settings
from hypothesis import strategies as st
from pycocotools import mask as mask_utils
from test_detection import _coco

import ingest
from ingest.formats.coco import CocoSource
from ingest.ops import CenterCrop, Flip, PadTo, RandomIoUCrop, Resize, Rotate, ZoomOut, plan, resample
from ingest.ops.base import as_list
from ingest.ops.affine import clip_polygons, polygon_parts_kept
from ingest.ops.planner import scale_polygons


def _clip(poly, h, w):
    pts = np.asarray(poly, dtype=np.float64).reshape(-1, 2)
    out, part = clip_polygons(pts, np.zeros(len(pts), dtype=np.int64), np.tile([h, w], (len(pts), 1)))
    out, part = polygon_parts_kept(out, part)
    return out


def _area(flat):
    p = np.asarray(flat, dtype=np.float64).reshape(-1, 2)
    x, y = p[:, 0], p[:, 1]
    return abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) / 2


def test_sutherland_hodgman_against_the_rectangle():
    # a triangle poking out of the right side of a 10x10 image: its tip is cut off along x = 10
    got = _clip([2, 2, 14, 6, 2, 10], 10, 10)
    np.testing.assert_allclose(got, [[2, 2], [10, 2 + 4 * 8 / 12], [10, 6 + 4 * 4 / 12], [2, 10]], rtol=1e-12)
    # a square covering the whole image becomes the image's rectangle
    assert sorted(map(tuple, _clip([-5, -5, 20, -5, 20, 20, -5, 20], 10, 8))) == [(0, 0), (0, 10), (8, 0), (8, 10)]
    # wholly outside: nothing; touching the image along its left side only: a line, dropped
    assert len(_clip([12, 1, 15, 1, 15, 4], 10, 10)) == 0
    assert len(_clip([-3, 1, 0, 1, 0, 4, -3, 4], 10, 10)) == 0
    # inside: unchanged
    assert _clip([1, 1, 4, 1, 4, 3], 10, 10).tolist() == [[1, 1], [4, 1], [4, 3]]


def test_flip_and_resize_move_a_polygon_to_known_coordinates():
    p = plan([Flip(p=1.0), Resize((30, 160))], [(60, 80)], 0)
    polys = [[[4, 10, 34, 10, 19, 30]], None, [[0, 0, 100, 0, 100, 100]]]
    out = p.targets([{"boxes": np.array([[4, 10, 34, 30], [0, 0, 8, 8], [0, 0, 80, 60]]),
                      "polygons": json.dumps(polys)}])[0]
    got = json.loads(out["polygons"])   # text in, text out
    # x' = (80 - x) * 2, y' = y / 2
    assert got[0] == [[152, 5, 92, 5, 122, 15]]
    assert got[1] is None
    # the triangle y <= x reaches outside the 80x60 image: clipped to it first, then moved
    assert sorted(map(tuple, np.reshape(got[2], (-1, 2)).tolist())) == [(0, 0), (0, 30), (40, 30), (160, 0)]


def test_a_crop_clips_and_a_pruned_box_drops_its_polygon():
    p = plan([CenterCrop((20, 20))], [(40, 40)], 0)   # keeps [10, 30) x [10, 30)
    boxes = np.array([[0, 0, 5, 5], [5, 12, 25, 18], [12, 12, 16, 16]], dtype=np.float32)
    polys = [[[0, 0, 5, 0, 5, 5]], [[5, 12, 25, 12, 25, 18, 5, 18]],
             [[12, 12, 16, 12, 16, 16], [13, 13, 14, 13, 14, 14]]]
    out = p.targets([{"boxes": boxes, "polygons": polys, "area": np.array([1.0, 2.0, 3.0])}])[0]
    np.testing.assert_allclose(out["boxes"], [[0, 2, 15, 8], [2, 2, 6, 6]])
    assert out["area"].tolist() == [2.0, 3.0]   # pruned with the box, value kept
    assert len(out["polygons"]) == 2            # the first object (outside the crop) is gone with its box
    assert sorted(map(tuple, np.reshape(out["polygons"][0], (-1, 2)).tolist())) == [(0, 2), (0, 8), (15, 2), (15, 8)]
    assert out["polygons"][1] == [[2, 2, 6, 2, 6, 6], [3, 3, 4, 3, 4, 4]]   # both parts, moved


def test_iou_crop_prunes_polygons_with_the_boxes_centre_rule():
    boxes = np.array([[2, 2, 12, 12], [60, 40, 78, 58]], dtype=np.float64)
    polys = [[[2, 2, 12, 2, 12, 12, 2, 12]], [[60, 40, 78, 40, 78, 58, 60, 58]]]
    for seed in range(30):
        p = plan([RandomIoUCrop()], [(60, 80)], seed, boxes=[boxes])
        out = p.targets([{"boxes": boxes, "polygons": polys}])[0]
        assert len(out["polygons"]) == len(out["boxes"])
        for box, poly in zip(out["boxes"], out["polygons"]):
            xy = np.reshape(poly, (-1, 2))
            np.testing.assert_allclose([*xy.min(0), *xy.max(0)], box, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), h=st.integers(20, 90), w=st.integers(20, 90))
def test_rectangles_stay_their_boxes_through_any_axis_aligned_ops(seed, h, w):
    """A rectangle's polygon and its box go through the same maps and clips, so the polygon stays the
    box's rectangle whatever the ops (an independent path: boxes map corners, polygons clip vertices)."""
    rng = np.random.default_rng(seed)
    x0, y0 = rng.uniform(0, w - 2), rng.uniform(0, h - 2)
    boxes = np.array([[x0, y0, rng.uniform(x0 + 1, w), rng.uniform(y0 + 1, h)] for _ in range(4)])
    polys = [[[a, b, c, b, c, d, a, d]] for a, b, c, d in boxes.tolist()]
    ops = [ZoomOut(p=0.5), RandomIoUCrop(), Flip(horizontal=True, vertical=True, p=0.5), Resize(37, max_size=70),
           PadTo(multiple=16, center=bool(seed % 2))]
    p = plan(ops, [(h, w)], seed, boxes=[boxes])
    out = p.targets([{"boxes": boxes, "polygons": polys}])[0]
    assert len(out["polygons"]) == len(out["boxes"])
    for box, poly in zip(out["boxes"], out["polygons"]):
        (part,) = poly
        xy = np.reshape(part, (-1, 2))
        np.testing.assert_allclose([*xy.min(0), *xy.max(0)], box, atol=1e-6)
        assert _area(part) == pytest.approx((box[2] - box[0]) * (box[3] - box[1]), rel=1e-6)


def test_a_rotation_clips_to_the_output():
    p = plan([Rotate(90)], [(40, 40)], 0)   # a square image: the whole of it stays in view
    out = p.map_polygons([[[[0, 0, 10, 0, 10, 10, 0, 10]], [[-10, -10, 50, -10, 50, 50, -10, 50]]]])[0]
    assert _area(out[0][0]) == pytest.approx(100)
    assert _area(out[1][0]) == pytest.approx(1600)   # clipped to the 40x40 output
    xy = np.reshape(out[0][0], (-1, 2))
    # counter-clockwise about the centre: the top-left corner goes to the bottom-left
    np.testing.assert_allclose([*xy.min(0), *xy.max(0)], [0, 30, 10, 40], atol=1e-9)


def test_rle_entries_are_warped_like_masks():
    mask = np.zeros((60, 80), dtype=np.uint8)
    mask[10:30, 4:34] = 1
    mask[40:45, 70:80] = 1
    rle = mask_utils.encode(np.asfortranarray(mask))
    compressed = {"size": [60, 80], "counts": rle["counts"].decode("ascii")}
    uncompressed = {"size": [60, 80], "counts": _uncompressed(mask)}
    p = plan([Flip(p=1.0), ZoomOut(p=1.0), Resize((50, 70))], [(60, 80)], 3)
    want = p.warp_masks([mask[None]])[0][0].numpy()
    for entry in (compressed, uncompressed):
        (got,) = p.map_polygons([[entry]])[0]
        assert got["size"] == [50, 70] and isinstance(got["counts"], str)
        np.testing.assert_array_equal(mask_utils.decode({"size": got["size"], "counts": got["counts"].encode()}),
                                      want)
    with pytest.raises(ValueError, match="image's size"):
        p.map_polygons([[{"size": [10, 10], "counts": compressed["counts"]}]])


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31), h=st.integers(8, 90), w=st.integers(8, 90), out=st.integers(4, 160))
def test_cpu_mask_warp_equals_the_resample_reference(seed, h, w, out):
    """Masks and RLEs of crops, flips, resizes and pads take a per-row/per-column gather on the CPU; it
    gives exactly the resampler's nearest sampling (fill 0), which rotations still use."""
    rng = np.random.default_rng(seed)
    masks = torch.from_numpy((rng.random((3, h, w)) > 0.5).astype(np.uint8))
    ops = [ZoomOut(p=0.5), RandomIoUCrop(), Flip(horizontal=True, vertical=True, p=0.5),
           Resize(out, max_size=4 * out), PadTo(multiple=16, center=bool(seed % 2)), CenterCrop(out)]
    p = plan(ops, [(h, w)], seed, boxes=[np.array([[0.5, 0.5, w - 0.5, h - 0.5]])])
    warp = p.stages[0].warp.for_masks()
    want = as_list(resample.warp([masks.permute(1, 2, 0)], warp))[0].permute(2, 0, 1)
    assert torch.equal(p.warp_masks([masks])[0], want)


def _uncompressed(mask):
    """COCO's uncompressed RLE counts (column-major runs, starting with zeros)."""
    flat = mask.ravel(order="F")
    edges = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.r_[0, edges, flat.size]).tolist()
    return ([0] + runs) if flat[0] else runs


def test_bad_polygons_raise_value_errors():
    p = plan([Flip(p=1.0)], [(10, 10)], 0)
    with pytest.raises(ValueError, match="even number"):
        p.map_polygons([[[[1, 2, 3]]]])
    with pytest.raises(ValueError, match="2 entries for 1 boxes"):
        p.targets([{"boxes": [[0, 0, 4, 4]], "polygons": [None, None]}])
    with pytest.raises(ValueError, match="one segmentation per object"):
        p.targets([{"boxes": [[0, 0, 4, 4]], "polygons": '{"a": 1}'}])


def test_scale_polygons_keeps_the_type_and_leaves_rles():
    rle = {"size": [4, 4], "counts": "abc"}
    assert scale_polygons([[[1, 2, 3, 4, 5, 6]], rle, None], 2, 0.5) == [[[2, 1, 6, 2, 10, 3]], rle, None]
    assert json.loads(scale_polygons('[[[1, 2, 3, 4, 5, 6]]]', 2, 0.5)) == [[[2, 1, 6, 2, 10, 3]]]


@pytest.mark.parametrize("relative", [False, True])
def test_loader_moves_polygons_with_boxes(tmp_path, relative):
    path = _coco(tmp_path, n=4)
    src = CocoSource(path, images=tmp_path / "img", masks="polygons", box_format="ltrb", relative=relative,
                     cache=False)
    loader = ingest.Loader(src, batch_size=4, output="dict", shuffle=False,
                           ops=[Flip(p=1.0), Resize((30, 160))])
    batch = next(iter(loader))
    scale = np.array([160, 30]) if relative else np.ones(2)
    for n, text in enumerate(batch["polygons"]):
        objs = json.loads(text)
        assert len(objs) == int(batch["boxes_lengths"][n]) == 2
        for box, (part,) in zip(batch["boxes"][n].numpy(), objs):
            xy = np.reshape(part, (-1, 2)) * scale
            np.testing.assert_allclose([*xy.min(0), *xy.max(0)], box * np.tile(scale, 2), atol=1e-3)
    # the first object of _coco: x 4..34, y 10..30 in 80x60 -> x (80 - x) * 2, y / 2
    first = np.reshape(json.loads(batch["polygons"][0])[0][0], (-1, 2)) * scale
    assert sorted(map(tuple, first.round(3).tolist())) == [(92, 5), (92, 15), (152, 5), (152, 15)]


@pytest.mark.realworld
def test_realworld_polygons_land_where_the_masks_do():
    """The official COCO subset through crop, zoom-out, flip, resize and pad, read once as masks and once as
    polygons with the same seed: the moved polygons, rasterised by pycocotools, cover what the warped masks
    cover (pooled IoU; polygon rasterising and nearest sampling differ along edges), and the crowd RLE
    comes out exactly as its warped mask."""
    root = realworld("coco/tiny_coco_train2017")
    ops = [ZoomOut(p=0.5), RandomIoUCrop(), Flip(p=0.5), Resize(320, max_size=400), PadTo(400)]

    def batches(masks):
        src = CocoSource(root / "instances_train2017_small.json", images=root / "train_2017_small", masks=masks,
                         cache=False)
        return list(ingest.Loader(src, batch_size=8, output="dict", seed=3, shuffle=False, ops=ops))

    inter = union = rles = 0
    for a, b in zip(batches("masks"), batches("polygons")):
        for n, text in enumerate(b["polygons"]):
            objs = json.loads(text)
            assert len(objs) == int(a["masks_lengths"][n]) == int(b["boxes_lengths"][n])
            for j, obj in enumerate(objs):
                mask = a["masks"][n, j].numpy()
                if isinstance(obj, dict):
                    rles += 1
                    np.testing.assert_array_equal(mask_utils.decode({**obj, "counts": obj["counts"].encode()}), mask)
                    continue
                drawn = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(obj, *mask.shape)))
                inter += int((drawn & mask).sum())
                union += int((drawn | mask).sum())
    assert rles == 1 and union > 0
    assert inter / union > 0.97   # 0.991 measured
