"""What the augmentation launches per batch, counted without a GPU (dev/augment_launches.py: the ops on "cuda"
tensors of torch's FakeTensorMode, every aten call counted): no device-to-host synchronization, one upload of
per-sample parameters per op, and a number of launches that does not grow with the batch. Plus the batched
policy path on batches where the groups of samples are mixed, whole or single, against torchvision per sample."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from ingest.ops import AutoAugment, CutMix, MixUp, MixUpCutMix, RandAugment, RandomErasing, TrivialAugmentWide
from ingest.ops import functional as F
from ingest.ops.augment import NAMES, OP, PolicyParams
from test_augment import hwc, policy_reference

_spec = importlib.util.spec_from_file_location(
    "augment_launches", Path(__file__).resolve().parents[1] / "dev" / "augment_launches.py")
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


def counts(fn, n: int, h: int = 48, w: int = 40, channels_last: bool = True, fused: bool = True) -> dict:
    return probe.count(fn, (n, h, w, 3) if channels_last else (n, 3, h, w), fused=fused)


POLICIES = [RandAugment(2, 9), RandAugment(3, 17, interpolation="bilinear", fill=(1, 2, 3)), TrivialAugmentWide(),
            AutoAugment()]


@pytest.mark.parametrize("op", POLICIES, ids=lambda op: type(op).__name__)
def test_policy_rounds_are_their_own_kernels_whatever_was_drawn(op):
    """On CUDA with CuPy: per round that runs an op, one statistics launch where a sample drew Contrast,
    AutoContrast or Equalize, and one launch of every sample's op; nothing else reaches the device but the
    parameters' one upload."""
    stats = [OP[name] for name in ("Contrast", "AutoContrast", "Equalize")]
    for name in [name for name in op._space if name != "Identity"]:
        params = PolicyParams(np.full((16, 2), OP[name]), np.full((16, 2), 0.5))
        got = counts(lambda x: op.apply(x, params), 16)
        assert (got["syncs"], got["uploads"]) == (0, 1), got
        assert got["by_call"] == {"policy_apply": 2, **({"policy_stats": 2} if OP[name] in stats else {})}, name
    for n in (16, 64):
        params = op.draw([(48, 40)] * n, 3)
        got = counts(lambda x: op.apply(x, params), n)
        rounds = params.ops.shape[1]
        assert (got["syncs"], got["uploads"]) == (0, 1) and got["launches"] <= 2 * rounds, got["by_call"]
        assert set(got["by_call"]) <= {"policy_apply", "policy_stats"}, got["by_call"]


@pytest.mark.parametrize("op", POLICIES, ids=lambda op: type(op).__name__)
def test_policies_do_not_sync_and_upload_once(op):
    """The torch path (CUDA without CuPy)."""
    for n in (16, 64):
        params = op.draw([(48, 40)] * n, 3)
        got = counts(lambda x: op.apply(x, params), n, fused=False)
        assert got["syncs"] == 0, got["sync_sites"]
        assert got["uploads"] == 1
        rounds = params.ops.shape[1]
        # per round at most: the geometry (7, 11 with a fill blend), the pointwise ops (16), sharpness (9),
        # autocontrast (14) and equalize (20) groups, each with its index_select and index_copy; one copy of
        # the batch
        assert got["launches"] <= 1 + 75 * rounds, got["by_call"]


def test_launches_do_not_grow_with_the_batch():
    op = RandAugment(2, 9)
    small, large = (counts(lambda x: op.apply(x, params), len(params.ops), fused=False)["launches"]
                    for params in (op.draw([(48, 40)] * n, 7) for n in (32, 256)))
    assert large <= small + 4   # the same groups, whatever their sizes


@pytest.mark.parametrize("value", [0, (10, 20, 30)])   # "random" needs a CUDA generator: test_augment_gpu.py
def test_random_erasing_is_one_masked_fill_without_sync(value):
    op = RandomErasing(1.0, value=value)
    params = op.draw([(48, 40)] * 32, 2)
    got = counts(lambda x: op.apply(x, params), 32)
    assert got["syncs"] == 0 and got["uploads"] == 1, got
    assert got["launches"] <= 10, got["by_call"]


@pytest.mark.parametrize("op", [MixUp(0.8, 10), CutMix(1.0, 10), MixUpCutMix(0.8, 1.0, num_classes=10)],
                         ids=lambda op: type(op).__name__)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_mixing_does_not_sync(op, dtype):
    params = op.draw([(48, 40)] * 32, 5)
    def run(x):
        op.mix_images(x, params)
        op.mix_labels(torch.arange(32, device=x.device) % 10, params)
    got = probe.count(run, (32, 3, 48, 40), dtype=dtype)
    assert got["syncs"] == 0 and got["uploads"] <= 2, got
    assert got["launches"] <= 32, got["by_call"]   # images 11 (float) to 19 (uint8), labels 10 (one-hot)


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")   # the host value's, read on the host
def test_primitives_with_host_parameters_do_not_sync():
    n = 8
    f = np.linspace(0.2, 1.8, n)
    value = torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1)   # on the host
    calls = [lambda x: F.adjust_brightness(x, f), lambda x: F.adjust_contrast(x, f),
             lambda x: F.adjust_saturation(x, f), lambda x: F.adjust_sharpness(x, f),
             lambda x: F.adjust_hue(x, (f - 1.0) / 2), lambda x: F.posterize(x, np.arange(n) % 9),
             lambda x: F.solarize(x, 30.0 * np.arange(n)), F.equalize, F.autocontrast, F.invert,
             lambda x: F.gaussian_blur(x, 5, f), lambda x: F.gaussian_blur(x, 3, 0.7),
             lambda x: F.erase(x, [1] * n, [2] * n, [3] * n, [4] * n, value),
             lambda x: F.rotate(x, 10.0 * np.arange(n), fill=(1, 2, 3)),
             lambda x: F.affine(x, 5.0, (1, 2), 1.1, (3.0, 1.0), "bilinear")]
    for k, call in enumerate(calls):
        got = counts(call, n, channels_last=False)
        assert got["syncs"] == 0, (k, got["sync_sites"])


