"""LMDB databases: `LMDBSource` reads ours and other tools' layouts, `LMDBWriter` writes ours.

Opening is read-only and lock-free (``lock=False``: read-only media work and there is no reader table to
size; a database that another process writes meanwhile is not supported), with OS read-ahead off (random
access), once per process: py-lmdb allows one environment per database file per process, so sources share
them (`_Environments`, keyed by the file's identity: a source holds them from its first read until its `close`
or collection, and the last to let go closes them; pickled sources carry paths and keys only and reopen in their
worker; a forked worker closes what it inherited and opens its own). Keys are listed once,
in LMDB's (byte) order, by one cursor pass, and kept packed.

**Values are located, not copied.** LMDB keeps each value contiguous in ``data.mdb``, which py-lmdb maps into
memory. A value's byte range of ``data.mdb`` is found from the address of its view in the map (a
``buffers=True`` read, no copy) and where the map lies in this process (`_Map`). Every sample's ranges (a row
per field for columnar samples) are found once, at open, in one cursor pass (`_Db.ranges`; file offsets, so
they hold in every process the source is sent to), and ``locate`` is a table lookup with no LMDB call. That
matters because py-lmdb gives the GIL up in every ``get``, and beside a busy thread each release costs up to a
switch interval, so a per-batch lookup would cost one per key. The batch's reader reads the ranges with the
batch's other reads, on native threads into its arena, instead of py-lmdb copying each value out with the GIL
held (locating a value is cheaper than copying it, before the page faults of touching the map; see
docs/measurements.md, Formats). Where the table
cannot be made (the map's base not found: no ``/proc/self/maps`` or a check read that disagrees; keys that are
not the layout's), keys are looked up per batch in one read transaction, and without the base the values are
copied out as ``Location.data``. Views of the map are dropped inside their transaction, and the open pass keeps
few alive at a time: py-lmdb's cursor slows down with the number of live views (`_CHUNK`).

**Layouts** (``layout="auto"`` tells them apart from the keys and the first values):

- ``ingest`` -- ours, written by `LMDBWriter`: key ``b"%09d" % i`` per sample holding a framed record
  (`_framed`); ``__meta__``: JSON ``{"format": "ingest-lmdb", "version": 1, "count": n, "fields":
  [{"name", "kind", "shape", "dtype"}, ...] (in record order), "classes": [...], "content_sha256": ...}``;
  ``__labels__``: every sample's ``label``, int64 little-endian (``labels()`` reads one value);
  ``__crc32c__``: every sample value's CRC32C, uint32 little-endian, checked as values are read (``check``:
  `ingest.formats.checks`; databases written before it have none).
- ``columnar`` -- mmocr / CRNN text-recognition style: ``<prefix>-<number>`` keys, one prefix per field
  (``image-000000001`` -> JPEG, ``label-000000001`` -> text), plus an optional ``num-samples`` that must
  agree. Prefix ``image``/``img`` is the ``image`` field; ``label`` is the ``text`` field (the
  transcription, kept as text even when it looks like a number); any other prefix is a field of that name
  (image, text or bytes, by its first values; images under a prefix of `MASK_PREFIXES`, ``mask-000000001``,
  are a ``mask`` field). Samples are the numbers in numeric order.
- ``caffe`` -- Caffe ``Datum`` protobufs (``convert_imageset``: keys ``%08d_<path>``). ``encoded=true``:
  the image bytes (kind ``image``); ``encoded=false``: raw ``uint8`` C x H x W planes, returned as decoded
  pixels ``[H, W, C]`` (kind ``pixels``) in **RGB** order: Caffe stores OpenCV's BGR, so the channels are
  reversed (``caffe_bgr=False`` keeps them as stored, for Datums made from RGB arrays). DALI's caffe reader
  copies the planar bytes as they are into an ``H x W x C`` tensor and leaves the order BGR. Datums holding
  ``float_data`` instead give a ``float_data`` field (float32 ``[C, H, W]``).
- ``images`` -- every key holds one encoded image (no labels).

**Determinism.** `LMDBWriter` appends keys in order in fixed-size transactions, so the same records give the
same keys and values (`content_checksum`, also stored in ``__meta__`` and checked by `verify`); the
``data.mdb`` bytes are the same too for the same liblmdb and OS page size.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import re
import threading
from typing import Any, Iterator, Mapping, Sequence

import lmdb as _lmdb
import numpy as np
from google.protobuf.message import DecodeError as _ProtoDecodeError

from ..errors import ConfigError, CorruptRecordError, SourceError
from ..io import NATIVE
from . import _framed, _lmdb_check, checks
from ._protos import Datum
from .base import Field, Location, ProcessLocal, Record, batch_structs, check_index, parse_or_error, read_location
from .boxes import convert_record
from ._images import image_extension
from ._native_table import NativeTable, NotNative

LAYOUTS = ("auto", "ingest", "columnar", "caffe", "images")
META_KEY, LABELS_KEY, CRC_KEY = b"__meta__", b"__labels__", b"__crc32c__"
FORMAT, VERSION = "ingest-lmdb", 1
#: Columnar prefixes whose image values are segmentation label maps (kind ``mask``).
MASK_PREFIXES = ("mask", "seg", "segmentation")
_COLUMN = re.compile(rb"^([A-Za-z][A-Za-z0-9_]*)-(\d+)$")
_NUM_SAMPLES = b"num-samples"
_SNIFF = 8           # values looked at to tell a layout or a column's kind
# Our framed record of an image and an int label (`_framed`): its head, up to the image, and its tail, the label
_IMAGE_HEAD = np.dtype([("magic", "S4"), ("code", "u1"), ("length", "<u8")])
_LABEL_TAIL = np.dtype([("code", "u1"), ("length", "<u8"), ("label", "<i8")])


def _open_env(path: str) -> Any:
    """The environment of the LMDB at ``path``, opened only after its data file passed `_lmdb_check.check`
    (liblmdb trusts the file: a truncated one gives SIGBUS, a damaged tree an assertion)."""
    data = _data_file(path)
    _lmdb_check.check(data)
    try:
        return _lmdb.open(path, subdir=os.path.isdir(path), readonly=True, lock=False, readahead=False,
                          meminit=False, max_readers=1024, max_dbs=0)
    except _lmdb.Error as err:
        raise CorruptRecordError(f"cannot open the LMDB: {err}", path=data) from err


@contextlib.contextmanager
def _lmdb_errors(path: str, key: Any = None) -> Iterator[None]:
    """liblmdb's errors (``lmdb.Error``: a corrupt page, a page number past the map, ...) as a
    CorruptRecordError naming the data file and, where known, the key."""
    try:
        yield
    except _lmdb.Error as err:
        if isinstance(key, (bytes, bytearray)):
            key = bytes(key).decode("ascii", "backslashreplace")
        raise CorruptRecordError(f"liblmdb: {err}", path=_data_file(path), index=key) from err


class _Environments:
    """The LMDB environments of this process, each shared by its users and closed when the last one leaves.

    Notes
    -----
    py-lmdb allows one open environment per database file per process, so every source (and every pickled
    copy of one) shares them, keyed by the data file's identity (a database replaced at the same path is
    opened afresh). Each user holds the environment between `acquire` and `release` (a source: from its first
    read in a process until `LMDBSource.close` or its collection); when the last one releases it, it is closed,
    so that the process may open the database again (``lmdb.open``, a writer). A forked child closes the ones
    it inherited before opening its own (py-lmdb refuses a second one for the same file): read-only with
    ``lock=False``, that releases nothing the parent holds."""

    def __init__(self):
        self._pid = os.getpid()
        self._open: dict[Any, list] = {}   # key -> [environment, users]
        self._lock = threading.Lock()

    def _here(self) -> None:
        if self._pid != os.getpid():   # inherited through fork: never use the parent's environments
            inherited, self._open = self._open, {}
            self._pid, self._lock = os.getpid(), threading.Lock()
            for env, _ in inherited.values():
                env.close()

    def acquire(self, path: str) -> tuple[Any, Any]:
        """(key, environment) of the LMDB at ``path``, opened if no user holds it; give the key to `release`."""
        data = _data_file(path)
        try:
            st = os.stat(data)
        except OSError as err:
            raise SourceError(f"cannot open LMDB {path!r}: {err.strerror}", path=path) from err
        key = (os.path.realpath(data), st.st_dev, st.st_ino)
        self._here()
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                entry = self._open[key] = [_open_env(path), 0]
            entry[1] += 1
            return key, entry[0]

    def release(self, key: Any) -> None:
        """One user of ``key``'s environment leaves; the last one closes it."""
        if self._pid != os.getpid():
            return
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0:
                del self._open[key]
                entry[0].close()

    def close(self) -> None:
        """Close every environment of this process, whoever holds it."""
        self._here()
        with self._lock:
            entries, self._open = self._open, {}
        for env, _ in entries.values():
            env.close()

    def __len__(self) -> int:
        self._here()
        return len(self._open)


