"""The formats ingest reads and writes: name -> (module, reader class, writer class or None). Its own module so
that the modules `ingest.formats` imports (the manifest checks) can name the formats without importing it."""

from __future__ import annotations

FORMATS: dict[str, tuple[str, str, str | None]] = {
    "filetree": ("filetree", "FileTree", "FileTreeWriter"),
    "tfrecord": ("tfrecord", "TFRecordSource", "TFRecordWriter"),
    "recordio": ("recordio", "RecordIOSource", "RecordIOWriter"),
    "lmdb": ("lmdb", "LMDBSource", "LMDBWriter"),
    "wds": ("webdataset", "WebDatasetSource", "WebDatasetWriter"),
    "raw": ("raw", "RawSource", "RawWriter"),
    "coco": ("coco", "CocoSource", None),
}
