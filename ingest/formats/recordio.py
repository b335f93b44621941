"""MXNet RecordIO (``.rec``) files as im2rec writes them, read and written without MXNet.

**Framing** (dmlc-core ``recordio``): a record is one or more chunks, each ``uint32`` magic ``0xced7230a``,
``uint32 lrec`` (upper 3 bits: continuation flag ``cflag``, lower 29 bits: ``length``), ``length`` bytes,
zero padding to a multiple of 4. The writer splits a record wherever its data holds the magic at a 4-byte
aligned position: chunk flags 1 (first), 2 (middle), 3 (last), 0 for an unsplit record; the reader
joins the chunks with the magic put back between them.

**Payload** (``mxnet.recordio.pack``): an ``IRHeader`` ``struct '<IfQQ'`` (flag, label, id, id2), then,
when ``flag > 0``, ``flag`` float32 labels, then the encoded image. Fields of a sample:

- ``image``: the encoded image bytes, a uint8 array viewing the buffer read (a record with none is a
  `CorruptRecordError`);
- ``label`` (int): the header's label when ``flag == 0`` and it is a class index (a whole number from 0 to
  2**31 - 1), else -1;
- ``label_values`` (floats): every label as float32: ``[label]`` when ``flag == 0``, the ``flag`` values
  otherwise (multi-value labels, detection boxes packed by im2rec);
- ``id`` (int): the header's id (a uint64 seen as int64).

**Index** (``MXIndexedRecordIO``): ``<name>.idx`` beside ``<name>.rec``, lines ``key<TAB>offset``. Used when
present (or given as ``index=``), built by scanning the chunk headers when not; reading never writes it.
Samples are in file order (index entries sorted by offset), so both ways give the same order. A record's
extent is the gap to the next indexed offset. The index must list every record: its first offset is 0 and
no offset repeats (checked when it is read); an offset that does not start a record, or a record that does
not fill its extent exactly (a dropped line leaves two records in one extent), is a `CorruptRecordError`
naming the file and offset when that record is read.

`RecordIOWriter` writes ``<stem>.rec`` and ``<stem>.idx`` (keys 0, 1, ...) that MXNet's ``MXIndexedRecordIO``
+ ``recordio.unpack`` read, and ``<stem>.crc32c``, each record's CRC32C, which the reader checks as records
are read (``check``: `ingest.formats.checks`): the CRC of the record's whole extent (chunk headers, data and
padding, the bytes the index gives it), as the native engine checks it too. It writes no ``.lst``: that is
im2rec's input, not read back by MXNet's readers.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Mapping, Sequence

import numpy as np

from .._atomic import atomic_write
from ..errors import ConfigError, CorruptRecordError
from . import checks
from ._native_table import NativeTable
from ._shards import RecordTable, read_index_rows, resolve_indexes, resolve_shards
from .base import Field, Location, Record, batch_structs, parse_or_error, read_location

MAGIC = 0xCED7230A
_MAGIC_BYTES = MAGIC.to_bytes(4, "little")
_CHUNK_HEADER = struct.Struct("<II")
IR_HEADER = struct.Struct("<IfQQ")   # flag, label, id, id2
_FIRST = struct.Struct("<IIIfQQ")    # a chunk header and the IRHeader after it
_LEN_MASK = (1 << 29) - 1
#: `_FIRST` as a numpy record, to read a batch's headers at once (`RecordIOSource.parse_batch`)
_FIRST_DTYPE = np.dtype([("magic", "<u4"), ("lrec", "<u4"), ("flag", "<u4"), ("label", "<f4"), ("id", "<i8"),
                         ("id2", "<u8")])
MAX_LENGTH = _LEN_MASK               # a chunk holds at most 2**29 - 1 bytes

FIELDS = {"image": Field("image"), "label": Field("int"), "label_values": Field("floats"), "id": Field("int")}


def _pad4(n: int) -> int:
    return (n + 3) & ~3


def is_shard_name(name: str) -> bool:
    """Whether a file in a dataset directory is a RecordIO shard (``.rec``)."""
    return name.lower().endswith(".rec")


def find_shards(path: str | os.PathLike | Sequence[str]) -> list[str]:
    """The ``.rec`` files at ``path``: a file, a list, a glob or a directory (`_shards.resolve_shards`)."""
    return resolve_shards(path, is_shard_name, "RecordIO")


def _index_of(shard: str) -> str:
    return os.path.splitext(shard)[0] + ".idx"


# -- framing ---------------------------------------------------------------------------------------

def _chunk(pos: int, offset: int) -> str:
    """Where a chunk is, when it is not the first of its record."""
    return f" in the chunk at byte {offset + pos}" if pos else ""


def _chunk_header(head: Any, path: str, offset: int, pos: int = 0, index: Any = None) -> tuple[int, int]:
    """(cflag, length) of the chunk header ``head`` (8 bytes), ``pos`` bytes into the record at ``offset``."""
    if len(head) < _CHUNK_HEADER.size:
        raise CorruptRecordError(f"truncated chunk header{_chunk(pos, offset)}", path=path, index=index,
                                 offset=offset)
    magic, lrec = _CHUNK_HEADER.unpack_from(head)
    if magic != MAGIC:
        raise CorruptRecordError(f"wrong magic 0x{magic:08x}{_chunk(pos, offset)} (expected 0x{MAGIC:08x}): not "
                                 f"the start of a RecordIO record", path=path, index=index, offset=offset)
    return lrec >> 29, lrec & _LEN_MASK


def _expect_flag(cflag: int, first: bool, path: str, offset: int, pos: int, index: Any = None) -> None:
    if cflag > 3 or (first and cflag not in (0, 1)) or (not first and cflag not in (2, 3)):
        kind = "first chunk" if first else "continuation chunk"
        raise CorruptRecordError(f"continuation flag {cflag} cannot start a {kind}{_chunk(pos, offset)}",
                                 path=path, index=index, offset=offset)


def unchunk(raw: Any, path: str, offset: int, index: Any = None) -> tuple[bytes, int]:
    """The data of the record at the start of ``raw`` (chunks joined, magic re-inserted) and the number of
    bytes it spans. Bytes after it are left alone (an index may skip records)."""
    buf = memoryview(raw).cast("B") if not isinstance(raw, (bytes, bytearray)) else raw
    parts, pos = [], 0
    while True:
        cflag, length = _chunk_header(buf[pos:pos + _CHUNK_HEADER.size], path, offset, pos, index)
        _expect_flag(cflag, not parts, path, offset, pos, index)
        start = pos + _CHUNK_HEADER.size
        if start + length > len(buf):
            raise CorruptRecordError(f"chunk length {length}{_chunk(pos, offset)} runs past the record's extent "
                                     f"({len(buf)} bytes)", path=path, index=index, offset=offset)
        parts.append(bytes(buf[start:start + length]))
        pos = start + _pad4(length)
        if cflag in (0, 3):
            return _MAGIC_BYTES.join(parts), min(pos, len(buf))


def scan(path: str) -> np.ndarray:
    """Index a ``.rec`` file by reading its chunk headers: ``[N, 2]`` int64 ``(offset, size)`` per record,
    size running through the last chunk's padding."""
    size = os.path.getsize(path)
    entries = []
    with open(path, "rb") as f:
        offset = pos = 0
        first = True
        while pos < size:
            f.seek(pos)
            head = f.read(_CHUNK_HEADER.size)
            cflag, length = _chunk_header(head, path, offset, pos - offset)
            _expect_flag(cflag, first, path, offset, pos - offset)
            end = pos + _CHUNK_HEADER.size + _pad4(length)
            if end > size:
                raise CorruptRecordError(f"chunk length {length}{_chunk(pos - offset, offset)} runs past the end of "
                                         f"the file ({size} bytes)", path=path, offset=offset)
            pos, first = end, cflag in (0, 3)
            if first:
                entries.append((offset, pos - offset))
                offset = pos
        if not first:
            raise CorruptRecordError("the file ends inside a split record (no last chunk)", path=path,
                                     offset=offset)
    return np.array(entries, dtype=np.int64).reshape(-1, 2)


