"""The Loader inside real training code: torch.distributed sharding defaults, AMP and torch.compile."""

import pytest
import torch
import torch.distributed as dist

import ingest
from ingest.ops import Flip, Normalize, RandomResizedCrop

MEAN, STD = (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)


def test_shard_defaults_come_from_torch_distributed(image_folder, tmp_path):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        loader = ingest.Loader(image_folder, batch_size=4, ops=[RandomResizedCrop(16)])
        assert (loader.sampler.shard_id, loader.sampler.num_shards) == (0, 1)
        assert sum(len(y) for _, y in loader) == 21
    finally:
        dist.destroy_process_group()


def test_compiled_model_with_autocast_trains_on_loader_batches(image_folder):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 3))
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = ingest.Loader(image_folder, batch_size=7, ops=[RandomResizedCrop(32), Flip(p=0.5), Normalize(MEAN, STD)],
                           shuffle=True, seed=0)
    losses = []
    for epoch in range(3):
        for images, labels in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(compiled(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert len(losses) == 9 and all(map(torch.isfinite, torch.tensor(losses)))
    assert sum(losses[-3:]) < sum(losses[:3])  # it learns something from correctly labeled batches
