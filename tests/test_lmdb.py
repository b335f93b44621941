"""LMDB: the real mmocr and Caffe databases, our writer (read back by plain `lmdb`), layouts written here the
way other tools write them, threads and worker processes, and values that are not what the layout says."""

import json
import multiprocessing
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import lmdb
import numpy as np
import pytest
from google.protobuf.message import DecodeError as ProtoDecodeError
from hypothesis import given, settings, strategies as st

import ingest
from ingest.errors import ConfigError, CorruptRecordError, DecodeError, FailureBudgetExceeded, SourceError
from ingest.formats import check_format, open_source, read_location
from ingest.formats._protos import Datum
from ingest.formats.base import Field, Record
from ingest.formats.lmdb import LMDBSource, LMDBWriter, content_checksum, datum_label, environment, verify
from conftest import isolated, jpeg_bytes, realworld, textured


def read(src, i):
    return src.parse(i, read_location(src.locate(i)))


def raw_items(path):
    """Every key and value, read with the process's environment (py-lmdb allows one per database)."""
    with environment(str(path)) as env, env.begin() as txn:
        return dict(txn.cursor())


def write_lmdb(path, items):
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for key, value in items.items():
            txn.put(key, value)
    env.close()
    return str(path)


# -- files written by other tools --------------------------------------------------------------------
def test_realworld_mmocr_images_and_text():
    path = realworld("lmdb") / "mmocr_rec_toy" / "imgs.lmdb"
    src = open_source(str(path))
    assert isinstance(src, LMDBSource)
    check_format(src)
    raw = raw_items(path)
    assert len(src) == int(raw[b"num-samples"]) == 10
    assert {k: f.kind for k, f in src.fields.items()} == {"image": "image", "text": "text"}
    for i in range(10):
        record = read(src, i)
        key = b"%09d" % (i + 1)
        assert bytes(record.image) == raw[b"image-" + key]
        assert record.fields["text"] == raw[b"label-" + key].decode()
    assert src.name(0).endswith("imgs.lmdb:image-000000001")


def test_realworld_label_only_lmdb_reads_as_text():
    src = LMDBSource(realworld("lmdb") / "mmocr_rec_toy" / "label.lmdb")
    check_format(src)
    assert set(src.fields) == {"text"} and len(src) == 10
    first = json.loads(read(src, 0).fields["text"])
    assert first["filename"] == "1223731.jpg" and read(src, 0).image is None


def test_realworld_broken_jpeg_reads_then_fails_to_decode():
    path = realworld("lmdb") / "mmocr_rec_toy" / "broken.lmdb"
    src = LMDBSource(path)
    assert len(read(src, 0).image) == 512 and read(src, 0).fields["text"] == "broken"
    with pytest.raises((DecodeError, FailureBudgetExceeded)) as err:
        list(ingest.Loader(str(path), batch_size=1, device="cpu"))
    assert "image-000000001" in str(err.value)


def test_realworld_caffe_raw_datums():
    path = realworld("lmdb") / "caffe_verifycode" / "test_lmdb"
    src = LMDBSource(path)
    check_format(src)
    assert len(src) == 400 and src.fields["image"].kind == "pixels"
    raw = raw_items(path)
    keys = sorted(raw)
    labels = src.labels()
    for i in (0, 137, 399):
        datum = Datum.FromString(raw[keys[i]])
        record = read(src, i)
        planes = np.frombuffer(datum.data, np.uint8).reshape(3, 26, 22)      # Caffe: C x H x W, BGR
        assert record.image.shape == (26, 22, 3) and record.image.dtype == np.uint8
        np.testing.assert_array_equal(record.image, planes[::-1].transpose(1, 2, 0))   # -> H x W x RGB
        assert record.label == datum.label == labels[i]
        assert src.name(i).endswith(keys[i].decode())
    as_stored = LMDBSource(path, caffe_bgr=False)
    np.testing.assert_array_equal(read(as_stored, 0).image, read(src, 0).image[..., ::-1])
    assert set(labels.tolist()) <= set(range(56)) and len(set(labels.tolist())) > 20


