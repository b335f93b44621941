"""Property tests: random and mutated bytes fed to the tar scan and sample grouping (plain and gzipped), the
WebDataset member decoders, the framed-record decoder of our LMDB layout and Caffe Datum parsing. Each may
only give a valid result or an `IngestError`: never another exception, a hang or a wrong-sized value."""

import gzip
import io
import tarfile

import lmdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ingest.errors import IngestError
from ingest.formats import _framed, tarindex
from ingest.formats.base import Field, Record, read_location
from ingest.formats.lmdb import LMDBSource
from ingest.formats.webdataset import WebDatasetSource, decode_member
from ingest.formats._protos import Datum
from conftest import jpeg_bytes

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _tar(fmt=tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
        for name, data in [("d/a.jpg", jpeg_bytes(8, 8)), ("d/a.cls", b"3"), ("d/a.seg.png", b"x" * 700),
                           ("d" * 60 + "/" + "e" * 60 + ".txt", "é".encode()), ("c.json", b"{}"), ("c.cls", b"1")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


#: The long name takes a pax record, a GNU long-name member, or the ustar prefix field (read by the fast path).
TARS = [_tar(tarfile.PAX_FORMAT), _tar(tarfile.GNU_FORMAT), _tar(tarfile.USTAR_FORMAT)]


def mutated(data: bytes, *, cut: bool = True):
    """Bytes flipped, and the whole cut or extended (``cut=False``: flips only, the length kept)."""
    n = len(data)
    flip = st.tuples(st.integers(0, n - 1), st.integers(1, 255))
    end = st.integers(0, n + 600) if cut else st.just(n)
    return st.tuples(st.lists(flip, max_size=6 if cut else 2), end, st.binary(max_size=600)).map(
        lambda t: _apply(data, *t))


def _apply(data, flips, cut, tail):
    out = bytearray(data)
    for pos, mask in flips:
        out[pos] ^= mask
    return bytes(out[:cut]) + (tail if cut >= len(data) else b"")


def scan_checked(data: bytes, path="fuzz.tar"):
    """Scan and group ``data``; every range found must lie inside it."""
    samples = list(tarindex.group(tarindex.scan(io.BytesIO(data), path, size=len(data)), path))
    for _, parts in samples:
        for _, m in parts:
            assert 0 <= m.offset and m.offset + m.size <= len(data)
    return samples


@FUZZ
@given(st.binary(max_size=3000))
def test_tar_scan_random_bytes(data):
    try:
        scan_checked(data)
    except IngestError:
        pass


@FUZZ
@given(st.sampled_from(range(len(TARS))).flatmap(lambda k: mutated(TARS[k])))
def test_tar_scan_mutated(data):
    try:
        scan_checked(data)
    except IngestError:
        pass


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(TARS[0]))
def test_webdataset_source_on_mutated_shards(shard_dir, data):
    path = shard_dir / "m.tar"
    path.write_bytes(data)
    try:
        src = WebDatasetSource(path, fields={"image": ("jpg", "png"), "label": "cls"})
        for i in range(len(src)):
            record = src.parse(i, read_location(src.locate(i)))
            assert isinstance(record.label, int)
    except IngestError:
        pass


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated(gzip.compress(TARS[0], mtime=0)), mutated(TARS[1]).map(lambda d: gzip.compress(d, mtime=0))))
def test_streamed_gzip_mutated(data):
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
            list(tarindex.group(tarindex.scan(gz, "fuzz.tgz", read_all=True), "fuzz.tgz"))
    except IngestError:
        pass


@FUZZ
@given(st.sampled_from(["jpg", "cls", "txt", "json", "npy", "float", "txt.gz", "npy.gz", "mp"]),
       st.binary(max_size=300))
def test_member_decoders(ext, data):
    try:
        decode_member(ext, data, path="fuzz.tar", where="member")
    except IngestError:
        pass


