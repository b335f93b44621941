"""A sample's augmentation is keyed by (seed, epoch, dataset index): the same whatever batch it lands in,
the batch size, the number of shards, a neighbour that failed, and the device that executes it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from conftest import make_image_folder, requires_cuda
from ingest.formats import open_source
from ingest.ops import ColorJitter, Flip, RandomIoUCrop, RandomResizedCrop, Rotate, ZoomOut, per_sample, plan
from ingest.engine import Failures, Pipeline
from ingest.random import SampleRandom
from ingest.sampler import Sampler


def ops():
    return [ZoomOut(p=0.5), RandomIoUCrop(), RandomResizedCrop(32), Flip(vertical=True), Rotate((-10, 10)),
            ColorJitter(0.3, 0.3, 0.3, 0.1, p=0.7)]


def size_of(i: int) -> tuple[int, int]:
    return 50 + (i * 37) % 200, 60 + (i * 53) % 180


def boxes_of(i: int) -> np.ndarray:
    h, w = size_of(i)
    return np.array([[0.1 * w, 0.2 * h, 0.6 * w, 0.7 * h], [0.5 * w, 0.1 * h, 0.9 * w, 0.4 * h]])


def params_by_index(plans, operations) -> dict[int, list]:
    """Dataset index -> every op's drawn params for that sample, over the given batch plans."""
    out = {}
    for bp in plans:
        idx = [int(i) for i in bp.indices]
        p = plan(operations, [size_of(i) for i in idx], bp.sample_rngs(), boxes=[boxes_of(i) for i in idx])
        for n, i in enumerate(idx):
            out[i] = [np.asarray([f[n] for f in params if f is not None] if isinstance(params, tuple) else params[n])
                      for _, params in p.drawn]
    return out


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(all(np.array_equal(x, y) for x, y in zip(a[i], b[i])) for i in a)


def test_params_depend_on_the_index_not_the_batch_or_shard():
    operations = ops()
    reference = params_by_index(Sampler(40, 40, shuffle=True, seed=3).batches(epoch=2), operations)
    assert len(reference) == 40
    for batch_size, shards in [(1, 1), (4, 1), (7, 2), (5, 3)]:
        got = {}
        for shard in range(shards):
            sampler = Sampler(40, batch_size, shuffle=True, seed=3, shard_id=shard, num_shards=shards)
            got.update(params_by_index(sampler.batches(epoch=2), operations))
        assert same(got, reference), (batch_size, shards)
    other_epoch = params_by_index(Sampler(40, 40, shuffle=True, seed=3).batches(epoch=3), operations)
    other_seed = params_by_index(Sampler(40, 40, shuffle=True, seed=4).batches(epoch=2), operations)
    crops = lambda d: np.array([d[i][2] for i in range(40)])  # noqa: E731 - RandomResizedCrop's regions
    assert (crops(other_epoch) != crops(reference)).any(axis=1).mean() > 0.9
    assert (crops(other_seed) != crops(reference)).any(axis=1).mean() > 0.9


def test_params_survive_a_neighbour_dropping_out():
    operations = ops()
    bp = next(Sampler(12, 12, shuffle=True, seed=1).batches(epoch=0))
    full = params_by_index([bp], operations)
    keep = np.array([k for k in range(12) if k % 3 != 1])  # as the pipeline drops failed samples
    survivors = params_by_index([replace(bp, indices=bp.indices[keep], is_pad=bp.is_pad[keep])], operations)
    assert same(survivors, {i: full[i] for i in survivors}) and len(survivors) == 8


def test_eager_calls_give_sample_k_the_same_draws_in_any_batch_size():
    ims = [torch.randint(0, 256, (40 + 3 * k, 50, 3), dtype=torch.uint8) for k in range(6)]
    op = RandomResizedCrop(16)
    small, large = op(ims[:2], rng=5), op(ims, rng=5)
    assert torch.equal(small, large[:2])
    assert not torch.equal(op(ims, rng=6), large)


def pipeline_images(pipe: Pipeline, batch_size: int, seed: int = 9) -> dict[int, torch.Tensor]:
    out = {}
    for bp in Sampler(len(pipe.source), batch_size, shuffle=True, seed=seed).batches(epoch=1):
        batch = pipe.run(bp)
        if batch is None:  # a batch of only the broken sample
            continue
        for i, im in zip(batch.indices.tolist(), batch.images):
            out[i] = im.cpu()
    return out


