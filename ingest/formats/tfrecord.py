"""TFRecord files of ``tf.train.Example`` records, read and written without TensorFlow.

**Framing** (TensorFlow's ``record_writer``): every record is ``uint64 length`` (little endian), ``uint32``
masked CRC32C of those 8 bytes, ``length`` bytes of data, ``uint32`` masked CRC32C of the data, where
mask(crc) = ``((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2**32). The reader checks both CRCs unless
``check_crc=False``; a length is checked against the file size before anything is allocated.

**Index** (NVIDIA DALI's ``tfrecord2idx`` format): a text file, one ``offset size`` line per record, where
``size`` is the whole framed record (data + 16 bytes). ``TFRecordSource`` uses ``<shard>.idx`` beside each
shard (or the files named by ``index=``) and otherwise builds the index in memory by scanning the record
headers (one 12-byte read per record). Reading never writes files: `write_index` (and ``ingest index``)
writes index files, so a read-only dataset directory stays untouched and two readers never race on a cache.
An index entry that disagrees with the data is a `CorruptRecordError` naming the shard and offset.

**Compressed shards** (GZIP: ``.gz`` or the gzip magic; ZLIB: a zlib header) cannot be read at an offset: a
source with one is *streamed* (``streamed = True``, ``shards``, ``iter_shard``; see `ingest.formats.base`).

**Features.** ``features`` names the fields of a sample: ``{field name: spec}`` where a spec is a feature
key (kind taken from the key: ``image`` -> encoded image, ``label`` -> int, others from the first record's
feature type: int64 -> ints, float -> floats, bytes -> bytes), ``(key, kind)``, ``(key, Field)`` or a
`Field` (key = the field name); a pair may be a two-item list, as JSON gives it (``-s features=...``).
Kinds (`base.KINDS`) read as TensorFlow's ``FixedLenFeature`` / ``VarLenFeature`` would:
``int``/``float``/``bytes``/``text``/``image`` need exactly one value, ``ints``/``floats`` any number
(exactly ``Field.shape[0]`` when a shape is declared), ``pixels`` and ``array`` one bytes value shaped by
``Field.shape``/``dtype`` or by the sibling features ``<key>/shape`` (int64) and ``<key>/dtype`` (bytes) that
`TFRecordWriter` writes. Without a spec the common layouts are
inferred from the first record: the image from TF-slim/Inception/Object Detection keys (``image/encoded``,
``image``, ``image_raw``, ... holding an encoded image), the label from ``image/class/label``, ``label``,
...; every other int64/float feature becomes an ``ints``/``floats`` field named by its key (variable
length: one record says nothing about the others); a byte-string feature holding one value becomes a
``bytes`` field (``image/filename``), but for the Object Detection API's per-object lists (``image/object/...``)
and the features the writer derives from other fields (``image/format``, an array's ``/shape``). What no
field reads is listed in ``unread`` (and by ``ingest inspect``), and ``ingest convert`` refuses to leave it
out unless told to (``--drop``): name such a feature in a spec to read it.
A missing feature or one of the wrong type is a `CorruptRecordError` naming the file, offset and key.

**Detection** (the TensorFlow Object Detection API layout): a record holding ``image/object/bbox/xmin``,
``ymin``, ``xmax``, ``ymax`` (floats normalized to [0, 1]) and ``image/height``/``image/width`` is read with a
``boxes`` field: ``[N, 4]`` float32 boxes in pixels, xyxy or the ``box_format`` asked for (the source says
which, with ``relative = False``, so the pipeline's box-aware ops move them; `ingest.formats.boxes`), ``categories`` from
``image/object/class/label``, ``iscrowd`` from ``image/object/is_crowd``, ``area`` from ``image/object/area``
where present, and ``image_id`` from ``image/source_id`` when that holds a decimal id (the OD API's COCO
converter writes it so; other writers put a file name there, which is then not read). Name the raw keys in
a spec to read them as they are. `TFRecordWriter` writes this layout for a sample with a ``boxes`` field. The
native engine reads it too: `native_boxes` gives it the keys, and it scans each record's boxes as read here.

``tf.train.SequenceExample`` files: their context features are read with ``sequence=True`` (the feature
lists are not read); without it, such a file raises `SourceError` saying so.

**Batches** (`TFRecordSource.parse_batch`, what the loader calls): the compiled ``_wire`` scan locates every
feature of a batch's records in one call (the image as a view of the read buffer, not a copy out of a
protobuf message), for specs of one-value features (DeepLab's mask among them), int/float lists and the
Object Detection API's boxes (its four coordinate lists and the image size) and image ids, and checks their
CRCs with the crc32c package's own function (`_native_crc`) with the GIL released once per batch (else per
record here).
A record the scan does not take (anything but the canonical encoding, or a problem) is parsed with protobuf,
record by record, which reads it or names what is wrong. Records come out the same either way.

``labels()`` parses every record once (the label is inside the protobuf), lazily on first call, and caches
the result in the source.
"""

from __future__ import annotations

