"""WebDataset tar shards: the real shards of the webdataset/torchdata test suites, our writer read back by the
`webdataset` package, the index, streamed gzipped shards and bad input."""

import gzip
import io
import json
import os
import shutil
import tarfile

import numpy as np
import pytest

import ingest
from ingest.errors import ConfigError, CorruptRecordError, IngestError, SourceError
from ingest.formats import check_format, iter_records, open_source, read_location, tarindex
from ingest.formats.base import Field, Record
from ingest.formats.webdataset import WebDatasetSource, WebDatasetWriter
from conftest import jpeg_bytes, realworld, textured

webdataset = pytest.importorskip("webdataset")


def wds_samples(url):
    """Raw samples as the webdataset package groups them: {key: {ext: bytes}} in order."""
    out = {}
    for sample in webdataset.WebDataset(str(url), shardshuffle=False, empty_check=False):
        out[sample["__key__"]] = {k: v for k, v in sample.items() if not k.startswith("__")}
    return out


def read_all(src):
    return {name.split(":", 1)[1]: record for name, record in iter_records(src)}


# -- files written by other tools --------------------------------------------------------------------
@pytest.mark.parametrize("name, count, fields", [
    ("mpdata.tar", 100, {"mp": "bytes"}),
    ("tendata.tar", 100, {"ten": "bytes"}),
    ("compressed.tar", 3, {"txt": "text"}),
    ("wds.tar", 10, {"bin": "bytes", "txt": "text"}),
    ("edge_cases/hopper.tar", 1, {"image": "image"}),
    ("sample.tgz", 90, {"image": "image", "label": "int"}),
])
def test_realworld_shards_match_webdataset(name, count, fields):
    path = realworld("webdataset") / name
    src = open_source(str(path))
    assert isinstance(src, WebDatasetSource)
    check_format(src)
    assert {k: f.kind for k, f in src.fields.items()} == fields
    ours = read_all(src)
    theirs = wds_samples(path)
    assert len(ours) == count and list(ours) == list(theirs)
    for key, record in ours.items():
        members = theirs[key]
        for field_name in fields:
            value = record.get(field_name)
            ext = src._exts[field_name][0]
            expected = members[ext]
            if ext.endswith(".gz"):
                expected = gzip.decompress(expected)
            if fields[field_name] == "text":
                expected = expected.decode()
            elif fields[field_name] == "int":
                expected = int(expected)
            else:
                value = bytes(value)
            assert value == expected, (name, key, field_name)


def test_realworld_directory_prefix_keys_and_gz_members():
    src = WebDatasetSource(realworld("webdataset") / "wds.tar")
    assert [src.name(i).rsplit(":", 1)[1] for i in range(3)] == ["data/0", "data/1", "data/2"]
    assert src.parse(1, read_location(src.locate(1))).fields == {"bin": b"bin1", "txt": "text1"}
    gz = WebDatasetSource(realworld("webdataset") / "compressed.tar")   # with a directory entry, skipped
    assert len(gz) == 3 and gz.name(0).endswith(":compressed/0001")
    assert gz.parse(0, read_location(gz.locate(0))).fields["txt"] == "hello\n"


def test_realworld_plain_tar_of_images():
    src = WebDatasetSource(realworld("webdataset") / "edge_cases" / "hopper.tar")
    assert src._exts["image"] == ("jpg", "png")   # the first image member wins
    record = src.parse(0, read_location(src.locate(0)))
    with tarfile.open(realworld("webdataset") / "edge_cases" / "hopper.tar") as tf:
        assert bytes(record.image) == tf.extractfile("hopper.jpg").read()


def test_realworld_labels_of_gzipped_shard_through_loader():
    path = realworld("webdataset") / "sample.tgz"
    expected = [int(s["cls"]) for s in wds_samples(path).values()]
    loader = ingest.Loader(str(path), batch_size=16, device="cpu")
    got = [int(x) for _, labels in loader for x in labels]
    assert sorted(got) == sorted(expected) and len(got) == 90


# -- our writer ---------------------------------------------------------------------------------------
FIELDS = {"image": Field("image"), "label": Field("int"), "json": Field("text"), "caption": Field("text"),
          "emb": Field("array"), "raw": Field("bytes"), "mask": Field("pixels"), "score": Field("float")}


