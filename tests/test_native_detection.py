"""Detection on the native engine, the parts that need no GPU: which COCO loaders `native.chain_for` takes (the
bench's chain, per image and padded per batch) and what it refuses, naming why; the output ring's bound; the COCO
table (samples the engine must leave to the Python reader marked) and its boxes as absolute ltrb, equal to what
the Python read stage converts; the engine's `set_detection` checks; the keys an Object Detection API TFRecord
source gives the engine (which scans each record's boxes) and what such a source it refuses. The batches themselves
are compared with the Python stages in tests/test_native_emulated.py (stand-in driver) and tests/test_native_gpu.py
(CUDA)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ingest import native
from ingest.engine.native_boxes import bound, detection_of
from ingest.formats.coco import CocoSource
from ingest.ops import Flip, Normalize, PadTo, RandomIoUCrop, Resize, ZoomOut
from ingest.ops.boxes import BoxBatch, to_ltrb
from ingest.ops.geometry import CenterCrop

from test_coco import ann, write_coco

BENCH = [RandomIoUCrop(), Flip(p=0.5), Resize(800, max_size=1333), PadTo(multiple=32)]


@pytest.fixture
def coco(tmp_path):
    images = [(1, 40, 60), (2, 50, 30), (3, 20, 20)]
    anns = [ann(1, 1, [2, 3, 10, 8], 1), ann(2, 1, [5, 5, 4, 4], 2, iscrowd=1), ann(3, 2, [0, 0, 30, 50], 2)]
    return write_coco(tmp_path, anns, images=images)


def test_the_bench_chain_runs_natively_per_image_and_per_batch(coco):
    src = CocoSource(coco, images=coco.parent.parent / "img", cache=False, box_format="ltrb")
    chain, why = native.chain_for(src, BENCH)
    assert why is None and chain.detection is not None
    det = chain.detection
    assert det.bound == (800, 1344) and det.stride(3) == 800 * 1344 * 3 and not det.batchwide
    assert det.order == ("image_id", "boxes", "boxes_lengths", "categories", "categories_lengths", "iscrowd",
                         "iscrowd_lengths", "area", "area_lengths", "image_sizes")
    assert chain.fields == frozenset(det.order)
    batch, why = native.chain_for(src, BENCH[:-1] + [PadTo(multiple=32, batch=True)])
    assert why is None and batch.detection.batchwide and batch.detection.row_capacity(3) == 1344 * 1344 * 3
    # SSD's chain: ZoomOut leaves the size unbounded until the Resize bounds it again
    ssd, why = native.chain_for(src, [ZoomOut(), *BENCH, Normalize((127.5,) * 3, (51.0,) * 3)])
    assert why is None and ssd.detection.bound == (800, 1344)


def test_boxes_are_the_read_stages_absolute_ltrb(coco):
    src = CocoSource(coco, images=coco.parent.parent / "img", cache=False, box_format="cxcywh", relative=True)
    det, why = detection_of(src, BENCH, (0.0, 0.0, 0.0))
    assert why is None
    given = src.native_boxes()
    want = to_ltrb(BoxBatch(given.boxes.astype(np.float64), given.starts), given.declared, "cxcywh", True).flat
    np.testing.assert_array_equal(det.boxes, want)
    np.testing.assert_allclose(det.boxes[:3], [[2, 3, 12, 11], [5, 5, 9, 9], [0, 0, 30, 50]], atol=1e-5)
    assert det.starts.tolist() == [0, 2, 3, 3] and det.per_sample[0][1].tolist() == [1, 2, 3]
    names = [name for name, *_ in det.per_box]
    assert names == ["categories", "iscrowd", "area"] and det.per_box[1][1].tolist() == [0, 1, 0]
    assert [pad for *_, pad in det.per_box] == [-1, -1, 0.0]


@pytest.mark.parametrize("ops, options, says", [
    (BENCH, {"masks": "polygons"}, "'polygons' (text)"),
    ([RandomIoUCrop(), Resize(800)], {}, "not bounded"),
    ([Resize(800, max_size=1333), ZoomOut()], {}, "not bounded"),
    ([Resize(800, max_size=1333), PadTo(multiple=32, batch=True, center=True)], {}, "centred"),
    ([Resize(800, max_size=1333), PadTo(multiple=32, batch=True)], {"relative": True}, "relative boxes"),
    ([Resize(64, max_size=80), CenterCrop(64, fill=3), PadTo(multiple=32, fill=5)], {}, "one fill"),
    (BENCH, {"relative": True, "check_sizes": False}, "declared sizes"),
])
def test_what_it_refuses_is_named(coco, ops, options, says):
    src = CocoSource(coco, images=coco.parent.parent / "img", cache=False, **options)
    chain, why = native.chain_for(src, ops)
    assert chain is None and says in why, why


def test_the_table_leaves_what_the_reader_must_check_to_python(tmp_path):
    images = [(1, 20, 30), (2, 20, 30), (3, 20, 30), (4, 20, 30), (5, 20, 30)]
    path = write_coco(tmp_path, [ann(1, 1, [1, 1, 5, 5]), ann(2, 4, [1, 1, 5, -5])], images=images)
    img = tmp_path / "img"
    (img / "sub").mkdir()
    os.replace(img / "000005.jpg", img / "sub" / "five.jpg")
    os.symlink(img / "sub" / "five.jpg", img / "000005.jpg")   # a link inside the root: read where it leads
    os.remove(img / "000002.jpg")   # missing: the reader names it
    outside = tmp_path / "elsewhere.jpg"
    os.replace(img / "000003.jpg", outside)
    os.symlink(outside, img / "000003.jpg")   # a link leaving the root: the reader refuses it
    src = CocoSource(path, images=img, cache=False)
    table = src.native_table()
    assert table.kind == "whole" and (table.labels == -1).all()
    # image 4's annotation is invalid (negative height): its read raises, in Python
    assert table.python.tolist() == [0, 1, 1, 1, 0] and table.paths[4] == str(img / "sub" / "five.jpg")
    assert table.sizes[0] == os.path.getsize(img / "000001.jpg") and table.paths[0] == str(img / "000001.jpg")


def test_bound_follows_the_ops():
    assert bound([Resize((30, 50)), Flip()]) == (30, 50)
    assert bound([Resize(64, max_size=100), PadTo(multiple=32)]) == (64, 128)
    assert bound([Resize(longer=90), PadTo(size=(100, 40))]) == (100, 100)
    assert bound([CenterCrop((20, 10)), RandomIoUCrop()]) == (10, 20)
    assert bound([Resize(64)]) is None and bound([RandomIoUCrop()]) is None


@pytest.mark.skipif(native.ENGINE is None, reason="ingest._engine was not built")
def test_set_detection_checks_its_arguments(coco):
    src = CocoSource(coco, images=coco.parent.parent / "img", cache=False)
    chain, _ = native.chain_for(src, BENCH)
    t = chain.table
    engine = native.ENGINE.Engine(list(t.paths), t.files, t.offsets, t.sizes, t.labels, 0, chain.desc, 0, 4, 2, 1,
                                  1 << 26, True, None)
    try:
        from ingest.engine.native_boxes import engine_arguments
        args = list(engine_arguments(chain.detection, 3))
        with pytest.raises(ValueError, match="starts"):
            engine.set_detection(args[0], np.zeros(3, np.int64), *args[2:])
        with pytest.raises(ValueError, match="box format"):
            engine.set_detection(*args[:4], 7, *args[5:])
        with pytest.raises(ValueError, match="set_targets"):
            engine.set_targets(0, 0, np.zeros(64, np.uint8), np.zeros(200, np.int64))
        engine.set_detection(*args)
        with pytest.raises(RuntimeError, match="once"):
            engine.set_detection(*args)
        with pytest.raises(ValueError, match="info array"):
            engine.set_targets(0, 0, np.zeros(64, np.uint8), np.zeros(8, np.int64))
    finally:
        engine.close()


@pytest.mark.parametrize("batchwide", [False, True])
def test_a_batch_whose_fallback_rows_all_failed_keeps_the_engines_rows(coco, batchwide):
    """`merged` with every fallback row dropped (Python decoded none: no fields came back) gives the engine's other
    rows, their boxes and per-sample fields, as new tensors."""
    import torch
    from ingest.engine.native_boxes import merged
    src = CocoSource(coco, images=coco.parent.parent / "img", cache=False, box_format="ltrb")
    ops = BENCH[:-1] + [PadTo(multiple=32, batch=True)] if batchwide else BENCH
    det, why = detection_of(src, ops, (0.0, 0.0, 0.0))
    assert why is None
    rows = 3
    images = torch.arange(rows * 3 * 4 * 5, dtype=torch.uint8).reshape(rows, 3, 4, 5)
    boxes = torch.tensor([[[1, 2, 3, 4], [0, 0, 0, 0]], [[5, 6, 7, 8], [1, 1, 2, 2]], [[0, 0, 0, 0]] * 2],
                         dtype=torch.float32)
    fields = {"image_id": torch.tensor([1, 2, 3]), "boxes": boxes, "boxes_lengths": torch.tensor([1, 2, 0])}
    for name, _, dtype, pad in det.per_box:
        fields[name] = torch.full((rows, 2), 7, dtype=dtype)
        fields[f"{name}_lengths"] = torch.tensor([1, 2, 0])
    if "image_sizes" in det.order:
        fields["image_sizes"] = torch.tensor([[4, 5], [4, 5], [4, 5]])
    fields = {name: fields[name] for name in det.order}
    got_images, got, kept = merged(det, rows, [], [1], images if batchwide else list(images.unbind(0)), fields,
                                   [], {}, (0.0, 0.0, 0.0), torch.device("cpu"), "NCHW", True)
    assert kept.tolist() == [0, 2] and list(got) == list(det.order)
    assert got["image_id"].tolist() == [1, 3] and got["boxes_lengths"].tolist() == [1, 0]
    assert got["boxes"].tolist() == [[[1, 2, 3, 4]], [[0, 0, 0, 0]]]
    shown = got_images if batchwide else torch.stack(got_images)
    assert torch.equal(shown, images[[0, 2]])


# -- TFRecord records of the Object Detection API layout: the engine scans each record's boxes ------------------------

OD_SPEC = {"image": "image/encoded", "boxes": ("image/object/bbox", "array"), "categories": "image/object/class/label"}


@pytest.fixture
def od_path(tmp_path):
    from test_native_emulated import od_tfrecord
    src, _ = od_tfrecord(tmp_path, "xyxy")
    return src.shards[0]


def test_object_detection_records_give_the_engine_their_keys(od_path):
    from ingest.engine.native_boxes import RECORD_BOXES
    from ingest.formats.tfrecord import TFRecordSource
    src = TFRecordSource(od_path, box_format="xywh")
    chain, why = native.chain_for(src, BENCH)
    assert why is None and chain.table.kind == "tfrecord"
    assert chain.table.keys == (b"image/encoded", b"image/class/label")
    det = chain.detection
    assert det.boxes is None and det.starts is None and det.most == RECORD_BOXES and det.box_format == "xywh"
    keys, codes = det.record
    assert keys == [f"image/object/bbox/{k}".encode() for k in ("xmin", "ymin", "xmax", "ymax")] + [
        b"image/height", b"image/width", b"image/object/class/label", b"image/object/is_crowd", b"image/object/area",
        b"image/source_id"]
    assert codes == b"FFFFiiIIFb"   # image/source_id: a decimal id in one bytes value
    assert det.order == ("boxes", "boxes_lengths", "categories", "categories_lengths", "iscrowd", "iscrowd_lengths",
                         "area", "area_lengths", "image_id", "image_sizes")
    assert [(name, pad) for name, _, _, pad in det.per_box] == [("categories", -1), ("iscrowd", -1), ("area", 0.0)]


@pytest.mark.parametrize("extra, says", [
    ({"format": ("image/format", "bytes")}, "'format' (bytes)"),
    ({"difficult": ("image/object/is_crowd", "ints")}, "'difficult' is a list the Python stages do not prune"),
])
def test_object_detection_records_it_refuses_are_named(od_path, extra, says):
    from ingest.formats.tfrecord import TFRecordSource
    src = TFRecordSource(od_path, features={**OD_SPEC, **extra})
    chain, why = native.chain_for(src, BENCH)
    assert chain is None and says in why, why


def test_compressed_object_detection_records_are_refused(od_path, tmp_path):
    import gzip
    from ingest.formats.tfrecord import TFRecordSource
    with open(od_path, "rb") as f:
        (tmp_path / "od.tfrecord.gz").write_bytes(gzip.compress(f.read()))
    chain, why = native.chain_for(TFRecordSource(str(tmp_path / "od.tfrecord.gz")), BENCH)
    assert chain is None and "streamed" in why, why


@pytest.mark.skipif(native.ENGINE is None, reason="ingest._engine was not built")
def test_set_detection_checks_a_records_keys(od_path, coco):
    from ingest.engine.native_boxes import engine_arguments
    from ingest.formats.tfrecord import TFRecordSource
    chain, _ = native.chain_for(TFRecordSource(od_path), BENCH)
    t = chain.table
    engine = native.ENGINE.Engine(list(t.paths), t.files, t.offsets, t.sizes, t.labels, 2, chain.desc, 0, 4, 2, 1,
                                  1 << 26, True, None, 0, None, list(t.keys), True)
    try:
        args = list(engine_arguments(chain.detection, 3))
        keys, codes = args[9]
        with pytest.raises(ValueError, match="'FFFFii'"):
            engine.set_detection(*args[:9], (keys, codes.replace(b"IIF", b"IFF")), args[10])
        with pytest.raises(ValueError, match="'FFFFii'"):
            engine.set_detection(*args[:9], (keys[:-1], codes), args[10])
        with pytest.raises(ValueError, match="most >= 1"):
            engine.set_detection(*args[:9], args[9], 0)
        engine.set_detection(*args)
    finally:
        engine.close()
    coco_chain, _ = native.chain_for(CocoSource(coco, images=coco.parent.parent / "img", cache=False), BENCH)
    c = coco_chain.table
    engine = native.ENGINE.Engine(list(c.paths), c.files, c.offsets, c.sizes, c.labels, 0, coco_chain.desc, 0, 4, 2,
                                  1, 1 << 26, True, None)
    try:   # (records are a TFRecord table's)
        with pytest.raises(ValueError, match="records from a TFRecord table"):
            engine.set_detection(*args)
    finally:
        engine.close()
