"""Reading the converter's ``manifest.json`` (written by `ingest.tools.manifest`; layout there) as untrusted
input, and checking a dataset's files against it when a source opens.

`load` parses and validates the whole document: JSON that does not parse, a value of the wrong type, a
missing key, a file name that leaves the dataset directory are each a `CorruptRecordError` naming the
manifest (and the key at fault), never a `JSONDecodeError`, `KeyError` or `TypeError`. `check_files`
compares what is cheap to compare before anything is read: every listed file is there with the size the
manifest gives (a truncated shard or LMDB is named before it is mapped or indexed), and every side file (an
index, a CRC file, a raw shard's JSON: `SIDE_FILES`, small beside the data) has the manifest's sha256, so an
edited index or label column is named at open; data files are checked record by record as they are read
(framing, `checks`), and whole by ``ingest verify``. `check_counts` compares
the samples a source found with the counts the manifest lists, shard by shard where the source keeps a
per-shard table: an index file that dropped or repeated lines is named by its shard.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from ..errors import CorruptRecordError
from ._registry import FORMATS
from .boxes import ALIASES, BOX_FORMATS

#: Endings of the files a shard's records are found or checked through (hashed at open; data files are not).
SIDE_FILES = (".idx", ".json", ".crc32c")
#: Keys of a shard entry and the JSON types they must have.
_SHARD_KEYS = {"stem": str, "start": int, "stop": int, "count": int, "bytes": int, "files": list}
_FILE_KEYS = {"name": str, "bytes": int, "sha256": str}


def _bad(path: str, message: str) -> CorruptRecordError:
    return CorruptRecordError(f"malformed manifest: {message}", path=path)


def _typed(value: Any, kind: type) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return isinstance(value, kind)


def parse(doc: Any, path: str) -> dict[str, Any]:
    """``doc`` checked as a manifest; returns it. ``format`` is required; every other key the converter writes
    may be absent (a hand-written manifest naming the format and classes), but one that is there must have
    its type, and a shard entry must be whole."""
    if not isinstance(doc, dict):
        raise _bad(path, f"expected a JSON object, got {type(doc).__name__}")
    fmt = doc.get("format")
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise _bad(path, f"`format` is {fmt!r}. Available: {', '.join(sorted(FORMATS))}")
    for key, kind in (("fields", dict), ("options", dict), ("source", dict), ("boxes", dict)):
        if key in doc and doc[key] is not None and not isinstance(doc[key], kind):
            raise _bad(path, f"`{key}` must be an object, got {type(doc[key]).__name__}")
    classes = doc.get("classes", [])
    if classes is not None and not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
        raise _bad(path, "`classes` must be a list of strings")
    for name, entry in (doc.get("fields") or {}).items():
        from .base import Field
        try:
            if not isinstance(entry, dict):
                raise TypeError(f"expected an object, got {type(entry).__name__}")
            Field.from_json(entry)
        except (KeyError, TypeError, ValueError) as err:
            raise _bad(path, f"field {name!r}: {err}") from None
    boxes = doc.get("boxes")
    if boxes and (ALIASES.get(boxes.get("box_format"), boxes.get("box_format")) not in BOX_FORMATS
                  or not isinstance(boxes.get("relative"), bool)):
        raise _bad(path, f"`boxes` must hold `box_format` ({', '.join(BOX_FORMATS)}) and `relative` (true or false)")
    shards = doc.setdefault("shards", [])
    if not isinstance(shards, list):
        raise _bad(path, "`shards` must be a list")
    for k, shard in enumerate(shards):
        _shard(shard, path, k)
    for key in ("count", "bytes"):
        if key in doc and not _typed(doc[key], int):
            raise _bad(path, f"`{key}` must be an integer >= 0, got {doc[key]!r}")
    if "count" in doc and sum(s["count"] for s in shards) != doc["count"]:
        raise _bad(path, f"`count` is {doc['count']} but the shards hold {sum(s['count'] for s in shards)}")
    return doc


def _shard(shard: Any, path: str, k: int) -> None:
    if not isinstance(shard, dict):
        raise _bad(path, f"shard {k} is not an object")
    for key, kind in _SHARD_KEYS.items():
        if not _typed(shard.get(key), kind):
            raise _bad(path, f"shard {k}: `{key}` must be {'an integer >= 0' if kind is int else kind.__name__}, "
                             f"got {shard.get(key)!r}")
    if shard["count"] > shard["stop"] - shard["start"] or shard["stop"] < shard["start"]:
        raise _bad(path, f"shard {k}: count {shard['count']} does not fit its range {shard['start']}.."
                         f"{shard['stop']}")
    for entry in shard["files"]:
        if not isinstance(entry, dict) or not all(_typed(entry.get(a), t) for a, t in _FILE_KEYS.items()):
            raise _bad(path, f"shard {k}: a file entry must hold name, bytes and sha256, got {entry!r:.120}")
        name = entry["name"]
        if not name or "\0" in name or os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
            raise _bad(path, f"shard {k}: file name {name!r} is outside the dataset directory")
        if not any(part.startswith(shard["stem"]) for part in name.split("/")):
            raise _bad(path, f"shard {k}: file {name!r} is not named after the shard's stem {shard['stem']!r}")


def load(path: str) -> dict[str, Any]:
    """The final manifest at ``path``, validated (`parse`)."""
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise _bad(path, f"not valid JSON: {err}") from None
    except OSError as err:
        raise CorruptRecordError(f"cannot read the manifest: {err.strerror or err}", path=path) from err
    return parse(doc, path)


def check_files(directory: str, doc: dict[str, Any], path: str) -> None:
    """Every file the manifest lists is in ``directory`` with the size it gives."""
    for shard in doc["shards"]:
        for entry in shard["files"]:
            file = os.path.join(directory, entry["name"])
            try:
                size = os.stat(file).st_size
            except OSError:
                raise CorruptRecordError(f"missing: {path} lists it ({entry['bytes']} bytes)", path=file) from None
            if size != entry["bytes"]:
                raise CorruptRecordError(f"{size} bytes, but {path} says {entry['bytes']} (truncated or rewritten)",
                                         path=file, offset=min(size, entry["bytes"]))
            if entry["name"].endswith(SIDE_FILES) and sha256(file) != entry["sha256"]:
                raise CorruptRecordError(f"sha256 differs from the one {path} gives: the file was edited, or "
                                         "belongs to another dataset", path=file)


def sha256(path: str, chunk: int = 1 << 22) -> str:
    """The sha256 (hex) of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def check_counts(directory: str, doc: dict[str, Any], source: Any, path: str) -> None:
    """The samples ``source`` found against the manifest's counts: per shard file where the source keeps a
    table of its shards (TFRecord, RecordIO, WebDataset), else in total."""
    if getattr(source, "streamed", False):
        return
    per_file = _shard_counts(source)
    if per_file:
        for shard in doc["shards"]:
            for entry in shard["files"]:
                file = os.path.realpath(os.path.join(directory, entry["name"]))
                if file in per_file and per_file[file] != shard["count"]:
                    raise CorruptRecordError(
                        f"its index gives {per_file[file]} records, {path} lists {shard['count']} for shard "
                        f"{shard['stem']!r} (an index that dropped or repeated lines?)", path=file)
    if "count" in doc and len(source) != doc["count"]:
        raise CorruptRecordError(f"{path} lists {doc['count']} samples, the dataset's indexes give {len(source)}",
                                 path=directory)


def _shard_counts(source: Any) -> dict[str, int]:
    """Samples per shard file (real paths) of a source with a shard table, else empty."""
    shards = getattr(source, "shards", None)
    starts = getattr(getattr(source, "_table", None), "starts", None)
    if starts is None:
        starts = getattr(getattr(source, "_members", None), "starts", None)
    if not shards or starts is None or len(starts) != len(shards) + 1:
        return {}
    return {os.path.realpath(s): starts[k + 1] - starts[k] for k, s in enumerate(shards)}
