"""CUDA driver calls that keep the GIL: events, and small host-to-device copies from pinned staging.

Every torch call that reaches an ATen op releases the GIL (its generated binding does), and so do a torch
event's ``record`` and ``wait``; beside a busy Python thread (a training loop in the same process) getting it
back costs up to a switch interval (5 ms; the loader sets 0.5 ms). The loader's stages record or wait on five
events per batch and upload a few small host arrays (labels, kernel arguments, a raw batch's staged rows), so
these go through the CUDA driver (``libcuda.so.1``, present wherever CUDA runs) with :class:`ctypes.PyDLL`,
which keeps the GIL: each call only enqueues work on a stream, in microseconds. Only waiting for the GPU
(:meth:`Event.synchronize`, rare: a staging buffer whose last copy has not run yet) releases it.

:class:`Event` has the part of ``torch.cuda.Event``'s interface the loader uses (``record(stream)``,
``wait(stream)``), so ``torch.cuda.Stream.wait_event`` takes it too. Where the driver cannot be loaded,
:func:`new_event` gives a ``torch.cuda.Event`` and :class:`Staging` copies with torch. Driver and runtime
handles are the same objects (a ``cudaStream_t`` is a ``CUstream``), and the calling thread's current context
is the device's primary context that torch made current (`bind_thread`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from ctypes import POINTER, c_int, c_size_t, c_uint, c_void_p

import numpy as np
import torch

_DISABLE_TIMING = 0x2   # CU_EVENT_DISABLE_TIMING
_NOT_READY = 600        # CUDA_ERROR_NOT_READY


@functools.cache
def _driver() -> ctypes.PyDLL | None:
    """The CUDA driver library with the argument types of the calls made here; None where it does not load."""
    try:
        lib = ctypes.PyDLL("libcuda.so.1")
        for name, args in (("cuEventCreate", (POINTER(c_void_p), c_uint)), ("cuEventDestroy_v2", (c_void_p,)),
                           ("cuEventRecord", (c_void_p, c_void_p)), ("cuEventQuery", (c_void_p,)),
                           ("cuStreamWaitEvent", (c_void_p, c_void_p, c_uint)),
                           ("cuMemcpyHtoDAsync_v2", (c_void_p, c_void_p, c_size_t, c_void_p)),
                           ("cuCtxGetCurrent", (POINTER(c_void_p),)), ("cuCtxGetDevice", (POINTER(c_int),))):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, c_int
    except (OSError, AttributeError):
        return None
    return lib


@functools.cache
def _memcpy():
    """libc's memcpy through :class:`ctypes.PyDLL` (the GIL kept; numpy's copies of more than 500 items give it
    up)."""
    fn = ctypes.PyDLL(None).memcpy
    fn.argtypes, fn.restype = (c_void_p, c_void_p, c_size_t), c_void_p
    return fn


@functools.cache
def _releasing() -> ctypes.CDLL:
    """The driver's cuEventSynchronize through :class:`ctypes.CDLL`: waiting for the GPU gives the GIL up."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuEventSynchronize.argtypes, lib.cuEventSynchronize.restype = (c_void_p,), c_int
    return lib


def _check(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"CUDA driver call {call} failed with CUresult {status}")


