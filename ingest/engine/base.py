"""The stage contract, said once, and what every stage counts.

A stage is one step of a batch's way from the sampler to the consumer (read -> decode -> ops). It is a
`Stage`: an object made once per `Pipeline` whose `Stage.run` takes one item and returns the next, with no
threads of its own (the `Executor` or a worker process runs it). Every stage's docstring has these
sections (``tests/test_engine.py`` checks them):

- **Takes**: what `run` is given (a `BatchPlan`, or the `_Work` the stage before returned).
- **Returns**: what `run` gives the stage after (a `_Work`, or the finished `Batch`); None drops the batch.
- **Owns**: what it made and releases (readers, decoders, streams, buffers); **Uses**, where it has any:
  what it is given and leaves to its owner.
- **Stops**: what `close()` releases. `Pipeline.close` calls it once, after the threads that ran the stage
  have stopped; `run` is not called again.
- Every stage counts into `stats`, a `StageStats` (the executor times each `run` into it).

Rules: a stage's attributes are set by its own constructor and methods only. What others may change (the
failure budget of the epoch being read, where batches are delivered) is a method of the stage; what two
stages share (the CPU decoder, the decode lanes, the direct-read buffers handed back) is given to both by
the `Pipeline` that makes them, and the docstrings say which one owns it. State that crosses a thread or a
process travels in `_Work` (between stages) or `Batch` (to the consumer), never in stage attributes.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar


class StageStats:
    """Busy time of a stage, the CPU time its thread(s) spent in it, and how full the queue after it was when it
    put a batch (summed; see as_dict). The CPU time is the calling thread's own: the work it does holding the
    GIL (Python, numpy, torch calls' host side), not the native threads it waits on (reads, nvImageCodec), so
    the stages' CPU seconds per batch, added up, say how much of the GIL a batch needs in this process."""

    def __init__(self, name: str):
        self.name, self.busy, self.cpu, self.batches, self.occupancy = name, 0.0, 0.0, 0, 0
        self._lock = threading.Lock()

    def timed(self, fn: Callable, item: Any) -> Any:
        """``fn(item)``, its time added to this stage's busy seconds (a stage of several threads: their sum)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(item)
        finally:
            with self._lock:
                self.busy += time.perf_counter() - t0
                self.cpu += time.thread_time() - c0
                self.batches += 1

    def add(self, busy: float, cpu: float, batches: int, occupancy: int) -> None:
        """Add another process's counts of this stage (reader or worker processes)."""
        self.busy, self.cpu = self.busy + busy, self.cpu + cpu
        self.batches, self.occupancy = self.batches + batches, self.occupancy + occupancy

    def counts(self) -> tuple[float, float, int, int]:
        """What `add` takes: busy and CPU seconds, batches, summed occupancy."""
        return self.busy, self.cpu, self.batches, self.occupancy

    def as_dict(self, depth: int) -> dict[str, float]:
        return {"seconds": round(self.busy, 4), "cpu_seconds": round(self.cpu, 4), "batches": self.batches,
                "mean_queue_after": round(self.occupancy / max(self.batches, 1), 3), "queue_depth": depth}


class Stage(ABC):
    """One step of the per-batch path (see the module docstring for the contract every stage states)."""

    #: The stage's name in `STAGES` and in ``Loader.stats()["stages"]``.
    name: ClassVar[str]

    def __init__(self) -> None:
        self.stats = StageStats(self.name)   # over every epoch

    @abstractmethod
    def run(self, item: Any) -> Any:
        """The stage's work on one batch: the item for the next stage, or None to drop the batch."""

    def close(self) -> None:
        """Release what the stage owns; `run` is not called after."""
