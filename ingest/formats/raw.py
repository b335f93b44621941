"""Raw tensor shards: decoded pixels (or any numeric arrays) stored back to back, aligned for direct I/O, and
read straight into GPU memory with KvikIO (GPUDirect Storage where the host has it) in a few large reads,
skipping decode. JPEG bitstreams must visit the host for nvJPEG anyway; raw pixels need not.

**Files.** `RawWriter` writes a shard as two files:

- ``<stem>.raw``: the samples, back to back. Each sample starts at a multiple of ``align`` (4096 by default,
  the block of O_DIRECT and GDS); its stored fields follow in field order (``image`` first), each at a
  multiple of `FIELD_ALIGN` bytes inside the sample; the file is zero-padded to a multiple of ``align``.
  256x256x3 uint8 samples (48 blocks each) lie back to back with no padding at all.
- ``<stem>.raw.json``: the shard's index. It names no file: the data file is the index's name less
  ``.json``, so the two can be moved and renamed together (the converter writes them in a temporary
  directory and renames them into place).

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
stored field and ``<f>.shape`` ([n, ndim]) for each field whose ``shape`` is null (it varies). `RawWriter`
also stores ``<f>.crc32c`` ([n]), the CRC32C of each stored field's bytes, which a reader checks with
``check`` (`ingest.formats.checks`: on the locate/parse path each field as parsed, in `read_batch` each row
read, copied to the host first when ``out`` is on the GPU).

**Field kinds.** Stored in the shard: ``pixels`` (uint8 [H, W, C]; an encoded ``image`` field is decoded on
the way in, by the writer's ``decode``, and becomes ``pixels``), ``array`` (bool/int/uint/float dtypes of `DTYPES`, a fixed number of
dims), ``ints`` (int64 [L]), ``floats`` (float32 [L]), ``text`` (UTF-8), ``bytes`` and ``mask`` (as the
writer gets it: encoded bytes, 1-D uint8, or decoded ``[H, W]`` uint8/uint16; the same for every sample). Index columns: ``int``
(the label among them) and ``float``.

**Reading.** `RawSource` is a `formats.Source` (``locate``: the byte span of a sample; ``parse``: numpy views
of it) for the CPU path, `check_format` and the converter. Its fast path, :meth:`RawSource.read_batch`,
reads one fixed-shape field of a batch straight into a preallocated ``[B, *shape]`` tensor, on the GPU with
KvikIO (see `ingest.io.ByteReader.read_rows`). Opening checks every index entry against the shard's size:
a range past the end of a shard raises CorruptRecordError naming the file, the sample and the offset before
anything is read, so no read is ever sized by an unchecked number.
"""

from __future__ import annotations

import json
import math
import os
from array import array
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .._atomic import atomic_write
from .._numpy import take
from ..errors import ConfigError, CorruptRecordError, SourceError
from . import RAW_INDEX, checks
from ._native_table import NativeTable, NotNative
from ._raw_index import (COLUMNS, DATA_SUFFIX, DEFAULT_ALIGN, DTYPES, FIELD_ALIGN, FORMAT, INDEX_SUFFIX, STORED,
                         VERSION, Shard, encode_array, shard_indexes)
from .base import DEFAULT_FIELDS, Field, Location, Record, check_index, check_indices
from .boxes import convert_record