import gzip
import io
import os
import struct
import zlib
from typing import Any, Iterator, Mapping, Sequence

import crc32c
import numpy as np
from PIL import Image
from google.protobuf.message import DecodeError as ProtoDecodeError

from .._atomic import atomic_write
from ..errors import ConfigError, CorruptRecordError, SourceError
from . import _protos
from ._example import (OD_BOX_KEYS, OD_BOXES, OD_CLASS_TEXT, OD_KEYS, OD_SIZE_KEYS, OD_SOURCE_ID, field_value, infer_spec, normalize_spec,
                       parse_features, put, put_boxes, to_record, unread_keys, writer_spec)
from ._images import image_type
from ._native_table import NativeTable, NotNative, RecordBoxes
from ._shards import (CHUNK, GZIP_MAGIC, RecordTable, read_exact, read_index_rows, resolve_indexes,
                      resolve_shards)
from .base import Field, Location, Record, parse_or_error
from .boxes import DEFAULT as DEFAULT_BOXES, Conversion, box_format as check_box_format, convert_record

try:
    from . import _wire   # compiled (setup.py); without it every record is parsed with protobuf
except ImportError:
    _wire = None

HEADER = 12      # uint64 length + uint32 masked CRC of it
FOOTER = 4       # uint32 masked CRC of the data
FRAMING = HEADER + FOOTER
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_HEAD = struct.Struct("<QI")   # length, masked CRC of the length
_FOOT = struct.Struct("<I")    # masked CRC of the data

_COMPRESSIONS = ("auto", "none", "gzip", "zlib")


# -- framing ---------------------------------------------------------------------------------------

def masked_crc(data: Any) -> int:
    """TFRecord's masked CRC32C of ``data``. The GIL is kept (crc32c gives it up for buffers over 32 KB by
    default): a record's CRC is far shorter than the switch interval that getting the GIL back can cost beside
    a busy thread (docs/measurements.md, The GIL)."""
    crc = crc32c.crc32c(data, gil_release_mode=0)
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


def _native_crc() -> int:
    """The address of the crc32c package's own CRC32C function, for `_wire` to check a batch's CRCs with no
    Python call per record: ``uint32 f(uint32 crc, const uint8 *data, size_t n)``, conditioned as
    ``crc32c(data) == f(0xFFFFFFFF, data, n) ^ 0xFFFFFFFF``. Its symbols are the package's internals (crc32c
    2.x: ``_crc32c_hw_adler`` where the CPU has SSE 4.2, else ``_crc32c_sw_slicing_by_8``), so the function is
    used only if it gives `crc32c.crc32c`'s results on test data; 0 otherwise (CRCs are then checked here)."""
    if _wire is None:
        return 0
    try:
        import ctypes

        lib = ctypes.CDLL(crc32c._crc32c.__file__)
        lib._crc32c_intel_probe.restype = ctypes.c_int
        fn = lib._crc32c_hw_adler if lib._crc32c_intel_probe() else lib._crc32c_sw_slicing_by_8
        fn.restype, fn.argtypes = ctypes.c_uint32, [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]
        samples = [b"", b"a", bytes(range(256)) * 37 + b"tail", np.random.default_rng(0).bytes(100_003)]
        if all(fn(_U32, s, len(s)) ^ _U32 == crc32c.crc32c(s) for s in samples):
            return ctypes.cast(fn, ctypes.c_void_p).value or 0
    except (AttributeError, OSError):
        pass
    return 0


_CRC = _native_crc()


def frame(data: bytes) -> bytes:
    """One framed TFRecord record holding ``data``."""
    length = len(data).to_bytes(8, "little")
    return b"".join((length, masked_crc(length).to_bytes(4, "little"), data,
                     masked_crc(data).to_bytes(4, "little")))


def crc_error(which: str, *, path: str, offset: int, index: Any = None) -> CorruptRecordError:
    """The error of a record whose masked CRC of its ``which`` ("length" or "data") fails (the readers' and the
    native engine's)."""
    what = "bad length CRC in the record header (not a TFRecord, or corrupt)" if which == "length" else \
        "bad data CRC"
    return CorruptRecordError(what, path=path, index=index, offset=offset)


def _header_length(head: Any, path: str, offset: int, check_crc: bool, index: Any = None) -> int:
    """The data length in a 12-byte record header, its CRC checked."""
    length = int.from_bytes(head[:8], "little")
    if check_crc and masked_crc(head[:8]) != int.from_bytes(head[8:12], "little"):
        raise crc_error("length", path=path, index=index, offset=offset)
    return length


