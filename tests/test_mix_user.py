"""MixUp, CutMix and MixUpCutMix (labels, ratios, images, config errors), the user ops (a function over the
batch, a torchvision v2 transform per sample or per batch, the errors for anything else) and all of them in a
Loader on CPU over a small generated JPEG folder, with resume and shard invariance of the draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

import ingest
from ingest.errors import ConfigError
from ingest.ops import (BatchFunction, CutMix, Flip, MixUp, MixUpCutMix, Normalize, RandAugment, RandomErasing,
                        RandomResizedCrop, Resize, Torchvision, plan)
from ingest.ops.mix import beta, split
from ingest.random import SampleRandom

from conftest import make_image_folder


def ks_two_sample(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic."""
    a, b = np.sort(a), np.sort(b)
    both = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, both, "right") / len(a) - np.searchsorted(b, both, "right") / len(b)).max())


@pytest.mark.parametrize("alpha", [0.2, 0.8, 1.0, 2.0])
def test_beta_draws_follow_beta_alpha_alpha(alpha):
    n = 50_000
    ours = beta(SampleRandom.eager(123, n), alpha)
    ref = np.random.default_rng(0).beta(alpha, alpha, n)
    assert ks_two_sample(ours, ref) < 1.95 * np.sqrt(2 / n)   # the 0.1% critical value


def test_mixup_ratios_follow_beta_and_labels_sum_to_one():
    n = 50_000
    op = MixUp(0.4, num_classes=10)
    p = op.draw(np.tile([[8, 8]], (n, 1)), 5)
    assert p.blend.all() and ks_two_sample(p.lam, np.random.default_rng(1).beta(0.4, 0.4, n)) < 1.95 * np.sqrt(2 / n)
    labels = np.arange(n) % 10
    soft = op.mix_labels(labels, p)
    assert soft.shape == (n, 10) and soft.dtype == np.float32
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, atol=1e-6)
    rows = np.arange(n)
    np.testing.assert_allclose(soft[rows, labels], p.lam, atol=1e-6)       # own class: lam (neighbours differ)


def test_cutmix_lam_is_the_area_kept_and_follows_beta_before_clipping():
    n = 20_000
    op = CutMix(1.0, num_classes=5)
    p = op.draw(np.tile([[64, 96]], (n, 1)), 6)
    area = (p.boxes[:, 2] - p.boxes[:, 0]) * (p.boxes[:, 3] - p.boxes[:, 1]) / (64 * 96)
    np.testing.assert_allclose(p.lam, 1 - area)
    assert not p.blend.any() and (p.lam >= 0).all() and (p.lam <= 1).all()
    # clipping only shrinks boxes: the kept share is at least the drawn Beta(1, 1) = U(0, 1) share on average
    assert p.lam.mean() > 0.5


def test_mix_images_and_labels_by_hand():
    x = torch.stack([torch.full((3, 4, 6), 10 * (k + 1), dtype=torch.uint8) for k in range(4)])
    op = MixUpCutMix(0.8, 1.0, num_classes=4, label_smoothing=0.1, switch_prob=0.5)
    params = op.draw([(4, 6)] * 4, 7)
    mixed = op.mix_images(x.clone(), params)
    for n in range(4):
        partner = (n - 1) % 4
        if params.blend[n]:
            want = round(float(params.lam[n]) * 10 * (n + 1) + (1 - float(params.lam[n])) * 10 * (partner + 1))
            assert (mixed[n].int() - want).abs().max() <= 1
        else:
            y0, x0, y1, x1 = params.boxes[n]
            assert (mixed[n, :, y0:y1, x0:x1] == 10 * (partner + 1)).all()
            assert int((mixed[n] == 10 * (n + 1)).sum()) == 3 * (24 - (y1 - y0) * (x1 - x0))
    soft = op.mix_labels(np.arange(4), params)
    np.testing.assert_allclose(soft.sum(1), 1.0, atol=1e-6)
    assert soft.min() >= 0.1 / 4 * 0.999   # smoothing: every class keeps s / C


def test_eager_mix_on_tensors_keeps_input_and_layout():
    x = torch.rand(6, 3, 8, 10)
    labels = torch.tensor([0, 1, 2, 3, 4, 5])
    out, soft = MixUp(1.0, num_classes=6)(x, labels, rng=3)
    assert out.shape == x.shape and soft.shape == (6, 6) and not torch.equal(out, x)
    nhwc, soft2 = MixUp(1.0, num_classes=6)(x.permute(0, 2, 3, 1).contiguous(), labels, rng=3, channels_last=True)
    assert torch.allclose(nhwc.permute(0, 3, 1, 2), out) and torch.equal(soft, soft2)


