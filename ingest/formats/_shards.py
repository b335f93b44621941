"""Helpers shared by the shard-file readers (TFRecord, RecordIO, WebDataset tars) and the index tools:
resolving a dataset path into shard files and their index files, telling a gzipped shard by its magic bytes,
the per-record table that locates a sample without searching, and bounded reads that never trust a length
field further than the file goes."""

from __future__ import annotations

import glob
import os
from array import array
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import CorruptRecordError, SourceError
from .base import Location, check_index

#: Read size used when a length field cannot be checked against a file size (compressed streams).
CHUNK = 1 << 20
#: The first two bytes of every gzip stream (RFC 1952).
GZIP_MAGIC = b"\x1f\x8b"


def gzipped(path: str) -> bool:
    """True for a gzip-compressed file, by its magic bytes (whatever its name says)."""
    with open(path, "rb") as f:
        return f.read(len(GZIP_MAGIC)) == GZIP_MAGIC


def resolve_shards(path: str | os.PathLike | Sequence[str | os.PathLike], accept: Callable[[str], bool],
                   what: str, sniff: Callable[[str], bool] | None = None) -> list[str]:
    """The shard files of ``path``: one file, a list of files, a glob (every file it matches), or a
    directory (sorted, subdirectories not searched). ``what`` names the shards in messages. Raises
    FileNotFoundError or SourceError.

    Notes
    -----
    A directory's shards are its files whose name ``accept`` takes, and its files with no extension (no dot
    in the name, as TF-slim's ``validation-00000-of-00001``) whose content ``sniff(path)`` takes (the
    format's magic or framing); hidden files never."""
    if not isinstance(path, (str, os.PathLike)):
        shards = [os.fspath(p) for p in path]
        if not shards:
            raise SourceError(f"no {what} files given")
        for p in shards:
            if not os.path.isfile(p):
                raise FileNotFoundError(f"{what} file {p!r} does not exist")
        return shards
    path = os.fspath(path)
    if os.path.isdir(path):
        shards = sorted(os.path.join(path, e.name) for e in os.scandir(path)
                        if e.is_file() and not e.name.startswith(".") and (
                            accept(e.name) or ("." not in e.name and sniff is not None and sniff(e.path))))
        if not shards:
            raise SourceError(f"no {what} files in directory {path!r}", path=path)
        return shards
    if os.path.isfile(path):
        return [path]
    if any(c in path for c in "*?["):
        shards = sorted(p for p in glob.glob(path) if os.path.isfile(p))
        if not shards:
            raise SourceError(f"no {what} files match {path!r}", path=path)
        return shards
    raise FileNotFoundError(f"{what} path {path!r} does not exist")


def resolve_indexes(index: str | os.PathLike | Sequence | None, shards: list[str],
                    index_of: Callable[[str], str]) -> list[str | None]:
    """The index file of each shard: ``index`` given explicitly (one path for one shard, a list aligned with
    the shards, or a directory holding the index files by name), else ``index_of(shard)`` beside the shard.
    None where no index file exists (the reader then builds one by scanning)."""
    if index is None:
        found = [index_of(s) for s in shards]
        return [p if os.path.isfile(p) else None for p in found]
    if isinstance(index, (str, os.PathLike)):
        index = os.fspath(index)
        if os.path.isdir(index):
            paths = [os.path.join(index, os.path.basename(index_of(s))) for s in shards]
        elif len(shards) == 1:
            paths = [index]
        else:
            raise SourceError(f"one index file {index!r} given for {len(shards)} shards; pass a list or a "
                              f"directory of index files", path=index)
    else:
        paths = [None if p is None else os.fspath(p) for p in index]
        if len(paths) != len(shards):
            raise SourceError(f"{len(paths)} index files given for {len(shards)} shards")
    for p in paths:
        if p is not None and not os.path.isfile(p):
            raise FileNotFoundError(f"index file {p!r} does not exist")
    return paths