def unframe(raw: Any, path: str, offset: int, *, check_crc: bool = True, index: Any = None) -> memoryview:
    """The data of one whole framed record ``raw`` (exactly one record), framing and CRCs checked; errors
    name ``path``, sample ``index`` and ``offset``."""
    mv = memoryview(raw)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    size = len(mv)
    if size < FRAMING:
        raise CorruptRecordError(f"truncated record: {size} bytes, a record has at least {FRAMING}",
                                 path=path, index=index, offset=offset)
    length, length_crc = _HEAD.unpack_from(mv)
    if check_crc and masked_crc(mv[:8]) != length_crc:
        raise crc_error("length", path=path, index=index, offset=offset)
    if length + FRAMING != size:
        raise CorruptRecordError(f"record header says {length} data bytes but the index gives the record "
                                 f"{size} bytes ({size - FRAMING} of data): index and data disagree",
                                 path=path, index=index, offset=offset)
    data = mv[HEADER:size - FOOTER]
    if check_crc and masked_crc(data) != _FOOT.unpack_from(mv, size - FOOTER)[0]:
        raise crc_error("data", path=path, index=index, offset=offset)
    return data


def scan(path: str, *, check_crc: bool = True) -> np.ndarray:
    """Index an uncompressed TFRecord file by reading its record headers: an ``[N, 2]`` int64 array of
    ``(offset, size)``, size including the framing. Data CRCs are not checked here (parsing checks them)."""
    size = os.path.getsize(path)
    entries = []
    with open(path, "rb") as f:
        offset = 0
        while offset < size:
            f.seek(offset)
            head = f.read(HEADER)
            if len(head) < HEADER:
                raise CorruptRecordError(f"truncated record header: {len(head)} of {HEADER} bytes at the end "
                                         f"of the file", path=path, offset=offset)
            length = _header_length(head, path, offset, check_crc)
            if length > size - offset - FRAMING:
                raise CorruptRecordError(f"record length {length} runs past the end of the file "
                                         f"({size} bytes)", path=path, offset=offset)
            entries.append((offset, length + FRAMING))
            offset += length + FRAMING
    return np.array(entries, dtype=np.int64).reshape(-1, 2)


def read_index(index_path: str, shard: str) -> np.ndarray:
    """A DALI ``tfrecord2idx`` index file as an ``[N, 2]`` array of ``(offset, size)``, each entry checked
    to lie inside ``shard``, and the entries checked to tile the shard: the first at byte 0, each where the
    one before ends, the last ending at the end of the file (what ``tfrecord2idx`` writes). So an index
    with a line dropped, repeated or edited, or an empty one, is a CorruptRecordError naming it and the
    entry; that each entry starts a record is checked when it is read (its header's length and CRC)."""
    def row(words, size):
        offset, length = int(words[0]), int(words[1])
        return (offset, length) if offset >= 0 and length >= FRAMING and offset + length <= size else None

    rows, size = read_index_rows(index_path, shard, row, "offset size")
    table = np.array(rows, dtype=np.int64).reshape(-1, 2)
    starts = np.concatenate([[0], table[:, 0] + table[:, 1]])   # where each entry must start, then the end
    wrong = np.flatnonzero(table[:, 0] != starts[:-1])
    if len(wrong):
        k = int(wrong[0])
        raise CorruptRecordError(f"index entry {k + 1} starts at byte {int(table[k, 0])}, but the entry before "
                                 f"ends at byte {int(starts[k])} (a dropped, repeated or edited line?)",
                                 path=index_path, offset=int(table[k, 0]))
    if starts[-1] != size:
        raise CorruptRecordError(f"index entries end at byte {int(starts[-1])}, but {shard} holds {size} bytes (a "
                                 "dropped line, or an index of another file?)", path=index_path,
                                 offset=int(starts[-1]))
    return table


def write_index(shard: str, index_path: str | None = None, *, check_crc: bool = True) -> str:
    """Write the DALI-format index of an uncompressed TFRecord shard (default ``<shard>.idx``), through a
    temporary name; returns its path."""
    if _compression(shard, "auto") != "none":
        raise SourceError(f"{shard} is compressed: compressed TFRecords cannot be indexed (read them streamed)",
                          path=shard)
    index_path = index_path or shard + ".idx"
    _write_index_file(index_path, scan(shard, check_crc=check_crc))
    return index_path


def _write_index_file(index_path: str, entries: Any) -> None:
    with atomic_write(index_path) as f:
        f.writelines(f"{int(o)} {int(s)}\n" for o, s in entries)


# -- compressed streams ----------------------------------------------------------------------------

class _ZlibReader(io.RawIOBase):
    """A ZLIB stream (TFRecordOptions compression 'ZLIB') as a readable file, decompressed in bounded steps."""

    def __init__(self, f):
        self._f = f
        self._d = zlib.decompressobj()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while True:
            if self._d.unconsumed_tail:
                data = self._d.decompress(self._d.unconsumed_tail, len(b))
            elif self._d.eof:
                return 0
            else:
                chunk = self._f.read(CHUNK)
                if not chunk:
                    raise EOFError("compressed stream ended before its end marker")
                data = self._d.decompress(chunk, len(b))
            if data:
                b[:len(data)] = data
                return len(data)

    def close(self) -> None:
        self._f.close()
        super().close()


