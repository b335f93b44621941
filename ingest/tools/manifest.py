"""The manifest `ingest convert` writes beside its shards, and the checks `verify` and ``--resume`` run on it.

``manifest.json`` (``formats.MANIFEST``) is written once the conversion is complete; while it runs, the
committed shards are recorded in the journal ``manifest.partial.jsonl``: its first line is the header (the
manifest without ``shards``), then one line per committed shard, appended and fsynced as each is committed
(so a commit costs one short write, not a rewrite of every entry; a line cut short by a kill is ignored).
The manifest holds::

    {"format": "tfrecord", "version": 1,
     "source": {"path": ..., "format": ..., "count": ...},
     "options": {...what decides the bytes: sharding, re-encoding, writer options...},
     "fields": {"image": {"kind": "image"}, "label": {"kind": "int"}},
     "classes": [...],
     "shards": [{"stem": ..., "start": 0, "stop": 1000, "count": 998, "bytes": ...,
                 "files": [{"name": ..., "bytes": ..., "sha256": ...}], "failures": [[name, stage, reason]]}],
     "count": ..., "bytes": ...}          # totals: the final manifest only

A shard's ``start``/``stop`` is its range of source samples; ``count`` is how many it holds (fewer when
samples failed under ``max_failures``). Nothing in it depends on the run (no times, no worker counts), so
a resumed run writes the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .._atomic import atomic_write
from ..formats import MANIFEST, _manifest
from ..formats._manifest import sha256
from ..formats.base import Field

PARTIAL = "manifest.partial.jsonl"
VERSION = 1


def fields_json(fields: dict[str, Field]) -> dict[str, dict[str, Any]]:
    """Fields as the manifest stores them (`Field.to_json`)."""
    return {name: f.to_json() for name, f in fields.items()}


def write_atomic(path: str, data: dict[str, Any]) -> None:
    """Write JSON to ``path`` through a temporary file and a rename (readers never see half a file)."""
    with atomic_write(path) as f:
        json.dump(data, f, indent=1)
        f.write("\n")


class Journal:
    """The partial manifest of a running conversion: ``header`` and the ``shards`` already kept, written
    afresh (atomically), then one line appended per `commit`."""

    def __init__(self, directory: str, header: dict[str, Any], shards: list[dict[str, Any]]):
        self.path = os.path.join(directory, PARTIAL)
        with atomic_write(self.path) as f:
            f.writelines(json.dumps(entry) + "\n" for entry in [header, *shards])

    def commit(self, shard: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(shard) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def remove(self) -> None:
        if os.path.exists(self.path):
            os.remove(self.path)


def load(directory: str) -> tuple[dict[str, Any] | None, bool]:
    """The manifest in ``directory`` and whether it is the final one; else the journal of an unfinished run
    as a manifest (its shards in order, the last entry of a stem winning), or None. Either is validated: a
    malformed one is a CorruptRecordError naming its file (`formats._manifest`)."""
    path = os.path.join(directory, MANIFEST)
    if os.path.exists(path):
        return _manifest.load(path), True
    path = os.path.join(directory, PARTIAL)
    if not os.path.exists(path):
        return None, False
    with open(path) as f:
        lines = f.read().split("\n")
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:   # the line a kill cut short (or the empty one after the last newline)
            continue
    if not entries:
        return None, False
    header = _manifest.parse(entries[0], path)   # the header, then each shard line, as a manifest
    for shard in entries[1:]:
        _manifest.parse({**header, "shards": [shard]}, path)
    shards = {s["stem"]: s for s in entries[1:]}
    return {**header, "shards": sorted(shards.values(), key=lambda s: s["start"])}, False


def file_entry(directory: str, name: str) -> dict[str, Any]:
    """The manifest entry of one written file: name (relative), size and sha256."""
    path = os.path.join(directory, name)
    return {"name": name, "bytes": os.path.getsize(path), "sha256": sha256(path)}


def check_shard(directory: str, shard: dict[str, Any]) -> list[str]:
    """What is wrong with a shard's files in ``directory`` against its manifest entry (empty: nothing)."""
    problems = []
    for entry in shard["files"]:
        path = os.path.join(directory, entry["name"])
        if not os.path.isfile(path):
            problems.append(f"{path}: missing")
        elif os.path.getsize(path) != entry["bytes"]:
            problems.append(f"{path}: {os.path.getsize(path)} bytes, the manifest says {entry['bytes']}")
        elif sha256(path) != entry["sha256"]:
            problems.append(f"{path}: sha256 differs from the manifest's")
    return problems
