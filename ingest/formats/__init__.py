"""Format readers and writers: one module per format. See `base` for the contract.

`open_source(path, format=None, **options)` picks the format from the path (`detect`) and opens it;
`writer_class(format)` gives a format's shard writer for the converter. Format modules are imported on
first use, so a missing optional dependency only matters to the format that needs it.
"""

from __future__ import annotations

import glob
import importlib
import inspect
import os
from typing import Any, Sequence

from ..errors import ConfigError, SourceError
from .base import (DEFAULT_FIELDS, KINDS, Field, Location, ProcessLocal, Record, Source, check_format, fields_of,
                   iter_records, read_location)
from .filetree import IMAGE_EXTENSIONS, FileList, FileTree
from .memory import MemorySource
from . import _manifest, boxes
from ._registry import FORMATS   # format name -> (module, reader class, writer class or None)

#: Shard file endings -> format (longest first when matching).
SUFFIXES = {".tfrecord": "tfrecord", ".tfrecords": "tfrecord", ".record": "tfrecord", ".tfrecord.gz": "tfrecord",
            ".tfrecords.gz": "tfrecord", ".record.gz": "tfrecord", ".rec": "recordio", ".tar": "wds",
            ".tgz": "wds", ".tar.gz": "wds", ".json": "coco", ".raw": "raw", ".raw.json": "raw"}

#: Name of the manifest the converter writes beside its shards (it names the format).
MANIFEST = "manifest.json"
#: Name of a raw-shard dataset's index file.
RAW_INDEX = "ingest-raw.json"


def _module(fmt: str):
    if fmt not in FORMATS:
        raise ConfigError(f"Unknown format {fmt!r}. Available: {', '.join(sorted(FORMATS))}")
    return importlib.import_module(f".{FORMATS[fmt][0]}", __name__)


def reader_class(fmt: str):
    """The reader (source) class of format ``fmt``."""
    return getattr(_module(fmt), FORMATS[fmt][1])


def writer_class(fmt: str):
    """The shard writer class of format ``fmt`` (for `ingest convert`)."""
    mod = _module(fmt)
    name = FORMATS[fmt][2]
    if name is None:
        writable = ", ".join(sorted(k for k, v in FORMATS.items() if v[2]))
        raise ConfigError(f"format {fmt!r} can be read but not written. Writable: {writable}")
    return getattr(mod, name)


def _suffix_format(path: str) -> str | None:
    low = path.lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if low.endswith(suffix):
            return SUFFIXES[suffix]
    if "tfrecord" in os.path.basename(low):  # TFX: data_tfrecord-00000-of-00001.gz
        return "tfrecord"
    return None


def detect(path: str | os.PathLike | Sequence[str]) -> str:
    """The format of a dataset path (a file, a directory, a glob, or a list of shard files)."""
    if not isinstance(path, (str, os.PathLike)):
        kinds = {_suffix_format(os.fspath(p)) for p in path}
        if len(kinds) == 1 and None not in kinds:
            return kinds.pop()
        raise SourceError(f"cannot tell the format of shards {list(path)[:3]}...; pass format=")
    path = os.fspath(path)
    if any(c in path for c in "*?[") and not os.path.exists(path):
        return detect(sorted(glob.glob(path)) or [path])
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, MANIFEST)):
            return _manifest.load(os.path.join(path, MANIFEST))["format"]
        if os.path.exists(os.path.join(path, "data.mdb")):
            return "lmdb"
        if os.path.exists(os.path.join(path, RAW_INDEX)):
            return "raw"
        kinds = {_suffix_format(e.name) for e in os.scandir(path) if e.is_file()} - {None, "coco"}
        subdirs = any(e.is_dir() and not e.name.startswith(".") for e in os.scandir(path))
        if len(kinds) == 1 and not subdirs:
            return kinds.pop()
        return "filetree"
    if not os.path.exists(path):
        raise FileNotFoundError(f"dataset path {path!r} does not exist")
    if os.path.basename(path) == RAW_INDEX:
        return "raw"
    if os.path.basename(path) == "data.mdb":
        return "lmdb"
    fmt = _suffix_format(path)
    if fmt is None:
        raise SourceError(f"cannot tell the format of {path!r} from its name; pass format= "
                          f"(one of {', '.join(sorted(FORMATS))})", path=path)
    return fmt