def test_batch_op_config_errors():
    with pytest.raises(ConfigError, match="alpha"):
        MixUp(0.0)
    with pytest.raises(ConfigError, match="num_classes"):
        CutMix(1.0, num_classes=0)
    with pytest.raises(ConfigError, match="label_smoothing"):
        MixUp(1.0, 10, label_smoothing=1.0)
    with pytest.raises(ConfigError, match="must be the last op"):
        split([MixUp(1.0, 10), Normalize(127.0, 64.0)])
    with pytest.raises(ConfigError, match="one batch op at most"):
        split([MixUp(1.0, 10), CutMix(1.0, 10)])
    with pytest.raises(ConfigError, match="CutMix cannot run on a source with boxes"):
        split([Resize((8, 8)), CutMix(1.0, 10)], boxes=True)
    with pytest.raises(ConfigError, match="RandAugment moves pixels without a map for boxes"):
        split([Resize((8, 8)), RandAugment(2, 9)], boxes=True)
    with pytest.raises(ConfigError, match="mixes labels too"):
        plan([Resize((8, 8)), MixUp(1.0, 10)], [(8, 8)], 0).execute(torch.zeros(1, 8, 8, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="labels in 0..9"):
        MixUp(1.0, 10).mix_labels(np.array([3, 10]), MixUp(1.0, 10).draw([(4, 4)] * 2, 0))


# --------------------------------------------------------------------------------------------------
# User ops

def brighten(images: torch.Tensor, rand: torch.Tensor) -> torch.Tensor:
    return (images.float() * (0.5 + rand[:, :1, None, None])).clamp(0, 255).to(torch.uint8)


def test_batch_function_gets_the_batch_and_per_sample_numbers():
    seen = []

    def fn(images, rand):
        seen.append((tuple(images.shape), images.dtype, None if rand is None else tuple(rand.shape)))
        return brighten(images, rand)

    op = BatchFunction(fn, randoms=2)
    x = torch.randint(0, 256, (5, 12, 14, 3), dtype=torch.uint8)
    params = op.draw([(12, 14)] * 5, SampleRandom.keyed(1, 0, np.arange(5)))
    out = op.apply(x, params)
    assert seen == [((5, 3, 12, 14), torch.uint8, (5, 2))] and out.shape == x.shape
    # sample 3's numbers are its own: the same in a batch of one
    one = op.draw([(12, 14)], SampleRandom.keyed(1, 0, [3]))
    np.testing.assert_array_equal(one[0], params[3])


def test_batch_function_output_is_checked():
    x = torch.zeros(2, 8, 8, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"must return uint8 \[2, 3, 8, 8\].*float32"):
        BatchFunction(lambda im, r: im.float()).apply(x, None)
    with pytest.raises(ValueError, match=r"declare a new size: size=\(4, 4\)"):
        BatchFunction(lambda im, r: im[..., :4, :4]).apply(x, None)
    ok = BatchFunction(lambda im, r: im[..., :4, :4].contiguous(), size=4)
    assert ok.apply(x, None).shape == (2, 4, 4, 3) and ok.out_sizes([(8, 8)], None) == [(4, 4)]


def test_torchvision_transform_per_sample_is_seeded_by_the_sample():
    t = v2.Compose([v2.RandomCrop(6), v2.Resize(8)])
    op = Torchvision(t, size=8)
    x = torch.randint(0, 256, (4, 10, 12, 3), dtype=torch.uint8)
    seeds = op.draw([(10, 12)] * 4, 9)
    state = torch.random.get_rng_state()
    a, b = op.apply(x, seeds), op.apply(x, seeds)
    assert torch.equal(a, b) and torch.equal(torch.random.get_rng_state(), state)   # the user's RNG untouched
    torch.random.default_generator.manual_seed(int(seeds[2]))
    assert torch.equal(a[2], t(x[2].permute(2, 0, 1)).permute(1, 2, 0))
    batched = Torchvision(v2.RandomHorizontalFlip(1.0), per_batch=True)
    assert torch.equal(batched.apply(x, seeds), x.flip(2))


def test_anything_else_in_ops_is_a_config_error(tmp_path):
    folder = make_image_folder(tmp_path / "f", {"a": 2, "b": 2})
    with pytest.raises(ConfigError, match=r"ops\[1\] is 'brighten', a function, not an op.*BatchFunction"):
        ingest.Loader(folder, batch_size=2, ops=[Resize((8, 8)), brighten])
    with pytest.raises(ConfigError, match=r"ops\[0\] is a str, not an op"):
        ingest.Loader(folder, batch_size=2, ops=["flip"])
    with pytest.raises(ConfigError, match="not an op"):
        plan([Resize((8, 8)), lambda im: im], [(10, 10)], 0)
    with pytest.raises(ConfigError, match="must be the last op"):
        ingest.Loader(folder, batch_size=2, ops=[Resize((8, 8)), MixUp(1.0, 2), Flip()])


# --------------------------------------------------------------------------------------------------
# In a Loader (CPU)

NUM_CLASSES = 3


def recipe():
    return [RandomResizedCrop(24), Flip(), RandAugment(2, 9), RandomErasing(0.25, value="random"),
            Normalize((123.675, 116.28, 103.53), (58.395, 57.12, 57.375)),
            MixUpCutMix(0.8, 1.0, num_classes=NUM_CLASSES, label_smoothing=0.1)]


@pytest.fixture
def folder(tmp_path):
    return make_image_folder(tmp_path / "train", {"cat": 5, "dog": 4, "emu": 5})


def test_loader_runs_the_timm_recipe_with_user_ops(folder):
    ops = recipe()
    ops[3:3] = [BatchFunction(brighten, randoms=1), v2.RandomPosterize(4, p=0.5)]   # as they are, in the list
    loader = ingest.Loader(folder, batch_size=4, ops=ops, shuffle=True, seed=3)
    batches = list(loader)
    assert len(batches) == 4
    for images, labels in batches:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 24, 24)
        assert labels.shape == (len(images), NUM_CLASSES) and labels.dtype == torch.float32
        assert torch.allclose(labels.sum(1), torch.ones(len(images)), atol=1e-5)


