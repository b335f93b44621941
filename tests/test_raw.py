"""Raw tensor shards: writer/reader round trips, the batched read path on the CPU (posix preadv), dataset
layouts, and bad input (truncated shards, indexes that disagree with their files, mutated indexes)."""

from __future__ import annotations

import base64
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import jpeg_bytes, textured
from ingest.errors import ConfigError, CorruptRecordError, IngestError, SourceError
from ingest.formats import RAW_INDEX, Field, Record, check_format, detect, open_source
from ingest.formats.raw import RawSource, RawWriter, write_dataset_index
from ingest.io import ByteReader, plan_rows
from ingest.decode.cpu import CpuDecoder

PIXELS = {"image": Field("pixels", None, "uint8"), "label": Field("int")}


def write_shards(root: Path, images: list[np.ndarray], *, shards: int = 1, fields=None, align: int = 4096,
                 classes=("a", "b", "c"), extra=lambda i: {}) -> Path:
    """``images`` split over ``shards`` shards ``part-<k>``; labels i % 3; returns root."""
    root.mkdir(parents=True, exist_ok=True)
    per = -(-len(images) // shards)
    decode = CpuDecoder(threads=1).decode   # for encoded images
    for k in range(shards):
        with RawWriter(root, f"part-{k:03d}", fields or PIXELS, align=align, classes=classes, decode=decode) as w:
            for i in range(k * per, min(len(images), (k + 1) * per)):
                w.add(Record(images[i], i % 3, extra(i)))
    return root


def fixed_images(n: int, h: int = 16, w: int = 12, c: int = 3) -> list[np.ndarray]:
    return [textured(h, w, seed=i)[:, :, :c].copy() for i in range(n)]


def index_of(root: Path, k: int = 0) -> Path:
    return root / f"part-{k:03d}.raw.json"


def edit_index(path: Path, change) -> None:
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


def encode_array(a: np.ndarray) -> dict:
    return {"dtype": a.dtype.str, "shape": list(a.shape), "base64": base64.b64encode(a.tobytes()).decode()}


# -- round trips --------------------------------------------------------------------------------------


def test_fixed_shape_round_trip(tmp_path):
    images = fixed_images(11)
    root = write_shards(tmp_path / "ds", images, shards=3)
    src = RawSource(root)
    check_format(src)
    assert len(src) == 11 and src.classes == ["a", "b", "c"]
    assert src.fixed_shape == (16, 12, 3)
    assert src.fields["image"] == Field("pixels", (16, 12, 3), "uint8")
    assert src.labels().tolist() == [i % 3 for i in range(11)]
    for i in range(11):
        rec = src.parse(i, _read(src, i))
        assert np.array_equal(rec.image, images[i]) and rec.label == i % 3
        assert rec.image.flags.writeable
    # The fixed layout stores no per-sample offsets: sample i is at i * stride.
    meta = json.loads(index_of(root).read_text())
    assert meta["stride"] == 4096 and set(meta["arrays"]) == {"label", "image.crc32c"}
    assert os.path.getsize(root / "part-000.raw") % 4096 == 0


def _read(src: RawSource, i: int) -> bytes:
    loc = src.locate(i)
    with open(loc.path, "rb") as f:
        f.seek(loc.offset)
        return f.read(loc.length)


def test_dense_samples_have_no_padding(tmp_path):
    images = fixed_images(5, 32, 32, 4)  # 4096 bytes each
    src = RawSource(write_shards(tmp_path / "ds", images))
    assert [src.locate(i).offset for i in range(5)] == [4096 * i for i in range(5)]
    assert os.path.getsize(src.paths[0]) == 5 * 4096


def test_ragged_fields_round_trip(tmp_path):
    fields = {"label": Field("int"), "caption": Field("text"), "image": Field("pixels"),
              "blob": Field("bytes"), "boxes": Field("floats"), "tags": Field("ints"),
              "depth": Field("array", None, "float32"), "weight": Field("float"), "id": Field("int")}
    images = [textured(10 + i, 7 + 2 * i, seed=i) for i in range(6)]

    def extra(i):
        return {"caption": "ünïcode " * i, "blob": bytes(range(i * 3)), "boxes": [0.5 * i] * i,
                "tags": list(range(i)),
                "depth": np.full((i + 1, 2), i, np.float32), "weight": i / 4, "id": 10**12 + i}

    root = write_shards(tmp_path / "ds", images, shards=2, fields=fields, extra=extra)
    src = RawSource(root)
    check_format(src)
    assert src.fixed_shape is None and src.fields["image"] == Field("pixels", None, "uint8")
    assert src.fields["depth"] == Field("array", None, "float32")
    for i in range(6):
        rec = src.parse(i, _read(src, i))
        want = extra(i)
        assert np.array_equal(rec.image, images[i]) and rec.label == i % 3
        assert rec.fields["caption"] == want["caption"] and rec.fields["blob"] == want["blob"]
        assert rec.fields["boxes"].dtype == np.float32 and rec.fields["boxes"].tolist() == want["boxes"]
        assert rec.fields["tags"].dtype == np.int64 and rec.fields["tags"].tolist() == want["tags"]
        assert np.array_equal(rec.fields["depth"], want["depth"])
        assert rec.fields["weight"] == want["weight"] and rec.fields["id"] == want["id"]
        assert src.shape(i) == images[i].shape
    with pytest.raises(ConfigError, match="different shapes"):
        src.read_batch([0, 1], torch.empty(2, 1))


def test_fixed_array_field_reads_in_batches_beside_ragged_image(tmp_path):
    fields = {"image": Field("pixels"), "label": Field("int"), "emb": Field("array", (5,), "float64")}
    images = [textured(8 + i, 9, seed=i) for i in range(7)]
    embs = [np.arange(5) * 1.5 + i for i in range(7)]
    src = RawSource(write_shards(tmp_path / "ds", images, fields=fields, extra=lambda i: {"emb": embs[i]}))
    out = src.batch_buffer(4, field="emb")
    assert out.dtype == torch.float64 and out.shape == (4, 5)
    src.read_batch([6, 0, 3, 3], out, field="emb")
    assert np.array_equal(out.numpy(), np.stack([embs[6], embs[0], embs[3], embs[3]]))


def test_encoded_images_are_decoded_on_the_way_in(tmp_path):
    jpegs = [jpeg_bytes(20 + i, 30, seed=i) for i in range(3)]
    fields = {"image": Field("image"), "label": Field("int")}
    src = RawSource(write_shards(tmp_path / "ds", jpegs, fields=fields))
    assert src.fields["image"].kind == "pixels"
    decoder = CpuDecoder(threads=1)
    for i, data in enumerate(jpegs):
        assert np.array_equal(src.parse(i, _read(src, i)).image, decoder.decode(data, "x"))


def test_grayscale_pixels_without_labels(tmp_path):
    images = [textured(6, 5 + i, seed=i)[:, :, 0].copy() for i in range(3)]  # [H, W] -> [H, W, 1]
    with RawWriter(tmp_path, "g", {"image": Field("pixels")}) as w:
        for im in images:
            w.add(Record(im))
    src = RawSource(tmp_path)
    check_format(src)
    assert src.labels().tolist() == [-1, -1, -1] and src.classes == []
    for i, im in enumerate(images):
        rec = src.parse(i, _read(src, i))
        assert rec.image.shape == (*im.shape, 1) and np.array_equal(rec.image[:, :, 0], im) and rec.label == -1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_arrays_round_trip(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("arrays")
    dtype = data.draw(st.sampled_from(["bool", "uint8", "int16", "uint32", "int64", "float16", "float64"]))
    ndim = data.draw(st.integers(0, 3))
    shapes = st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim).map(tuple)
    fixed = data.draw(st.booleans())
    n = data.draw(st.integers(1, 6))
    shape_list = [data.draw(shapes)] * n if fixed else [data.draw(shapes) for _ in range(n)]
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    arrays = [(rng.standard_normal(s) * 100).astype(dtype) for s in shape_list]
    align = data.draw(st.sampled_from([1, 8, 4096]))
    with RawWriter(root, "a", {"x": Field("array")}, align=align) as w:
        for a in arrays:
            w.add(Record(None, -1, {"x": a}))
    src = RawSource(root)
    check_format(src)
    for i, a in enumerate(arrays):
        got = src.parse(i, _read(src, i)).fields["x"]
        assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)
    if len(set(shape_list)) == 1:
        out = src.read_batch(np.arange(n)[::-1], src.batch_buffer(n, field="x"), field="x")
        assert np.array_equal(out.numpy(), np.stack(arrays[::-1]))


