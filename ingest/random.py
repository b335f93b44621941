"""Per-sample random numbers for a whole batch at once: a counter-based source keyed by sample.

Sample n of a batch has a 64-bit key, in the pipeline a hash of ``(seed, epoch, dataset index)``
(:meth:`SampleRandom.keyed`). Every number it gets is a pure function of its key, the number of the draw
call and the position within that call::

    bits[n, j] = mix(key[n], call, j)      # splitmix64's finalizer, chained: no state per sample

so a sample's numbers do not depend on the batch it is in, its position there, the batch size, the number
of shards, a resume or its neighbours, and a whole batch's numbers are a few vectorized numpy operations
(no Python loop over samples). Each draw method advances the call counter by one, whatever it draws, so
successive draws differ; an op must therefore make the same calls for every batch (a count that depends on
its config, never on the data). An op that needs a data-dependent number of draws for some samples (an IoU
crop retrying until one qualifies) takes a :meth:`~SampleRandom.spawn` (one call of its parent) and draws
from that child's :meth:`~SampleRandom.take` subsets, which give samples the numbers the whole batch would.

The numbers are 53-bit uniform floats and integers derived from them; they are for augmentation, not
cryptography. The streams are fixed by this module (stable across numpy versions and machines).
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

try:   # built by setup.py where a C compiler is found: a batch's numbers in one call that keeps the GIL
    from . import _random as NATIVE
except ImportError:
    NATIVE = None

_MASK = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_SPAWN = 0x5350_4157_4E00_0001  # a call number no draw reaches: tags child keys
_TO_UNIT = 2.0 ** -53


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 arrays (a bijection with full avalanche); products wrap mod 2**64."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> _S30)
        x = x * _M1
        x = x ^ (x >> _S27)
        x = x * _M2
        return x ^ (x >> _S31)


def _combine(h: np.ndarray, v: np.ndarray | int) -> np.ndarray:
    """A new hash of ``h`` and the value(s) ``v`` (uint64 arrays broadcast against each other)."""
    with np.errstate(over="ignore"):
        return _mix(h ^ _mix(np.asarray(v, dtype=np.uint64) + _GOLDEN))


def _words(value: int) -> list[int]:
    """A non-negative int as 64-bit words, low first (at least one)."""
    if value < 0:
        raise ValueError(f"a random seed must be >= 0, got {value}")
    words = [value & _MASK]
    value >>= 64
    while value:
        words.append(value & _MASK)
        value >>= 64
    return words


def sample_keys(seed: int, epoch: int, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """The uint64 key of each dataset index for ``(seed, epoch)``: a hash of the three."""
    idx = np.asarray(indices).reshape(-1)
    if idx.size and idx.min() < 0:
        raise ValueError("dataset indices must be >= 0")
    return _combine(_prefix(int(seed), int(epoch)), idx.astype(np.uint64))


@functools.lru_cache(maxsize=16)
def _prefix(seed: int, epoch: int) -> np.ndarray:
    """The hash of ``(seed, epoch)`` that every key of the epoch starts from (read-only): made once per epoch,
    not per batch slice (it is a dozen numpy calls on one element each)."""
    h = np.zeros(1, dtype=np.uint64)
    for word in _words(seed) + [len(_words(seed))] + _words(epoch):
        h = _combine(h, word)
    h.flags.writeable = False
    return h


def _bound(value: float | np.ndarray, k: int | None, dtype: type) -> np.ndarray:
    """A draw's bound, a number or one per sample, shaped to broadcast against ``[B]`` or ``[B, k]``."""
    v = np.asarray(value, dtype=dtype)
    return v[:, None] if k is not None and v.ndim == 1 else v