def make_records(n, seed=0):
    rng = np.random.default_rng(seed)
    return [Record(jpeg_bytes(24 + i % 5, 32, seed=seed + i), int(i % 4),
                   {"json": f'{{"i": {i}}}', "caption": f"sample {i} é",
                    "emb": rng.random((3, i % 3 + 1)).astype(np.float32),
                    "raw": bytes([i, 0, 255]), "mask": textured(6, 5 + i % 2, seed=i)[..., :1], "score": i / 7})
            for i in range(n)]


def write_shard(directory, stem, records, fields=FIELDS, **options):
    writer = WebDatasetWriter(directory, stem, fields, **options)
    for r in records:
        writer.add(r)
    return writer.close()


def test_writer_round_trip_and_webdataset_reads_it(tmp_path):
    records = make_records(9)
    assert write_shard(tmp_path, "s", records) == ["s.tar", "s.tar.idx", "s.tar.crc32c"]
    src = WebDatasetSource(tmp_path / "s.tar")
    check_format(src)
    assert {k: f.kind for k, f in src.fields.items()} == {
        "image": "image", "label": "int", "json": "text", "caption": "text", "emb": "array", "raw": "bytes",
        "mask": "image", "score": "float"}
    assert src.labels().tolist() == [r.label for r in records]
    for i, r in enumerate(records):
        got = src.parse(i, read_location(src.locate(i)))
        assert bytes(got.image) == r.image and got.label == r.label
        assert got.fields["json"] == r.fields["json"] and got.fields["caption"] == r.fields["caption"]
        np.testing.assert_array_equal(got.fields["emb"], r.fields["emb"])
        assert got.fields["raw"] == r.fields["raw"] and got.fields["score"] == r.fields["score"]
        from PIL import Image
        np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(bytes(got.fields["mask"])))),
                                      r.fields["mask"][..., 0])   # pixels are stored as lossless PNG
    theirs = webdataset.WebDataset(str(tmp_path / "s.tar"), shardshuffle=False, empty_check=False).decode()
    for r, sample in zip(records, theirs):
        assert sample["cls"] == r.label and sample["json"] == {"i": records.index(r)}
        assert sample["caption.txt"] == r.fields["caption"]
        np.testing.assert_array_equal(sample["emb.npy"], r.fields["emb"])


def test_writer_is_deterministic_and_headers_fixed(tmp_path):
    records = make_records(5)
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        write_shard(tmp_path / d, "s", records, key_prefix="part/")
    data = (tmp_path / "a" / "s.tar").read_bytes()
    assert data == (tmp_path / "b" / "s.tar").read_bytes()
    assert (tmp_path / "a" / "s.tar.idx").read_bytes() == (tmp_path / "b" / "s.tar.idx").read_bytes()
    with tarfile.open(tmp_path / "a" / "s.tar") as tf:
        infos = tf.getmembers()
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in infos} == {(0, 0, 0, "", "", 0o644)}
    assert infos[0].name == "part/000000000.jpg" and infos[1].name == "part/000000000.cls"
    with pytest.raises(ConfigError, match="key_prefix"):
        WebDatasetWriter(tmp_path, "t", FIELDS, key_prefix="x.y")
    with pytest.raises(ConfigError, match="key_prefix"):
        WebDatasetWriter(tmp_path, "t", FIELDS, key_prefix="../")


def test_writer_refuses_unknown_image_bytes(tmp_path):
    writer = WebDatasetWriter(tmp_path, "s", {"image": Field("image")})
    with pytest.raises(CorruptRecordError, match="no image format"):
        writer.add(Record(b"not an image at all"))


def test_index_is_used_and_stale_index_rebuilt(tmp_path, monkeypatch):
    write_shard(tmp_path, "s", make_records(4))
    index = tarindex.index_path(str(tmp_path / "s.tar"))
    assert os.path.exists(index)
    monkeypatch.setattr(tarindex, "build", lambda path: pytest.fail("the saved index should be used"))
    assert len(WebDatasetSource(tmp_path / "s.tar")) == 4
    monkeypatch.undo()
    with open(tmp_path / "s.tar", "ab") as f:   # the shard changed size: the index no longer applies
        f.write(b"\0" * 512)
    assert len(WebDatasetSource(tmp_path / "s.tar")) == 4
    with open(index, "w") as f:
        f.write('{"format": "ingest-tar-index", "version": 1, "tar_size": %d, "keys": ["a"], "starts": [0, 1], '
                '"exts": ["jpg"], "offsets": [999999999], "sizes": [5], "ints": [null]}'
                % os.path.getsize(tmp_path / "s.tar"))
    with pytest.raises(CorruptRecordError, match="do not fit") as err:
        WebDatasetSource(tmp_path / "s.tar")
    assert err.value.path == index