def _compression(path: str, compression: str) -> str:
    """'none', 'gzip' or 'zlib' for ``path``: as given, or detected ('auto') from the first bytes: a valid
    TFRecord header first, then the gzip magic, then a zlib header."""
    if compression != "auto":
        return compression
    with open(path, "rb") as f:
        head = f.read(HEADER)
    if not head or (len(head) == HEADER and masked_crc(head[:8]) == int.from_bytes(head[8:], "little")):
        return "none"
    if head.startswith(GZIP_MAGIC) or path.lower().endswith(".gz"):
        return "gzip"
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib"
    return "none"  # not a TFRecord: the scan reports where


def _open_stream(path: str, compression: str):
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "zlib":
        return io.BufferedReader(_ZlibReader(open(path, "rb")), CHUNK)
    return open(path, "rb")


def iter_stream(path: str, compression: str = "auto", *, check_crc: bool = True) -> Iterator[tuple[int, bytes]]:
    """Every record of a (possibly compressed) TFRecord file in order, as ``(offset, data)``; offsets are in
    the decompressed stream. Compression and framing errors raise CorruptRecordError."""
    compression = _compression(path, compression)
    where = " (offset in the decompressed stream)" if compression != "none" else ""
    offset = 0
    try:
        with _open_stream(path, compression) as f:
            while True:
                head = f.read(HEADER)
                if not head:
                    return
                if len(head) < HEADER:
                    raise CorruptRecordError(f"truncated record header{where}", path=path, offset=offset)
                length = _header_length(head, path, offset, check_crc)
                body = read_exact(f, length + FOOTER, path, offset, f"record{where}")
                if check_crc and masked_crc(body[:length]) != int.from_bytes(body[length:], "little"):
                    raise CorruptRecordError(f"bad data CRC{where}", path=path, offset=offset)
                yield offset, body[:length]
                offset += length + FRAMING
    except (OSError, EOFError, zlib.error) as err:
        raise CorruptRecordError(f"{compression} stream is corrupt or truncated in the record at this offset of "
                                 f"the decompressed stream: {err}", path=path, offset=offset) from err


# -- the source ------------------------------------------------------------------------------------

_NOT_SHARDS = (".idx", ".json", ".txt", ".md", ".tmp", ".part", ".partial")


def is_shard_name(name: str) -> bool:
    """Whether a file in a dataset directory is a TFRecord shard: its name says 'record' and it is not an
    index, a manifest, a note or a partial write."""
    low = name.lower()
    return "record" in low and not low.endswith(_NOT_SHARDS) and not low.startswith((".", "_"))


def starts_with_record(path: str) -> bool:
    """Whether a file begins with a TFRecord record header (a length and its masked CRC), plain or inside a
    gzip or zlib stream: how a directory's shards without an extension are told (`_shards.resolve_shards`)."""
    try:
        with _open_stream(path, _compression(path, "auto")) as f:
            head = f.read(HEADER)
    except (OSError, EOFError, zlib.error):
        return False
    return len(head) == HEADER and masked_crc(head[:8]) == int.from_bytes(head[8:], "little")


def find_shards(path: str | os.PathLike | Sequence[str]) -> list[str]:
    """The TFRecord shards at ``path``: a file, a list, a glob or a directory (`_shards.resolve_shards`; in a
    directory, files named as shards and extension-less files that start with a record, as TF-slim's
    ``train-00000-of-00004``)."""
    return resolve_shards(path, is_shard_name, "TFRecord", starts_with_record)


