"""benchmarks/bench_segmentation.py's own checks: the map-follows-image measure and the derived figures."""

import io
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from PIL import Image  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_segmentation as seg  # noqa: E402


def normalized_batch(samples):
    """Decoded samples as the loaders deliver them: float32 NCHW normalized images, uint8 [N, H, W] maps."""
    images, masks = [], []
    for jpeg, png in samples:
        x = torch.from_numpy(np.array(Image.open(io.BytesIO(jpeg)).convert("RGB"))).permute(2, 0, 1).float()
        images.append((x - torch.tensor(seg.MEAN)[:, None, None]) / torch.tensor(seg.STD)[:, None, None])
        masks.append(torch.from_numpy(np.array(Image.open(io.BytesIO(png)))))
    h = min(m.shape[0] for m in masks)
    w = min(m.shape[1] for m in masks)
    return torch.stack([x[:, :h, :w] for x in images]), torch.stack([m[:h, :w] for m in masks])


def test_agreement_tells_maps_that_follow_their_images_from_flipped_ones():
    images, masks = normalized_batch([seg.make_sample(i, seed=0) for i in range(3)])
    check = seg.describe_batch(images, masks)
    assert check["images"] == [list(images.shape), "torch.float32", "cpu"]
    assert check["masks"][1:] == ["torch.uint8", "cpu"]
    assert set(check["values"]) <= set(range(seg.CLASSES)) | {255} and 255 in check["values"]
    assert check["agreement"] > 0.95
    flipped = seg.describe_batch(images, masks.flip(-1))   # the map mirrored, its image not
    assert flipped["agreement"] < check["agreement"] - 0.2


def test_derive_ratios_target_and_matching_outputs():
    same = {"images": [[32, 3, 512, 512], "torch.float32", "cuda:0"],
            "masks": [[32, 512, 512], "torch.uint8", "cuda:0"]}
    results = {"ingest": {"img_s": 1300.0, "check": same}, "dali": {"img_s": 1000.0, "check": same},
               "ingest_images": {"img_s": 2000.0, "check": {"images": same["images"]}},
               "dali_images": {"img_s": 2500.0, "check": {"images": [[32, 3, 512, 512], "torch.uint8", "cuda:0"]}}}
    d = seg.derive(results)
    assert d["ingest_over_dali"] == 1.3 and d["target_met"] is True
    assert d["ingest_images_over_dali_images"] == 0.8
    assert d["ingest_outputs_match_dali"] is True
    assert d["ingest_images_outputs_match_dali_images"] is False   # float32 against uint8
    assert d["ingest_w4_over_dali"] is None and "target_met" not in seg.derive({"ingest": {"img_s": 1.0}})
