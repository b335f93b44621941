"""WebDataset tar shards: `WebDatasetSource` reads them, `WebDatasetWriter` writes them.

A sample is the run of consecutive tar members sharing a key (``a/b/c.jpg`` and ``a/b/c.cls`` -> key
``a/b/c``); its fields are its members, by extension (grouping rules and the index: `tarindex`). Field kinds
follow the extension's last part (a trailing ``.gz`` is decompressed first, as webdataset does):

==============================================  =========================================================
jpg jpeg png webp bmp gif tif tiff ppm pgm        ``image`` (encoded bytes, decoded by the pipeline)
seg.mask.png (``<name>.mask.<image ext>``)        ``mask`` (a segmentation label map: decoded to its values)
cls cls2 class index inx id count                 ``int`` (ASCII integer)
float                                             ``float`` (ASCII number; written by `WebDatasetWriter`)
txt text transcript json jsn                      ``text`` (UTF-8; JSON is not parsed)
npy                                               ``array`` (NumPy ``.npy``, never pickled objects)
anything else (mp, ten, pth, pkl, bin, ...)        ``bytes`` (as stored: nothing is unpickled or unpacked)
==============================================  =========================================================

**Fields.** ``fields=None`` looks at the first samples of the first shard: ``image`` is the first member with
an image extension (jpg before jpeg, png, webp, ...: all image extensions seen are its alternatives),
``label`` the ``cls`` member (or cls2, index, ...); every other extension present in all of those samples is
a field named after it, less a trailing type part when there is one (``seg.png`` -> ``seg``, ``json`` ->
``json``, ``seg.mask.png`` -> ``seg``). ``fields={"image": ("jpg", "png"), "label": "cls", "meta": "json"}``
names them explicitly; ``masks=("seg",)`` reads the named image fields as kind ``mask``. A
sample that lacks a declared field is a `CorruptRecordError` when parsed (skipped under ``max_failures``).

**Random access** (plain ``.tar``): ``locate(i)`` returns one `Location` per member the declared fields
need, from the shard's index (`tarindex.open_index`: ``<shard>.idx`` when present, else a scan;
``write_index=True`` saves it), each starting at the member's header block. ``parse`` checks every header
against the index (`tarindex.header_problem`) and reads the label from the shard's own member, so an
edited or misplaced index is a `CorruptRecordError` naming the index file and the member's offset, never a
silently wrong sample or label. ``labels()`` (sampling, ``inspect``) gives the labels the index holds;
each is compared with the shard's when its sample is read. Where ``<shard>.crc32c`` holds every member's
CRC32C (`WebDatasetWriter` writes it), members are checked against it as they are read (``check``:
`ingest.formats.checks`).

**Streamed** (``.tgz``/``.tar.gz``, or ``stream=True``): the shards are read front to back through
``iter_shard(k, skip)`` (see `ingest.stream`); a shard is taken as gzipped by its magic bytes, so a gzipped
tar named ``.tar`` streams too.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zlib
from array import array
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..errors import ConfigError, CorruptRecordError, SourceError
from . import checks, tarindex
from ._native_table import NativeTable, NotNative
from ._shards import gzipped, resolve_shards
from .base import Field, Location, Record, check_index
from .boxes import convert_record
from ._images import image_extension, mask_bytes

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "jp2", "j2k", "pam", "pnm")
LABEL_EXTENSIONS = ("cls", "cls2", "class", "index", "inx", "id", "count")
TEXT_EXTENSIONS = ("txt", "text", "transcript", "json", "jsn")
TAR_SUFFIXES = (".tar", ".tgz", ".tar.gz")
#: Decompressed size above which a ``.gz`` member is refused (a gzip bomb must not exhaust memory).
MAX_GUNZIP = 1 << 30
_SCAN_SAMPLES = 16   # samples looked at to declare fields when none are given
_BLOCK = tarfile.BLOCKSIZE   # a member's header block, read with its data


def kind_of(ext: str) -> str:
    """The field kind of a member extension (``seg.png`` -> image, ``seg.mask.png`` -> mask, ``txt.gz`` -> text)."""
    parts = ext.removesuffix(".gz").rsplit(".", 2)
    last = parts[-1]
    if last in IMAGE_EXTENSIONS:
        return "mask" if len(parts) == 3 and parts[-2] == "mask" else "image"
    if last in LABEL_EXTENSIONS:
        return "int"
    if last == "float":
        return "float"
    if last in TEXT_EXTENSIONS:
        return "text"
    if last == "npy":
        return "array"
    return "bytes"


def _field_name(ext: str) -> str:
    base = ext.removesuffix(".gz")
    name = base.rsplit(".", 1)[0] if "." in base else base
    return name.removesuffix(".mask") if kind_of(ext) == "mask" else name


def is_shard_name(name: str) -> bool:
    """Whether a file in a dataset directory is a tar shard (``.tar``, ``.tgz``, ``.tar.gz``)."""
    return name.lower().endswith(TAR_SUFFIXES)


def find_shards(path: Any) -> list[str]:
    """The tar shards at ``path``: a file, a list, a glob or a directory (`_shards.resolve_shards`; in a
    directory, files named as tar shards and extension-less files that are tar archives, plain or gzipped)."""
    return resolve_shards(path, is_shard_name, "tar shard", _is_tar)


def _is_tar(path: str) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except OSError:
        return False


def gunzip(data: bytes, *, path: str, where: str) -> bytes:
    """Decompress a ``.gz`` member, refusing more than `MAX_GUNZIP` bytes of output."""
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(data, MAX_GUNZIP)
        if d.unconsumed_tail:
            raise CorruptRecordError(f"{where}: decompresses to more than {MAX_GUNZIP} bytes", path=path)
        out += d.flush()
    except zlib.error as err:
        raise CorruptRecordError(f"{where}: bad gzip data: {err}", path=path) from err
    if not d.eof:
        raise CorruptRecordError(f"{where}: truncated gzip data", path=path)
    return out


def decode_npy(data: bytes, *, path: str, where: str) -> np.ndarray:
    """A ``.npy`` array, its header checked against its length before anything is allocated."""
    buf = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(buf)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(buf)
    except (ValueError, SyntaxError, TypeError, OverflowError) as err:
        raise CorruptRecordError(f"{where}: not a .npy array: {err}", path=path) from err
    if dtype.hasobject:
        raise CorruptRecordError(f"{where}: .npy holds Python objects (refused: it would unpickle)", path=path)
    count = int(np.prod(shape, dtype=object))
    body = memoryview(data)[buf.tell():]
    if count * dtype.itemsize != len(body):
        raise CorruptRecordError(f"{where}: .npy header says {shape} {dtype} ({count * dtype.itemsize} bytes) "
                                 f"but {len(body)} bytes follow", path=path)
    return np.frombuffer(body, dtype=dtype).reshape(shape, order="F" if fortran else "C")


def decode_member(ext: str, data: Any, *, path: str, where: str) -> Any:
    """The value of a member of extension ``ext`` (see the module table)."""
    if ext.endswith(".gz"):
        data = gunzip(bytes(data), path=path, where=where)
    kind = kind_of(ext)
    if kind in ("image", "mask"):
        return data
    raw = bytes(data)
    if kind == "int":
        value = tarindex.parse_int(raw)
        if value is None:
            raise CorruptRecordError(f"{where}: {raw[:40]!r} is not an integer", path=path)
        return value
    if kind == "float":
        try:
            return float(raw.strip())
        except ValueError as err:
            raise CorruptRecordError(f"{where}: {raw[:40]!r} is not a number", path=path) from err
    if kind == "text":
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise CorruptRecordError(f"{where}: not UTF-8 text: {err}", path=path) from err
    if kind == "array":
        return decode_npy(raw, path=path, where=where)
    return raw


def _normalize_fields(fields: Mapping[str, str | Sequence[str]]) -> dict[str, tuple[str, ...]]:
    out = {}
    for name, exts in fields.items():
        exts = (exts,) if isinstance(exts, str) else tuple(exts)
        if not exts or not all(isinstance(e, str) and e for e in exts):
            raise ConfigError(f"field {name!r} must name one or more member extensions, got {exts!r}")
        exts = tuple(e.lower().lstrip(".") for e in exts)
        kinds = {kind_of(e) for e in exts}
        if len(kinds) != 1:
            raise ConfigError(f"field {name!r}: extensions {exts} are of different kinds {sorted(kinds)}")
        if name == "image" and kinds != {"image"}:
            raise ConfigError(f"the 'image' field needs image extensions ({', '.join(IMAGE_EXTENSIONS)}), "
                              f"got {exts}")
        if name == "label" and kinds != {"int"}:
            raise ConfigError(f"the 'label' field needs integer extensions ({', '.join(LABEL_EXTENSIONS)}), "
                              f"got {exts}")
        out[name] = exts
    return out


def infer_fields(samples: Sequence[Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """Declared fields from the extension lists of the first samples (see the module docstring)."""
    seen = [e for exts in samples for e in exts]
    common = set.intersection(*(set(exts) for exts in samples)) if samples else set()
    out: dict[str, tuple[str, ...]] = {}
    images = sorted({e for e in seen if e in IMAGE_EXTENSIONS}, key=IMAGE_EXTENSIONS.index)
    if images:
        out["image"] = tuple(images)
    label = next((e for e in LABEL_EXTENSIONS if e in common), None)
    if label:
        out["label"] = (label,)
    rest = sorted(e for e in common if e not in images and e != label)
    names = [_field_name(e) for e in rest]
    for ext, name in zip(rest, names):
        unique = names.count(name) == 1 and name not in ("image", "label")
        out[name if unique else ext] = (ext,)
    return out


class _Members:
    """Which tar member each declared field of each sample reads, for every shard at once: per field a flat
    `array.array` of global member numbers (-1: the sample lacks it), the members' byte ranges and
    extensions, and each sample's shard, so ``locate``/``parse`` look values up instead of grouping a
    sample's members on every call. Built with numpy from the shard indexes when the source opens."""

    def __init__(self, indexes: Sequence[tarindex.TarIndex], exts: Mapping[str, tuple[str, ...]]):
        counts = [len(ix) for ix in indexes]
        self.starts = [0, *np.cumsum(counts).tolist()]          # samples of shard k: starts[k]:starts[k + 1]
        self.shard_of = array("i", np.repeat(np.arange(len(indexes), dtype=np.intc), counts).tobytes())
        self.exts = [e for ix in indexes for e in ix.exts]
        self.offsets = array("q", np.concatenate([ix.offsets for ix in indexes]).astype(np.int64).tobytes())
        self.sizes = array("q", np.concatenate([ix.sizes for ix in indexes]).astype(np.int64).tobytes())
        ints = np.concatenate([ix.ints for ix in indexes]).astype(np.int64)
        columns = {name: [] for name in exts}
        base = 0
        for ix in indexes:
            sample_of = np.repeat(np.arange(len(ix)), np.diff(ix.starts))
            names = np.array(ix.exts, dtype=object)
            for name, alternatives in exts.items():
                column = np.full(len(ix), -1, np.int64)
                for ext in reversed(alternatives):   # the first alternative present wins
                    found = np.flatnonzero(names == ext)
                    column[sample_of[found]] = found + base
                columns[name].append(column)
            base += len(ix.exts)
        merged = {name: np.concatenate(parts) for name, parts in columns.items()}
        self.columns = {name: array("q", column.tobytes()) for name, column in merged.items()}
        label = merged.get("label")
        # The label the index holds for each sample (NO_INT: none), compared with the member read.
        known = np.full(len(self.shard_of), tarindex.NO_INT, np.int64) if label is None or len(exts) == 1 else \
            np.where(label >= 0, ints[np.maximum(label, 0)], tarindex.NO_INT)
        self.label_ints = array("q", known.tobytes())