def read_index_rows(index_path: str, shard: str, row: Callable[[list[bytes], int], tuple | None],
                    layout: str) -> tuple[list[tuple], int]:
    """The rows of a text index file of ``shard`` and the shard's size: ``row(words, shard_size)`` turns one
    line into a tuple, or None (or ValueError / IndexError) when the line is not a valid entry of the shard, which
    raises CorruptRecordError naming the index file and line."""
    size = os.path.getsize(shard)
    rows = []
    with open(index_path, "rb") as f:
        for line_no, line in enumerate(f, start=1):
            words = line.split()
            if not words:
                continue
            try:
                entry = row(words, size)
            except (ValueError, IndexError):
                entry = None
            if entry is None:
                raise CorruptRecordError(f"index line {line_no} ({line.strip()[:60]!r}) is not '{layout}' of a "
                                         f"record inside {shard} ({size} bytes)", path=index_path)
            rows.append(entry)
    return rows, size


def read_exact(f, n: int, path: str, offset: int, what: str) -> bytes:
    """Read exactly ``n`` bytes from stream ``f`` (positioned at ``offset``), in bounded chunks so that a
    corrupt length costs no more memory than the data really there. Raises CorruptRecordError when short."""
    if n <= CHUNK:
        data = f.read(n)
    else:
        parts, left = [], n
        while left:
            part = f.read(min(left, CHUNK))
            if not part:
                break
            parts.append(part)
            left -= len(part)
        data = b"".join(parts)
    if len(data) != n:
        raise CorruptRecordError(f"truncated {what}: expected {n} bytes, found {len(data)}", path=path,
                                 offset=offset)
    return data


class RecordTable:
    """Where every record of a set of shards is: the ``[N_k, 2]`` ``(offset, size)`` tables of ``shards``,
    concatenated. Each sample's shard number, offset and size sit in flat `array.array` columns, so finding
    sample ``i`` is three list-speed lookups (no search, no numpy scalar per call), at 20 bytes a sample,
    and the table pickles as a few byte strings."""

    def __init__(self, shards: Sequence[str], tables: Sequence[np.ndarray]):
        counts = [len(t) for t in tables]
        entries = np.concatenate(tables).astype(np.int64) if tables else np.zeros((0, 2), np.int64)
        self.shards = list(shards)
        self.starts = [0, *np.cumsum(counts).tolist()]   # samples of shard k: starts[k]:starts[k + 1]
        self.shard_of = array("i", np.repeat(np.arange(len(counts), dtype=np.intc), counts).tobytes())
        self.offsets = array("q", np.ascontiguousarray(entries[:, 0]).tobytes())
        self.sizes = array("q", np.ascontiguousarray(entries[:, 1]).tobytes())

    def __len__(self) -> int:
        return len(self.offsets)

    def index(self, i: int) -> int:
        """``i`` validated and normalized as `check_index` does (a plain in-range int passes straight)."""
        if type(i) is int and 0 <= i < len(self.offsets):
            return i
        return check_index(i, len(self.offsets))

    def path(self, i: int) -> str:
        """The shard file of sample ``i``."""
        return self.shards[self.shard_of[i]]

    def location(self, i: int) -> Location:
        """The byte range of sample ``i``; IndexError outside the table."""
        i = self.index(i)
        return Location(self.shards[self.shard_of[i]], self.offsets[i], self.sizes[i])

    def read_each(self, head: int | None = None) -> Iterator[tuple[int, str, int, bytes]]:
        """``(i, shard, offset, bytes)`` of every record in order, each read whole or, given ``head``, its
        first ``head`` bytes (fewer when the record is shorter); one open file per shard."""
        for k, shard in enumerate(self.shards):
            with open(shard, "rb") as f:
                for i in range(self.starts[k], self.starts[k + 1]):
                    offset, size = self.offsets[i], self.sizes[i]
                    f.seek(offset)
                    yield i, shard, offset, f.read(size if head is None else min(size, head))
