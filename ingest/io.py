"""Byte-range reads. One `ByteReader` reads a batch of `Location`s on a thread pool:

- ``kvikio``: KvikIO's ``CuFile`` (GPUDirect Storage where the host has it, KvikIO's compat mode where
  not). ``io="auto"`` takes it for device destinations when CUDA and KvikIO are present (see `resolve_io`
  for why not for host destinations). KvikIO needs a CUDA driver even for host reads, so the no-GPU path
  never touches it.
- ``posix``: ``os.preadv`` straight into the destination buffer (releases the GIL).

Encoded data goes to host memory (pinned when the batch is headed for the GPU decoder, which reads the
bitstream from the host); raw tensors go straight to device memory with :meth:`ByteReader.read_into`.
Which paths run are `ByteReader.path` (host) and `ByteReader.device_path` (the loader's
``stats()["read_path"]``); ``io="kvikio"`` sends both through KvikIO.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np
import torch

from . import defaults
from .errors import ConfigError, CorruptRecordError
from .formats.base import Location

log = logging.getLogger("ingest")


def kvikio_usable() -> bool:
    """True when KvikIO imports and a CUDA device is present (KvikIO needs the driver)."""
    if not torch.cuda.is_available():
        return False
    try:
        import kvikio  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_io(io: str | None) -> tuple[str, str]:
    """The read paths for (host, device) destinations. ``auto`` takes KvikIO for device destinations when
    it is usable, and ``os.preadv`` for host destinations: KvikIO reading into host memory is a POSIX read
    through its own thread pool even where GDS exists, and measured slower for file-per-sample reads
    (256 x 81 KB page-cached JPEGs on an H200 host: 15.9 ms with KvikIO, 8.2 ms with preadv)."""
    io = io or defaults.get("io")
    if io == "auto":
        return "posix", "kvikio" if kvikio_usable() else "posix"
    if io == "kvikio" and not kvikio_usable():
        raise ConfigError("io='kvikio' needs CUDA and KvikIO (pip install 'ingest[gpu]'); "
                          "use io='posix' or io='auto'")
    if io not in ("kvikio", "posix"):
        raise ConfigError(f"Unknown io {io!r}. Available: auto, kvikio, posix")
    return io, io


class ByteReader:
    """Reads batches of byte ranges into one host arena per batch (pinned if ``pin=True``)."""

    def __init__(self, io: str | None = None, *, threads: int | None = None, pin: bool = False):
        self.path, self.device_path = resolve_io(io)
        self.threads = threads or defaults.get("io_threads")
        self.pin = pin
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ingest-io")
        if "kvikio" in (self.path, self.device_path):
            import kvikio
            import kvikio.defaults
            # KvikIO's own pool defaults to ONE thread; large reads are split across it.
            kvikio.defaults.set("num_threads", self.threads)
            self._kvikio = kvikio
        log.info("ingest: reads to host memory via %s, to device memory via %s (%d threads)",
                 self.path, self.device_path, self.threads)

    # -- batch reads into host memory -------------------------------------------------------------
    def read(self, locations: Sequence[Location]) -> list[np.ndarray | Exception]:
        """Bytes of every location, as uint8 views into one arena, in order. A location whose read fails
        gives the exception as its value (the executor applies the failure budget)."""
        unknown = [k for k, loc in enumerate(locations) if loc.data is None and loc.length is None]
        sizes: list[int | Exception] = [0 if loc.data is not None else loc.length for loc in locations]
        for k, size in zip(unknown, self._pool.map(_size_of, [locations[k] for k in unknown])):
            sizes[k] = size
        arena = self._arena(sum(s for s in sizes if isinstance(s, int)))
        views: list = []
        jobs = []
        offset = 0
        for loc, size in zip(locations, sizes):
            if isinstance(size, Exception):
                views.append(size)
            elif loc.data is not None:
                data = loc.data
                views.append(data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray)
                             else np.frombuffer(data, dtype=np.uint8))
            else:
                views.append(arena[offset:offset + size])
                jobs.append(len(views) - 1)
                offset += size
        # One task per thread, each reading an equal share: few hand-offs between Python threads.
        shares = [jobs[t::self.threads] for t in range(min(self.threads, len(jobs)))]
        for share, errors in zip(shares, self._pool.map(
                lambda share: [self._read_one(locations[k], views[k]) for k in share], shares)):
            for k, err in zip(share, errors):
                if err is not None:
                    views[k] = err
        return views

    def _arena(self, nbytes: int) -> np.ndarray:
        # A fresh buffer per batch: the previous batch's views may still be in use by the decoder.
        if self.pin and nbytes:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()
        return np.empty(nbytes, dtype=np.uint8)

    def _read_one(self, loc: Location, out: np.ndarray) -> Exception | None:
        try:
            if self.path == "kvikio":
                with self._kvikio.CuFile(loc.path, "r") as f:
                    got = f.pread(out, out.nbytes, loc.offset).get()
            else:
                got = _pread_full(loc.path, out, loc.offset)
        except OSError as err:
            return err
        if got != out.nbytes:
            return CorruptRecordError(f"short read: {got} of {out.nbytes} bytes (file truncated?)",
                                      path=loc.path, offset=loc.offset)
        return None

    # -- raw ranges straight into (device) memory -------------------------------------------------
    def read_into(self, loc: Location, out: torch.Tensor) -> None:
        """Read ``out.nbytes`` bytes of ``loc`` into the contiguous tensor ``out`` (CPU or CUDA). With KvikIO
        a CUDA destination is filled by GDS (or compat mode's bounce buffers); otherwise via host memory."""
        if not out.is_contiguous():
            raise ValueError("read_into needs a contiguous tensor")
        flat = out.view(torch.uint8).reshape(-1)
        nbytes = flat.numel()
        if self.device_path == "kvikio" and out.is_cuda:
            import cupy
            with self._kvikio.CuFile(loc.path, "r") as f:
                got = f.pread(cupy.asarray(flat), nbytes, loc.offset).get()
        elif out.is_cuda:
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            got = _pread_full(loc.path, host.numpy(), loc.offset)
            flat.copy_(host, non_blocking=False)
        else:
            got = _pread_full(loc.path, flat.numpy(), loc.offset)
        if got != nbytes:
            raise CorruptRecordError(f"short read: {got} of {nbytes} bytes", path=loc.path, offset=loc.offset)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "ByteReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _size_of(loc: Location) -> int | Exception:
    try:
        return os.stat(loc.path).st_size - loc.offset
    except OSError as err:
        return err


def _pread_full(path: str, out: np.ndarray, offset: int) -> int:
    """Read into ``out`` from ``offset`` until it is full or the file ends; returns bytes read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        mv = memoryview(out).cast("B")
        while done < len(mv):
            n = os.preadv(fd, [mv[done:]], offset + done)
            if n == 0:
                break
            done += n
        return done
    finally:
        os.close(fd)
