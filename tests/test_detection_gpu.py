"""Detection on CUDA: boxes, masks and per-box fields equal the CPU pipeline's (same draws), on the device."""

from __future__ import annotations

import pytest
import torch

import ingest
from ingest.formats.coco import CocoSource
from ingest.ops import Flip, RandomIoUCrop, Resize

from conftest import requires_cuda
from test_detection import _coco

pytestmark = [pytest.mark.gpu, requires_cuda]


def test_cuda_detection_matches_cpu(tmp_path):
    path = _coco(tmp_path)
    ops = [RandomIoUCrop(), Flip(p=0.5), Resize((48, 48))]
    out = {}
    for device in ("cpu", "cuda"):
        src = CocoSource(path, images=tmp_path / "img", box_format="ltrb", masks="masks")
        out[device] = next(iter(ingest.Loader(src, batch_size=6, output="dict", seed=1, ops=ops, device=device,
                                              num_workers=0)))
    cpu, gpu = out["cpu"], out["cuda"]
    for name in ("boxes", "categories", "masks", "boxes_lengths"):
        assert gpu[name].device.type == ("cuda" if name != "boxes_lengths" else "cpu")
        assert torch.equal(gpu[name].cpu(), cpu[name]) if name != "boxes" else \
            torch.allclose(gpu[name].cpu(), cpu[name], atol=1e-4)
    assert (gpu["images"].cpu().int() - cpu["images"].int()).abs().max() <= 3
