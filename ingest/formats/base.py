"""The format contract: what a source of samples and a writer of samples must provide, said once, and
`check_format`, the conformance check every format's tests run.

**Samples are named fields of declared kinds.** A source declares ``fields: dict[str, Field]``; a parsed
sample (`Record`) holds one value per declared field. Two names are special: ``"image"`` is the field the
pipeline decodes and augments (kind ``image`` = encoded bytes, or ``pixels`` = already decoded uint8 HWC)
and ``"label"`` (kind ``int``) is the class label yielded beside it. Every other encoded-image field is
decoded too (on the CPU); a ``mask`` field (a segmentation label map) is decoded to its stored values and
moved by the geometry ops with the image; every field is collated by its kind (`KINDS`).

**Where, then what.** For sample ``i`` a source tells the reader where the bytes are (:meth:`Source.locate`:
one `Location` or a tuple of them, e.g. the tar members of a WebDataset sample) and, once they are read,
what they mean (:meth:`Source.parse`, which receives one buffer or a tuple of buffers in the same order).
Keeping the two apart lets the executor batch all reads of a batch, grouped by file, whatever the format.
A source may also locate or parse a whole batch in one call (``locate_batch``, ``parse_batch``; see
`locate_each`, `parse_each`), as LMDB and TFRecord do:

- file tree: one file per sample -> ``Location(path)``; ``parse`` returns the bytes as they are.
- TFRecord / RecordIO / tar shards: byte ranges of big files found through an index.
- LMDB: key -> the value's byte range of ``data.mdb``, found through the memory map in ``locate``.
- raw tensor shards: aligned ranges of decoded pixels, read straight into device memory.

**Handles are per process.** Open files, LMDB environments and KvikIO handles are opened lazily in the
process that uses them (`ProcessLocal`) and never pickled: a source crosses into worker processes as its
paths and index only.

**Streamed sources** (GZIP TFRecords, gzipped tars) cannot seek: they set ``streamed = True`` and provide
``shards`` and ``iter_shard(k, skip)`` instead of ``locate``/``parse``; the loader shuffles shard order and
a bounded buffer (see `ingest.stream`).

**Nothing unread goes unsaid.** A source that sees something in the data that no declared field reads
(TFRecord's per-object byte lists, COCO's segmentation without ``masks``) lists it in ``unread`` (name ->
how to read it); ``ingest inspect`` shows it and ``ingest convert`` refuses to leave it out unless dropped.

**Writers** (one per format module) write one output shard: ``Writer(directory, stem, fields, **options)``,
``add(record)``, ``close() -> [file names written]``. The converter (`ingest.tools.convert`) owns shard
naming, temporary names, renames, manifests and resume; a writer only turns records into bytes,
deterministically (the same records give the same bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from .._numpy import extremes
from ..errors import IngestError
from ..io import Location, ProcessLocal  # noqa: F401 - part of the source contract

#: Field kinds and how a batch collates them (see `ingest.engine.collate`).
KINDS = {
    "image": "encoded image bytes (JPEG, PNG, ...): decoded; 'image' goes through the ops",
    "pixels": "decoded uint8 pixels [H, W, C] (Caffe raw Datum, raw shards): 'image' goes through the ops",
    "mask": "a per-pixel label map: an encoded single-channel or palette image (PNG, ...) or its decoded [H, W] "
            "values; decoded to its stored values (uint8, or uint16) and moved by the geometry ops with the image",
    "int": "one integer -> int64 tensor [B]",
    "float": "one float -> float32 tensor [B]",
    "ints": "several integers (multi-value label) -> int64 [B, L] padded with -1, plus <name>_lengths",
    "floats": "several floats -> float32 [B, L] padded with 0, plus <name>_lengths",
    "text": "a str -> list of str",
    "bytes": "raw bytes -> list of bytes",
    "array": "a numpy array -> stacked tensor when shapes agree, else padded along dim 0 plus <name>_lengths",
}


@dataclass(frozen=True)
class Field:
    """One field of a sample: its kind (`KINDS`) and, where fixed, its shape and dtype (numpy name)."""

    kind: str
    shape: tuple[int, ...] | None = None   # fixed shape (ints/floats: (L,); pixels: (H, W, C)); None: varies
    dtype: str | None = None               # numpy dtype name for pixels/array
    fill: int | None = None                # mask: the value of pixels that geometry ops pad (None: `MASK_FILL`)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Unknown field kind {self.kind!r}. Available: {', '.join(KINDS)}")
        if self.shape is not None and not all(isinstance(d, (int, np.integer)) and d >= 0 for d in self.shape):
            raise ValueError(f"`shape` must be a tuple of ints >= 0, got {self.shape!r}")
        if self.fill is not None and (self.kind != "mask" or not 0 <= self.fill < 1 << 16):
            raise ValueError(f"`fill` is a mask's padding value in [0, 65535], got {self.fill!r} for a "
                             f"{self.kind} field")

    def to_json(self) -> dict[str, Any]:
        """The field as a manifest stores it: kind, and shape/dtype where fixed."""
        entry: dict[str, Any] = {"kind": self.kind}
        if self.shape is not None:
            entry["shape"] = [int(d) for d in self.shape]
        if self.dtype is not None:
            entry["dtype"] = self.dtype
        if self.fill is not None:
            entry["fill"] = int(self.fill)
        return entry

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> "Field":
        """The inverse of `to_json`."""
        shape = entry.get("shape")
        return cls(entry["kind"], tuple(shape) if shape is not None else None, entry.get("dtype"), entry.get("fill"))

    @property
    def mask_fill(self) -> int:
        """A mask's padding value: `fill`, else `MASK_FILL`."""
        return MASK_FILL if self.fill is None else int(self.fill)