def test_pipeline_output_per_index_ignores_batch_size_and_failed_neighbours(tmp_path):
    root = make_image_folder(tmp_path / "d", {"a": 6, "b": 5})
    (root / "b" / "9999.jpg").write_bytes(b"\xff\xd8 not a jpeg")  # fails at its header, in some batch
    pipe = Pipeline(open_source(root), ops=[RandomResizedCrop(24), Flip(), ColorJitter(0.3)], num_threads=1)
    pipe.start_epoch(Failures(10, 12))
    try:
        alone, batched = pipeline_images(pipe, 1), pipeline_images(pipe, 5)
    finally:
        pipe.close()
    assert len(alone) == len(batched) == 11 and alone.keys() == batched.keys()
    assert all(torch.equal(alone[i], batched[i]) for i in alone)
    assert len({tuple(im.flatten()[:64].tolist()) for im in alone.values()}) == 11  # every sample drew its own


@pytest.mark.gpu
@requires_cuda
def test_cpu_and_cuda_pipelines_draw_the_same_params(tmp_path):
    """The plan is drawn on the host from the per-sample generators, whatever executes it; the executed
    images then agree within the warp kernel's tolerance against eager CPU ops (bilinear: <= 1 level)."""
    root = make_image_folder(tmp_path / "d", {"a": 6, "b": 5}, size=(120, 150))
    operations = [RandomResizedCrop(48), Flip(), ColorJitter(0.2)]
    pipes = [Pipeline(open_source(root), ops=operations, device=d) for d in ("cpu", "cuda")]
    try:
        for bp in Sampler(11, 4, shuffle=True, seed=2).batches(epoch=0):
            cpu_work, cuda_work = (p.read(bp) for p in pipes)
            for (_, a), (_, b) in zip(cpu_work.ops_plan.drawn, cuda_work.ops_plan.drawn):
                assert all(np.array_equal(x, y) for x, y in zip(a, b)) if isinstance(a, tuple) \
                    else np.array_equal(a, b)
        images = [pipeline_images(p, 4) for p in pipes]
    finally:
        for p in pipes:
            p.close()
    for i, im in images[0].items():
        d = (im.to(torch.int32) - images[1][i].to(torch.int32)).abs()
        assert d.max() <= 3 and d.float().mean() < 0.5  # decoders may differ by a level or two, then jitter


# The batch random source itself.

def test_sample_random_rows_depend_only_on_the_key():
    indices = np.array([7, 3, 12345678901, 0, 7])
    batch = SampleRandom.keyed(11, 4, indices)
    a, b, c = batch.random(6), batch.uniform(-2.0, np.arange(5.0), 3), batch.integers(0, indices + 1)
    for n, i in enumerate(indices):
        alone = SampleRandom.keyed(11, 4, [i])  # the same sample in a batch of its own
        assert np.array_equal(alone.random(6)[0], a[n]) and np.array_equal(alone.uniform(-2.0, n, 3)[0], b[n])
        assert alone.integers(0, i + 1)[0] == c[n]
    assert np.array_equal(a[0], a[4]) and not np.array_equal(a[0], a[1])  # a repeated index: a padding sample
    again = SampleRandom.keyed(11, 4, indices)
    assert np.array_equal(again.random(6), a) and not np.array_equal(again.random(6), a)  # calls advance
    for other in (SampleRandom.keyed(12, 4, indices), SampleRandom.keyed(11, 5, indices),
                  SampleRandom.keyed(11 + (1 << 64), 4, indices)):
        assert (other.random(6) != a).all()


@pytest.mark.parametrize("engine", ["native", "numpy"])
def test_sample_random_streams_are_fixed(engine, monkeypatch):
    """The numbers of a key are fixed by the module (pinned here), whether `ingest._random` made them or numpy."""
    import ingest.random as rnd
    if engine == "native" and rnd.NATIVE is None:
        pytest.skip("ingest._random was not built")
    if engine == "numpy":
        monkeypatch.setattr(rnd, "NATIVE", None)
    src = SampleRandom.keyed(11, 4, np.array([7, 12345678901]))
    assert [x.hex() for x in src.random(3).ravel()] == [
        "0x1.4a9f77636350cp-3", "0x1.c016dd00424e2p-1", "0x1.6c8801f0cbc46p-1",
        "0x1.b5837c595ecffp-1", "0x1.1b8ba72ae77a8p-3", "0x1.591e35f21dbdcp-3"]
    assert [x.hex() for x in src.random()] == ["0x1.4ef9c211e9ae2p-1", "0x1.ce48fb4b8e42cp-1"]
    assert src.random(0).shape == (2, 0) and src.calls == 3
    with pytest.raises(ValueError, match="`k` must be >= 0"):   # either engine, and no draw is counted
        src.random(-1)
    assert src.calls == 3