def test_explicit_index_files(tmp_path):
    write_shard(tmp_path, "a", make_records(2))
    write_shard(tmp_path, "b", make_records(3))
    moved = str(tmp_path / "b-index.json")
    os.rename(tmp_path / "b.tar.idx", moved)
    src = WebDatasetSource(tmp_path / "b.tar", index=moved)
    assert len(src) == 3 and src.labels().tolist() == [0, 1, 2]
    with pytest.raises(CorruptRecordError, match="another size") as err:
        WebDatasetSource(tmp_path / "a.tar", index=moved)
    assert err.value.path == moved
    with pytest.raises(ConfigError, match="2 index files for 1 shards"):
        WebDatasetSource(tmp_path / "a.tar", index=[moved, moved])


def test_write_index_option_and_shard_sets(tmp_path):
    for k in range(3):
        write_shard(tmp_path, f"s{k}", make_records(3 + k, seed=k), fields={"image": Field("image"),
                                                                           "label": Field("int")})
        os.remove(tmp_path / f"s{k}.tar.idx")
    src = WebDatasetSource(tmp_path, write_index=True)
    assert len(src) == 3 + 4 + 5 and len(src.shards) == 3
    assert all(os.path.exists(tmp_path / f"s{k}.tar.idx") for k in range(3))
    assert src.name(3).endswith("s1.tar:000000000")
    assert len(WebDatasetSource(str(tmp_path / "s*.tar"))) == 12
    assert len(WebDatasetSource([tmp_path / "s2.tar", tmp_path / "s0.tar"])) == 8
    with pytest.raises(SourceError, match="no tar shard files match"):
        WebDatasetSource(str(tmp_path / "nothing*.tar"))


