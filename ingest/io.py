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
from typing import NamedTuple, Sequence

import numpy as np
import torch

from . import defaults
from .errors import ConfigError, CorruptRecordError, SourceError
from .formats.base import Location

log = logging.getLogger("ingest")

MIN_SHARE = 8  # files per pool task at least (ByteReader._shared_map)


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
    """Reads batches of byte ranges into one host arena per batch: pinned if ``pin=True``. A reader process's
    reader (``shared=K``) reads into K shared-memory buffers taken in turn and reused, so that no batch
    allocates, maps and faults in new shared memory, and its handle crosses to the training process only
    when a buffer is new or grown: `last_arena` is ``(slot, buffer, bytes used, new)`` for the latest batch. The
    receiver must be done with a buffer before its turn comes again (`ingest.workers` says why it is)."""

    def __init__(self, io: str | None = None, *, threads: int | None = None, pin: bool = False,
                 shared: int = 0):
        self.path, self.device_path = resolve_io(io)
        self.threads = threads or defaults.get("io_threads")
        self.pin = pin
        self.shared = shared
        self.last_arena: tuple[int, torch.Tensor, int, bool] | None = None
        self._buffers: list[torch.Tensor | None] = [None] * shared
        self._turn = 0
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
        gives its error as its value (the executor applies the failure budget): `SourceError` naming the
        file when it cannot be opened or read (missing, no permission, a directory), `CorruptRecordError`
        when it is shorter than the location says."""
        unknown = [k for k, loc in enumerate(locations) if loc.data is None and loc.length is None]
        sizes: list[int | Exception] = [0 if loc.data is not None else loc.length for loc in locations]
        for share, got in self._shared_map(lambda k: _size_of(locations[k]), unknown):
            for k, size in zip(share, got):
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
        for share, errors in self._shared_map(lambda k: self._read_one(locations[k], views[k]), jobs):
            for k, err in zip(share, errors):
                if err is not None:
                    views[k] = err
        return views

    def _shared_map(self, fn, items: list) -> list[tuple[list, list]]:
        """``fn`` over ``items`` on the pool in a few tasks of equal shares, at least `MIN_SHARE` items each:
        every task is a hand-off between Python threads (tens of microseconds), as costly as a page-cached
        read of a whole file, so a batch's 32 files in one task per file spent more on hand-offs than reads."""
        tasks = min(self.threads, -(-len(items) // MIN_SHARE))
        shares = [items[t::tasks] for t in range(tasks)]
        return list(zip(shares, self._pool.map(lambda share: [fn(k) for k in share], shares)))

    def _arena(self, nbytes: int) -> np.ndarray:
        if self.shared:
            slot = self._turn % self.shared
            self._turn += 1
            buffer = self._buffers[slot]
            new = buffer is None or buffer.numel() < nbytes
            if new:  # grown with room to spare: batch sizes vary by a few percent
                buffer = self._buffers[slot] = torch.empty(nbytes + nbytes // 4, dtype=torch.uint8).share_memory_()
            self.last_arena = (slot, buffer, nbytes, new)
            return buffer.numpy()[:nbytes]
        # Otherwise a fresh buffer per batch: the previous batch's views may still be in use by the decoder.
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
            return read_error(loc, err)
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

    # -- fixed-size rows of a batch tensor, gathered from shard files ------------------------------
    def read_rows(self, paths: Sequence[str], files: np.ndarray, offsets: np.ndarray, out: torch.Tensor, *,
                  handles=None) -> None:
        """Fill every row ``out[k]`` (``out[0].nbytes`` bytes) with the bytes of ``paths[files[k]]`` from byte
        ``offsets[k]``: fixed-size samples read straight into a batch tensor (CPU or CUDA).

        Rows are grouped by file and sorted by offset; neighbours at most `COALESCE_GAP` bytes apart become one
        read (at most `READ_CHUNK` bytes). Into CUDA memory with KvikIO (``device_path`` kvikio) each read is
        one ``CuFile.pread`` (KvikIO splits it over its thread pool), landing in ``out`` itself when its rows
        are back to back in the file and in ``out``, else in a device staging buffer spread over the rows by
        one strided copy. KvikIO writes outside torch's streams, so this first waits for the work queued on
        ``out``'s device's current stream. Otherwise ``os.preadv`` scatters each read into its rows (gaps go
        to a scratch buffer) on this reader's threads: into a CPU ``out`` directly, into a pinned host buffer
        and one copy for a CUDA ``out``. ``handles`` (`file_handles()`) keeps files open across calls;
        without it they are opened and closed per call. A short read raises CorruptRecordError."""
        if not out.is_contiguous():
            raise ValueError("read_rows needs a contiguous tensor")
        files = np.asarray(files, dtype=np.int64).reshape(-1)
        offsets = np.asarray(offsets, dtype=np.int64).reshape(-1)
        if not len(files) == len(offsets) == (out.shape[0] if out.dim() else -1):
            raise ValueError(f"read_rows: {len(files)} files and {len(offsets)} offsets for "
                             f"{out.shape[0] if out.dim() else 0} rows of out")
        flat = out.view(torch.uint8).reshape(len(offsets), -1)
        if flat.numel() == 0:
            return
        own = handles is None
        handles = file_handles() if own else handles
        runs = plan_runs(files, offsets, flat.shape[1])
        try:
            if self.device_path == "kvikio" and out.is_cuda or self.path == "kvikio" and not out.is_cuda:
                self._rows_kvikio(paths, runs, flat, handles)
            elif out.is_cuda:
                staging = torch.empty(flat.shape, dtype=torch.uint8, pin_memory=True)
                self._rows_posix(paths, runs, staging.numpy(), handles)
                flat.copy_(staging, non_blocking=True)  # the pinned block stays reserved until the copy is done
            else:
                self._rows_posix(paths, runs, flat.numpy(), handles)
        finally:
            if own:
                handles.close()

    def _rows_posix(self, paths: Sequence[str], runs: list["Run"], rows: np.ndarray, handles) -> None:
        scratch = memoryview(np.empty(COALESCE_GAP, dtype=np.uint8))  # gap bytes land here, unread

        def work(share: list[Run]) -> None:
            for run in share:
                path = paths[run.file]
                fd = handles.get(("fd", path), lambda: os.open(path, os.O_RDONLY))
                if run.dense:
                    first = int(run.rows[0])
                    iovs = [memoryview(rows[first:first + len(run.rows)].reshape(-1))]
                else:
                    iovs, pos = [], 0
                    for r, start in zip(run.rows.tolist(), run.starts.tolist()):
                        if start > pos:
                            iovs.append(scratch[:start - pos])
                        iovs.append(memoryview(rows[r]))
                        pos = start + rows.shape[1]
                _check_read(_preadv_full(fd, iovs, run.offset), run, path)

        shares = [runs[t::self.threads] for t in range(min(self.threads, len(runs)))]
        list(self._pool.map(work, shares))

    def _rows_kvikio(self, paths: Sequence[str], runs: list["Run"], flat: torch.Tensor, handles) -> None:
        if flat.is_cuda:
            import cupy
            torch.cuda.current_stream(flat.device).synchronize()
            as_buffer = cupy.asarray
        else:
            as_buffer = torch.Tensor.numpy
        row = flat.shape[1]
        dest = as_buffer(flat.reshape(-1))
        staged = [run for run in runs if not run.dense]
        if staged:
            staging = torch.empty(sum(run.nbytes for run in staged), dtype=torch.uint8, device=flat.device)
            stage = as_buffer(staging)
        files: dict[int, object] = {}
        pending, at = [], 0
        for run in runs:
            f = files.get(run.file)
            if f is None:
                path = paths[run.file]
                f = files[run.file] = handles.get(("kvikio", path), lambda: self._kvikio.CuFile(path, "r"))
            if run.dense:
                start = int(run.rows[0]) * row
                buf = dest[start:start + run.nbytes]
            else:
                buf, at = stage[at:at + run.nbytes], at + run.nbytes
            pending.append((run, f.pread(buf, run.nbytes, run.offset)))
        for run, future in pending:
            _check_read(future.get(), run, paths[run.file])
        at = 0
        for run in staged:
            _spread(staging[at:at + run.nbytes], run, flat)
            at += run.nbytes

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
        return read_error(loc, err)


def read_error(loc: Location, err: OSError) -> SourceError:
    """The typed error for a location that cannot be read, naming the file (and offset), chained from ``err``."""
    where = f" at byte {loc.offset}" if loc.offset else ""
    out = SourceError(f"{loc.path}: cannot read{where}: {err.strerror or err}", path=loc.path)
    out.__cause__ = err
    return out


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


# -- batched row reads (ByteReader.read_rows) --------------------------------------------------------

#: Rows at most this many bytes apart in a file are read as one range (the gap is read and dropped): one
#: read of a few more bytes costs less than a second call.
COALESCE_GAP = 64 * 1024
#: The longest single read `read_rows` issues (posix reads split a batch across threads at this size; KvikIO
#: splits each read again by its own ``task_size``).
READ_CHUNK = 16 << 20
#: Rows per read at most: a posix read scatters with two iovecs per row, and IOV_MAX is 1024 on Linux.
MAX_RUN_ROWS = 512


class Run(NamedTuple):
    """One read of `ByteReader.read_rows`: ``nbytes`` bytes of ``paths[file]`` from ``offset``, holding the
    batch rows ``rows`` at byte ``starts`` of the range (increasing). ``dense``: the rows are back to back
    both in the file and in the batch, so the range can land in the batch tensor as it is."""

    file: int
    offset: int
    nbytes: int
    rows: np.ndarray
    starts: np.ndarray
    dense: bool


def plan_runs(files: np.ndarray, offsets: np.ndarray, row: int, *, gap: int = COALESCE_GAP,
              chunk: int = READ_CHUNK) -> list[Run]:
    """Group ``len(offsets)`` rows of ``row`` bytes (row k at ``offsets[k]`` of file ``files[k]``) into reads:
    sorted by file and offset, a row joins the previous read when it starts at or after its end, at most
    ``gap`` bytes later, and the read stays within ``chunk`` bytes and `MAX_RUN_ROWS` rows."""
    order = np.lexsort((offsets, files))
    f, o = files[order], offsets[order]
    n = len(order)
    brk = np.ones(n, dtype=bool)
    brk[1:] = (f[1:] != f[:-1]) | (o[1:] < o[:-1] + row) | (o[1:] - (o[:-1] + row) > gap)
    seg = np.cumsum(brk) - 1
    first = np.flatnonzero(brk)
    piece = (o - o[first][seg]) // max(chunk, row)
    pos = np.arange(n) - first[seg]
    brk[1:] |= (piece[1:] != piece[:-1]) | (pos[1:] // MAX_RUN_ROWS != pos[:-1] // MAX_RUN_ROWS)
    starts = np.flatnonzero(brk)
    lasts = np.append(starts[1:], n) - 1
    # A run is dense when every neighbour pair in it is back to back in the file and in the batch.
    apart = np.concatenate(([0], np.cumsum((np.diff(o) != row) | (np.diff(order) != 1))))
    dense = (apart[lasts] == apart[starts]).tolist()
    nbytes = (o[lasts] + row - o[starts]).tolist()
    fl, ol = f.tolist(), o.tolist()
    runs = []
    for a, b, nb, d in zip(starts.tolist(), (lasts + 1).tolist(), nbytes, dense):
        runs.append(Run(fl[a], ol[a], nb, order[a:b], o[a:b] - ol[a] if b - a > 1 else _ZERO, d))
    return runs


_ZERO = np.zeros(1, dtype=np.int64)


def _spread(span: torch.Tensor, run: Run, flat: torch.Tensor) -> None:
    """Copy the rows of one staged read (``span``: its bytes) into their rows of ``flat`` ([B, row] uint8)."""
    row = flat.shape[1]
    steps = np.diff(run.starts)
    if len(steps) == 0 or (steps == steps[0]).all():
        step = int(steps[0]) if len(steps) else row
        view = span.as_strided((len(run.rows), row), (step, 1))
        rows = torch.from_numpy(run.rows).to(flat.device, non_blocking=True)
        flat.index_copy_(0, rows, view)
    else:
        for r, start in zip(run.rows.tolist(), run.starts.tolist()):
            flat[r].copy_(span[start:start + row])


def _check_read(got: int, run: Run, path: str) -> None:
    if got != run.nbytes:
        raise CorruptRecordError(f"short read: {got} of {run.nbytes} bytes (the file is shorter than its "
                                 f"index says: truncated after it was opened?)", path=path, offset=run.offset)


def _preadv_full(fd: int, iovs: list[memoryview], offset: int) -> int:
    """``os.preadv`` until every buffer is full or the file ends; returns the bytes read."""
    done = 0
    while iovs:
        n = os.preadv(fd, iovs, offset + done)
        if n == 0:
            break
        done += n
        while iovs and n >= len(iovs[0]):
            n -= len(iovs[0])
            iovs = iovs[1:]
        if iovs and n:
            iovs = [iovs[0][n:], *iovs[1:]]
    return done


def file_handles():
    """A per-process cache of open files for `ByteReader.read_rows` (posix descriptors and KvikIO
    ``CuFile``s, keyed by kind and path), closed by its ``close()``; an attribute of the source that owns
    the files, so that they are opened once per process and never pickled."""
    from .formats.base import ProcessLocal
    return ProcessLocal(close=_close_handle)


def _close_handle(handle) -> None:
    if isinstance(handle, int):
        os.close(handle)
    else:
        handle.close()
