"""The native engine on record formats, on the CPU (dry mode, `ingest.native`): TFRecord, LMDB (ours, Caffe Datums,
raw images) and WebDataset tables against their readers, the engine's parse of each record kind against the reader
(`ingest._engine.record_image`), a dry epoch of each format against the Python read stage and planner (the same
indices, labels, probed sizes, regions and output sizes for the same seed), records whose CRC fails dropped with
the reader's error naming the file and offset, records the engine's parse does not take left to Python, and the
settings where a source gives no table and says why. The GPU path on a stand-in driver is
tests/test_native_emulated.py (a TFRecord file here too); on a real GPU, tests/test_native_gpu.py."""

from __future__ import annotations

import os
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from ingest import native
from ingest.engine import Failures
from ingest.errors import CorruptRecordError
from ingest.formats._native_table import NativeTable, NotNative
from ingest.formats._protos import Datum, Example
from ingest.formats.base import Field, Record, read_location
from ingest.formats.lmdb import LMDBSource, LMDBWriter
from ingest.formats.tfrecord import TFRecordSource, TFRecordWriter, frame
from ingest.formats.webdataset import WebDatasetSource, WebDatasetWriter
from conftest import encode, jpeg_bytes, textured
from test_native import OPS, check_same, dry, python_rows

pytestmark = pytest.mark.skipif(native.ENGINE is None, reason="ingest._engine was not built")
E = native.ENGINE
IMAGE_LABEL = {"image": Field("image"), "label": Field("int")}


def images(n: int, *, png: tuple[int, ...] = ()) -> list[Record]:
    """``n`` JPEGs of varied sizes with labels (PNGs at ``png``: the engine's read team decodes those)."""
    out = []
    for i in range(n):
        h, w = 20 + 3 * i, 30 + 2 * (i % 5)
        data = encode(__import__("PIL.Image").Image.fromarray(textured(h, w, i)), "PNG") if i in png else \
            jpeg_bytes(h, w, seed=i)
        out.append(Record(data, (7 * i) % 5))
    return out


def run_dry(source, *, max_failures=0, epochs=1, batch_size=4):
    """A dry epoch (or more) of ``source`` against the Python read stage; returns the batches and the executor's
    first epoch's failures."""
    ex, pipe, sampler = dry(source, batch_size=batch_size, max_failures=max_failures)
    failures = ex._failures[0]
    pipe.start_epoch(Failures(max_failures, sampler.samples()))
    try:
        got = []
        for epoch in range(epochs):
            batches = list(ex)
            plans = list(sampler.batches(epoch))
            assert [b.number for b in batches] == [p.number for p in plans]
            for batch, plan in zip(batches, plans):
                want = python_rows(pipe, plan)
                python = batch.column("status") != 0   # rows Python fills (their labels too: NativeExecutor)
                kept = np.isin(batch.column("index"), want["index"])   # (a row Python fails is dropped there)
                assert python[~kept].all()
                batch = native.DryBatch(batch.rows[kept], batch.number, batch.epoch, batch.notes)
                want["label"] = np.where(python[kept], batch.column("label"), want["label"])
                check_same(batch, want)
            got += batches
        return got, failures, ex.fallbacks
    finally:
        ex.close()


def statuses(batches) -> dict[int, int]:
    return {int(i): int(s) for b in batches for i, s in zip(b.column("index"), b.column("status"))}


# -- TFRecord -----------------------------------------------------------------------------------------------


def write_tfrecord(directory: Path, records: list[Record], fields=IMAGE_LABEL, stem="data", **kw) -> Path:
    writer = TFRecordWriter(directory, stem, fields, **kw)
    for r in records:
        writer.add(r)
    writer.close()
    return directory / f"{stem}.tfrecord"


def example(**features) -> bytes:
    """A framed record of an Example: ``name=bytes`` (a bytes feature), ``name=int`` (an int64 one)."""
    ex = Example()
    for key, value in features.items():
        key = key.replace("__", "/")
        if isinstance(value, bytes):
            ex.features.feature[key].bytes_list.value.append(value)
        else:
            ex.features.feature[key].int64_list.value.append(value)
    return frame(ex.SerializeToString())