def test_streamed_gzip_shard(tmp_path):
    records = make_records(6)
    write_shard(tmp_path, "s", records, fields={"image": Field("image"), "label": Field("int")})
    with open(tmp_path / "s.tar", "rb") as f, gzip.open(tmp_path / "s.tar.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    src = WebDatasetSource(tmp_path / "s.tar.gz")
    assert src.streamed and src.shards == [str(tmp_path / "s.tar.gz")]
    check_format(src)
    items = list(src.iter_shard(0, 2))
    assert [r.label for _, r in items] == [r.label for r in records[2:]]
    assert items[0][0].endswith("s.tar.gz:000000002")
    with pytest.raises(TypeError, match="streamed"):
        len(src)
    os.link(tmp_path / "s.tar.gz", tmp_path / "misnamed.tar")   # gzip data under a plain name
    assert WebDatasetSource(tmp_path / "misnamed.tar").streamed
    plain = WebDatasetSource(tmp_path / "s.tar", stream=True)
    assert [r.label for _, r in plain.iter_shard(0)] == [r.label for r in records]
    with pytest.raises(ConfigError, match="gzipped"):
        WebDatasetSource(tmp_path / "s.tar.gz", stream=False)


def test_loader_end_to_end(tmp_path):
    records = make_records(10)
    write_shard(tmp_path, "s", records, fields={"image": Field("image"), "label": Field("int"),
                                                "caption": Field("text")})
    loader = ingest.Loader(str(tmp_path / "s.tar"), batch_size=4, device="cpu", output="dict", ragged=True)
    labels, captions = [], []
    for batch in loader:
        labels += batch["labels"].tolist()
        captions += batch["caption"]
    assert labels == [r.label for r in records]
    assert captions == [r.fields["caption"] for r in records]


# -- declared fields --------------------------------------------------------------------------------
def tar_of(path, members, fmt=tarfile.PAX_FORMAT):
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return str(path)


def test_explicit_fields_and_missing_member(tmp_path):
    jpg = jpeg_bytes(8, 8)
    path = tar_of(tmp_path / "x.tar", [("a.jpg", jpg), ("a.cls", b"1"), ("a.seg.png", b"p"),
                                       ("b.jpg", jpg), ("b.cls", b" 2\n"), ("b.Seg.PNG", b"q"),
                                       ("c.png", jpg), ("c.cls", b"3")])
    src = WebDatasetSource(path)
    assert set(src.fields) == {"image", "label"} and src._exts["image"] == ("jpg", "png")
    assert src.labels().tolist() == [1, 2, 3]
    assert bytes(src.parse(2, read_location(src.locate(2))).image) == jpg
    seg = WebDatasetSource(path, fields={"image": "jpg", "label": "cls", "seg": "seg.png"})
    assert seg.fields["seg"].kind == "image"
    assert bytes(seg.parse(1, read_location(seg.locate(1))).fields["seg"]) == b"q"   # extensions lower-cased
    with pytest.raises(CorruptRecordError, match="no member for field 'image'") as err:
        seg.parse(2, read_location(seg.locate(2)))
    assert err.value.path == path and "c" in str(err.value)
    with pytest.raises(ConfigError, match="'label' field needs integer"):
        WebDatasetSource(path, fields={"label": "txt"})
    with pytest.raises(ConfigError, match="different kinds"):
        WebDatasetSource(path, fields={"x": ("jpg", "txt")})


def test_not_integer_label_member(tmp_path):
    path = tar_of(tmp_path / "x.tar", [("a.jpg", jpeg_bytes(8, 8)), ("a.cls", b"cat")])
    src = WebDatasetSource(path, fields={"image": "jpg", "label": "cls"})
    with pytest.raises(CorruptRecordError, match="not an integer"):
        src.labels()


# -- bad input ------------------------------------------------------------------------------------
@pytest.fixture
def good_tar(tmp_path):
    return tar_of(tmp_path / "good.tar", [(f"{k:03d}.{ext}", data) for k in range(4)
                                          for ext, data in (("jpg", jpeg_bytes(8, 8, seed=k)), ("cls", b"%d" % k))],
                  fmt=tarfile.USTAR_FORMAT)


def test_truncated_tar(good_tar, tmp_path):
    data = open(good_tar, "rb").read()
    bad = tmp_path / "cut.tar"
    bad.write_bytes(data[:700])   # inside the first member's data
    with pytest.raises(CorruptRecordError, match="past the end of the file") as err:
        WebDatasetSource(bad)
    assert err.value.path == str(bad) and err.value.offset == 0
    with tarfile.open(good_tar) as tf:
        second = tf.getmembers()[1].offset
    bad.write_bytes(data[:second + 100])   # inside the second header
    with pytest.raises(CorruptRecordError, match="invalid tar header") as err:
        WebDatasetSource(bad)
    assert err.value.offset == second


def test_flipped_header_byte_is_reported_not_treated_as_end(good_tar, tmp_path):
    data = bytearray(open(good_tar, "rb").read())
    with tarfile.open(good_tar) as tf:
        third = tf.getmembers()[2].offset
    data[third + 10] ^= 0x41        # a name byte of the third header: its checksum no longer matches
    bad = tmp_path / "flip.tar"
    bad.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="invalid tar header") as err:
        WebDatasetSource(bad)
    assert err.value.offset == third and "flip.tar" in str(err.value)


def test_size_field_past_end_allocates_nothing(tmp_path):
    header = tarfile.TarInfo("a.jpg")
    header.size = 8**11 - 1          # the largest octal size: ~8 GiB
    bad = tmp_path / "huge.tar"
    bad.write_bytes(header.tobuf(tarfile.USTAR_FORMAT) + b"x" * 100)
    with pytest.raises(CorruptRecordError, match="past the end"):
        WebDatasetSource(bad)
    long_name = tarfile.TarInfo("././@LongLink")   # a GNU long-name block claiming more than the file holds
    long_name.type, long_name.size = tarfile.GNUTYPE_LONGNAME, 8**11 - 1
    (tmp_path / "long.tar").write_bytes(long_name.tobuf(tarfile.GNU_FORMAT) + b"y" * 600)
    with pytest.raises(CorruptRecordError):
        WebDatasetSource(tmp_path / "long.tar")


