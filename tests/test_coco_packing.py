"""COCO annotations packed with their images: TFRecord in the TensorFlow Object Detection API layout (boxes
normalized by the image size, read back as ltrb pixels), LMDB and WebDataset keeping the fields as they are."""

import io
import json

import numpy as np
import pytest
from conftest import jpeg_bytes, realworld
from PIL import Image
from test_detection import _coco

import ingest
from ingest.errors import CorruptRecordError
from ingest.formats import _protos, open_source
from ingest.formats.base import Field, Record, iter_records
from ingest.formats.coco import CocoSource
from ingest.formats.tfrecord import TFRecordSource, TFRecordWriter, frame, iter_stream
from ingest.tools.convert import convert


def _ltrb(boxes):
    b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    b[:, 2:] += b[:, :2]
    return b


def _records(source):
    return [source.parse(i, None).fields for i in range(len(source))]


@pytest.mark.parametrize("box_format", ["xywh", "ltrb"])
def test_coco_to_tfrecord_keeps_the_targets(tmp_path, box_format):
    path = _coco(tmp_path, n=5)
    options = {"images": str(tmp_path / "img"), "box_format": box_format}
    src = CocoSource(path, **options)
    convert(str(path), str(tmp_path / "out"), to="tfrecord", shard_size=2, source_options=options, progress=False,
            drop_fields=["segmentation"])
    packed = open_source(str(tmp_path / "out"))
    assert (packed.box_format, packed.relative) == ("xyxy", False)
    assert {"boxes", "categories", "iscrowd", "area", "image_id"} <= set(packed.fields)
    assert len(packed) == len(src)
    for i, want in enumerate(_records(src)):
        got = packed.parse(i, _raw(packed, i)).fields
        expect = _ltrb(want["boxes"]) if box_format == "xywh" else want["boxes"]
        np.testing.assert_allclose(got["boxes"], expect, atol=1e-3)
        for name in ("categories", "iscrowd", "area", "image_id"):
            np.testing.assert_array_equal(got[name], want[name])


def _raw(source, i):
    loc = source.locate(i)
    with open(loc.path, "rb") as f:
        f.seek(loc.offset)
        return f.read(loc.length)


def test_tfrecord_holds_the_object_detection_api_keys(tmp_path):
    path = _coco(tmp_path, n=2)
    convert(str(path), str(tmp_path / "out"), to="tfrecord", source_options={"images": str(tmp_path / "img")},
            progress=False, drop_fields=["segmentation"])
    shard = next((tmp_path / "out").glob("*.tfrecord"))
    fmap = _protos.Example.FromString(bytes(next(iter_stream(str(shard)))[1])).features.feature
    assert fmap["image/format"].bytes_list.value == [b"jpeg"]
    assert (fmap["image/height"].int64_list.value, fmap["image/width"].int64_list.value) == ([60], [80])
    assert fmap["image/source_id"].bytes_list.value == [b"1"]
    # the first box of _coco: xywh (4, 10, 30, 20) in an 80x60 image
    xs = [fmap[f"image/object/bbox/{k}"].float_list.value[0] for k in ("xmin", "ymin", "xmax", "ymax")]
    np.testing.assert_allclose(xs, [4 / 80, 10 / 60, 34 / 80, 30 / 60], rtol=1e-6)
    assert list(fmap["image/object/class/label"].int64_list.value) == [1, 2]
    assert list(fmap["image/object/class/text"].bytes_list.value) == [b"c3", b"c7"]
    assert list(fmap["image/object/is_crowd"].int64_list.value) == [0, 0]
    assert list(fmap["image/object/area"].float_list.value) == [600.0, 120.0]


def test_loader_reads_packed_boxes_like_the_json(tmp_path):
    path = _coco(tmp_path, n=4)
    options = {"images": str(tmp_path / "img"), "box_format": "ltrb"}
    convert(str(path), str(tmp_path / "out"), to="tfrecord", source_options=options, progress=False,
            drop_fields=["segmentation"])
    kw = {"batch_size": 4, "output": "dict", "shuffle": False, "ragged": True}
    a = next(iter(ingest.Loader(str(path), reader_options=options, **kw)))
    b = next(iter(ingest.Loader(str(tmp_path / "out"), **kw)))
    assert np.allclose(a["boxes"].numpy(), b["boxes"].numpy(), atol=1e-3)
    assert a["categories"].tolist() == b["categories"].tolist()