def test_the_counter_sees_syncs():
    got = counts(lambda x: (x.float().mean().item(), x.cpu(), x.to(torch.float32).to("cpu")), 4)
    assert got["syncs"] >= 1
    got = counts(lambda x: x + torch.ones(1).to(x.device), 4, channels_last=False)
    assert got["syncs"] == 1 and "blocking" in got["sync_sites"][0]


# --------------------------------------------------------------------------------------------------
# The batched policy path against torchvision, sample by sample

TV = {"rand": v2.RandAugment(2, 9), "auto": v2.AutoAugment()}


def table(op: RandAugment, ops: np.ndarray, hw: tuple[int, int]) -> PolicyParams:
    """Params for given op numbers at the op's magnitude bin, alternating signs."""
    from ingest.ops.augment import _magnitudes
    negative = (np.arange(ops.size).reshape(ops.shape) % 2).astype(bool)
    bins = np.full(ops.shape, op.magnitude)
    return PolicyParams(ops, _magnitudes(op._space, ops, bins, negative, np.array([hw] * len(ops))))


def batch(n: int, h: int = 33, w: int = 41, seed: int = 4) -> torch.Tensor:
    x = torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    x[1::5] = x[1::5] // 4 + 80   # low contrast samples: autocontrast and equalize have work to do
    x[2:3] = 7                    # one level: equalize keeps it, autocontrast too
    return x


@pytest.mark.parametrize("layout", ["every kind", "one kind per round", "one sample"])
def test_mixed_op_kinds_in_one_batch_equal_torchvision_per_sample(layout):
    op = RandAugment(2, 9)
    kinds = np.arange(len(NAMES) - 1)   # RandAugment's 14 (no Invert)
    if layout == "every kind":       # every kind in every round, groups of one to three samples
        ops = np.stack([np.resize(kinds, 30), np.resize(kinds[::-1], 30)], axis=1)
    elif layout == "one kind per round":   # each group is the whole batch (no index_select)
        ops = np.array([[OP["Equalize"], OP["Rotate"]]] * 6)
    else:
        ops = np.array([[OP["Sharpness"], OP["AutoContrast"]]])
    x = batch(len(ops))
    params = table(op, ops, tuple(x.shape[-2:]))
    got = op.apply(hwc(x), params).permute(0, 3, 1, 2)
    assert torch.equal(got, policy_reference(TV["rand"], x, params))


def test_invert_and_autoaugment_groups_equal_torchvision():
    op = AutoAugment()
    ops = np.stack([np.resize(np.arange(1, len(NAMES)), 20), np.resize([OP["Invert"], OP["Solarize"]], 20)], 1)
    x = batch(len(ops), seed=8)
    params = PolicyParams(ops, table(RandAugment(2, 5), np.where(ops == OP["Invert"], 0, ops), (33, 41)).magnitudes)
    got = op.apply(hwc(x), params).permute(0, 3, 1, 2)
    assert torch.equal(got, policy_reference(TV["auto"], x, params))


def test_gray_and_float_batches_take_the_op_by_op_path():
    op = RandAugment(2, 9)
    ops = np.stack([np.resize(np.arange(len(NAMES) - 1), 14), np.resize(np.arange(len(NAMES) - 1)[::-1], 14)], 1)
    x = batch(14)
    params = table(op, ops, (33, 41))
    gray = x[:, :1].contiguous()
    assert torch.equal(op.apply(hwc(gray), params).permute(0, 3, 1, 2), policy_reference(TV["rand"], gray, params))
    fl = x.float() / 255
    got = op.apply(hwc(fl), params).permute(0, 3, 1, 2)
    assert (got - policy_reference(TV["rand"], fl, params)).abs().max() < 1e-5


def test_upload_keeps_dtypes_and_shapes():
    arrays = [np.arange(5, dtype=np.int64), np.ones((2, 3), dtype=np.float32), np.array([True, False]),
              np.arange(3, dtype=np.uint8)]
    for a, t in zip(arrays, F.upload(arrays, "cpu")):
        assert t.shape == a.shape and np.array_equal(t.numpy(), a)
    assert F.upload([], "cpu") == []


def test_upload_packs_arrays_into_one_copy_for_a_device(monkeypatch):
    copies = []

    def to_device(host, device):   # the staged copy, kept on the host: what the views must read back
        copies.append(host.copy())
        return torch.from_numpy(copies[-1])
    monkeypatch.setattr(F, "_to_device_bytes", to_device)
    arrays = [np.arange(5, dtype=np.int64), np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3),
              np.array([True, False, True]), np.arange(3, dtype=np.uint8), np.array([1.5, -2.25])]
    sent = F.upload(arrays, "cuda")
    assert len(copies) == 1
    for a, t in zip(arrays, sent):
        assert t.shape == a.shape and t.dtype == torch.from_numpy(a).dtype and np.array_equal(t.numpy(), a)
