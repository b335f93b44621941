"""Raw tensor shards: decoded pixels (or any numeric arrays) stored back to back, aligned for direct I/O, and
read straight into GPU memory with KvikIO (GPUDirect Storage where the host has it) in a few large reads,
skipping decode. JPEG bitstreams must visit the host for nvJPEG anyway; raw pixels need not.

**Files.** `RawWriter` writes a shard as two files:

- ``<stem>.raw``: the samples, back to back. Each sample starts at a multiple of ``align`` (4096 by default,
  the block of O_DIRECT and GDS); its stored fields follow in field order (``image`` first), each at a
  multiple of `FIELD_ALIGN` bytes inside the sample; the file is zero-padded to a multiple of ``align``.
  256x256x3 uint8 samples (48 blocks each) lie back to back with no padding at all.
- ``<stem>.raw.json``: the shard's index. The data file is the index's name less ``.json``, so the two can
  be renamed together (the converter writes them under a temporary stem).

A dataset is a directory of shards. Its shards, in order: those listed by ``ingest-raw.json``
(`formats.RAW_INDEX`: ``{"format": "ingest-raw", "version": 1, "shards": ["a.raw.json", ...]}``, written by
`write_dataset_index`), else the stems of the converter's ``manifest.json``, else every ``*.raw.json`` in
name order. `RawSource` also opens one shard (its ``.raw`` or ``.raw.json``), ``ingest-raw.json`` itself,
or a list of shard paths.

**Index.** JSON; per-sample numbers are numpy arrays kept compact as base64 of their little-endian bytes in
the smallest integer type that holds them (``{"dtype": "<i2", "shape": [n], "base64": "..."}``)::

    {"format": "ingest-raw", "version": 1, "count": n, "align": 4096, "file_size": <bytes of the .raw>,
     "classes": [...],
     "fields": [{"name": "image", "kind": "pixels", "dtype": "uint8", "shape": [256, 256, 3]},
                {"name": "label", "kind": "int"}],
     "stride": 196608, "offsets": {"image": 0},
     "arrays": {"label": <array [n]>}}

When every sample of a shard has the same shapes (the fast path) the layout is fixed: field ``f`` of
sample ``i`` is at byte ``i * stride + offsets[f]``, and only the index columns are stored per sample.
Otherwise ``stride`` is null and ``arrays`` holds ``<f>.offset`` (absolute byte offsets, [n]) for every
stored field and ``<f>.shape`` ([n, ndim]) for each field whose ``shape`` is null (it varies).

**Field kinds.** Stored in the shard: ``pixels`` (uint8 [H, W, C]; an encoded ``image`` field is decoded on
the way in and becomes ``pixels``), ``array`` (bool/int/uint/float dtypes of `DTYPES`, a fixed number of
dims), ``ints`` (int64 [L]), ``floats`` (float32 [L]), ``text`` (UTF-8) and ``bytes``. Index columns: ``int``
(the label among them) and ``float``.

**Reading.** `RawSource` is a `formats.Source` (``locate``: the byte span of a sample; ``parse``: numpy views
of it) for the CPU path, `check_format` and the converter. Its fast path, :meth:`RawSource.read_batch`,
reads one fixed-shape field of a batch straight into a preallocated ``[B, *shape]`` tensor, on the GPU with
KvikIO (see `ingest.io.ByteReader.read_rows`). Opening checks every index entry against the shard's size:
a range past the end of a shard raises CorruptRecordError naming the file, the sample and the offset before
anything is read, so no read is ever sized by an unchecked number.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
from array import array
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import ConfigError, CorruptRecordError, SourceError
from .base import DEFAULT_FIELDS, Field, Location, Record, check_index

FORMAT = "ingest-raw"
VERSION = 1
DEFAULT_ALIGN = 4096
#: Alignment of each field inside a sample (at least any element size, a cache line).
FIELD_ALIGN = 64
DATA_SUFFIX = ".raw"
INDEX_SUFFIX = ".raw.json"
DATASET_INDEX = "ingest-raw.json"  # = formats.RAW_INDEX
MANIFEST = "manifest.json"  # = formats.MANIFEST

#: Element types a stored field may have (numpy names; stored little-endian) and their torch dtypes.
DTYPES = {"bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16,
          "int32": torch.int32, "int64": torch.int64, "uint16": torch.uint16, "uint32": torch.uint32,
          "uint64": torch.uint64, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}
#: Kinds stored in the shard -> their dtype (None: the field's own); kinds kept as index columns -> dtype.
STORED = {"pixels": "uint8", "array": None, "ints": "int64", "floats": "float32", "text": "uint8", "bytes": "uint8"}
COLUMNS = {"int": np.int64, "float": np.float64}


def _align_up(n: int, a: int) -> int:
    return -(-n // a) * a


# ==================================================================================================
# Writing


class RawWriter:
    """Writes one raw shard, ``<stem>.raw`` + ``<stem>.raw.json``, into ``directory`` (see the module doc).

    ``fields``: the declared fields of the samples (``image``/``pixels`` first in the file whatever the order
    given). ``align``: the alignment of every sample's start (a power of two, 1 to 1 MiB). ``classes``: class
    names, kept in the index. :meth:`add` checks a sample against its fields before writing any byte of it,
    so a rejected sample (CorruptRecordError naming the shard, the sample and the field) leaves the shard
    as it was. The same records give the same bytes.
    """

    def __init__(self, directory: str | os.PathLike, stem: str, fields: dict[str, Field] | None = None, *,
                 align: int = DEFAULT_ALIGN, classes: Sequence[str] = ()):
        if isinstance(align, bool) or not isinstance(align, int) or not 1 <= align <= 1 << 20 \
                or align & (align - 1):
            raise ConfigError(f"`align` must be a power of two from 1 to 1048576, got {align!r}")
        self.align = align
        self.classes = [str(c) for c in classes]
        fields = dict(DEFAULT_FIELDS if fields is None else fields)
        for name, f in fields.items():
            if f.kind == "array" and f.dtype is not None and f.dtype not in DTYPES:
                raise ConfigError(f"field {name!r}: dtype {f.dtype!r} cannot be stored raw. "
                                  f"Available: {', '.join(DTYPES)}")
        order = sorted(fields, key=lambda k: k != "image")  # stable: 'image' first, the rest as declared
        self._fields = {k: fields[k] for k in order}
        self._stored = [k for k, f in self._fields.items() if f.kind in STORED or f.kind == "image"]
        if not self._stored:
            raise ConfigError("a raw shard needs at least one field stored in it (pixels, array, ints, floats, "
                              f"text, bytes or an encoded image); got {sorted(fields)}")
        self._dtype = {k: STORED.get(self._fields[k].kind) or self._fields[k].dtype for k in self._stored}
        self._ndim: dict[str, int | None] = {
            k: len(f.shape) if f.shape is not None else 3 if f.kind in ("image", "pixels") else None
            for k, f in ((k, self._fields[k]) for k in self._stored)}
        self._offsets = {k: array("q") for k in self._stored}
        self._shapes = {k: array("q") for k in self._stored}
        self._columns = {k: [] for k, f in self._fields.items() if f.kind in COLUMNS}
        self.stem = stem
        self.path = os.path.join(os.fspath(directory), stem + DATA_SUFFIX)
        self._file = open(self.path, "wb")
        self._end = 0        # bytes written so far
        self._count = 0
        self._decoder = None

    def add(self, record: Record) -> None:
        """Append one sample (its ``image``, ``label`` and every other declared field)."""
        values = [(k, self._value(k, record)) for k in self._stored]
        columns = [(k, self._column(k, record)) for k in self._columns]
        start = pos = _align_up(self._end, self.align)
        for k, arr in values:
            pos = _align_up(pos, FIELD_ALIGN)
            self._offsets[k].append(pos)
            self._shapes[k].extend(arr.shape)
            self._file.write(bytes(pos - self._end))
            self._file.write(memoryview(arr).cast("B"))
            self._end = pos = pos + arr.nbytes
        assert start % self.align == 0
        for k, v in columns:
            self._columns[k].append(v)
        self._count += 1

    def close(self) -> list[str]:
        """Pad the data file to the alignment, write the index; returns both file names."""
        if self._file.closed:
            raise ValueError("RawWriter is closed")
        size = _align_up(self._end, self.align)
        self._file.write(bytes(size - self._end))
        self._file.close()
        index = self._index(size)
        with open(self.path + ".json", "w") as f:
            json.dump(index, f, separators=(",", ":"))
            f.write("\n")
        return [self.stem + DATA_SUFFIX, self.stem + INDEX_SUFFIX]

    def __enter__(self) -> "RawWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self._file.close()

    # -- one sample --------------------------------------------------------------------------------
    def _bad(self, name: str, msg: str) -> CorruptRecordError:
        return CorruptRecordError(f"field {name!r}: {msg}", path=self.path, index=self._count)

    def _value(self, name: str, record: Record) -> np.ndarray:
        field = self._fields[name]
        try:
            value = record.get(name)
        except KeyError:
            raise self._bad(name, "missing from the record") from None
        kind = field.kind
        try:
            if kind == "image" and not isinstance(value, np.ndarray) and not torch.is_tensor(value):
                value = self._decode(value)
            if kind == "text":
                if not isinstance(value, str):
                    raise self._bad(name, f"a text field needs a str, got {type(value).__name__}")
                arr = np.frombuffer(value.encode("utf-8"), np.uint8)
            elif kind == "bytes":
                arr = np.frombuffer(bytes(value), np.uint8)
            elif kind in ("ints", "floats"):
                arr = np.asarray(value, dtype=STORED[kind]).reshape(-1)
            else:
                arr = np.asarray(value.cpu() if torch.is_tensor(value) else value)
        except (TypeError, ValueError, OverflowError) as err:
            raise self._bad(name, f"cannot store a {type(value).__name__} as {kind}: {err}") from err
        if kind in ("image", "pixels") and arr.ndim == 2:
            arr = arr[:, :, None]
        return self._checked(name, arr)

    def _checked(self, name: str, arr: np.ndarray) -> np.ndarray:
        field, kind = self._fields[name], self._fields[name].kind
        if arr.dtype.name not in DTYPES:
            raise self._bad(name, f"dtype {arr.dtype} cannot be stored raw. Available: {', '.join(DTYPES)}")
        want = self._dtype[name]
        if want is None:
            self._dtype[name] = want = arr.dtype.name
        if arr.dtype.name != want:
            raise self._bad(name, f"dtype {arr.dtype.name}, but the field holds {want}")
        if kind in ("image", "pixels") and arr.ndim != 3:
            raise self._bad(name, f"pixels must be [H, W, C] (or [H, W]), got shape {arr.shape}")
        if field.shape is not None and arr.shape != tuple(field.shape):
            raise self._bad(name, f"shape {arr.shape}, but the field is declared {tuple(field.shape)}")
        if self._ndim[name] is None:
            self._ndim[name] = arr.ndim
        if arr.ndim != self._ndim[name]:
            raise self._bad(name, f"{arr.ndim} dims, but earlier samples have {self._ndim[name]}")
        return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))

    def _column(self, name: str, record: Record) -> Any:
        try:
            value = record.get(name)
            value = int(value) if self._fields[name].kind == "int" else float(value)
        except KeyError:
            raise self._bad(name, "missing from the record") from None
        except (TypeError, ValueError, OverflowError) as err:
            raise self._bad(name, f"not a{'n int' if self._fields[name].kind == 'int' else ' float'}: {err}") \
                from err
        if name == "label" and value < -1:
            raise self._bad(name, f"a label must be >= -1 (-1: none), got {value}")
        if isinstance(value, int) and not -2**63 <= value < 2**63:
            raise self._bad(name, f"{value} does not fit in int64")
        return value

    def _decode(self, data: Any) -> np.ndarray:
        if self._decoder is None:
            from ..ops.decode import CpuDecoder
            self._decoder = CpuDecoder(threads=1)
        return self._decoder.decode(data, f"{self.path} [sample {self._count}]")

    # -- the index ---------------------------------------------------------------------------------
    def _index(self, size: int) -> dict[str, Any]:
        n = self._count
        offsets = {k: np.frombuffer(self._offsets[k], np.int64) for k in self._stored}
        shapes = {k: np.frombuffer(self._shapes[k], np.int64).reshape(n, self._ndim[k] or 0)
                  for k in self._stored}
        fixed = {k: bool(n) and (shapes[k] == shapes[k][0]).all() for k in self._stored}
        fields = []
        for k, f in self._fields.items():
            entry: dict[str, Any] = {"name": k, "kind": "pixels" if f.kind == "image" else f.kind}
            if k in offsets:
                entry["dtype"] = self._dtype[k] or "uint8"
                shape = shapes[k][0].tolist() if fixed[k] else (list(f.shape) if f.shape is not None else None)
                entry["shape"] = shape
            fields.append(entry)
        arrays = {k: _encode_array(np.asarray(v, COLUMNS[self._fields[k].kind]))
                  for k, v in self._columns.items()}
        first = offsets[self._stored[0]]
        stride = int(first[1] - first[0]) if n > 1 else _align_up(self._end, self.align)
        if n and all(fixed.values()) and all((offsets[k] == np.arange(n) * stride + offsets[k][0]).all()
                                              for k in self._stored):
            layout = {"stride": stride, "offsets": {k: int(offsets[k][0]) for k in self._stored}}
        else:
            layout = {"stride": None}
            for k in self._stored:
                arrays[f"{k}.offset"] = _encode_array(offsets[k])
                if not fixed[k]:
                    arrays[f"{k}.shape"] = _encode_array(shapes[k])
        return {"format": FORMAT, "version": VERSION, "count": n, "align": self.align, "file_size": size,
                "classes": self.classes, "fields": fields, **layout, "arrays": arrays}


def _encode_array(a: np.ndarray) -> dict[str, Any]:
    """A numpy array as JSON: integers in the smallest signed type that holds them, little-endian, base64."""
    if a.dtype.kind in "iu":
        lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
        a = a.astype(next(t for t in ("<i1", "<i2", "<i4", "<i8")
                          if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max))
    else:
        a = a.astype(a.dtype.newbyteorder("<"))
    return {"dtype": a.dtype.str, "shape": list(a.shape), "base64": base64.b64encode(a.tobytes()).decode()}


def write_dataset_index(directory: str | os.PathLike, shards: Sequence[str] | None = None, *,
                        classes: Sequence[str] | None = None) -> str:
    """Write ``ingest-raw.json`` into ``directory``, listing the shard index files ``shards`` (names relative
    to it, in order; default: every ``*.raw.json`` there, sorted) and optionally ``classes``; returns its path.
    Written through a temporary file and a rename."""
    directory = os.fspath(directory)
    if shards is None:
        shards = sorted(e.name for e in os.scandir(directory) if e.is_file() and e.name.endswith(INDEX_SUFFIX))
    shards = [s + ".json" if s.endswith(DATA_SUFFIX) else s for s in shards]
    data: dict[str, Any] = {"format": FORMAT, "version": VERSION, "shards": list(shards)}
    if classes is not None:
        data["classes"] = list(classes)
    path = os.path.join(directory, DATASET_INDEX)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    return path


# ==================================================================================================
# Reading


class RawSource:
    """A raw-shard dataset (see the module doc for the paths it opens).

    ``fields``: ``image`` = ``Field("pixels", (H, W, C) or None, "uint8")`` where the shards hold pixels,
    ``label`` = ``Field("int")``, and the other fields as written. ``fixed_shape``: the shape of ``image``
    when every sample has the same one (the fast path), else None.

    CPU path: ``locate(i)`` is the sample's byte span, ``parse(i, raw)`` returns numpy views of it
    (``image`` [H, W, C] uint8, arrays, str, bytes; columns from the index). Fast path:
    ``read_batch(indices, out)`` reads a fixed-shape field of a batch straight into ``out``.

    Opening reads every shard index and checks it against its data file (CorruptRecordError naming the file,
    sample and offset for anything past the end, misaligned or inconsistent; SourceError for shards that
    disagree on their fields or classes). Pickles as its index (file handles are per process).
    """

    def __init__(self, path: str | os.PathLike | Sequence[str | os.PathLike]):
        from ..io import file_handles
        index_paths, classes = _shard_indexes(path)
        shards, count = [], 0
        for p in index_paths:
            shard = _Shard(p, count)
            shards.append(shard)
            count += shard.count
        if not shards:
            raise SourceError(f"no raw shards in {os.fspath(path)!r}" if isinstance(path, (str, os.PathLike))
                              else "no raw shards given")
        self._merge(shards, classes)
        self._handles = file_handles()

    def _merge(self, shards: list["_Shard"], classes: list[str] | None) -> None:
        full = [s for s in shards if s.count] or shards[:1]  # empty shards cannot tell dtypes and dims
        first = full[0]
        for s in shards:
            mine, theirs = s.layout(), first.layout()
            if not s.count:
                mine, theirs = [x[:2] for x in mine], [x[:2] for x in theirs]
            if mine != theirs:
                raise SourceError(f"shard {s.index_path} has fields {mine} but {first.index_path} has "
                                  f"{theirs}: one dataset needs one set of fields", path=s.index_path)
        if classes is None:
            named = [s for s in shards if s.classes]
            for s in named[1:]:
                if s.classes != named[0].classes:
                    raise SourceError(f"shards {named[0].index_path} and {s.index_path} name different classes",
                                      path=s.index_path)
            classes = named[0].classes if named else []
        self.classes = list(classes)
        self.paths = [s.data_path for s in shards]
        self._count = sum(s.count for s in shards)
        self._file = np.concatenate([np.full(s.count, k, np.int32) for k, s in enumerate(shards)])
        self._offsets = {k: np.concatenate([s.offsets[k] for s in shards]) for k in first.stored}
        self._shapes: dict[str, tuple[int, ...] | np.ndarray] = {}
        self._nbytes: dict[str, int | np.ndarray] = {}
        for k in first.stored:
            shapes = {s.shapes[k] if isinstance(s.shapes[k], tuple) else None for s in full}
            if len(shapes) == 1 and None not in shapes:
                self._shapes[k] = shapes.pop()
                self._nbytes[k] = math.prod(self._shapes[k]) * np.dtype(first.dtypes[k]).itemsize
            else:
                self._shapes[k] = np.concatenate([s.shape_array(k) for s in full])
                self._nbytes[k] = np.concatenate([s.nbytes_array(k) for s in full])
        self._columns = {k: np.concatenate([s.columns[k] for s in shards]) for k in first.columns}
        self._labels = self._columns.pop("label", None)
        if self._labels is None:
            self._labels = np.full(self._count, -1, np.int64)
        bad = np.flatnonzero((self._labels < -1) | (self._labels >= len(self.classes) if self.classes else False))
        if len(bad):
            j = int(bad[0])
            raise CorruptRecordError(f"label {int(self._labels[j])} is outside -1..{len(self.classes) - 1} "
                                     f"({len(self.classes)} classes)", path=self.paths[self._file[j]], index=j)
        self._stored = first.stored
        self._dtypes = first.dtypes
        self._kinds = first.kinds
        self.fields = {k: _field(kind, self._shapes.get(k), self._dtypes.get(k)) for k, kind in first.kinds.items()}
        image = self.fields.get("image")
        self.fixed_shape = image.shape if image is not None and image.kind == "pixels" else None
        ends = [self._offsets[k] + self._nbytes[k] for k in self._stored]
        self._start = self._offsets[self._stored[0]]
        self._end = np.maximum.reduce(ends) if len(ends) > 1 else ends[0]

    # -- the Source contract ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._count

    def locate(self, i: int) -> Location:
        i = check_index(i, self._count)
        start = int(self._start[i])
        return Location(self.paths[self._file[i]], start, int(self._end[i]) - start)

    def parse(self, i: int, raw: Any) -> Record:
        i = check_index(i, self._count)
        buf = raw.reshape(-1).view(np.uint8) if isinstance(raw, np.ndarray) else np.frombuffer(raw, np.uint8)
        start = int(self._start[i])
        if buf.nbytes != int(self._end[i]) - start:
            raise CorruptRecordError(f"expected {int(self._end[i]) - start} bytes, got {buf.nbytes}",
                                     path=self.paths[self._file[i]], index=i, offset=start)
        if not buf.flags.writeable:
            buf = buf.copy()  # tensors made from it must be writable
        values = {k: self._field(k, i, buf, start) for k in self._stored}
        values.update({k: col[i].item() for k, col in self._columns.items()})
        image = values.pop("image", None)
        values.pop("label", None)
        return Record(image, int(self._labels[i]), values)

    def _field(self, name: str, i: int, buf: np.ndarray, start: int) -> Any:
        at = int(self._offsets[name][i]) - start
        shape = self.shape(i, name)
        data = buf[at:at + self._nbytes_of(name, i)]
        kind = self._kinds[name]
        if kind == "text":
            try:
                return data.tobytes().decode("utf-8")
            except UnicodeDecodeError as err:
                raise CorruptRecordError(f"field {name!r} is not UTF-8 text: {err}", path=self.paths[self._file[i]],
                                         index=i, offset=at + start) from err
        if kind == "bytes":
            return data.tobytes()
        return data.view(np.dtype(self._dtypes[name]).newbyteorder("<")).reshape(shape)

    def labels(self) -> np.ndarray:
        return self._labels

    def name(self, i: int) -> str:
        i = check_index(i, self._count)
        return f"{self.paths[self._file[i]]}:{int(self._start[i])}"

    # -- shapes and the fast path ---------------------------------------------------------------------
    def shape(self, i: int, field: str = "image") -> tuple[int, ...]:
        """The shape of ``field`` of sample ``i``."""
        shapes = self._stored_field(field)
        return shapes if isinstance(shapes, tuple) else tuple(shapes[check_index(i, self._count)].tolist())

    def _nbytes_of(self, name: str, i: int) -> int:
        nb = self._nbytes[name]
        return nb if isinstance(nb, int) else int(nb[i])

    def _stored_field(self, field: str) -> tuple[int, ...] | np.ndarray:
        if field not in self._shapes:
            raise ConfigError(f"Unknown stored field {field!r}. Available: {', '.join(self._stored)}")
        return self._shapes[field]

    def batch_buffer(self, n: int, device: str | torch.device = "cpu", *, field: str = "image",
                     pin_memory: bool = False) -> torch.Tensor:
        """An empty ``[n, *shape]`` tensor of ``field``'s dtype on ``device``: an ``out`` for :meth:`read_batch`."""
        shape = self._fixed(field)
        return torch.empty((n, *shape), dtype=DTYPES[self._dtypes[field]], device=device, pin_memory=pin_memory)

    def _fixed(self, field: str) -> tuple[int, ...]:
        shape = self._stored_field(field)
        if not isinstance(shape, tuple):
            raise ConfigError(f"field {field!r} has samples of different shapes; read_batch needs one fixed "
                              "shape (read them with locate/parse, or convert with one pixel size)")
        return shape

    def read_batch(self, indices: Sequence[int] | np.ndarray, out: torch.Tensor, reader=None, *,
                   field: str = "image") -> torch.Tensor:
        """Read ``field`` of the samples ``indices`` into ``out[k]`` (a contiguous ``[B, *shape]`` tensor of the
        field's dtype, CPU or CUDA, e.g. from :meth:`batch_buffer`) and return ``out``.

        ``reader``: the `ingest.io.ByteReader` to read with (its ``device_path`` picks KvikIO or preadv + one
        copy; its threads are KvikIO's); default: one per process, made on first use from `ingest.defaults`.
        Samples that are neighbours in a shard are read together; files stay open per process. A CUDA ``out``
        must not be in use by queued GPU work (see `ByteReader.read_rows`); the reads are complete on return."""
        shape = self._fixed(field)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < -self._count or idx.max() >= self._count):
            bad = idx[(idx < -self._count) | (idx >= self._count)][0]
            raise IndexError(f"sample index {int(bad)} out of range for a source of {self._count} samples")
        idx = np.where(idx < 0, idx + self._count, idx)
        want = (len(idx), *shape)
        dtype = DTYPES[self._dtypes[field]]
        if tuple(out.shape) != want or out.dtype != dtype or not out.is_contiguous():
            raise ConfigError(f"`out` must be a contiguous {list(want)} {dtype} tensor, got "
                              f"{list(out.shape)} {out.dtype}{'' if out.is_contiguous() else ' (not contiguous)'}")
        if reader is None:
            from ..io import ByteReader
            reader = self._handles.get("reader", ByteReader)
        reader.read_rows(self.paths, self._file[idx], self._offsets[field][idx], out, handles=self._handles)
        return out

    def close(self) -> None:
        """Close the files (and the default reader) this process opened."""
        self._handles.close()

    def __repr__(self) -> str:
        shape = self.fixed_shape or "ragged"
        return f"RawSource({self._count} samples in {len(self.paths)} shards, image {shape})"


