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


@pytest.fixture(params=["native", "python"])
def batch_check(request, monkeypatch):
    """The readers' batch check on each path: ``ingest._readv.crcs`` (one GIL release a batch) or `checks.crc` of
    each record (the reference, and the path where no compiler was found)."""
    if request.param == "native" and checks.NATIVE is None:
        pytest.skip("ingest._readv was not built")
    if request.param == "python":
        monkeypatch.setattr(checks, "NATIVE", None)
    return request.param


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_changed_record_fails_alone_naming_file_and_offset(tmp_path, fmt, batch_check):
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


# -- the native CRC32C (ingest/_native/crc32c.h) against the crc32c package ------------------------------------

native_crc = pytest.mark.skipif(checks.NATIVE is None, reason="ingest._readv was not built")


@native_crc
@pytest.mark.parametrize("software", [False, True])
def test_native_crc32c_is_the_packages(software):
    """Every length 0..64 at every start 0..7 (unaligned heads and tails), and large buffers; ``software``: the
    slicing-by-8 tables even where the CPU has SSE4.2."""
    import crc32c
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 1 << 20, np.uint8).tobytes()
    view = memoryview(data)
    for n in range(65):
        for start in range(8):
            part = view[start:start + n]
            assert checks.NATIVE.crc32c(part, software) == crc32c.crc32c(part), (n, start)
    # (the SSE4.2 path runs three streams over 3 x 8192 and 3 x 256 bytes: lengths about those)
    for n, start in [(1 << 20, 0), ((1 << 20) - 3, 3), (81_001, 5), (4096, 1), (123_457, 7), (767, 0), (768, 0),
                     (769, 3), (1543, 1), (24_575, 0), (24_576, 0), (24_577, 2), (24_576 + 768, 4), (49_160, 6)]:
        part = view[start:start + n]
        assert checks.NATIVE.crc32c(part, software) == crc32c.crc32c(part), (n, start)


@native_crc
def test_batch_crcs_native_and_reference_agree(monkeypatch):
    rng = np.random.default_rng(3)
    blob = rng.integers(0, 256, 300_000, np.uint8)
    buffers = [blob[s:s + n] for s, n in [(0, 0), (1, 1), (3, 63), (5, 81_000), (7, 200_001)]] + \
        [bytes(blob[:17]), bytearray(blob[:100]), memoryview(blob.tobytes())[9:5000]]
    got = checks.crcs(buffers)
    monkeypatch.setattr(checks, "NATIVE", None)
    assert got.dtype == np.uint32 and got.tolist() == checks.crcs(buffers).tolist() == \
        [checks.crc(b) for b in buffers]
    table = checks.table([got])
    assert checks.matches(buffers, range(len(buffers)), table).all()
    assert checks.matches(buffers[::-1], range(len(buffers)), table).tolist() == \
        [a == b for a, b in zip(got.tolist(), got.tolist()[::-1])]
