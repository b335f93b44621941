"""A source read by ranges of sample indices, whether it can seek or only stream: what the converter's shard
jobs read. It pickles as the source does (paths and indices, no handles), so a job can run anywhere.

Streamed sources (GZIP TFRecords, gzipped tars) are counted once, shard by shard, when the view is made; a
range then starts inside a source shard by reading past ``skip`` samples (`iter_shard(k, skip)`).
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Iterator

import numpy as np

from ..errors import IngestError
from ..formats.base import Location, Record
from ..io import short_read

#: Open source files a range read keeps at once.
_OPEN_FILES = 16


class SourceView:
    """Samples ``[start, stop)`` of ``source`` as ``(name, record, error)``; ``sizes`` (when asked for) holds
    each sample's stored size in bytes, for cutting shards by size."""

    def __init__(self, source: Any, *, sizes: bool = False):
        self.source = source
        self.streamed = bool(getattr(source, "streamed", False))
        self.sizes: np.ndarray | None = None
        if self.streamed:
            counts, sizes_list = [], []
            for k in range(len(source.shards)):
                n = 0
                for _, record in source.iter_shard(k, 0):
                    n += 1
                    if sizes:
                        sizes_list.append(_record_nbytes(record))
                counts.append(n)
            self._bounds = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
            if sizes:
                self.sizes = np.asarray(sizes_list, dtype=np.int64)
        elif sizes:
            self.sizes = np.fromiter((_stored_size(source.locate(i)) for i in range(len(source))),
                                     dtype=np.int64, count=len(source))

    def __len__(self) -> int:
        return int(self._bounds[-1]) if self.streamed else len(self.source)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["sizes"] = None   # the driver's planning data; jobs do not need it
        return state

    def read(self, start: int, stop: int) -> Iterator[tuple[str, Record | None, Exception | None]]:
        """Every sample of ``[start, stop)`` in order: ``(name, record, None)``, or ``(name, None, error)``
        for one that cannot be read or parsed."""
        if self.streamed:
            yield from self._read_streamed(start, stop)
            return
        files: dict[str, Any] = {}
        try:
            for i in range(start, stop):
                name = self.source.name(i)
                try:
                    record = self.source.parse(i, _read(self.source.locate(i), files))
                except (IngestError, OSError) as err:
                    yield name, None, err
                    continue
                yield name, record, None
        finally:
            for f in files.values():
                f.close()

    def _read_streamed(self, start: int, stop: int):
        k = int(np.searchsorted(self._bounds, start, side="right")) - 1
        pos = start
        while pos < stop:
            skip, take = pos - int(self._bounds[k]), min(stop, int(self._bounds[k + 1])) - pos
            try:
                for name, record in itertools.islice(self.source.iter_shard(k, skip), take):
                    yield name, record, None
            except (IngestError, OSError) as err:   # the rest of this source shard cannot be read
                yield str(self.source.shards[k]), None, err
            pos += take
            k += 1


def _nbytes(value: Any) -> int:
    return value.nbytes if isinstance(value, np.ndarray) else memoryview(value).nbytes


def _record_nbytes(record: Record) -> int:
    """Bytes a parsed sample holds in its byte-like and array fields (the image among them)."""
    values = (record.image, *record.fields.values())
    return sum(_nbytes(v) for v in values if isinstance(v, (bytes, bytearray, memoryview, np.ndarray)))


def _stored_size(loc: Location | tuple[Location, ...]) -> int:
    if isinstance(loc, tuple):
        return sum(_stored_size(part) for part in loc)
    if loc.data is not None:
        return _nbytes(loc.data)
    if loc.length is not None:
        return loc.length
    return max(os.path.getsize(loc.path) - loc.offset, 0)


def _read(loc: Location | tuple[Location, ...], files: dict[str, Any]) -> Any:
    """A location's bytes (a tuple of bytes for a tuple), keeping up to `_OPEN_FILES` files open."""
    if isinstance(loc, tuple):
        return tuple(_read(part, files) for part in loc)
    if loc.data is not None:
        return loc.data
    f = files.pop(loc.path, None)
    if f is None:
        if len(files) >= _OPEN_FILES:
            files.pop(next(iter(files))).close()
        f = open(loc.path, "rb")
    files[loc.path] = f   # most recently used last
    f.seek(loc.offset)
    data = f.read() if loc.length is None else f.read(loc.length)
    if loc.length is not None and len(data) != loc.length:
        raise short_read(len(data), loc.length, loc.path, loc.offset)
    return data
