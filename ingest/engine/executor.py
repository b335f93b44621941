"""The executor: a `Pipeline`'s stages run on their own threads, joined by bounded queues.

::

    sampler ──BatchPlan──> [read]  ──bytes──> [decode] ──images──> [ops] ──Batch──> consumer
                          I/O pool            CPU pool or           one fused warp
                          (KvikIO/pread)      nvImageCodec on       + rest, on the ops
                                              a lane's stream       CUDA stream
                                              (lanes in turn)

Each stage takes from the queue before it and puts into the one after it (``prefetch`` deep), so reading
batch k+2, decoding k+1 and augmenting k overlap with the training step on batch k; with two decode lanes
(the GPU default) two batches decode at once, each lane on its own thread. GPU work is ordered by CUDA
events, never by host synchronisation; the consumer's stream waits on the batch's event.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from .. import defaults
from .._driver import bind_thread
from ..sampler import BatchPlan
from .base import StageStats
from .batch import Batch, Failures, _Work
from .lifecycle import CLOSE_AT_EXIT

if TYPE_CHECKING:
    from .pipeline import Pipeline


class _End:
    pass


@dataclass
class EpochEnd:
    """In a run of several epochs, what passes through the stages between one epoch's batches and the next's:
    the next epoch's number and the failure budget its batches count against."""

    epoch: int
    failures: Failures


class _Raised:
    def __init__(self, exc: BaseException):
        self.exc = exc


class _Slots:
    """A queue of ``depth`` places, each taken by its producer before it starts on a batch (`reserve`) and
    freed when the consumer takes the batch out (`get`): a stage never holds a finished batch, and the device
    memory in it, while it waits for room. Ends and errors pass without a place."""

    def __init__(self, stop: threading.Event, depth: int):
        self.stop, self.items, self.free = stop, queue.Queue(), threading.Semaphore(depth)

    def reserve(self) -> bool:
        """Take a place; False once the executor stops."""
        while not self.stop.is_set():
            if self.free.acquire(timeout=0.05):
                return True
        return False

    def get(self) -> Any:
        """The next item (None once the executor stops); its place is free again."""
        while not self.stop.is_set():
            try:
                item = self.items.get(timeout=0.05)
            except queue.Empty:
                continue
            if not isinstance(item, (_End, _Raised)):
                self.free.release()
            return item
        return None

    def clear(self) -> None:
        while not self.items.empty():
            self.items.get_nowait()


class _Turns:
    """`_Slots` taken in turn: batch k goes to (and comes from) the k % n-th, so the decode lanes' batches come
    back in order. The end of the epoch goes to every one, so that every lane stops; an error goes where the
    next batch would have."""

    def __init__(self, slots: list[_Slots]):
        self.slots = slots
        self.put_turn = self.get_turn = 0

    def reserve(self) -> bool:
        return self.slots[self.put_turn % len(self.slots)].reserve()

    def cancel(self) -> None:
        """Give back the place `reserve` took (no batch came of it)."""
        self.slots[self.put_turn % len(self.slots)].free.release()

    def put(self, item: Any) -> None:
        for slot in self.slots if isinstance(item, _End) else [self.slots[self.put_turn % len(self.slots)]]:
            slot.items.put(item)
        self.put_turn += 1

    def get(self) -> Any:
        item = self.slots[self.get_turn % len(self.slots)].get()
        self.get_turn += 1
        return item

    def qsize(self) -> int:
        return sum(slot.items.qsize() for slot in self.slots)