def test_writer_is_deterministic(tmp_path):
    images = [textured(9, 5 + i, seed=i) for i in range(4)]
    a = write_shards(tmp_path / "a", images)
    b = write_shards(tmp_path / "b", images)
    for name in ("part-000.raw", "part-000.raw.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_parse_takes_the_batched_readers_arena_views(tmp_path):
    images = fixed_images(4)
    src = RawSource(write_shards(tmp_path / "ds", images))
    with ByteReader("posix") as reader:
        views = reader.read([src.locate(i) for i in range(4)])
    for i, view in enumerate(views):
        assert np.array_equal(src.parse(i, view).image, images[i])


# -- the batched read path (CPU: posix preadv) -------------------------------------------------------------


@pytest.mark.parametrize("align", [256, 4096])     # 16x16x3 = 768 bytes: back to back at 256, gaps at 4096
@pytest.mark.parametrize("order", ["sequential", "shuffled", "repeats", "negative"])
def test_read_batch_into_a_cpu_tensor(tmp_path, align, order, read_engine):
    images = fixed_images(40, 16, 16)
    src = RawSource(write_shards(tmp_path / "ds", images, shards=3, align=align))
    rng = np.random.default_rng(1)
    idx = {"sequential": np.arange(5, 37), "shuffled": rng.permutation(40)[:32],
           "repeats": rng.integers(0, 40, 32), "negative": -1 - np.arange(32)}[order]
    out = src.batch_buffer(len(idx))
    with ByteReader("posix", threads=3) as reader:
        assert src.read_batch(idx, out, reader) is out
    assert np.array_equal(out.numpy(), np.stack([images[i] for i in idx]))


def test_read_batch_default_reader_and_pickling(tmp_path):
    images = fixed_images(9)
    src = RawSource(write_shards(tmp_path / "ds", images, shards=2))
    out = src.read_batch([8, 2], src.batch_buffer(2))
    assert np.array_equal(out.numpy(), np.stack([images[8], images[2]]))
    clone = pickle.loads(pickle.dumps(src))  # open handles stay behind
    assert np.array_equal(clone.read_batch([4], clone.batch_buffer(1))[0].numpy(), images[4])
    src.close()
    clone.close()


def test_ranges_say_where_each_sample_is(tmp_path):
    src = RawSource(write_shards(tmp_path / "ds", fixed_images(7), shards=2))
    files, offsets = src.ranges([6, 0, -4])
    assert files.tolist() == [1, 0, 0] and offsets.tolist() == [4096 * 2, 0, 4096 * 3]
    for i, f, o in zip([6, 0, 3], files, offsets):
        assert (src.paths[f], o) == (src.locate(i).path, src.locate(i).offset)
    with pytest.raises(IndexError):
        src.ranges([7])


def test_read_batch_rejects_wrong_buffers_and_indices(tmp_path):
    src = RawSource(write_shards(tmp_path / "ds", fixed_images(4)))
    for bad in (torch.empty(3, 16, 12, 3, dtype=torch.uint8), torch.empty(2, 16, 12, 3, dtype=torch.float32),
                torch.empty(2, 12, 16, 3, dtype=torch.uint8), torch.empty(2, 16, 3, 12, dtype=torch.uint8)[..., :1]):
        with pytest.raises(ConfigError, match="`out` must be a contiguous"):
            src.read_batch([0, 1], bad)
    with pytest.raises(IndexError, match="out of range"):
        src.read_batch([0, 4], src.batch_buffer(2))
    with pytest.raises(ConfigError, match="Unknown stored field 'label'"):
        src.read_batch([0], src.batch_buffer(1), field="label")


class _FakeKvikIO:
    """Stands in for KvikIO (``CuFile(path).pread(buf, size, offset).get()``) so that the KvikIO branch of
    `ByteReader.read_rows` (direct reads, staging, spreading rows) runs on a machine without CUDA."""

    class CuFile:
        def __init__(self, path, mode):
            self.fd = os.open(path, os.O_RDONLY)

        def pread(self, buf, size, offset):
            got = os.preadv(self.fd, [memoryview(buf).cast("B")[:size]], offset)
            return type("Future", (), {"get": lambda _: got})()

        def close(self):
            os.close(self.fd)


@pytest.mark.parametrize("threshold", [0, 2000])   # every read through KvikIO; only those of 2000+ bytes
@pytest.mark.parametrize("layout", ["dense", "padded", "uneven"])
def test_kvikio_branch_of_read_rows(tmp_path, layout, threshold):
    fields = {"image": Field("pixels", (16, 16, 3), "uint8"), "label": Field("int"), "t": Field("text")}
    images = fixed_images(30, 16, 16)
    extra = (lambda i: {"t": "x" * (i * 37 % 300)}) if layout == "uneven" else (lambda i: {"t": ""})
    src = RawSource(write_shards(tmp_path / "ds", images, shards=2, fields=fields, extra=extra,
                                 align={"dense": 256, "padded": 4096, "uneven": 64}[layout]))
    idx = np.concatenate([np.arange(3, 20), np.random.default_rng(0).integers(0, 30, 10)])
    with ByteReader("posix") as reader:
        reader.path, reader._kvikio, reader._kvikio_min_read = "kvikio", _FakeKvikIO, threshold
        out = src.read_batch(idx, src.batch_buffer(len(idx)), reader)
    assert np.array_equal(out.numpy(), np.stack([images[i] for i in idx]))


@pytest.mark.parametrize("idx", [np.arange(30), np.arange(4, 26)])
def test_kvikio_reads_a_batch_in_order_from_the_native_plan(tmp_path, monkeypatch, idx):
    """A batch read in order (rows back to back in the shards and in the batch, across a shard boundary) goes
    to KvikIO as the native plan's tasks, one read each straight into its rows: numpy's plan is not made."""
    import ingest.io as ingest_io
    if ingest_io.NATIVE is None:
        pytest.skip("ingest._readv was not built")
    images = fixed_images(30, 16, 16)
    src = RawSource(write_shards(tmp_path / "ds", images, shards=2, align=256))
    reads = []

    class Counted(_FakeKvikIO.CuFile):
        def pread(self, buf, size, offset):
            reads.append((size, offset))
            return super().pread(buf, size, offset)

    monkeypatch.setattr(ingest_io, "plan_rows", lambda *a, **k: pytest.fail("the numpy plan was made"))
    with ByteReader("posix") as reader:
        reader.path, reader._kvikio, reader._kvikio_min_read = "kvikio", type("K", (), {"CuFile": Counted}), 0
        out = src.read_batch(idx, src.batch_buffer(len(idx)), reader)
    assert np.array_equal(out.numpy(), np.stack([images[i] for i in idx]))
    assert len(reads) == 2 and sum(size for size, _ in reads) == len(idx) * 16 * 16 * 3   # one read per shard


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60)), min_size=1, max_size=40),
       st.integers(1, 48), st.integers(0, 64), st.integers(1, 300))