class WebDatasetSource:
    """Samples of WebDataset tar shards. ``path``: a tar file, a directory of them, a glob or a list.
    ``fields``: field name -> member extension(s) (None: inferred, see the module docstring).
    ``index``: index file(s), one per shard, to use instead of ``<shard>.idx`` (they must match).
    ``masks``: image fields to read as kind ``mask`` (segmentation label maps, decoded to their values; a
    member ``<name>.mask.png`` is one without being named). ``stream``: read front to back (default: only
    gzipped shards). ``write_index``: save each shard's index
    beside it when it had to be built. ``check``: per-member CRC32C checks against ``<shard>.crc32c`` ("auto",
    "crc", "none"; None: the ``check`` setting; `ingest.formats.checks`). Class names come from the
    ``manifest.json`` of an ``ingest convert`` output directory (tars have no place for them), else there
    are none."""

    box_conversion = None   # stored boxes -> those asked for (set by `open_source` from a converter manifest)

    def __init__(self, path: Any, *, fields: Mapping[str, str | Sequence[str]] | None = None,
                 index: str | os.PathLike | Sequence[str | os.PathLike] | None = None, stream: bool | None = None,
                 write_index: bool = False, check: str | None = None, masks: Sequence[str] = ()):
        self.shards = find_shards(path)
        indexes = [None] * len(self.shards) if index is None else \
            [os.fspath(index)] if isinstance(index, (str, os.PathLike)) else [os.fspath(p) for p in index]
        if len(indexes) != len(self.shards):
            raise ConfigError(f"`index` names {len(indexes)} index files for {len(self.shards)} shards")
        compressed = [gzipped(s) for s in self.shards]
        if stream is False and any(compressed):
            raise ConfigError("gzipped tars cannot be read at offsets; leave `stream` unset or True")
        self.streamed = bool(stream) or any(compressed)
        self.classes: list[str] = []   # tars hold none; open_source takes a converter manifest's
        self._indexes: list[tarindex.TarIndex] = []
        self._index_paths = [p or tarindex.index_path(s) for s, p in zip(self.shards, indexes)]
        if not self.streamed:
            self._indexes = [tarindex.open_index(s, write=write_index, path=p) for s, p in zip(self.shards, indexes)]
        if fields is None:
            if self._indexes:   # the fields come from these members' extensions: their headers must agree
                self._check_headers(0, range(min(len(self._indexes[0]), _SCAN_SAMPLES)))
            self._exts = infer_fields(self._first_samples())
        else:
            self._exts = _normalize_fields(fields)
        if not self._exts:
            raise SourceError(f"no fields found in the first samples of {self.shards[0]!r}",
                              path=self.shards[0])
        self._crcs = None
        if not self.streamed:
            crcs = checks.table([checks.read_file(s + checks.SUFFIX, len(ix.exts))
                                 for s, ix in zip(self.shards, self._indexes)])
            self._crcs = crcs if checks.enabled(check, "wds", crcs is not None, self.shards[0]) else None
            self._members = _Members(self._indexes, self._exts)
            # (field name, its member column, whether its bytes need no decoding: images, not gzipped)
            self._plan = [(name, self._members.columns[name],
                           kind_of(exts[0]) in ("image", "mask") and not any(e.endswith(".gz") for e in exts))
                          for name, exts in self._exts.items()]
        self.fields = {name: Field(kind_of(exts[0])) for name, exts in self._exts.items()}
        masks = [masks] if isinstance(masks, str) else list(masks)
        for name in masks:
            if name == "image" or self.fields.get(name, Field("bytes")).kind not in ("image", "mask"):
                raise ConfigError(f"`masks` names {name!r}, which is not an image field other than 'image' "
                                  f"(fields: {', '.join(f'{n} ({f.kind})' for n, f in self.fields.items())})")
            self.fields[name] = Field("mask")
        self._labels: np.ndarray | None = None
        self._native: NativeTable | None = None   # native_table's, made once

    def _first_samples(self) -> list[list[str]]:
        if self.streamed:
            samples = []
            for _, parts in self._stream_samples(0):
                samples.append([ext for ext, _ in parts])
                if len(samples) == _SCAN_SAMPLES:
                    break
            return samples
        ix = self._indexes[0] if self._indexes else None
        return [[ix.exts[m] for m in ix.members(j)] for j in range(min(len(ix), _SCAN_SAMPLES))] if ix else []

    def _check_headers(self, k: int, samples: range) -> None:
        """The header of every member of ``samples`` of shard ``k`` against its index (`tarindex.header_problem`)."""
        ix, shard = self._indexes[k], self.shards[k]
        with open(shard, "rb") as f:
            for j in samples:
                for m in ix.members(j):
                    at = int(ix.offsets[m]) - _BLOCK
                    problem = tarindex.header_problem(os.pread(f.fileno(), _BLOCK, at), ix.keys[j], ix.exts[m],
                                                      int(ix.sizes[m]))
                    if problem is not None:
                        raise CorruptRecordError(f"{problem}; index {self._index_paths[k]}", path=shard, offset=at)

    # -- random access ---------------------------------------------------------------------------
    def __len__(self) -> int:
        if self.streamed:
            raise TypeError("a streamed WebDataset source has no length (see ingest.stream)")
        return len(self._members.shard_of)

    def _index(self, i: int) -> int:
        if self.streamed:
            raise TypeError("a streamed WebDataset source is read with iter_shard(), not at offsets")
        if type(i) is int and 0 <= i < len(self._members.shard_of):
            return i
        return check_index(i, len(self))

    def _key(self, i: int) -> tuple[str, str]:
        """(shard path, sample key) of sample ``i``."""
        k = self._members.shard_of[i]
        return self.shards[k], self._indexes[k].keys[i - self._members.starts[k]]

    def locate(self, i: int) -> tuple[Location, ...]:
        """One range per member the declared fields read, each from its header block to the end of its data."""
        i = self._index(i)
        mem = self._members
        path, offsets, sizes = self.shards[mem.shard_of[i]], mem.offsets, mem.sizes
        return tuple(Location(path, offsets[m] - _BLOCK, sizes[m] + _BLOCK)
                     for m in (column[i] for _, column, _ in self._plan) if m >= 0)

    def parse(self, i: int, raw: Any) -> Record:
        """The sample's fields from its members (as `locate` gives them), every header checked against the
        index and the label compared with the one the index holds."""
        i = self._index(i)
        mem = self._members
        raws = iter(raw if isinstance(raw, tuple) else (raw,))
        path, key = self._key(i)
        values = {}
        for name, column, plain in self._plan:
            m = column[i]
            if m < 0:
                raise self._missing(key, name, path, i)
            part = next(raws)
            problem = tarindex.header_problem(part, key, mem.exts[m], mem.sizes[m])
            if problem is None and len(part) != mem.sizes[m] + _BLOCK:
                problem = f"{len(part)} bytes read for a member of {mem.sizes[m]}"
            if problem is not None:
                raise CorruptRecordError(f"{problem}; index {self._index_paths[mem.shard_of[i]]}", path=path,
                                         index=i, offset=mem.offsets[m] - _BLOCK)
            data = part[_BLOCK:]
            if self._crcs is not None:
                err = checks.mismatch(data, self._crcs[m], path=path, index=i, offset=mem.offsets[m])
                if err is not None:
                    raise err
            if plain:
                values[name] = data
                continue
            values[name] = decode_member(mem.exts[m], data, path=path,
                                         where=f"member {key}.{mem.exts[m]} at byte {mem.offsets[m]}")
            if name == "label" and mem.label_ints[i] != tarindex.NO_INT and values[name] != mem.label_ints[i]:
                raise CorruptRecordError(f"the index {self._index_paths[mem.shard_of[i]]} gives sample {key!r} "
                                         f"label {mem.label_ints[i]}, its member holds {values[name]} (an edited "
                                         "or stale index)", path=path, index=i, offset=mem.offsets[m])
        return convert_record(_record(values), self.box_conversion)

    def labels(self) -> np.ndarray:
        """The ``label`` member of every sample, from the index (read from the shard only where the scan
        did not hold it: long or gzipped members). -1 without a label field."""
        if self._labels is None:
            labels = np.full(len(self), -1, dtype=np.int64)
            if "label" in self._exts:
                mem = self._members
                column = np.frombuffer(mem.columns["label"], np.int64)
                ints = np.concatenate([ix.ints for ix in self._indexes]).astype(np.int64)
                known = (column >= 0) & (ints[np.maximum(column, 0)] != tarindex.NO_INT)
                labels[known] = ints[column[known]]
                for i in np.flatnonzero((column >= 0) & ~known).tolist():
                    labels[i] = self._label_value(i, column[i])
            self._labels = labels
        return self._labels

    def _label_value(self, i: int, m: int) -> int:
        """The label member ``m`` of sample ``i`` read from its shard (one the scan did not hold)."""
        mem, path = self._members, self.shards[self._members.shard_of[i]]
        with open(path, "rb") as f:
            f.seek(mem.offsets[m])
            data = f.read(mem.sizes[m])
        return decode_member(mem.exts[m], data, path=path, where=f"label member at byte {mem.offsets[m]}")

    def name(self, i: int) -> str:
        path, key = self._key(self._index(i))
        return f"{path}:{key}"

    def native_table(self) -> NativeTable:
        """Every sample's image member data for the native engine (kind "whole"; their CRC32Cs checked as
        ``check`` says), its label read here, once, from its label member, and, with a mask field, its mask
        member's data as the sample's mask range (``NativeTable.mask``: the engine reads it with the image, and its
        CRC32C where ``check`` says). Every member's header is checked against the index as `parse` checks it; a
        sample whose image, label or mask member is missing, whose header disagrees with the index, whose label
        member's CRC32C fails or whose label is not the index's is left to `parse` (``NativeTable.python``), which
        names its problem. `NotNative` for streamed shards and for fields other than a plain (not gzipped) image,
        an optional int label and an optional plain mask. Made once (a small read per member), then kept."""
        if self.streamed:
            raise NotNative("streamed (gzipped) tars are read front to back, not at offsets")
        kinds = {name: field.kind for name, field in self.fields.items()}
        plain = {name: is_plain for name, _, is_plain in self._plan}
        masks = [name for name, kind in kinds.items() if kind == "mask"]
        if kinds.get("image") != "image" or not plain["image"] or kinds.get("label", "int") != "int" or \
                set(kinds) - {"image", "label", *masks[:1]} or not all(plain[name] for name in masks):
            raise NotNative(f"it reads a plain image member, an optional int label member and an optional plain "
                            f"(not gzipped) mask member, not the fields {self._described(kinds)}")
        if self._native is not None:
            return self._native
        mem, n = self._members, len(self)
        image = np.frombuffer(mem.columns["image"], np.int64)
        label = np.frombuffer(mem.columns["label"], np.int64) if "label" in kinds else None
        mask = np.frombuffer(mem.columns[masks[0]], np.int64) if masks else None
        labels = np.full(n, -1, np.int64)
        python = np.zeros(n, np.uint8)
        for k, shard in enumerate(self.shards):
            with open(shard, "rb") as f:
                for i in range(mem.starts[k], mem.starts[k + 1]):
                    value = self._native_label(f.fileno(), i, int(image[i]),
                                               None if label is None else int(label[i]))
                    if value is None or (mask is not None and not self._member_ok(f.fileno(), i, int(mask[i]))):
                        python[i] = 1
                    else:
                        labels[i] = value
        offsets, sizes, crcs = self._ranges(image, python)
        ranges = {} if mask is None else dict(zip(("mask_offsets", "mask_sizes", "mask_crcs"),
                                                  self._ranges(mask, python)), mask=(masks[0], None))
        self._native = NativeTable(self.shards, np.frombuffer(mem.shard_of, np.intc).astype(np.int64), offsets,
                                   sizes, labels, "whole", crcs, python=python if python.any() else None, **ranges)
        return self._native

    def _described(self, kinds: Mapping[str, str]) -> dict[str, str]:
        return {name: f"{', '.join(self._exts[name])} ({kind})" for name, kind in kinds.items()}

    def _ranges(self, column: np.ndarray, python: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The data offsets, sizes (0 where the sample is left to Python) and CRC32Cs (None: unchecked) of the
        members of ``column``, one per sample."""
        mem, at = self._members, np.maximum(column, 0)
        offsets = np.frombuffer(mem.offsets, np.int64)[at]
        sizes = np.where(python == 1, 0, np.frombuffer(mem.sizes, np.int64)[at])
        return offsets, sizes, None if self._crcs is None else np.frombuffer(self._crcs, np.uint32)[at]

    def _member_ok(self, fd: int, i: int, m: int) -> bool:
        """Whether member ``m`` of sample ``i`` (-1: missing) is there with the header the index gives it."""
        mem = self._members
        return m >= 0 and tarindex.header_problem(os.pread(fd, _BLOCK, mem.offsets[m] - _BLOCK), self._key(i)[1],
                                                  mem.exts[m], mem.sizes[m]) is None

    def _native_label(self, fd: int, i: int, image: int, label: int | None) -> int | None:
        """`native_table`'s checks of sample ``i`` (its image and label members, -1: missing; None: no label
        field; the shard open as ``fd``): its label (-1 without a label field), or None where `parse` must read
        it."""
        mem = self._members
        key = self._key(i)[1]
        if not self._member_ok(fd, i, image):
            return None
        if label is None:
            return -1
        if label < 0:
            return None
        part = os.pread(fd, _BLOCK + mem.sizes[label], mem.offsets[label] - _BLOCK)
        data = part[_BLOCK:]
        if len(data) != mem.sizes[label] or tarindex.header_problem(part, key, mem.exts[label],
                                                                    mem.sizes[label]) is not None or \
                (self._crcs is not None and checks.crc(data) != self._crcs[label]):
            return None
        try:
            value = decode_member(mem.exts[label], data, path=self.shards[mem.shard_of[i]], where="label")
        except CorruptRecordError:
            return None
        known = mem.label_ints[i]
        return None if known != tarindex.NO_INT and value != known else value

    # -- streaming ---------------------------------------------------------------------------------
    def _stream_samples(self, k: int) -> Iterator[tuple[str, list[tuple[str, tarindex.Member]]]]:
        path = self.shards[k]
        with open(path, "rb") as f:
            if gzipped(path):
                with gzip.GzipFile(fileobj=f) as gz:
                    yield from tarindex.group(tarindex.scan(gz, path, read_all=True), path)
            else:
                size = os.fstat(f.fileno()).st_size
                yield from tarindex.group(tarindex.scan(f, path, size=size, read_all=True), path)

    def iter_shard(self, k: int, skip: int = 0) -> Iterator[tuple[str, Record]]:
        """``(name, record)`` of shard ``k``'s samples in order, from sample ``skip`` on."""
        path = self.shards[k]
        for j, (key, parts) in enumerate(self._stream_samples(k)):
            if j < skip:
                continue
            by_ext = dict(parts)
            values = {}
            for name, exts in self._exts.items():
                ext = next((e for e in exts if e in by_ext), None)
                if ext is None:
                    raise self._missing(key, name, path, j)
                member = by_ext[ext]
                values[name] = decode_member(ext, member.data, path=path,
                                             where=f"member {member.name} at byte {member.offset}")
            yield f"{path}:{key}", convert_record(_record(values), self.box_conversion)

    def _missing(self, key: str, name: str, path: str, index: int) -> CorruptRecordError:
        return CorruptRecordError(f"sample {key!r} has no member for field {name!r} (extensions "
                                  f"{', '.join(self._exts[name])})", path=path, index=index)

    def __repr__(self) -> str:
        size = "streamed" if self.streamed else f"{len(self)} samples"
        return f"WebDatasetSource({len(self.shards)} shards, {size}, fields {sorted(self.fields)})"