def tfrecord_cases() -> dict[str, bytes]:
    image = jpeg_bytes(12, 12)
    plain = example(image__encoded=image, image__class__label=4)
    two = Example()
    two.features.feature["image/encoded"].bytes_list.value.extend([image, image])
    two.features.feature["image/class/label"].int64_list.value.append(1)
    merged = plain[12:-4] + Example(features={"feature": {"x": {"int64_list": {"value": [1]}}}}).SerializeToString()
    return {
        "plain": plain,
        "negative label": example(image__encoded=image, image__class__label=-3),
        "extra features": example(image__encoded=image, image__class__label=2, image__format=b"jpeg"),
        "no label": example(image__encoded=image),
        "empty image": example(image__encoded=b"", image__class__label=1),
        "no image": example(image__class__label=1),
        "two images": frame(two.SerializeToString()),
        "features given twice": frame(merged),
        "label as bytes": example(image__encoded=image, image__class__label=b"4"),
        "truncated": plain[:30],
        "length not the record's": plain[:8].replace(plain[:1], bytes([plain[0] + 1]), 1) + plain[8:],
    }


@pytest.mark.parametrize("name", list(tfrecord_cases()))
def test_tfrecord_parse_matches_the_reader(tmp_path, name):
    """Where the engine takes a record (CRCs not checked: the damaged framings reach the parse), it finds the
    reader's image and label; the records it leaves go to the reader, which reads them or names their problem."""
    raw = tfrecord_cases()[name]
    path = tmp_path / "x.tfrecord"
    path.write_bytes(tfrecord_cases()["plain"])
    src = TFRecordSource(str(path), features={"image": "image/encoded", "label": "image/class/label"},
                         check_crc=False)
    keys = list(src.native_table().keys)
    got = E.record_image(raw, E.TFRECORD, keys, False)
    try:
        record = src.parse(0, raw)
    except CorruptRecordError:
        assert got is None
        return
    if got is None:   # left to the reader: a record the canonical scan does not take
        assert name in ("two images", "features given twice", "empty image")
        return
    start, end, label = got
    assert raw[start:end] == bytes(record.image) and label == record.label


def test_tfrecord_parse_finds_no_label_without_a_label_key():
    raw = tfrecord_cases()["plain"]
    start, end, label = E.record_image(raw, E.TFRECORD, [b"image/encoded"], True)
    assert label == -1 and raw[start:start + 2] == b"\xff\xd8"


@pytest.mark.parametrize("at, which", [(2, 1), (-6, 2), (-2, 2), (9, 1)])
def test_tfrecord_crc_check_names_which_crc_fails(at, which):
    raw = bytearray(tfrecord_cases()["plain"])
    raw[at] ^= 0x10
    assert E.record_image(bytes(raw), E.TFRECORD, [b"image/encoded"], True) == which


def test_tfrecord_table_is_its_locations_and_keys(tmp_path):
    path = write_tfrecord(tmp_path, images(5))
    src = TFRecordSource(str(path))
    t = src.native_table()
    assert t.kind == "tfrecord" and t.labels is None and t.record_crc
    assert t.keys == (b"image/encoded", b"image/class/label")
    for i in range(len(src)):
        loc = src.locate(i)
        assert (t.paths[t.files[i]], t.offsets[i], t.sizes[i]) == (loc.path, loc.offset, loc.length)
    assert not TFRecordSource(str(path), check_crc=False).native_table().record_crc
    only = TFRecordSource(str(path), features={"image": "image/encoded"}).native_table()
    assert only.keys == (b"image/encoded",)


def test_tfrecord_sources_the_engine_does_not_take_say_why(tmp_path):
    path = write_tfrecord(tmp_path, [Record(jpeg_bytes(8, 8), 1, {"note": "x"})],
                          {**IMAGE_LABEL, "note": Field("text")})
    src = TFRecordSource(str(path), features={"image": "image/encoded", "label": "image/class/label",
                                              "note": ("note", "text")})
    with pytest.raises(NotNative, match="note"):
        src.native_table()
    chain, why = native.chain_for(src, OPS)
    assert chain is None and "TFRecordSource gives no native table here" in why and "note" in why
    gz = write_tfrecord(tmp_path, images(2), stem="z", compression="gzip")
    with pytest.raises(NotNative, match="compressed"):
        TFRecordSource(str(gz.with_suffix(".tfrecord.gz"))).native_table()