class Event:
    """A CUDA event (no timing) made, recorded and waited on through the driver, the GIL kept."""

    __slots__ = ("_handle", "_lib")

    def __init__(self, lib: ctypes.PyDLL):
        self._lib = lib
        self._handle = c_void_p()
        _check(lib.cuEventCreate(ctypes.byref(self._handle), _DISABLE_TIMING), "cuEventCreate")

    def record(self, stream: torch.cuda.Stream) -> None:
        """Record on ``stream``: the event completes once the work queued there so far has run."""
        _check(self._lib.cuEventRecord(self._handle, stream.cuda_stream), "cuEventRecord")

    def wait(self, stream: torch.cuda.Stream) -> None:
        """Make the work queued on ``stream`` from now on wait for this event (the host does not wait)."""
        _check(self._lib.cuStreamWaitEvent(stream.cuda_stream, self._handle, 0), "cuStreamWaitEvent")

    def done(self) -> bool:
        """Whether the work recorded has run (True for an event never recorded)."""
        status = self._lib.cuEventQuery(self._handle)
        if status not in (0, _NOT_READY):
            _check(status, "cuEventQuery")
        return status == 0

    def synchronize(self) -> None:
        """Wait on the host until the work recorded has run; the GIL is given up meanwhile."""
        _check(_releasing().cuEventSynchronize(self._handle), "cuEventSynchronize")

    def __del__(self) -> None:
        if self._handle:   # destroying a recorded event that has not completed yet is allowed
            try:
                self._lib.cuEventDestroy_v2(self._handle)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass
            self._handle = c_void_p()


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Where the calling thread may not be on ``device`` (the thread that takes a loader's batches is the user's):
    a context in which driver calls for ``device``'s streams and events work. A thread with no current CUDA
    context (it never touched CUDA) gets ``device``'s for good, as `bind_thread` gives the
    loader's own threads (a device guard would leave it on device 0 afterwards, a context on GPU 0 under
    torchrun); a thread on another device is switched for the block and back; else nothing happens. Two
    driver calls that keep the GIL where the driver loads."""
    lib = _driver()
    if lib is None or device.type != "cuda":
        return contextlib.nullcontext()
    ctx, index = c_void_p(), c_int(-1)
    _check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        torch.cuda.set_device(device)
        return contextlib.nullcontext()
    _check(lib.cuCtxGetDevice(ctypes.byref(index)), "cuCtxGetDevice")
    return contextlib.nullcontext() if index.value == device.index else torch.cuda.device(device)


def wait_for(event: Event | torch.cuda.Event | None) -> None:
    """Return once the work recorded on ``event`` has run (None: at once): a finished event costs one query,
    which keeps the GIL for ours; only an unfinished one waits on the host, giving the GIL up."""
    if event is not None and not (event.done() if hasattr(event, "done") else event.query()):
        event.synchronize()


def new_event() -> Event | torch.cuda.Event:
    """An event for the loader's streams: an :class:`Event` where the CUDA driver loads, else torch's."""
    lib = _driver()
    return Event(lib) if lib is not None else torch.cuda.Event()


def recorded(stream: torch.cuda.Stream) -> Event | torch.cuda.Event:
    """A new event recorded on ``stream``."""
    event = new_event()
    event.record(stream)
    return event


class _Slot:
    """One pinned staging buffer: the torch tensor that owns it, its bytes as numpy, its address, the event
    recorded after its last copy (None before the first) and the device whose context made that event (an event
    records only on streams of its own context)."""

    __slots__ = ("pinned", "array", "address", "event", "device")

    def __init__(self, nbytes: int, event, device: torch.device | None):
        self.pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.array = self.pinned.numpy()
        self.address = self.pinned.data_ptr()
        self.event, self.device = event, device

    def wait_free(self) -> None:
        """Return once the last copy out of this buffer has run."""
        wait_for(self.event)


class Staging:
    """Host-to-device copies queued without a torch call: :meth:`take` gives a pinned host buffer to fill,
    :meth:`upload` queues its copy into a CUDA tensor on a stream (``cuMemcpyHtoDAsync`` from pinned memory,
    the GIL kept). The buffers form a ring of ``slots``; a buffer is handed out again only once its last copy
    has run (checked with an event; waited for, the GIL given up, only if the GPU is that far behind), and
    grows when a batch needs more. Safe to share between threads (a lock, uncontended in the loader: each
    stage has its own). Without the CUDA driver, the copies go through torch (same results)."""

    def __init__(self, slots: int = 4):
        self._slots: list[_Slot | None] = [None] * slots
        self._turn = 0
        self._lock = threading.Lock()
        self._local = threading.local()   # the slot each thread took last

    def take(self, nbytes: int) -> np.ndarray:
        """A pinned uint8 host buffer of ``nbytes`` for the next :meth:`upload` of this thread."""
        with self._lock:
            k = self._turn % len(self._slots)
            self._turn += 1
            slot = self._slots[k]
            if slot is not None:
                slot.wait_free()
            if slot is None or slot.array.nbytes < nbytes:
                slot = self._slots[k] = _Slot(max(nbytes + nbytes // 4, 1 << 16), slot and slot.event,
                                              slot and slot.device)
        self._local.slot = slot
        return slot.array[:nbytes]

    def upload(self, host: np.ndarray, dst: torch.Tensor, stream: torch.cuda.Stream, offset: int = 0) -> None:
        """Queue on ``stream`` the copy of ``host`` (the start of this thread's last :meth:`take` buffer) into
        the contiguous CUDA tensor ``dst`` from byte ``offset``; ``dst`` must hold that many bytes there."""
        slot, n = self._local.slot, host.nbytes
        lib = _driver()
        if lib is not None:
            _check(lib.cuMemcpyHtoDAsync_v2(dst.data_ptr() + offset, slot.address, n, stream.cuda_stream),
                   "cuMemcpyHtoDAsync")
        else:
            with torch.cuda.stream(stream):
                dst.view(-1).view(torch.uint8)[offset:offset + n].copy_(slot.pinned[:n], non_blocking=True)
        # A slot whose last copy went to another GPU (`take` waited for it) gets an event of this stream's GPU
        if slot.event is None or slot.device != stream.device:
            with torch.cuda.device(stream.device):
                slot.event = new_event()
            slot.device = stream.device
        slot.event.record(stream)

    def copy(self, host: np.ndarray, dst: torch.Tensor, stream: torch.cuda.Stream, offset: int = 0) -> None:
        """Queue on ``stream`` the copy of the C-contiguous array ``host`` into ``dst`` from byte ``offset``,
        through a staging buffer (:meth:`take` + :meth:`upload`); ``host`` may change once this returns."""
        host = np.ascontiguousarray(host)
        staged = self.take(host.nbytes)
        _memcpy()(staged.ctypes.data, host.ctypes.data, host.nbytes)
        self.upload(staged, dst, stream, offset)


def bind_thread(device: torch.device) -> None:
    """Make ``device`` the calling thread's current CUDA device (nothing off CUDA). For the threads ingest
    starts: CUDA keeps the current device per thread and a new thread starts on device 0, so a pinned host
    buffer, a stream or a decoder made on such a thread for a rank's GPU 1 would open a context on GPU 0,
    and every rank's memory would grow there (docs/measurements.md, Scaling out)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
