"""Worker processes: ``Loader(num_workers=W)`` runs W processes, batch ``b`` of an epoch going to worker
``b % W`` (DataLoader's scheme), and hands the batches over in order. What a worker runs (``stages``):

- ``"read"``: the read stage only (read, parse, probe the headers, draw the augmentation), into shared
  memory buffers reused in turn (`buffer_slots`); the training process receives the batch's `_Work` (each
  sample's range in the buffer; the buffer's handle only the first time), copies the bytes out at once and
  runs decode and ops on its own threads and its one CUDA context. The per-file Python work leaves the training process's GIL, and no
  second CUDA context time-slices the GPU or holds memory.
- ``"all"`` (the default): the whole pipeline per worker, batches coming back as below.

Why processes: nvImageCodec's Python binding (0.9) gives up and retakes the GIL for every image it parses,
decodes or returns, so next to one busy Python thread (the training loop is such a thread) a batch's decode
takes hundreds of times as long as alone (``docs/measurements.md``, section The in-process CUDA loader).
A worker process has its own GIL, so its decode runs at the speed it has alone, and several workers feed
the hardware decoder in parallel.

CUDA images cross the process boundary through CUDA IPC (`torch.multiprocessing`): the worker makes its
default stream wait for the batch, so the IPC event orders the consumer after the worker's kernels; the
consumer copies the batch into its own memory on a side stream, makes its stream wait for the copy (no host
sync) and drops the shared tensor once the copy has run, so the worker may reuse the memory and the user
gets ordinary tensors that outlive the workers. A ragged batch's images, views of one buffer, cross as that
buffer (`_Views`). Labels and the other fields (boxes, categories: small) stay on the worker's CPU, cross
inside the message and go to the GPU in the training process: every CUDA tensor that crosses costs an IPC
handle, an IPC event and a reference-count file to open on each side. A full worker reads its next batch on a second thread
while it decodes and transforms the current one (see `_run_epoch`).

Lifetime: a worker exits on the pool's ``exit`` command (`WorkerPool.close`, also run by an exit hook for
pools still open when the interpreter exits) and, failing that, within `_POLL` seconds of its parent's
death (a ``kill -9`` of the training process): it watches its parent's pid, because nothing else would end
it and on CUDA it holds a context.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Iterator

import numpy as np
import torch
import torch.multiprocessing as mp

from .._driver import bind_thread
from .._malloc import keep_freed_memory
from ..decode import _nvjpeg
from ..errors import IngestError
from ..formats.base import Record
from ..io import ByteReader
from .batch import Batch, Failures, _Work
from .collate import to_device
from .lifecycle import CLOSE_AT_EXIT
from .pipeline import Pipeline

#: What worker processes run: every stage (batches come back on the GPU), or only the read stage (read,
#: parse, probe, plan: CPU work that never touches CUDA; decode and ops then run in the training process).
STAGES = ("all", "read")

_POLL = 1.0  # seconds between liveness checks while waiting for a worker
_MAX_SHARED = 4  # worker batches held until their copy has run
#: A worker's GIL switch interval (Python's default is 5 ms). Its read-ahead thread runs Python and numpy
#: for milliseconds at a time; the thread running decode and ops gives the GIL up in every CUDA and
#: nvImageCodec call and, to get it back, waits for the read thread to be asked to drop it, up to one
#: interval, so a short interval keeps decode fed (docs/measurements.md, Reads).
_SWITCH_INTERVAL = 0.0005


def _clone(value: Any) -> Any:
    """A copy of the CUDA tensors in a batch value (a tensor, a list of tensors or a dict of such); a list of
    views of one storage (a ragged batch's images) is copied as that storage, once."""
    if isinstance(value, torch.Tensor):
        return value.clone() if value.is_cuda else value
    if isinstance(value, list):
        base = _common_base(value)
        if base is not None:
            base = base.clone()
            return [base.as_strided(v.shape, v.stride(), v.storage_offset()) for v in value]
        return [_clone(v) for v in value]
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _common_base(tensors: list) -> torch.Tensor | None:
    """The one-dimensional tensor over the whole storage that every tensor of the list views (CUDA tensors of
    one dtype, at least two), or None."""
    if len(tensors) < 2 or not all(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
        return None
    first = tensors[0]
    storage = first.untyped_storage()
    if any(t.dtype != first.dtype or t.untyped_storage().data_ptr() != storage.data_ptr() for t in tensors):
        return None
    return torch.empty(0, dtype=first.dtype, device=first.device).set_(storage)


@dataclass(frozen=True)
class _ByValue:
    """A small CPU tensor crossing to the parent inside the message, as an array."""

    array: np.ndarray


@dataclass(frozen=True)
class _Views:
    """A list of CUDA tensors that view one storage (a ragged batch's images: the warp writes them into one
    buffer) crossing as that buffer and each view's shape, strides and offset: one CUDA IPC handle to open
    and one copy in the parent instead of one per image."""

    base: torch.Tensor
    views: list[tuple[tuple[int, ...], tuple[int, ...], int]]


#: CPU tensors up to this size cross inside the message: torch would share each through its own
#: shared-memory file, whose descriptor the parent fetches from the worker over a socket, per tensor.
_BY_VALUE_BYTES = 1 << 16


def _transport(value: Any, back: bool = False) -> Any:
    """``value`` (a Batch, or a field value) as it crosses to the parent: small CPU tensors as `_ByValue`
    arrays, lists of views of one CUDA storage as `_Views`; with ``back=True``, tensors again (the views
    still on the worker's memory, which `_clone` copies once)."""
    if isinstance(value, Batch):
        return replace(value, images=_transport(value.images, back), indices=_transport(value.indices, back),
                       is_pad=_transport(value.is_pad, back), labels=_transport(value.labels, back),
                       fields={k: _transport(v, back) for k, v in value.fields.items()})
    if back:
        if isinstance(value, _ByValue):
            return torch.from_numpy(value.array)
        if isinstance(value, _Views):
            return [value.base.as_strided(*view) for view in value.views]
        return value
    if isinstance(value, torch.Tensor) and not value.is_cuda \
            and value.numel() * value.element_size() <= _BY_VALUE_BYTES:
        return _ByValue(value.numpy())
    if isinstance(value, list):
        base = _common_base(value)
        if base is not None:
            return _Views(base, [(tuple(v.shape), v.stride(), v.storage_offset()) for v in value])
    return value


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process (chained as the cause)."""

    def __str__(self) -> str:
        return self.args[0]


class WorkerPool:
    """W persistent worker processes. ``spec`` holds the pipeline's arguments (picklable: the source, ops,
    sampler, ...). `epoch()` yields the batches of one epoch in order."""

    def __init__(self, spec: dict[str, Any], num_workers: int):
        self.stages = spec["stages"]   # one of STAGES (the Loader checked it)
        ctx = mp.get_context("spawn")
        self.num_workers = num_workers
        self.device = torch.device(spec["device"])
        self._commands = [ctx.Queue() for _ in range(num_workers)]
        self._results = [ctx.Queue(maxsize=spec["prefetch"]) for _ in range(num_workers)]
        self._procs = [ctx.Process(target=_worker_main, name=f"ingest-worker-{w}", daemon=True,
                                   args=(spec, w, num_workers, self._commands[w], self._results[w], os.getpid()))
                       for w in range(num_workers)]
        # on CUDA the workers may decode on the GPU: their nvImageCodec gets the nvJPEG wheel's copy whatever
        # the user's script imports first (`ingest.decode._nvjpeg`)
        with _nvjpeg.in_children() if self.device.type == "cuda" else contextlib.nullcontext():
            for p in self._procs:
                p.start()
        self._closed = False
        CLOSE_AT_EXIT.add(self)
        self._run = 0
        self._side = torch.cuda.Stream(self.device) if self.device.type == "cuda" and self.stages == "all" else None
        self._shared: collections.deque = collections.deque()
        self.stats: list[dict[str, Any]] = [{} for _ in range(num_workers)]
        # read stage: each worker's shared buffers by slot, as it handed them over (`take_buffer`)
        self._buffers = [[None] * buffer_slots(spec["prefetch"]) for _ in range(num_workers)]

    def epoch(self, epoch: int, start: int, count: int, failures: Failures, offset: int = 0,
              stop: threading.Event | None = None) -> Iterator[Batch | _Work]:
        """Batches ``start .. count-1`` of ``epoch`` (that skips the first ``offset`` samples of its global
        order: `Sampler.batches`), in order: `Batch`es, or with ``stages="read"`` the read stage's `_Work` of
        every batch (its bytes in shared memory). Failures the workers report are added to ``failures``, which
        raises when the budget is exceeded. Setting ``stop`` ends the iterator while it waits."""
        self._stop_current()
        self._run += 1
        run = self._run
        for q in self._commands:
            q.put(("epoch", run, epoch, start, offset))
        held: list[Any] = [None] * self.num_workers   # a message read ahead of its turn
        done = [False] * self.num_workers
        for number in range(start, count):
            if self._run != run:   # a newer epoch has started: this one is over
                return
            w = number % self.num_workers
            if done[w]:
                continue
            msg = held[w] if held[w] is not None else self._receive(w, run, failures, stop)
            held[w] = None
            if msg is None:   # stopped
                return
            if msg[0] == "end":
                done[w] = True
                continue
            batch = msg[2]
            if _number(batch) != number:   # every sample of `number` failed: the worker skipped it
                held[w] = msg
                continue
            yield batch
        # Every batch is out: each worker's end is due, with the failures of a last batch that failed whole.
        for w in range(self.num_workers):
            if not done[w] and held[w] is None and self._receive(w, run, failures, stop) is None:
                return

    def _receive(self, w: int, run: int, failures: Failures, stop: threading.Event | None = None):
        """The next message of worker ``w`` for ``run`` (older runs' messages are dropped); the failures
        and stats it reports are taken in here, once. None once ``stop`` is set."""
        while True:
            try:
                with torch.cuda.stream(self._side) if self._side is not None else contextlib.nullcontext():
                    msg = self._results[w].get(timeout=_POLL if stop is None else 0.05)
            except queue.Empty:
                if stop is not None and stop.is_set():
                    return None
                if not self._procs[w].is_alive():
                    raise IngestError(f"ingest worker {w} died (exit code {self._procs[w].exitcode})") from None
                continue
            if msg[0] == "batch" and self.stages == "read":
                take_buffer(msg[2], self._buffers[w])
            if msg[1] != run:
                continue
            if msg[0] == "error":
                exc, text = msg[2], msg[3]
                raise exc from RemoteTraceback(text)
            if msg[0] in ("batch", "end"):
                for name, stage, reason in msg[3]:
                    failures.record(name, stage, reason)
            if msg[0] == "batch":
                self.stats[w] = msg[4]
                msg = ("batch", run, self._own(msg[2]) if self.stages == "all" else
                       unpack_work(msg[2], self._buffers[w], failures, pin=self.device.type == "cuda"))
            return msg

    def _own(self, batch: Batch) -> Batch:
        """Copy a batch shared by a worker into this process's memory on the side stream (see the module
        docstring). The shared tensors are kept until their copy has run, checked without blocking; only
        past `_MAX_SHARED` pending copies does this wait for the oldest."""
        batch = _transport(batch, back=True)
        if self._side is None:
            return batch
        with torch.cuda.stream(self._side):
            images, fields = _clone(batch.images), to_device(_clone(batch.fields), self.device)
            labels = batch.labels.pin_memory().to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._side)
        self._shared.append((batch, done))
        while self._shared and (len(self._shared) > _MAX_SHARED or self._shared[0][1].query()):
            self._shared.popleft()[1].synchronize()
        return Batch(images, labels, batch.indices, batch.is_pad, fields, done, batch.number)

    def _stop_current(self) -> None:
        for q in self._commands:
            q.put(("stop", self._run))

    def close(self) -> None:
        """Stop the running epoch and the workers."""
        if self._closed:
            return
        self._closed = True
        CLOSE_AT_EXIT.discard(self)
        self._run += 1   # ends the running epoch's iterator at its next step
        for q in self._commands:
            q.put(("exit",))  # also ends a running epoch, and a wait on a full queue (see _stopped, _send)
        deadline = time.monotonic() + 10
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.terminate()
            p.join()
        for q in self._commands + self._results:
            q.close()
            q.cancel_join_thread()


def _pixels(spec: dict[str, Any]) -> dict[str, Any]:
    """The decoded pixels' dtype and channels the Loader asked for (uint8 RGB in a spec without them)."""
    return {"decode_dtype": spec.get("decode_dtype", "uint8"), "channels": spec.get("channels", 3)}


def _worker_main(spec: dict[str, Any], worker: int, num_workers: int, commands, results, parent: int) -> None:
    threading.Thread(target=_exit_with_parent, args=(parent,), name="ingest-parent-watch", daemon=True).start()
    torch.set_num_threads(1)
    sys.setswitchinterval(_SWITCH_INTERVAL)
    keep_freed_memory()
    if spec["stages"] == "read":   # CPU only: this process never touches CUDA
        pipeline = Pipeline(spec["source"], ops=spec["ops"], device="cpu", decode="cpu", io=spec["io"],
                            num_threads=spec["num_threads"], shared_reads=buffer_slots(spec["prefetch"]),
                            **_pixels(spec))
    else:
        bind_thread(torch.device(spec["device"]))   # this process touches its rank's GPU only
        pipeline = Pipeline(spec["source"], ops=spec["ops"], device=spec["device"], decode=spec["decode"],
                            io=spec["io"], num_threads=spec["num_threads"], labels_on_host=True,
                            lanes=1, **_pixels(spec))   # a worker decodes one batch at a time, on its main thread
    sampler = spec["sampler"]
    stop_runs: set[int] = set()
    announced: set[int] = set()   # read stage: shared buffers (by slot) the parent has received
    try:
        while True:
            cmd = commands.get()
            if cmd[0] == "exit":
                break
            if cmd[0] == "stop":
                stop_runs.add(cmd[1])
                continue
            _, run, epoch, start, offset = cmd
            if run in stop_runs:
                continue
            _run_epoch(pipeline, sampler, spec, worker, num_workers, run, epoch, start, offset, commands,
                       results, stop_runs, announced)
    finally:
        pipeline.close()
    # What is still buffered for the parent is not wanted, and an interpreter exit could find the queue's
    # feeder thread inside torch's tensor sharing, which aborts the process ("terminate called ..."): leave now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _exit_with_parent(parent: int) -> None:
    """End this worker process once ``parent`` is no longer its parent (it died; see the module docstring)."""
    while os.getppid() == parent:
        time.sleep(_POLL)
    os._exit(1)


def _run_epoch(pipeline, sampler, spec, worker, num_workers, run, epoch, start, offset, commands, results,
               stop_runs, announced: set[int]) -> None:
    """This worker's share of an epoch. A full worker decodes and transforms each batch on this thread while
    `_ReadAhead` reads the next one: the read stage is host work (Python and numpy: parse, header probe,
    the augmentation draws, which for detection's IoU crop cost as much as decode and ops together), and
    decode and ops mostly wait in CUDA and nvImageCodec calls that let the GIL go. Decode and ops stay on
    one thread: overlapping them too holds more GPU memory and contends for the GIL without training faster
    (docs/measurements.md, The in-process CUDA loader)."""
    # The budget is the parent's: here every failure is only recorded (or raised at once when none is allowed).
    pipeline.start_epoch(Failures(0 if spec["max_failures"] == 0 else sys.maxsize, 0, report=False))
    sent = 0
    plans = (plan for plan in sampler.batches(epoch, start, offset) if plan.number % num_workers == worker)
    ahead = None
    try:
        if spec["stages"] == "all":
            ahead = _ReadAhead(pipeline, plans)
        for plan in ahead or plans:
            if _stopped(run, commands, stop_runs):
                return
            if ahead is not None:
                batch = pipeline.run(plan)   # plan: the read stage's _Work, made on the read-ahead thread
            elif spec["stages"] == "read":
                batch = pack_work(pipeline.stage_stats[0].timed(pipeline.read_shared, plan), pipeline.reader, announced)
            else:
                batch = pipeline.run(plan)   # the default stream (the IPC event's) waits for the batch
            if batch is None:   # every sample failed: its failures go with the next message
                continue
            items = pipeline.failures.items[sent:]
            sent += len(items)
            if isinstance(batch, Batch):
                batch = _transport(replace(batch, ready=None))
            stats = {"stages": {s.name: s.counts() for s in pipeline.stage_stats},
                     "decode_paths": dict(pipeline.decode_paths), "read_path": pipeline.read_path,
                     "gpu_fallbacks": pipeline.gpu_fallbacks}
            if not _send(results, ("batch", run, batch, items, stats), run, commands, stop_runs):
                return
            if isinstance(batch, tuple) and batch[1] is not None and batch[1].buffer is not None:
                announced.add(batch[1].slot)
        _send(results, ("end", run, None, pipeline.failures.items[sent:]), run, commands, stop_runs)
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, re-raised there
        text = traceback.format_exc()
        try:
            _send(results, ("error", run, exc, text), run, commands, stop_runs)
        except Exception:  # noqa: BLE001 - the exception does not pickle: send its text
            _send(results, ("error", run, IngestError(f"{type(exc).__name__}: {exc}"), text), run, commands,
                  stop_runs)
    finally:
        if ahead is not None:
            ahead.close()


class _ReadAhead:
    """A full worker's plans, each with its read stage (read, parse, probe, plan: Python and numpy on the
    host) already run on a thread of its own while this worker decoded and transformed the batch before:
    iterating gives the read stage's `_Work`, which `Pipeline.run` takes as it is."""

    def __init__(self, pipeline: Pipeline, plans: Iterator):
        self._pipeline, self._plans = pipeline, plans
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ingest-read-ahead", initializer=bind_thread,
                                        initargs=(pipeline.device,))
        self._next = self._submit()

    def _submit(self):
        plan = next(self._plans, None)
        if plan is None:
            return None
        return self._pool.submit(self._pipeline.stage_stats[0].timed, self._pipeline.read, plan)

    def __iter__(self):
        return self

    def __next__(self) -> _Work:
        if self._next is None:
            raise StopIteration
        current, self._next = self._next, self._submit()
        return current.result()

    def close(self) -> None:
        """Wait for the read in flight (the pipeline is this worker's next epoch's too), its result unused."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _send(results, msg, run: int, commands, stop_runs: set[int]) -> bool:
    """Put ``msg`` for the parent, waiting while its queue is full; False (not sent) once ``run`` must end. The
    parent never reads to make room when it stops a run or closes the pool: a read could wait forever on a
    message another worker left half written when it exited."""
    while True:
        try:
            results.put(msg, timeout=0.1)
            return True
        except queue.Full:
            if _stopped(run, commands, stop_runs):
                return False


def _stopped(run: int, commands, stop_runs: set[int]) -> bool:
    """Whether ``run`` must end now: a stop for it, or an exit, has arrived (other commands, and the exit,
    are kept for the main loop)."""
    pending = []
    while True:
        try:
            cmd = commands.get_nowait()
        except queue.Empty:
            break
        if cmd[0] == "stop":
            stop_runs.add(cmd[1])
        else:
            pending.append(cmd)
    for cmd in pending:
        commands.put(cmd)
    return run in stop_runs or any(cmd[0] == "exit" for cmd in pending)


# -- the read stage's batches across processes ------------------------------------------------------


@dataclass(frozen=True)
class _InArena:
    """A sample's bytes as a range of its batch's shared buffer (replaced by a view of a copy on arrival)."""

    start: int
    length: int


@dataclass(frozen=True)
class _Shared:
    """Where a batch's bytes are: shared buffer ``slot`` of the sending worker, ``nbytes`` of it used, and
    ``buffer`` itself when the receiver does not have it yet (new, or grown)."""

    slot: int
    nbytes: int
    buffer: torch.Tensor | None


def buffer_slots(prefetch: int) -> int:
    """Shared buffers a reader process takes in turn. Its results queue holds ``prefetch`` batches; when it
    fills buffer ``s + K`` it has sent batch ``s + K - 1``, so the parent has taken batch ``s + K - 1 -
    prefetch`` off the queue, and it copies each batch out on arrival, in order: buffer ``s`` is free once
    ``K >= prefetch + 2``. One more for the batch the parent is copying."""
    return prefetch + 3


def pack_work(work: _Work, reader: ByteReader, announced: set[int]) -> tuple[_Work, _Shared | None]:
    """``work`` ready to cross to the training process through ``reader``'s shared buffer of the batch
    (`ByteReader.last_arena`): every record image that is a view of the batch's reads becomes its range there,
    and every other encoded image (bytes the parse made: a TFRecord image that protobuf parsed, an LMDB
    value copied out) is copied in after the reads (`ByteReader.grow_shared`) and becomes its range too. So only ranges
    travel, plus the buffer's handle when its slot is not in ``announced`` (the slots the receiver holds; a
    grown buffer's slot is taken out). Anything else (decoded pixels, several ranges of one sample) is pickled
    as is. The batch's failure budget stays behind: the receiver's takes its place (`unpack_work`)."""
    work = replace(work, failures=None)
    if reader.last_arena is None or not work.records:
        return work, None
    slot, buffer, nbytes, new = reader.last_arena
    base, end = buffer.data_ptr(), buffer.data_ptr() + nbytes
    records, loose = list(work.records), []
    for k, r in enumerate(records):
        im = _byte_view(r.image)
        if im is None:
            continue
        at = im.ctypes.data
        if base <= at and at + im.nbytes <= end:
            records[k] = replace(r, image=_InArena(at - base, im.nbytes))
        else:
            loose.append((k, im))
    if loose:
        slot, buffer, used, new = reader.grow_shared(nbytes + sum(im.nbytes for _, im in loose))
        flat = buffer.numpy()
        for k, im in loose:
            flat[nbytes:nbytes + im.nbytes] = im
            records[k] = replace(records[k], image=_InArena(nbytes, im.nbytes))
            nbytes += im.nbytes
    if not nbytes:
        return work, None
    if new:
        announced.discard(slot)
    return replace(work, records=records), _Shared(slot, nbytes, None if slot in announced else buffer)


def _byte_view(image: Any) -> np.ndarray | None:
    """An encoded image (bytes-like, or a 1-D uint8 array) as a uint8 array without a copy; None otherwise."""
    if isinstance(image, np.ndarray):
        return image if image.dtype == np.uint8 and image.ndim == 1 else None
    if isinstance(image, (bytes, bytearray, memoryview)):
        return np.frombuffer(image, dtype=np.uint8)
    return None


def unpack_work(payload: tuple[_Work, _Shared | None], buffers: list[torch.Tensor | None], failures: Failures,
                pin: bool = False) -> _Work:
    """The inverse of `pack_work`, given the sender's ``buffers`` by slot (see `take_buffer`): the used part of
    the shared buffer is copied out at once (into pinned memory if ``pin``: the GPU decoder reads pinned
    bitstreams faster), which frees it for the sender, and ranges become views of the copy. The batch's later
    stages count against ``failures``."""
    work, shared = payload
    work.failures = failures
    if shared is not None:
        source = buffers[shared.slot][:shared.nbytes]
        copy = torch.empty(shared.nbytes, dtype=torch.uint8, pin_memory=pin)
        flat = copy.copy_(source).numpy()
        work.records = [Record(flat[r.image.start:r.image.start + r.image.length], r.label, r.fields)
                        if isinstance(r.image, _InArena) else r for r in work.records]
    return work


def take_buffer(payload: tuple[_Work, _Shared | None], buffers: list[torch.Tensor | None]) -> None:
    """Keep a buffer the sender handed over with ``payload`` (done for every batch received, even one of a
    finished epoch that is dropped: later batches refer to the buffer by slot only)."""
    shared = payload[1]
    if shared is not None and shared.buffer is not None:
        buffers[shared.slot] = shared.buffer


def _number(item: Batch | _Work) -> int:
    return item.number if isinstance(item, Batch) else item.plan.number