def test_plan_rows_covers_every_row_once(rows, row, gap, chunk):
    files = np.array([f for f, _ in rows])
    offsets = np.array([o * 7 for _, o in rows])
    plan = plan_rows(files, offsets, row, gap=gap, chunk=chunk)
    runs = plan.runs(range(len(plan.nbytes)))
    assert sorted(np.concatenate([r.rows for r in runs]).tolist()) == list(range(len(rows)))
    for r in runs:
        assert (files[r.rows] == r.file).all() and (offsets[r.rows] == r.offset + r.starts).all()
        assert r.starts[0] == 0 and (np.diff(r.starts) >= row).all() and (np.diff(r.starts) <= row + gap).all()
        assert r.nbytes == r.starts[-1] + row and (len(r.rows) == 1 or r.nbytes <= max(chunk, row) + row)
        assert r.dense == (len(r.rows) == 1 or (np.diff(r.starts) == row).all() and (np.diff(r.rows) == 1).all())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_read_rows_equals_plain_reads(tmp_path_factory, read_engine, data):
    root = tmp_path_factory.mktemp("rows")
    blobs = [np.random.default_rng(k).integers(0, 256, 3000, dtype=np.uint8) for k in range(2)]
    paths = []
    for k, blob in enumerate(blobs):
        paths.append(str(root / f"f{k}"))
        blob.tofile(paths[-1])
    row = data.draw(st.integers(1, 100))
    n = data.draw(st.integers(1, 30))
    files = np.array(data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    offsets = np.array(data.draw(st.lists(st.integers(0, 3000 - row), min_size=n, max_size=n)))
    out = torch.empty(n, row, dtype=torch.uint8)
    with ByteReader("posix", threads=data.draw(st.integers(1, 4))) as reader:
        reader.read_rows(paths, files, offsets, out)
    want = np.stack([blobs[f][o:o + row] for f, o in zip(files, offsets)])
    assert np.array_equal(out.numpy(), want)


# -- datasets: paths, indexes, detection ------------------------------------------------------------------


def test_dataset_paths(tmp_path):
    images = fixed_images(9)
    root = write_shards(tmp_path / "ds", images, shards=3)
    # The dataset index decides the order; without it shards are taken in name order.
    write_dataset_index(root, ["part-002.raw.json", "part-000.raw", "part-001.raw.json"], classes=["x", "y", "z"])
    src = RawSource(root)
    assert src.classes == ["x", "y", "z"]
    assert [src.parse(i, _read(src, i)).image.tobytes() for i in range(3)] == [images[i].tobytes() for i in (6, 7, 8)]
    assert detect(root) == "raw" and detect(root / RAW_INDEX) == "raw"
    assert len(open_source(root / RAW_INDEX)) == 9
    os.remove(root / RAW_INDEX)
    assert detect(root) == "raw" and detect(root / "part-000.raw") == "raw"
    assert len(RawSource(root)) == 9 and RawSource(root).name(0) == f"{root / 'part-000.raw'}:0"
    one = RawSource(root / "part-001.raw")
    assert len(one) == 3 and np.array_equal(one.read_batch([0], one.batch_buffer(1))[0].numpy(), images[3])
    both = RawSource([root / "part-001.raw.json", root / "part-000.raw"])
    assert both.labels().tolist() == [0, 1, 2, 0, 1, 2]
    # The converter's manifest names the shards in order.
    (root / "manifest.json").write_text(json.dumps({"format": "raw", "shards": [
        {"stem": "part-001", "start": 3, "stop": 6, "count": 3, "bytes": 0, "files": []}]}))
    assert detect(root) == "raw" and len(RawSource(root)) == 3


def test_missing_and_unknown_paths(tmp_path):
    with pytest.raises(FileNotFoundError):
        RawSource(tmp_path / "nope.raw")
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(SourceError, match="not a raw shard"):
        RawSource(tmp_path / "x.bin")
    with pytest.raises(SourceError, match="no raw shards"):
        RawSource(tmp_path)


def test_empty_shards(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    RawWriter(root, "a-0", PIXELS).close()
    write_shards(root, fixed_images(2))
    src = RawSource(root)
    assert len(src) == 2 and src.fixed_shape == (16, 12, 3)
    check_format(src)


# -- bad input ------------------------------------------------------------------------------------------


def test_truncated_shard_names_file_sample_and_offset(tmp_path):
    root = write_shards(tmp_path / "ds", fixed_images(6))
    data = root / "part-000.raw"
    os.truncate(data, 4096 * 4 + 100)  # samples 4 and 5 are gone (sample 4 partly)
    with pytest.raises(CorruptRecordError, match="ends past the end of the file") as err:
        RawSource(root)
    assert err.value.path == str(data) and err.value.index == 4 and err.value.offset == 4 * 4096
    assert "part-000.raw [sample 4] at byte 16384" in str(err.value)


def test_ragged_index_past_the_end_names_the_sample(tmp_path):
    images = [textured(8, 8 + i, seed=i) for i in range(5)]
    root = write_shards(tmp_path / "ds", images, shards=2)
    size = os.path.getsize(root / "part-001.raw")

    def push(meta):
        off = np.frombuffer(base64.b64decode(meta["arrays"]["image.offset"]["base64"]),
                            meta["arrays"]["image.offset"]["dtype"]).astype(np.int64)
        off[1] = size  # shard sample 1 = dataset sample 4
        meta["arrays"]["image.offset"] = encode_array(off)
    edit_index(index_of(root, 1), push)
    with pytest.raises(CorruptRecordError) as err:
        RawSource(root)
    assert err.value.path == str(root / "part-001.raw") and err.value.index == 4 and err.value.offset == size


def test_file_longer_than_its_index_says(tmp_path):
    root = write_shards(tmp_path / "ds", fixed_images(2))
    with open(root / "part-000.raw", "ab") as f:
        f.write(b"\0" * 4096)
    with pytest.raises(CorruptRecordError, match="index says 8192"):
        RawSource(root)


def test_shard_shrunk_after_opening(tmp_path, read_engine):
    root = write_shards(tmp_path / "ds", fixed_images(6))
    src = RawSource(root)
    os.truncate(root / "part-000.raw", 4096 * 3)
    with pytest.raises(CorruptRecordError, match="short read") as err:
        src.read_batch([5], src.batch_buffer(1), ByteReader("posix"))
    assert err.value.path == str(root / "part-000.raw") and err.value.offset == 5 * 4096
    with pytest.raises(CorruptRecordError, match=r"expected 576 bytes, got 100") as err:
        src.parse(5, b"\0" * 100)
    assert err.value.index == 5


BAD_INDEXES = {
    "not json": (lambda m: None, "not valid JSON"),
    "format": (lambda m: m.update(format="other"), "not a raw shard index"),
    "version": (lambda m: m.update(version=2), "version 2 is not supported"),
    "dtype": (lambda m: m["fields"][0].update(dtype="float128x"), "'image' has dtype 'float128x'"),
    "pixel dtype": (lambda m: m["fields"][0].update(dtype="int16"), "a pixels field holds uint8"),
    "kind": (lambda m: m["fields"][0].update(kind="jpeg"), "has kind 'jpeg'"),
    "list kind": (lambda m: m["fields"][1].update(kind=["int"]), "has kind"),
    "count": (lambda m: m.update(count=10**15), "ends past the end"),
    "huge shape": (lambda m: m["fields"][0].update(shape=[2**40, 2**40, 3]), "ends past the end"),
    "stride": (lambda m: m.update(stride=4000), "multiples of `align`"),
    "align": (lambda m: m.update(align=3000), "power of two"),
    "labels": (lambda m: m["arrays"].update(label=encode_array(np.array([0, 7], np.int8))), "label 7 is outside"),
    "label count": (lambda m: m["arrays"].update(label=encode_array(np.array([0], np.int8))), "must be \\[2\\]"),
    "base64": (lambda m: m["arrays"]["label"].update(base64="!!"), "not valid base64"),
    "big-endian": (lambda m: m["arrays"].update(label=encode_array(np.array([0, 1], ">i4"))), "little-endian"),
    "classes": (lambda m: m.update(classes="abc"), "`classes` must be a list"),
}


@pytest.mark.parametrize("case", sorted(BAD_INDEXES))
def test_bad_index_gives_a_typed_error_naming_the_file(tmp_path, case):
    root = write_shards(tmp_path / "ds", fixed_images(2))
    change, message = BAD_INDEXES[case]
    if case == "not json":
        index_of(root).write_text("{\"format\": ")
    else:
        edit_index(index_of(root), change)
    with pytest.raises(CorruptRecordError, match=message) as err:
        RawSource(root)
    assert "part-000.raw" in err.value.path


def test_ragged_shape_larger_than_the_file(tmp_path):
    root = write_shards(tmp_path / "ds", [textured(8, 8 + i, seed=i) for i in range(3)])

    def grow(meta):
        meta["arrays"]["image.shape"] = encode_array(np.array([[8, 8, 3], [2**40, 2**40, 3], [8, 10, 3]]))
    edit_index(index_of(root), grow)
    with pytest.raises(CorruptRecordError, match="more than the file holds") as err:
        RawSource(root)
    assert err.value.index == 1 and err.value.offset == 4096


def test_text_that_is_not_utf8(tmp_path):
    with RawWriter(tmp_path, "t", {"image": Field("pixels"), "t": Field("text")}) as w:
        w.add(Record(textured(4, 4), -1, {"t": "é"}))
    src = RawSource(tmp_path)
    raw = bytearray(_read(src, 0))
    raw[64] = 0xFF  # the caption follows the 48 pixel bytes at the next 64-byte boundary
    with pytest.raises(CorruptRecordError, match="'t' is not UTF-8") as err:
        src.parse(0, bytes(raw))
    assert err.value.offset == 64


def test_misaligned_ragged_offsets(tmp_path):
    root = write_shards(tmp_path / "ds", [textured(8, 8 + i, seed=i) for i in range(3)])

    def shift(meta):
        meta["arrays"]["image.offset"] = encode_array(np.array([0, 4096, 4100]))
    edit_index(index_of(root), shift)
    with pytest.raises(CorruptRecordError, match="not a multiple of `align` 4096") as err:
        RawSource(root)
    assert err.value.index == 2 and err.value.offset == 4100


def test_dataset_index_cannot_escape_its_directory(tmp_path):
    root = write_shards(tmp_path / "ds", fixed_images(2))
    write_dataset_index(root, ["../elsewhere.raw.json"])
    with pytest.raises(CorruptRecordError, match="outside the dataset directory"):
        RawSource(root)


def test_shards_with_different_fields(tmp_path):
    root = write_shards(tmp_path / "ds", fixed_images(2))
    with RawWriter(root, "part-009", {"image": Field("pixels"), "label": Field("int"), "x": Field("float")}) as w:
        w.add(Record(fixed_images(1)[0], 0, {"x": 1.0}))
    with pytest.raises(SourceError, match="one dataset needs one set of fields"):
        RawSource(root)


def test_shards_with_different_classes(tmp_path):
    root = write_shards(tmp_path / "ds", fixed_images(2), classes=["a", "b", "c"])
    write_shards(tmp_path / "ds2", fixed_images(2), classes=["c", "b", "a"])
    os.rename(tmp_path / "ds2" / "part-000.raw", root / "part-001.raw")
    os.rename(tmp_path / "ds2" / "part-000.raw.json", root / "part-001.raw.json")
    with pytest.raises(SourceError, match="name different classes"):
        RawSource(root)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mutated_index_opens_or_raises_a_typed_error(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("mut")
    fields = {"image": Field("pixels"), "label": Field("int"), "t": Field("text")}
    write_shards(root, [textured(4, 3 + i, seed=i) for i in range(3)], fields=fields,
                 extra=lambda i: {"t": "x" * i})
    path = index_of(root)
    raw = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.sampled_from(b'0123456789-[]{}",:.e ntfalsrue'))
    path.write_bytes(bytes(raw))
    try:
        src = RawSource(root)
    except IngestError:
        return
    for i in range(len(src)):  # what opens reads within its file
        try:
            src.parse(i, _read(src, i))
        except CorruptRecordError:
            pass


def test_writer_rejects_bad_samples_and_keeps_the_shard_consistent(tmp_path):
    fields = {"image": Field("pixels", (4, 4, 3)), "label": Field("int"), "v": Field("array"), "t": Field("text")}
    w = RawWriter(tmp_path, "s", fields)
    good = np.zeros((4, 4, 3), np.uint8)
    w.add(Record(good, 1, {"v": np.arange(3, dtype=np.int16), "t": "ok"}))
    bad = [
        (Record(good.astype(np.float32), 0, {"v": np.zeros(3, np.int16), "t": ""}),
         "dtype float32, but the field holds uint8"),
        (Record(np.zeros((4, 5, 3), np.uint8), 0, {"v": np.zeros(3, np.int16), "t": ""}), "declared \\(4, 4, 3\\)"),
        (Record(good, 0, {"v": np.zeros((3, 1), np.int16), "t": ""}), "2 dims, but earlier samples have 1"),
        (Record(good, 0, {"v": np.zeros(3, np.int32), "t": ""}), "dtype int32, but the field holds int16"),
        (Record(good, 0, {"v": np.zeros(3, np.complex64), "t": ""}), "cannot be stored raw"),
        (Record(good, 0, {"v": np.zeros(3, np.int16)}), "'t': missing"),
        (Record(good, 0, {"v": np.zeros(3, np.int16), "t": b"x"}), "needs a str"),
        (Record(good, -2, {"v": np.zeros(3, np.int16), "t": ""}), "label must be >= -1"),
    ]
    for record, message in bad:
        with pytest.raises(CorruptRecordError, match=message) as err:
            w.add(record)
        assert err.value.path == str(tmp_path / "s.raw") and err.value.index == 1
    w.add(Record(good + 7, 2, {"v": np.arange(4, dtype=np.int16), "t": "end"}))
    w.close()
    src = RawSource(tmp_path / "s.raw")
    assert len(src) == 2 and src.labels().tolist() == [1, 2]
    assert src.parse(1, _read(src, 1)).fields["v"].tolist() == [0, 1, 2, 3]


def test_writer_options_are_checked(tmp_path):
    for align in (0, 3, 1 << 21, True, "4096"):
        with pytest.raises(ConfigError, match="`align` must be a power of two"):
            RawWriter(tmp_path, "s", PIXELS, align=align)
    with pytest.raises(ConfigError, match="needs at least one field stored"):
        RawWriter(tmp_path, "s", {"label": Field("int")})
    with pytest.raises(ConfigError, match="dtype 'complex64' cannot be stored"):
        RawWriter(tmp_path, "s", {"x": Field("array", None, "complex64")})


def test_raw_loader_reads_into_the_batch_tensors_the_ops_handed_back(tmp_path, monkeypatch):
    """Direct reads reuse the batch tensors whose ops wrote their output elsewhere (`ReadStage._direct_buffer`):
    over three epochs no more tensors are made than the pipeline holds at once, and the batches are those of a
    loader that makes a new tensor per batch."""
    import ingest
    from ingest.ops import Flip, Normalize, RandomResizedCrop
    from ingest.engine.read import ReadStage
    images = fixed_images(48, 20, 20)
    root = write_shards(tmp_path / "ds", images, shards=2)
    ops = [RandomResizedCrop(12), Flip(), Normalize([120.0] * 3, [60.0] * 3)]

    def epochs(loader):
        try:
            return [(x.clone(), y) for _ in range(3) for x, y in loader]
        finally:
            loader.close()
    made = []
    real = RawSource.batch_buffer
    monkeypatch.setattr(RawSource, "batch_buffer", lambda self, n, *a, **k: made.append(n) or real(self, n, *a, **k))
    kw = dict(batch_size=10, ops=ops, shuffle=True, num_workers=0, last_batch="partial")  # 10, 10, 10, 10, 8
    got = epochs(ingest.Loader(str(root), **kw))
    assert [len(x) for x, _ in got] == [10, 10, 10, 10, 8] * 3 and len(made) <= 9, made
    assert made == [10] * len(made), made   # a smaller batch reads into the first rows of a full one
    monkeypatch.setattr(ReadStage, "_direct_buffer", lambda self, n: real(self.source, n, self.device))
    want = epochs(ingest.Loader(str(root), **kw))
    for (x, y), (xw, yw) in zip(got, want):
        assert torch.equal(x, xw) and torch.equal(y, yw)


def test_raw_loader_plans_a_large_batch_in_slices(tmp_path, monkeypatch):
    """A direct-read batch of more than `planner.SLICE` samples is planned and run in slices (numpy gives the GIL
    up on more than 500 items), and each sample comes out as it does from batches under the limit."""
    import ingest
    from ingest.ops import Flip, Normalize, RandomResizedCrop, planner
    monkeypatch.setattr(planner, "SLICE", 8)
    root = write_shards(tmp_path / "ds", fixed_images(40, 20, 20), shards=2)
    ops = [RandomResizedCrop(12), Flip(), Normalize([120.0] * 3, [60.0] * 3)]
    slices = []
    execute = planner.Sliced.execute
    monkeypatch.setattr(planner.Sliced, "execute", lambda self, *a, **k: slices.append(self.bounds) or
                        execute(self, *a, **k))

    def run(batch_size):
        loader = ingest.Loader(str(root), batch_size=batch_size, ops=ops, seed=2, num_workers=0)
        try:
            batches = list(loader)
        finally:
            loader.close()
        return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])
    big = run(20)
    # two batches an epoch (the pipeline may already have run the next epoch's first)
    assert len(slices) >= 2 and all(b == [(0, 6), (6, 13), (13, 20)] for b in slices), slices
    small = run(5)
    assert torch.equal(big[0], small[0]) and torch.equal(big[1], small[1])