#: What geometry ops write where a mask has no source pixel (padding, a crop past the edge, a rotation's
#: corners) unless its field declares another `Field.fill`: 255, PASCAL VOC's "ignore" label, which losses
#: skip (``ignore_index=255``).
MASK_FILL = 255


#: What a source that declares nothing holds: an encoded image and a class label.
DEFAULT_FIELDS = {"image": Field("image"), "label": Field("int")}


def fields_of(source: Any) -> dict[str, Field]:
    """The fields a source declares (`DEFAULT_FIELDS` when it declares none)."""
    return dict(getattr(source, "fields", None) or DEFAULT_FIELDS)


@dataclass
class Record:
    """A parsed sample: the primary ``image`` (encoded bytes or decoded pixels; None for a source without
    images), its class ``label`` (-1: none) and every other declared field by name in ``fields``."""

    image: Any
    label: int = -1
    fields: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str) -> Any:
        """The value of field ``name`` ('image', 'label' or another declared field)."""
        if name == "image":
            return self.image
        if name == "label":
            return self.label
        return self.fields[name]

    def as_dict(self) -> dict[str, Any]:
        """Every field by name, 'image' and 'label' included."""
        return {"image": self.image, "label": self.label, **self.fields}


@runtime_checkable
class Source(Protocol):
    """What the executor needs of a seekable format."""

    classes: Sequence[str]           # class names, index = label; empty when unknown

    def __len__(self) -> int: ...

    def locate(self, i: int) -> Location | tuple[Location, ...]:
        """Where sample ``i``'s bytes are. Raises IndexError outside ``range(len(self))``."""

    def parse(self, i: int, raw: Any) -> Record:
        """Interpret the bytes read for sample ``i`` (one buffer, or a tuple matching ``locate``'s tuple).
        Raises CorruptRecordError naming path and offset (or key)."""

    def labels(self) -> np.ndarray:
        """Class label of every sample (int64, -1 = none), for batching labels and `inspect`."""

    def name(self, i: int) -> str:
        """A human-readable name of sample ``i`` (path, path:offset or key) for messages."""


def locate_each(source: Any, indices: Sequence[int]) -> list[Any]:
    """``source.locate(i)`` for each index, or the IngestError or ValueError it raised (so that one sample that
    cannot be located fails alone): in one call where the source has ``locate_batch(indices)``, sample by
    sample where that call raises."""
    batch = getattr(source, "locate_batch", None)
    if batch is not None:
        try:
            return batch(indices)
        except (IngestError, ValueError):
            pass
    return [_or_error(source.locate, i) for i in indices]


def parse_each(source: Any, indices: Sequence[int], raws: Sequence[Any]) -> list[Any]:
    """Sample ``indices[k]`` parsed from ``raws[k]``, for each k: a `Record`, or the error (IngestError or
    ValueError) that parsing it raised. A source with ``parse_batch(indices, raws)`` (same contract) parses the
    batch in one call; otherwise each sample goes through ``parse``."""
    batch = getattr(source, "parse_batch", None)
    if batch is not None:
        return batch(indices, raws)
    return [parse_or_error(source, i, raw) for i, raw in zip(indices, raws)]