class TFRecordSource:
    """Samples of TFRecord shards: ``path`` is a file, a list or glob of shards, or a directory of them
    (files whose name contains ``record``, e.g. ``*.tfrecord``, ``*.record``, ``data_tfrecord-*.gz``).

    Options: ``features`` (the feature spec, see the module docstring), ``index`` (index file(s) for the
    shards: a path, a list aligned with the shards or a directory of ``<shard name>.idx``; default
    ``<shard>.idx`` where present), ``check_crc`` (default True), ``compression`` ('auto', 'none', 'gzip',
    'zlib'), ``sequence`` (read the context of SequenceExample records), ``classes`` (class names),
    ``box_format`` (of Object Detection API boxes: "xyxy", "xywh" or "cxcywh" pixels; `ingest.formats.boxes`).
    """

    def __init__(self, path: str | os.PathLike | Sequence[str], *, features: Mapping[str, Any] | None = None,
                 index: Any = None, check_crc: bool = True, compression: str = "auto", sequence: bool = False,
                 classes: Sequence[str] = (), box_format: str = DEFAULT_BOXES):
        box_format = check_box_format(box_format)
        compression = str(compression).lower()
        if compression not in _COMPRESSIONS:
            raise ConfigError(f"Unknown compression {compression!r}. Available: {', '.join(_COMPRESSIONS)}")
        self.shards = find_shards(path)
        self.check_crc = bool(check_crc)
        self.classes = list(classes)
        self._compression = [_compression(s, compression) for s in self.shards]
        self.streamed = any(c != "none" for c in self._compression)
        if self.streamed:
            if index is not None:
                raise ConfigError("`index` cannot be used with compressed TFRecords (they are read streamed)")
            self._table = None
        else:
            indexes = resolve_indexes(index, self.shards, lambda shard: shard + ".idx")
            tables = [read_index(idx, s) if idx else scan(s, check_crc=self.check_crc)
                      for s, idx in zip(self.shards, indexes)]
            self._table = RecordTable(self.shards, tables)
        first = self._first_record(sequence)
        self._spec = normalize_spec(features, first) if features is not None else \
            (infer_spec(first) if first is not None else {})
        self.fields = {name: field for name, (_, field) in self._spec.items()}
        self._unread = unread_keys(first, self._spec) if first is not None else {}
        self._boxes = None
        if self._spec.get("boxes", ("",))[0] == OD_BOXES:   # Object Detection API boxes: xyxy pixels, converted
            self.box_format, self.relative = box_format, False
            self._boxes = None if box_format == "xyxy" else Conversion("xyxy", box_format)
        self._labels: np.ndarray | None = None
        self._scan = _scan_plan(self._spec) if not self.streamed else None

    @property
    def unread(self) -> dict[str, str]:
        """Feature keys of the first record no field reads, each with how to read it: what a conversion would
        lose (`ingest convert` refuses them unless dropped). The OD API's class names are not lost where
        ``classes`` names the categories (the writer writes them again from it)."""
        spec = "name it in a feature spec (-s features='{...}')"
        return {key: f"a {kind} the reader does not read: {spec}" for key, kind in self._unread.items()
                if not (key == OD_CLASS_TEXT and self.classes and self._spec.get("categories", ("",))[0]
                        == OD_KEYS["categories"])}

    def _first_record(self, sequence: bool) -> Any:
        """The feature map of the first record (None for an empty dataset); refuses SequenceExample files
        unless ``sequence``."""
        for k, shard in enumerate(self.shards):
            if self.streamed:
                data = next((d for _, d in iter_stream(shard, self._compression[k], check_crc=self.check_crc)),
                            None)
                offset = 0
            elif self._table.starts[k + 1] > self._table.starts[k]:
                offset = self._table.offsets[self._table.starts[k]]
                data = self._read_data(k, self._table.starts[k])
            else:
                continue
            if data is None:
                continue
            try:
                seq = _protos.SequenceExample.FromString(data)
            except ProtoDecodeError as err:
                raise CorruptRecordError(f"not a tf.train.Example: {err}", path=shard, offset=offset) from None
            if len(seq.feature_lists.feature_list) and not sequence:
                raise SourceError(f"{shard} holds tf.train.SequenceExample records (feature lists "
                                  f"{sorted(seq.feature_lists.feature_list)[:5]}); pass sequence=True to read "
                                  f"their context features {sorted(seq.context.feature)[:5]} (feature lists are "
                                  f"not read)", path=shard)
            return seq.context.feature
        return None

    def _read_data(self, k: int, i: int) -> memoryview:
        offset, size = self._table.offsets[i], self._table.sizes[i]
        with open(self.shards[k], "rb") as f:
            f.seek(offset)
            raw = f.read(size)
        return unframe(raw, self.shards[k], offset, check_crc=self.check_crc, index=i)

    # -- seekable (uncompressed) -------------------------------------------------------------------
    def _seekable(self) -> None:
        if self.streamed:
            raise SourceError("compressed TFRecords cannot be read at an offset: read them with iter_shard "
                              "(the Loader streams them)", path=self.shards[0])

    def __len__(self) -> int:
        if self.streamed:
            raise TypeError("a compressed (streamed) TFRecord source has no length until it is read")
        return len(self._table)

    def locate(self, i: int) -> Location:
        self._seekable()
        return self._table.location(i)

    def parse(self, i: int, raw: Any) -> Record:
        table = self._table
        if table is None:
            self._seekable()
        path, offset = table.shards[table.shard_of[i]], table.offsets[i]
        data = unframe(raw, path, offset, check_crc=self.check_crc, index=i)
        return convert_record(to_record(parse_features(data, path, i, offset), self._spec, path, i, offset),
                              self._boxes)

    def parse_batch(self, indices: Sequence[int], raws: Sequence[Any]) -> list[Record | Exception]:
        """`parse` of each record (a Record, or the error it raised), the batch scanned in one native call
        where the spec allows it (module docstring)."""
        if self._scan is None or not raws:
            return [parse_or_error(self, i, raw) for i, raw in zip(indices, raws)]
        keys, codes, fields = self._scan
        out = np.empty((len(raws), 5 + 2 * len(keys)), dtype=np.int64)
        side = np.empty(_SIDE * len(raws) if any(c in b"IF" for c in codes) else 0, dtype=np.int64)
        native_crc = _CRC if self.check_crc else 0
        _wire.examples(raws, keys, codes, out, side, native_crc)
        rows = out.tolist()
        numbers = out.view(np.float64).tolist() if b"f" in codes else rows
        side_floats = side.view(np.float64)
        check = self.check_crc and not native_crc
        parsed: list[Record | Exception] = []
        for i, raw, row, number in zip(indices, raws, rows, numbers):
            record = None
            if not row[0] and not (check and (masked_crc(raw[:8]) != row[2]
                                              or masked_crc(raw[HEADER:HEADER + row[1]]) != row[3])):
                record = _scanned(raw, row, number, fields, side, side_floats)
                if record is not None:
                    record = convert_record(record, self._boxes)
            parsed.append(record if record is not None else parse_or_error(self, i, raw))
        return parsed

    def labels(self) -> np.ndarray:
        """Every sample's label (int64, -1 without a label field): parses every record once, then cached."""
        self._seekable()
        if self._labels is None:
            table = self._table
            labels = np.full(len(table), -1, dtype=np.int64)
            if "label" in self._spec:
                key, field = self._spec["label"]
                for i, shard, offset, raw in table.read_each():
                    data = unframe(raw, shard, offset, check_crc=self.check_crc, index=i)
                    labels[i] = field_value(parse_features(data, shard, i, offset), key, field, shard, i, offset)
            self._labels = labels
        return self._labels

    def name(self, i: int) -> str:
        self._seekable()
        i = self._table.index(i)
        return f"{self._table.path(i)}:{self._table.offsets[i]}"

    def native_table(self) -> NativeTable:
        """Every record's byte range for the native engine (kind "tfrecord"), which checks each record's framing
        and, with ``check_crc``, both its CRCs, and finds the image, label and mask features in its Example with the
        scan `parse_batch` runs (``ingest/_native/example_scan.h``); records it does not take go to `parse`.
        `NotNative` for compressed shards and for a spec other than an encoded image, an optional int label and an
        optional mask (DeepLab's ``image/segmentation/class/encoded``, for one), or the Object Detection API's
        boxes and the fields `native_boxes` gives."""
        if self.streamed:
            raise NotNative("compressed TFRecords are read streamed, not at offsets")
        spec = self._spec
        kinds = {name: field.kind for name, (_, field) in spec.items()}
        boxes = self.native_boxes() if "boxes" in spec else None   # (NotNative where the engine cannot scan them)
        masks = [name for name in set(kinds) - {"image", "label"} if kinds[name] == "mask"]
        rest = set(kinds) - {"image", "label", *masks}
        if boxes is not None:
            rest -= {"boxes", *boxes.per_box, *boxes.per_sample}
        if kinds.get("image") != "image" or kinds.get("label", "int") != "int" or len(masks) > 1 or rest:
            raise NotNative(f"it reads encoded images with an optional int label and an optional mask (or the Object "
                            f"Detection API's boxes and fields), not the fields {kinds}")
        keys = tuple(spec[name][0].encode("utf-8") for name in ("image", "label") if name in spec)
        mask = (masks[0], spec[masks[0]][0].encode("utf-8")) if masks else None
        t = self._table
        return NativeTable(t.shards, np.frombuffer(t.shard_of, np.intc).astype(np.int64),
                           np.frombuffer(t.offsets, np.int64), np.frombuffer(t.sizes, np.int64), None, "tfrecord",
                           keys=keys, record_crc=self.check_crc, mask=mask)

    def native_boxes(self) -> RecordBoxes:
        """Where the native engine finds each record's boxes and fields (`RecordBoxes`): the Object Detection API's
        keys of this spec, which it scans out of every record it reads and converts as `parse` does. `NotNative`
        for boxes that are not the OD API's (``image/object/bbox``) and for a field besides the image, label and
        boxes that is not an int or float list (one value per box) or one int (``image/source_id``'s decimal id
        among them)."""
        if self.streamed:
            raise NotNative("compressed TFRecords are read streamed, not at offsets")
        if self._spec.get("boxes", ("",))[0] != OD_BOXES:
            raise NotNative(f"its boxes are not the Object Detection API's ({OD_BOXES}/xmin, ...)")
        per_box, per_sample = {}, {}
        for name, (key, field) in self._spec.items():
            if name in ("image", "label", "boxes"):
                continue
            if field.kind in ("ints", "floats") and field.shape is None:
                per_box[name] = (key, field.kind)
            elif field.kind == "int":
                per_sample[name] = (key, "decimal" if key == OD_SOURCE_ID else "int")
            else:
                raise NotNative(f"its field {name!r} ({field.kind}{' of a fixed shape' if field.shape else ''}) is "
                                "not one the engine scans out of a record with its boxes (int or float lists, one "
                                "int)")
        return RecordBoxes(OD_BOX_KEYS + OD_SIZE_KEYS, per_box, per_sample)

    # -- streamed (compressed) ---------------------------------------------------------------------
    def iter_shard(self, k: int, skip: int = 0) -> Iterator[tuple[str, Record]]:
        """The samples of shard ``k`` in order, after the first ``skip``, as ``(name, Record)``. A framing or
        parse error ends the shard with a CorruptRecordError (a stream cannot resynchronise)."""
        shard = self.shards[k]
        for n, (offset, data) in enumerate(iter_stream(shard, self._compression[k], check_crc=self.check_crc)):
            if n >= skip:
                fmap = parse_features(data, shard, n, offset)
                yield f"{shard}#{n}", convert_record(to_record(fmap, self._spec, shard, n, offset), self._boxes)

    def __repr__(self) -> str:
        size = "streamed" if self.streamed else f"{len(self)} records"
        return f"TFRecordSource({len(self.shards)} shards, {size}, fields {sorted(self.fields)})"