def test_realworld_caffe_through_loader():
    path = realworld("lmdb") / "caffe_verifycode" / "test_lmdb"
    src = LMDBSource(path)
    loader = ingest.Loader(src, batch_size=64, device="cpu")
    images, labels = next(iter(loader))
    assert images.shape == (64, 3, 26, 22)
    np.testing.assert_array_equal(images[5].permute(1, 2, 0).numpy(), read(src, 5).image)
    assert labels.tolist() == src.labels()[:64].tolist()


# -- our layout -------------------------------------------------------------------------------------
FIELDS = {"image": Field("image"), "label": Field("int"), "caption": Field("text"), "box": Field("floats"),
          "ids": Field("ints"), "emb": Field("array"), "blob": Field("bytes"), "score": Field("float"),
          "thumb": Field("pixels")}


def make_records(n):
    rng = np.random.default_rng(0)
    return [Record(jpeg_bytes(20 + i % 7, 24, seed=i), i % 3,
                   {"caption": f"caption {i} ü", "box": rng.random(i % 4).astype(np.float32),
                    "ids": list(range(i % 5)),
                    "emb": rng.random((2, 3)).astype(np.float16), "blob": bytes([i % 256]) * (i % 3),
                    "score": i / 3, "thumb": textured(4, 5, seed=i)}) for i in range(n)]


def write(directory, records, stem="db", fields=FIELDS, classes=("a", "b", "c")):
    writer = LMDBWriter(directory, stem, fields, classes=classes)
    for r in records:
        writer.add(r)
    return writer.close()


def test_writer_round_trip_every_kind(tmp_path):
    records = make_records(30)
    assert write(tmp_path, records) == [os.path.join("db.lmdb", "data.mdb")]
    src = LMDBSource(tmp_path / "db.lmdb")
    check_format(src)
    assert src.fields == FIELDS and src.classes == ["a", "b", "c"]
    assert src.labels().tolist() == [r.label for r in records]
    for i, r in enumerate(records):
        got = read(src, i)
        assert bytes(got.image) == r.image and got.label == r.label
        assert got.fields["caption"] == r.fields["caption"] and got.fields["blob"] == r.fields["blob"]
        assert got.fields["score"] == r.fields["score"]
        np.testing.assert_array_equal(got.fields["box"], r.fields["box"])
        np.testing.assert_array_equal(got.fields["ids"], r.fields["ids"])
        assert got.fields["emb"].dtype == np.float16
        np.testing.assert_array_equal(got.fields["emb"], r.fields["emb"])
        np.testing.assert_array_equal(got.fields["thumb"], r.fields["thumb"])
    assert len(LMDBSource(tmp_path)) == 30     # the directory holding <stem>.lmdb (a converter output)


def test_writer_output_is_plain_lmdb_and_deterministic(tmp_path):
    records = make_records(1200)               # more than one write transaction
    for d in ("a", "b"):
        write(tmp_path / d, records, fields={"image": Field("image"), "label": Field("int")})
    data = (tmp_path / "a" / "db.lmdb" / "data.mdb").read_bytes()
    assert data == (tmp_path / "b" / "db.lmdb" / "data.mdb").read_bytes()
    env = lmdb.open(str(tmp_path / "a" / "db.lmdb"), readonly=True)      # plain lmdb, default options
    with env.begin() as txn:
        raw = dict(txn.cursor())
    env.close()
    meta = json.loads(raw[b"__meta__"])
    assert meta["count"] == 1200 and [f["name"] for f in meta["fields"]] == ["image", "label"]
    assert np.frombuffer(raw[b"__labels__"], "<i8").tolist() == [r.label for r in records]
    assert raw[b"000000007"][:4] == b"IGR1" and len(raw) == 1203   # samples, __crc32c__, __labels__, __meta__
    checksum = content_checksum(str(tmp_path / "a" / "db.lmdb"))
    assert checksum == meta["content_sha256"] == content_checksum(str(tmp_path / "b" / "db.lmdb"))
    assert verify(str(tmp_path / "a" / "db.lmdb")) == 1200