def _field(kind: str, shape: Any, dtype: str | None) -> Field:
    """The declared `Field` of a stored field or column: shape where fixed (and meaningful), dtype of arrays."""
    fixed = isinstance(shape, tuple) and kind in ("pixels", "array", "ints", "floats")
    return Field(kind, shape if fixed else None, dtype if kind in ("pixels", "array") else None)


# -- opening ------------------------------------------------------------------------------------------


def _shard_indexes(path: Any) -> tuple[list[str], list[str] | None]:
    """The shard index files of a dataset path, in order, and the classes its dataset index names."""
    if not isinstance(path, (str, os.PathLike)):
        paths = [_index_of(os.fspath(p)) for p in path]
        return paths, None
    path = os.fspath(path)
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, DATASET_INDEX)):
            return _dataset_index(os.path.join(path, DATASET_INDEX))
        stems = _manifest_stems(path)
        if stems is not None:
            return [_index_of(os.path.join(path, s + INDEX_SUFFIX)) for s in stems], None
        return sorted(os.path.join(path, e.name) for e in os.scandir(path)
                      if e.is_file() and e.name.endswith(INDEX_SUFFIX)), None
    if os.path.basename(path) == DATASET_INDEX:
        return _dataset_index(path)
    return [_index_of(path)], None


