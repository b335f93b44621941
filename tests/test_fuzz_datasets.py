"""Mutated datasets as `ingest convert` writes them, every format and every kind of file (issue 38, item 4): the
data files, their indexes and CRC files, and manifest.json get bit flips, truncations, inserted and deleted
runs, huge length fields, swapped blocks, edited, repeated, dropped and swapped index lines and garbage JSON.
Each case is opened and read in a forked child (`conftest.isolated`), so a SIGBUS or SIGABRT fails the test
instead of killing pytest. Every case must end with no crash and no exception but `IngestError`; with the
manifest beside the data and ``check="crc"``, every sample that reads is the sample that was written (a data
or side file change is a typed error, never a silently wrong sample). A changed manifest itself is only held
to the first two rules (nothing checks a manifest's own bytes). Cases are drawn from fixed seeds, so the run
is the same every time."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import isolated, make_image_folder

from ingest.tools.cli import main

FORMATS = ("tfrecord", "recordio", "lmdb", "wds", "raw")
CASES_PER_FILE = 10          # mutations per file of each dataset (kinds drawn from the seed)
HUGE = [b"\xff" * 8, (2 ** 31).to_bytes(4, "little"), (2 ** 63 - 1).to_bytes(8, "little"), b"\xff\xff\xff\x1f"]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz_datasets")
    folder = make_image_folder(root / "src", {"a": 3, "b": 3}, size=(16, 20))
    out = {}
    for fmt in FORMATS:
        extra = ["--raw-size", "8x8"] if fmt == "raw" else []
        assert main(["convert", str(folder), str(root / fmt), "--to", fmt, "--shard-size", "3", "-q", *extra]) == 0
        out[fmt] = root / fmt
    return out


def read_all(path: str, fmt: str) -> str:
    """Open the dataset and read every sample: JSON of ``{"open": error}`` or ``{"samples": [...]}``, each a
    digest of the image bytes and the label, or the ingest error's type. Anything else escapes (and fails)."""
    from ingest.errors import IngestError
    from ingest.formats import open_source, read_location
    try:
        src = open_source(path, check="crc") if fmt != "tfrecord" else open_source(path)
        n = len(src)
    except IngestError as err:
        return json.dumps({"open": type(err).__name__})
    samples = []
    for i in range(n):
        try:
            rec = src.parse(i, read_location(src.locate(i)))
            image = np.ascontiguousarray(np.asarray(rec.image)).tobytes()
            samples.append([hashlib.sha256(image).hexdigest()[:16], int(rec.label)])
        except IngestError as err:
            samples.append(type(err).__name__)
    return json.dumps({"samples": samples})


def _run(fn, where: str, *args) -> dict:
    """``fn(*args)`` in a forked child (`isolated`), its JSON result; a foreign exception fails the test."""
    out = isolated(fn, *args)
    if out.startswith("<"):
        pytest.fail(f"{where}: {out[:2000]}")
    return json.loads(out)