def test_verify_and_reader_catch_changed_values(tmp_path):
    write(tmp_path, make_records(5), fields={"image": Field("image"), "label": Field("int")})
    copy = tmp_path / "copy.lmdb"
    shutil.copytree(tmp_path / "db.lmdb", copy)
    env = lmdb.open(str(copy), map_size=1 << 26)
    with env.begin(write=True) as txn:
        value = txn.get(b"000000002")
        txn.put(b"000000002", value[:-1] + bytes([value[-1] ^ 1]))        # same framing, one flipped bit
        txn.put(b"000000003", b"IGR1" + value[4:10])                       # truncated record
        txn.put(b"000000004", b"\x08\x03" + value[2:])                     # not a framed record
    env.close()
    with pytest.raises(CorruptRecordError, match="checksum"):
        verify(str(copy))
    src = LMDBSource(copy)
    with pytest.raises(CorruptRecordError, match="ends before field|claims") as err:
        read(src, 3)
    assert err.value.index == "000000003" and err.value.path == str(copy)
    with pytest.raises(CorruptRecordError, match="not an ingest framed record"):
        read(src, 4)


def test_declared_kind_mismatch_and_metadata_checks(tmp_path):
    write(tmp_path, make_records(3), fields={"image": Field("image"), "label": Field("int")})
    kinds, stray = tmp_path / "kinds.lmdb", tmp_path / "stray.lmdb"
    shutil.copytree(tmp_path / "db.lmdb", kinds)
    shutil.copytree(tmp_path / "db.lmdb", stray)
    env = lmdb.open(str(kinds), map_size=1 << 26)
    with env.begin(write=True) as txn:
        meta = json.loads(txn.get(b"__meta__"))
        meta["fields"][1]["kind"] = "float"
        txn.put(b"__meta__", json.dumps(meta).encode())
    env.close()
    write_lmdb(stray, {b"000000099": b"stray"})
    with pytest.raises(CorruptRecordError, match="declared 'float'") as err:
        read(LMDBSource(kinds), 0)
    assert err.value.offset is not None
    with pytest.raises(SourceError, match=r"7 keys but __meta__ says 3 samples \(\+3 metadata keys\)"):
        LMDBSource(stray)


def test_several_databases_and_data_file_path(tmp_path):
    records = make_records(7)
    fields = {"image": Field("image"), "label": Field("int")}
    write(tmp_path, records[:3], stem="a", fields=fields)
    write(tmp_path, records[3:], stem="b", fields=fields)
    both = LMDBSource(tmp_path)
    check_format(both)
    assert len(both) == 7 and both.labels().tolist() == [r.label for r in records]
    assert both.name(3).endswith("b.lmdb:000000000") and bytes(read(both, 6).image) == records[6].image
    single = LMDBSource(tmp_path / "b.lmdb" / "data.mdb")
    assert len(single) == 4 and bytes(read(single, 0).image) == records[3].image
    write(tmp_path, records[:1], stem="c", fields={"image": Field("image")})
    with pytest.raises(SourceError, match="different fields"):
        LMDBSource(tmp_path)


def test_writer_refuses_existing_database(tmp_path):
    write(tmp_path, make_records(1), fields={"image": Field("image")})
    with pytest.raises(ConfigError, match="already holds"):
        LMDBWriter(tmp_path, "db", {"image": Field("image")})


def test_loader_end_to_end_by_path(tmp_path):
    records = make_records(10)
    write(tmp_path, records, fields={"image": Field("image"), "label": Field("int"), "caption": Field("text")})
    loader = ingest.Loader(str(tmp_path / "db.lmdb"), batch_size=4, device="cpu", output="dict", ragged=True)
    labels, captions = [], []
    for batch in loader:
        labels += batch["labels"].tolist()
        captions += batch["caption"]
    assert labels == [r.label for r in records] and captions == [r.fields["caption"] for r in records]