class SampleRandom:
    """The random source of a batch: one key per sample, numbers drawn for all samples at once.

    ``SampleRandom(keys)`` takes the keys (uint64, one per sample); :meth:`keyed` makes them from
    ``(seed, epoch, dataset indices)`` and :meth:`eager` from a seed for samples ``0..n-1``. Every draw
    returns one row per sample: ``random(k)`` is ``[B, k]``, ``random()`` is ``[B]``. Sample n's stream is a
    pure function of ``keys[n]``: the same key gives the same numbers in any batch, at any position.
    """

    def __init__(self, keys: np.ndarray, *, calls: int = 0):
        self.keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
        self.calls = calls

    @classmethod
    def keyed(cls, seed: int, epoch: int, indices: Sequence[int] | np.ndarray) -> "SampleRandom":
        """The pipeline's source: sample n keyed by ``(seed, epoch, indices[n])``."""
        return cls(sample_keys(seed, epoch, indices))

    @classmethod
    def eager(cls, seed: int, n: int) -> "SampleRandom":
        """Samples ``0..n-1`` keyed by ``seed`` (as dataset indices ``0..n-1`` of epoch 0 would be): sample k
        gets the same numbers whatever ``n`` is."""
        return cls.keyed(seed, 0, np.arange(n))

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        return f"SampleRandom({len(self)} samples, calls={self.calls})"

    def _bits(self, k: int | None) -> np.ndarray:
        """Fresh uint64 words, ``[B, k]`` (``[B]`` when k is None); advances the call counter."""
        h = _combine(self.keys, self.calls)
        self.calls += 1
        if k is None:
            return _mix(h)
        return _combine(h[:, None], np.arange(k, dtype=np.uint64))

    def random(self, k: int | None = None) -> np.ndarray:
        """Uniform float64 in [0, 1), 53 random bits each: ``[B, k]``, or ``[B]`` when k is None. Computed by
        ``ingest._random`` where it was built (the same numbers; numpy's ~15 array operations each let the
        GIL go on a large batch, which costs a loader in the training process up to a switch interval each)."""
        if k is not None and k < 0:
            raise ValueError(f"`k` must be >= 0, got {k}")
        if NATIVE is None:
            return (self._bits(k) >> np.uint64(11)).astype(np.float64) * _TO_UNIT
        out = np.empty(len(self.keys) if k is None else (len(self.keys), k), dtype=np.float64)
        NATIVE.uniform(np.ascontiguousarray(self.keys), self.calls, -1 if k is None else k, out)
        self.calls += 1
        return out

    def uniform(self, low: float | np.ndarray, high: float | np.ndarray, k: int | None = None) -> np.ndarray:
        """Uniform in [low, high); bounds are numbers or per-sample ``[B]`` arrays."""
        low, high = _bound(low, k, np.float64), _bound(high, k, np.float64)
        return low + (high - low) * self.random(k)

    def integers(self, low: int | np.ndarray, high: int | np.ndarray, k: int | None = None) -> np.ndarray:
        """Integers in [low, high) (``high > low``), bounds numbers or per-sample ``[B]`` arrays:
        ``low + floor(u * (high - low))`` of a 53-bit uniform u, so the bias is below ``(high - low) / 2**53``."""
        low, high = _bound(low, k, np.int64), _bound(high, k, np.int64)
        if (high <= low).any():
            raise ValueError("`integers` needs high > low for every sample")
        span = high - low
        return low + np.minimum((self.random(k) * span).astype(np.int64), span - 1)

    def advance(self, calls: int) -> int:
        """Take ``calls`` call numbers for a draw made elsewhere from this source's keys (native code that
        draws for a whole op: `ingest._random`); returns the first."""
        first = self.calls
        self.calls += calls
        return first

    def spawn(self) -> "SampleRandom":
        """A child source (one call of this one): its keys hash this source's keys and call number, so it can
        make any number of draws, on any subset of the samples, without touching this stream."""
        child = SampleRandom(_combine(_combine(self.keys, self.calls), _SPAWN))
        self.calls += 1
        return child

    def take(self, rows: np.ndarray | Sequence[int]) -> "SampleRandom":
        """The samples ``rows`` at this point of the stream: they draw what they would in the whole batch.
        Draws on the subset do not advance this source."""
        return SampleRandom(self.keys[np.asarray(rows, dtype=np.int64)], calls=self.calls)