@pytest.mark.parametrize("to", ["lmdb", "wds"])
def test_other_writers_keep_the_fields(tmp_path, to):
    path = _coco(tmp_path, n=3)
    options = {"images": str(tmp_path / "img")}
    convert(str(path), str(tmp_path / "out"), to=to, source_options=options, progress=False,
            drop_fields=["segmentation"])
    want = _records(CocoSource(path, **options))
    packed = open_source(str(tmp_path / "out"))
    got = [rec.fields for _, rec in iter_records(packed)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g["boxes"]).reshape(-1, 4), w["boxes"], atol=1e-6)
        np.testing.assert_array_equal(g["categories"], w["categories"])


def test_object_without_boxes_and_bad_coordinates(tmp_path):
    fields = {"image": Field("image"), "boxes": Field("array", dtype="float32"), "categories": Field("ints")}
    w = TFRecordWriter(tmp_path, "s", fields)
    w.add(Record(jpeg_bytes(20, 30), -1, {"boxes": np.zeros((0, 4), np.float32), "categories": np.zeros(0)}))
    w.add(Record(jpeg_bytes(20, 30), -1, {"boxes": [[3, 4, 9, 12]], "categories": [5]}))
    w.close()
    src = TFRecordSource(tmp_path / "s.tfrecord")
    recs = [src.parse(i, _raw(src, i)).fields for i in range(2)]
    assert recs[0]["boxes"].shape == (0, 4) and recs[0]["categories"].size == 0
    np.testing.assert_allclose(recs[1]["boxes"], [[3, 4, 9, 12]], atol=1e-4)
    # a record whose coordinate lists disagree names the feature
    ex = _protos.Example()
    for k, v in (("xmin", [0.1]), ("ymin", [0.1, 0.2]), ("xmax", [0.5]), ("ymax", [0.5])):
        ex.features.feature[f"image/object/bbox/{k}"].float_list.value.extend(v)
    for k in ("image/height", "image/width"):
        ex.features.feature[k].int64_list.value.append(10)
    ex.features.feature["image/encoded"].bytes_list.value.append(jpeg_bytes(10, 10))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "b.tfrecord").write_bytes(frame(ex.SerializeToString()))
    bad = TFRecordSource(tmp_path / "bad" / "b.tfrecord")
    with pytest.raises(CorruptRecordError, match="image/object/bbox"):
        bad.parse(0, _raw(bad, 0))


@pytest.mark.realworld
def test_realworld_object_detection_record_gives_boxes():
    src = TFRecordSource(realworld("tfrecord") / "test.record")
    assert {"boxes", "categories"} <= set(src.fields) and "image_id" not in src.fields   # source_id: file names
    for i in range(len(src)):
        rec = src.parse(i, _raw(src, i))
        with Image.open(io.BytesIO(bytes(rec.image))) as im:
            h, w = im.height, im.width
        boxes = rec.fields["boxes"]
        assert boxes.shape == (len(rec.fields["categories"]), 4) and len(boxes) >= 1
        assert (boxes[:, 0] < boxes[:, 2]).all() and (boxes[:, 1] < boxes[:, 3]).all()
        assert (boxes >= 0).all() and (boxes[:, 2] <= w + 1e-3).all() and (boxes[:, 3] <= h + 1e-3).all()
        assert boxes[:, 2].max() > 1 and set(rec.fields["categories"].tolist()) == {1}



@pytest.mark.parametrize("fmt", ["lmdb", "wds"])   # RecordIO refuses these fields, by name
def test_formats_that_store_boxes_as_given_keep_their_box_format(tmp_path, fmt):
    """A COCO source read as xywh, packed where box values are stored as they are: the manifest records xywh,
    and reading back gives the format asked for (xyxy by default), so the box-aware ops move the boxes the
    same as from the JSON."""
    import ingest
    from ingest.ops import Flip
    from ingest.tools.cli import main
    path = _coco(tmp_path)
    assert main(["convert", str(path), str(tmp_path / fmt), "--to", fmt, "-s", f"images={tmp_path / 'img'}",
                 "-s", "box_format=xywh", "--drop", "segmentation", "-q"]) == 0
    assert json.loads((tmp_path / fmt / "manifest.json").read_text())["boxes"] == {"box_format": "xywh",
                                                                                  "relative": False}
    packed = open_source(tmp_path / fmt)
    assert (packed.box_format, packed.relative) == ("xyxy", False)
    kw = dict(batch_size=3, output="dict", ops=[Flip(p=1.0)], ragged=True)
    for box_format in ("xyxy", "xywh", "cxcywh"):
        a = next(iter(ingest.Loader(CocoSource(path, images=tmp_path / "img", cache=False, box_format=box_format),
                                    **kw)))
        b = next(iter(ingest.Loader(tmp_path / fmt, reader_options={"box_format": box_format}, **kw)))
        assert np.allclose(a["boxes"].numpy(), b["boxes"].numpy(), atol=1e-3)