# -- threads and processes -----------------------------------------------------------------------------
def _read_labels(src, indices):
    return [read(src, i).label for i in indices]


def test_reader_threads_and_processes(tmp_path):
    records = make_records(40)
    write(tmp_path, records, fields={"image": Field("image"), "label": Field("int")})
    src = LMDBSource(tmp_path / "db.lmdb")
    expected = [r.label for r in records]
    with ThreadPoolExecutor(8) as pool:
        images = list(pool.map(lambda i: bytes(read(src, i).image), range(40)))
    assert images == [r.image for r in records]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_read_labels, (src, range(40))) == expected
    with multiprocessing.get_context("fork").Pool(1) as pool:    # the parent's environment is not reused
        assert pool.apply(_read_labels, (src, range(40))) == expected
    assert _read_labels(src, range(40)) == expected


def test_values_are_located_in_the_data_file(tmp_path, monkeypatch):
    """A value is a byte range of data.mdb (read with the batch's other reads), the same bytes py-lmdb gives;
    where the map cannot be found, values are copied out and read the same."""
    records = make_records(12)
    write(tmp_path, records)
    values = raw_items(tmp_path / "db.lmdb")
    src = LMDBSource(tmp_path / "db.lmdb")
    data = os.path.join(str(tmp_path / "db.lmdb"), "data.mdb")
    for i in range(12):
        loc = src.locate(i)
        assert loc.path == data and loc.data is None and loc.length == len(values[b"%09d" % i])
        assert read_location(loc) == values[b"%09d" % i]
    loader = ingest.Loader(str(tmp_path / "db.lmdb"), batch_size=5, shuffle=False, device="cpu", output="dict",
                           ops=[ingest.ops.Resize((8, 8))])
    assert [int(x) for b in loader for x in b["labels"]] == [r.label for r in records]
    located = [src.locate(i) for i in range(12)]
    monkeypatch.setattr("ingest.formats.lmdb.NATIVE", None)   # addresses through numpy: the same ranges
    assert LMDBSource(tmp_path / "db.lmdb").locate_batch(list(range(12))) == located
    monkeypatch.setattr("ingest.formats.lmdb._Map._find_base", lambda self: None)
    copied = LMDBSource(tmp_path / "db.lmdb")
    loc = copied.locate(3)
    assert loc.data is not None and bytes(loc.data) == values[b"%09d" % 3]
    for i in range(12):
        assert bytes(read(copied, i).image) == bytes(read(src, i).image) == records[i].image


def test_value_ranges_are_found_at_open_else_looked_up_per_batch(tmp_path, monkeypatch):
    """Every sample's value range comes from one pass at open (no LMDB call per batch: py-lmdb's get gives the
    GIL up); keys that are not the layout's leave the table out, and a batch is looked up in one transaction,
    where a missing key fails its sample alone."""
    records = make_records(6)
    write(tmp_path / "a", records, fields={"image": Field("image"), "label": Field("int")})
    src = LMDBSource(tmp_path / "a" / "db.lmdb")
    assert src._dbs[0].ranges.shape == (6, 2)
    assert [bytes(read(src, i).image) for i in range(6)] == [r.image for r in records]
    monkeypatch.setattr("ingest.formats.lmdb._CHUNK", 4)   # the pass in chunks: the same table
    assert np.array_equal(LMDBSource(tmp_path / "a" / "db.lmdb")._dbs[0].ranges, src._dbs[0].ranges)
    write(tmp_path / "b", records, fields={"image": Field("image"), "label": Field("int")})
    env = lmdb.open(str(tmp_path / "b" / "db.lmdb"), map_size=1 << 26)
    with env.begin(write=True) as txn:   # sample 4's key renamed: the counts still agree
        txn.put(b"000000004x", txn.pop(b"%09d" % 4))
    env.close()
    src = LMDBSource(tmp_path / "b" / "db.lmdb")
    assert src._dbs[0].ranges is None
    assert src.locate_batch([0, 3, 5, -1]) == [src.locate(0), src.locate(3), src.locate(5), src.locate(5)]
    with pytest.raises(CorruptRecordError, match="000000004"):
        src.locate_batch([1, 4])
    with pytest.raises(IndexError):
        src.locate_batch([6])
    # in a loader, the sample whose key is missing fails alone, through the failure budget
    loader = ingest.Loader(src, batch_size=6, shuffle=False, device="cpu", ops=[ingest.ops.Resize((8, 8))],
                           max_failures=1)
    assert [int(x) for _, labels in loader for x in labels] == [r.label for k, r in enumerate(records) if k != 4]
    with pytest.raises(CorruptRecordError, match="000000004"):   # the default budget: the first error
        list(ingest.Loader(src, batch_size=6, shuffle=False, device="cpu", ops=[ingest.ops.Resize((8, 8))]))


