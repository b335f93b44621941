"""CUDA events that are recorded and waited on without giving up the GIL.

A torch event's ``record`` and ``wait`` each release the GIL, and beside a busy Python thread (a training loop in
the same process) getting it back costs up to a switch interval (5 ms). The loader's stages record or wait on
five events per batch, so these go through the CUDA driver (``libcuda.so.1``, present wherever CUDA runs)
with :class:`ctypes.PyDLL`, which keeps the GIL: each call only enqueues work on a stream, in microseconds.

:class:`Event` has the part of ``torch.cuda.Event``'s interface the loader uses (``record(stream)``,
``wait(stream)``), so ``torch.cuda.Stream.wait_event`` takes it too. Where the driver cannot be loaded,
:func:`new_event` gives a ``torch.cuda.Event``. Driver and runtime handles are the same objects (a
``cudaStream_t`` is a ``CUstream``), and the calling thread's current context is the device's primary context
that torch made current (`ingest.ops.base.bind_thread`).
"""

from __future__ import annotations

import ctypes
import functools
from ctypes import POINTER, c_int, c_uint, c_void_p

import torch

_DISABLE_TIMING = 0x2   # CU_EVENT_DISABLE_TIMING


@functools.cache
def _driver() -> ctypes.PyDLL | None:
    """The CUDA driver library with the argument types of the calls made here; None where it does not load."""
    try:
        lib = ctypes.PyDLL("libcuda.so.1")
        for name, args in (("cuEventCreate", (POINTER(c_void_p), c_uint)), ("cuEventDestroy_v2", (c_void_p,)),
                           ("cuEventRecord", (c_void_p, c_void_p)),
                           ("cuStreamWaitEvent", (c_void_p, c_void_p, c_uint))):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, c_int
    except (OSError, AttributeError):
        return None
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

    def __del__(self) -> None:
        if self._handle:   # destroying a recorded event that has not completed yet is allowed
            try:
                self._lib.cuEventDestroy_v2(self._handle)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass
            self._handle = c_void_p()


def new_event() -> Event | torch.cuda.Event:
    """An event for the loader's streams: an :class:`Event` where the CUDA driver loads, else torch's."""
    lib = _driver()
    return Event(lib) if lib is not None else torch.cuda.Event()


def recorded(stream: torch.cuda.Stream) -> Event | torch.cuda.Event:
    """A new event recorded on ``stream``."""
    event = new_event()
    event.record(stream)
    return event
