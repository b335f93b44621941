"""The converter's manifest.json read as untrusted input (issue 38, item 2): a malformed one is a typed error
naming it from the Loader, `open_source` and `ingest verify` (no traceback), and a dataset that disagrees with
it (a file missing, truncated, an index that dropped records) is named before it is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_image_folder

import ingest
from ingest.errors import CorruptRecordError
from ingest.formats import detect, open_source
from ingest.tools.cli import main

GARBAGE = [
    b"{not json", b"[]", b'"tfrecord"', b"\xff\xfe", b"[" * 100_000,
    b'{"format": 5}', b'{"format": ["x"]}', b'{"format": "tfrec"}', b'{"format": "recordio", "shards": "all"}',
    b'{"format": "recordio", "shards": [7]}', b'{"format": "recordio", "shards": [{"stem": "data-00000"}]}',
    b'{"format": "recordio", "classes": "cat"}', b'{"format": "recordio", "fields": {"image": 3}}',
    b'{"format": "recordio", "fields": {"image": {"kind": "jpeg"}}}', b'{"format": "recordio", "count": -1}',
    b'{"format": "recordio", "count": 3, "shards": []}', b'{"format": "recordio", "options": []}',
    b'{"format": "recordio", "boxes": {"box_format": "ltrb"}}',
    b'{"format": "recordio", "shards": [{"stem": "s", "start": 0, "stop": 2, "count": 2, "bytes": 1, '
    b'"files": [{"name": "../../etc/passwd", "bytes": 1, "sha256": "x"}]}]}',
    b'{"format": "recordio", "shards": [{"stem": "s", "start": 0, "stop": 2, "count": 5, "bytes": 1, "files": []}]}',
    b'{"format": "recordio", "shards": [{"stem": "t", "start": 0, "stop": 2, "count": 2, "bytes": 1, '
    b'"files": [{"name": "s.rec", "bytes": 1, "sha256": "x"}]}]}',
]


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("manifest")
    folder = make_image_folder(root / "src", {"a": 3, "b": 3})
    assert main(["convert", str(folder), str(root / "rec"), "--to", "recordio", "--shard-size", "3", "-q"]) == 0
    return root / "rec"


@pytest.fixture
def copy(packed, tmp_path) -> Path:
    out = tmp_path / "rec"
    out.mkdir()
    for f in packed.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


@pytest.mark.parametrize("text", GARBAGE, ids=range(len(GARBAGE)))
def test_malformed_manifest_is_a_typed_error_naming_it(copy, text, capsys):
    manifest = copy / "manifest.json"
    manifest.write_bytes(text)
    for call in (lambda: detect(copy), lambda: open_source(copy, format="recordio"),
                 lambda: ingest.Loader(copy, batch_size=2, device="cpu", output="dict")):
        with pytest.raises(CorruptRecordError, match="manifest.json: malformed manifest") as err:
            call()
        assert err.value.path == str(manifest)
    assert main(["verify", str(copy)]) == 1
    out = capsys.readouterr()
    assert f"BAD {manifest}" in out.out and "Traceback" not in out.err + out.out


def test_files_are_checked_against_the_manifest_before_they_are_read(copy):
    shard = copy / "shard-00001-of-00002.rec"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CorruptRecordError, match=r"shard-00001-of-00002\.rec at byte \d+: \d+ bytes, but .*says"):
        open_source(copy)
    shard.unlink()
    with pytest.raises(CorruptRecordError, match=r"shard-00001-of-00002\.rec: missing: .*manifest\.json lists it"):
        open_source(copy)


def test_index_counts_are_checked_against_the_manifest(copy):
    """A RecordIO index with its last line dropped still starts at 0 and tiles nothing twice: the manifest's
    count for its shard names it (the size check is passed by rewriting the manifest's entry)."""
    idx = copy / "shard-00000-of-00002.idx"
    idx.write_text("".join(idx.read_text().splitlines(keepends=True)[:-1]))
    (copy / "shard-00000-of-00002.crc32c").unlink()   # (whose count would name the shard first)
    doc = json.loads((copy / "manifest.json").read_text())
    doc["shards"][0]["files"] = [f for f in doc["shards"][0]["files"] if not f["name"].endswith(".crc32c")]
    from ingest.tools.manifest import file_entry
    doc["shards"][0]["files"] = [file_entry(str(copy), f["name"]) for f in doc["shards"][0]["files"]]
    (copy / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(CorruptRecordError, match=r"shard-00000-of-00002\.rec: its index gives 2 records, .* lists 3"):
        open_source(copy)