def test_located_columnar_values_and_missing_keys(tmp_path, monkeypatch):
    items = {b"image-000000001": jpeg_bytes(10, 10, seed=1), b"label-000000001": b"abc",
             b"label-000000002": b"de", b"image-000000003": jpeg_bytes(10, 12, seed=3), b"label-000000003": b""}
    src = LMDBSource(write_lmdb(tmp_path / "col", items), layout="columnar")
    assert src._dbs[0].ranges.shape == (3, 2, 2)   # a row of (offset, length) per field
    image, text = src.locate(0)
    assert image.data is None and text.data is None and read_location(text) == b"abc"
    missing, _ = src.locate(1)
    assert missing.data == b""
    assert read(src, 2).fields["text"] == "" and bytes(read(src, 2).image) == items[b"image-000000003"]
    assert src.locate_batch([2, 0, 1]) == [src.locate(2), src.locate(0), src.locate(1)]
    monkeypatch.setattr("ingest.formats.lmdb._Map._find_base", lambda self: None)   # looked up and copied
    copied = LMDBSource(tmp_path / "col", layout="columnar")
    assert copied._dbs[0].ranges is None
    assert [read_location(loc) for loc in copied.locate(0)] == [read_location(loc) for loc in src.locate(0)]
    assert copied.locate(1)[0].data == b"" and read(copied, 2).fields["text"] == ""


# -- other tools' layouts written here -------------------------------------------------------------
def test_columnar_keys_numeric_text_and_missing_keys(tmp_path):
    items = {b"num-samples": b"3"}
    for n in (1, 2, 3):
        items[b"image-%09d" % n] = jpeg_bytes(10, 10, seed=n)
        items[b"label-%09d" % n] = b"%03d" % (n * 2)          # numbers to recognise, not class labels
        items[b"bbox-%09d" % n] = b"\x00\xff"
    src = LMDBSource(write_lmdb(tmp_path / "ok", items), layout="columnar")
    check_format(src)
    assert {k: f.kind for k, f in src.fields.items()} == {"image": "image", "text": "text", "bbox": "bytes"}
    assert [read(src, i).fields["text"] for i in range(3)] == ["002", "004", "006"]
    assert (src.labels() == -1).all() and read(src, 2).fields["bbox"] == b"\x00\xff"
    del items[b"image-000000002"]
    gap = LMDBSource(write_lmdb(tmp_path / "gap", items))
    assert len(gap) == 3
    with pytest.raises(CorruptRecordError, match="no key for field 'image'"):
        read(gap, 1)
    items[b"num-samples"] = b"7"
    with pytest.raises(SourceError, match="num-samples"):
        LMDBSource(write_lmdb(tmp_path / "count", items))


def datum(label, *, pixels=None, jpeg=None, floats=None):
    d = Datum(label=label)
    if pixels is not None:
        d.channels, d.height, d.width = pixels.shape
        d.data, d.encoded = pixels.tobytes(), False
    elif jpeg is not None:
        d.data, d.encoded = jpeg, True
    else:
        d.channels, d.height, d.width = floats.shape
        d.float_data.extend(floats.reshape(-1).tolist())
    return d.SerializeToString()


