"""The manifest `ingest convert` writes beside its shards, and the checks `verify` and ``--resume`` run on it.

``manifest.json`` (``formats.MANIFEST``) is written once the conversion is complete; while it runs, the
committed shards are listed in ``manifest.partial.json``, replaced atomically after each shard. Both hold::

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

import hashlib
import json
import os
from typing import Any

from ..formats import MANIFEST
from ..formats.base import Field

PARTIAL = "manifest.partial.json"
VERSION = 1


def fields_json(fields: dict[str, Field]) -> dict[str, dict[str, Any]]:
    """Fields as JSON: kind, and shape/dtype where fixed."""
    out = {}
    for name, f in fields.items():
        entry: dict[str, Any] = {"kind": f.kind}
        if f.shape is not None:
            entry["shape"] = [int(d) for d in f.shape]
        if f.dtype is not None:
            entry["dtype"] = f.dtype
        out[name] = entry
    return out


def fields_from_json(data: dict[str, dict[str, Any]]) -> dict[str, Field]:
    """Inverse of `fields_json`."""
    return {name: Field(e["kind"], tuple(e["shape"]) if "shape" in e else None, e.get("dtype"))
            for name, e in data.items()}


def write_atomic(path: str, data: dict[str, Any]) -> None:
    """Write JSON to ``path`` through a temporary file and a rename (readers never see half a file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load(directory: str) -> tuple[dict[str, Any] | None, bool]:
    """The manifest in ``directory`` and whether it is the final one (else the partial one, or None)."""
    for name, final in ((MANIFEST, True), (PARTIAL, False)):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f), final
    return None, False


def sha256(path: str, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


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