def test_dry_run_of_a_tfrecord_file_plans_what_the_python_stages_plan(tmp_path):
    src = TFRecordSource(str(write_tfrecord(tmp_path, images(11, png=(3,)))))
    batches, failures, fallbacks = run_dry(src, epochs=2)
    assert not any(statuses(batches).values()) and fallbacks == {}   # (the PNG: the read team's)
    assert not failures.items


def test_dry_run_of_tfrecords_leaves_records_it_does_not_take_to_python(tmp_path):
    """A record the canonical scan does not take (its features given twice, which protobuf merges: the second
    label wins) keeps its row for the Python reader; one without its label is the reader's error there, as in the
    Python engine (the fallback pipeline drops it against the budget)."""
    recs = [example(image__encoded=jpeg_bytes(20, 30, seed=i), image__class__label=i) for i in range(6)]
    recs[2] = frame(recs[2][12:-4] + example(image__class__label=9)[12:-4])
    recs[4] = example(image__encoded=jpeg_bytes(20, 30))
    path = tmp_path / "odd.tfrecord"
    path.write_bytes(b"".join(recs))
    src = TFRecordSource(str(path), features={"image": "image/encoded", "label": "image/class/label"})
    assert src.parse(2, read_location(src.locate(2))).label == 9
    batches, _, fallbacks = run_dry(src, max_failures=1, batch_size=3)
    assert {i for i, s in statuses(batches).items() if s} == {2, 4} and fallbacks == {"record": 2}


def flip(path, at: int) -> None:
    """Change a bit of the byte at ``at`` of the file at ``path``."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x20]))


def dropped_with_the_readers_error(src, bad: int, offset: int) -> str:
    """A dry epoch of ``src`` (9 samples) in order, with a budget of one failure, that drops sample ``bad`` with
    the error its reader raises (naming byte ``offset``); returns that failure's reason."""
    with pytest.raises(CorruptRecordError) as reader:
        src.parse(bad, read_location(src.locate(bad)))
    ex, _, _ = dry(src, shuffle=False, max_failures=1)
    try:
        got = list(ex)
        assert np.concatenate([b.column("index") for b in got]).tolist() == [i for i in range(9) if i != bad]
        [(name, stage, reason)] = ex._failures[0].items
        assert name == src.name(bad) and reason == f"CorruptRecordError: {reader.value}"
        assert f"at byte {offset}" in reason
        return reason
    finally:
        ex.close()


@pytest.mark.parametrize("where, what", [(-40, "bad data CRC"), (9, "bad length CRC")])
def test_a_tfrecord_record_whose_crc_fails_is_dropped_with_the_readers_error(tmp_path, where, what):
    path = write_tfrecord(tmp_path, images(9))
    loc = TFRecordSource(str(path), check_crc=False).locate(4)
    flip(path, loc.offset + (loc.length + where if where < 0 else where))
    reason = dropped_with_the_readers_error(TFRecordSource(str(path)), 4, loc.offset)
    assert what in reason and str(path) in reason
    unchecked = TFRecordSource(str(path), check_crc=False)   # not checked: the engine reads the record
    batches, failures, _ = run_dry(unchecked, batch_size=3)
    assert sorted(statuses(batches)) == list(range(9)) and not failures.items


# -- LMDB -----------------------------------------------------------------------------------------------------


def datum(label: int | None, data: bytes | None = None, *, encoded=True, **more) -> bytes:
    d = Datum(**more)
    if label is not None:
        d.label = label
    if data is not None:
        d.data, d.encoded = data, encoded
    return d.SerializeToString()


def datum_cases() -> dict[str, bytes]:
    image = jpeg_bytes(12, 12)
    return {
        "plain": datum(3, image),
        "sizes and an unknown field": datum(2, image, channels=3, height=12, width=12) + b"\xa8\x06\x05",
        "negative label": datum(-7, image),
        "no label": datum(None, image),
        "label given twice": datum(1, image) + Datum(label=6).SerializeToString(),
        "raw pixels": datum(1, bytes(12), encoded=False, channels=1, height=3, width=4),
        "no data": datum(1, None, channels=1, height=1, width=1),
        "data given twice": datum(1, image) + Datum(data=image).SerializeToString(),
        "truncated": datum(1, image)[:-5],
        "a group": datum(1, image) + b"\x0b\x0c",
        "label of another wire type": datum(None, image) + b"\x2d\x01\x00\x00\x00",
    }