def test_caffe_encoded_float_and_bad_datums(tmp_path):
    jpegs = [jpeg_bytes(12, 9, seed=k) for k in range(3)]
    encoded = LMDBSource(write_lmdb(tmp_path / "enc", {b"%08d_x.jpg" % k: datum(k, jpeg=j)
                                                       for k, j in enumerate(jpegs)}))
    check_format(encoded)
    assert encoded.fields["image"].kind == "image" and bytes(read(encoded, 2).image) == jpegs[2]
    floats = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    feats = LMDBSource(write_lmdb(tmp_path / "f", {b"a": datum(5, floats=floats), b"b": datum(6, floats=floats)}))
    assert set(feats.fields) == {"float_data", "label"}
    np.testing.assert_array_equal(read(feats, 1).fields["float_data"], floats)
    pixels = textured(4, 3)
    items = {b"%08d" % k: datum(k, pixels=pixels.transpose(2, 0, 1).copy()) for k in range(10)}
    items[b"00000011"] = b"\xff\xfe not a datum"
    items[b"00000012"] = datum(1, jpeg=jpegs[0])
    mixed = LMDBSource(write_lmdb(tmp_path / "mixed", items), layout="caffe")
    np.testing.assert_array_equal(read(mixed, 3).image, pixels[..., ::-1])
    with pytest.raises(CorruptRecordError, match="not a Caffe Datum") as err:
        read(mixed, 10)
    assert err.value.index == "00000011"
    with pytest.raises(CorruptRecordError, match="encoded Datum in an LMDB of raw ones"):
        read(mixed, 11)


def test_plain_images_and_unknown_layouts(tmp_path):
    images = LMDBSource(write_lmdb(tmp_path / "img", {b"b": jpeg_bytes(8, 8), b"a": jpeg_bytes(9, 9)}))
    assert images.fields == {"image": Field("image")} and images.name(0).endswith(":a")
    junk = write_lmdb(tmp_path / "junk", {b"k": b"\x00\x01\x02"})
    with pytest.raises(SourceError, match="pass layout=") as err:
        LMDBSource(junk)
    assert "columnar" in str(err.value) and "caffe" in str(err.value)
    with pytest.raises(SourceError, match="not written by LMDBWriter"):
        LMDBSource(junk, layout="ingest")
    with pytest.raises(ConfigError, match="Unknown LMDB layout 'cafe'. Available"):
        LMDBSource(junk, layout="cafe")
    with pytest.raises(SourceError, match="empty"):
        LMDBSource(write_lmdb(tmp_path / "empty", {}))
    with pytest.raises(FileNotFoundError):
        LMDBSource(tmp_path / "nope")


# -- Caffe labels() without parsing the image ------------------------------------------------------------
def full_labels(src):
    return [read(src, i).label for i in range(len(src))]


def test_realworld_caffe_labels_agree_with_the_full_parse():
    path = realworld("lmdb") / "caffe_verifycode" / "test_lmdb"
    src = LMDBSource(path)
    raw = raw_items(path)
    assert src.labels().tolist() == full_labels(src) == [Datum.FromString(raw[k]).label for k in sorted(raw)]


def test_caffe_labels_agree_with_the_full_parse(tmp_path):
    pixels = textured(5, 4).transpose(2, 0, 1).copy()
    values = [datum(label, pixels=pixels) for label in (0, 7, -1, -5, 2**31 - 1, -2**31, 300)]
    values.append(Datum(channels=3, height=5, width=4, data=pixels.tobytes()).SerializeToString())  # no label
    values.append(datum(3, pixels=pixels) + Datum(label=9).SerializeToString())   # repeated: the last wins
    values.append(b"\x28\x04" + datum(8, pixels=pixels))   # a label before the data too: the last wins
    src = LMDBSource(write_lmdb(tmp_path / "raw", {b"%08d" % k: v for k, v in enumerate(values)}))
    assert src.fields["image"].kind == "pixels"
    assert src.labels().tolist() == full_labels(src) == [0, 7, -1, -5, 2**31 - 1, -2**31, 300, -1, 9, 8]
    floats = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    feats = LMDBSource(write_lmdb(tmp_path / "f", {b"a": datum(-3, floats=floats), b"b": datum(6, floats=floats)}))
    assert feats.labels().tolist() == full_labels(feats) == [-3, 6]
    jpegs = {b"%08d_x.jpg" % k: datum(k * 11, jpeg=jpeg_bytes(6, 6, seed=k)) for k in range(4)}
    encoded = LMDBSource(write_lmdb(tmp_path / "enc", jpegs))
    assert encoded.labels().tolist() == full_labels(encoded) == [0, 11, 22, 33]