def read_index(index_path: str, shard: str) -> np.ndarray:
    """An MXNet ``key<TAB>offset`` index as ``[N, 2]`` int64 ``(offset, extent)`` sorted by offset, extents
    running to the next offset (the last to the end of the file). Keys are not kept: samples are numbered
    in file order."""
    def row(words, size):
        offset = int(words[1]) if len(words) == 2 else -1
        return (offset,) if 0 <= offset <= size - _CHUNK_HEADER.size else None

    rows, size = read_index_rows(index_path, shard, row, "key<TAB>offset")
    offsets = np.array(sorted(o for o, in rows) + [size], dtype=np.int64)
    extents = np.diff(offsets)
    if len(extents) and extents.min() == 0:
        dup = int(offsets[np.argmin(extents)])
        raise CorruptRecordError(f"offset {dup} is listed twice", path=index_path, offset=dup)
    if offsets[0] != 0:
        what = f"starts at byte {int(offsets[0])}" if len(rows) else "lists no record"
        raise CorruptRecordError(f"the index {what}, but {shard} holds {size} bytes from byte 0 (a dropped line, "
                                 "or an index of another file?)", path=index_path, offset=0)
    return np.stack([offsets[:-1], extents], axis=1)


def write_index(shard: str, index_path: str | None = None) -> str:
    """Write the MXNet index (``key<TAB>offset``, keys 0, 1, ... in file order) of a ``.rec`` file, by
    scanning it, through a temporary name; default ``<name>.idx`` beside ``<name>.rec``. Returns its path."""
    index_path = index_path or _index_of(shard)
    _write_index_file(index_path, scan(shard)[:, 0])
    return index_path


