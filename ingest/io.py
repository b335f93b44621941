"""Byte-range reads. One `ByteReader` reads a batch of `Location`s (byte ranges) on a thread pool:

- ``kvikio``: KvikIO's ``CuFile`` (GPUDirect Storage where the host has it, KvikIO's compat mode where
  not). ``io="auto"`` takes it for device destinations when CUDA and KvikIO are present (see `resolve_io`
  for why not for host destinations). KvikIO needs a CUDA driver even for host reads, so the no-GPU path
  never touches it.
- ``posix``: ``preadv`` straight into the destination buffer. A batch's reads are planned in Python as one
  set of `_Tasks` and run by the compiled ``ingest._readv`` on native threads, which release the GIL once per
  batch (a Python thread per read pays a GIL hand-off per file, which beside a busy training thread costs
  more than the read); where it was not built, the same tasks run on this reader's Python threads.

Encoded data goes to host memory (pinned when the batch is headed for the GPU decoder, which reads the
bitstream from the host); raw tensors go straight to device memory with :meth:`ByteReader.read_into`.
Which paths run are `ByteReader.path` (host) and `ByteReader.device_path` (the loader's
``stats()["read_path"]``); ``io="kvikio"`` sends both through KvikIO.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

from . import defaults
from ._driver import Staging
from ._threads import Threads
from .errors import ConfigError, CorruptRecordError, SourceError

try:
    from . import _readv as NATIVE
except ImportError:  # built by setup.py where a C compiler is found
    NATIVE = None

log = logging.getLogger("ingest")

MIN_SHARE = 8  # files per pool task at least (ByteReader._shared_map)


@dataclass(frozen=True)
class Location:
    """Where sample bytes live: ``length`` bytes of ``path`` from ``offset`` (``None``: to the end of the
    file), or ``data`` when the source already holds the bytes in memory (then ``path`` is a display name)."""

    path: str
    offset: int = 0
    length: int | None = None
    data: Any = None  # bytes | memoryview | np.ndarray


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
    through its own thread pool even where GDS exists, and is the slower of the two for file-per-sample reads
    (``docs/measurements.md``, section Reads)."""
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
    receiver must be done with a buffer before its turn comes again (`ingest.engine.workers` says why it is)."""

    def __init__(self, io: str | None = None, *, threads: int | None = None, pin: bool = False,
                 shared: int = 0):
        self.path, self.device_path = resolve_io(io)
        self.threads = threads or defaults.get("io_threads")
        self.pin = pin
        self.shared = shared
        self.last_arena: tuple[int, torch.Tensor, int, bool] | None = None
        self._buffers: list[torch.Tensor | None] = [None] * shared
        self._turn = 0
        self._pool = Threads(self.threads, "ingest-io")
        if "kvikio" in (self.path, self.device_path):
            import kvikio
            import kvikio.defaults
            # KvikIO's own pool defaults to ONE thread; large reads are split across it.
            kvikio.defaults.set("num_threads", self.threads)
            self._kvikio = kvikio
        self._kvikio_min_read = KVIKIO_MIN_READ
        log.info("ingest: reads to host memory via %s, to device memory via %s (%d threads)",
                 self.path, self.device_path, self.threads)

    # -- batch reads into host memory -------------------------------------------------------------
    def read(self, locations: Sequence[Location]) -> list[np.ndarray | Exception]:
        """Bytes of every location, as uint8 views into one arena, in order. A location whose read fails
        gives its error as its value (the executor applies the failure budget): `SourceError` naming the
        file when it cannot be opened or read (missing, no permission, a directory), `CorruptRecordError`
        when it is shorter than the location says."""
        sizes: list[int | Exception] = [0 if loc.data is not None else loc.length for loc in locations]
        unknown = [k for k, size in enumerate(sizes) if size is None]
        for k, size in zip(unknown, self._sizes([locations[k].path for k in unknown])):
            loc = locations[k]
            if isinstance(size, OSError):
                sizes[k] = read_error(loc, size)
            elif size < loc.offset:
                sizes[k] = CorruptRecordError(f"offset {loc.offset} is past the end of the file ({size} bytes)",
                                              path=loc.path, offset=loc.offset)
            else:
                sizes[k] = size - loc.offset
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
                jobs.append((len(views) - 1, offset))
                offset += size
        if self.path == "kvikio":
            ks = [k for k, _ in jobs]
            for share, errors in self._shared_map(lambda k: self._read_kvikio(locations[k], views[k]), ks):
                for k, err in zip(share, errors):
                    if err is not None:
                        views[k] = err
            return views
        tasks = _Tasks.whole(arena, [locations[k].path for k, _ in jobs], [locations[k].offset for k, _ in jobs],
                             [at for _, at in jobs], [len(views[k]) for k, _ in jobs])
        for (k, _), got in zip(jobs, self._run(tasks).tolist()):
            want, loc = len(views[k]), locations[k]
            if got < 0:
                views[k] = read_error(loc, _os_error(got))
            elif got != want:
                views[k] = short_read(got, want, loc.path, loc.offset)
        return views

    def _run(self, tasks: "_Tasks") -> np.ndarray:
        """Run a batch of reads: natively where ``ingest._readv`` was built, else on this reader's threads.
        Per task (int64): the bytes read, or -errno of the error that stopped it."""
        if NATIVE is not None:
            # A thread costs about as much to start as a page-cached read of a file: each one gets at least
            # MIN_SHARE reads or 1 MiB (docs/measurements.md, Reads).
            work = max(-(-len(tasks) // MIN_SHARE), int(tasks.lens.sum()) >> 20)
            return tasks.run_native(max(1, min(self.threads, work)))
        return np.array(self._pool_map(tasks.run_one, len(tasks)), dtype=np.int64).reshape(-1)

    def _sizes(self, paths: list[str]) -> list[int | OSError]:
        """Each file's size in bytes, or the OSError of looking it up."""
        if NATIVE is not None and paths:
            got = np.empty(len(paths), dtype=np.int64)
            # A stat is cheap next to a thread start: threads pay from 128 files each (docs/measurements.md, Reads).
            NATIVE.sizes(paths, got, max(1, min(self.threads, len(paths) // 128)))
            got = got.tolist()
        else:
            got = self._pool_map(lambda k: _size_of(paths[k]), len(paths))
        return [_os_error(g) if g < 0 else g for g in got]

    def _pool_map(self, fn, n: int) -> list:
        """``[fn(k) for k in range(n)]`` on the pool (`_shared_map`)."""
        got: list = [None] * n
        for share, results in self._shared_map(fn, list(range(n))):
            for k, g in zip(share, results):
                got[k] = g
        return got

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

    def grow_shared(self, nbytes: int) -> tuple[int, torch.Tensor, int, bool]:
        """Make the latest batch's shared buffer hold ``nbytes`` (its reads kept at the start; grown with room to
        spare and marked new if it must be): a reader process puts what the parse made outside it (a TFRecord
        image that protobuf parsed, an LMDB value copied out) after the reads. Returns the new `last_arena`."""
        slot, buffer, used, new = self.last_arena
        if buffer.numel() < nbytes:
            bigger = torch.empty(nbytes + nbytes // 4, dtype=torch.uint8).share_memory_()
            bigger[:used].copy_(buffer[:used])
            buffer = self._buffers[slot] = bigger
            new = True
        self.last_arena = (slot, buffer, nbytes, new)
        return self.last_arena

    def _read_kvikio(self, loc: Location, out: np.ndarray) -> Exception | None:
        try:
            with self._kvikio.CuFile(loc.path, "r") as f:
                got = f.pread(out, out.nbytes, loc.offset).get()
        except OSError as err:
            return read_error(loc, err)
        if got != out.nbytes:
            return short_read(got, out.nbytes, loc.path, loc.offset)
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
        else:
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) if out.is_cuda else flat
            got = int(self._run(_Tasks.whole(host.numpy(), [loc.path], [loc.offset], [0], [nbytes]))[0])
            if got < 0:
                raise read_error(loc, _os_error(got))
            if out.is_cuda:
                flat.copy_(host, non_blocking=False)
        if got != nbytes:
            raise short_read(got, nbytes, loc.path, loc.offset)

    # -- fixed-size rows of a batch tensor, gathered from shard files ------------------------------
    @functools.cached_property
    def _staging(self) -> Staging:
        """Pinned buffers for a CUDA batch's rows read with preadv, copied up with the GIL kept."""
        return Staging(slots=3)

    def read_rows(self, paths: Sequence[str], files: np.ndarray, offsets: np.ndarray, out: torch.Tensor, *,
                  handles=None) -> None:
        """Fill every row ``out[k]`` (``out[0].nbytes`` bytes) with the bytes of ``paths[files[k]]`` from byte
        ``offsets[k]``: fixed-size samples read straight into a batch tensor (CPU or CUDA).

        Rows are grouped by file and sorted by offset; neighbours at most `COALESCE_GAP` bytes apart become one
        read (at most `READ_CHUNK` bytes). With KvikIO (``device_path`` kvikio for a CUDA ``out``, ``path``
        kvikio for a CPU one) each read of at least `KVIKIO_MIN_READ` bytes is one ``CuFile.pread``, which
        KvikIO splits over its thread pool (GDS where the host has it), landing in ``out`` itself when its
        rows are back to back in the file and in ``out``, else in a device staging buffer spread over the rows
        by one strided copy; KvikIO writes outside torch's streams, so this first waits for the work queued on
        ``out``'s device's current stream. Smaller reads (a shuffled batch's scattered rows), and every read
        without KvikIO, are ``preadv`` calls scattering each read into its rows (gaps are read and dropped),
        all of a batch's in one `_Tasks`: into a CPU ``out`` directly, into a pinned host buffer and one copy
        (queued on the current stream) for a CUDA ``out``. ``handles`` (`file_handles()`) keeps files open
        across calls; without it they are opened and closed per call. A short read raises
        CorruptRecordError."""
        if not out.is_contiguous():
            raise ValueError("read_rows needs a contiguous tensor")
        files = np.asarray(files, dtype=np.int64).reshape(-1)
        offsets = np.asarray(offsets, dtype=np.int64).reshape(-1)
        if not len(files) == len(offsets) == (out.shape[0] if out.dim() else -1):
            raise ValueError(f"read_rows: {len(files)} files and {len(offsets)} offsets for "
                             f"{out.shape[0] if out.dim() else 0} rows of out")
        n = len(offsets)
        row = out.numel() * out.element_size() // n if n else 0   # no view or reshape: each gives the GIL up
        if row == 0:
            return
        own = handles is None
        handles = file_handles() if own else handles
        kvikio = (self.device_path if out.is_cuda else self.path) == "kvikio"
        try:
            if NATIVE is not None:   # planned in one native call (numpy's would give the GIL up ~20 times)
                if self._rows_native(paths, files, offsets, out, handles, kvikio):
                    return
            plan = plan_rows(files, offsets, row)
            large = plan.nbytes >= self._kvikio_min_read if kvikio else np.zeros(len(plan.nbytes), dtype=bool)
            some = large.any()
            if some:
                self._rows_kvikio(paths, plan.runs(np.flatnonzero(large)), _rows_of(out, n), handles)
            if large.all():
                return
            if some and out.is_cuda:
                self._rows_some_staged(paths, plan, ~large, _rows_of(out, n), handles)
            elif out.is_cuda:
                staged = self._staging.take(n * row).reshape(n, row)
                self._rows_posix(paths, plan, ~large, staged, None, handles)
                self._staging.upload(staged, out, torch.cuda.current_stream(out.device))
            else:
                self._rows_posix(paths, plan, ~large, _rows_of(out, n).numpy(), None, handles)
        finally:
            if own:
                handles.close()

    def _rows_native(self, paths: Sequence[str], files: np.ndarray, offsets: np.ndarray, out: torch.Tensor,
                     handles, kvikio: bool) -> bool:
        """Read every row into ``out`` with the tasks ``ingest._readv.plan_rows`` makes in one call (the same
        reads as `plan_rows` + `_rows_posix`): by native preadv into ``out`` (CPU) or a pinned buffer and one
        copy (CUDA); with ``kvikio``, when a task is large enough for KvikIO and every task's rows are back to
        back (a batch read in order), each task is one KvikIO read straight into its rows. Returns False, having
        read nothing, where KvikIO should read some tasks and not others (`read_rows` then splits the batch)."""
        n = len(offsets)
        row = out.numel() * out.element_size() // n
        host = self._staging.take(n * row) if out.is_cuda else out.numpy().view(np.uint8).reshape(-1)
        files, offsets = np.ascontiguousarray(files), np.ascontiguousarray(offsets)
        listed = files.tolist()
        if listed and min(listed) < 0:
            raise ValueError(f"read_rows: file number {min(listed)} is negative")
        fd_of = _descriptors(paths, listed, offsets, handles)
        table = np.full(max(listed) + 1 if listed else 0, -1, dtype=np.int64)
        for file, fd in fd_of.items():
            table[file] = fd
        file_of = {fd: file for file, fd in fd_of.items()}
        fds, starts, want, dense = (np.empty(n, dtype=np.int64) for _ in range(4))
        first, lens, addrs = np.empty(n + 1, dtype=np.int64), np.empty(2 * n, dtype=np.int64), \
            np.empty(2 * n, dtype=np.uint64)
        tasks, segments, total, longest = NATIVE.plan_rows(
            files, offsets, None, table, row, COALESCE_GAP, READ_CHUNK, MAX_RUN_ROWS, host.ctypes.data, host.nbytes,
            fds, starts, first, addrs, lens, want, dense)
        if kvikio and longest >= self._kvikio_min_read:
            if not dense[:tasks].all():
                return False
            # A task's first row, from its first address (row k lands at byte k * row of ``host``).
            lead = ((addrs[first[:tasks]] - np.uint64(host.ctypes.data)) // np.uint64(row)).astype(np.int64)
            runs = [Run(file_of[fd], at, size, np.arange(k, k + size // row), _ZERO, True) for fd, at, size, k in
                    zip(fds[:tasks].tolist(), starts[:tasks].tolist(), want[:tasks].tolist(), lead.tolist())]
            self._rows_kvikio(paths, runs, _rows_of(out, n), handles)
            return True
        got = np.empty(tasks, dtype=np.int64)
        threads = max(1, min(self.threads, max(-(-tasks // MIN_SHARE), total >> 20)))
        NATIVE.read([None] * tasks, fds[:tasks], starts[:tasks], first[:tasks + 1], addrs[:segments],
                    lens[:segments], got, threads)
        _check_reads(got, want[:tasks], lambda k: (paths[file_of[int(fds[k])]], int(starts[k])))
        if out.is_cuda:
            self._staging.upload(host, out, torch.cuda.current_stream(out.device))
        return True

    def _rows_some_staged(self, paths: Sequence[str], plan: "RowPlan", which: np.ndarray, flat: torch.Tensor,
                          handles) -> None:
        """Read the runs ``which`` (a mask over ``plan``'s runs, not all of them: KvikIO read the others) into
        a pinned host buffer holding just their rows, in batch order, then copy them by row index into ``flat``
        (CUDA, ``[rows, row bytes]``) on the current stream."""
        rows = np.sort(plan.order[which[plan.run_of]])
        slot = np.empty(flat.shape[0], dtype=np.int64)
        slot[rows] = np.arange(len(rows))
        staging = torch.empty((len(rows), flat.shape[1]), dtype=torch.uint8, pin_memory=True)
        self._rows_posix(paths, plan, which, staging.numpy(), slot, handles)
        # non_blocking: the pinned block stays reserved until the copy is done
        index = torch.from_numpy(rows).to(flat.device, non_blocking=True)
        flat.index_copy_(0, index, staging.to(flat.device, non_blocking=True))

    def _rows_posix(self, paths: Sequence[str], plan: "RowPlan", which: np.ndarray, rows: np.ndarray,
                    slot: np.ndarray | None, handles) -> None:
        """Read the runs ``which`` (a mask over ``plan``'s runs) into ``rows`` (host, [N, row]): batch row r
        lands in ``rows[slot[r]]`` (``slot`` None: in ``rows[r]``). One task per run, one segment per row and
        one per gap, all built with array operations: no Python work per row or per run."""
        row = rows.shape[1]
        keep = which[plan.run_of]                 # the sorted rows of those runs
        pos, batch_rows = plan.pos[keep], plan.order[keep]
        lead = plan.lead[keep]                    # each run's first row
        offsets = pos[lead]                       # where each run starts in its file
        gaps = np.zeros(len(pos), dtype=np.int64)
        gaps[1:] = pos[1:] - pos[:-1] - row
        gaps[lead] = 0
        has_gap = gaps > 0
        ends = np.cumsum(1 + has_gap)             # a gap segment (read and dropped) before its row's segment
        at = ends - 1
        starts = np.full(int(ends[-1]), -1, dtype=np.int64)
        lens = np.full(int(ends[-1]), row, dtype=np.int64)
        starts[at] = (batch_rows if slot is None else slot[batch_rows]) * row
        lens[at[has_gap] - 1] = gaps[has_gap]
        chosen = np.flatnonzero(which)
        run_files = plan.file[chosen].tolist()
        fd_of = _descriptors(paths, run_files, offsets, handles)
        fds = np.array([fd_of[file] for file in run_files], dtype=np.int64)
        tasks = _Tasks(rows.reshape(-1), [None] * len(chosen), fds, offsets, np.append(at[lead], len(starts)),
                       starts, lens)
        _check_reads(self._run(tasks), plan.nbytes[chosen], lambda k: (paths[run_files[k]], int(offsets[k])))

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
        self._pool.shutdown()

    def __enter__(self) -> "ByteReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _size_of(path: str) -> int:
    """The size of ``path`` in bytes, or -errno."""
    try:
        return os.stat(path).st_size
    except OSError as err:
        return -(err.errno or errno.EIO)


def _os_error(code: int) -> OSError:
    """The OSError of a negative errno from a read task."""
    return OSError(-code, os.strerror(-code))


def read_error(loc: Location, err: OSError) -> SourceError:
    """The typed error for a location that cannot be read, naming the file (and offset), chained from ``err``."""
    where = f" at byte {loc.offset}" if loc.offset else ""
    out = SourceError(f"{loc.path}: cannot read{where}: {err.strerror or err}", path=loc.path)
    out.__cause__ = err
    return out


@dataclass(frozen=True)
class _Tasks:
    """One batch of reads into ``base`` (a contiguous uint8 host array). Task k reads from byte ``offsets[k]``
    of the open descriptor ``fds[k]`` (or, where that is < 0, of ``paths[k]``, opened for the task) into its
    segments ``first[k]`` to ``first[k + 1] - 1`` in order, segment s being ``lens[s]`` bytes at ``starts[s]``
    of ``base``; a segment at start -1 is read and dropped (a gap inside one coalesced read). Run by the
    compiled ``ingest._readv`` (`run_native`) or, where it was not built, by `run_one` on Python threads."""

    base: np.ndarray
    paths: list
    fds: np.ndarray
    offsets: np.ndarray
    first: np.ndarray
    starts: np.ndarray
    lens: np.ndarray

    @classmethod
    def whole(cls, base: np.ndarray, paths: list, offsets, starts, lens) -> "_Tasks":
        """One task per path, each opened for its read, into one segment each."""
        n = len(paths)
        return cls(base, list(paths), np.full(n, -1, dtype=np.int64), np.asarray(offsets, dtype=np.int64),
                   np.arange(n + 1, dtype=np.int64), np.asarray(starts, dtype=np.int64),
                   np.asarray(lens, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.offsets)

    def run_native(self, threads: int) -> np.ndarray:
        """Every task on ``threads`` native threads; per task the bytes read or -errno."""
        starts, lens = self.starts, self.lens
        if len(starts) and ((starts >= 0) & (starts + lens > self.base.nbytes)).any():
            raise ValueError("a read segment ends past its buffer")  # a planning bug; never write past it
        addrs = np.where(starts >= 0, starts + self.base.ctypes.data, 0).astype(np.uint64)
        got = np.empty(len(self), dtype=np.int64)
        NATIVE.read(self.paths, self.fds, self.offsets, self.first, addrs, lens, got, threads)
        return got

    def run_one(self, k: int) -> int:
        """Task ``k`` on the calling thread: the bytes read or -errno."""
        base = memoryview(self.base).cast("B")
        a, b = int(self.first[k]), int(self.first[k + 1])
        starts, lens = self.starts[a:b].tolist(), self.lens[a:b].tolist()
        scratch = memoryview(bytearray(max((n for s, n in zip(starts, lens) if s < 0), default=0)))
        iovs = [base[s:s + n] if s >= 0 else scratch[:n] for s, n in zip(starts, lens)]
        own = self.fds[k] < 0
        try:
            fd = os.open(self.paths[k], os.O_RDONLY) if own else int(self.fds[k])
            try:
                return _preadv_full(fd, iovs, int(self.offsets[k]))
            finally:
                if own:
                    os.close(fd)
        except OSError as err:
            return -(err.errno or errno.EIO)


# -- batched row reads (ByteReader.read_rows) --------------------------------------------------------

#: Rows at most this many bytes apart in a file are read as one range (the gap is read and dropped): one
#: read of a few more bytes costs less than a second call.
COALESCE_GAP = 64 * 1024
#: The longest single read `read_rows` issues (posix reads split a batch across threads at this size; KvikIO
#: splits each read again by its own ``task_size``).
READ_CHUNK = 16 << 20
#: `ByteReader.read_rows` sends reads of at least this many bytes through KvikIO, smaller ones to one native
#: preadv batch into pinned memory and one copy: KvikIO splits a large read over its thread pool, but issues
#: each small one by a Python call of its own (and, below its ``gds_threshold``, by POSIX on the calling
#: thread), so small shuffled rows go faster through preadv and large consecutive reads through KvikIO
#: (``docs/measurements.md``, section Reads).
KVIKIO_MIN_READ = 1 << 20
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


class RowPlan(NamedTuple):
    """`plan_rows`'s reads in columns. The rows sorted by (file, offset): ``order`` (their batch rows),
    ``pos`` (their file offsets), ``run_of`` (the read holding each) and ``lead`` (True for each read's first
    row). Per read: ``file``, ``nbytes`` and ``dense`` (its rows back to back both in the file and in the batch)."""

    order: np.ndarray
    pos: np.ndarray
    run_of: np.ndarray
    lead: np.ndarray
    file: np.ndarray
    nbytes: np.ndarray
    dense: np.ndarray

    def runs(self, which: Sequence[int]) -> list["Run"]:
        """The reads ``which`` as `Run`s."""
        firsts = np.flatnonzero(self.lead)
        ends = np.append(firsts[1:], len(self.order))
        out = []
        for r in which:
            a, b = int(firsts[r]), int(ends[r])
            offset = int(self.pos[a])
            out.append(Run(int(self.file[r]), offset, int(self.nbytes[r]), self.order[a:b],
                           self.pos[a:b] - offset if b - a > 1 else _ZERO, bool(self.dense[r])))
        return out


def _descriptors(paths: Sequence[str], files: list[int], offsets: np.ndarray, handles) -> dict[int, int]:
    """The open descriptor of each file number in ``files`` (entry k read at ``offsets[k]``, named in the error
    of a file that does not open), from ``handles``. A dict, not np.unique and a mask per file: on a big
    batch each of those gives the GIL up."""
    fd_of: dict[int, int] = {}
    for k, file in enumerate(files):
        if file not in fd_of:
            path = paths[file]
            try:
                fd_of[file] = handles.get(("fd", path), lambda: os.open(path, os.O_RDONLY))
            except OSError as err:
                raise read_error(Location(path, int(offsets[k])), err) from None
    return fd_of


def _check_reads(got: np.ndarray, want: np.ndarray, where) -> None:
    """Raise for the first read k whose count ``got[k]`` (bytes, or -errno) is not ``want[k]``; ``where(k)``:
    its (path, offset). The arrays are compared as bytes, which keeps the GIL (numpy's ``!=`` may not)."""
    if got.tobytes() == want.tobytes():
        return
    k = next(k for k, (g, w) in enumerate(zip(got.tolist(), want.tolist())) if g != w)
    path, offset = where(k)
    if got[k] < 0:
        raise read_error(Location(path, offset), _os_error(int(got[k])))
    raise short_read(int(got[k]), int(want[k]), path, offset)


def _rows_of(out: torch.Tensor, n: int) -> torch.Tensor:
    """``out`` as ``[n, row bytes]`` uint8 (a view)."""
    return out.view(torch.uint8).reshape(n, -1)


def plan_rows(files: np.ndarray, offsets: np.ndarray, row: int, *, gap: int = COALESCE_GAP,
              chunk: int = READ_CHUNK) -> RowPlan:
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
    return RowPlan(order, o, np.cumsum(brk) - 1, brk, f[starts], o[lasts] + row - o[starts],
                   apart[lasts] == apart[starts])


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
        raise short_read(got, run.nbytes, path, run.offset)


def short_read(got: int, want: int, path: str, offset: int) -> CorruptRecordError:
    """The error for a read that got fewer bytes than the range asked: the file ends before its index (or the
    record's own header) says it does."""
    return CorruptRecordError(f"short read: {got} of {want} bytes (the file ends before the range its index or "
                              "header gives: truncated?)", path=path, offset=offset)


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


class ProcessLocal:
    """Handles (open files, LMDB environments, KvikIO handles) opened on first use in the process that uses
    them, shared by its threads, and never pickled: ``get(key, opener)`` returns the handle for ``key``,
    opening it with ``opener()`` once per process. A source keeps one as an attribute; pickling it (to send
    the source to a worker process) gives an empty one. A forked child never uses the parent's handles: it
    drops them, and with ``close_inherited`` also closes them with ``close`` (for handles a library allows
    only one of per process, such as LMDB environments)."""

    def __init__(self, close: Callable[[Any], None] | None = None, *, close_inherited: bool = False):
        self._pid = os.getpid()
        self._handles: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self._close = close
        self._close_inherited = close_inherited and close is not None

    def get(self, key: Any, opener: Callable[[], Any]) -> Any:
        if self._pid != os.getpid():  # inherited through fork: never use the parent's handles
            inherited = self._handles
            self._pid, self._handles, self._lock = os.getpid(), {}, threading.Lock()
            if self._close_inherited:
                for h in inherited.values():
                    self._close(h)
        handle = self._handles.get(key)
        if handle is None:
            with self._lock:
                handle = self._handles.get(key)
                if handle is None:
                    handle = self._handles[key] = opener()
        return handle

    def close(self) -> None:
        handles, self._handles = self._handles, {}
        if self._close is not None and self._pid == os.getpid():
            for h in handles.values():
                self._close(h)

    def __getstate__(self):
        return {"close": self._close, "close_inherited": self._close_inherited}

    def __setstate__(self, state):
        self.__init__(state["close"], close_inherited=state["close_inherited"])


def file_handles():
    """A per-process cache of open files for `ByteReader.read_rows` (posix descriptors and KvikIO
    ``CuFile``s, keyed by kind and path), closed by its ``close()``; an attribute of the source that owns
    the files, so that they are opened once per process and never pickled."""
    return ProcessLocal(close=_close_handle)


def _close_handle(handle) -> None:
    if isinstance(handle, int):
        os.close(handle)
    else:
        handle.close()
