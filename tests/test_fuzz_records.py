"""Property-based tests: random and mutated bytes fed to the TFRecord and RecordIO readers (framing scan, index
files, GZIP streams, tf.train.Example and IRHeader parsing) give valid records or typed errors (`IngestError`),
never another exception, a hang or a large allocation."""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.errors import IngestError
from ingest.formats import Field, Record, read_location
from ingest.formats._protos import Example
from ingest.formats.base import _same_record, parse_each, parse_or_error
from ingest.formats.recordio import IR_HEADER, MAGIC, RecordIOSource, RecordIOWriter, chunks
from ingest.formats.tfrecord import TFRecordSource, TFRecordWriter, frame

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
PEAK_LIMIT = 16 * 2 ** 20   # inputs are < 4 KB: nothing may allocate more than this
FAKE_JPEG = b"\xff\xd8\xff\xe0" + bytes(range(60))
MAGIC_BYTES = MAGIC.to_bytes(4, "little")


def _valid_tfrecord(tmp: Path) -> bytes:
    fields = {"image": Field("image"), "label": Field("int"), "boxes": Field("floats"), "mask": Field("array"),
              "name": Field("text")}
    writer = TFRecordWriter(tmp, "seed", fields)
    for i in range(3):
        writer.add(Record(FAKE_JPEG + bytes([i]), i, {"boxes": np.arange(i, dtype=np.float32), "name": f"n{i}",
                                                      "mask": np.ones((2, i + 1), np.uint16)}))
    writer.close()
    return (tmp / "seed.tfrecord").read_bytes()