def _write_index_file(index_path: str, offsets: Any) -> None:
    with atomic_write(index_path) as f:
        f.writelines(f"{key}\t{int(offset)}\n" for key, offset in enumerate(offsets))


# -- payload ---------------------------------------------------------------------------------------

def unpack(data: Any, path: str, index: Any, offset: int) -> Record:
    """A record's payload (IRHeader, labels, image; bytes or a byte view) as a `Record` with the fields in
    `FIELDS`; the image is a uint8 array viewing ``data`` (no copy: the read buffer stays with the sample)."""
    if len(data) < IR_HEADER.size:
        raise CorruptRecordError(f"record of {len(data)} bytes is shorter than the {IR_HEADER.size}-byte IRHeader",
                                 path=path, index=index, offset=offset)
    flag, label, rid, _ = IR_HEADER.unpack_from(data)
    if flag > (len(data) - IR_HEADER.size) // 4:
        raise CorruptRecordError(f"IRHeader flag {flag} promises more float labels than the record holds",
                                 path=path, index=index, offset=offset)
    start = IR_HEADER.size + 4 * flag
    if start == len(data):
        raise CorruptRecordError("record holds no image bytes after its IRHeader", path=path, index=index,
                                 offset=offset)
    labels = np.frombuffer(data, "<f4", flag, IR_HEADER.size).astype(np.float32) if flag else None
    return _record(np.frombuffer(data, np.uint8, -1, start), flag, label, rid, labels)


def _record(image: np.ndarray, flag: int, label: float, rid: int, labels: np.ndarray | None) -> Record:
    """The `Record` of a checked payload: ``labels`` holds the ``flag`` float labels (None when flag is 0)."""
    if labels is None:
        labels = np.array((label,), np.float32)
    rid -= (rid >> 63) << 64   # the uint64 id seen as int64
    return Record(image, _class_label(flag, label), {"label_values": labels, "id": rid})


def _class_label(flag: int, label: float) -> int:
    """The int label of a header: its label when single-valued and a whole number, else -1 (NaN and
    infinities fail the range test)."""
    if flag == 0 and 0 <= label < 2 ** 31 and label == int(label):
        return int(label)
    return -1


# -- the source ------------------------------------------------------------------------------------