def test_loader_draws_do_not_depend_on_batch_size_or_resume(folder):
    ops = [RandomResizedCrop(24), Flip(), RandAugment(2, 9), RandomErasing(0.5)]
    kw = dict(ops=ops, shuffle=True, seed=5)

    def by_index(loader):
        out = {}
        for batch in loader:
            for i, im in zip(batch["indices"].tolist(), batch["images"]):
                out[i] = im
        return out

    a = by_index(ingest.Loader(folder, batch_size=4, output="dict", **kw))
    b = by_index(ingest.Loader(folder, batch_size=3, output="dict", **kw))
    assert a.keys() == b.keys() and all(torch.equal(a[i], b[i]) for i in a)
    half = [ingest.Loader(folder, batch_size=4, output="dict", num_shards=2, shard_id=s, **kw) for s in (0, 1)]
    c = {**by_index(half[0]), **by_index(half[1])}
    assert all(torch.equal(a[i], c[i]) for i in c)


def test_loader_mixing_resumes(folder):
    kw = dict(batch_size=4, ops=[Resize((16, 16)), MixUp(1.0, num_classes=NUM_CLASSES)], shuffle=True, seed=7)
    ref = list(ingest.Loader(folder, **kw))
    run = ingest.Loader(folder, **kw)
    it = iter(run)
    next(it)
    state = run.state_dict()
    resumed = ingest.Loader(folder, **kw)
    resumed.load_state_dict(state)
    for (x, y), (rx, ry) in zip(resumed, ref[1:]):
        assert torch.equal(x, rx) and torch.equal(y, ry)


def test_mixup_needs_a_fixed_size(folder):
    loader = ingest.Loader(folder, batch_size=4, ops=[MixUp(1.0, num_classes=NUM_CLASSES)])
    with pytest.raises(ValueError, match="needs one output size"):
        next(iter(loader))


def test_mixing_pairs_only_delivered_samples(folder):
    (folder / "dog" / "0001.jpg").write_bytes(b"not a jpeg")
    loader = ingest.Loader(folder, batch_size=14, ops=[Resize((16, 16)), MixUp(1.0, num_classes=NUM_CLASSES)],
                           max_failures=1, output="dict")
    batch, = list(loader)
    assert len(batch["images"]) == 13 and batch["labels"].shape == (13, NUM_CLASSES)
    assert torch.allclose(batch["labels"].sum(1), torch.ones(13), atol=1e-5)