# -- batches scanned natively ----------------------------------------------------------------------

#: Field kind -> `_wire` kind code (``b``: one bytes value, ``i`` one int64, ``f`` one float, ``I``/``F``
#: a list). The Object Detection API's boxes are asked as their four coordinate lists and the image size, its
#: image id as one bytes value; pixels and other arrays are parsed with protobuf.
_SCAN_CODES = {"image": "b", "mask": "b", "bytes": "b", "text": "b", "int": "i", "float": "f", "ints": "I",
               "floats": "F"}
#: List values room per record in a scanned batch; a batch with more takes its last records through protobuf.
_SIDE = 256


def _scan_plan(spec: Mapping[str, tuple[str, Field]]) -> tuple[list[bytes], bytes, list] | None:
    """What `_wire.examples` is asked for a spec: keys, kind codes and ``(name, kind, shape)`` per field (kind
    ``od_boxes``: six keys, ``od_id``: the decimal image id); None where the scan was not built or a field
    needs protobuf."""
    if _wire is None or not spec:
        return None
    keys, codes, fields = [], "", []
    for name, (key, field) in spec.items():
        kind = field.kind
        if key == OD_BOXES:
            kind, asked, code = "od_boxes", OD_BOX_KEYS + OD_SIZE_KEYS, "FFFFii"
        elif key == OD_SOURCE_ID and kind == "int":
            kind, asked, code = "od_id", (key,), "b"
        else:
            asked, code = (key,), _SCAN_CODES.get(kind)
            if code is None:
                return None
        keys.extend(k.encode("utf-8") for k in asked)
        codes += code
        fields.append((name, kind, None if field.shape is None else tuple(field.shape)))
    return (keys, codes.encode("ascii"), fields) if len(keys) <= 64 else None