class RecordIOSource:
    """Samples of MXNet RecordIO files: ``path`` is a ``.rec`` file, a list or glob of them, or a directory
    (its ``*.rec`` files). ``index``: the ``.idx`` file(s) (a path, a list aligned with the files, or a
    directory); default ``<name>.idx`` beside each ``<name>.rec`` where present. ``classes``: class names.
    ``check``: per-record CRC32C checks against ``<name>.crc32c`` ("auto", "crc", "none"; None: the
    ``check`` setting; `ingest.formats.checks`).

    A file whose first record holds labels and no image (the meta header InsightFace's face datasets start
    with, e.g. identity ranges) does not count it as a sample: its labels are in ``meta[file]``."""

    fields = FIELDS

    def __init__(self, path: str | os.PathLike | Sequence[str], *, index: Any = None, classes: Sequence[str] = (),
                 check: str | None = None):
        self.shards = find_shards(path)
        self.classes = list(classes)
        self.meta: dict[str, np.ndarray] = {}
        tables = [self._without_meta(shard, read_index(idx, shard) if idx else scan(shard))
                  for shard, idx in zip(self.shards, resolve_indexes(index, self.shards, _index_of))]
        self._table = RecordTable(self.shards, tables)
        self._labels: np.ndarray | None = None
        crcs = checks.table([checks.read_file(os.path.splitext(s)[0] + checks.SUFFIX, len(t))
                             for s, t in zip(self.shards, tables)])
        self._crcs = crcs if checks.enabled(check, "recordio", crcs is not None, self.shards[0]) else None

    def _without_meta(self, shard: str, table: np.ndarray) -> np.ndarray:
        """``table`` less its first record when that is a meta header (labels, no image)."""
        if not len(table):
            return table
        offset, size = (int(v) for v in table[0])
        with open(shard, "rb") as f:
            f.seek(offset)
            raw = f.read(size)
        try:
            data, _ = unchunk(raw, shard, offset)
        except CorruptRecordError:
            return table  # reported when the sample is read
        if len(data) < IR_HEADER.size:
            return table
        flag = IR_HEADER.unpack_from(data)[0]
        if flag == 0 or len(data) != IR_HEADER.size + 4 * flag:
            return table
        self.meta[shard] = np.frombuffer(data, dtype="<f4", count=flag, offset=IR_HEADER.size).astype(np.float32)
        return table[1:]

    def __len__(self) -> int:
        return len(self._table)

    def locate(self, i: int) -> Location:
        return self._table.location(i)

    def parse(self, i: int, raw: Any) -> Record:
        buf = memoryview(raw)
        if buf.ndim != 1 or buf.format != "B":
            buf = buf.cast("B")
        if len(buf) > _FIRST.size:   # the common record: one unsplit chunk, one label, then the image
            magic, lrec, flag, label, rid, _ = _FIRST.unpack_from(buf)
            end = _CHUNK_HEADER.size + lrec
            if magic == MAGIC and lrec <= _LEN_MASK and _FIRST.size < end and flag == 0 and \
                    _CHUNK_HEADER.size + _pad4(lrec) == len(buf) and \
                    (self._crcs is None or checks.crc(buf) == self._crcs[i]):
                return _record(np.frombuffer(buf, np.uint8, end - _FIRST.size, _FIRST.size), 0, label, rid, None)
        table = self._table
        path, offset = table.shards[table.shard_of[i]], table.offsets[i]
        data, span = unchunk(raw, path, offset, i)
        if span != len(buf):
            raise CorruptRecordError(f"the record here spans {span} bytes, but the index gives it {len(buf)} (a "
                                     f"dropped or edited index line?)", path=path, index=i, offset=offset)
        if self._crcs is not None:
            self._check(i, buf)
        return unpack(data, path, i, offset)

    def parse_batch(self, indices: Sequence[int], raws: Sequence[Any]) -> list[Record | Exception]:
        """`parse` of each record (a Record, or the error it raised): the common records' headers (one unsplit
        chunk, one label) read as one array and, where records are checked, their CRC32C in one native call
        (`checks.matches`, the GIL released once); the others, and any that fails its CRC, go through `parse`."""
        if not raws:
            return []
        heads, sizes = batch_structs(raws, _FIRST_DTYPE)
        ends = heads["lrec"].astype(np.int64) + _CHUNK_HEADER.size
        common = ((heads["magic"] == MAGIC) & (heads["lrec"] <= _LEN_MASK) & (heads["flag"] == 0)
                  & (_FIRST.size < ends) & (((ends + 3) & ~3) == sizes))
        if self._crcs is not None:
            common &= checks.matches(raws, indices, self._crcs)   # the GIL released once for the batch
        values = heads["label"].reshape(-1, 1)   # each record's label_values: a row of one array
        parsed: list[Record | Exception] = []
        for k, (i, raw, ok, end, label, rid) in enumerate(zip(indices, raws, common.tolist(), ends.tolist(),
                                                               heads["label"].tolist(), heads["id"].tolist())):
            if ok:
                image = np.frombuffer(raw, np.uint8, end - _FIRST.size, _FIRST.size)
                parsed.append(Record(image, _class_label(0, label), {"label_values": values[k], "id": rid}))
            else:
                parsed.append(parse_or_error(self, i, raw))
        return parsed

    def _check(self, i: int, buf: Any) -> None:
        """Raise the CorruptRecordError of record ``i`` when its bytes do not have the CRC written with them."""
        table = self._table
        err = checks.mismatch(buf, self._crcs[i], path=table.shards[table.shard_of[i]], index=i,
                              offset=table.offsets[i])
        if err is not None:
            raise err

    def labels(self) -> np.ndarray:
        """Every sample's label, from the IRHeaders (one small read per record), cached after the first call."""
        if self._labels is None:
            labels = np.empty(len(self._table), dtype=np.int64)
            for i, shard, offset, head in self._table.read_each(_CHUNK_HEADER.size + IR_HEADER.size):
                cflag, length = _chunk_header(head[:_CHUNK_HEADER.size], shard, offset, index=i)
                whole = len(head) == _CHUNK_HEADER.size + IR_HEADER.size and length >= IR_HEADER.size
                if cflag == 0 and whole:
                    flag, label, _, _ = IR_HEADER.unpack_from(head, _CHUNK_HEADER.size)
                    labels[i] = _class_label(flag, label)
                else:  # split or short record: read it whole
                    labels[i] = self.parse(i, read_location(self._table.location(i))).label
            self._labels = labels
        return self._labels

    def name(self, i: int) -> str:
        i = self._table.index(i)
        return f"{self._table.path(i)}:{self._table.offsets[i]}"

    def native_table(self) -> NativeTable:
        """Every record's byte range for the native engine, which reads each label from its IRHeader and, where
        records are checked (``check``), checks the CRC32C of each range read as `parse` does."""
        t = self._table
        crcs = None if self._crcs is None else np.frombuffer(self._crcs, np.uint32)
        return NativeTable(t.shards, np.frombuffer(t.shard_of, np.intc).astype(np.int64),
                           np.frombuffer(t.offsets, np.int64), np.frombuffer(t.sizes, np.int64), None, "recordio",
                           crcs)

    def __repr__(self) -> str:
        return f"RecordIOSource({len(self.shards)} files, {len(self)} records)"