@pytest.mark.parametrize("name", ["../evil.jpg", "/etc/evil.jpg", "a/../../evil.jpg"])
def test_escaping_member_names(tmp_path, name):
    path = tar_of(tmp_path / "x.tar", [("ok.jpg", jpeg_bytes(8, 8)), (name, b"x")])
    with pytest.raises(CorruptRecordError, match="escapes the shard root") as err:
        WebDatasetSource(path)
    assert name in str(err.value)


def test_garbage_after_end_and_duplicates(good_tar, tmp_path):
    bad = tmp_path / "tail.tar"
    bad.write_bytes(open(good_tar, "rb").read() + b"garbage")
    with pytest.raises(CorruptRecordError, match="after the end-of-archive"):
        WebDatasetSource(bad)
    dup = tar_of(tmp_path / "dup.tar", [("a.jpg", b"1"), ("a.jpg", b"2")])
    with pytest.raises(CorruptRecordError, match="two 'jpg' members"):
        WebDatasetSource(dup)
    (tmp_path / "empty.tar").write_bytes(b"")
    with pytest.raises(CorruptRecordError, match="not a valid tar"):
        WebDatasetSource(tmp_path / "empty.tar")


def test_truncated_gzip_stream(good_tar, tmp_path):
    packed = gzip.compress(open(good_tar, "rb").read())
    bad = tmp_path / "cut.tgz"
    bad.write_bytes(packed[:len(packed) // 2])
    with pytest.raises(IngestError):   # the first samples may already be found while inferring fields
        src = WebDatasetSource(bad)
        list(src.iter_shard(0))


def test_gz_member_bomb_is_refused(tmp_path, monkeypatch):
    from ingest.formats import webdataset as wds
    path = tar_of(tmp_path / "x.tar", [("a.txt.gz", gzip.compress(b"z" * 100_000))])
    src = WebDatasetSource(path)
    monkeypatch.setattr(wds, "MAX_GUNZIP", 1000)
    with pytest.raises(CorruptRecordError, match="more than 1000 bytes"):
        src.parse(0, read_location(src.locate(0)))
    monkeypatch.undo()
    assert src.parse(0, read_location(src.locate(0))).fields["txt"] == "z" * 100_000


def test_npy_member_checked_before_allocation(tmp_path):
    buf = io.BytesIO()
    np.save(buf, np.zeros((2, 3), np.float32))
    huge = io.BytesIO()   # a header claiming 120 GB, followed by 8 bytes
    np.lib.format.write_array_header_1_0(huge, {"descr": "<f4", "fortran_order": False, "shape": (10**10, 3)})
    path = tar_of(tmp_path / "x.tar", [("a.npy", buf.getvalue()[:-4]), ("b.npy", huge.getvalue() + b"8 bytes!"),
                                       ("c.npy", b"\x93NUMPY\x01\x00garbage")])
    src = WebDatasetSource(path)
    for i in range(3):
        with pytest.raises(CorruptRecordError, match=r"\.npy"):
            src.parse(i, read_location(src.locate(i)))


def test_label_is_read_from_the_shard_and_checked_against_the_index(tmp_path):
    records = make_records(3)
    write_shard(tmp_path, "s", records, fields={"image": Field("image"), "label": Field("int")})
    src = WebDatasetSource(tmp_path / "s.tar")
    locs = src.locate(1)
    assert len(locs) == 2 and locs[0].length == len(records[1].image) + 512   # each from its header block
    assert src.parse(1, read_location(locs)).label == records[1].label
    index = tmp_path / "s.tar.idx"
    doc = json.loads(index.read_text())
    doc["ints"][doc["exts"].index("cls")] = 7   # relabel sample 0 in the index only
    index.write_text(json.dumps(doc))
    edited = WebDatasetSource(tmp_path / "s.tar")
    with pytest.raises(CorruptRecordError, match=r"s\.tar\.idx gives sample .* label 7, its member holds 0") as err:
        edited.parse(0, read_location(edited.locate(0)))
    assert err.value.path.endswith("s.tar") and err.value.offset is not None
    assert edited.parse(1, read_location(edited.locate(1))).label == records[1].label   # the others read right


def test_edited_index_offsets_are_named(tmp_path):
    """Members swapped in the index (same sizes, so every range still fits) fail on their header check."""
    records = [Record(jpeg_bytes(8, 8), i) for i in range(3)]
    write_shard(tmp_path, "s", records, fields={"image": Field("image"), "label": Field("int")})
    index = tmp_path / "s.tar.idx"
    doc = json.loads(index.read_text())
    cls = [k for k, e in enumerate(doc["exts"]) if e == "cls"]
    doc["offsets"][cls[0]], doc["offsets"][cls[1]] = doc["offsets"][cls[1]], doc["offsets"][cls[0]]
    doc["ints"][cls[0]], doc["ints"][cls[1]] = doc["ints"][cls[1]], doc["ints"][cls[0]]
    order = np.argsort(doc["offsets"])   # the loader refuses offsets out of order; keep them sorted
    if list(order) != list(range(len(order))):
        doc["offsets"] = sorted(doc["offsets"])
    index.write_text(json.dumps(doc))
    src = WebDatasetSource(tmp_path / "s.tar")
    bad = [i for i in range(3) if isinstance(_try(src, i), CorruptRecordError)]
    assert bad and all("s.tar.idx" in str(_try(src, i)) for i in bad)
    assert all(_try(src, i).label == i for i in range(3) if i not in bad)


def _try(src, i):
    try:
        return src.parse(i, read_location(src.locate(i)))
    except CorruptRecordError as err:
        return err


def test_pixels_image_and_classes_from_a_converter_manifest(tmp_path):
    fields = {"image": Field("pixels"), "label": Field("int")}
    pixels = textured(5, 7, seed=3)
    write_shard(tmp_path, "s", [Record(pixels, 1), Record(pixels[::-1].copy(), 0)], fields=fields)
    (tmp_path / "manifest.json").write_text('{"format": "wds", "classes": ["cat", "dog"]}')
    src = open_source(tmp_path)
    check_format(src)
    assert src.classes == ["cat", "dog"] and src._exts["image"] == ("png",)   # pixels stored as PNG
    from PIL import Image
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(bytes(read(src, 0).image)))), pixels)


