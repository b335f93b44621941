"""The field model on CUDA: ragged image batches stay lists of device tensors (as on the CPU), other fields
arrive on the device, decoded-pixel sources are uploaded, with and without worker processes."""

from __future__ import annotations

import pytest
import torch

import ingest
from ingest.ops import Resize

from conftest import requires_cuda
from test_fields import Pixels, Rich

pytestmark = [pytest.mark.gpu, requires_cuda]


@pytest.mark.parametrize("workers", [0, 2])
def test_ragged_cuda_output_is_a_list_like_on_the_cpu(image_folder, workers):
    cpu = next(iter(ingest.Loader(image_folder, batch_size=6, device="cpu", ops=[Resize(32)], ragged=True)))[0]
    loader = ingest.Loader(image_folder, batch_size=6, device="cuda", ops=[Resize(32)], num_workers=workers,
                           ragged=True)
    images, labels = next(iter(loader))
    loader.close()
    assert isinstance(cpu, list) and isinstance(images, list) and len(images) == len(cpu) == 6
    assert len({tuple(im.shape) for im in images}) > 1, "the fixture's sizes must differ for this test"
    for got, want in zip(images, cpu):
        assert got.is_cuda and got.shape == want.shape
        assert (got.cpu().int() - want.int()).abs().max() <= 2  # GPU vs CPU decode + resize
    assert labels.is_cuda


def test_fields_arrive_on_the_device():
    batch = next(iter(ingest.Loader(Rich(), batch_size=4, device="cuda", output="dict", ops=[Resize((16, 16))])))
    for name in ("images", "labels", "score", "tags", "coords", "points"):
        assert batch[name].is_cuda, name
    assert not batch["tags_lengths"].is_cuda   # counts stay on the host: splitting the batch needs no sync
    assert batch["caption"][3] == "sample 3"
    cpu = next(iter(ingest.Loader(Rich(), batch_size=4, output="dict", ops=[Resize((16, 16))])))
    assert torch.equal(batch["tags"].cpu(), cpu["tags"]) and torch.equal(batch["points"].cpu(), cpu["points"])


def test_pixel_sources_upload():
    images = next(iter(ingest.Loader(Pixels(), batch_size=4, device="cuda", output="dict", ragged=True)))["images"]
    for got, want in zip(images, Pixels().arrays):
        assert got.is_cuda and torch.equal(got.cpu(), torch.from_numpy(want).permute(2, 0, 1))  # CHW, as stacked


@pytest.mark.parametrize("engine, way", [("python", "none (raw, direct read)"), ("native", "none (raw, native)")])
@pytest.mark.parametrize("io", ["auto", "posix"])
def test_raw_shards_land_on_the_gpu_directly(tmp_path, io, engine, way):
    """On the Python stages (direct reads) and on the native engine (one upload per batch, the warp)."""
    from test_fields import _raw_dataset
    arrays = _raw_dataset(tmp_path / "raw")
    with ingest.defaults.set(engine=engine):
        loader = ingest.Loader(tmp_path / "raw", batch_size=4, device="cuda", output="dict", io=io,
                               ops=[ingest.ops.Flip(p=1.0)])
    assert loader.engine == engine
    seen = 0
    for b in loader:
        for image, i in zip(b["images"], b["indices"].tolist()):
            assert image.is_cuda
            assert torch.equal(image.permute(1, 2, 0).cpu(), torch.from_numpy(arrays[i][:, ::-1].copy()))
            seen += 1
    paths = loader.stats()["decode_paths"]   # the next epoch's read-ahead included
    assert seen == 10 and set(paths) == {way} and paths[way] >= 10