def test_caffe_labels_of_a_value_that_is_no_datum_name_its_key(tmp_path):
    pixels = textured(4, 3).transpose(2, 0, 1).copy()
    items = {b"%08d" % k: datum(k, pixels=pixels) for k in range(9)}
    items[b"00000009"] = datum(1, pixels=pixels)[:-3]   # truncated inside the data
    src = LMDBSource(write_lmdb(tmp_path / "bad", items), layout="caffe")
    with pytest.raises(CorruptRecordError, match="not a Caffe Datum") as err:
        src.labels()
    assert err.value.index == "00000009"


@settings(max_examples=200, deadline=None)
@given(st.one_of(
    st.binary(max_size=40),
    st.builds(lambda label, data, cut, tail: (Datum(label=label, data=data, channels=3).SerializeToString()
                                              + tail)[:cut],
              st.integers(-2**31, 2**31 - 1), st.binary(max_size=300), st.integers(0, 400), st.binary(max_size=8))))
def test_datum_label_is_the_full_parse_label_or_defers_to_it(value):
    label = datum_label(value)
    try:
        parsed = Datum.FromString(value)
    except ProtoDecodeError:
        assert label is None   # damage is left to the full parse, which names it
        return
    if label is not None:
        assert label == (parsed.label if parsed.HasField("label") else -1)


@pytest.fixture(scope="module")
def image_label_db(tmp_path_factory):
    root = tmp_path_factory.mktemp("il")
    write(root, make_records(4), fields={"image": Field("image"), "label": Field("int")})
    return root / "db.lmdb"


def test_batch_parse_reads_intact_records_without_parse(image_label_db, monkeypatch):
    """Intact image + label records are read from the batch's arrays, not handed one by one to `parse` (which
    would give the same records, more slowly: the test above cannot tell the two apart)."""
    src = LMDBSource(image_label_db)
    indices = list(range(len(src)))
    raws = [read_location(src.locate(i)) for i in indices]
    want = [src.parse(i, raw) for i, raw in zip(indices, raws)]
    monkeypatch.setattr(src, "parse", lambda i, raw: pytest.fail(f"record {i} went through parse"))
    got = src.parse_batch(indices, raws)
    assert [r.label for r in got] == [r.label for r in want]
    assert all(bytes(g.image) == bytes(w.image) for g, w in zip(got, want))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40),
                          st.tuples(st.integers(0, 3), st.integers(0, 60), st.integers(0, 255), st.booleans())),
                min_size=4, max_size=4))
def test_batch_parse_of_image_label_records_matches_parse(image_label_db, tmp_path_factory, changes):
    """The batch parse of our image + label records (`LMDBSource.parse_batch`) gives what `parse` gives, for
    intact records, random values and records with one byte changed or cut short."""
    from ingest.formats.base import _same_record, parse_each, parse_or_error
    copy = tmp_path_factory.mktemp("m") / "db.lmdb"
    shutil.copytree(image_label_db, copy)
    env = lmdb.open(str(copy), map_size=1 << 26)
    with env.begin(write=True) as txn:
        intact = [txn.get(b"%09d" % k) for k in range(4)]
        for k, change in enumerate(changes):
            key = b"%09d" % k
            if isinstance(change, bytes):
                txn.put(key, change)
                continue
            which, at, byte, cut = change
            value = bytearray(intact[which])
            at = at if at < 30 else len(value) - (at - 29)   # the head or the tail of the record
            value[at] = byte
            txn.put(key, bytes(value[:at] if cut else value))
    env.close()
    src = LMDBSource(copy)
    indices = list(range(len(src)))
    raws = [read_location(src.locate(i)) for i in indices]
    for i, raw, got in zip(indices, raws, parse_each(src, indices, raws)):
        want = parse_or_error(src, i, raw)
        if isinstance(want, Exception):
            assert type(got) is type(want) and str(got) == str(want)
        else:
            assert _same_record(got, want)