def _mutate_bytes(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    out = bytearray(data)
    kind = rng.choice(["flip", "flips", "truncate", "insert", "delete", "huge", "swap"])
    pos = rng.randrange(max(len(out), 1))
    if kind == "flip" and out:
        out[pos] ^= 1 << rng.randrange(8)
    elif kind == "flips" and out:
        for _ in range(rng.randint(2, 12)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del out[pos:]
    elif kind == "insert":
        out[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif kind == "delete":
        del out[pos:pos + rng.randint(1, 64)]
    elif kind == "huge":
        word = rng.choice(HUGE)
        out[pos:pos + len(word)] = word
    elif len(out) > 64:   # swap two blocks of the same size
        n = rng.randint(4, min(512, len(out) // 2))
        a, b = sorted(rng.sample(range(len(out) - n), 2))
        if b - a >= n:
            out[a:a + n], out[b:b + n] = out[b:b + n], out[a:a + n]
    return kind, bytes(out)


def _mutate_lines(text: str, rng: random.Random) -> tuple[str, str]:
    lines = text.splitlines(keepends=True)
    kind = rng.choice(["drop", "repeat", "swap", "edit", "empty"])
    k = rng.randrange(max(len(lines), 1))
    if kind == "drop" and lines:
        del lines[k]
    elif kind == "repeat" and lines:
        lines.insert(k, lines[k])
    elif kind == "swap" and len(lines) > 1:
        j = rng.randrange(len(lines))
        lines[k], lines[j] = lines[j], lines[k]
    elif kind == "edit" and lines:
        words = lines[k].split()
        w = rng.randrange(len(words))
        words[w] = str(int(words[w]) + rng.choice([-512, -4, -1, 1, 4, 512, 2 ** 40]))
        lines[k] = ("\t" if "\t" in lines[k] else " ").join(words) + "\n"
    else:
        lines = []
    return kind, "".join(lines)


def _mutate_json(text: str, rng: random.Random) -> tuple[str, str]:
    doc = json.loads(text)
    kind = rng.choice(["number", "swap", "drop", "type", "garbage"])
    if kind == "garbage":
        return kind, rng.choice(["", "{", "[]", "null", '{"format": ["x"]}', "[" * 5000, "\ud800"])
    lists = [(d, k) for d, k in _containers(doc) if isinstance(d[k], list) and d[k]]
    numbers = [(d, k) for d, k in _containers(doc) if type(d[k]) is int]
    if kind == "number" and numbers:
        d, k = rng.choice(numbers)
        d[k] += rng.choice([-512, -1, 1, 512, 2 ** 62])
    elif kind in ("swap", "drop") and lists:
        d, k = rng.choice(lists)
        if kind == "swap" and len(d[k]) > 1:
            i, j = rng.sample(range(len(d[k])), 2)
            d[k][i], d[k][j] = d[k][j], d[k][i]
        else:
            d[k].pop(rng.randrange(len(d[k])))
    else:
        d, k = rng.choice(list(_containers(doc)))
        d[k] = rng.choice([None, "x", 3.5, [], {}, True])
    return kind, json.dumps(doc)


def _containers(doc):
    """(container, key) of every value inside a JSON document."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        yield doc, k
        yield from _containers(v)


def _mutate(path: Path, rng: random.Random) -> str:
    name = path.name
    if name.endswith((".json", ".tar.idx")) and rng.random() < 0.7:
        kind, text = _mutate_json(path.read_text(), rng)
        path.write_text(text, errors="surrogatepass")
    elif name.endswith(".idx") and not name.endswith(".tar.idx") and rng.random() < 0.7:
        kind, text = _mutate_lines(path.read_text(), rng)
        path.write_text(text)
    else:
        kind, data = _mutate_bytes(path.read_bytes(), rng)
        path.write_bytes(data)
    return kind


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("fmt", FORMATS)
def test_mutated_datasets_read_right_or_fail_typed(datasets, fmt, tmp_path):
    pristine = json.loads(isolated(read_all, str(datasets[fmt]), fmt))
    want = pristine["samples"]
    assert len(want) == 6 and all(isinstance(s, list) for s in want)
    rng = random.Random(f"{fmt}-38")
    outcomes = {"open": 0, "failed": 0, "read": 0}
    for original in _files(datasets[fmt]):
        rel = original.relative_to(datasets[fmt])
        for case in range(CASES_PER_FILE):
            copy = tmp_path / f"{rel.name}-{case}"
            shutil.copytree(datasets[fmt], copy)
            kind = _mutate(copy / rel, rng)
            where = f"{fmt}: {rel} {kind} (case {case})"
            got = _run(read_all, where, str(copy), fmt)   # a crash or a foreign exception fails here
            if "open" in got:
                outcomes["open"] += 1
            elif rel.name != "manifest.json":
                for i, sample in enumerate(got["samples"]):
                    if isinstance(sample, list):
                        assert i < len(want) and sample == want[i], f"{where}: sample {i} read wrong"
                        outcomes["read"] += 1
                    else:
                        outcomes["failed"] += 1
            shutil.rmtree(copy)
    assert outcomes["open"] + outcomes["failed"] > 0, outcomes   # the damage was seen


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio", "wds"])
def test_mutated_indexes_without_a_manifest(datasets, fmt, tmp_path):
    """The index checks of their own (tiling, extents, tar headers, the shard's labels), with no manifest to
    name an edited index first: every sample that reads is the one written."""
    want = json.loads(isolated(read_all, str(datasets[fmt]), fmt))["samples"]
    rng = random.Random(f"{fmt}-index-38")
    seen = 0
    for original in [p for p in _files(datasets[fmt]) if p.name.endswith(".idx")]:
        rel = original.relative_to(datasets[fmt])
        for case in range(2 * CASES_PER_FILE):
            copy = tmp_path / f"{rel.name}-{case}"
            shutil.copytree(datasets[fmt], copy)
            (copy / "manifest.json").unlink()
            kind = _mutate(copy / rel, rng)
            got = _run(read_all, f"{fmt}: {rel} {kind} (case {case})", str(copy), fmt)
            for i, sample in enumerate(got.get("samples", [])):
                if isinstance(sample, list):
                    assert i < len(want) and sample == want[i], f"{fmt}: {rel} {kind} (case {case}): sample {i}"
                else:
                    seen += 1
            seen += "open" in got
            shutil.rmtree(copy)
    assert seen > 0


def read_lmdb(path: str) -> str:
    """`read_all` for a bare LMDB (no manifest), every value CRC-checked."""
    from ingest.errors import IngestError
    from ingest.formats.lmdb import LMDBSource
    from ingest.formats import read_location
    try:
        src = LMDBSource(path, check="crc")
    except IngestError as err:
        return json.dumps({"open": type(err).__name__})
    out = []
    for i in range(len(src)):
        try:
            rec = src.parse(i, read_location(src.locate(i)))
            out.append([hashlib.sha256(np.asarray(rec.image).tobytes()).hexdigest()[:16], int(rec.label)])
        except IngestError as err:
            out.append(type(err).__name__)
    return json.dumps({"samples": out})


def test_mutated_lmdb_pages(tmp_path):
    """A database of small values (a tree of several levels, many branch and leaf pages) with pages zeroed or
    garbled, bits flipped, the file cut: liblmdb asserted (SIGABRT) or faulted (SIGBUS) on such files."""
    from ingest.formats import Field, Record
    from ingest.formats.lmdb import LMDBWriter
    w = LMDBWriter(tmp_path, "db", {"image": Field("image"), "label": Field("int")})
    for i in range(2000):
        w.add(Record(b"\xff\xd8\xff" + bytes([i % 251]) * (8 + i % 40), i % 7))
    w.close()
    data = tmp_path / "db.lmdb" / "data.mdb"
    pristine, whole = json.loads(isolated(read_lmdb, str(data.parent)))["samples"], data.read_bytes()
    rng, psize = random.Random("lmdb-pages-38"), 4096
    for case in range(60):
        raw = bytearray(whole)
        kind = rng.choice(["zero", "garble", "flip", "truncate", "header"])
        page = rng.randrange(len(raw) // psize)
        if kind == "zero":
            raw[page * psize:(page + 1) * psize] = bytes(psize)
        elif kind == "garble":
            at = page * psize + rng.randrange(psize - 64)
            raw[at:at + 64] = bytes(rng.randrange(256) for _ in range(64))
        elif kind == "flip":
            for _ in range(rng.randint(1, 6)):
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        elif kind == "header":   # a page header's bounds or flags
            at = page * psize + rng.randrange(8, 16)
            raw[at] ^= 1 << rng.randrange(8)
        else:
            del raw[rng.randrange(len(raw)):]
        data.write_bytes(bytes(raw))
        got = _run(read_lmdb, f"{kind} page {page} (case {case})", str(data.parent))
        for i, sample in enumerate(got.get("samples", [])):
            if isinstance(sample, list):
                assert i < len(pristine) and sample == pristine[i], f"{kind} page {page} (case {case}): sample {i}"