def read(src, i):
    return src.parse(i, read_location(src.locate(i)))


@pytest.mark.parametrize("compress", [False, True])
def test_reads_what_webdataset_tarwriter_wrote(tmp_path, compress):
    path = str(tmp_path / ("w.tar.gz" if compress else "w.tar"))
    samples = [{"__key__": f"dir/s{i}", "jpg": jpeg_bytes(9, 9, seed=i), "cls": i % 3, "txt": f"t{i}",
                "npy": np.arange(i + 1, dtype=np.int16)} for i in range(5)]
    with webdataset.TarWriter(path, compress=compress) as sink:
        for sample in samples:
            sink.write(sample)
    src = WebDatasetSource(path)
    assert src.streamed == compress
    assert {k: f.kind for k, f in src.fields.items()} == {"image": "image", "label": "int", "txt": "text",
                                                          "npy": "array"}
    got = read_all(src)
    assert list(got) == [s["__key__"] for s in samples]
    for sample, record in zip(samples, got.values()):
        assert bytes(record.image) == sample["jpg"] and record.label == sample["cls"]
        assert record.fields["txt"] == sample["txt"]
        np.testing.assert_array_equal(record.fields["npy"], sample["npy"])


@pytest.mark.parametrize("key_prefix", ["", "données/" + "d" * 120 + "/"])   # the long one needs pax headers
def test_writer_index_is_the_one_ingest_index_builds(tmp_path, key_prefix):
    from ingest.tools.cli import main
    fields = {**FIELDS, "count": Field("int"), "Note": Field("text"), "empty": Field("bytes")}
    records = make_records(7)
    for i, r in enumerate(records):
        r.fields.update({"count": 10**i - 3, "Note": "x" * i, "empty": b""})
    write_shard(tmp_path, "s", records, fields=fields, key_prefix=key_prefix)
    written = (tmp_path / "s.tar.idx").read_bytes()
    os.remove(tmp_path / "s.tar.idx")
    assert main(["index", str(tmp_path / "s.tar")]) == 0
    assert (tmp_path / "s.tar.idx").read_bytes() == written
    index = tarindex.load(str(tmp_path / "s.tar.idx"), os.path.getsize(tmp_path / "s.tar"))
    assert index.keys[1] == f"{key_prefix}000000001" and "note.txt" in index.exts   # keys, names as read back
    assert int(index.ints[index.exts.index("count")]) == 10**0 - 3