def test_native_numbers_equal_numpys():
    """`ingest._random` against the numpy arithmetic it replaces, on random keys, call numbers (up to 2**64 - 1)
    and widths, and on keys that are a strided view."""
    import ingest.random as rnd
    if rnd.NATIVE is None:
        pytest.skip("ingest._random was not built")
    rng = np.random.default_rng(5)
    for _ in range(50):
        keys = rng.integers(0, 2 ** 64, int(rng.integers(0, 700)), dtype=np.uint64, endpoint=False)
        calls = int(rng.choice([0, 1, int(rng.integers(0, 2 ** 63)) * 2 + 1]))
        k = None if rng.random() < 0.3 else int(rng.integers(0, 25))
        src = SampleRandom(keys[::-1] if rng.random() < 0.5 else keys, calls=calls)
        want = (src._bits(k) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        src.calls = calls
        assert np.array_equal(src.random(k), want)


def test_sample_random_take_and_spawn():
    src = SampleRandom.keyed(1, 0, np.arange(10))
    child = src.spawn()
    rows = np.array([8, 2, 5])
    assert np.array_equal(child.take(rows).random(4), child.random(4)[rows])  # a subset draws its rows' numbers
    after = src.random(3)
    fresh = SampleRandom.keyed(1, 0, np.arange(10))
    fresh.spawn()
    assert np.array_equal(fresh.random(3), after)  # the child's draws leave the parent's stream alone
    assert not np.isin(child.random(4), after).any()


def test_sample_random_numbers_are_uniform():
    src = SampleRandom.keyed(0, 0, np.arange(20000))
    u = src.random(8)
    assert u.min() >= 0.0 and u.max() < 1.0
    counts = np.histogram(u, bins=64, range=(0, 1))[0]
    expected = u.size / 64
    assert ((counts - expected) ** 2 / expected).sum() < 120  # chi-square, 63 degrees of freedom
    assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.03  # positions of one call
    assert abs(np.corrcoef(u[:-1, 0], u[1:, 0])[0, 1]) < 0.03  # neighbouring indices
    assert abs(np.corrcoef(u[:, 0], src.random(1)[:, 0])[0, 1]) < 0.03  # successive calls
    high = np.arange(1, 20001) % 7 + 1
    k = src.integers(0, high)
    assert (k >= 0).all() and (k < high).all()
    assert np.array_equal(np.unique(k[high == 7]), np.arange(7))
    with pytest.raises(ValueError):
        src.integers(0, np.zeros(20000, dtype=np.int64))
    with pytest.raises(ValueError):
        SampleRandom.keyed(0, 0, [-1])


def test_eager_sources_accept_seeds_and_generators_only():
    assert np.array_equal(per_sample(3, 5).random(2)[:2], per_sample(3, 2).random(2))
    a, b = per_sample(np.random.default_rng(1), 4).random(), per_sample(np.random.default_rng(1), 4).random()
    assert np.array_equal(a, b)
    src = SampleRandom.keyed(0, 0, np.arange(4))
    assert per_sample(src, 4) is src
    with pytest.raises(ValueError):
        per_sample(src, 3)
    with pytest.raises(TypeError):
        per_sample(np.random.default_rng(0).spawn(4), 4)


def test_iou_crop_draws_of_a_sample_ignore_its_neighbours():
    """RandomIoUCrop retries per sample for a data-dependent number of rounds: a sample's crop must still
    be the one it draws alone, whichever neighbours stop early."""
    op = RandomIoUCrop()
    idx = np.arange(64)
    sizes = [size_of(int(i)) for i in idx]
    boxes = [boxes_of(int(i)) if i % 5 else np.zeros((0, 4)) for i in idx]  # some never qualify
    batch = op.draw(sizes, SampleRandom.keyed(2, 1, idx), boxes=boxes)
    assert batch[:, 4].any() and not batch[:, 4].all()
    for n in range(0, 64, 7):
        alone = op.draw([sizes[n]], SampleRandom.keyed(2, 1, idx[n:n + 1]), boxes=[boxes[n]])
        assert np.array_equal(alone[0], batch[n])