def check_options(cls: type, what: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` checked against the keyword-only arguments of ``cls`` (unknown names are refused)."""
    params = inspect.signature(cls).parameters
    accepted = [name for name, p in params.items() if p.kind == p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(f"the {what} has no option {', '.join(map(repr, unknown))}. "
                          f"Available: {', '.join(accepted) or 'none'}")
    return options


def _declared_kinds(source: Any, declared: dict[str, Field]) -> None:
    """Give a converter output's fields the kinds its manifest records where the format stores them in another
    kind's form (ints and floats as ``.npy`` arrays in a tar; any kind a format keeps as bytes), so a field reads
    back with the kind it was written with. ``pixels`` stay as read: formats that store them encoded (a PNG
    member) give the encoded image, and an encoded image a format stored decoded (raw shards) stays pixels."""
    fields = getattr(source, "fields", None)
    if not isinstance(fields, dict):
        return
    for name, field in declared.items():
        if name in fields and fields[name] != field and field.kind != "pixels" and \
                not (field.kind == "image" and fields[name].kind == "pixels"):
            fields[name] = field


def open_source(path: Any, format: str | None = None, **options: Any) -> Any:
    """Open the dataset at ``path`` with format ``format`` (detected from the path when None); ``options``
    go to the reader (e.g. a TFRecord feature spec); an option the reader does not take is a ConfigError."""
    fmt = format or detect(path)
    cls = reader_class(fmt)
    wanted_boxes = None
    if "box_format" in options and "box_format" not in inspect.signature(cls).parameters:
        options = dict(options)
        wanted_boxes = options.pop("box_format")   # a converter output's stored boxes, converted as read (below)
    check_options(cls, f"{fmt} reader", options)
    manifest = os.path.join(os.fspath(path), MANIFEST) if isinstance(path, (str, os.PathLike)) else None
    meta = None
    if manifest and os.path.isfile(manifest):
        # the converter keeps what the format has no place for; its files are checked before they are opened
        meta = _manifest.load(manifest)
        _manifest.check_files(os.fspath(path), meta, manifest)
        declared = {name: Field.from_json(f) for name, f in (meta.get("fields") or {}).items()}
        spec = getattr(_module(fmt), "reader_spec", None)
        if spec is not None and declared:
            # Every field under the name and of the kind written (a record's bytes may not tell either)
            writer = (meta.get("options") or {}).get("writer")
            options = {**spec(declared, writer if isinstance(writer, dict) else {}), **options}
    source = cls(path, **options)
    if meta is not None:
        _manifest.check_counts(os.fspath(path), meta, source, manifest)
        _declared_kinds(source, declared)
        if meta.get("classes") and not list(getattr(source, "classes", ()) or ()):
            source.classes = list(meta["classes"])
        if meta.get("boxes") and "boxes" in fields_of(source):   # how the stored box values read (xywh, relative)
            stored = boxes.box_format(meta["boxes"]["box_format"])
            source.box_format = boxes.box_format(boxes.DEFAULT if wanted_boxes is None else wanted_boxes)
            source.relative = bool(meta["boxes"]["relative"])
            source.box_conversion = None if stored == source.box_format else \
                boxes.Conversion(stored, source.box_format)
            wanted_boxes = None
    if wanted_boxes is not None:
        raise ConfigError(f"the {fmt} reader has no option 'box_format': it is for COCO, TFRecord and converter "
                          f"outputs whose manifest describes their boxes")
    return source


__all__ = ["Location", "Record", "Source", "Field", "KINDS", "DEFAULT_FIELDS", "ProcessLocal", "check_format",
           "fields_of", "iter_records", "read_location", "FileTree", "FileList", "MemorySource",
           "IMAGE_EXTENSIONS", "FORMATS", "check_options", "detect", "open_source", "reader_class", "writer_class",
           "MANIFEST", "RAW_INDEX"]