def _read_everything(path) -> str:
    """Open, label, read and verify the LMDB at ``path``: "ok", or the ingest error's type and message."""
    from ingest.errors import IngestError
    try:
        src = LMDBSource(path)
        src.labels()
        for i in range(len(src)):
            src.parse(i, read_location(src.locate(i)))
        verify(path)
    except IngestError as err:
        return f"{type(err).__name__}: {err}"
    return "ok"


def _small_lmdb(root, n=300, sizes=(20, 40)):
    w = LMDBWriter(root, "s", {"image": Field("image"), "label": Field("int")})
    for i in range(n):
        w.add(Record(b"\xff\xd8\xff" + bytes([i % 251]) * sizes[i % len(sizes)], i % 5))
    w.close()
    return root / "s.lmdb"


def test_truncated_lmdb_is_named_before_it_is_mapped(tmp_path):
    """liblmdb maps what the meta page promises: a shorter file gave SIGBUS on the first read past its end."""
    db = _small_lmdb(tmp_path)
    data = db / "data.mdb"
    whole = data.read_bytes()
    for cut in (len(whole) - 4096, len(whole) // 2, 5000, 100, 0):
        data.write_bytes(whole[:cut])
        out = isolated(_read_everything, db)
        assert out.startswith("CorruptRecordError") and str(data) in out, out
    data.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(CorruptRecordError, match=r"data\.mdb at byte \d+: truncated or damaged LMDB: its meta page "
                                                 r"promises \d+ pages"):
        isolated_check(data)


def isolated_check(data):
    from ingest.formats import _lmdb_check
    _lmdb_check.check(str(data))


@pytest.mark.parametrize("damage", ["zero", "garble", "root", "meta"])
def test_damaged_pages_are_named_not_asserted_on(tmp_path, damage):
    """A zeroed branch or leaf page made liblmdb abort (IS_LEAF / NUMKEYS assertions): the tree is walked first."""
    from ingest.formats import _lmdb_check
    db = _small_lmdb(tmp_path, n=3000)
    data = db / "data.mdb"
    raw = bytearray(data.read_bytes())
    meta = _lmdb_check.check(str(data))
    assert meta.depth >= 2 and meta.entries == 3003
    psize = meta.page_size
    if damage == "meta":   # the picked meta's magic
        picked = psize if meta.txnid % 2 else 0
        raw[picked + 16:picked + 20] = b"\0\0\0\0"
    else:
        page = meta.root if damage == "root" else meta.root + 1 if damage == "zero" else meta.last_page // 2
        raw[page * psize:(page + 1) * psize] = bytes(psize) if damage != "garble" else \
            np.random.default_rng(0).bytes(psize)
    data.write_bytes(bytes(raw))
    out = isolated(_read_everything, db)
    assert out.startswith("CorruptRecordError") and str(data) in out, out


def test_liblmdb_errors_are_corrupt_record_errors(tmp_path, monkeypatch):
    db = _small_lmdb(tmp_path, n=10)
    src = LMDBSource(db)
    monkeypatch.setattr(src._dbs[0], "ranges", None)   # looked up per batch, through liblmdb

    class Failing:
        def begin(self, **kw):
            raise lmdb.CorruptedError("mdb_get: MDB_CORRUPTED: Located page was wrong type")
    from ingest.formats.lmdb import _Map
    view = src._maps.get(0, lambda: _Map(str(db)))
    monkeypatch.setattr(view, "env", Failing())
    with pytest.raises(CorruptRecordError, match=r"data\.mdb \[sample 000000003\]: liblmdb: mdb_get"):
        src.locate(3)