def batch_structs(raws: Sequence[Any], dtype: np.dtype, *, at_end: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The first (``at_end``: last) ``dtype.itemsize`` bytes of each buffer of a batch as one numpy record array,
    and every buffer's length: a `parse_batch` reads the batch's fixed-size record heads (or tails) in one
    call. A buffer shorter than that gives a row of zeros; the caller checks the lengths."""
    size = dtype.itemsize
    sizes = np.fromiter(map(len, raws), np.int64, len(raws))
    zeros = bytes(size)
    parts = [zeros if n < size else memoryview(r)[n - size:] if at_end else memoryview(r)[:size]
             for r, n in zip(raws, sizes.tolist())]
    return np.frombuffer(b"".join(parts), dtype), sizes


def parse_or_error(source: Any, i: int, raw: Any) -> Any:
    """``source.parse(i, raw)``, or the IngestError or ValueError it raised."""
    return _or_error(source.parse, i, raw)


def _or_error(call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, or the IngestError or ValueError it raised: what a sample that fails gives."""
    try:
        return call(*args)
    except (IngestError, ValueError) as err:
        return err


class Writer(Protocol):
    """Writes one output shard of a format into ``directory`` (file names start with ``stem``)."""

    def add(self, record: Record) -> None: ...

    def close(self) -> list[str]:
        """Finish the shard; return the names (relative to ``directory``) of every file written."""


def parse_dtype(text: Any) -> np.dtype:
    """A dtype named by a file (an index, a record header): ValueError for anything numpy does not take.
    numpy parses some strings as Python literals and lets their SyntaxError out ("02" for one)."""
    try:
        return np.dtype(text)
    except (TypeError, ValueError, SyntaxError) as err:
        raise ValueError(f"not a dtype: {text!r} ({type(err).__name__}: {err})") from None


def check_index(i: int, n: int) -> int:
    """Validate and normalize a sample index (negative indices count from the end)."""
    if not isinstance(i, (int, np.integer)):
        raise TypeError(f"sample index must be an integer, got {type(i).__name__}")
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError(f"sample index {i} out of range for a source of {n} samples")
    return int(i)


def check_indices(indices: Any, n: int) -> np.ndarray:
    """`check_index` of a batch of sample indices at once: an int64 array, negative entries counted from the
    end. IndexError naming the first index out of range, TypeError for non-integers. A source's batch path
    calls it on every batch in the training process, so its numpy work on the whole batch is done in pieces
    numpy keeps the GIL on (`ingest._numpy`)."""
    idx = np.asarray(indices).reshape(-1)
    if not len(idx):
        return idx.astype(np.int64)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"sample indices must be integers, got {idx.dtype}")
    low, high = extremes(idx)
    if low < -n or high >= n:
        bad = idx[(idx < -n) | (idx >= n)][0]
        raise IndexError(f"sample index {int(bad)} out of range for a source of {n} samples")
    idx = idx.astype(np.int64, copy=False)
    return np.where(idx < 0, idx + n, idx) if low < 0 else idx


def read_location(loc: Location | tuple[Location, ...]) -> Any:
    """Plain (unbatched) read of a location or a tuple of them: bytes, or a tuple of bytes."""
    if isinstance(loc, tuple):
        return tuple(read_location(part) for part in loc)
    if loc.data is not None:
        return bytes(loc.data)
    with open(loc.path, "rb") as f:
        f.seek(loc.offset)
        return f.read() if loc.length is None else f.read(loc.length)


def iter_records(source: Any) -> Iterator[tuple[str, Record]]:
    """Every sample of a source, in order, as ``(name, record)``: what the converter, ``verify`` and
    ``inspect`` walk. Streamed sources are read shard by shard."""
    if getattr(source, "streamed", False):
        for k in range(len(source.shards)):
            yield from source.iter_shard(k, 0)
        return
    for i in range(len(source)):
        yield source.name(i), source.parse(i, read_location(source.locate(i)))