def _index_of(path: str) -> str:
    """The index file of a shard given by its data or index file."""
    if path.endswith(DATA_SUFFIX):
        path += ".json"
    elif not path.endswith(INDEX_SUFFIX):
        raise SourceError(f"{path!r} is not a raw shard (expected <stem>{DATA_SUFFIX} or <stem>{INDEX_SUFFIX})",
                          path=path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"raw shard index {path!r} does not exist")
    return path


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        raise CorruptRecordError(f"not valid JSON: {err}", path=path) from err
    except OSError as err:
        raise SourceError(f"cannot read {path!r}: {err.strerror or err}", path=path) from err


def _dataset_index(path: str) -> tuple[list[str], list[str] | None]:
    data = _read_json(path)
    shards = data.get("shards") if isinstance(data, dict) else None
    if not (isinstance(data, dict) and data.get("format") == FORMAT and isinstance(shards, list)
            and all(isinstance(s, str) and s for s in shards)):
        raise CorruptRecordError(f"not a raw dataset index (expected {{\"format\": \"{FORMAT}\", \"shards\": "
                                 "[...]}})", path=path)
    classes = data.get("classes")
    if classes is not None and not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
        raise CorruptRecordError("`classes` must be a list of strings", path=path)
    root = os.path.dirname(path)
    for s in shards:
        if os.path.isabs(s) or ".." in s.replace("\\", "/").split("/"):
            raise CorruptRecordError(f"shard {s!r} is outside the dataset directory", path=path)
    return [_index_of(os.path.join(root, s)) for s in shards], classes