_ENVS = _Environments()


@contextlib.contextmanager
def environment(path: str) -> Iterator[Any]:
    """The read-only environment of the LMDB at ``path`` in this process, held for the ``with`` block (closed
    after it unless another user holds it: `_Environments`)."""
    key, env = _ENVS.acquire(path)
    try:
        yield env
    finally:
        _ENVS.release(key)


def _data_file(path: str) -> str:
    return os.path.join(path, "data.mdb") if os.path.isdir(path) else path


class _Map:
    """An LMDB's environment in this process and where its memory map lies, so that a value viewed in the map
    is located as a byte range of the data file (`locations`). ``base`` is the address of file offset 0
    (None: unknown, values are copied out)."""

    def __init__(self, path: str):
        self.path = path
        self._key, self.env = _ENVS.acquire(path)   # held until `close` (or collection)
        self.data = _data_file(path)
        self.size = os.path.getsize(self.data)
        with _lmdb_errors(path):
            self.base = self._find_base()

    def close(self) -> None:
        """Release the environment (`_Environments`); the map is not used after this."""
        key, self._key = self._key, None
        if key is not None:
            _ENVS.release(key)

    def __del__(self) -> None:
        self.close()

    def _find_base(self) -> int | None:
        """The map's base: the mapping of this process that holds a probe value (the first one), checked by
        reading that value from the file at the offset it gives."""
        with self.env.begin(buffers=True) as txn:
            view = next((v for v in txn.cursor().iternext(keys=False, values=True) if len(v)), None)
            if view is None:
                return None
            probe, address = bytes(view), _address(view)
            del view   # inside the transaction
        try:
            with open("/proc/self/maps") as f:
                maps = f.read().splitlines()
        except OSError:
            return None
        real = os.path.realpath(self.data)
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) < 6 or os.path.realpath(fields[5].strip()) != real:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                base = start - int(fields[2], 16)
                offset = address - base
                try:
                    with open(self.data, "rb") as f:
                        same = os.pread(f.fileno(), len(probe), offset) == probe
                except OSError:
                    return None
                return base if same else None
        return None

    def locations(self, keys: Sequence[bytes], name: str) -> list[Location | None]:
        """Where each key's value lies (None: no such key, or an empty key); ``name`` prefixes the display
        name of a value that must be copied out."""
        with _lmdb_errors(self.path, keys[0] if len(keys) == 1 else None), \
                self.env.begin(buffers=self.base is not None) as txn:
            return self._ranges(txn, keys, name)   # the views die with its frame, inside the transaction

    def _ranges(self, txn: Any, keys: Sequence[bytes], name: str) -> list[Location | None]:
        values = [txn.get(key) if key else None for key in keys]
        found = [v for v in values if v is not None]
        where = iter(_addresses(found).tolist() if self.base is not None else [0] * len(found))
        out: list[Location | None] = []
        for key, value in zip(keys, values):
            if value is None:
                out.append(None)
                continue
            address, size = next(where), len(value)
            offset = address - self.base if self.base is not None and size else -1
            if 0 <= offset <= self.size - size:
                out.append(Location(self.data, offset, size))
            else:   # copied out: valid after the transaction
                out.append(Location(f"{name}:{key.decode('ascii', 'backslashreplace')}", data=bytes(value)))
        return out

    def sample_ranges(self, db: "_Db") -> np.ndarray | None:
        """(offset, length) of every sample's value in the data file, from one cursor pass: ``[count, 2]``, or
        for a columnar layout ``[count, fields, 2]`` with offset -1 where a sample has no key for a field.
        None: the map's base is unknown, or the keys are not the layout's."""
        if self.base is None:
            return None
        entries = db.entries if db.layout == "columnar" else db.count
        out = np.zeros((entries, 2), np.int64)
        with _lmdb_errors(self.path), self.env.begin(buffers=True) as txn:
            if not self._fill(txn, db, out):
                return None
        if db.layout != "columnar":
            return out
        at = np.stack([db.key_index[name] for name in db.fields], axis=1)   # [count, fields] entry numbers
        table = out[at]
        table[at < 0] = (-1, 0)
        return table

    def _fill(self, txn: Any, db: "_Db", out: np.ndarray) -> bool:
        """`sample_ranges`' pass over ``len(out)`` entries in key order (ours: the sample keys only), a chunk of
        views alive at a time (`_CHUNK`)."""
        cursor = txn.cursor()
        if db.layout == "ingest" and not cursor.set_range(b"%09d" % 0):
            return len(out) == 0
        chunk: list = []
        n, total = 0, len(out)
        for key, value in cursor.iternext(keys=True, values=True):
            if n == total:
                break
            if db.layout == "ingest" and key != b"%09d" % n:
                return False
            chunk.append(value)
            n += 1
            if len(chunk) == _CHUNK or n == total:
                if not self._put(chunk, out[n - len(chunk):n]):
                    return False
                chunk = []
        return n == total

    def _put(self, values: list, rows: np.ndarray) -> bool:
        rows[:, 1] = [len(v) for v in values]
        rows[:, 0] = _addresses(values)
        rows[:, 0] -= self.base
        rows[rows[:, 1] == 0, 0] = 0
        return bool(((rows[:, 0] >= 0) & (rows[:, 0] + rows[:, 1] <= self.size)).all())