FIELDS = {"image": Field("image"), "label": Field("int"), "t": Field("text"), "v": Field("floats"),
          "a": Field("array"), "p": Field("pixels"), "n": Field("ints"), "f": Field("float"), "b": Field("bytes")}
RECORD = _framed.encode(Record(b"\xff\xd8\xff", 3, {"t": "hé", "v": [1.5, 2], "a": np.ones((2, 3), np.int32),
                                                  "p": np.zeros((2, 2, 3), np.uint8), "n": [1, 2, 3], "f": 0.5,
                                                  "b": b"\0"}), FIELDS)


def test_framed_record_round_trip():
    values = _framed.decode(RECORD, FIELDS, path="db", key="000000000")
    assert values["t"] == "hé" and values["n"].tolist() == [1, 2, 3] and values["a"].shape == (2, 3)


@FUZZ
@given(st.one_of(st.binary(max_size=400), mutated(RECORD), st.binary(max_size=200).map(lambda b: b"IGR1" + b)))
def test_framed_record_decoder(data):
    try:
        values = _framed.decode(data, FIELDS, path="db", key="k")
    except IngestError:
        return
    assert list(values) == list(FIELDS)
    assert values["p"].dtype == np.uint8 and values["p"].ndim == 3


@pytest.fixture(scope="module")
def caffe_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("caffe") / "db"
    d = Datum(channels=3, height=2, width=2, data=bytes(range(12)), label=1)
    env = lmdb.open(str(path), map_size=1 << 22)
    with env.begin(write=True) as txn:
        txn.put(b"00000000_a.jpg", d.SerializeToString())
    env.close()
    return LMDBSource(path, layout="caffe")


DATUM = Datum(channels=3, height=2, width=2, data=bytes(range(12)), label=7).SerializeToString()


@FUZZ
@given(st.one_of(st.binary(max_size=200), mutated(DATUM)))
def test_caffe_datum_parsing(caffe_db, data):
    try:
        record = caffe_db.parse(0, data)
    except IngestError:
        return
    d = Datum.FromString(data)
    assert record.image.shape == (d.height, d.width, d.channels) and record.image.size == len(d.data)


def test_fast_scan_reads_plain_headers(shard_dir):
    path = shard_dir / "plain.tar"
    path.write_bytes(TARS[2])
    with open(path, "rb") as f:
        fast = tarindex.fast_scan(f, str(path), len(TARS[2]))
    assert fast == list(tarindex.scan(io.BytesIO(TARS[2]), str(path), size=len(TARS[2])))
    assert fast[3].name == "d" * 60 + "/" + "e" * 60 + ".txt" and fast[1].data == b"3"


@FUZZ
@given(st.sampled_from(TARS).flatmap(lambda t: st.one_of(mutated(t), mutated(t, cut=False))))
def test_fast_scan_agrees_with_tarfile(shard_dir, data):
    """Where the header fast path reads a file, `tarfile` reads the same members (or both refuse it)."""
    path = shard_dir / "fast.tar"
    path.write_bytes(data)
    with open(path, "rb") as f:
        try:
            fast = tarindex.fast_scan(f, str(path), len(data))
        except IngestError as err:
            fast = type(err)
    if fast is None:
        return
    try:
        slow = list(tarindex.scan(io.BytesIO(data), str(path), size=len(data)))
    except IngestError as err:
        slow = type(err)
    assert fast == slow


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="ab./_J", max_size=14))
def test_member_keys_follow_webdataset(name):
    """Keys and extensions as webdataset's tariterators split them (its regex and metadata rules)."""
    from webdataset.tariterators import base_plus_ext, meta_prefix, meta_suffix
    import re
    skipped = ("/" not in name and name.startswith(meta_prefix) and name.endswith(meta_suffix)) or \
        re.match(r"__[^/]*__($|/)", name)
    key, ext = (None, None) if skipped else base_plus_ext(name)
    expected = None if key is None else (key, ext.lower())
    assert tarindex.split_key(name) == expected