def _manifest_stems(directory: str) -> list[str] | None:
    """The shard stems of the converter's manifest, when it is there and names the raw format."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        return None
    data = _read_json(path)
    if not isinstance(data, dict) or data.get("format") != "raw":
        return None
    try:
        return [str(s["stem"]) for s in data["shards"]]
    except (KeyError, TypeError) as err:
        raise CorruptRecordError(f"manifest has no list of shards with stems: {err!r}", path=path) from err


class _Shard:
    """One shard's index, checked against its data file. ``first``: the dataset index of its first sample."""

    def __init__(self, index_path: str, first: int):
        self.index_path = index_path
        self.data_path = index_path[:-len(".json")]
        self.first = first
        meta = _read_json(index_path)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise self._bad(f"not a raw shard index (no \"format\": \"{FORMAT}\")")
        if meta.get("version") != VERSION:
            raise self._bad(f"index version {meta.get('version')!r} is not supported (this reader reads {VERSION})")
        self.count = self._int(meta, "count", 0)
        self.align = self._int(meta, "align", 1)
        if self.align & (self.align - 1):
            raise self._bad(f"`align` {self.align} is not a power of two")
        classes = meta.get("classes", [])
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise self._bad("`classes` must be a list of strings")
        self.classes = classes
        self._parse_fields(meta.get("fields"))
        arrays = meta.get("arrays")
        if not isinstance(arrays, dict):
            raise self._bad("`arrays` must be an object")
        try:
            self.size = os.stat(self.data_path).st_size
        except OSError as err:
            raise SourceError(f"cannot open the data file of {index_path!r}: {err.strerror or err}",
                              path=self.data_path) from err
        self._layout(meta, arrays)
        self.columns = {k: self._array(arrays, k, (self.count,), "iu" if kind == "int" else "iuf")
                        .astype(COLUMNS[kind]) for k, kind in self.kinds.items() if kind in COLUMNS}
        file_size = self._int(meta, "file_size", 0)
        if file_size != self.size:
            raise CorruptRecordError(f"the shard is {self.size} bytes but its index says {file_size} (truncated or "
                                     "rewritten?)", path=self.data_path, offset=min(self.size, file_size))

    def _bad(self, msg: str) -> CorruptRecordError:
        return CorruptRecordError(msg, path=self.index_path)

    def _int(self, meta: dict, key: str, minimum: int) -> int:
        v = meta.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self._bad(f"`{key}` must be an integer >= {minimum}, got {v!r}")
        return v

    def _parse_fields(self, fields: Any) -> None:
        if not isinstance(fields, list) or not all(isinstance(f, dict) for f in fields):
            raise self._bad("`fields` must be a list of objects")
        self.kinds: dict[str, str] = {}
        self.dtypes: dict[str, str] = {}
        self.declared: dict[str, tuple[int, ...] | None] = {}
        for f in fields:
            name, kind = f.get("name"), f.get("kind")
            if not isinstance(name, str) or not name or name in self.kinds:
                raise self._bad(f"field name {name!r} is empty, not a string or repeated")
            if not isinstance(kind, str) or kind not in STORED and kind not in COLUMNS:
                raise self._bad(f"field {name!r} has kind {kind!r}. Available: {', '.join([*STORED, *COLUMNS])}")
            if name == "image" and kind != "pixels" or name == "label" and kind != "int":
                raise self._bad(f"field {name!r} must be of kind {'pixels' if name == 'image' else 'int'}, got {kind!r}")
            self.kinds[name] = kind
            if kind in COLUMNS:
                continue
            dtype, shape = f.get("dtype"), f.get("shape")
            if not isinstance(dtype, str) or dtype not in DTYPES or STORED[kind] not in (None, dtype):
                raise self._bad(f"field {name!r} has dtype {dtype!r}; a {kind} field holds "
                                f"{STORED[kind] or 'one of ' + ', '.join(DTYPES)}")
            if shape is not None and not (isinstance(shape, list) and all(
                    isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
                raise self._bad(f"field {name!r} has shape {shape!r}; expected a list of integers >= 0 or null")
            if kind == "pixels" and shape is not None and len(shape) != 3:
                raise self._bad(f"field {name!r}: pixels are [H, W, C], got shape {shape}")
            self.dtypes[name] = dtype
            self.declared[name] = None if shape is None else tuple(shape)
        self.stored = [k for k in self.kinds if k in self.declared]
        if not self.stored:
            raise self._bad("no stored field (pixels, array, ints, floats, text or bytes)")

    def layout(self) -> list[tuple[str, str, str | None, int | None]]:
        """What other shards of the dataset must agree with: each field's name, kind, dtype and number of
        dims (of which an empty shard can only tell the first two)."""
        def ndim(k: str) -> int | None:
            s = self.shapes.get(k)
            return None if s is None else len(s) if isinstance(s, tuple) else s.shape[1]
        return [(k, kind, self.dtypes.get(k), ndim(k)) for k, kind in self.kinds.items()]

    def _array(self, arrays: dict, key: str, shape: tuple[int, ...], kinds: str) -> np.ndarray:
        entry = arrays.get(key)
        if not isinstance(entry, dict):
            raise self._bad(f"array {key!r} is missing")
        try:
            if not isinstance(entry.get("dtype"), str):
                raise TypeError
            dtype = np.dtype(entry["dtype"])
        except (TypeError, ValueError):
            raise self._bad(f"array {key!r} has an unknown dtype {entry.get('dtype')!r}") from None
        if dtype.kind not in kinds or dtype.byteorder == ">" or entry.get("shape") != list(shape):
            raise self._bad(f"array {key!r} must be {list(shape)} of a little-endian kind {kinds!r} dtype, got "
                            f"{entry.get('shape')!r} {dtype.str}")
        try:
            data = base64.b64decode(entry.get("base64", ""), validate=True)
        except (binascii.Error, TypeError, ValueError) as err:
            raise self._bad(f"array {key!r} is not valid base64: {err}") from err
        if len(data) != math.prod(shape) * dtype.itemsize:
            raise self._bad(f"array {key!r} holds {len(data)} bytes; {list(shape)} {dtype.str} needs "
                            f"{math.prod(shape) * dtype.itemsize}")
        return np.frombuffer(data, dtype).reshape(shape)

    def _layout(self, meta: dict, arrays: dict) -> None:
        """Offsets and shapes of every stored field, checked against the data file."""
        n, itemsize = self.count, {k: np.dtype(self.dtypes[k]).itemsize for k in self.stored}
        self.shapes: dict[str, tuple[int, ...] | np.ndarray] = {}
        self.offsets: dict[str, np.ndarray] = {}
        stride = meta.get("stride")
        if stride is not None:
            stride = self._int(meta, "stride", 1)
            offsets = meta.get("offsets")
            if not isinstance(offsets, dict) or set(offsets) != set(self.stored) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in offsets.values()):
                raise self._bad(f"`offsets` must give a byte offset >= 0 for each of {self.stored}")
            if stride % self.align or offsets[self.stored[0]] % self.align:
                raise self._bad(f"samples must start at multiples of `align` {self.align}: stride {stride}, "
                                f"offset {offsets[self.stored[0]]}")
            for k in self.stored:
                if self.declared[k] is None:
                    raise self._bad(f"field {k!r} has no fixed shape, which a fixed layout (`stride`) needs")
                nbytes = math.prod(self.declared[k]) * itemsize[k]
                last_ok = (self.size - offsets[k] - nbytes) // stride  # samples 0..last_ok end inside the file
                if n and last_ok < n - 1:
                    j = max(last_ok + 1, 0)
                    self._past_end(k, j, j * stride + offsets[k], nbytes)
                self.offsets[k] = np.arange(n, dtype=np.int64) * stride + offsets[k]
                self.shapes[k] = self.declared[k]
            return
        for k in self.stored:
            off = self._array(arrays, f"{k}.offset", (n,), "iu").astype(np.int64)
            if self.declared[k] is not None:
                shape = self.declared[k]
                nbytes = np.full(n, math.prod(shape) * itemsize[k], np.int64)
            else:
                ndim = self._ragged_ndim(arrays, k)
                shape = self._array(arrays, f"{k}.shape", (n, ndim), "iu").astype(np.int64)
                approx = np.prod(shape.astype(np.float64), axis=1) * itemsize[k]  # no int64 overflow
                bad = np.flatnonzero((shape < 0).any(axis=1) | (approx > self.size))
                if len(bad):
                    j = int(bad[0])
                    raise CorruptRecordError(f"field {k!r} has shape {shape[j].tolist()}, more than the file holds",
                                             path=self.data_path, index=self.first + j, offset=int(off[j]))
                nbytes = np.prod(shape, axis=1) * itemsize[k]
            bad = np.flatnonzero((off < 0) | (off > self.size - nbytes))
            if len(bad):
                j = int(bad[0])
                self._past_end(k, j, int(off[j]), int(nbytes[j]))
            self.offsets[k], self.shapes[k] = off, shape
        starts = self.offsets[self.stored[0]]
        misaligned = np.flatnonzero(starts % self.align)
        if len(misaligned):
            j = int(misaligned[0])
            raise CorruptRecordError(f"sample starts at byte {int(starts[j])}, not a multiple of `align` "
                                     f"{self.align}", path=self.data_path, index=self.first + j, offset=int(starts[j]))

    def _ragged_ndim(self, arrays: dict, k: str) -> int:
        entry = arrays.get(f"{k}.shape")
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not (isinstance(shape, list) and len(shape) == 2 and isinstance(shape[1], int) and 0 <= shape[1] <= 32):
            raise self._bad(f"array {k + '.shape'!r} must be [count, ndim]")
        if self.kinds[k] == "pixels" and shape[1] != 3:
            raise self._bad(f"field {k!r}: pixels are [H, W, C], but shapes have {shape[1]} dims")
        return shape[1]

    def _past_end(self, k: str, j: int, offset: int, nbytes: int) -> None:
        raise CorruptRecordError(f"field {k!r} ({nbytes} bytes at byte {offset}) ends past the end of the file "
                                 f"({self.size} bytes): a truncated shard or an index that disagrees with it "
                                 f"(shard sample {j})", path=self.data_path, index=self.first + j, offset=offset)

    def shape_array(self, k: str) -> np.ndarray:
        s = self.shapes[k]
        return np.tile(np.asarray(s, np.int64), (self.count, 1)) if isinstance(s, tuple) else s

    def nbytes_array(self, k: str) -> np.ndarray:
        return np.prod(self.shape_array(k), axis=1).astype(np.int64) * np.dtype(self.dtypes[k]).itemsize