# -- the writer ------------------------------------------------------------------------------------

def chunks(data: bytes) -> bytes:
    """``data`` framed as one RecordIO record, split where it holds the magic at a 4-byte aligned position
    (as dmlc-core's RecordIOWriter::WriteRecord does)."""
    if len(data) > MAX_LENGTH:
        raise ConfigError(f"a RecordIO record holds at most {MAX_LENGTH} bytes, got {len(data)}")
    aligned = np.frombuffer(data, dtype="<u4", count=len(data) // 4)
    cuts = (np.flatnonzero(aligned == MAGIC) * 4).tolist()
    out, start = [], 0
    for cut in cuts:
        out += [_CHUNK_HEADER.pack(MAGIC, (1 if start == 0 else 2) << 29 | (cut - start)), data[start:cut]]
        start = cut + 4
    tail = len(data) - start
    out += [_CHUNK_HEADER.pack(MAGIC, (3 if cuts else 0) << 29 | tail), data[start:], bytes(_pad4(tail) - tail)]
    return b"".join(out)


class RecordIOWriter:
    """Writes one shard ``<stem>.rec`` + ``<stem>.idx`` (keys 0, 1, ... in write order), records packed as
    ``mxnet.recordio.pack`` does. Storable fields: ``image`` (encoded, required), ``label`` (int), ``label_values``
    (floats: written as ``flag`` multi-value labels unless it holds exactly one value) and ``id`` (int;
    default: the key)."""

    def __init__(self, directory: str | os.PathLike, stem: str, fields: Mapping[str, Field]):
        fields = dict(fields)
        if fields.get("image", Field("bytes")).kind != "image":
            raise ConfigError("RecordIO stores encoded images: the fields need an 'image' of kind image "
                              "(re-encode pixels first)")
        extra = sorted(set(fields) - set(FIELDS))
        if extra:
            raise ConfigError(f"RecordIO records hold an image, a label or float labels and an id; cannot "
                              f"store fields {extra}")
        self.fields = fields
        self.directory = os.fspath(directory)
        self._stem = stem
        self._file = open(os.path.join(self.directory, stem + ".rec"), "wb")
        self._offsets: list[int] = []
        self._crcs: list[int] = []
        self._offset = 0

    def add(self, record: Record) -> None:
        key = len(self._offsets)
        label = float(record.label) if "label" in self.fields else 0.0
        extra = b""
        flag = 0
        if "label_values" in self.fields:
            values = np.asarray(record.fields["label_values"], dtype="<f4").ravel()
            if values.size == 1:
                label = float(values[0])
            else:
                flag, label, extra = values.size, 0.0, values.tobytes()
        rid = int(record.fields["id"]) if "id" in self.fields else key
        header = IR_HEADER.pack(flag, label, rid & (2 ** 64 - 1), 0)
        data = chunks(header + extra + bytes(record.image))
        self._file.write(data)
        self._offsets.append(self._offset)
        self._crcs.append(checks.crc(data))
        self._offset += len(data)

    def close(self) -> list[str]:
        """Finish the shard and write its index and CRC file; returns the file names written."""
        names = [self._stem + ".rec", self._stem + ".idx", self._stem + checks.SUFFIX]
        if not self._file.closed:
            self._file.close()
            _write_index_file(os.path.join(self.directory, names[1]), self._offsets)
            checks.write_file(os.path.join(self.directory, names[2]), self._crcs)
        return names
