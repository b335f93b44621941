"""What a source hands the native engine once, at start: every sample's byte range, its label where the source
knows it without reading, and each record's CRC32C where the source checks them (`ingest.native`). A source that
can give one has ``native_table()``, which raises `NotNative` saying why where its settings or data rule it out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

#: How the engine finds the encoded image in a sample's bytes:
#:
#: - "whole": the range is the image (where the table has a ``mask``, its own range of the same file is the mask's
#:   encoded bytes: a WebDataset mask member);
#: - "recordio": an MXNet record: the IRHeader, its float labels, then the image; the label from the header;
#: - "tfrecord": one whole framed TFRecord record holding a tf.train.Example: the image is the one bytes value of
#:   feature ``keys[0]``, the label the one int64 of ``keys[1]`` (-1 without a second key), the mask (where the
#:   table has a ``mask``) the one bytes value of its key; with ``record_crc`` the record's own masked CRC32Cs
#:   (length, data) are checked;
#: - "caffe_datum": an encoded Caffe ``Datum``: the image is its ``data`` (field 4), the label its ``label`` (5);
#: - "framed": our LMDB layout's record (`ingest.formats._framed`) of an image and an int label in that order, or,
#:   where the table's ``keys`` is one bytes value, of the fields whose kind codes it holds in order (``KIND_CODES``:
#:   an image, at most one int label, at most one mask, e.g. ``b"\x01\x03\x0a"``); the label is the int field's
#:   (-1 without one), and the mask (where the table has a ``mask``, ``(field name, b"\x0a")``) the field of kind
#:   code 10;
#: - "pixels": the range is the image already decoded, uint8 ``[H, W, 3]`` dense (a raw shard's), of the table's
#:   ``hw``: nothing is parsed or decoded, and the kernel reads the pixels where they land.
#:
#: A record the engine's parse does not take (anything but the plain encoding) keeps its row, filled by the
#: Python reader, which reads it or names its problem.
KINDS = ("whole", "recordio", "tfrecord", "caffe_datum", "framed", "pixels")


class NotNative(Exception):
    """A source's ``native_table()`` cannot give a table for these settings or this data; the message says why."""


@dataclass(frozen=True)
class NativeTable:
    """Sample i is bytes ``offsets[i]`` to ``offsets[i] + sizes[i]`` of ``paths[files[i]]`` (size -1: to the end
    of the file), parsed as ``kind``; ``labels[i]`` its label (None: read from each record); ``crcs[i]`` the
    CRC32C of exactly those bytes (`ingest.formats.checks`), which the engine checks as it reads them (None: no
    check); ``keys`` a "tfrecord" table's feature keys (image, then label where the spec has one), or a "framed"
    table's one bytes value of its records' field kind codes in order (empty: an image, then an int label);
    ``record_crc`` whether the engine checks a "tfrecord" record's own CRCs; ``python[i]`` 1 where the source
    knows at start that sample i needs its Python reader (a missing member, a header or label that disagrees with
    the index): the engine does not read it and leaves its row to the Python pipeline (None: none);
    ``index_names(i)`` how the reader's errors name sample i (their ``index``; None: i itself); ``mask`` the mask
    field, which the engine decodes and warps beside the image where the consumer takes the fields (None: no mask):
    a "tfrecord" table's (field name, feature key), a "framed" table's (field name, b"\x0a": the field of that kind
    code in its ``keys``), a "whole" table's (field name, None) with the mask's own byte
    range per sample in the image's file, ``mask_offsets[i]`` and ``mask_sizes[i]``, read with the image, and
    ``mask_crcs[i]`` the CRC32C of those bytes, checked as read (None: no check); ``hw`` a "pixels" table's ``[n, 2]`` heights and widths, and only
    its (each range then holds exactly ``h * w * 3`` bytes)."""

    paths: Sequence[str]
    files: np.ndarray     # int64
    offsets: np.ndarray   # int64
    sizes: np.ndarray     # int64, -1 for the whole file
    labels: np.ndarray | None   # int64
    kind: str
    crcs: np.ndarray | None = None   # uint32
    keys: tuple[bytes, ...] = ()
    record_crc: bool = False
    python: np.ndarray | None = None   # uint8
    index_names: Callable[[int], Any] | None = None
    mask: tuple[str, bytes | None] | None = None
    hw: np.ndarray | None = None   # int64 [n, 2]
    mask_offsets: np.ndarray | None = None   # int64
    mask_sizes: np.ndarray | None = None     # int64
    mask_crcs: np.ndarray | None = None      # uint32

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Unknown table kind {self.kind!r}. Available: {', '.join(KINDS)}")
        n = len(self.files)
        if len(self.offsets) != n or len(self.sizes) != n or any(
                column is not None and len(column) != n for column in (self.labels, self.crcs, self.python,
                                                                       self.mask_offsets, self.mask_sizes,
                                                                       self.mask_crcs)):
            raise ValueError(f"a native table's columns differ in length ({n} files)")
        framed = self.kind == "framed" and len(self.keys) == 1 and isinstance(self.keys[0], bytes)
        if (self.kind == "tfrecord") != bool(self.keys) and not framed or len(self.keys) > 2:
            raise ValueError("a 'tfrecord' table, and only one, names its image key and, where read, its label key; "
                             "a 'framed' table may give its fields' kind codes "
                             f"(got keys {self.keys!r} for kind {self.kind!r})")
        if (self.kind == "pixels") != (self.hw is not None) or (self.hw is not None and self.hw.shape != (n, 2)):
            raise ValueError(f"a 'pixels' table, and only one, gives each sample's height and width as [n, 2] "
                             f"(got {None if self.hw is None else self.hw.shape} for kind {self.kind!r})")
        ranges = self.mask_offsets is not None
        if self.mask is not None and not (self.kind == "tfrecord" and isinstance(self.mask[1], bytes) or
                                          self.kind == "whole" and self.mask[1] is None and ranges or
                                          framed and self.mask[1] == b"\x0a" and b"\x0a" in self.keys[0]):
            raise ValueError(f"a mask is a 'tfrecord' table's feature key, a 'framed' table's field of kind code 10 "
                             f"or a 'whole' table's byte ranges (got {self.mask!r} for kind {self.kind!r}"
                             f"{' with ranges' if ranges else ''})")
        if ranges != (self.mask_sizes is not None) or (ranges or self.mask_crcs is not None) and \
                (self.mask is None or self.mask[1] is not None):
            raise ValueError("mask ranges (offsets and sizes, their CRC32Cs optional) go with a 'whole' table's mask")


