"""Elastic resume: a checkpoint taken on N ranks (rank 0's state alone) resumes on M ranks; the rest of the
epoch covers exactly the samples not yet delivered, each once, in the global order; later epochs equal an
uninterrupted M-rank run; a sample's augmentation does not depend on the ranks, the batch size or a resume."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import ingest
from ingest.errors import ConfigError
from ingest.formats import Field, Location, Record
from ingest.formats.base import check_index
from ingest.ops import Flip, RandomResizedCrop
from ingest.sampler import Sampler

from conftest import textured
from test_fields import Gz

N_SAMPLES, BATCH, SEED = 53, 3, 7
RANKS = (1, 2, 3, 4, 8)


class Tiny:
    """Decoded pixels, so that many simulated ranks stay fast; each image encodes its index."""

    classes: list = []
    fields = {"image": Field("pixels", dtype="uint8"), "label": Field("int")}

    def __init__(self, n=N_SAMPLES):
        self.arrays = [textured(12, 12, seed=i) for i in range(n)]

    def __len__(self):
        return len(self.arrays)

    def locate(self, i):
        return Location(f"tiny{check_index(i, len(self))}", data=b"\x00")

    def parse(self, i, raw):
        return Record(self.arrays[i], i)

    def labels(self):
        return np.arange(len(self), dtype=np.int64)

    def name(self, i):
        return f"tiny{i}"


def _loader(source, rank, world, batch=BATCH, **kw):
    return ingest.Loader(source, batch_size=batch, output="dict", shuffle=True, seed=SEED, shard_id=rank,
                         num_shards=world, **kw)


def _real(batch):
    return [i for i, pad in zip(batch["indices"].tolist(), batch["is_pad"].tolist()) if not pad]


def _run_ranks(make, world, steps):
    """``world`` ranks each take ``steps`` batches; returns (indices delivered, rank 0's state)."""
    delivered, state = [], None
    for rank in range(world):
        loader = make(rank, world)
        it = iter(loader)
        for _ in range(steps):
            delivered += _real(next(it))
        if rank == 0:
            state = loader.state_dict()
    return delivered, state


def _rest(make, world, state, *, epochs=1):
    """Resume ``world`` ranks from ``state``: per rank, the indices of the rest of the epoch, then of
    ``epochs - 1`` further epochs."""
    out = []
    for rank in range(world):
        loader = make(rank, world)
        loader.load_state_dict(state)
        out.append([sum((_real(b) for b in loader), []) for _ in range(epochs)])
    return out


@pytest.mark.parametrize("before,after", list(itertools.product(RANKS, RANKS)))
def test_resume_on_another_number_of_ranks_covers_the_rest_once(before, after):
    source = Tiny()
    make = lambda rank, world: _loader(source, rank, world)  # noqa: E731
    steps = 2
    delivered, state = _run_ranks(make, before, steps)
    assert state["position"] == min(N_SAMPLES, steps * BATCH * before)
    rest = _rest(make, after, state, epochs=2)
    perm = Sampler(N_SAMPLES, BATCH, shuffle=True, seed=SEED).permutation(0).tolist()
    assert sorted(delivered) == sorted(perm[:state["position"]])
    for rank in range(after):  # exact order: every `after`-th sample of the rest of the global order
        assert rest[rank][0] == perm[state["position"] + rank::after]
    assert sorted(delivered + sum((r[0] for r in rest), [])) == list(range(N_SAMPLES))
    for rank in range(after):  # the next epoch is an uninterrupted `after`-rank run's
        plain = _loader(source, rank, after)
        plain.set_epoch(1)
        assert rest[rank][1] == sum((_real(b) for b in plain), [])


def test_resume_with_a_new_batch_size_and_equal_batch_counts():
    source = Tiny()
    delivered, state = _run_ranks(lambda r, w: _loader(source, r, w), 3, 4)
    counts = []
    rest = []
    for rank in range(2):
        loader = _loader(source, rank, 2, batch=5)
        loader.load_state_dict(state)
        batches = list(loader)
        counts.append(len(batches))
        rest += sum((_real(b) for b in batches), [])
    assert len(set(counts)) == 1, "ranks must get the same number of batches"
    assert sorted(delivered + rest) == list(range(N_SAMPLES))


def test_same_configuration_resumes_each_rank_at_its_batch():
    source = Tiny()
    full = [[_real(b) for b in _loader(source, r, 3)] for r in range(3)]
    _, state = _run_ranks(lambda r, w: _loader(source, r, w), 3, 5)
    for rank in range(3):
        loader = _loader(source, rank, 3)
        loader.load_state_dict(state)
        assert [_real(b) for b in loader] == full[rank][5:]


def test_augmentation_depends_on_the_sample_only():
    """The same dataset index gets the same crop whatever the ranks, the batch size or a resume."""
    source = Tiny()
    ops = [RandomResizedCrop(8), Flip()]

    def images(loaders):
        out = {}
        for loader in loaders:
            for b in loader:
                for i, im, pad in zip(b["indices"].tolist(), b["images"], b["is_pad"].tolist()):
                    if not pad:
                        out[i] = im
        return out

    one = images([ingest.Loader(source, batch_size=7, output="dict", shuffle=True, seed=SEED, ops=ops)])
    four = images([_loader(source, r, 4, batch=2, ops=ops) for r in range(4)])
    _, state = _run_ranks(lambda r, w: _loader(source, r, w, ops=ops), 2, 3)
    resumed = []
    for rank in range(3):
        loader = _loader(source, rank, 3, ops=ops)
        loader.load_state_dict(state)
        resumed.append(loader)
    again = images(resumed)
    assert set(one) == set(four) == set(range(N_SAMPLES)) and len(again) > 10
    for i, im in four.items():
        assert torch.equal(im, one[i])
    for i, im in again.items():
        assert torch.equal(im, one[i])


def test_a_checkpoint_at_the_end_of_the_data_moves_to_the_next_epoch():
    source = Tiny(10)
    loader = _loader(source, 0, 2, batch=5)
    it = iter(loader)
    next(it)
    state = loader.state_dict()   # 2 ranks x 5 = all 10 samples delivered
    resumed = _loader(source, 0, 3, batch=2)
    resumed.load_state_dict(state)
    next(iter(resumed))
    assert resumed.epoch == 1


def test_another_dataset_order_is_refused():
    source = Tiny()
    _, state = _run_ranks(lambda r, w: _loader(source, r, w), 2, 1)
    with pytest.raises(ConfigError, match="num_samples"):
        _loader(Tiny(40), 0, 2).load_state_dict(state)
    with pytest.raises(ConfigError, match="offset"):
        _loader(source, 0, 2).load_state_dict({**state, "offset": N_SAMPLES + 1})


@pytest.mark.parametrize("before,after", [(1, 3), (3, 2), (2, 4)])
def test_streamed_sources_resume_elastically(before, after):
    """Compressed shards: the global sequence (shard order + shuffle buffer) does not depend on the ranks,
    so the same rule holds, by replay."""
    make = lambda rank, world: _loader(Gz(), rank, world, shuffle_buffer=4)  # noqa: E731
    delivered, state = _run_ranks(make, before, 1)
    rest = _rest(make, after, state)
    assert sorted(delivered + sum((r[0] for r in rest), [])) == list(range(21))
