"""Detection loading end to end: COCO through the Loader with box- and mask-aware ops, boxes in the
reader's format, targets pruned with their boxes, and a torchvision Faster R-CNN step on a batch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils

import ingest
from ingest.formats.coco import CocoSource
from ingest.ops import Flip, PadTo, RandomIoUCrop, Resize

from conftest import jpeg_bytes, realworld


def _coco(tmp_path, n=6):
    """n images of 60x80 with two boxes each: a wide one at the left, a small one at the bottom right, and
    polygon segmentations filling them."""
    images, anns = [], []
    (tmp_path / "img").mkdir()
    for i in range(n):
        (tmp_path / "img" / f"{i}.jpg").write_bytes(jpeg_bytes(60, 80, seed=i))
        images.append({"id": i + 1, "file_name": f"{i}.jpg", "height": 60, "width": 80})
        for k, (x, y, w, h, cat) in enumerate([(4, 10, 30, 20, 3), (60, 40, 12, 10, 7)]):
            anns.append({"id": 10 * i + k, "image_id": i + 1, "category_id": cat, "bbox": [x, y, w, h],
                         "area": w * h, "iscrowd": 0,
                         "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]]})
    cats = [{"id": c, "name": f"c{c}"} for c in (3, 7)]
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path


def test_flip_and_resize_move_boxes_in_the_readers_format(tmp_path):
    path = _coco(tmp_path)
    loader = ingest.Loader(path, batch_size=3, output="dict", reader_options={"images": tmp_path / "img",
                                                                              "box_format": "xywh"},
                           ops=[Flip(p=1.0), Resize((30, 160))])
    batch = next(iter(loader))
    assert batch["images"].shape == (3, 3, 30, 160)
    # xywh, as COCO: x' = (80 - x - w) * 2, y' = y / 2, w' = 2w, h' = h / 2
    want = torch.tensor([[(80 - 4 - 30) * 2, 5, 60, 10], [(80 - 60 - 12) * 2, 20, 24, 5]], dtype=torch.float32)
    for n in range(3):
        assert torch.allclose(batch["boxes"][n], want, atol=1e-4)
    assert batch["categories"].tolist() == [[1, 2]] * 3 and batch["iscrowd"].tolist() == [[0, 0]] * 3


def test_iou_crop_prunes_per_box_fields_and_masks_follow(tmp_path):
    path = _coco(tmp_path)
    src = CocoSource(path, images=tmp_path / "img", box_format="ltrb", masks="masks")
    loader = ingest.Loader(src, batch_size=6, output="dict", seed=1,
                           ops=[RandomIoUCrop(), Flip(p=0.5), Resize((48, 48))])
    batch = next(iter(loader))
    lengths = batch["boxes_lengths"].tolist()
    assert batch["categories_lengths"].tolist() == lengths == batch["masks_lengths"].tolist()
    assert batch["masks"].shape[2:] == (48, 48)
    for n, k in enumerate(lengths):
        for j in range(k):
            x0, y0, x1, y1 = batch["boxes"][n, j].tolist()
            assert 0 <= x0 < x1 <= 48 and 0 <= y0 < y1 <= 48
            ys, xs = torch.nonzero(batch["masks"][n, j], as_tuple=True)
            assert len(xs), "a kept box keeps a non-empty mask"
            # the mask (a filled rectangle) is where the box is, within a pixel
            assert abs(xs.min().item() - x0) <= 1.01 and abs(xs.max().item() + 1 - x1) <= 1.01
            assert abs(ys.min().item() - y0) <= 1.01 and abs(ys.max().item() + 1 - y1) <= 1.01
        assert batch["categories"][n, :k].tolist() == sorted(batch["categories"][n, :k].tolist()) or k < 2


def test_torchvision_faster_rcnn_trains_on_a_batch(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn
    path = _coco(tmp_path, n=2)
    src = CocoSource(path, images=tmp_path / "img", box_format="ltrb")
    loader = ingest.Loader(src, batch_size=2, output="dict",
                           ops=[Resize(64, max_size=96), PadTo(multiple=32), ingest.ops.Normalize(mean=[0.0] * 3,
                                                                                         std=[255.0] * 3)])
    batch = next(iter(loader))
    targets = ingest.torch.detection_targets(batch)
    assert targets[0]["boxes"].shape == (2, 4) and targets[0]["labels"].tolist() == [1, 2]
    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=3)
    model.train()
    losses = model(list(batch["images"]), targets)
    total = sum(losses.values())
    assert torch.isfinite(total)
    total.backward()


def test_padded_batch_with_image_sizes(tmp_path):
    """PadTo(batch=True): one [N, C, H, W] tensor, each image's content at the top left, its size before the
    padding in `image_sizes`, the padding filled; boxes stay inside the content."""
    path = _coco(tmp_path, n=4)
    src = CocoSource(path, images=tmp_path / "img", box_format="ltrb")
    ops = [RandomIoUCrop(), Flip(), Resize(40, max_size=60), PadTo(multiple=32, batch=True, fill=3)]
    batch = next(iter(ingest.Loader(src, batch_size=4, output="dict", ops=ops, seed=2)))
    images, sizes = batch["images"], batch["image_sizes"]
    assert isinstance(images, torch.Tensor) and images.shape[:2] == (4, 3) and images.shape[2] % 32 == 0
    assert sizes.shape == (4, 2) and (sizes <= torch.tensor(images.shape[2:])).all()
    assert (sizes.min(dim=1).values <= 40).all() and (sizes.max(dim=0).values > torch.tensor(images.shape[2:]) - 32).all()
    for n, (h, w) in enumerate(sizes.tolist()):
        assert (images[n, :, h:, :] == 3).all() and (images[n, :, :, w:] == 3).all()
        k = int(batch["boxes_lengths"][n])
        assert (batch["boxes"][n, :k, 2] <= w + 1e-3).all() and (batch["boxes"][n, :k, 3] <= h + 1e-3).all()
    plain = next(iter(ingest.Loader(src, batch_size=4, output="dict", ops=ops[:3], seed=2, ragged=True)))
    assert [tuple(im.shape[1:]) for im in plain["images"]] == [tuple(s) for s in sizes.tolist()]
    for n, (h, w) in enumerate(sizes.tolist()):
        assert torch.equal(images[n, :, :h, :w], plain["images"][n])
    assert "image_sizes" not in plain


def test_real_coco_masks_follow_a_resize():
    root = realworld("coco/tiny_coco_train2017")
    src = CocoSource(root / "instances_train2017_small.json", images=root / "train_2017_small", masks="masks", cache=False,
                     box_format="ltrb")
    batch = next(iter(ingest.Loader(src, batch_size=2, output="dict", ops=[Resize((128, 128))])))
    assert batch["masks"].shape[2:] == (128, 128)
    for n in range(2):
        for j in range(int(batch["boxes_lengths"][n])):
            if batch["iscrowd"][n, j]:
                continue
            m = batch["masks"][n, j].numpy()
            if m.sum() < 20:
                continue
            x, y, w, h = mask_utils.toBbox(mask_utils.encode(np.asfortranarray(m)))
            assert np.allclose([x, y, x + w, y + h], batch["boxes"][n, j].numpy(), atol=3.0)