def _scanned(raw: Any, row: list, number: list, fields: list, side: np.ndarray,
             side_floats: np.ndarray) -> Record | None:
    """The Record of a record `_wire` took (``row``: its output row; ``number``: the same as float64), or None
    where a value needs protobuf's path to read it or to name its problem (an empty image or mask, text that is
    not UTF-8, a list of the wrong length)."""
    values = {}
    at = 5
    for name, kind, shape in fields:
        a, b = row[at], row[at + 1]
        if kind in ("image", "mask") and not b:
            return None
        if kind == "image":
            value = raw[a:a + b]
        elif kind in ("mask", "bytes"):
            value = bytes(raw[a:a + b])
        elif kind == "text":
            try:
                value = bytes(raw[a:a + b]).decode("utf-8")
            except UnicodeDecodeError:
                return None
        elif kind == "int":
            value = a
        elif kind == "float":
            value = number[at]
        elif kind == "od_id":
            value = bytes(raw[a:a + b])
            if not value.isdigit():
                return None
            value = int(value)
        elif kind == "od_boxes":
            value = _od_boxes(row[at:at + 12], side_floats)
            if value is None:
                return None
            at += 10
        else:
            if shape is not None and shape != (b,):
                return None
            value = side[a:a + b].copy() if kind == "ints" else side_floats[a:a + b].astype(np.float32)
        values[name] = value
        at += 2
    return Record(values.pop("image", None), values.pop("label", -1), values)


def _od_boxes(cells: list, side_floats: np.ndarray) -> np.ndarray | None:
    """`_example.Extract.od_boxes` on scanned cells (four coordinate lists in `side`, then height and width):
    ``[N, 4]`` float32 boxes in pixels; None where the lists differ in length or the size is not positive."""
    count, height, width = cells[1], cells[8], cells[10]
    if any(cells[k] != count for k in (3, 5, 7)) or height <= 0 or width <= 0:
        return None
    coords = [side_floats[cells[k]:cells[k] + count] for k in (0, 2, 4, 6)]
    return (np.stack(coords, axis=1).reshape(-1, 4) * (width, height, width, height)).astype(np.float32)


def reader_spec(fields: Mapping[str, Field], writer: Mapping[str, Any]) -> dict[str, Any]:
    """The reader options that read shards `TFRecordWriter` wrote for ``fields`` (with writer options
    ``writer``) back with every field as written: `open_source` uses them for a converter output."""
    keys = writer.get("keys")
    return {"features": writer_spec(fields, keys if isinstance(keys, Mapping) else None)}


# -- the writer ------------------------------------------------------------------------------------