class Executor:
    """A `Pipeline` run on stage threads (read, one per decode lane, ops) over ``plans``: iterate it for
    `Batch`es. Where the plans hold an `EpochEnd` between two epochs, iteration stops there (`ended` holds it)
    while the threads go on into the next epoch, and iterating again continues with its batches: the pipeline
    does not drain and refill between epochs. `close()` (also on garbage collection, ``break`` or an exception)
    stops every thread and leaves none behind. Executors still running when the interpreter exits are closed
    by an exit hook, before finalization: a stage thread left inside a torch call while the interpreter
    finalizes aborts the process ("terminate called without an active exception").

    The ops stage runs its torch CPU ops on the ``ops_threads`` setting's intra-op threads (half the cores
    unless set), not torch's default of every core: the decode pool keeps the cores busy meanwhile, and
    OpenMP threads spinning beside it slow the ops stage several times over (see `ingest.defaults`)."""

    def __init__(self, pipeline: Pipeline, plans: Iterator[BatchPlan], *, prefetch: int = 2,
                 read: Callable[[BatchPlan], _Work] | None = None):
        self.pipeline = pipeline
        self.prefetch = prefetch
        self._stop = threading.Event()
        self.stats = pipeline.stage_stats
        # ``read``: what the read stage does instead of `Pipeline.read` (reader processes: receive the batch)
        self._read = read
        # The decode stage runs one thread per decode lane: batch k goes to lane k % lanes, and the ops stage
        # takes them back in the same turn, so batches stay in order. Each stage takes a place in the queue after
        # it before it starts a batch (`_Slots`); decoded batches hold device memory, so the lanes share the
        # ``prefetch`` places after the decode stage.
        lanes = len(pipeline.lanes)
        # Outputs in flight: those queued (``prefetch``), the one the consumer holds, the one it held before.
        pipeline.start_outputs(prefetch + 1 if pipeline.consumer_stream is not None else None, self._stop)
        to_decode = [_Slots(self._stop, prefetch) for _ in range(lanes)]
        decoded = [_Slots(self._stop, max(1, prefetch // lanes)) for _ in range(lanes)]
        self._out = _Slots(self._stop, prefetch)
        self._queues = [*to_decode, *decoded, self._out]
        plans = iter(plans)
        # (work, take an item, where results go, stats, torch intra-op threads (None: torch's), thread name)
        stages = [(read or pipeline.read, lambda: next(plans, _End()), _Turns(to_decode), self.stats[0], None,
                   "read")]
        for k in range(lanes):
            stages.append((lambda work, k=k: pipeline.decode(work, k), to_decode[k].get, _Turns([decoded[k]]),
                           self.stats[1], None, f"decode{k or ''}"))
        stages.append((pipeline.transform, _Turns(decoded).get, _Turns([self._out]), self.stats[2],
                       defaults.ops_threads(), "ops"))
        self._threads = [threading.Thread(target=self._run_stage, name=f"ingest-{name}", daemon=True, args=args)
                         for *args, name in stages]
        self._closed = False
        self.ended: EpochEnd | None = None   # the epoch end the consumer reached last, until the next epoch is taken
        CLOSE_AT_EXIT.add(self)
        for t in self._threads:
            t.start()

    def _run_stage(self, fn, take, out: _Turns, stats: StageStats, threads: int | None) -> None:
        bind_thread(self.pipeline.device)
        if threads is not None:
            set_thread_torch_threads(threads)
        try:
            while out.reserve():   # room for the result first: no finished batch waits in this thread
                item = take()
                if item is None:   # stopped
                    return
                if isinstance(item, (_End, _Raised)):
                    out.cancel()
                    out.put(item)
                    return
                if isinstance(item, EpochEnd):   # takes its place like a batch: it keeps the lanes' turns
                    out.put(item)
                    continue
                result = stats.timed(fn, item)
                stats.occupancy += out.qsize()
                if result is None:
                    out.cancel()
                else:
                    out.put(result)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, re-raised there
            out.put(_Raised(exc))

    def __iter__(self) -> "Executor":
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        item = self._out.get()
        if isinstance(item, EpochEnd):   # the threads go on into the next epoch
            self.ended = item
            raise StopIteration
        if item is None or isinstance(item, _End):
            self.close()
            raise StopIteration
        if isinstance(item, _Raised):
            self.close()
            raise item.exc
        return item

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        CLOSE_AT_EXIT.discard(self)
        self._stop.set()
        if hasattr(self._read, "close"):
            self._read.close()   # a read stage waiting on other processes stops waiting
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()
        for q in self._queues:
            q.clear()
        self.pipeline.end_outputs(self._stop)   # unless another executor's run started since

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def set_thread_torch_threads(n: int) -> None:
    """Run the calling thread's torch CPU ops on ``n`` intra-op threads, leaving other threads' counts alone.
    torch keeps the count per thread (OpenMP's) but also records it as the count of threads that start using
    torch later (the user's among them): that default is put back from a short-lived thread."""
    default = torch.get_num_threads()
    if n == default:
        return
    torch.set_num_threads(n)
    restore = threading.Thread(target=torch.set_num_threads, args=(default,), name="ingest-threads")
    restore.start()
    restore.join()
