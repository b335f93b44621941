"""The on-disk index of raw tensor shards (see `ingest.formats.raw` for the layout): its constants, the
encoding of per-sample arrays, and opening a dataset: finding its shards and checking each shard's index
against its data file before anything is read, so that no read is ever sized by an unchecked number."""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
from typing import Any

import numpy as np
import torch

from ..errors import CorruptRecordError, SourceError
from . import MANIFEST, RAW_INDEX
from .base import parse_dtype

FORMAT = "ingest-raw"
VERSION = 1
DEFAULT_ALIGN = 4096
#: Alignment of each field inside a sample (at least any element size, a cache line).
FIELD_ALIGN = 64
DATA_SUFFIX = ".raw"
INDEX_SUFFIX = ".raw.json"

#: Element types a stored field may have (numpy names; stored little-endian) and their torch dtypes.
DTYPES = {"bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16,
          "int32": torch.int32, "int64": torch.int64, "uint16": torch.uint16, "uint32": torch.uint32,
          "uint64": torch.uint64, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}
#: Kinds stored in the shard -> their dtype (None: the field's own); kinds kept as index columns -> dtype.
STORED = {"pixels": "uint8", "array": None, "ints": "int64", "floats": "float32", "text": "uint8", "bytes": "uint8",
          "mask": None}
COLUMNS = {"int": np.int64, "float": np.float64}


def encode_array(a: np.ndarray) -> dict[str, Any]:
    """A numpy array as JSON: integers in the smallest signed type that holds them, little-endian, base64."""
    if a.dtype.kind in "iu":
        lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
        a = a.astype(next(t for t in ("<i1", "<i2", "<i4", "<i8")
                          if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max))
    else:
        a = a.astype(a.dtype.newbyteorder("<"))
    return {"dtype": a.dtype.str, "shape": list(a.shape), "base64": base64.b64encode(a.tobytes()).decode()}


def shard_indexes(path: Any) -> tuple[list[str], list[str] | None]:
    """The shard index files of a dataset path, in order, and the classes its dataset index names."""
    if not isinstance(path, (str, os.PathLike)):
        paths = [_index_of(os.fspath(p)) for p in path]
        return paths, None
    path = os.fspath(path)
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, RAW_INDEX)):
            return _dataset_index(os.path.join(path, RAW_INDEX))
        stems = _manifest_stems(path)
        if stems is not None:
            return [_index_of(os.path.join(path, s + INDEX_SUFFIX)) for s in stems], None
        return sorted(os.path.join(path, e.name) for e in os.scandir(path)
                      if e.is_file() and e.name.endswith(INDEX_SUFFIX)), None
    if os.path.basename(path) == RAW_INDEX:
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
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise CorruptRecordError(f"not valid JSON: {err}", path=path) from None
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


class Shard:
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
        # each stored field's CRC32C per sample, where the writer put them (`ingest.formats.checks`)
        self.crcs = {k: self._crc_array(arrays, k) for k in self.stored if f"{k}.crc32c" in arrays}
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
                want = "pixels" if name == "image" else "int"
                raise self._bad(f"field {name!r} must be of kind {want}, got {kind!r}")
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
                raise ValueError
            dtype = parse_dtype(entry["dtype"])
        except ValueError:
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
                first = offsets[self.stored[0]]
                if not first <= offsets[k] <= offsets[k] + nbytes <= first + stride:
                    raise self._bad(f"field {k!r} ({nbytes} bytes at offset {offsets[k]}) lies outside its sample "
                                    f"({stride} bytes from offset {first}): samples would overlap")
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
        ends = np.maximum.reduce([self.offsets[k] + self.nbytes_array(k) for k in self.stored])
        overlap = np.flatnonzero(starts[1:] < ends[:-1]) if n > 1 else []
        if len(overlap):
            j = int(overlap[0]) + 1
            raise CorruptRecordError(f"sample starts at byte {int(starts[j])}, inside the one before it (which ends at "
                                     f"byte {int(ends[j - 1])}): a repeated or edited index entry",
                                     path=self.index_path, index=self.first + j, offset=int(starts[j]))

    def _crc_array(self, arrays: dict, k: str) -> np.ndarray:
        crcs = self._array(arrays, f"{k}.crc32c", (self.count,), "iu")
        if len(crcs) and (crcs.min() < 0 or crcs.max() > 0xFFFFFFFF):
            raise self._bad(f"array {k + '.crc32c'!r} holds values outside 0..2**32 - 1")
        return crcs.astype(np.uint32)

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
