"""Samples as named fields: collation by kind through the Loader, sources without images, decoded-pixel
sources, streamed sources (shuffle buffer, sharding, resume) and picking the format from a path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision

import ingest
from ingest.engine.collate import collate
from ingest.errors import ConfigError, SourceError
from ingest.formats import Field, Location, Record, check_format, detect
from ingest.formats.base import check_index

from conftest import jpeg_bytes, textured


class Rich:
    """A seekable in-memory source with one field of every kind."""

    classes = ["a", "b", "c"]
    fields = {"image": Field("image"), "label": Field("int"), "score": Field("float"),
              "tags": Field("ints"), "coords": Field("floats", shape=(2,)), "caption": Field("text"),
              "blob": Field("bytes"), "points": Field("array", dtype="float32"), "thumb": Field("image")}

    def __init__(self, n: int = 10):
        self.n = n
        self.images = [jpeg_bytes(20 + i, 30 + 2 * i, seed=i) for i in range(n)]
        self.thumbs = [jpeg_bytes(8, 8, seed=100 + i) for i in range(n)]

    def __len__(self):
        return self.n

    def locate(self, i):
        i = check_index(i, self.n)
        return (Location(f"img{i}", data=self.images[i]), Location(f"thumb{i}", data=self.thumbs[i]))

    def parse(self, i, raw):
        image, thumb = raw
        return Record(bytes(image), i % 3, {
            "score": i / 2, "tags": list(range(i % 4)), "coords": [i, -i], "caption": f"sample {i}",
            "blob": bytes([i]), "points": np.full((i % 3, 4), i, dtype=np.float32), "thumb": bytes(thumb)})

    def labels(self):
        return np.arange(self.n, dtype=np.int64) % 3

    def name(self, i):
        return f"rich:{i}"


def test_rich_source_conforms():
    check_format(Rich())


def test_every_kind_is_collated():
    loader = ingest.Loader(Rich(), batch_size=4, output="dict", ops=[ingest.ops.Resize((16, 16))])
    batch = next(iter(loader))
    assert batch["images"].shape == (4, 3, 16, 16)
    assert batch["labels"].tolist() == [0, 1, 2, 0]
    assert batch["score"].dtype == torch.float32 and batch["score"].tolist() == [0, 0.5, 1, 1.5]
    assert batch["tags"].tolist() == [[-1, -1, -1], [0, -1, -1], [0, 1, -1], [0, 1, 2]]
    assert batch["tags_lengths"].tolist() == [0, 1, 2, 3]
    assert batch["coords"].tolist() == [[0, 0], [1, -1], [2, -2], [3, -3]] and "coords_lengths" not in batch
    assert batch["caption"] == ["sample 0", "sample 1", "sample 2", "sample 3"]
    assert batch["blob"] == [b"\x00", b"\x01", b"\x02", b"\x03"]
    assert batch["points"].shape == (4, 2, 4) and batch["points_lengths"].tolist() == [0, 1, 2, 0]
    assert torch.equal(batch["points"][2], torch.full((2, 4), 2.0))
    assert batch["thumb"].shape == (4, 8, 8, 3) and batch["thumb"].dtype == torch.uint8
    assert batch["indices"].tolist() == [0, 1, 2, 3]


def test_collate_lists_arrays_that_differ_beyond_dim_0_and_rejects_others_with_typed_error():
    # nothing to pad to (COCO's [K, H, W] masks of images of different sizes): one tensor per sample
    out = collate("points", Field("array"), [np.zeros((2, 4)), np.ones((1, 5))], decode=None, names=["a", "b"])
    assert [tuple(t.shape) for t in out["points"]] == [(2, 4), (1, 5)] and out["points_lengths"].tolist() == [2, 1]
    with pytest.raises(ingest.CorruptRecordError, match="points"):
        collate("points", Field("array"), [np.zeros(2), object()], decode=None, names=["a", "b"])


class Tabular:
    """A source without images (like TFX's tabular Examples)."""

    classes: list = []
    fields = {"label": Field("int"), "x": Field("floats", shape=(3,))}

    def __len__(self):
        return 5

    def locate(self, i):
        return Location(f"row{check_index(i, 5)}", data=b"\x01")

    def parse(self, i, raw):
        return Record(None, i, {"x": [i, i, i]})

    def labels(self):
        return np.arange(5, dtype=np.int64)

    def name(self, i):
        return f"row{i}"


def test_source_without_images():
    check_format(Tabular())
    with pytest.raises(ConfigError, match="no image field"):
        ingest.Loader(Tabular(), batch_size=2)
    batches = list(ingest.Loader(Tabular(), batch_size=2, output="dict"))
    assert [b["labels"].tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    assert batches[0]["images"] is None and batches[1]["x"].tolist() == [[2, 2, 2], [3, 3, 3]]


class Pixels:
    """Decoded pixels (raw Caffe Datums, raw shards): no decode, straight to the ops."""

    classes: list = []
    fields = {"image": Field("pixels", dtype="uint8"), "label": Field("int")}

    def __init__(self):
        self.arrays = [textured(10 + i, 12, seed=i) for i in range(4)]

    def __len__(self):
        return 4

    def locate(self, i):
        return Location(f"px{check_index(i, 4)}", data=b"\x00")

    def parse(self, i, raw):
        return Record(self.arrays[i], i)

    def labels(self):
        return np.arange(4, dtype=np.int64)

    def name(self, i):
        return f"px{i}"


def test_pixel_sources_skip_decode():
    loader = ingest.Loader(Pixels(), batch_size=4, output="dict", ragged=True)
    batch = next(iter(loader))
    assert isinstance(batch["images"], list)  # ragged sizes stay a list, each image CHW as in a stacked batch
    for i, im in enumerate(batch["images"]):
        assert torch.equal(im, torch.from_numpy(Pixels().arrays[i]).permute(2, 0, 1))
    paths = loader.stats()["decode_paths"]   # counts what ran, the next epoch's read-ahead included
    assert set(paths) == {"none (pixels)"} and paths["none (pixels)"] >= 4
    fixed = next(iter(ingest.Loader(Pixels(), batch_size=4, ops=[ingest.ops.CenterCrop(8)])))[0]
    want = torchvision.transforms.functional.center_crop(torch.from_numpy(Pixels().arrays[1]).permute(2, 0, 1), 8)
    assert torch.equal(fixed[1], want)


class Gz:
    """A streamed source: shards read front to back only."""

    streamed = True
    classes = ["x", "y"]
    fields = {"image": Field("image"), "label": Field("int")}

    def __init__(self, sizes=(7, 5, 9)):
        self.shards = [f"shard{k}.gz" for k in range(len(sizes))]
        self.sizes = sizes
        self.images = {(k, j): jpeg_bytes(16, 16, seed=k * 100 + j) for k, n in enumerate(sizes) for j in range(n)}
        self.reads = 0

    def iter_shard(self, k, skip=0):
        self.reads += 1
        for j in range(skip, self.sizes[k]):
            yield f"shard{k}.gz#{j}", Record(self.images[k, j], (k + j) % 2)


def _indices(loader):
    return [b["indices"].tolist() for b in loader]


def test_streamed_source_conforms_and_loads_in_order():
    check_format(Gz())
    loader = ingest.Loader(Gz(), batch_size=4, output="dict")
    assert len(loader) == 6
    batches = list(loader)
    assert sum((b["indices"].tolist() for b in batches), []) == list(range(21))
    assert batches[2]["labels"].tolist() == [(k + j) % 2 for k, j in [(1, 1), (1, 2), (1, 3), (1, 4)]]


def test_streamed_shuffle_is_a_seeded_permutation_per_epoch():
    a = ingest.Loader(Gz(), batch_size=5, output="dict", shuffle=True, seed=3, shuffle_buffer=4)
    b = ingest.Loader(Gz(), batch_size=5, output="dict", shuffle=True, seed=3, shuffle_buffer=4)
    e0, e1 = sum(_indices(a), []), sum(_indices(a), [])
    assert sorted(e0) == list(range(21)) and sorted(e1) == list(range(21))
    assert e0 != list(range(21)) and e0 != e1
    assert sum(_indices(b), []) == e0


def test_streamed_epochs_run_on():
    """The read stage goes on into a streamed source's next epoch (shards reopened, shuffle buffer refilled)
    while the last one drains; the next iter() takes it over: the same batches as a fresh loader's epoch."""
    import gc
    import threading
    gc.collect()   # earlier tests' loaders held in reference cycles, and their threads
    kw = dict(batch_size=5, output="dict", shuffle=True, seed=3, shuffle_buffer=4)
    loader = ingest.Loader(Gz(), **kw)
    _indices(loader)
    reader = [t for t in threading.enumerate() if t.name == "ingest-read"]
    assert len(reader) == 1
    fresh = ingest.Loader(Gz(), **kw)
    fresh.set_epoch(1)
    assert _indices(loader) == _indices(fresh)
    assert [t for t in threading.enumerate() if t.name == "ingest-read" and t in reader] == reader   # the same one
    loader.close(), fresh.close()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_streamed_shards_cover_the_epoch_with_equal_batch_counts(world):
    loaders = [ingest.Loader(Gz(), batch_size=3, output="dict", shuffle=True, seed=1, shard_id=r,
                             num_shards=world, shuffle_buffer=6) for r in range(world)]
    batches = [list(loader) for loader in loaders]
    assert len({len(b) for b in batches}) == 1 and len(batches[0]) == len(loaders[0])
    real = sorted(i for rank in batches for b in rank for i, pad in zip(b["indices"].tolist(), b["is_pad"].tolist())
                  if not pad)
    assert real == list(range(21))


def test_streamed_resume_is_exact():
    full = ingest.Loader(Gz(), batch_size=4, output="dict", shuffle=True, seed=5, shuffle_buffer=5)
    want = _indices(full)
    first = ingest.Loader(Gz(), batch_size=4, output="dict", shuffle=True, seed=5, shuffle_buffer=5)
    it = iter(first)
    got = [next(it)["indices"].tolist() for _ in range(2)]
    state = first.state_dict()
    resumed = ingest.Loader(Gz(), batch_size=4, output="dict", shuffle=True, seed=5, shuffle_buffer=5)
    resumed.load_state_dict(state)
    assert got + _indices(resumed) == want


def test_streamed_sources_refuse_workers_quietly_and_bad_buffer():
    assert ingest.Loader(Gz(), batch_size=4, num_workers=2).num_workers == 0
    with pytest.raises(ConfigError, match="shuffle_buffer"):
        ingest.Loader(Gz(), batch_size=4, shuffle_buffer=0)


def test_format_is_detected_from_the_path(image_folder, tmp_path):
    assert detect(image_folder) == "filetree"
    for name, fmt in [("a.tfrecord", "tfrecord"), ("a.record.gz", "tfrecord"), ("b.rec", "recordio"),
                      ("c.tar", "wds"), ("c.tgz", "wds"), ("instances_val.json", "coco")]:
        (tmp_path / name).write_bytes(b"")
        assert detect(tmp_path / name) == fmt
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "data.mdb").write_bytes(b"")
    assert detect(tmp_path / "db") == "lmdb"
    shards = tmp_path / "shards"
    shards.mkdir()
    for k in range(2):
        (shards / f"part-{k}.tfrecord").write_bytes(b"")
    assert detect(shards) == "tfrecord"
    assert detect(str(shards / "part-*.tfrecord")) == "tfrecord"
    (tmp_path / "notes.txt").write_bytes(b"")
    with pytest.raises(SourceError, match="format="):
        detect(tmp_path / "notes.txt")
    with pytest.raises(FileNotFoundError):
        detect(tmp_path / "missing.tfrecord")


def test_unknown_format_names_the_valid_ones(image_folder):
    with pytest.raises(ConfigError, match="Available: .*lmdb.*tfrecord"):
        ingest.Loader(image_folder, batch_size=2, format="tfrec")
    with pytest.raises(ConfigError, match="apply when `source` is a path"):
        ingest.Loader([jpeg_bytes(8, 8)], batch_size=1, format="filetree")
    images, labels = next(iter(ingest.Loader(image_folder, batch_size=3, format="filetree", ragged=True)))
    assert labels.tolist() == [0, 0, 0]


def _raw_dataset(root, n=10, shape=(24, 20, 3)):
    from ingest.formats.raw import RawWriter, write_dataset_index
    root.mkdir()
    arrays = [textured(*shape[:2], seed=i) for i in range(n)]
    fields = {"image": Field("pixels", shape=shape, dtype="uint8"), "label": Field("int")}
    for k, part in enumerate((range(0, n // 2), range(n // 2, n))):
        w = RawWriter(root, f"part-{k}", fields, classes=["a", "b", "c"])
        for i in part:
            w.add(Record(arrays[i], i % 3))
        w.close()
    write_dataset_index(root)
    return arrays


def test_raw_shards_are_read_directly_into_the_batch(tmp_path):
    arrays = _raw_dataset(tmp_path / "raw")
    loader = ingest.Loader(tmp_path / "raw", batch_size=4, output="dict", shuffle=True, seed=2)
    batches = list(loader)
    paths = loader.stats()["decode_paths"]   # counts what ran, the next epoch's read-ahead included
    assert set(paths) == {"none (raw, direct read)"} and paths["none (raw, direct read)"] >= 10
    seen = []
    for b in batches:
        for image, label, i in zip(b["images"], b["labels"].tolist(), b["indices"].tolist()):
            assert torch.equal(image.permute(1, 2, 0), torch.from_numpy(arrays[i])) and label == i % 3
            seen.append(i)
    assert sorted(seen) == list(range(10)) and seen != list(range(10))


def test_raw_direct_path_draws_what_the_parsed_path_draws(tmp_path):
    """The same per-sample augmentation whether pixels come straight from the shard or through parse."""
    arrays = _raw_dataset(tmp_path / "raw")
    ops = [ingest.ops.RandomResizedCrop(12), ingest.ops.Flip(p=0.5)]
    direct = list(ingest.Loader(tmp_path / "raw", batch_size=5, ops=ops, shuffle=True, seed=9))
    parsed = list(ingest.Loader(_ListPixels(arrays), batch_size=5, ops=ops,
                                shuffle=True, seed=9))
    for (a, la), (b, lb) in zip(direct, parsed):
        assert torch.equal(a, b) and torch.equal(la, lb)


class _ListPixels(Pixels):
    def __init__(self, arrays):
        self.arrays = arrays

    def __len__(self):
        return len(self.arrays)

    def locate(self, i):
        return Location(f"px{check_index(i, len(self.arrays))}", data=b"\x00")

    def parse(self, i, raw):
        return Record(self.arrays[i], i % 3)

    def labels(self):
        return np.arange(len(self.arrays), dtype=np.int64) % 3


def test_tfx_shard_names_are_tfrecords(tmp_path):
    split = tmp_path / "Split-train"
    split.mkdir()
    (split / "data_tfrecord-00000-of-00001.gz").write_bytes(b"")
    assert detect(split) == "tfrecord"


def test_converted_datasets_keep_their_class_names(image_folder, tmp_path):
    from ingest.tools.cli import main
    for fmt in ("tfrecord", "recordio", "wds"):
        assert main(["convert", str(image_folder), str(tmp_path / fmt), "--to", fmt]) == 0
        loader = ingest.Loader(tmp_path / fmt, batch_size=4)
        assert list(loader.source.classes) == ["cat", "dog", "emu"], fmt


def test_an_unknown_reader_option_names_the_valid_ones(image_folder):
    with pytest.raises(ConfigError, match="filetree reader has no option 'bogus'. Available: extensions"):
        ingest.Loader(image_folder, batch_size=2, reader_options={"bogus": 1})


def test_tuple_output_skips_the_other_fields(monkeypatch):
    """(images, labels) batches do not pay for fields nobody receives (no collation); switching to
    output="dict" brings every field back at the next epoch."""
    import ingest.engine.ops
    calls = []
    real = ingest.engine.ops.collate
    monkeypatch.setattr(ingest.engine.ops, "collate", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    loader = ingest.Loader(Rich(), batch_size=5, decode="cpu", ops=[ingest.ops.Resize((16, 16))])
    batches = list(loader)
    assert [tuple(b[0].shape) for b in batches] == [(5, 3, 16, 16)] * 2 and calls == []
    loader.output = "dict"
    batch = next(iter(loader))
    assert {"score", "tags", "caption", "thumb"} <= set(batch) and "score" in calls
