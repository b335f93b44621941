"""What travels between the stages and to the consumer: `_Work` (a batch in flight), `Batch` (a finished
one) and `Failures` (the failure budget a batch counts against), with the helpers that select a batch's rows.

Bad samples: a read, parse, probe or decode failure drops the sample from its batch, logs (name, stage,
reason) and counts against ``max_failures`` (an int: samples; a float in (0, 1): fraction of the epoch);
past the budget the epoch fails with `FailureBudgetExceeded` listing them. With ``max_failures=0`` (the
default) the first failure raises its own typed error (e.g. `DecodeError` naming the file).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from ..errors import ConfigError, FailureBudgetExceeded, IngestError
from ..formats.base import Field, Record, Source, fields_of
from ..ops.boxes import BoxBatch
from ..sampler import BatchPlan

log = logging.getLogger("ingest")


@dataclass
class Batch:
    """What the executor hands the consumer. ``images`` and ``labels`` are on the loader's device."""

    images: torch.Tensor | list[torch.Tensor] | None   # None when the source has no image field
    labels: torch.Tensor
    indices: torch.Tensor                      # int64 dataset indices (CPU)
    is_pad: torch.Tensor                       # bool (CPU): True where the sample only pads the last batch
    fields: dict[str, Any] = field(default_factory=dict)   # every other declared field, collated by kind
    ready: Any = None      # an event (`ingest._driver`) recorded on the ops stream after the batch is complete
    number: int = 0                            # batch number within the epoch (this shard)


@dataclass
class _Work:
    """A batch in flight between stages."""

    plan: BatchPlan
    names: Sequence[str]   # a list, or `_Names` (made on demand)
    indices: np.ndarray
    is_pad: np.ndarray
    records: list[Record]
    sizes: list[tuple[int, int]] = field(default_factory=list)   # probed (oriented) image sizes
    headers: np.ndarray | None = None  # the batch's JPEG header table (`decode.cpu.jpeg_headers`), if probed
    ops_plan: Any = None
    images: Any = None
    origins: list[tuple[float, float]] | None = None   # (x0, y0) in source pixels of each decoded region
    scales: list[float] | None = None   # decoded pixels per source pixel, where a decoder reduced the resolution
    failed: list[int] = field(default_factory=list)   # positions whose decode failed (dummy image in place)
    ready: Any = None   # an event (`ingest._driver`) on the decode stream after the decode (or upload)
    lane: int = 0                                     # the decode lane (decoder and stream) that decoded it
    labels: np.ndarray | None = None                  # the batch's labels when known without records
    boxes: BoxBatch | None = None                     # the samples' boxes as absolute ltrb (detection)
    masks: dict[str, list[np.ndarray]] | None = None  # per mask field, each sample's decoded [H, W] values
    failures: Failures | None = None   # the budget of the batch's epoch: `ReadStage.failures` when it was read
    buffer: Any = None   # a direct read's batch tensor (`images` may be its first rows: `ReadStage._direct_buffer`)