class TFRecordWriter:
    """Writes one shard ``<stem>.tfrecord`` of ``tf.train.Example`` records plus its DALI index
    ``<stem>.tfrecord.idx`` (with ``compression="gzip"``: ``<stem>.tfrecord.gz`` and no index).

    Feature keys: ``keys`` maps field names to keys; by default 'image' -> ``image/encoded`` (plus
    ``image/format``; pixels -> ``image/raw`` plus ``image/raw/shape``), 'label' -> ``image/class/label``,
    any other field -> its name; with an image and a ``boxes`` array, the detection fields take the Object
    Detection API keys (module docstring): the boxes, in ``box_format`` (`ingest.formats.boxes`; in pixels or,
    ``relative``, divided by the image size) are written as ltrb coordinates normalized by the image's
    stored size (its header's, or a pixel array's shape) with ``image/height`` and ``image/width``,
    ``image_id`` as the decimal string ``image/source_id`` and, given ``classes``, each category's name as
    ``image/object/class/text`` (its id where ``classes`` has no name for it). Kinds map to lists as `TFRecordSource` reads them: int/ints -> int64_list,
    float/floats -> float_list, image/bytes/text -> one bytes value, pixels/array -> the raw little-endian
    bytes plus ``<key>/shape`` (and ``<key>/dtype`` for arrays). Maps are serialized deterministically, so
    the same records give the same bytes. `writer_spec` gives the ``features`` spec that reads them back.
    """

    def __init__(self, directory: str | os.PathLike, stem: str, fields: Mapping[str, Field], *,
                 keys: Mapping[str, str] | None = None, compression: str | None = None,
                 classes: Sequence[str] = (), box_format: str = DEFAULT_BOXES, relative: bool = False):
        if compression not in (None, "gzip"):
            raise ConfigError(f"Unknown compression {compression!r}. Available: None, gzip")
        box_format = check_box_format(box_format)
        self.classes, self.box_format, self.relative = [str(c) for c in classes], box_format, bool(relative)
        bad = [n for n, f in fields.items() if not isinstance(f, Field)]
        if bad:
            raise ConfigError(f"fields must map names to Field, got {bad}")
        self.fields = dict(fields)
        self._keys = {name: key for name, (key, _) in writer_spec(self.fields, keys).items()}
        self.directory = os.fspath(directory)
        self._name = f"{stem}.tfrecord" + (".gz" if compression else "")
        self._raw = open(os.path.join(self.directory, self._name), "wb")
        # no file name and time in the gzip header: the bytes depend on the records only
        self._file = gzip.GzipFile(fileobj=self._raw, mode="wb", filename="", mtime=0) if compression else self._raw
        self._compressed = compression is not None
        self._entries: list[tuple[int, int]] = []
        self._offset = 0

    def add(self, record: Record) -> None:
        example = _protos.Example()
        fmap = example.features.feature
        for name, field in self.fields.items():
            try:
                value = record.get(name)
            except KeyError:
                raise ConfigError(f"record has no field {name!r} (declared: {sorted(self.fields)})") from None
            if self._keys[name] == OD_BOXES:
                put_boxes(fmap, value, _image_size(record.image, self.fields["image"].kind),
                          self.box_format, self.relative)
                continue
            put(fmap, self._keys[name], field, value)
            if self.classes and name == "categories" and self._keys[name] == "image/object/class/label":
                fmap[OD_CLASS_TEXT].bytes_list.value.extend(self._class_text(value))
            if name == "image" and field.kind == "image" and self._keys[name] == "image/encoded":
                fmap["image/format"].bytes_list.value.append((image_type(value) or "").encode())
        data = frame(example.SerializeToString(deterministic=True))
        self._file.write(data)
        self._entries.append((self._offset, len(data)))
        self._offset += len(data)

    def _class_text(self, categories: Any) -> list[bytes]:
        """The class name of each category id (the id itself where ``classes`` has no name for it)."""
        ids = np.atleast_1d(np.asarray(categories, dtype=np.int64)).tolist()
        return [(self.classes[c] if 0 <= c < len(self.classes) else str(c)).encode("utf-8") for c in ids]

    def close(self) -> list[str]:
        """Finish the shard (and write its index); returns the file names written."""
        if self._raw.closed:
            return self._written()
        self._file.close()
        self._raw.close()
        if not self._compressed:
            _write_index_file(os.path.join(self.directory, self._name + ".idx"), self._entries)
        return self._written()

    def _written(self) -> list[str]:
        return [self._name] if self._compressed else [self._name, self._name + ".idx"]


def _image_size(image: Any, kind: str) -> tuple[int, int]:
    """``(height, width)`` of a record's image as stored (pixels: its array; encoded: the header's size, EXIF
    orientation not applied, as COCO's and the OD API's image sizes are), to normalize its boxes."""
    if kind == "pixels":
        shape = np.shape(image)
        return int(shape[0]), int(shape[1])
    try:
        with Image.open(io.BytesIO(bytes(image))) as img:
            return img.height, img.width
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise ConfigError(f"cannot read the size of the image to normalize its boxes: {err}") from None
