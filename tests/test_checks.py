"""Per-record CRC32C checks (issue 38, item 3): the RecordIO, LMDB, WebDataset and raw writers record each
record's CRC, and a reader with ``check="crc"`` fails a record whose bytes changed, naming its file and
offset, while the others read as written."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import jpeg_bytes

from ingest import defaults
from ingest.errors import ConfigError, CorruptRecordError
from ingest.formats import Field, Record, read_location, reader_class, writer_class
from ingest.formats import checks

FORMATS = ["recordio", "lmdb", "wds", "raw"]
N = 4


def _write(fmt: str, root) -> str:
    fields = {"image": Field("image"), "label": Field("int")}
    if fmt == "raw":
        fields = {"image": Field("pixels", (8, 8, 3), "uint8"), "label": Field("int")}
    writer = writer_class(fmt)(root, "s", fields)
    for i in range(N):
        image = np.full((8, 8, 3), i, np.uint8) if fmt == "raw" else jpeg_bytes(16, 16, seed=i)
        writer.add(Record(image, i))
    names = writer.close()
    return str(root / ("s.lmdb" if fmt == "lmdb" else names[0]))


def _image_byte(src, i: int) -> tuple[str, int]:
    """A byte of sample ``i``'s image in its data file: the framing stays whole, only a CRC can tell."""
    loc = src.locate(i)
    loc = loc[0] if isinstance(loc, tuple) else loc
    return loc.path, loc.offset + loc.length - 40   # the JPEG's entropy-coded tail / the last pixels


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


def _read(src, i):
    return src.parse(i, read_location(src.locate(i)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_changed_record_fails_alone_naming_file_and_offset(tmp_path, fmt):
    path = _write(fmt, tmp_path)
    cls = reader_class(fmt)
    want = [_read(cls(path, check="none"), i) for i in range(N)]
    data, offset = _image_byte(cls(path, check="none"), 1)
    _flip(data, offset)
    src = cls(path, check="crc")
    with pytest.raises(CorruptRecordError, match=r"CRC32C [0-9a-f]{8} of the record's \d+ bytes differs") as err:
        _read(src, 1)
    assert err.value.path == data and err.value.offset is not None and err.value.offset <= offset
    batch = getattr(src, "parse_batch", None)
    got = batch(range(N), [read_location(src.locate(i)) for i in range(N)]) if batch else \
        [_try(src, i) for i in range(N)]
    assert isinstance(got[1], CorruptRecordError)
    for i in (0, 2, 3):
        assert bytes(np.asarray(got[i].image).tobytes()) == bytes(np.asarray(want[i].image).tobytes())
        assert got[i].label == want[i].label == i
    silent = _read(cls(path, check="none"), 1)   # without the check the changed bytes come back
    assert bytes(np.asarray(silent.image).tobytes()) != bytes(np.asarray(want[1].image).tobytes())


def _try(src, i):
    try:
        return _read(src, i)
    except CorruptRecordError as err:
        return err


def _drop_crcs(fmt: str, path: str) -> None:
    if fmt in ("recordio", "wds"):
        os.remove(os.path.splitext(path)[0] + ".crc32c" if fmt == "recordio" else path + ".crc32c")
    elif fmt == "raw":
        import json
        index = path + ".json"
        doc = json.load(open(index))
        doc["arrays"] = {k: v for k, v in doc["arrays"].items() if not k.endswith(".crc32c")}
        json.dump(doc, open(index, "w"))
    else:
        import lmdb
        from ingest.formats.lmdb import _ENVS
        _ENVS.close()   # py-lmdb opens a database once per process
        env = lmdb.open(path, map_size=1 << 26)
        with env.begin(write=True) as txn:
            txn.delete(b"__crc32c__")
        env.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_modes_and_datasets_without_crcs(tmp_path, fmt):
    path = _write(fmt, tmp_path)
    cls = reader_class(fmt)
    assert (cls(path)._crcs is not None) == (fmt in checks.DEFAULT_ON)   # "auto"
    with defaults.set(check="crc"):
        assert cls(path)._crcs is not None
    with defaults.set(check="none"):
        assert cls(path)._crcs is None
    with pytest.raises(ConfigError, match="`check` must be one of auto, crc, none"):
        cls(path, check="sha")
    _drop_crcs(fmt, path)
    assert cls(path)._crcs is None and _read(cls(path), 2).label == 2   # older datasets read as before
    with pytest.raises(ConfigError, match="holds no per-record CRC32C"):
        cls(path, check="crc")


def test_crc_file_that_does_not_fit_is_named(tmp_path):
    path = _write("recordio", tmp_path)
    side = tmp_path / "s.crc32c"
    whole = side.read_bytes()
    for bad, message in [(whole[:-2], "a CRC file of 4 records has"), (b"XXXX" + whole[4:], "not a CRC file"),
                         (whole[:4] + (9).to_bytes(8, "little") + whole[12:], "holds the CRCs of 9 records")]:
        side.write_bytes(bad)
        with pytest.raises(CorruptRecordError, match=message) as err:
            reader_class("recordio")(path)
        assert err.value.path == str(side)
