"""TFRecord: framing and CRCs, DALI index files, feature specs and inference, GZIP/ZLIB streams, the writer,
bad input, the real files TensorFlow and TFX wrote, and the Loader end to end."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import ingest
from conftest import jpeg_bytes, realworld
from ingest.errors import ConfigError, CorruptRecordError, SourceError
from ingest.formats import Field, Record, check_format, iter_records, read_location
from ingest.formats import tfrecord
from ingest.formats._protos import Example
from ingest.formats.tfrecord import TFRecordSource, TFRecordWriter, frame, masked_crc, writer_spec

FIELDS = {"image": Field("image"), "label": Field("int"), "boxes": Field("floats"), "caption": Field("text"),
          "weight": Field("float"), "mask": Field("array")}
#: A Python with TensorFlow for the cross-check (a developer's check, not CI's: TensorFlow takes long to start)
TF_PYTHON = os.environ.get("INGEST_TF_PYTHON") or ("" if os.environ.get("CI") else "/tmp/tfvenv/bin/python")


def make_records(n: int, size: tuple[int, int] | None = None) -> list[Record]:
    out = []
    for i in range(n):
        h, w = size or (20 + i, 30 + 2 * i)
        out.append(Record(jpeg_bytes(h, w, seed=i), i % 3,
                          {"boxes": np.arange(4 * (i % 3), dtype=np.float32) / 10, "caption": f"sample {i} ✓",
                           "weight": 0.5 * i, "mask": np.arange(6, dtype=np.int16).reshape(2, 3) * i}))
    return out


def write(directory: Path, records: list[Record], stem: str = "part-0", fields=FIELDS, **options) -> list[str]:
    writer = TFRecordWriter(directory, stem, fields, **options)
    for r in records:
        writer.add(r)
    return writer.close()


@pytest.fixture
def shard(tmp_path: Path) -> tuple[Path, list[Record]]:
    records = make_records(6)
    write(tmp_path, records)
    return tmp_path / "part-0.tfrecord", records


def example_bytes(**features) -> bytes:
    """A serialized tf.train.Example: keyword -> ('int64'|'float'|'bytes', values)."""
    ex = Example()
    for key, (kind, values) in features.items():
        getattr(ex.features.feature[key.replace("__", "/")], f"{kind}_list").value.extend(values)
    return ex.SerializeToString()


# -- round trip -------------------------------------------------------------------------------------

def test_writer_round_trip_every_kind(shard):
    path, records = shard
    src = TFRecordSource(path, features=writer_spec(FIELDS))
    check_format(src)
    assert len(src) == len(records)
    assert src.labels().tolist() == [r.label for r in records]
    for (name, got), want in zip(iter_records(src), records):
        assert name.startswith(str(path) + ":")
        assert got.image == want.image and got.label == want.label
        np.testing.assert_array_equal(got.fields["boxes"], want.fields["boxes"])
        assert got.fields["caption"] == want.fields["caption"]
        assert got.fields["weight"] == pytest.approx(want.fields["weight"])
        assert got.fields["mask"].dtype == np.int16
        np.testing.assert_array_equal(got.fields["mask"], want.fields["mask"])


def test_writer_is_deterministic_and_indexes_what_it_wrote(tmp_path):
    records = make_records(4)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert write(tmp_path / "a", records) == ["part-0.tfrecord", "part-0.tfrecord.idx"]
    write(tmp_path / "b", records)
    for name in ("part-0.tfrecord", "part-0.tfrecord.idx"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    entries = tfrecord.scan(str(tmp_path / "a" / "part-0.tfrecord"))
    lines = (tmp_path / "a" / "part-0.tfrecord.idx").read_text().splitlines()
    assert lines == [f"{o} {s}" for o, s in entries]
    assert entries[-1].sum() == (tmp_path / "a" / "part-0.tfrecord").stat().st_size


def test_framing_matches_the_spec():
    data = b"hello"
    rec = frame(data)
    assert rec[:8] == (5).to_bytes(8, "little") and rec[12:17] == data and len(rec) == 5 + 16
    # masked CRC32C of the spec: rotate right by 15, add 0xa282ead8
    import crc32c
    crc = crc32c.crc32c(data)
    assert int.from_bytes(rec[17:], "little") == ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) % 2 ** 32
    assert masked_crc(rec[:8]) == int.from_bytes(rec[8:12], "little")


def test_inferred_layout(shard):
    path, records = shard
    src = TFRecordSource(path)
    # a one-value bytes feature is bytes (a single record cannot tell text); numbers are variable-length lists
    assert src.fields == {"image": Field("image"), "label": Field("int"), "boxes": Field("floats"),
                          "weight": Field("floats"), "mask": Field("array"), "caption": Field("bytes")}
    assert src.unread == {}
    check_format(src)
    rec = src.parse(1, read_location(src.locate(1)))
    assert rec.image == records[1].image and rec.label == 1
    assert rec.fields["weight"].tolist() == [0.5]


def test_spec_forms_and_validation(shard):
    path, _ = shard
    src = TFRecordSource(path, features={"image": "image/encoded", "cls": ("image/class/label", "int"),
                                         "format": "image/format", "mask": ("mask", Field("array", dtype="int16"))})
    assert src.fields["format"] == Field("bytes") and "label" not in src.fields
    rec = src.parse(0, read_location(src.locate(0)))
    assert rec.fields["format"] == b"jpeg" and rec.fields["cls"] == 0 and rec.label == -1
    with pytest.raises(ConfigError, match="'label' field must be of kind int"):
        TFRecordSource(path, features={"label": ("image/class/label", "floats")})
    with pytest.raises(ConfigError, match="Unknown field kind"):
        TFRecordSource(path, features={"x": ("boxes", "complex")})
    with pytest.raises(ConfigError, match="cannot tell the kind"):
        TFRecordSource(path, features={"x": "no/such/key"})


def test_fixed_length_lists_are_checked(tmp_path):
    (tmp_path / "x.tfrecord").write_bytes(frame(example_bytes(v=("int64", [1, 2, 3]))))
    src = TFRecordSource(tmp_path / "x.tfrecord", features={"v": Field("ints", shape=(3,))})
    assert src.parse(0, read_location(src.locate(0))).fields["v"].tolist() == [1, 2, 3]
    src = TFRecordSource(tmp_path / "x.tfrecord", features={"v": Field("ints", shape=(2,))})
    with pytest.raises(CorruptRecordError, match="'v': holds 3 values, expected 2"):
        src.parse(0, read_location(src.locate(0)))


def test_pixels_field_round_trip(tmp_path):
    pixels = [np.random.default_rng(k).integers(0, 255, (5, 7, 3), dtype=np.uint8) for k in range(3)]
    write(tmp_path, [Record(p, k) for k, p in enumerate(pixels)],
          fields={"image": Field("pixels"), "label": Field("int")})
    src = TFRecordSource(tmp_path / "part-0.tfrecord")
    assert src.fields == {"image": Field("pixels"), "label": Field("int")}
    check_format(src)
    np.testing.assert_array_equal(src.parse(1, read_location(src.locate(1))).image, pixels[1])
    (images, labels), = ingest.Loader(src, batch_size=3, device="cpu")  # no decode: CHW uint8
    assert labels.tolist() == [0, 1, 2]
    for image, want in zip(images, pixels):
        np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), want)


# -- index files --------------------------------------------------------------------------------------

def test_index_used_when_present_and_built_when_not(shard, tmp_path):
    path, _ = shard
    with_index = TFRecordSource(path)
    os.rename(f"{path}.idx", tmp_path / "elsewhere.idx")
    scanned = TFRecordSource(path)
    assert [with_index.locate(i) for i in range(len(scanned))] == [scanned.locate(i) for i in range(len(scanned))]
    explicit = TFRecordSource(path, index=tmp_path / "elsewhere.idx")
    assert explicit.locate(5) == scanned.locate(5)
    assert not os.path.exists(f"{path}.idx")  # reading never writes an index
    assert tfrecord.write_index(str(path)) == f"{path}.idx"
    assert TFRecordSource(path, index=tmp_path).locate(3) == scanned.locate(3)  # a directory of index files


def test_index_that_disagrees_with_the_data(shard):
    path, _ = shard
    idx = Path(f"{path}.idx")
    lines = idx.read_text().splitlines()
    entries = [tuple(map(int, line.split())) for line in lines]
    (o0, s0), (o1, s1), (_, s2) = entries[:3]
    rest = "".join(f"{o} {s}\n" for o, s in entries[3:])
    idx.write_text(f"{o0} {s0}\n{o1} {s1 + s2}\n" + rest)  # tiles the file, but one entry is two records long
    src = TFRecordSource(path)
    with pytest.raises(CorruptRecordError, match=f"{path}.*at byte {o1}: .*index and data disagree"):
        src.parse(1, read_location(src.locate(1)))
    size = path.stat().st_size
    idx.write_text(f"{o0} {s0}\n{o1} {size}\n")  # past the end of the file
    with pytest.raises(CorruptRecordError, match=r"part-0.tfrecord.idx.*index line 2"):
        TFRecordSource(path)
    idx.write_text("0 x\n")
    with pytest.raises(CorruptRecordError, match="index line 1 .* is not 'offset size'"):
        TFRecordSource(path)


@pytest.mark.parametrize("edit", ["empty", "dropped", "repeated", "shifted", "swapped"])
def test_index_lines_must_tile_the_shard(shard, edit):
    """An index is checked against its shard when it is read: an empty one, a dropped, repeated, shifted or
    reordered line is named (file and entry), never a shard or record silently lost or read twice."""
    path, _ = shard
    idx = Path(f"{path}.idx")
    lines = idx.read_text().splitlines(keepends=True)
    edited = {"empty": [], "dropped": lines[:1] + lines[2:], "repeated": lines[:2] + lines[1:],
              "shifted": [lines[0], "%d %s" % (int(lines[1].split()[0]) + 3, lines[1].split()[1] + "\n")]
              + lines[2:], "swapped": [lines[1], lines[0]] + lines[2:]}[edit]
    idx.write_text("".join(edited))
    with pytest.raises(CorruptRecordError, match=r"part-0\.tfrecord\.idx.*(index entr|index lists|entries end)"):
        TFRecordSource(path)


def test_shard_lists_globs_and_directories(tmp_path):
    records = make_records(7)
    for k in range(3):
        write(tmp_path, records[k * 3:(k + 1) * 3], stem=f"part-{k}")
    for other in ("README.txt", "records.md", "part-3.tfrecord.tmp", ".part-4.tfrecord"):
        (tmp_path / other).write_bytes(b"not a shard")  # notes and partial writes are not shards
    by_dir = TFRecordSource(tmp_path)
    assert len(by_dir) == 7 and len(by_dir.shards) == 3
    assert len(TFRecordSource(str(tmp_path / "part-*.tfrecord"))) == 7
    assert len(TFRecordSource([tmp_path / "part-2.tfrecord", tmp_path / "part-0.tfrecord"])) == 4
    assert by_dir.labels().tolist() == [r.label for r in records]
    assert by_dir.name(6) == f"{tmp_path / 'part-2.tfrecord'}:0"
    check_format(by_dir)
    with pytest.raises(FileNotFoundError):
        TFRecordSource(tmp_path / "missing.tfrecord")
    with pytest.raises(SourceError, match="no TFRecord files match"):
        TFRecordSource(str(tmp_path / "nothing-*.tfrecord"))
    with pytest.raises(SourceError, match="3 shards"):
        TFRecordSource(tmp_path, index=tmp_path / "part-0.tfrecord.idx")


def test_empty_file_is_an_empty_source(tmp_path):
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    src = TFRecordSource(tmp_path / "empty.tfrecord")
    assert len(src) == 0 and src.fields == {}
    check_format(src)


# -- bad input ----------------------------------------------------------------------------------------

def test_truncated_file(shard):
    path, _ = shard
    os.remove(f"{path}.idx")
    last = int(tfrecord.scan(str(path))[-1, 0])
    data = path.read_bytes()
    for cut in (last + 5, last + 20, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(CorruptRecordError, match=f"{path} at byte {last}: (truncated|record length)"):
            TFRecordSource(path)


def test_flipped_bytes_fail_the_crcs(shard):
    path, records = shard
    data = bytearray(path.read_bytes())
    at = data.find(records[2].image) + 100
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    src = TFRecordSource(path)
    offset = src.locate(2).offset
    with pytest.raises(CorruptRecordError, match=f"at byte {offset}: bad data CRC"):
        src.parse(2, read_location(src.locate(2)))
    unchecked = TFRecordSource(path, check_crc=False)
    got = unchecked.parse(2, read_location(unchecked.locate(2)))
    assert got.image != records[2].image and len(got.image) == len(records[2].image)
    data[3] ^= 0x01  # the first record's length
    path.write_bytes(bytes(data))
    os.remove(f"{path}.idx")
    with pytest.raises(CorruptRecordError, match="at byte 0: bad length CRC"):
        TFRecordSource(path)


def test_huge_length_is_checked_against_the_file_size(tmp_path):
    path = tmp_path / "huge.tfrecord"
    path.write_bytes((2 ** 62).to_bytes(8, "little") + bytes(40))
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError, match="runs past the end of the file"):
            TFRecordSource(path, check_crc=False)
        assert tracemalloc.get_traced_memory()[1] < 10 * 2 ** 20
    finally:
        tracemalloc.stop()


def test_not_a_tfrecord(tmp_path):
    path = tmp_path / "photo.tfrecord"
    path.write_bytes(jpeg_bytes(16, 16))
    with pytest.raises(CorruptRecordError, match=f"{path} at byte 0"):
        TFRecordSource(path)
    (tmp_path / "junk.tfrecord").write_bytes(frame(b"\xff\xff\xff not a protobuf"))
    with pytest.raises(CorruptRecordError, match="not a tf.train.Example"):
        TFRecordSource(tmp_path / "junk.tfrecord")


def test_missing_and_mistyped_features_name_the_key(tmp_path):
    good = example_bytes(image__encoded=("bytes", [jpeg_bytes(8, 8)]), image__class__label=("int64", [1]))
    no_label = example_bytes(image__encoded=("bytes", [jpeg_bytes(8, 8)]))
    float_label = example_bytes(image__encoded=("bytes", [jpeg_bytes(8, 8)]), image__class__label=("float", [1.0]))
    path = tmp_path / "x.tfrecord"
    path.write_bytes(frame(good) + frame(no_label) + frame(float_label))
    src = TFRecordSource(path)
    assert src.fields == {"image": Field("image"), "label": Field("int")}
    assert src.parse(0, read_location(src.locate(0))).label == 1
    second, third = src.locate(1), src.locate(2)
    with pytest.raises(CorruptRecordError, match=f"sample 1.* at byte {second.offset}: feature 'image/class/label': "
                                                 "missing"):
        src.parse(1, read_location(second))
    with pytest.raises(CorruptRecordError, match=f"at byte {third.offset}: feature 'image/class/label': holds a "
                                                 "float_list, expected a int64_list"):
        src.parse(2, read_location(third))
    with pytest.raises(CorruptRecordError, match="missing"):
        src.labels()


# -- compressed ---------------------------------------------------------------------------------------

def test_gzip_shards_stream(tmp_path):
    records = make_records(5)
    assert write(tmp_path, records, compression="gzip") == ["part-0.tfrecord.gz"]
    src = TFRecordSource(tmp_path / "part-0.tfrecord.gz", features=writer_spec(FIELDS))
    assert src.streamed
    check_format(src)
    items = list(src.iter_shard(0, 0))
    assert [r.image for _, r in items] == [r.image for r in records]
    assert [n for n, _ in src.iter_shard(0, 3)] == [n for n, _ in items[3:]]
    with pytest.raises(SourceError, match="cannot be read at an offset"):
        src.locate(0)
    # deterministic bytes: no name or time in the gzip header
    (tmp_path / "again").mkdir()
    write(tmp_path / "again", records, compression="gzip")
    assert (tmp_path / "again" / "part-0.tfrecord.gz").read_bytes() == (tmp_path / "part-0.tfrecord.gz").read_bytes()


@pytest.mark.parametrize("codec", ["gzip", "zlib"])
def test_compression_detected_from_the_bytes(shard, tmp_path, codec):
    path, records = shard
    packed = gzip.compress(path.read_bytes()) if codec == "gzip" else zlib.compress(path.read_bytes())
    (tmp_path / "packed").mkdir()
    target = tmp_path / "packed" / "data.tfrecord"  # no .gz: the magic says it
    target.write_bytes(packed)
    src = TFRecordSource(target)
    assert src.streamed
    assert [r.label for _, r in src.iter_shard(0)] == [r.label for r in records]


def test_corrupt_gzip_streams(shard, tmp_path):
    path, records = shard
    packed = gzip.compress(path.read_bytes())
    bad = tmp_path / "bad.tfrecord.gz"
    bad.write_bytes(packed[:len(packed) // 2])
    src = TFRecordSource(bad)  # the first record is intact
    with pytest.raises(CorruptRecordError, match=f"{bad}.*decompressed stream"):
        list(src.iter_shard(0))
    # a corrupt length inside a stream (CRCs off) is read in bounded chunks, never allocated at once
    huge = tmp_path / "huge.tfrecord.gz"
    huge.write_bytes(gzip.compress((2 ** 40).to_bytes(8, "little") + bytes(4) + bytes(3000)))
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError, match="truncated record"):
            list(tfrecord.iter_stream(str(huge), check_crc=False))
        assert tracemalloc.get_traced_memory()[1] < 20 * 2 ** 20
    finally:
        tracemalloc.stop()


# -- files written by TensorFlow and TFX ------------------------------------------------------------------

@pytest.mark.realworld
def test_realworld_object_detection_record():
    path = realworld("tfrecord") / "test.record"
    # the OD API layout inferred; its one-value byte features read as bytes
    assert {"image", "boxes", "categories", "image/filename", "image/source_id"} == set(TFRecordSource(path).fields)
    keys = ["image/width", "image/height", "image/object/class/label"] + \
        [f"image/object/bbox/{k}" for k in ("xmin", "ymin", "xmax", "ymax")]
    src = TFRecordSource(path, features={"image": "image/encoded", **{k: k for k in keys}})   # the raw keys
    check_format(src)
    assert len(src) == 40
    for name, rec in iter_records(src):
        with Image.open(io.BytesIO(rec.image)) as im:
            assert im.format == "JPEG"
            assert im.size == (rec.fields["image/width"][0], rec.fields["image/height"][0]), name
        n = len(rec.fields["image/object/class/label"])
        assert n >= 1 and all(len(rec.fields[f"image/object/bbox/{k}"]) == n for k in ("xmin", "ymin", "xmax"))
        assert (rec.fields["image/object/bbox/xmin"] < rec.fields["image/object/bbox/xmax"]).all()
        assert ((rec.fields["image/object/bbox/ymax"] > 0) & (rec.fields["image/object/bbox/ymax"] <= 1)).all()


@pytest.mark.realworld
def test_realworld_tabular_and_sequence_examples():
    root = realworld("tfrecord")
    src = TFRecordSource(root / "example.tfrecord", features={"x_byte": "x_byte", "x_int": "x_int",
                                                              "x_float": "x_float"})
    check_format(src)
    assert "image" not in src.fields and src.labels().tolist() == [-1] * 4
    for r, (_, rec) in enumerate(iter_records(src)):
        assert rec.fields["x_byte"] == b"test str"
        assert rec.fields["x_int"].tolist() == [100 * r + 10 * k for k in range(10)]
        np.testing.assert_array_equal(rec.fields["x_float"], np.arange(10 * r, 10 * r + 10, dtype=np.float32))
    with pytest.raises(SourceError, match="SequenceExample.*sequence=True"):
        TFRecordSource(root / "sequence_example.tfrecord")
    seq = TFRecordSource(root / "sequence_example.tfrecord", sequence=True)
    assert set(seq.fields) == {"x_int", "x_float", "x_byte"}
    assert [rec.fields["x_int"][1] for _, rec in iter_records(seq)] == [10, 110, 210, 310]


@pytest.mark.realworld
def test_realworld_tfx_gzip_directory():
    src = TFRecordSource(realworld("tfrecord") / "tfx_penguin_gzip" / "Split-train")
    assert src.streamed and set(src.fields) == {"body_mass_g", "culmen_depth_mm", "culmen_length_mm",
                                                "flipper_length_mm", "species"}
    check_format(src)
    rows = [rec for _, rec in src.iter_shard(0)]
    assert len(rows) == 234
    assert {int(r.fields["species"][0]) for r in rows} == {0, 1, 2}
    assert all(0 <= r.fields["body_mass_g"][0] <= 1 for r in rows)  # TFX's testdata is min-max scaled


# -- end to end ---------------------------------------------------------------------------------------

def test_loader_end_to_end(tmp_path):
    records = make_records(10, size=(24, 32))
    write(tmp_path, records)
    loader = ingest.Loader(str(tmp_path / "part-0.tfrecord"), batch_size=4, device="cpu", output="dict")
    labels, boxes = [], []
    for batch in loader:
        assert tuple(batch["images"].shape[1:]) in ((24, 32, 3), (3, 24, 32))
        labels += batch["labels"].tolist()
        boxes += [row[:n].tolist() for row, n in zip(batch["boxes"], batch["boxes_lengths"])]
    assert labels == [r.label for r in records]
    assert boxes == [pytest.approx(r.fields["boxes"].tolist()) for r in records]


def test_loader_streams_gzip_shards(tmp_path):
    records = make_records(9, size=(24, 32))
    write(tmp_path, records[:5], stem="a", compression="gzip")
    write(tmp_path, records[5:], stem="b", compression="gzip")
    loader = ingest.Loader(str(tmp_path), batch_size=4, device="cpu", shuffle=True)
    labels = [label for _, batch in loader for label in batch.tolist()]
    assert sorted(labels) == sorted(r.label for r in records)


@pytest.mark.skipif(not (TF_PYTHON and os.path.exists(TF_PYTHON)), reason="no TensorFlow Python (INGEST_TF_PYTHON)")
def test_tensorflow_reads_what_the_writer_wrote(tmp_path):
    """dev/tf_crosscheck.py, run by TensorFlow's Python: TFRecordDataset + parse_single_example read our
    shards (plain and GZIP), and shards TF wrote (plain, GZIP, ZLIB) read here the same."""
    records = make_records(4)
    write(tmp_path, records)
    write(tmp_path, records, stem="gz", compression="gzip")
    script = Path(__file__).resolve().parents[1] / "dev" / "tf_crosscheck.py"
    try:
        out = subprocess.run([TF_PYTHON, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("TensorFlow did not start in time")
    if "No module named 'tensorflow'" in out.stderr:
        pytest.skip("TensorFlow is not installed in the TF venv")
    assert out.returncode == 0, out.stderr[-2000:]
    import json
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    for part in ("part-0.tfrecord", "gz.tfrecord.gz"):
        assert seen[part]["labels"] == [r.label for r in records]
        assert seen[part]["captions"] == [r.fields["caption"] for r in records]
        assert seen[part]["image_sizes"] == [list(Image.open(io.BytesIO(r.image)).size[::-1]) for r in records]
    for name in ("tf_written.tfrecord", "tf_written.tfrecord.gz", "tf_written_zlib.tfrecord"):
        tf_written = TFRecordSource(tmp_path / name, features=writer_spec(FIELDS))
        assert tf_written.streamed == (name != "tf_written.tfrecord")
        got_all = [rec for _, rec in iter_records(tf_written)]
        assert len(got_all) == len(records)
        for got, want in zip(got_all, records):
            assert got.image == want.image and got.label == want.label
            assert got.fields["caption"] == want.fields["caption"]
            np.testing.assert_array_equal(got.fields["boxes"], want.fields["boxes"])
            np.testing.assert_array_equal(got.fields["mask"], want.fields["mask"])
    shutil.rmtree(tmp_path)


def test_one_value_features_that_are_not_one_value(tmp_path):
    """Features read as one value (image, int) holding none, two or an empty image are typed errors."""
    image = jpeg_bytes(8, 8)
    rows = [example_bytes(image__encoded=("bytes", [image]), image__class__label=("int64", [0])),
            example_bytes(image__encoded=("bytes", [image]), image__class__label=("int64", [1, 2])),
            example_bytes(image__encoded=("bytes", [b""]), image__class__label=("int64", [3])),
            example_bytes(image__encoded=("bytes", [image, image]), image__class__label=("int64", [4])),
            example_bytes(image__encoded=("bytes", [image]), image__class__label=("int64", []))]
    path = tmp_path / "x.tfrecord"
    path.write_bytes(b"".join(frame(r) for r in rows))
    src = TFRecordSource(path)
    first = src.parse(0, np.frombuffer(read_location(src.locate(0)), np.uint8))
    assert first.image == image and first.label == 0
    for i, message in [(1, "'image/class/label': holds 2 values"), (2, "'image/encoded': empty image"),
                       (3, "'image/encoded': holds 2 values"), (4, "'image/class/label': holds 0 values")]:
        with pytest.raises(CorruptRecordError, match=f"sample {i}.*{message}"):
            src.parse(i, read_location(src.locate(i)))