@dataclass(frozen=True)
class NativeBoxes:
    """A detection source's boxes and fields for the native engine, handed over once: sample i's boxes are rows
    ``starts[i]:starts[i + 1]`` of ``boxes`` (``[M, 4]``, as its records hold them: the source's ``box_format``,
    relative where the source's ``relative`` says); ``per_box[name]`` one value per box (int64 or float32, as
    the records' field), ``per_sample[name]`` one int64 per sample; ``declared[i]`` the (height, width) the boxes
    are in, which the image's probed size must be (None: not checked)."""

    boxes: np.ndarray                 # [M, 4]
    starts: np.ndarray                # int64 [n + 1]
    per_box: dict[str, np.ndarray]
    per_sample: dict[str, np.ndarray]
    declared: np.ndarray | None = None   # int64 [n, 2]

    def __post_init__(self):
        m = int(self.starts[-1]) if len(self.starts) else -1
        if len(self.starts) < 1 or len(self.boxes) != m or any(len(v) != m for v in self.per_box.values()):
            raise ValueError(f"native boxes: starts end at {m}, boxes and per-box fields must hold that many rows")


@dataclass(frozen=True)
class RecordBoxes:
    """A detection source whose boxes are inside each record (a "tfrecord" table of the Object Detection API
    layout): the engine scans them out of every record it reads, with no pass over the records at start. ``boxes``
    the keys of the four normalized coordinate lists (xmin, ymin, xmax, ymax: float lists) and of the image's height
    and width (one int64 each), which scale them to pixels as the reader does; ``per_box[name]`` (key, kind) of a
    list with one value per box (kind "ints" or "floats"); ``per_sample[name]`` (key, kind) of one int64 per sample
    (kind "int", or "decimal": one bytes value holding a decimal id, as ``image/source_id``)."""

    boxes: tuple[str, ...]
    per_box: dict[str, tuple[str, str]]
    per_sample: dict[str, tuple[str, str]]

    def __post_init__(self):
        if len(self.boxes) != 6 or any(kind not in ("ints", "floats") for _, kind in self.per_box.values()) or \
                any(kind not in ("int", "decimal") for _, kind in self.per_sample.values()):
            raise ValueError(f"record boxes: six box keys, per-box ints or floats, per-sample int or decimal (got "
                             f"{self})")
