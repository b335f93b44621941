"""The format contract: what a source of samples must provide, said once, and `check_format`, the
conformance check every format's tests run.

A source is a sized, indexable collection of samples. For sample ``i`` it tells the reader *where the bytes
are* (:meth:`Source.locate`) and, once they are read, *what they mean* (:meth:`Source.parse`). Keeping the
two apart lets the executor batch every read of a batch into one call on the I/O thread pool (KvikIO or
``os.pread``) whatever the format:

- file tree: one file per sample -> ``Location(path)`` (whole file); ``parse`` returns the bytes as they are.
- TFRecord / RecordIO: a byte range inside a big file, found through an index -> ``Location(path, offset,
  length)``; ``parse`` strips the record framing and decodes the label / tf.train.Example.
- LMDB: key -> value from an mmap, no file offsets -> ``Location(key, data=<the value>)`` filled in
  ``locate`` (a memory view, no copy); the reader passes ``data`` through.
- raw tensor shards: aligned ranges read straight into device memory (``ByteReader.read_into``).
- COCO: like the file tree, plus per-image targets (boxes, labels, masks) returned by ``parse``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Location:
    """Where sample bytes live: ``length`` bytes of ``path`` from ``offset`` (``None``: to the end of the
    file), or ``data`` when the source already holds the bytes in memory (then ``path`` is a display name)."""

    path: str
    offset: int = 0
    length: int | None = None
    data: Any = None  # bytes | memoryview | np.ndarray


@dataclass
class Record:
    """A parsed sample: the encoded image, its class label (or -1) and optional extra targets."""

    image: Any                       # bytes-like encoded image
    label: int = -1
    targets: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Source(Protocol):
    """What the executor needs of a format."""

    classes: Sequence[str]           # class names, index = label; empty when unlabeled

    def __len__(self) -> int: ...

    def locate(self, i: int) -> Location:
        """Where sample ``i``'s bytes are. Raises IndexError outside ``range(len(self))``."""

    def parse(self, i: int, raw: Any) -> Record:
        """Interpret the bytes read for sample ``i``. Raises CorruptRecordError naming path and offset."""

    def labels(self) -> np.ndarray:
        """Class label of every sample (int64, -1 = none), for batching labels without parsing."""

    def name(self, i: int) -> str:
        """A human-readable name of sample ``i`` (path, path:offset or key) for messages."""


def check_index(i: int, n: int) -> int:
    """Validate and normalize a sample index (negative indices count from the end)."""
    if not isinstance(i, (int, np.integer)):
        raise TypeError(f"sample index must be an integer, got {type(i).__name__}")
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError(f"sample index {i} out of range for a source of {n} samples")
    return int(i)


def check_format(source: Source, *, read=None) -> None:
    """Conformance check every format's tests run. ``read(location) -> bytes`` reads a location (defaults to a
    plain file read). Raises AssertionError describing the first violation."""
    n = len(source)
    assert isinstance(n, int) and n >= 0, f"len() must be a non-negative int, got {n!r}"
    labels = source.labels()
    assert isinstance(labels, np.ndarray) and labels.dtype == np.int64, "labels() must be an int64 array"
    assert labels.shape == (n,), f"labels() must have shape ({n},), got {labels.shape}"
    if len(source.classes):
        assert labels.min() >= -1 and labels.max() < len(source.classes), "labels must index classes"
    for bad in (n, -n - 1):
        try:
            source.locate(bad)
        except IndexError:
            pass
        else:
            raise AssertionError(f"locate({bad}) must raise IndexError for a source of {n} samples")
    read = read or _read_location
    for i in sorted({0, n // 2, n - 1} if n else set()):
        loc = source.locate(i)
        assert isinstance(loc, Location), f"locate({i}) must return a Location"
        record = source.parse(i, read(loc))
        assert isinstance(record, Record), f"parse({i}) must return a Record"
        assert record.label == labels[i], f"parse({i}).label {record.label} != labels()[{i}] {labels[i]}"
        assert len(memoryview(record.image)) > 0, f"sample {i} has an empty image"
        assert isinstance(source.name(i), str) and source.name(i), "name() must be a non-empty string"


def _read_location(loc: Location) -> bytes:
    if loc.data is not None:
        return bytes(loc.data)
    with open(loc.path, "rb") as f:
        f.seek(loc.offset)
        return f.read() if loc.length is None else f.read(loc.length)