def _valid_recordio(tmp: Path) -> bytes:
    writer = RecordIOWriter(tmp, "seed", {"image": Field("image"), "label_values": Field("floats")})
    writer.add(Record(FAKE_JPEG, -1, {"label_values": np.array([1, 2, 3], np.float32)}))
    writer.add(Record(FAKE_JPEG[:8] + MAGIC_BYTES + FAKE_JPEG, -1, {"label_values": np.array([4.0], np.float32)}))
    writer.add(Record(MAGIC_BYTES * 3 + FAKE_JPEG[:5], -1, {"label_values": np.array([5.0], np.float32)}))
    writer.close()
    return (tmp / "seed.rec").read_bytes()


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("seeds")
    tf_bytes = _valid_tfrecord(tmp)
    example = Example.FromString(tf_bytes[12:12 + int.from_bytes(tf_bytes[:8], "little")])
    payload = IR_HEADER.pack(2, 0.0, 7, 0) + np.array([1, 2], "<f4").tobytes() + FAKE_JPEG
    return {"tfrecord": tf_bytes, "recordio": _valid_recordio(tmp), "example": example.SerializeToString(),
            "payload": payload}


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """``data`` with a few bit flips, overwrites (lengths, magics), insertions, deletions or a truncation."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "overwrite", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(out) - 1, 0)))
        if op == "flip" and out:
            out[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "overwrite":
            word = draw(st.sampled_from([MAGIC_BYTES, b"\xff\xff\xff\xff", b"\x00\x00\x00\x00",
                                         (2 ** 31).to_bytes(4, "little"), b"\xff\xff\xff\x1f"]))
            out[pos:pos + 4] = word
        elif op == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del out[pos:pos + draw(st.integers(1, 16))]
        else:
            del out[pos:]
    return bytes(out)


def _bounded(read) -> None:
    """Run ``read()``: only IngestError may escape it, and it may not allocate much."""
    tracemalloc.start()
    try:
        read()
    except IngestError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < PEAK_LIMIT, f"allocated {peak} bytes"


def _read_all(src) -> None:
    """Every record of a source, each either a Record or a typed error, and the same from the source's batch
    parse (`parse_each`) as from `parse`; then labels()."""
    if getattr(src, "streamed", False):
        for _, rec in src.iter_shard(0):
            assert isinstance(rec, Record)
        return
    indices, raws = [], []
    for i in range(len(src)):
        try:
            raw = read_location(src.locate(i))
        except IngestError:
            continue
        indices.append(i)
        raws.append(np.frombuffer(raw, np.uint8) if isinstance(raw, bytes) else raw)
    for i, raw, got in zip(indices, raws, parse_each(src, indices, raws)):
        want = parse_or_error(src, i, raw)
        if isinstance(want, Exception):
            assert isinstance(want, IngestError) and type(got) is type(want) and str(got) == str(want)
        else:
            assert isinstance(want, Record) and _same_record(got, want)
    assert len(src.labels()) == len(src)


def _drain(cls, path: Path, **options) -> None:
    _bounded(lambda: _read_all(cls(path, **options)))


def _write(path: Path, data: bytes, index: str | None = None, index_path: Path | None = None) -> Path:
    path.write_bytes(data)
    idx = index_path or Path(f"{path}.idx")
    if index is None:
        idx.unlink(missing_ok=True)
    else:
        idx.write_text(index)
    return path


# -- TFRecord ---------------------------------------------------------------------------------------------

@FUZZ
@given(data=st.binary(max_size=400), check_crc=st.booleans())
def test_tfrecord_random_bytes(tmp_path, data, check_crc):
    _drain(TFRecordSource, _write(tmp_path / "x.tfrecord", data), check_crc=check_crc)


@FUZZ
@given(data=st.data(), check_crc=st.booleans())
def test_tfrecord_mutated_files(tmp_path, seeds, data, check_crc):
    raw = data.draw(mutated(seeds["tfrecord"]))
    _drain(TFRecordSource, _write(tmp_path / "x.tfrecord", raw), check_crc=check_crc)


@FUZZ
@given(data=st.data())
def test_tfrecord_mutated_examples_in_valid_frames(tmp_path, seeds, data):
    """CRCs intact, so the protobuf parser and the feature extraction see the damage."""
    examples = [data.draw(mutated(seeds["example"])) for _ in range(2)]
    path = _write(tmp_path / "x.tfrecord", frame(seeds["example"]) + b"".join(frame(e) for e in examples))
    _drain(TFRecordSource, path)  # fields inferred from the intact first record


@FUZZ
@given(data=st.data())
def test_tfrecord_random_index_files(tmp_path, seeds, data):
    lines = data.draw(st.lists(st.tuples(st.integers(-5, 3000), st.integers(-5, 3000)), max_size=6))
    junk = data.draw(st.sampled_from(["", "x y\n", "12\n", "1 2 3\n"]))
    index = "".join(f"{o} {s}\n" for o, s in lines) + junk
    _drain(TFRecordSource, _write(tmp_path / "x.tfrecord", seeds["tfrecord"], index))


@FUZZ
@given(data=st.data(), check_crc=st.booleans())
def test_tfrecord_mutated_gzip_streams(tmp_path, seeds, data, check_crc):
    raw = data.draw(st.one_of(mutated(gzip.compress(seeds["tfrecord"], mtime=0)),
                              st.builds(lambda m: gzip.compress(m, mtime=0), mutated(seeds["tfrecord"]))))
    _drain(TFRecordSource, _write(tmp_path / "x.tfrecord.gz", raw), check_crc=check_crc)


# -- RecordIO ---------------------------------------------------------------------------------------------

@FUZZ
@given(data=st.binary(max_size=400))
def test_recordio_random_bytes(tmp_path, data):
    _drain(RecordIOSource, _write(tmp_path / "x.rec", data, index_path=tmp_path / "x.idx"))


@FUZZ
@given(data=st.data())
def test_recordio_mutated_files(tmp_path, seeds, data):
    raw = data.draw(mutated(seeds["recordio"]))
    _drain(RecordIOSource, _write(tmp_path / "x.rec", raw, index_path=tmp_path / "x.idx"))


@FUZZ
@given(data=st.data())
def test_recordio_random_index_files(tmp_path, seeds, data):
    offsets = data.draw(st.lists(st.integers(-5, 1200), max_size=6))
    junk = data.draw(st.sampled_from(["", "k\n", "a\tb\n", "1\t2\t3\n"]))
    index = "".join(f"{k}\t{o}\n" for k, o in enumerate(offsets)) + junk
    _drain(RecordIOSource, _write(tmp_path / "x.rec", seeds["recordio"], index, tmp_path / "x.idx"))


@FUZZ
@given(data=st.data())
def test_recordio_mutated_payloads_in_valid_chunks(tmp_path, seeds, data):
    """Framing intact, so the IRHeader and label parsing see the damage."""
    payloads = [seeds["payload"]] + [data.draw(mutated(seeds["payload"])) for _ in range(2)]
    _drain(RecordIOSource, _write(tmp_path / "x.rec", b"".join(chunks(p) for p in payloads),
                                  index_path=tmp_path / "x.idx"))