#: Values whose addresses are taken at once in `_Map.sample_ranges`. py-lmdb's cursor steps slow down with the
#: number of views alive, and very small chunks add calls: a middle size is fastest (docs/measurements.md, Formats).
_CHUNK = 1024


def _addresses(views: list) -> np.ndarray:
    """Where each view's first byte lies, in one native call where `ingest._readv` was built."""
    out = np.empty(len(views), np.int64)
    if NATIVE is not None:
        NATIVE.addresses(views, out)
    else:
        out[:] = [_address(v) for v in views]
    return out


def _address(view: Any) -> int:
    return np.frombuffer(view, dtype=np.uint8).ctypes.data


class _Keys:
    """Byte strings packed in one buffer (a million keys pickle as one object)."""

    def __init__(self, keys: Sequence[bytes]):
        self.blob = b"".join(keys)
        self.ends = np.cumsum([len(k) for k in keys], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, i: int) -> bytes:
        start = int(self.ends[i - 1]) if i else 0
        return self.blob[start:int(self.ends[i])]


def _is_int(value: bytes) -> bool:
    return re.fullmatch(rb"\s*[+-]?\d{1,18}\s*", value) is not None


def _is_text(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class _Db:
    """One LMDB: its layout, sample count and how sample ``i``'s keys are made."""

    def __init__(self, path: str, layout: str, caffe_bgr: bool):
        self.path = path
        self.caffe_bgr = caffe_bgr
        with _lmdb_errors(path), environment(path) as env, env.begin() as txn:
            self._detect(txn, layout)
        # Where every sample's value lies in the data file, found once here (file offsets: they hold in every
        # process the source is sent to). Per batch, a lookup would release the GIL per key (py-lmdb's get): beside
        # a busy thread each release costs up to a switch interval. None: looked up per
        # batch (the map's base unknown, or keys that are not the layout's).
        self.data = _data_file(path)
        view = _Map(path)
        try:
            self.ranges = view.sample_ranges(self)
        finally:
            view.close()

    # -- layout detection ------------------------------------------------------------------------
    def _detect(self, txn: Any, layout: str) -> None:
        meta = txn.get(META_KEY)
        if layout in ("auto", "ingest") and meta is not None and self._ingest(txn, meta):
            return
        if layout == "ingest":
            raise SourceError(f"{self.path!r} has no ingest {META_KEY.decode()} key: not written by LMDBWriter "
                              "(try layout='auto')", path=self.path)
        keys = list(txn.cursor().iternext(keys=True, values=False))
        if not keys:
            raise SourceError(f"LMDB {self.path!r} is empty", path=self.path)
        if layout in ("auto", "columnar") and self._columnar(txn, keys):
            return
        first = [txn.get(k) for k in keys[:_SNIFF]]
        if layout in ("auto", "caffe") and all(_datum(v) is not None for v in first):
            self._caffe(keys, _datum(first[0]))
            return
        if layout in ("auto", "images") and all(image_extension(v) for v in first):
            self.layout, self.keys = "images", _Keys(keys)
            self.count, self.fields = len(keys), {"image": Field("image")}
            return
        what = "is not laid out as any of " + ", ".join(LAYOUTS[1:]) if layout == "auto" else \
            f"does not look like layout {layout!r}"
        raise SourceError(f"LMDB {self.path!r} {what} (first key {keys[0][:60]!r}, value starts "
                          f"{first[0][:16]!r}); pass layout= (one of {', '.join(LAYOUTS)})", path=self.path)

    def _ingest(self, txn: Any, meta: bytes) -> bool:
        try:
            doc = json.loads(meta)
        except (ValueError, RecursionError):
            return False
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return False
        self.meta = doc
        if doc.get("version") != VERSION:
            raise SourceError(f"{self.path!r}: ingest LMDB version {doc.get('version')!r}; this reader knows "
                              f"{VERSION}", path=self.path)
        try:
            self.count = int(doc["count"])
            self.fields = {f["name"]: Field(f["kind"], None if f.get("shape") is None else tuple(f["shape"]),
                                            f.get("dtype")) for f in doc["fields"]}
            self.classes = [str(c) for c in doc.get("classes", [])]
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise SourceError(f"{self.path!r}: malformed {META_KEY.decode()}: {err}", path=self.path) from err
        labels = txn.get(LABELS_KEY) or b""
        if len(labels) != 8 * self.count:
            raise SourceError(f"{self.path!r}: {LABELS_KEY.decode()} holds {len(labels)} bytes, expected "
                              f"{8 * self.count} for {self.count} samples", path=self.path)
        crcs = txn.get(CRC_KEY)
        if crcs is not None and len(crcs) != 4 * self.count:
            raise CorruptRecordError(f"{CRC_KEY.decode()} holds {len(crcs)} bytes, expected {4 * self.count} for "
                                     f"{self.count} samples", path=_data_file(self.path), index=CRC_KEY.decode())
        self.crcs = None if crcs is None else np.frombuffer(crcs, "<u4").astype(np.uint32)
        entries, extra = txn.stat()["entries"], 2 + (crcs is not None)
        if entries != self.count + extra:
            raise SourceError(f"{self.path!r}: {entries} keys but {META_KEY.decode()} says {self.count} samples "
                              f"(+{extra} metadata keys)", path=self.path)
        self.layout = "ingest"
        self.labels = np.frombuffer(labels, dtype="<i8").astype(np.int64)
        return True

    def _columnar(self, txn: Any, keys: list[bytes]) -> bool:
        columns: dict[bytes, dict[int, int]] = {}   # prefix -> sample number -> entry number (in key order)
        for entry, key in enumerate(keys):
            if key == _NUM_SAMPLES:
                continue
            match = _COLUMN.match(key)
            if match is None:
                return False
            columns.setdefault(match.group(1), {})[int(match.group(2))] = entry
        if not columns:
            return False
        numbers = sorted(set().union(*columns.values()))
        stated = txn.get(_NUM_SAMPLES)
        if stated is not None and (not _is_int(stated) or int(stated) != len(numbers)):
            raise SourceError(f"{self.path!r}: num-samples is {stated[:20]!r} but the keys number "
                              f"{len(numbers)} samples", path=self.path)
        self.layout, self.count, self.entries = "columnar", len(numbers), len(keys)
        self.columns: dict[str, _Keys] = {}
        self.key_index: dict[str, np.ndarray] = {}   # per field, each sample's entry number (-1: no key)
        self.fields = {}
        for prefix, by_number in sorted(columns.items()):
            sniffed = [txn.get(keys[by_number[n]]) for n in numbers[:_SNIFF] if n in by_number]
            name, kind = self._column_field(prefix.decode(), sniffed)
            self.fields[name] = Field(kind)
            # A missing key is an empty entry: parsing that sample names it.
            self.columns[name] = _Keys([keys[by_number[n]] if n in by_number else b"" for n in numbers])
            self.key_index[name] = np.array([by_number.get(n, -1) for n in numbers], dtype=np.int64)
        return True

    def _column_field(self, prefix: str, values: list[bytes]) -> tuple[str, str]:
        if prefix in ("image", "img"):
            return "image", "image"   # values that do not decode fail there, naming their key
        if prefix == "label":         # a transcription, even when it looks like a number ("007")
            return ("label_text" if "text" in self.fields else "text"), "text"
        images = all(image_extension(v) for v in values)
        if images and prefix in MASK_PREFIXES:   # a segmentation label map: decoded to its values
            return prefix, "mask"
        return prefix, "image" if images else "text" if all(_is_text(v) for v in values) else "bytes"

    def _caffe(self, keys: list[bytes], first: Any) -> None:
        self.layout, self.keys, self.count = "caffe", _Keys(keys), len(keys)
        if first.HasField("data"):
            image = Field("image") if first.encoded else Field("pixels", dtype="uint8")
            self.fields = {"image": image, "label": Field("int")}
        else:
            self.fields = {"float_data": Field("array", dtype="float32"), "label": Field("int")}

    def environment(self) -> contextlib.AbstractContextManager:
        """This LMDB's environment in this process, held for a ``with`` block (`environment`)."""
        return environment(self.path)

    def caffe_labels(self) -> np.ndarray:
        """The label of every Datum, in one read transaction over the values in place (no copies); a value
        `datum_label` cannot walk is parsed in full, which names its problem."""
        labels = np.empty(self.count, np.int64)
        n = 0
        with _lmdb_errors(self.path), self.environment() as env, env.begin(buffers=True) as txn:
            for value in txn.cursor().iternext(keys=False, values=True):
                if n == self.count:   # more keys than when opened
                    n += 1
                    break
                label = datum_label(value)
                if label is None:
                    label = self._parse_datum(bytes(value), self.keys[n].decode("ascii", "backslashreplace")).label
                labels[n] = label
                n += 1
        if n != self.count:
            raise SourceError(f"LMDB {self.path!r} changed while being read ({self.count} keys when it was opened)",
                              path=self.path)
        return labels

    # -- per sample ------------------------------------------------------------------------------
    def sample_keys(self, i: int) -> list[bytes]:
        if self.layout == "ingest":
            return [b"%09d" % i]
        if self.layout == "columnar":
            return [self.columns[name][i] for name in self.fields]
        return [self.keys[i]]

    def parse(self, i: int, raws: tuple, name: str) -> Record:
        if self.layout == "ingest":
            values = _framed.decode(raws[0], self.fields, path=self.path, key=name)
            return Record(values.pop("image", None), int(values.pop("label", -1)), values)
        if self.layout == "caffe":
            return self._parse_datum(raws[0], name)
        if self.layout == "images":
            return Record(raws[0])
        values = {}
        for (field_name, field), raw in zip(self.fields.items(), raws):
            values[field_name] = self._column_value(field_name, field, raw, name)
        return Record(values.pop("image", None), int(values.pop("label", -1)), values)

    def _column_value(self, field_name: str, field: Field, raw: Any, name: str) -> Any:
        if raw is None:
            raise CorruptRecordError(f"no key for field {field_name!r}", path=self.path, index=name)
        if field.kind in ("image", "mask"):
            return raw
        data = bytes(raw)
        if field.kind == "text":
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError as err:
                raise CorruptRecordError(f"field {field_name!r} is not UTF-8 text: {err}", path=self.path,
                                         index=name) from err
        return data

    def _parse_datum(self, raw: Any, name: str) -> Record:
        datum = _datum(bytes(raw), sniff=False)
        if datum is None:
            raise CorruptRecordError("value is not a Caffe Datum (protobuf parse failed or sizes disagree)",
                                     path=self.path, index=name)
        label = int(datum.label) if datum.HasField("label") else -1
        if "float_data" in self.fields:
            if not datum.float_data:
                raise CorruptRecordError("Datum has no float_data", path=self.path, index=name)
            shape = (datum.channels, datum.height, datum.width)
            return Record(None, label, {"float_data": np.array(datum.float_data, np.float32).reshape(shape)})
        if not datum.HasField("data"):
            raise CorruptRecordError("Datum holds no image data (float_data only?)", path=self.path, index=name)
        if self.fields["image"].kind == "image":
            if not datum.encoded:
                raise CorruptRecordError("raw Datum in an LMDB of encoded ones", path=self.path, index=name)
            return Record(np.frombuffer(datum.data, np.uint8), label)
        if datum.encoded:
            raise CorruptRecordError("encoded Datum in an LMDB of raw ones", path=self.path, index=name)
        planes = np.frombuffer(datum.data, np.uint8).reshape(datum.channels, datum.height, datum.width)
        order = [2, 1, 0, 3][:datum.channels] if self.caffe_bgr and datum.channels in (3, 4) else slice(None)
        return Record(np.ascontiguousarray(planes[order].transpose(1, 2, 0)), label)


def _datum(value: bytes, *, sniff: bool = True) -> Any:
    """``value`` as a Caffe Datum whose sizes agree with its payload, else None. ``sniff``: an encoded
    Datum's data must start like a known image format (telling the layout apart from other bytes)."""
    datum = Datum()
    try:
        datum.ParseFromString(value)
    except (_ProtoDecodeError, ValueError, RuntimeError):
        return None
    c, h, w = datum.channels, datum.height, datum.width
    if datum.HasField("data"):
        if datum.encoded:
            return datum if datum.data and (image_extension(datum.data) or not sniff) else None
        return datum if c > 0 and h > 0 and w > 0 and len(datum.data) == c * h * w else None
    return datum if c > 0 and h > 0 and w > 0 and len(datum.float_data) == c * h * w else None


def _varint(buf: Any, pos: int) -> tuple[int, int]:
    """The protobuf varint at ``buf[pos]`` and the position after it. IndexError when it runs past the end,
    ValueError when it is longer than 10 bytes or overflows 64 bits (as the protobuf parser refuses it)."""
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if result >> 64:
                raise ValueError("varint overflows 64 bits")
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def datum_label(value: Any) -> int | None:
    """The ``label`` (field 5, int32) of a serialized Caffe Datum, by walking its top-level fields and
    skipping the others by their lengths (the image data is never touched, so the cost does not grow with
    the image): what a full parse gives (-1 when absent, the last occurrence winning, the varint's low 32
    bits as a signed int32). None when ``value`` is not a plain sequence of fields (truncated, a group, a bad
    wire type or field number): the full parse then decides. It checks nothing else: `LMDBSource.parse`
    does. Single-byte varints (tags, small values) are read inline."""
    label, pos, end = None, 0, len(value)
    try:
        while pos < end:
            key = value[pos]
            pos += 1
            if key >= 0x80:
                key, pos = _varint(value, pos - 1)
            wire = key & 7
            if key < 8 or key >> 32:   # field number 0, or past 2**29 - 1
                return None
            if wire == 0 or wire == 2:   # a varint: the value, or the length of what follows
                v = value[pos]
                pos += 1
                if v >= 0x80:
                    v, pos = _varint(value, pos - 1)
                if wire == 2:
                    pos += v
                elif key == 0x28:   # field 5, varint
                    label = v
            elif wire == 5 or wire == 1:
                pos += 4 if wire == 5 else 8
            else:
                return None
    except (IndexError, ValueError):
        return None
    if pos != end:
        return None
    return -1 if label is None else (label & 0xFFFFFFFF) - ((label & 0x80000000) << 1)


def _paths(path: Any) -> list[str]:
    if not isinstance(path, (str, os.PathLike)):
        return [os.fspath(p) for p in path]
    path = os.fspath(path)
    if os.path.isfile(path) or os.path.exists(os.path.join(path, "data.mdb")):
        return [path]
    if os.path.isdir(path):   # a converter output: one or more <stem>.lmdb directories
        found = sorted(e.path for e in os.scandir(path) if e.is_dir() and not e.name.startswith(".")
                       and os.path.exists(os.path.join(e.path, "data.mdb")))
        if found:
            return found
        raise SourceError(f"{path!r} holds no LMDB (no data.mdb in it or its subdirectories)", path=path)
    raise FileNotFoundError(f"LMDB path {path!r} does not exist")


class LMDBSource:
    """Samples of one or more LMDBs (concatenated in order). ``path``: an LMDB directory (or its
    ``data.mdb``), a directory of LMDB directories, or a list. ``layout``: see the module docstring.
    ``caffe_bgr``: raw Caffe Datums are BGR (as ``convert_imageset`` writes them) and are turned to RGB.
    ``check``: per-record CRC32C checks of our layout's values ("auto", "crc", "none"; None: the ``check``
    setting; `ingest.formats.checks`)."""

    box_conversion = None   # stored boxes -> those asked for (set by `open_source` from a converter manifest)

    def __init__(self, path: Any, *, layout: str = "auto", caffe_bgr: bool = True, check: str | None = None):
        if layout not in LAYOUTS:
            raise ConfigError(f"Unknown LMDB layout {layout!r}. Available: {', '.join(LAYOUTS)}")
        self._dbs = [_Db(p, layout, caffe_bgr) for p in _paths(path)]
        first = self._dbs[0]
        for db in self._dbs[1:]:
            if db.fields != first.fields:
                raise SourceError(f"LMDBs {first.path!r} and {db.path!r} hold different fields "
                                  f"({sorted(first.fields)} vs {sorted(db.fields)})", path=db.path)
        self.fields = dict(first.fields)
        self.classes = list(getattr(first, "classes", []))
        self._starts = [0, *np.cumsum([db.count for db in self._dbs]).tolist()]   # samples of LMDB k from here
        self._maps = ProcessLocal(_Map.close)   # this source's hold on the shared environments (`close`)
        self._labels: np.ndarray | None = None
        crcs = checks.table([getattr(db, "crcs", None) for db in self._dbs])
        self._crcs = crcs if checks.enabled(check, "lmdb", crcs is not None, first.path) else None
        # one LMDB of ours holding an image and an int label: parse_batch reads its records as arrays
        self._image_label = (len(self._dbs) == 1 and first.layout == "ingest" and [
            (n, f.kind) for n, f in self.fields.items()] == [("image", "image"), ("label", "int")])

    def __len__(self) -> int:
        return self._starts[-1]

    def _find(self, i: int) -> tuple[_Db, int, int]:
        if not (type(i) is int and 0 <= i < self._starts[-1]):
            i = check_index(i, self._starts[-1])
        k = bisect.bisect_right(self._starts, i) - 1 if len(self._dbs) > 1 else 0
        return self._dbs[k], k, i - self._starts[k]

    def locate(self, i: int) -> Location | tuple[Location, ...]:
        """The byte range of sample ``i``'s value in ``data.mdb`` (module docstring); a columnar sample's
        values, one per field, with an empty one where a key is missing."""
        db, k, j = self._find(i)
        if db.ranges is not None:
            return _from_table(db, db.ranges[j].tolist())
        view = self._maps.get(k, lambda: _Map(db.path))
        if db.layout != "columnar":   # one key per sample
            key = b"%09d" % j if db.layout == "ingest" else db.keys[j]
            loc = view.locations((key,), db.path)[0]
            if loc is None:
                raise CorruptRecordError(f"key {key!r} is missing", path=db.path, index=i)
            return loc
        locs = tuple(loc or Location(f"{db.path}:{key.decode('ascii', 'backslashreplace')}", data=b"")
                     for key, loc in zip(db.sample_keys(j), view.locations(db.sample_keys(j), db.path)))
        return locs[0] if len(locs) == 1 else locs

    def locate_batch(self, indices: Sequence[int]) -> list[Location | tuple[Location, ...]]:
        """`locate` of each sample: from the table of value ranges, or a batch of one LMDB with one key per
        sample looked up in one read transaction."""
        db = self._dbs[0]
        if len(self._dbs) > 1 or (db.layout == "columnar" and db.ranges is None):
            return [self.locate(i) for i in indices]
        ids = [check_index(i, len(self)) for i in indices]
        if db.ranges is not None:
            return [_from_table(db, row) for row in db.ranges[ids].tolist()]
        keys = [b"%09d" % j for j in ids] if db.layout == "ingest" else [db.keys[j] for j in ids]
        located = self._maps.get(0, lambda: _Map(db.path)).locations(keys, db.path)
        for i, key, loc in zip(ids, keys, located):
            if loc is None:
                raise CorruptRecordError(f"key {key!r} is missing", path=db.path, index=i)
        return located

    def close(self) -> None:
        """Release this process's hold on the environments (closed when no other source holds them: see
        `_Environments`). The source stays usable: a later read opens them again."""
        self._maps.close()

    def parse(self, i: int, raw: Any) -> Record:
        db, _, j = self._find(i)
        raws = raw if isinstance(raw, tuple) else (raw,)
        if db.layout == "columnar":   # an empty value stands for a missing key (see locate)
            raws = tuple(r if len(r) or key else None for r, key in zip(raws, db.sample_keys(j)))
        record = db.parse(j, raws, self._key_name(db, j))
        if self._crcs is not None:   # after the parse, whose errors say more where the framing broke
            self._check(i, raw, db, j)
        return convert_record(record, self.box_conversion)

    def parse_batch(self, indices: Sequence[int], raws: Sequence[Any]) -> list[Record | Exception]:
        """`parse` of each record (a Record, or the error it raised). Ours with an image and an int label, the
        converter's usual output: every record's head and tail read as two arrays (`_IMAGE_HEAD`,
        `_LABEL_TAIL`); records of other shapes, and other layouts, go through `parse`."""
        if not raws or not self._image_label:
            return [parse_or_error(self, i, raw) for i, raw in zip(indices, raws)]
        heads, sizes = batch_structs(raws, _IMAGE_HEAD)
        tails, _ = batch_structs(raws, _LABEL_TAIL, at_end=True)
        head, tail = _IMAGE_HEAD.itemsize, _LABEL_TAIL.itemsize
        common = ((sizes >= head + tail) & (heads["magic"] == _framed.MAGIC)
                  & (heads["code"] == _framed.KIND_CODES["image"]) & (heads["length"] == sizes - head - tail)
                  & (tails["code"] == _framed.KIND_CODES["int"]) & (tails["length"] == 8))
        labels = tails["label"]
        if self._crcs is not None:
            common &= checks.matches(raws, indices, self._crcs)   # the GIL released once for the batch
        return [Record(np.frombuffer(raw, np.uint8, size - head - tail, head), label, {}) if ok
                else parse_or_error(self, i, raw)
                for i, raw, ok, size, label in zip(indices, raws, common.tolist(), sizes.tolist(), labels.tolist())]

    def _check(self, i: int, raw: Any, db: _Db, j: int) -> None:
        """Raise the CorruptRecordError of sample ``i`` when its value does not have the CRC written with it."""
        offset = int(db.ranges[j][0]) if db.ranges is not None else None
        err = checks.mismatch(raw, self._crcs[i], path=db.data, index=self._key_name(db, j), offset=offset)
        if err is not None:
            raise err

    def labels(self) -> np.ndarray:
        """Every sample's label (-1: none). Ours: stored; Caffe: the label field of every Datum, read in one
        cursor pass without parsing the rest (`datum_label`; done once, on the first call); other layouts
        have no class label."""
        if self._labels is None:
            parts = []
            for db in self._dbs:
                if db.layout == "ingest":
                    parts.append(db.labels)
                elif db.layout == "caffe":
                    parts.append(db.caffe_labels())
                else:
                    parts.append(np.full(db.count, -1, dtype=np.int64))
            self._labels = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return self._labels

    def native_table(self) -> NativeTable:
        """Every sample's value range in its ``data.mdb`` for the native engine, from the ranges found at open
        (`_Db.ranges`): kind "framed" for ours of an image and an int label, and of those with one ``mask`` field
        besides, in any declared order (its ``keys`` then the fields' kind codes, its ``mask`` the mask field's:
        `NativeTable`; each label read from its record, the CRC32Cs checked as ``check`` says), "caffe_datum" for
        encoded Caffe Datums, "whole" for the images layout. `NotNative` for other layouts and fields, and where
        the ranges were not found."""
        first = self._dbs[0]
        fields = [(name, f.kind) for name, f in self.fields.items()]
        kind = {"ingest": "framed", "caffe": "caffe_datum", "images": "whole"}.get(first.layout)
        plain = [("image", "image"), ("label", "int")]
        masks = [name for name, k in fields if k == "mask"]
        ours = fields == plain or len(masks) == 1 and sorted(fields) == sorted(plain + [(masks[0], "mask")])
        if kind is None or (first.layout != "images" and not ours):
            raise NotNative(f"it reads LMDBs of our layout holding an image, an int label and at most one mask, of "
                            f"encoded Caffe Datums or of images, not layout {first.layout!r} with fields "
                            f"{dict(fields)}")
        missing = next((db.path for db in self._dbs if db.ranges is None), None)
        if missing is not None:
            raise NotNative(f"where the values of {missing!r} lie in its data.mdb was not found (its map's base: "
                            "see ingest.formats.lmdb)")
        ranges = np.concatenate([db.ranges for db in self._dbs]).reshape(-1, 2)
        mask = (masks[0], bytes([_framed.KIND_CODES["mask"]])) if masks else None
        keys = (bytes(_framed.KIND_CODES[k] for _, k in fields),) if masks else ()
        return NativeTable([db.data for db in self._dbs],
                           np.repeat(np.arange(len(self._dbs), dtype=np.int64), [db.count for db in self._dbs]),
                           np.ascontiguousarray(ranges[:, 0]), np.ascontiguousarray(ranges[:, 1]), None, kind,
                           None if self._crcs is None else np.frombuffer(self._crcs, np.uint32), keys=keys,
                           index_names=self._index_name, mask=mask)

    def _index_name(self, i: int) -> str:
        """How errors name sample ``i``: its key."""
        db, _, j = self._find(i)
        return self._key_name(db, j)

    def _key_name(self, db: _Db, j: int) -> str:
        if db.layout == "ingest":
            return "%09d" % j   # the key b"%09d" % j, as text
        return db.sample_keys(j)[0].decode("ascii", "backslashreplace")

    def name(self, i: int) -> str:
        db, _, j = self._find(i)
        return f"{db.path}:{self._key_name(db, j)}"

    def __repr__(self) -> str:
        return (f"LMDBSource({len(self._dbs)} LMDB, layout {self._dbs[0].layout}, {len(self)} samples, "
                f"fields {sorted(self.fields)})")


def _from_table(db: _Db, row: list) -> Location | tuple[Location, ...]:
    """A sample's location(s) from its row of `_Db.ranges`: one range, or a columnar sample's, one per field (an
    empty one where a key is missing)."""
    if db.layout != "columnar":
        return Location(db.data, row[0], row[1])
    locs = tuple(Location(db.data, offset, size) if offset >= 0 else Location(f"{db.path}:", data=b"")
                 for offset, size in row)
    return locs[0] if len(locs) == 1 else locs


def _iter_content(path: str) -> Iterator[tuple[bytes, bytes]]:
    with _lmdb_errors(path), environment(path) as env, env.begin() as txn:
        for key, value in txn.cursor():
            if key != META_KEY:
                yield key, value


def content_checksum(path: str) -> str:
    """sha256 (hex) of every key and value of the LMDB at ``path`` in key order, ``__meta__`` excepted: equal
    for equal contents whatever the page layout (works on any LMDB)."""
    h = hashlib.sha256()
    for key, value in _iter_content(path):
        h.update(len(key).to_bytes(4, "little") + key + len(value).to_bytes(8, "little"))
        h.update(value)
    return h.hexdigest()


def verify(path: str) -> int:
    """Check an LMDB written by `LMDBWriter` against the checksum in its ``__meta__``, and that every
    sample parses; returns the sample count. Raises CorruptRecordError naming the first problem."""
    source = LMDBSource(path, layout="ingest")
    for db in source._dbs:
        stored = db.meta.get("content_sha256")
        actual = content_checksum(db.path)
        if stored != actual:
            raise CorruptRecordError(f"content checksum {actual} differs from the stored {stored}", path=db.path)
    for i in range(len(source)):
        source.parse(i, read_location(source.locate(i)))
    return len(source)


class LMDBWriter:
    """Writes ``<stem>.lmdb/data.mdb`` in our layout (module docstring) from records with ``fields``; one
    LMDB holds the whole dataset (``sharded = False``). ``classes`` go into ``__meta__``."""

    sharded = False
    BATCH = 1000                 # records per write transaction (fixed: the page layout depends on it)
    MAX_SAMPLES = 10**9          # keys are %09d: beyond, byte order would stop being sample order

    def __init__(self, directory: str | os.PathLike, stem: str, fields: Mapping[str, Field], *,
                 classes: Sequence[str] = ()):
        self.fields = dict(fields)
        for name, field in self.fields.items():
            if not isinstance(field, Field):
                raise ConfigError(f"field {name!r} must be a Field, got {type(field).__name__}")
        self.classes = [str(c) for c in classes]
        self.stem = stem
        self.path = os.path.join(os.fspath(directory), stem + ".lmdb")
        os.makedirs(self.path, exist_ok=True)
        if os.path.exists(os.path.join(self.path, "data.mdb")):
            raise ConfigError(f"{self.path!r} already holds an LMDB; write into a new directory")
        self._map_size = 1 << 26
        try:
            self._env = _lmdb.open(self.path, map_size=self._map_size, subdir=True, lock=False, sync=False,
                                   metasync=False, meminit=True, max_dbs=0)
        except _lmdb.Error as err:
            raise self._write_error(err) from err
        self._pending: list[tuple[bytes, bytes]] = []
        self._labels: list[int] = []
        self._crcs: list[int] = []
        self._hash = hashlib.sha256()

    def add(self, record: Record) -> None:
        n = len(self._labels)
        if n >= self.MAX_SAMPLES:
            raise ConfigError(f"an LMDB written by LMDBWriter holds at most {self.MAX_SAMPLES} samples")
        value = _framed.encode(record, self.fields)
        self._put(b"%09d" % n, value)
        self._crcs.append(checks.crc(value))
        self._labels.append(int(record.label))
        if len(self._pending) >= self.BATCH:
            self._flush()

    def _put(self, key: bytes, value: bytes) -> None:
        self._pending.append((key, value))
        if key != META_KEY:
            self._hash.update(len(key).to_bytes(4, "little") + key + len(value).to_bytes(8, "little"))
            self._hash.update(value)

    def _flush(self) -> None:
        """Commit the pending records; liblmdb's write errors (a full disk, a file-size limit) are OSErrors."""
        while self._pending:
            try:
                with self._env.begin(write=True) as txn:
                    for key, value in self._pending:
                        txn.put(key, value, append=True)
                self._pending = []
            except _lmdb.MapFullError:
                self._map_size *= 2
                self._env.set_mapsize(self._map_size)
            except _lmdb.Error as err:
                raise self._write_error(err) from err

    def close(self) -> list[str]:
        """Write the CRCs, the labels and ``__meta__``, sync and close; the names of the files written."""
        self._put(CRC_KEY, np.asarray(self._crcs, dtype="<u4").tobytes())
        self._put(LABELS_KEY, np.asarray(self._labels, dtype="<i8").tobytes())
        fields = [{"name": name, "kind": f.kind, "shape": None if f.shape is None else list(f.shape),
                   "dtype": f.dtype} for name, f in self.fields.items()]
        meta = {"format": FORMAT, "version": VERSION, "count": len(self._labels), "fields": fields,
                "classes": self.classes, "content_sha256": self._hash.hexdigest()}
        self._put(META_KEY, json.dumps(meta, sort_keys=True).encode())
        self._flush()
        try:
            self._env.sync(True)
        except _lmdb.Error as err:
            raise self._write_error(err) from err
        finally:
            self._env.close()
        return [os.path.join(self.stem + ".lmdb", "data.mdb")]

    def _write_error(self, err: Exception) -> OSError:
        """liblmdb's error as an OSError naming the database (py-lmdb gives no errno)."""
        out = OSError(str(err))
        out.filename = self.path
        return out
