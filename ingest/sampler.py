"""Which samples go in which batch: a per-epoch permutation from a seed, sharding across ranks, the
last-batch policy, and a resumable position.

The order of an epoch is a pure function of ``(seed, epoch)``: a permutation of the whole dataset drawn
from ``numpy.random.SeedSequence([seed, epoch])`` (stable across machines and numpy versions). Rank ``r`` of
``num_shards`` takes every ``num_shards``-th element of it starting at ``r``, so shards are disjoint and
together hold every sample, and after every rank's first ``b`` batches exactly a prefix of the global order
has been delivered (`Sampler.position`). That prefix does not depend on the number of shards, which is what
makes resume elastic: a checkpoint taken on N ranks resumes on M by skipping the prefix (``offset``) and
sharding the rest of the epoch over the M ranks; later epochs are ordinary M-rank epochs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ConfigError
from .random import SampleRandom

LAST_BATCH = ("drop", "partial", "pad")


@dataclass(frozen=True)
class BatchPlan:
    """One batch: which dataset indices, which of them are padding, and the seed of its randomness."""

    epoch: int
    number: int                 # batch index within the epoch (this shard)
    indices: np.ndarray         # int64 dataset indices
    is_pad: np.ndarray          # bool, True where the sample only pads the last batch
    seed: np.random.SeedSequence
    root: int = 0               # the loader's seed

    def rng(self) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(self.seed))

    def sample_rngs(self, start: int = 0, stop: int | None = None) -> SampleRandom:
        """The batch's per-sample random source, sample n keyed by ``(seed, epoch, dataset index)`` only: a
        sample's random augmentation does not depend on the batch size, the number of shards, a resume or
        its neighbours (:mod:`ingest.random`). ``start``/``stop``: that slice of the batch's samples only."""
        return SampleRandom.keyed(self.root, self.epoch, self.indices[start:stop])


class Sampler:
    """Batches of dataset indices for one shard, epoch after epoch.

    last_batch: ``drop`` (only full batches; every shard gets ``(n // num_shards) // batch_size``),
    ``partial`` (a smaller last batch; with several shards their batch counts can differ by one, which
    stalls a DDP step: the Loader defaults to ``pad`` when sharded),
    ``pad`` (every shard gets ``ceil(ceil(n / num_shards) / batch_size)`` full batches, the missing places
    filled by repeating the shard's first samples and marked in ``is_pad``).
    """

    def __init__(self, n: int, batch_size: int, *, shuffle: bool = False, seed: int = 0,
                 shard_id: int = 0, num_shards: int = 1, last_batch: str = "partial"):
        if batch_size < 1:
            raise ConfigError(f"`batch_size` must be >= 1, got {batch_size}")
        if num_shards < 1:
            raise ConfigError(f"`num_shards` must be >= 1, got {num_shards}")
        if not 0 <= shard_id < num_shards:
            raise ConfigError(f"`shard_id` must be in [0, {num_shards}), got {shard_id}")
        if last_batch not in LAST_BATCH:
            raise ConfigError(f"`last_batch` must be one of {', '.join(LAST_BATCH)}; got {last_batch!r}")
        if seed < 0:
            raise ConfigError(f"`seed` must be >= 0, got {seed}")
        self.n, self.batch_size, self.shuffle, self.seed = n, batch_size, shuffle, seed
        self.shard_id, self.num_shards, self.last_batch = shard_id, num_shards, last_batch

    def shard_length(self, shard_id: int | None = None, offset: int = 0) -> int:
        """Samples of shard ``shard_id`` (default: this one) in an epoch whose first ``offset`` samples of the
        global order were delivered before (an elastic resume, see `position`)."""
        s = self.shard_id if shard_id is None else shard_id
        return len(range(offset + s, self.n, self.num_shards))

    def __len__(self) -> int:
        """Batches per epoch for this shard."""
        return self.num_batches()

    def num_batches(self, offset: int = 0) -> int:
        """Batches for this shard in an epoch that starts ``offset`` samples into its global order."""
        bs, m = self.batch_size, self.n - offset
        if self.last_batch == "drop":
            return (m // self.num_shards) // bs
        if self.last_batch == "pad":
            return -(-(-(-m // self.num_shards)) // bs)
        return -(-self.shard_length(offset=offset) // bs)

    def samples(self, start: int = 0, offset: int = 0) -> int:
        """How many samples (padding included) batches ``start`` .. end of an epoch hold for this shard."""
        count = self.num_batches(offset)
        if start >= count:
            return 0
        total = self.shard_length(offset=offset) if self.last_batch == "partial" else count * self.batch_size
        return total - start * self.batch_size

    def permutation(self, epoch: int) -> np.ndarray:
        """The epoch's global order (every shard's samples): a pure function of (seed, epoch)."""
        if self.shuffle:
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
            return rng.permutation(self.n).astype(np.int64)
        return np.arange(self.n, dtype=np.int64)

    def order(self, epoch: int, offset: int = 0) -> np.ndarray:
        """This shard's dataset indices for ``epoch``, in order: every ``num_shards``-th element of the global
        order from position ``offset + shard_id``."""
        return self.permutation(epoch)[offset + self.shard_id::self.num_shards]

    def position(self, batch: int, offset: int = 0) -> int:
        """Samples of the global order delivered once every shard has delivered ``batch`` batches of an epoch
        that started at ``offset``: shards take turns through the global order, so that is a prefix of it.
        Synchronous data-parallel training has every rank at the same batch, so rank 0's position says what
        the whole job has consumed, whatever the number of ranks."""
        return min(self.n, offset + batch * self.batch_size * self.num_shards)

    def _epoch(self, epoch: int, offset: int) -> tuple[np.ndarray, np.ndarray, int]:
        """The epoch's batches end to end: this shard's indices (padded where ``last_batch="pad"``), their padding
        flags and the number of batches."""
        order = self.order(epoch, offset)
        count = self.num_batches(offset)
        if self.last_batch == "pad" and len(order):
            need = count * self.batch_size
            reps = -(-need // len(order))
            padded = np.tile(order, reps)[:need]
            is_pad = np.arange(need) >= len(order)
            order = padded
        else:
            is_pad = np.zeros(len(order), dtype=bool)
        return order, is_pad, count

    def batches(self, epoch: int, start: int = 0, offset: int = 0):
        """Yield the epoch's `BatchPlan`s from batch number ``start`` on; ``offset``: samples of the global
        order already delivered (by a run with another number of shards) that this epoch skips."""
        order, is_pad, count = self._epoch(epoch, offset)
        bs = self.batch_size
        for b in range(start, count):
            sl = slice(b * bs, min((b + 1) * bs, len(order)))
            yield BatchPlan(epoch, b, order[sl], is_pad[sl],
                            np.random.SeedSequence([self.seed, epoch, self.shard_id, b]), self.seed)

    def flat(self, epoch: int, start: int = 0, offset: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The batches `batches` yields, at once and without their plans: the indices and padding flags of batches
        ``start`` .. end end to end, and their bounds (batch ``start + j`` holds items ``bounds[j]`` ..
        ``bounds[j + 1]``; one bound, 0, where no batch is left)."""
        order, is_pad, count = self._epoch(epoch, offset)
        bs, first = self.batch_size, start * self.batch_size
        if start >= count:
            return order[:0], is_pad[:0], np.zeros(1, np.int64)
        ends = np.minimum(np.arange(start, count + 1, dtype=np.int64) * bs, len(order)) - first
        return order[first:first + int(ends[-1])], is_pad[first:first + int(ends[-1])], ends