class Failures:
    """The failure budget: records each bad sample, raises when the budget is exceeded.

    ``max_failures``: an int counts samples; a float in [0, 1) is that share of ``epoch_size``, the number of
    samples the epoch reads (padding included, a smaller last batch counted as it is), so 0.5 allows half of
    them. ``epoch_size=None`` (a stream of unknown length) takes counts only.

    Notes
    -----
    Each skipped sample is logged once, by the process that holds the user's budget: ``report=False`` (a
    worker process's budget, whose items travel to the main process's) records without logging.
    ``held=True`` (the budget of an epoch read ahead while the consumer is still in the one before) keeps its
    log lines until `release` (the consumer starting that epoch), so an epoch's warnings come during it and a
    sample read ahead into an epoch that never starts is not reported."""

    def __init__(self, max_failures: int | float, epoch_size: int | None, *, report: bool = True,
                 held: bool = False):
        if isinstance(max_failures, bool) or not isinstance(max_failures, (int, float)) or max_failures < 0:
            raise ConfigError(f"`max_failures` must be an int >= 0 or a fraction in [0, 1), got {max_failures!r}")
        if isinstance(max_failures, float):
            if max_failures >= 1:
                raise ConfigError(f"a fractional `max_failures` must be < 1, got {max_failures}")
            if epoch_size is None:
                raise ConfigError(f"a fractional `max_failures` ({max_failures}) needs the epoch's length, which a "
                                  "streamed iterator does not have: pass a count of samples instead")
            self.budget = int(max_failures * epoch_size)
        else:
            self.budget = max_failures
        self.allowed = max_failures != 0
        self.items: list[tuple[str, str, str]] = []
        self._report, self._held = report, held
        self._lock = threading.Lock()

    def release(self) -> None:
        """Log the failures a held budget kept back, and log later ones as they come (see Notes)."""
        with self._lock:
            if self._held:
                self._held = False
                for item in self.items if self._report else ():
                    _log_skip(*item)

    def add(self, name: str, stage: str, err: BaseException) -> None:
        """Count a failed sample: raise ``err`` when no failure is allowed, else record it."""
        if not self.allowed:
            if isinstance(err, IngestError | OSError):
                raise err
            raise IngestError(f"{name}: {stage} failed: {err}") from err
        self.record(name, stage, f"{type(err).__name__}: {err}")

    def record(self, name: str, stage: str, reason: str) -> None:
        """Record a failure (also one a worker process reported); raise when past the budget."""
        with self._lock:
            self.items.append((name, stage, reason))
            if self._report and not self._held:
                _log_skip(name, stage, reason)
            if len(self.items) > self.budget:
                stages = {}
                for _, s, _ in self.items:
                    stages[s] = stages.get(s, 0) + 1
                raise FailureBudgetExceeded(
                    f"{len(self.items)} samples failed, more than max_failures allows ({self.budget}); by stage: "
                    + ", ".join(f"{s}: {c}" for s, c in stages.items())
                    + f"; first: {self.items[0][0]} ({self.items[0][2]})", list(self.items))


def _log_skip(name: str, stage: str, reason: str) -> None:
    log.warning("ingest: skipping %s (%s failed: %s)", name, stage, reason)


class _Names:
    """The names of a batch's samples, made on demand (only messages need them). A source whose ``name(i)``
    holds only while a batch is read (a stream's) names the batch at once instead (``batch_names``)."""

    def __init__(self, source: Source, indices: np.ndarray):
        self.source, self.indices = source, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int | slice) -> Any:
        if isinstance(k, slice):
            return [self[j] for j in range(len(self))[k]]
        return self.source.name(int(self.indices[k]))

    def __reduce__(self):   # crossing to another process: the names, not the source
        return list, ([self[k] for k in range(len(self))],)


def _select(work: _Work, keep: list[int]) -> _Work:
    return _Work(work.plan, [work.names[k] for k in keep], work.indices[keep], work.is_pad[keep],
                 [work.records[k] for k in keep], failures=work.failures)


_NO_FIELDS = Record(None)


def cuda_tensors(value: Any) -> Iterator[torch.Tensor]:
    """The CUDA tensors in a batch value (tensors, lists, tuples and dicts of them)."""
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from cuda_tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from cuda_tensors(v)


def _select_rows(images: Any, keep: list[int], failed: set[int]) -> Any:
    """The rows of a batch (tensor, array or list) whose samples did not fail. Without failures, the batch
    itself: no fancy indexing, with which numpy gives the GIL up on more than 500 rows (ingest._numpy)."""
    if not failed or images is None:
        return images
    if isinstance(images, torch.Tensor):
        rows = torch.tensor(keep, dtype=torch.long, device=images.device)
        if images.dtype == torch.uint16:   # rows taken as bytes: CUDA has no uint16 indexing
            flat = images.reshape(len(images), -1).view(torch.uint8)[rows].view(torch.uint16)
            return flat.view(len(keep), *images.shape[1:])
        return images[rows]
    if isinstance(images, np.ndarray):
        return images[keep]
    return [images[k] for k in keep]


def split_fields(source: Source) -> tuple[str | None, dict[str, Field]]:
    """The kind of a source's image field ("image", "pixels", or None for none) and its fields other than the
    image and the label."""
    fields = fields_of(source)
    image = fields.get("image")
    extra = {k: f for k, f in fields.items() if k not in ("image", "label")}
    return (image.kind if image is not None else None), extra