def check_format(source: Any, *, read: Callable[[Any], Any] | None = None) -> None:
    """Conformance check every format's tests run. ``read(location) -> bytes`` reads a location (defaults to a
    plain file read). Raises AssertionError describing the first violation."""
    fields = fields_of(source)
    assert all(isinstance(f, Field) for f in fields.values()), "fields must map names to Field"
    if "image" in fields:
        assert fields["image"].kind in ("image", "pixels"), "the 'image' field must be of kind image or pixels"
    if "label" in fields:
        assert fields["label"].kind == "int", "the 'label' field must be of kind int"
    classes = getattr(source, "classes", None)
    assert classes is not None and isinstance(list(classes), list), "a source must have `classes`"
    if getattr(source, "streamed", False):
        _check_streamed(source, fields)
        return
    n = len(source)
    assert isinstance(n, int) and n >= 0, f"len() must be a non-negative int, got {n!r}"
    labels = source.labels()
    assert isinstance(labels, np.ndarray) and labels.dtype == np.int64, "labels() must be an int64 array"
    assert labels.shape == (n,), f"labels() must have shape ({n},), got {labels.shape}"
    if len(classes) and n:
        assert labels.min() >= -1 and labels.max() < len(classes), "labels must index classes"
    for bad in (n, -n - 1):
        try:
            source.locate(bad)
        except IndexError:
            pass
        else:
            raise AssertionError(f"locate({bad}) must raise IndexError for a source of {n} samples")
    read = read or read_location
    for i in sorted({0, n // 2, n - 1} if n else set()):
        loc = source.locate(i)
        parts = loc if isinstance(loc, tuple) else (loc,)
        assert parts and all(isinstance(p, Location) for p in parts), \
            f"locate({i}) must return a Location or a tuple of them"
        record = source.parse(i, read(loc))
        _check_record(record, fields, f"parse({i})")
        assert record.label == labels[i], f"parse({i}).label {record.label} != labels()[{i}] {labels[i]}"
        assert isinstance(source.name(i), str) and source.name(i), "name() must be a non-empty string"
    picks = sorted({0, n // 2, n - 1} if n else set())
    assert locate_each(source, picks) == [source.locate(i) for i in picks], "locate_batch must give what locate gives"
    raws = [read(source.locate(i)) for i in picks]
    for i, raw, record in zip(picks, raws, parse_each(source, picks, raws)):
        assert _same_record(record, source.parse(i, raw)), f"parse_batch must give what parse({i}) gives"
    import pickle
    clone = pickle.loads(pickle.dumps(source))  # sources cross into worker processes
    if n:
        again = clone.parse(n - 1, read(clone.locate(n - 1)))
        assert again.label == labels[n - 1], "a pickled source must read the same samples"


def _check_streamed(source: Any, fields: dict[str, Field]) -> None:
    shards = source.shards
    assert len(shards) > 0, "a streamed source must have at least one shard"
    items = list(source.iter_shard(0, 0))
    for name, record in items[:3]:
        assert isinstance(name, str) and name, "iter_shard must yield (name, Record)"
        _check_record(record, fields, name)
    if len(items) > 1:
        skipped = list(source.iter_shard(0, 1))
        assert [n for n, _ in skipped] == [n for n, _ in items[1:]], "iter_shard(k, skip) must skip exactly"


def _same_record(a: Any, b: Any) -> bool:
    """Whether two parsed samples hold the same values (buffers compared by their bytes)."""
    def same(x: Any, y: Any) -> bool:
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            x, y = np.asarray(x), np.asarray(y)
            return x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind in "fc")
        if isinstance(x, (bytes, bytearray, memoryview)) or isinstance(y, (bytes, bytearray, memoryview)):
            return bytes(x) == bytes(y)
        return type(x) is type(y) and x == y

    if not isinstance(a, Record) or not isinstance(b, Record) or set(a.fields) != set(b.fields):
        return False
    if (a.image is None) != (b.image is None) or a.label != b.label:
        return False
    image = a.image is None or bytes(memoryview(a.image).cast("B")) == bytes(memoryview(b.image).cast("B"))
    return image and all(same(a.fields[k], b.fields[k]) for k in a.fields)


def _check_record(record: Any, fields: dict[str, Field], where: str) -> None:
    assert isinstance(record, Record), f"{where} must return a Record"
    if "image" in fields:
        assert record.image is not None and len(memoryview(record.image).cast("B")) > 0, f"{where}: empty image"
    extra = set(fields) - {"image", "label"}
    assert set(record.fields) == extra, \
        f"{where}: fields {sorted(record.fields)} differ from the declared {sorted(extra)}"