def _record(values: dict[str, Any]) -> Record:
    image = values.pop("image", None)
    label = values.pop("label", -1)
    return Record(image, int(label), values)


def reader_spec(fields: Mapping[str, Field], writer: Mapping[str, Any]) -> dict[str, Any]:
    """The reader options that read shards `WebDatasetWriter` wrote for ``fields`` back under the names it was
    given (`written_extensions`): `open_source` uses them for a converter output, with its manifest's kinds."""
    return {"fields": {name: written_extensions(name, field) for name, field in fields.items()}}


#: Member extension a writer gives a field of each kind (images: sniffed from the bytes; label: ``cls``).
WRITE_EXTENSIONS = {"pixels": "png", "int": "cls", "float": "float", "ints": "npy", "floats": "npy",
                    "array": "npy", "text": "txt", "bytes": "bin"}


class WebDatasetWriter:
    """Writes one shard: ``<stem>.tar`` (one sample per record, keys ``<key_prefix>%09d``) and its index
    ``<stem>.tar.idx``. Headers are fixed (mtime 0, uid/gid 0, no user names, mode 0644, POSIX pax format),
    so the same records give the same bytes. Members per field: encoded images keep their bytes with the
    extension of their format (``jpg``, ``png``, ...), decoded pixels become lossless PNG, ``label`` is
    ``cls``; another field ``f`` is written as ``f`` when its name is already an extension of its kind
    (``json``, ``txt``), else ``f.<ext>`` (`WRITE_EXTENSIONS`: ints/floats/arrays as ``.npy``). Characters
    other than letters, digits, ``_`` and ``-`` in field names become ``_``. The files can be read by
    `WebDatasetSource` and by the ``webdataset`` package."""

    def __init__(self, directory: str | os.PathLike, stem: str, fields: Mapping[str, Field], *,
                 key_prefix: str = ""):
        if not isinstance(key_prefix, str) or tarindex.split_key(f"{key_prefix}0.x") != (f"{key_prefix}0", "x") \
                or tarindex.escapes(key_prefix):
            raise ConfigError(f"`key_prefix` must be a relative path prefix with no dot in its last part, "
                              f"got {key_prefix!r}")
        self.fields = dict(fields)
        self.key_prefix = key_prefix
        self.stem = stem
        self.path = os.path.join(os.fspath(directory), stem + ".tar")
        self._tar = tarfile.open(self.path, "w", format=tarfile.PAX_FORMAT)
        self._count = 0
        self._members: list[tarindex.Member] = []   # as written, for the index
        self._crcs: list[int] = []                  # each member's data, for the CRC file

    def _member(self, name: str, field: Field, value: Any) -> tuple[str, bytes]:
        safe = _safe(name)
        if field.kind in ("image", "mask"):
            data = mask_bytes(value) if field.kind == "mask" else bytes(memoryview(value).cast("B"))
            ext = image_extension(data)
            if ext is None:
                raise CorruptRecordError(f"field {name!r} holds no image format known by its magic bytes "
                                         f"({data[:8]!r})", path=self.path, index=self._count)
            if field.kind == "mask":   # read back as a mask (`kind_of`)
                return f"{safe}.mask{ext}", data
            return (ext[1:] if name == "image" else f"{safe}.{ext[1:]}"), data
        if name == "label":
            return "cls", str(int(value)).encode()
        return written_extensions(name, field)[0], _encode(field.kind, value)

    def add(self, record: Record) -> None:
        key = f"{self.key_prefix}{self._count:09d}"
        for name, field in self.fields.items():
            ext, data = self._member(name, field, record.get(name))
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = \
                len(data), 0, 0o644, 0, 0, "", ""
            header = self._tar.offset
            self._tar.addfile(info, io.BytesIO(data))
            # the data ends where the tar now stands, less its padding to whole blocks (whatever headers came)
            offset = self._tar.offset - -(-len(data) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
            kept = data if kind_of(ext) == "int" else None   # an integer the index holds (no image bytes kept)
            self._members.append(tarindex.Member(info.name, header, offset, len(data), kept))
            self._crcs.append(checks.crc(data))
        self._count += 1

    def close(self) -> list[str]:
        """Finish the tar and write its index, from the member offsets recorded while writing (the index
        `tarindex.build` would make by scanning the tar), and its members' CRCs; the names of the files."""
        self._tar.close()
        index = tarindex.from_members(iter(self._members), self.path, os.path.getsize(self.path))
        tarindex.save(index, tarindex.index_path(self.path))
        checks.write_file(self.path + checks.SUFFIX, self._crcs)
        return [self.stem + ".tar", self.stem + ".tar.idx", self.stem + ".tar" + checks.SUFFIX]


def _safe(name: str) -> str:
    """A field name as a member extension: characters other than letters, digits, ``_`` and ``-`` as ``_``."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in name)


def written_extensions(name: str, field: Field) -> tuple[str, ...]:
    """The member extension(s) `WebDatasetWriter` gives field ``name``: every image extension for an encoded
    image (its bytes decide which), else the one extension of its kind. As a ``fields`` spec they read the
    writer's shards back under the names it was given (``image/height``, not ``image_height``)."""
    safe = _safe(name)
    if field.kind == "image":
        return IMAGE_EXTENSIONS if name == "image" else tuple(f"{safe}.{e}" for e in IMAGE_EXTENSIONS)
    if field.kind == "mask":   # (`WebDatasetWriter._member`)
        return tuple(f"{safe}.mask.{e}" for e in IMAGE_EXTENSIONS)
    if name == "label":
        return ("cls",)
    if name == "image":   # decoded pixels
        return (WRITE_EXTENSIONS[field.kind],)
    return (safe if kind_of(safe) == field.kind and safe not in ("image", "label")
            else f"{safe}.{WRITE_EXTENSIONS[field.kind]}",)


def _encode(kind: str, value: Any) -> bytes:
    if kind == "pixels":
        from PIL import Image
        pixels = np.asarray(value, dtype=np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels[..., 0] if pixels.ndim == 3 and pixels.shape[2] == 1 else pixels).save(out, "PNG")
        return out.getvalue()
    if kind == "int":
        return str(int(value)).encode()
    if kind == "float":
        return repr(float(value)).encode()
    if kind == "text":
        return str(value).encode("utf-8")
    if kind == "bytes":
        return bytes(memoryview(value).cast("B"))
    out = io.BytesIO()
    np.save(out, np.asarray(value, dtype={"ints": np.int64, "floats": np.float32}.get(kind)), allow_pickle=False)
    return out.getvalue()
