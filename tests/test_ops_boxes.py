"""Boxes and masks through the ops: against torchvision.transforms.v2 on ``tv_tensors.BoundingBoxes`` with
the same parameters, masks against the image they belong to, the detection ops, and ``Plan.targets``.

Tolerances: boxes agree with torchvision within 1e-3 px (ours are mapped in float64, torchvision's in
float32). torchvision keeps a box clipped to zero width or height; we drop it (with its labels), so the
comparison is on torchvision's non-empty boxes. Masks: a mask drawn as a filled rectangle equals the warped
image's rectangle exactly for nearest sampling (the image's own eager kernels on CPU).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from torchvision import tv_tensors

from conftest import requires_cuda
from ingest.errors import ConfigError
from ingest.ops import (CenterCrop, ColorJitter, Flip, Normalize, PadTo, RandomIoUCrop, RandomResizedCrop, Resize,
                        Rotate, ZoomOut, plan)
from ingest.ops.base import per_sample
from ingest.ops.detection import box_iou

TOL = 1e-3


def random_boxes(h: int, w: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` boxes inside an ``h`` x ``w`` image, some small, some touching the border."""
    x = np.sort(rng.uniform(0, w, (k, 2)), axis=1)
    y = np.sort(rng.uniform(0, h, (k, 2)), axis=1)
    boxes = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], axis=1)
    boxes[: k // 4, 2] = w  # reach the right border
    return boxes


def batch(n: int = 6, seed: int = 0) -> tuple[list[tuple[int, int]], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    sizes = [(int(h), int(w)) for h, w in rng.integers(60, 400, (n, 2))]
    return sizes, [random_boxes(h, w, int(rng.integers(0, 9)), rng) for h, w in sizes]


def tv_boxes(boxes: np.ndarray, size) -> tv_tensors.BoundingBoxes:
    return tv_tensors.BoundingBoxes(torch.as_tensor(boxes, dtype=torch.float32).reshape(-1, 4), format="XYXY",
                                    canvas_size=tuple(size))


def tv_apply(op, param, b: tv_tensors.BoundingBoxes) -> tuple[tv_tensors.BoundingBoxes, torch.Tensor]:
    """torchvision's functional op with ``op``'s drawn ``param`` for one sample; returns the boxes and which
    of them the op itself keeps (torchvision's RandomIoUCrop drops boxes whose centre is outside the crop)."""
    keep = torch.ones(len(b), dtype=torch.bool)
    h, w = b.canvas_size
    if isinstance(op, Flip):
        fx, fy = param
        b = TF.horizontal_flip(b) if fx else b
        return (TF.vertical_flip(b) if fy else b), keep
    if isinstance(op, Resize):
        return TF.resize(b, list(op.output_size(h, w))), keep
    if isinstance(op, RandomResizedCrop):
        top, left, ch, cw = param
        return TF.resized_crop(b, int(top), int(left), int(ch), int(cw), list(op.size)), keep
    if isinstance(op, CenterCrop):
        return TF.center_crop(b, list(op.size)), keep
    if isinstance(op, RandomIoUCrop):
        top, left, ch, cw, cropped = (int(v) for v in param)
        if not cropped:
            return b, keep
        cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
        keep = (left < cx) & (cx < left + cw) & (top < cy) & (cy < top + ch)
        return TF.crop(b, top, left, ch, cw), keep
    if isinstance(op, ZoomOut):
        left, top, ch, cw = (int(v) for v in param)
        return TF.pad(b, [left, top, cw - w - left, ch - h - top]), keep
    if isinstance(op, PadTo):
        (oh, ow), = op.out_sizes([(h, w)], None)
        left, top = ((ow - w) // 2, (oh - h) // 2) if op.center else (0, 0)
        return TF.pad(b, [left, top, ow - w - left, oh - h - top]), keep
    if isinstance(op, Rotate):
        return TF.rotate(b, float(param), expand=op.expand), keep
    raise AssertionError(op)


def torchvision_chain(ops, p, boxes, sizes):
    """Every sample's boxes through torchvision op by op with the plan's params; empty ones dropped at the
    end (SanitizeBoundingBoxes with min_size ~0)."""
    out = []
    for n, (b, size) in enumerate(zip(boxes, sizes)):
        t = tv_boxes(b, size)
        for (op, params) in p.drawn:
            if isinstance(op, (Flip, Resize, RandomResizedCrop, CenterCrop, RandomIoUCrop, ZoomOut, PadTo, Rotate)):
                t, keep = tv_apply(op, params[n] if params is not None else None, t)
                t = tv_tensors.wrap(t[keep], like=t)
        wh = t[:, 2:] - t[:, :2]
        out.append(t[(wh > 0).all(dim=1)].numpy())
    return out


CHAINS = {
    "flip": lambda: [Flip(p=0.5, horizontal=True, vertical=True)],
    "resize_max_size": lambda: [Resize(200, max_size=260)],
    "rrc_flip": lambda: [RandomResizedCrop((64, 80)), Flip()],
    "center_crop": lambda: [CenterCrop((50, 60))],  # (a padding one: torchvision shifts its boxes 1 px off its image)
    "iou_crop": lambda: [RandomIoUCrop()],
    "zoom_out": lambda: [ZoomOut(p=0.7, fill=(1, 2, 3))],
    "pad_multiple": lambda: [PadTo(multiple=32)],
    "letterbox": lambda: [Resize(longer=128), PadTo(128, center=True)],
    "rotate": lambda: [Rotate((-40, 40))],
    "ssd": lambda: [ZoomOut(p=0.5), RandomIoUCrop(), Flip(), Resize((96, 96))],
    "detectron": lambda: [RandomIoUCrop(), Flip(), ColorJitter(0.2), Flip(vertical=True),
                          Resize(160, max_size=200), PadTo(multiple=32), Normalize(128, 50)],
}


@pytest.mark.parametrize("chain", CHAINS, ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_boxes_match_torchvision(chain, seed):
    ops = CHAINS[chain]()
    sizes, boxes = batch(seed=seed)
    p = plan(ops, sizes, seed, boxes=boxes)
    mapped, keep = p.map_boxes(boxes)
    expected = torchvision_chain(ops, p, boxes, sizes)
    for n, (got, exp, k, b) in enumerate(zip(mapped, expected, keep, boxes)):
        assert got.shape == exp.shape, (n, got, exp)
        assert np.abs(got - exp).max(initial=0) < TOL
        assert k.shape == (len(b),) and k.sum() == len(got)
        oh, ow = p.out_sizes[n]
        assert (got[:, :2] >= 0).all() and (got[:, 2] <= ow).all() and (got[:, 3] <= oh).all()


def test_keep_masks_pick_the_surviving_boxes():
    sizes = [(100, 200)]
    boxes = [np.array([[10, 10, 50, 50], [120, 10, 190, 90], [60, 60, 100, 100.0]])]
    p = plan([CenterCrop((100, 100))], sizes, 0)  # keeps x in [50, 150)
    (got,), (keep,) = p.map_boxes(boxes)
    assert keep.tolist() == [False, True, True]
    np.testing.assert_allclose(got, [[70, 10, 100, 90], [10, 60, 50, 100]])
    (_,), (keep,) = p.map_boxes(boxes, min_size=35)
    assert keep.tolist() == [False, False, True]


def test_boxes_keep_their_type_dtype_and_device():
    sizes = [(40, 60), (50, 50)]
    p = plan([Flip(p=1.0)], sizes, 0)
    t = [torch.tensor([[1.0, 2.0, 10.0, 12.0]], dtype=torch.float16), torch.zeros((0, 4))]
    (a, b), _ = p.map_boxes(t)
    assert isinstance(a, torch.Tensor) and a.dtype == torch.float16 and a.tolist() == [[50.0, 2.0, 59.0, 12.0]]
    assert isinstance(b, torch.Tensor) and b.shape == (0, 4)
    (a, _), _ = p.map_boxes([np.array([[1, 2, 10, 12]], dtype=np.float32), np.zeros((0, 4))])
    assert isinstance(a, np.ndarray) and a.dtype == np.float32
    with pytest.raises(ValueError, match=r"\[K, 4\]"):
        p.map_boxes([np.zeros((2, 3)), np.zeros((0, 4))])
    with pytest.raises(ValueError, match="boxes for 1 samples, the batch has 2"):
        p.map_boxes([np.zeros((0, 4))])


# --------------------------------------------------------------------------------------------------
# The detection ops


def test_random_iou_crop_draws_meet_their_threshold():
    rng = np.random.default_rng(0)
    op = RandomIoUCrop(min_ious=(0.5,), attempts=50, rounds=1)
    sizes = [(300, 400)] * 200
    boxes = [random_boxes(300, 400, 3, rng) for _ in sizes]
    params = op.draw(sizes, 7, boxes=boxes)
    assert params[:, 4].mean() > 0.5  # most find a crop
    for (top, left, ch, cw, cropped), b in zip(params.tolist(), boxes):
        if not cropped:
            assert (top, left, ch, cw) == (0, 0, 300, 400)
            continue
        assert 0.3 * 300 - 1 <= ch <= 300 and 0.3 * 400 - 1 <= cw <= 400 and 0.5 <= cw / ch <= 2.0
        assert 0 <= top <= 300 - ch and 0 <= left <= 400 - cw
        cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
        inside = (left < cx) & (cx < left + cw) & (top < cy) & (cy < top + ch)
        assert inside.any()
        assert box_iou(b[inside], np.array([left, top, left + cw, top + ch], float)).max() >= 0.5
    # None keeps the image whole; without boxes no crop qualifies (and it ends: no endless loop).
    assert not RandomIoUCrop(min_ious=(None,)).draw(sizes[:5], 0, boxes=boxes[:5])[:, 4].any()
    assert not RandomIoUCrop().draw(sizes[:5], 0)[:, 4].any()


def test_random_iou_crop_thresholds_are_all_used():
    sizes = [(200, 200)] * 300
    boxes = [np.array([[20.0, 20, 180, 180]])] * 300
    params = RandomIoUCrop().draw(sizes, 3, boxes=boxes)
    whole = params[:, 4] == 0
    assert 0.05 < whole.mean() < 0.5  # None is one option in six (plus the rare failed rounds)
    area = params[:, 2] * params[:, 3] / 200 ** 2
    assert area[~whole].min() >= 0.3 ** 2 * 0.95 and area[~whole].max() <= 1.0


def test_zoom_out_draws_and_pads_with_fill():
    op = ZoomOut((2.0, 3.0), fill=(7, 8, 9), p=1.0)
    params = op.draw([(50, 60)] * 100, 0)
    left, top, ch, cw = params.T
    assert (ch >= 100).all() and (ch <= 150).all() and (cw >= 120).all() and (cw <= 180).all()
    assert (left <= cw - 60).all() and (top <= ch - 50).all()
    im = torch.full((50, 60, 3), 200, dtype=torch.uint8)
    out = op.apply([im], params[:1])[0]
    l, t = int(left[0]), int(top[0])
    assert out.shape == (ch[0], cw[0], 3) and torch.equal(out[t:t + 50, l:l + 60], im)
    assert out[0, 0].tolist() == [7, 8, 9] and out[-1, -1].tolist() == [7, 8, 9]
    assert (ZoomOut(p=0.0).draw([(5, 6)] * 20, 0) == [0, 0, 5, 6]).all()


def test_pad_to_sizes_and_pixels():
    ims = [torch.full((33, 70, 3), 5, dtype=torch.uint8), torch.full((64, 20, 3), 6, dtype=torch.uint8)]
    op = PadTo(multiple=32, fill=255)
    assert op.out_sizes([(33, 70), (64, 20)], None) == [(64, 96), (64, 32)]
    out = op(ims)
    assert out.shape == (2, 64, 96, 3) if isinstance(out, torch.Tensor) else [o.shape[:2] for o in out]
    assert torch.equal(out[0][:33, :70], ims[0]) and (out[0][33:] == 255).all() and (out[0][:, 70:] == 255).all()
    box = PadTo((100, 80), center=True)
    assert box.out_sizes([(33, 70), (120, 20)], None) == [(100, 80), (120, 80)]  # never crops
    centred = box([ims[0]])[0]
    assert torch.equal(centred[33:66, 5:75], ims[0])
    assert torch.equal(centred, TF.pad(ims[0].permute(2, 0, 1), [5, 33, 5, 34]).permute(1, 2, 0))


def test_pad_to_the_batch_makes_one_tensor_and_keeps_the_content_sizes():
    ims = [torch.full((33, 70, 3), 5, dtype=torch.uint8), torch.full((64, 20, 3), 6, dtype=torch.uint8)]
    op = PadTo(multiple=32, batch=True, fill=1)
    assert op.out_sizes([(33, 70), (64, 20)], None) == [(64, 96), (64, 96)]
    out = op(ims)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 64, 96, 3)
    assert torch.equal(out[1][:64, :20], ims[1]) and (out[1][:, 20:] == 1).all() and (out[0][33:] == 1).all()
    p = plan([Resize((40, 50)), PadTo(batch=True), Normalize(0, 1)], [(33, 70), (64, 20)], 0)
    assert p.out_sizes == [(40, 50)] * 2 and p.content_sizes == [(40, 50)] * 2
    resize = Resize(30, max_size=60)
    p = plan([resize, PadTo(multiple=16, batch=True)], [(33, 70), (64, 20)], 0)
    assert p.content_sizes == resize.out_sizes([(33, 70), (64, 20)], None) == [(28, 60), (60, 18)]
    assert p.out_sizes == [(64, 64)] * 2
    assert plan([PadTo(multiple=8), Resize((10, 10))], [(33, 70)], 0).content_sizes is None   # resized after
    assert plan([Resize((10, 10))], [(33, 70)], 0).content_sizes is None


def test_detection_ops_validate_their_config():
    cases = [(lambda: RandomIoUCrop(min_ious=()), "`min_ious`"),
             (lambda: RandomIoUCrop(min_ious=(0.5, 2.0)), "`min_ious`"),
             (lambda: RandomIoUCrop(scale=(0.5, 1.5)), "`scale` must lie in"),
             (lambda: RandomIoUCrop(aspect=(2, 1)), "`aspect`"),
             (lambda: RandomIoUCrop(attempts=0), "`attempts` must be positive"),
             (lambda: ZoomOut((0.5, 2.0)), "`ratio` must be >= 1"),
             (lambda: ZoomOut(p=2), "`p` must be a probability"),
             (lambda: PadTo(), "needs `size`, `multiple`, `batch=True`"),
             (lambda: PadTo(multiple=0), "`multiple` must be positive"),
             (lambda: PadTo(32, fill=-1), "`fill`")]
    for make, message in cases:
        with pytest.raises(ConfigError, match=message):
            make()


# --------------------------------------------------------------------------------------------------
# Masks follow images


def rectangles(size, boxes) -> tuple[torch.Tensor, torch.Tensor]:
    """An image with a filled rectangle per box (its own grey level 40 * (k + 1)) and the matching masks."""
    h, w = size
    im = torch.zeros((h, w, 3), dtype=torch.uint8)
    masks = torch.zeros((len(boxes), h, w), dtype=torch.uint8)
    for k, (x0, y0, x1, y1) in enumerate(np.rint(boxes).astype(int).tolist()):
        masks[k, y0:y1, x0:x1] = 1
    for k in range(len(boxes)):  # later rectangles are painted over earlier ones, masks overlap freely
        im[masks[k].bool()] = 40 * (k + 1)
    return im, masks


@pytest.mark.parametrize("ops", [
    [RandomIoUCrop(), Flip(horizontal=True, vertical=True)],
    [ZoomOut(p=1.0), Resize((90, 70), interpolation="nearest")],
    [RandomResizedCrop(48, interpolation="nearest"), Flip(), ColorJitter(brightness=0.0), PadTo(multiple=32)],
    [Resize(100, max_size=130, interpolation="nearest"), Flip(), PadTo((140, 140), center=True)],
], ids=["iou_crop_flips", "zoom_resize", "rrc_split_by_colour", "resize_letterbox"])
def test_masks_follow_the_image(ops):
    rng = np.random.default_rng(5)
    sizes = [(120, 160), (90, 90), (150, 100)]
    boxes = [np.array([[10.0, 20, 70, 80], [50, 5, 150, 60]]), np.array([[0.0, 0, 45, 90]]), np.zeros((0, 4))]
    boxes[2] = np.array([[30.0, 40, 90, 140], [0, 0, 20, 20], [70, 100, 100, 150]])
    made = [rectangles(s, b) for s, b in zip(sizes, boxes)]
    p = plan(ops, sizes, rng, boxes=boxes)
    images = p.execute([im for im, _ in made])
    masks = p.warp_masks([m for _, m in made])
    for n, (image, mask) in enumerate(zip(images, masks)):
        assert mask.shape == (len(boxes[n]),) + tuple(image.shape[:2]) and mask.dtype == torch.uint8
        top = torch.zeros(image.shape[:2], dtype=torch.uint8)  # the visible rectangle at each pixel
        for k in range(len(mask)):
            top[mask[k].bool()] = k + 1
        rows, cols = torch.nonzero(image[..., 0] != top * 40, as_tuple=True)
        assert len(rows) < 0.01 * top.numel(), (n, ops)
        assert on_pixel_edges(p, n, rows.numpy(), cols.numpy()), (n, ops)


def on_pixel_edges(p, n: int, rows: np.ndarray, cols: np.ndarray) -> bool:
    """Whether every output pixel (rows, cols) of sample n samples its source exactly on a pixel edge: a tie
    of nearest sampling, which torch's float32 resize (the image on CPU) and the float64 warp (the masks)
    may break differently."""
    x, y = cols + 0.5, rows + 0.5
    for stage in reversed([st for st in p.stages if st.warp is not None]):
        m = stage.warp.matrix[n]
        x, y = m[0, 0] * x + m[0, 1] * y + m[0, 2], m[1, 0] * x + m[1, 1] * y + m[1, 2]
        tie = (np.abs(x - np.rint(x)) < 1e-6) | (np.abs(y - np.rint(y)) < 1e-6)
        if tie.all():
            return True
    return len(rows) == 0


def test_masks_of_a_bilinear_image_differ_only_at_edges():
    sizes = [(120, 160)]
    boxes = [np.array([[13.0, 22, 97, 81]])]
    im, masks = rectangles(sizes[0], boxes[0])
    p = plan([Resize((70, 50)), Flip(p=1.0)], sizes, 0)
    image, mask = p.execute([im])[0], p.warp_masks([masks])[0][0]
    solid = (image[..., 0] == 0) | (image[..., 0] == 40)
    assert torch.equal((image[..., 0] >= 20)[solid], mask.bool()[solid])
    assert (~solid).float().mean() < 0.1  # the blended edge is a thin ring
    box = p.map_boxes(boxes)[0][0][0]
    rows, cols = torch.nonzero(mask, as_tuple=True)
    assert abs(cols.min() - box[0]) <= 1 and abs(cols.max() + 1 - box[2]) <= 1
    assert abs(rows.min() - box[1]) <= 1 and abs(rows.max() + 1 - box[3]) <= 1


def test_targets_in_one_call():
    sizes = [(100, 200), (80, 80)]
    boxes = [np.array([[10.0, 10, 50, 50], [120, 10, 190, 90], [60, 60, 100, 100]]), np.zeros((0, 4))]
    masks = [rectangles(s, b)[1] for s, b in zip(sizes, boxes)]
    targets = [{"boxes": torch.as_tensor(boxes[0], dtype=torch.float32), "labels": torch.tensor([1, 2, 3]),
                "iscrowd": np.array([0, 1, 0]), "area": [1600.0, 5600.0, 1600.0], "masks": masks[0],
                "image_id": 42},
               {"boxes": boxes[1], "labels": np.zeros(0, np.int64), "masks": masks[1], "image_id": 7}]
    p = plan([CenterCrop((100, 100)), Flip(p=1.0)], sizes, 0)
    out = p.targets(targets)
    first = out[0]
    assert first["labels"].tolist() == [2, 3] and first["iscrowd"].tolist() == [1, 0]
    assert first["area"] == [5600.0, 1600.0] and first["image_id"] == 42  # area pruned, not rescaled
    assert first["boxes"].dtype == torch.float32
    np.testing.assert_allclose(first["boxes"].numpy(), [[0, 10, 30, 90], [50, 60, 90, 100]])
    assert first["masks"].shape == (2, 100, 100)
    np.testing.assert_array_equal(first["masks"].numpy(), p.warp_masks([masks[0][1:]])[0].numpy())
    assert out[1]["boxes"].shape == (0, 4) and out[1]["masks"].shape == (0, 100, 100)
    assert targets[0]["labels"].tolist() == [1, 2, 3]  # the input dicts are left as they were
    with pytest.raises(ValueError, match="`labels` has 2 entries for 3 boxes"):
        p.targets([{**targets[0], "labels": torch.tensor([1, 2])}, targets[1]])


def test_iou_crop_draws_see_boxes_mapped_by_the_ops_before():
    """A crop after a flip draws against the flipped boxes: same crop as drawing on flipped inputs."""
    sizes = [(200, 300)] * 4
    boxes = [np.array([[0.0, 0, 60, 60]])] * 4
    flipped = [np.array([[240.0, 0, 300, 60]])] * 4
    p = plan([Flip(p=1.0), RandomIoUCrop(min_ious=(0.1,))], sizes, 3, boxes=boxes)
    rngs = per_sample(3, 4)
    Flip(p=1.0).draw(sizes, rngs)  # the same source, advanced as the plan's was
    crops = p.drawn[1][1]
    assert np.array_equal(crops, RandomIoUCrop(min_ious=(0.1,)).draw(sizes, rngs, boxes=flipped))
    assert crops[:, 4].all() and (crops[:, 1] + crops[:, 3] > 270).all()  # each holds the flipped box's centre


# --------------------------------------------------------------------------------------------------
# CUDA: masks and detection chains against the CPU


DETECTION_CHAINS = [
    lambda: [ZoomOut(p=0.7, fill=(1, 2, 3)), RandomIoUCrop(), Flip(horizontal=True, vertical=True)],
    lambda: [RandomIoUCrop(), Flip(), Resize(120, max_size=150), PadTo(multiple=32)],
    lambda: [Resize(longer=100, interpolation="nearest"), PadTo(100, center=True, fill=9), Normalize(128, 50)],
]


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("chain", range(len(DETECTION_CHAINS)))
def test_detection_chain_on_cuda_matches_cpu(chain):
    """Images: exact for crops, flips, pads and nearest resizes; bilinear resizes <= 1 level (the kernel's
    float weights against torch's kernels). Masks: the same nearest sampling in double precision on both,
    so equal but for pixel-edge ties (< 0.1% of pixels). Boxes are mapped on the host either way."""
    sizes = [(120, 160), (90, 90), (150, 100), (200, 130)]
    boxes = [np.array([[10.0, 20, 70, 80], [50, 5, 150, 60]]), np.array([[0.0, 0, 45, 90]]), np.zeros((0, 4)),
             np.array([[30.0, 40, 90, 140], [0, 0, 20, 20], [70, 100, 100, 150]])]
    made = [rectangles(s, b) for s, b in zip(sizes, boxes)]
    p = plan(DETECTION_CHAINS[chain](), sizes, 11, boxes=boxes)
    host = p.execute([im for im, _ in made])
    device = p.execute([im.cuda() for im, _ in made])
    for a, b in zip(host, device):
        assert b.is_cuda and a.shape == b.shape and a.dtype == b.dtype
        assert (a.float() - b.cpu().float()).abs().max() <= (1.01 / 50 if a.dtype == torch.float32 else 1)
    masks_cpu = p.warp_masks([m for _, m in made])
    masks_gpu = p.warp_masks([m.cuda() for _, m in made])
    for a, b in zip(masks_cpu, masks_gpu):
        assert b.is_cuda and a.shape == b.shape and (a != b.cpu()).sum() <= 1e-3 * a.numel()
    targets = p.targets([{"boxes": torch.as_tensor(b, device="cuda"), "labels": torch.arange(len(b), device="cuda"),
                          "masks": m.cuda()} for b, (_, m) in zip(boxes, made)])
    mapped, _ = p.map_boxes(boxes)
    for t, ref in zip(targets, mapped):
        assert t["boxes"].is_cuda and t["labels"].is_cuda and t["masks"].is_cuda
        np.testing.assert_allclose(t["boxes"].cpu().numpy(), ref)