def lmdb_source_of(tmp_path, values: list[bytes]) -> LMDBSource:
    import lmdb
    env = lmdb.open(str(tmp_path / "caffe"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for k, value in enumerate(values):
            txn.put(b"%08d_x.jpg" % k, value)
    env.close()
    return LMDBSource(str(tmp_path / "caffe"), layout="caffe")


@pytest.mark.parametrize("name", list(datum_cases()))
def test_datum_parse_matches_the_reader(tmp_path, name):
    raw = datum_cases()[name]
    src = lmdb_source_of(tmp_path, [datum_cases()["plain"]])
    got = E.record_image(raw, E.CAFFE_DATUM)
    try:
        record = src.parse(0, raw)
    except CorruptRecordError:
        assert got is None
        return
    if got is None:
        # protobuf keeps the last data and takes a field of the wrong wire type as an unknown one: the engine leaves
        # such values to protobuf
        assert name in ("data given twice", "a group", "label of another wire type")
        return
    start, end, label = got
    assert raw[start:end] == bytes(record.image) and label == record.label


def framed_cases() -> dict[str, bytes]:
    from ingest.formats import _framed
    image = jpeg_bytes(10, 10)
    plain = _framed.encode(Record(image, 5), IMAGE_LABEL)
    return {
        "plain": plain,
        "negative label": _framed.encode(Record(image, -2), IMAGE_LABEL),
        "empty image": _framed.encode(Record(b"", 1), IMAGE_LABEL),
        "wrong magic": b"IGR2" + plain[4:],
        "trailing byte": plain + b"\0",
        "image length off": plain[:5] + (len(image) + 1).to_bytes(8, "little") + plain[13:],
        "label of another kind": plain[:-17] + b"\x04" + plain[-16:],
        "short": plain[:20],
    }


@pytest.mark.parametrize("name", list(framed_cases()))
def test_framed_parse_matches_the_reader(tmp_path, name):
    raw = framed_cases()[name]
    got = E.record_image(raw, E.FRAMED)
    src = write_lmdb_ours(tmp_path, images(1), check="none")   # (the parse, not the CRC)
    try:
        record = src.parse(0, raw)
    except CorruptRecordError:
        assert got is None
        return
    start, end, label = got
    assert raw[start:end] == bytes(record.image) and label == record.label


def write_lmdb_ours(directory: Path, records: list[Record], stem="db", **kw) -> LMDBSource:
    writer = LMDBWriter(directory, stem, IMAGE_LABEL)
    for r in records:
        writer.add(r)
    writer.close()
    return LMDBSource(str(directory / f"{stem}.lmdb"), **kw)


def big_and_small(n: int, *, png=()) -> list[Record]:
    """Images of which every third is large (its value on LMDB overflow pages), the others small (inside a leaf
    page)."""
    out = images(n, png=png)
    for i in range(0, n, 3):
        if i not in png:
            out[i] = Record(jpeg_bytes(90 + i, 120, seed=i, quality=95), out[i].label)
    return out


def test_lmdb_tables_are_their_locations(tmp_path):
    recs = big_and_small(7)
    ours = write_lmdb_ours(tmp_path, recs)
    caffe = lmdb_source_of(tmp_path, [datum(r.label, bytes(r.image)) for r in recs])
    for src, kind in ((ours, "framed"), (caffe, "caffe_datum")):
        t = src.native_table()
        assert t.kind == kind and t.labels is None
        for i in range(len(src)):
            loc = src.locate(i)
            assert (t.paths[t.files[i]], t.offsets[i], t.sizes[i]) == (loc.path, loc.offset, loc.length)
    sizes = ours.native_table().sizes
    assert sizes.max() > 2040 > sizes.min()   # values on overflow pages and inside leaf pages (4 KB pages)
    assert ours.native_table().crcs.tolist() == list(ours._crcs)
    assert LMDBSource(str(tmp_path / "db.lmdb"), check="none").native_table().crcs is None


def test_dry_run_of_lmdbs_plans_what_the_python_stages_plan(tmp_path):
    recs = big_and_small(10, png=(4,))
    for src in (write_lmdb_ours(tmp_path, recs), lmdb_source_of(tmp_path, [datum(r.label, bytes(r.image))
                                                                             for r in recs])):
        batches, failures, fallbacks = run_dry(src, epochs=2)
        assert not any(statuses(batches).values()) and fallbacks == {}   # (the PNG: the read team's)
        assert not failures.items


def test_dry_run_of_an_lmdb_of_images_reads_them_whole(tmp_path):
    import lmdb
    env = lmdb.open(str(tmp_path / "imgs"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for k, r in enumerate(big_and_small(6)):
            txn.put(b"img%03d" % k, bytes(r.image))
    env.close()
    src = LMDBSource(str(tmp_path / "imgs"))
    assert src.native_table().kind == "whole"
    batches, _, _ = run_dry(src)
    assert set(statuses(batches).values()) == {0} and {int(x) for b in batches for x in b.column("label")} == {-1}


def test_dry_run_of_caffe_datums_leaves_odd_ones_to_python(tmp_path):
    """A Datum the engine does not take (its data given twice: protobuf keeps the last) keeps its row for the
    Python reader; a raw one in an LMDB of encoded ones is the reader's error there."""
    values = [datum(i % 3, jpeg_bytes(20, 30, seed=i)) for i in range(7)]
    values[1] = datum(2, b"not this") + Datum(data=jpeg_bytes(20, 30)).SerializeToString()
    values[5] = datum(1, bytes(12), encoded=False, channels=1, height=3, width=4)
    src = lmdb_source_of(tmp_path, values)
    batches, failures, fallbacks = run_dry(src, max_failures=1, batch_size=3)
    assert {i for i, s in statuses(batches).items() if s} == {1, 5} and fallbacks == {"record": 2}


def test_an_lmdb_value_whose_crc_differs_is_dropped_with_the_readers_error(tmp_path):
    src = write_lmdb_ours(tmp_path, big_and_small(9))
    loc = src.locate(3)
    flip(tmp_path / "db.lmdb" / "data.mdb", loc.offset + loc.length - 40)
    reason = dropped_with_the_readers_error(LMDBSource(str(tmp_path / "db.lmdb")), 3, loc.offset)
    assert "[sample 000000003]" in reason and "CRC32C" in reason


def test_lmdbs_the_engine_does_not_take_say_why(tmp_path):
    raw = lmdb_source_of(tmp_path, [datum(1, bytes(12), encoded=False, channels=1, height=3, width=4)])
    with pytest.raises(NotNative, match="caffe"):
        raw.native_table()
    import lmdb
    env = lmdb.open(str(tmp_path / "col"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        txn.put(b"image-000000001", jpeg_bytes(8, 8))
        txn.put(b"label-000000001", b"text")
    env.close()
    chain, why = native.chain_for(LMDBSource(str(tmp_path / "col")), OPS)
    assert chain is None and "columnar" in why


# -- WebDataset -------------------------------------------------------------------------------------------------


def write_tar(directory: Path, records: list[Record], stem="shard") -> Path:
    writer = WebDatasetWriter(directory, stem, IMAGE_LABEL)
    for r in records:
        writer.add(r)
    writer.close()
    return directory / f"{stem}.tar"


def hand_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, __import__("io").BytesIO(data))
    return path


def test_webdataset_table_is_its_image_members_and_labels(tmp_path):
    src = WebDatasetSource(str(write_tar(tmp_path, images(7, png=(2,)))))
    t = src.native_table()
    assert t.kind == "whole" and t.python is None and t.labels.tolist() == src.labels().tolist()
    for i in range(len(src)):
        header = src.locate(i)[0]   # (the image member's header block, then its data)
        assert (t.paths[t.files[i]], t.offsets[i], t.sizes[i]) == (header.path, header.offset + 512,
                                                                   header.length - 512)
        assert t.crcs[i] == src._crcs[int(src._members.columns["image"][i])]
    assert WebDatasetSource(str(tmp_path / "shard.tar"), check="none").native_table().crcs is None


def test_dry_run_of_webdataset_shards_plans_what_the_python_stages_plan(tmp_path):
    recs = images(13, png=(5,))
    write_tar(tmp_path, recs[:6], "a")
    write_tar(tmp_path, recs[6:], "b")
    src = WebDatasetSource(str(tmp_path))
    batches, failures, fallbacks = run_dry(src, epochs=2)
    assert not any(statuses(batches).values()) and fallbacks == {}   # (the PNG: the read team's)
    assert not failures.items


def test_webdataset_samples_the_table_cannot_vouch_for_are_left_to_python(tmp_path):
    """A sample without its label member, and one whose label member disagrees with the index, are not read by
    the engine: the Python reader names their problem (and the budget drops them); the others run natively."""
    members = []
    for k in range(6):
        members.append((f"s{k}.jpg", jpeg_bytes(20 + k, 30, seed=k)))
        if k != 2:
            members.append((f"s{k}.cls", b"%d" % (k % 3)))
    path = hand_tar(tmp_path / "odd.tar", members)
    src = WebDatasetSource(str(path), fields={"image": "jpg", "label": "cls"}, write_index=True)
    cls = src._members.columns["label"][4]
    flip(path, src._members.offsets[cls])   # "1" -> "\x11": the index (written) still says 1
    src = WebDatasetSource(str(path), fields={"image": "jpg", "label": "cls"})
    t = src.native_table()
    assert t.python.tolist() == [0, 0, 1, 0, 1, 0]
    batches, failures, fallbacks = run_dry(src, max_failures=2, batch_size=3)
    assert {i for i, s in statuses(batches).items() if s} == {2, 4} and fallbacks == {"record": 2}


def test_a_webdataset_image_whose_crc_differs_is_dropped_with_the_readers_error(tmp_path):
    path = write_tar(tmp_path, images(9))
    src = WebDatasetSource(str(path))
    loc = src.locate(6)[0]
    flip(path, loc.offset + loc.length - 40)
    reason = dropped_with_the_readers_error(WebDatasetSource(str(path)), 6, loc.offset + 512)   # (its data's)
    assert "CRC32C" in reason


def test_webdatasets_the_engine_does_not_take_say_why(tmp_path):
    path = hand_tar(tmp_path / "x.tar", [("a.jpg", jpeg_bytes(8, 8)), ("a.cls", b"1"), ("a.txt", b"hi")])
    with pytest.raises(NotNative, match="txt"):
        WebDatasetSource(str(path)).native_table()
    assert WebDatasetSource(str(path), fields={"image": "jpg", "label": "cls"}).native_table().kind == "whole"
    with pytest.raises(NotNative, match="streamed"):
        WebDatasetSource(str(path), stream=True).native_table()


# -- eligibility ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["tfrecord", "lmdb", "caffe", "webdataset"])
def test_record_sources_are_eligible(tmp_path, fmt):
    """Each format's source passes every check of `native.why_not` that does not need a GPU (on a host without
    nvImageCodec or CuPy it stops at those)."""
    import torch
    from ingest.engine import Pipeline
    from test_native_emulated import record_source
    src, _ = record_source(tmp_path, fmt)
    cuda = dict(device=torch.device("cuda"), decode="mixed", workers=0, streamed=False, tuple_output=True)
    why = native.why_not(src, OPS, **cuda, pipeline=Pipeline(src, ops=OPS))[1]
    assert why is None or "nvImageCodec" in why or "CuPy" in why, why


def check_table(src) -> None:
    """Every sample of ``src`` through its native table as the engine parses it: the reader's image bytes and
    label, or a sample the table leaves to Python."""
    t = src.native_table()
    code = native._KINDS[t.kind]
    for i in range(len(src)):
        record = src.parse(i, read_location(src.locate(i)))
        if t.python is not None and t.python[i]:
            continue
        with open(t.paths[t.files[i]], "rb") as f:
            raw = os.pread(f.fileno(), int(t.sizes[i]) if t.sizes[i] >= 0 else 1 << 30, int(t.offsets[i]))
        if code == 0:
            got = (0, len(raw), -1 if t.labels is None else int(t.labels[i]))
        else:
            got = E.record_image(raw, code, list(t.keys) or None, t.record_crc)
        start, end, label = got
        assert raw[start:end] == bytes(memoryview(record.image).cast("B")) and label == record.label, i


@pytest.mark.parametrize("fmt", ["tfrecord", "lmdb", "caffe", "webdataset"])
def test_every_sample_through_its_table_is_the_readers(tmp_path, fmt):
    from test_native_emulated import record_source
    check_table(record_source(tmp_path, fmt)[0])