def _align_up(n: int, a: int) -> int:
    return -(-n // a) * a


# ==================================================================================================
# Writing


class RawWriter:
    """Writes one raw shard, ``<stem>.raw`` + ``<stem>.raw.json``, into ``directory`` (see the module doc).

    ``fields``: the declared fields of the samples (``image``/``pixels`` first in the file whatever the order
    given). ``align``: the alignment of every sample's start (a power of two, 1 to 1 MiB). ``classes``: class
    names, kept in the index. ``decode``: ``(encoded bytes, name) -> [H, W, C] uint8``, for an encoded ``image``
    field (formats sit below decoding, so the caller brings the decoder; the converter gives its own). :meth:`add` checks a sample against its fields before writing any byte of it,
    so a rejected sample (CorruptRecordError naming the shard, the sample and the field) leaves the shard
    as it was. The same records give the same bytes.
    """

    def __init__(self, directory: str | os.PathLike, stem: str, fields: dict[str, Field] | None = None, *,
                 align: int = DEFAULT_ALIGN, classes: Sequence[str] = (),
                 decode: Callable[[Any, str], np.ndarray] | None = None):
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
        self._crcs = {k: array("Q") for k in self._stored}   # each stored field's CRC32C per sample
        self.stem = stem
        self.path = os.path.join(os.fspath(directory), stem + DATA_SUFFIX)
        self._file = open(self.path, "wb")
        self._end = 0        # bytes written so far
        self._count = 0
        self._decoder = decode

    def add(self, record: Record) -> None:
        """Append one sample (its ``image``, ``label`` and every other declared field)."""
        values = [(k, self._value(k, record)) for k in self._stored]
        columns = [(k, self._column(k, record)) for k in self._columns]
        pos = _align_up(self._end, self.align)  # the sample's start
        for k, arr in values:
            pos = _align_up(pos, FIELD_ALIGN)
            self._offsets[k].append(pos)
            self._shapes[k].extend(arr.shape)
            self._file.write(bytes(pos - self._end))
            self._file.write(arr.reshape(-1).view(np.uint8))
            self._end = pos = pos + arr.nbytes
        for k, v in columns:
            self._columns[k].append(v)
        for k, arr in values:
            self._crcs[k].append(checks.crc(arr.reshape(-1).view(np.uint8)))
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
            elif kind == "mask" and not (isinstance(value, np.ndarray) and value.ndim >= 2):
                arr = np.frombuffer(bytes(memoryview(value).cast("B")), np.uint8)   # encoded, as given
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
        return arr.astype(arr.dtype.newbyteorder("<"), order="C", copy=False)  # keeps 0-d arrays 0-d

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
            raise ConfigError(f"{self.path}: an encoded image is stored decoded, and this writer was given no "
                              "`decode` (e.g. `ingest.decode.cpu.CpuDecoder(threads=1).decode`)")
        return self._decoder(data, f"{self.path} [sample {self._count}]")

    # -- the index ---------------------------------------------------------------------------------
    def _index(self, size: int) -> dict[str, Any]:
        n = self._count
        offsets = {k: np.array(self._offsets[k], np.int64) for k in self._stored}
        shapes = {k: np.array(self._shapes[k], np.int64).reshape(n, self._ndim[k] or 0)
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
        arrays = {k: encode_array(np.asarray(v, COLUMNS[self._fields[k].kind]))
                  for k, v in self._columns.items()}
        arrays.update({f"{k}.crc32c": encode_array(np.array(v, np.int64)) for k, v in self._crcs.items()})
        first = offsets[self._stored[0]]
        stride = int(first[1] - first[0]) if n > 1 else _align_up(self._end, self.align)
        if n and stride > 0 and all(fixed.values()) and all((offsets[k] == np.arange(n) * stride + offsets[k][0]).all()
                                              for k in self._stored):
            layout = {"stride": stride, "offsets": {k: int(offsets[k][0]) for k in self._stored}}
        else:
            layout = {"stride": None}
            for k in self._stored:
                arrays[f"{k}.offset"] = encode_array(offsets[k])
                if not fixed[k]:
                    arrays[f"{k}.shape"] = encode_array(shapes[k])
        return {"format": FORMAT, "version": VERSION, "count": n, "align": self.align, "file_size": size,
                "classes": self.classes, "fields": fields, **layout, "arrays": arrays}


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
    path = os.path.join(directory, RAW_INDEX)
    with atomic_write(path) as f:
        json.dump(data, f, indent=1)
        f.write("\n")
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
    ``read_batch(indices, out)`` reads a fixed-shape field of a batch straight into ``out``
    (``batch_buffer(n, device)`` makes one); ``ranges(indices)`` says where those bytes are (shard numbers
    into ``paths``, offsets) for a reader of one's own.

    Opening reads every shard index and checks it against its data file (CorruptRecordError naming the file,
    sample and offset for anything past the end, misaligned or inconsistent; SourceError for shards that
    disagree on their fields or classes). Pickles as its index (file handles are per process).
    """

    box_conversion = None   # stored boxes -> those asked for (set by `open_source` from a converter manifest)

    def __init__(self, path: str | os.PathLike | Sequence[str | os.PathLike], *, check: str | None = None):
        from ..io import file_handles
        index_paths, classes = shard_indexes(path)
        shards, count = [], 0
        for p in index_paths:
            shard = Shard(p, count)
            shards.append(shard)
            count += shard.count
        if not shards:
            raise SourceError(f"no raw shards in {os.fspath(path)!r}" if isinstance(path, (str, os.PathLike))
                              else "no raw shards given")
        self._merge(shards, classes)
        self._handles = file_handles()
        have = all(k in s.crcs for s in shards for k in self._stored)
        self._crcs = {k: np.concatenate([s.crcs[k] for s in shards]) for k in self._stored} \
            if checks.enabled(check, "raw", have, shards[0].index_path) else None

    def _merge(self, shards: list["Shard"], classes: list[str] | None) -> None:
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
        if self._crcs is not None:
            for k in self._stored:
                at = int(self._offsets[k][i])
                self._check(k, i, buf[at - start:at - start + self._nbytes_of(k, i)], at)
        if not buf.flags.writeable:
            buf = buf.copy()  # tensors made from it must be writable
        values = {k: self._field(k, i, buf, start) for k in self._stored}
        values.update({k: col[i].item() for k, col in self._columns.items()})
        image = values.pop("image", None)
        values.pop("label", None)
        return convert_record(Record(image, int(self._labels[i]), values), self.box_conversion)

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

    def _check(self, name: str, i: int, data: Any, offset: int) -> None:
        """Raise the CorruptRecordError of field ``name`` of sample ``i`` when its bytes do not have the CRC
        written with them."""
        err = checks.mismatch(data, int(self._crcs[name][i]), path=self.paths[self._file[i]], index=i, offset=offset)
        if err is not None:
            raise CorruptRecordError(f"field {name!r}: {str(err).split(': ', 1)[1]}", path=err.path, index=i,
                                     offset=offset)

    def labels(self) -> np.ndarray:
        return self._labels

    def native_table(self) -> NativeTable:
        """Every sample's ``image`` pixels for the native engine (kind "pixels"): their byte range, height and
        width, the label from the index and, where fields are checked (``check``), the field's CRC32C, which the
        engine checks over the bytes it reads as `parse` does. A sample of no pixels (a side of 0) is left to
        the Python reader. Raises `NotNative` where the engine cannot take the pixels: no ``image`` field of
        pixels, a dtype other than uint8, or a channel count other than 3 (the native kernel's output is RGB)."""
        image = self.fields.get("image")
        if image is None or image.kind != "pixels":
            raise NotNative("its shards hold no 'image' field of pixels")
        if self._dtypes["image"] != "uint8":
            raise NotNative(f"its pixels are {self._dtypes['image']}, and the native engine takes uint8 pixels")
        n = self._count
        shapes = self._shapes["image"]
        shapes = np.broadcast_to(np.asarray(shapes, np.int64), (n, 3)) if isinstance(shapes, tuple) else shapes
        if n and shapes.shape[1] != 3:
            raise NotNative(f"its pixels have {shapes.shape[1]} dims, not [H, W, C]")
        channels = np.unique(shapes[:, 2]) if n else np.zeros(0, np.int64)
        if len(channels) and (channels != 3).any():
            odd = int(channels[channels != 3][0])
            raise NotNative(f"its pixels have {odd} channel{'s' if odd != 1 else ''}, and the native engine takes 3 "
                            "(RGB)")
        hw = np.ascontiguousarray(shapes[:, :2], np.int64)
        empty = (hw <= 0).any(axis=1)
        nbytes = self._nbytes["image"]
        sizes = np.full(n, nbytes, np.int64) if isinstance(nbytes, int) else np.asarray(nbytes, np.int64)
        crcs = None if self._crcs is None else self._crcs["image"].astype(np.uint32)
        return NativeTable(self.paths, self._file.astype(np.int64), np.asarray(self._offsets["image"], np.int64),
                           sizes, np.asarray(self._labels, np.int64), "pixels", crcs,
                           python=empty.astype(np.uint8) if empty.any() else None, hw=hw)

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
        files, offsets = self.ranges(indices, field)
        want = (len(offsets), *shape)
        dtype = DTYPES[self._dtypes[field]]
        if tuple(out.shape) != want or out.dtype != dtype or not out.is_contiguous():
            raise ConfigError(f"`out` must be a contiguous {list(want)} {dtype} tensor, got "
                              f"{list(out.shape)} {out.dtype}{'' if out.is_contiguous() else ' (not contiguous)'}")
        if reader is None:
            from ..io import ByteReader
            reader = self._handles.get("reader", ByteReader)
        reader.read_rows(self.paths, files, offsets, out, handles=self._handles)
        if self._crcs is not None:
            rows = out.cpu().numpy().reshape(len(offsets), -1).view(np.uint8)
            idx = check_indices(np.asarray(indices, dtype=np.int64), self._count).tolist()
            for k, (i, offset) in enumerate(zip(idx, offsets.tolist())):
                self._check(field, i, rows[k], offset)
        return out

    def ranges(self, indices: Sequence[int] | np.ndarray, field: str = "image") -> tuple[np.ndarray, np.ndarray]:
        """Where ``field`` of each sample of ``indices`` is: (shard numbers into ``paths``, byte offsets), both
        int64 arrays; negative indices count from the end. Raises IndexError outside the dataset."""
        self._stored_field(field)
        idx = check_indices(np.asarray(indices, dtype=np.int64), self._count)
        return take(self._file, idx, np.int64), take(self._offsets[field], idx)

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
