"""Loading from streamed sources: GZIP TFRecords and gzipped tars cannot be read at offsets, so they are read
front to back (`ingest.formats.base`: ``streamed = True``, ``shards``, ``iter_shard(k, skip)``).

The order of an epoch is a pure function of ``(seed, epoch)``, as for seekable sources:

1. shard order: a permutation of the shards (``shuffle=True``) or their listed order;
2. a bounded shuffle buffer (``buffer_size`` records, ``shuffle=True`` only): fill it, then each new record
   takes the place of a randomly chosen one, which is emitted; at the end the rest leave in random order;
3. that global sequence is striped over the ranks: position ``g`` goes to rank ``g % num_shards``.

Every rank therefore reads (decompresses) every shard and keeps its stripe: exact and balanced, at the cost
of reading the data once per rank. The record count is taken once, on first use, by one pass over the
shards (cached per `StreamedSource`); with it every rank gets the same number of batches (the last one
padded with repeats of the rank's first samples, marked in ``is_pad``, as for seekable sources under
sharding), ``len()`` works, and each record gets a stable dataset index (its position in the unshuffled
order) that keys its random augmentation.

Resume is exact by replay: the epoch's sequence is regenerated and the delivered records skipped (they are
decompressed again but not decoded). Because the global sequence does not depend on the number of ranks,
a position saved on N ranks can be resumed on M (see `ingest.torch.Loader.load_state_dict`).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from .errors import ConfigError
from .formats.base import Location, Record, fields_of
from .sampler import BatchPlan, Sampler

DEFAULT_BUFFER = 1024


class StreamedSource:
    """A streamed format presented to the pipeline as a source of held records, plus the `BatchPlan`s of an
    epoch. Batch sizes, counts and padding follow a `Sampler` over the counted records (one rule for both
    kinds of source); the records fill them in stream order. The read stage iterates `plans` and then calls
    `locate`/`parse` for the plan's dataset indices (on the same thread)."""

    def __init__(self, source: Any, *, buffer_size: int = DEFAULT_BUFFER):
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ConfigError(f"`shuffle_buffer` must be an int >= 1, got {buffer_size!r}")
        self.source = source
        self.classes = list(getattr(source, "classes", ()))
        self.fields = fields_of(source)
        self.buffer_size = buffer_size
        self._counts: np.ndarray | None = None   # records per shard
        self._held: dict[int, tuple[str, Record]] = {}   # dataset index -> record, for the batch being read

    def shard_counts(self) -> np.ndarray:
        """Records per shard (one pass over the data, the first time)."""
        if self._counts is None:
            self._counts = np.array([sum(1 for _ in self.source.iter_shard(k, 0))
                                     for k in range(len(self.source.shards))], dtype=np.int64)
        return self._counts

    def __len__(self) -> int:
        """Records in the dataset."""
        return int(self.shard_counts().sum())

    def global_order(self, epoch: int, *, shuffle: bool, seed: int) -> Iterator[tuple[int, str, Record]]:
        """``(dataset index, name, record)`` of the whole epoch in its global order (all ranks)."""
        counts = self.shard_counts()
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        shards = np.arange(len(counts))
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 0x5EED])))
        if shuffle:
            shards = rng.permutation(shards)

        def natural():
            for k in shards:
                for j, (name, record) in enumerate(self.source.iter_shard(int(k), 0)):
                    yield int(starts[k]) + j, name, record

        if not shuffle:
            yield from natural()
            return
        buffer: list[tuple[int, str, Record]] = []
        for item in natural():
            if len(buffer) < self.buffer_size:
                buffer.append(item)
                continue
            j = int(rng.integers(len(buffer)))
            buffer[j], item = item, buffer[j]
            yield item
        for j in rng.permutation(len(buffer)):
            yield buffer[j]

    def plans(self, sampler: Sampler, epoch: int, start: int = 0, offset: int = 0) -> Iterator[BatchPlan]:
        """This rank's batches of ``epoch`` from batch ``start`` on, shaped by ``sampler`` (built over
        ``len(self)`` records), skipping the first ``offset`` records of the global sequence (an elastic
        resume). A batch's records are held until the next batch is planned."""
        world, rank, bs = sampler.num_shards, sampler.shard_id, sampler.batch_size
        stripe = ((index, name, record) for g, (index, name, record) in
                  enumerate(self.global_order(epoch, shuffle=sampler.shuffle, seed=sampler.seed))
                  if g >= offset and (g - offset) % world == rank)
        first: list[tuple[int, str, Record]] = []   # the rank's first samples, repeated to pad
        skip = start * bs
        for _ in range(skip):
            item = next(stripe, None)
            if item is not None and len(first) < bs:
                first.append(item)
        for plan in sampler.batches(epoch, start, offset):
            items = []
            for pad in plan.is_pad:
                item = None if pad else next(stripe, None)
                if item is None:
                    if not first:
                        raise ConfigError("a streamed source has fewer records than counted; it changed "
                                          "while being read")
                    item = first[len(items) % len(first)]
                elif len(first) < bs:
                    first.append(item)
                items.append(item)
            self._held = {index: (name, record) for index, name, record in items}
            yield BatchPlan(epoch, plan.number, np.array([i[0] for i in items], dtype=np.int64), plan.is_pad,
                            plan.seed, plan.root)

    # -- the Source side ------------------------------------------------------------------------------
    def locate(self, i: int) -> Location:
        name, record = self._held[i]
        return Location(name, data=record.image if record.image is not None else b"\0")

    def parse(self, i: int, raw: Any) -> Record:
        return self._held[i][1]

    def name(self, i: int) -> str:
        return self._held[i][0]

    def batch_names(self, indices: Any) -> list[str]:
        """The names of a batch, made while it is held (`name` fails once the next batch is)."""
        return [self._held[int(i)][0] for i in indices]

    def labels(self) -> np.ndarray:
        """Labels are known only as records stream by."""
        return np.full(0, -1, dtype=np.int64)
