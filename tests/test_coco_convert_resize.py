"""`ingest convert --max-side` on a COCO set: the annotations follow the resized (and EXIF-oriented) pixels, so
reading the packed data gives what reading the JSON through the Loader with the same resize gives; area
scales by sx * sy; relative coordinates stay."""

import json

import numpy as np
import pytest
from conftest import encode, realworld, textured
from PIL import Image
from pycocotools import mask as mask_utils
from test_polygons import _uncompressed

import ingest
from ingest.errors import CorruptRecordError
from ingest.formats import open_source
from ingest.formats.base import Record, iter_records
from ingest.formats.coco import CocoSource
from ingest.ops import Resize
from ingest.decode.cpu import CpuDecoder
from ingest.tools.convert import convert
from ingest.tools.transform import Transform

MAX_SIDE = 48
#: stored (height, width) and EXIF orientation of each image: the last is stored landscape, shown portrait
IMAGES = [(60, 80, 1), (90, 50, 1), (72, 72, 1), (40, 100, 6)]


def _jpeg(h, w, orientation, seed):
    img = Image.fromarray(textured(h, w, seed))
    if orientation == 1:
        return encode(img, "JPEG", quality=92)
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(img, "JPEG", quality=92, exif=exif.tobytes())


def _dataset(tmp_path):
    """Per image (annotated in its displayed frame): a triangle, a rectangle and a crowd object given as an
    uncompressed RLE."""
    (tmp_path / "img").mkdir()
    images, anns = [], []
    for i, (h, w, orientation) in enumerate(IMAGES):
        (tmp_path / "img" / f"{i}.jpg").write_bytes(_jpeg(h, w, orientation, i))
        H, W = (w, h) if orientation in (5, 6, 7, 8) else (h, w)
        images.append({"id": i + 1, "file_name": f"{i}.jpg", "height": H, "width": W})
        x0, y0, x1, y1 = 0.1 * W, 0.2 * H, 0.6 * W, 0.7 * H
        tri = [x0, y0, x1, y0, x0, y1]
        anns.append({"id": 10 * i, "image_id": i + 1, "category_id": 1, "iscrowd": 0, "segmentation": [tri],
                     "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0) / 2})
        rect = [0.5 * W, 0.1 * H, 0.9 * W, 0.4 * H]
        anns.append({"id": 10 * i + 1, "image_id": i + 1, "category_id": 2, "iscrowd": 0,
                     "segmentation": [[rect[0], rect[1], rect[2], rect[1], rect[2], rect[3], rect[0], rect[3]]],
                     "bbox": [rect[0], rect[1], rect[2] - rect[0], rect[3] - rect[1]],
                     "area": (rect[2] - rect[0]) * (rect[3] - rect[1])})
        mask = np.zeros((H, W), dtype=np.uint8)
        mask[H // 2:H // 2 + H // 4, W // 3:W // 3 + W // 4] = 1
        rle = mask_utils.encode(np.asfortranarray(mask))
        anns.append({"id": 10 * i + 2, "image_id": i + 1, "category_id": 2, "iscrowd": 1,
                     "segmentation": {"size": [H, W], "counts": _uncompressed(mask)},
                     "bbox": mask_utils.toBbox(rle).tolist(), "area": float(mask.sum())})
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}))
    return path


def _convert(path, tmp_path, to, options):
    convert(str(path), str(tmp_path / "out"), to=to, max_side=MAX_SIDE, progress=False,
            source_options={"images": str(tmp_path / "img"), **options},
            drop_fields=[] if options.get("masks") else ["segmentation"])
    return tmp_path / "out"


def _samples(loader):
    return [{k: v[0] if k != "polygons" else json.loads(v[0]) for k, v in batch.items()} for batch in loader]


def _open(path, tmp_path, **options):
    return CocoSource(path, images=tmp_path / "img", cache=False, **options)


def _compare(path, out, tmp_path, options, want_fields):
    """The packed samples against the JSON's through Resize(longer=MAX_SIDE), one by one."""
    kw = {"batch_size": 1, "output": "dict", "shuffle": False}
    src = _open(path, tmp_path, **options)
    want = _samples(ingest.Loader(src, ops=[Resize(longer=MAX_SIDE)], **kw))
    got = _samples(ingest.Loader(out, **kw))
    raw = [src.parse(i, None).fields for i in range(len(src))]
    assert len(got) == len(want) == len(IMAGES)
    for g, w, r, (h0, w0, orientation) in zip(got, want, raw, IMAGES):
        assert g["images"].shape == w["images"].shape   # oriented, then resized
        H, W = (w0, h0) if orientation == 6 else (h0, w0)
        oh, ow = w["images"].shape[-2:]
        assert max(oh, ow) == MAX_SIDE
        sx, sy = ow / W, oh / H
        np.testing.assert_allclose(g["boxes"][:int(g["boxes_lengths"])], w["boxes"][:int(w["boxes_lengths"])],
                                   atol=1e-3)
        for name in ("categories", "iscrowd"):
            assert g[name].tolist() == w[name].tolist()
        # area follows the pixels in the packed data; the Loader's ops leave the source's value
        np.testing.assert_allclose(g["area"], r["area"] * sx * sy, rtol=1e-5)
        np.testing.assert_allclose(w["area"], r["area"], rtol=1e-6)
        for name in want_fields:
            _same(g[name], w[name])
    return got, raw


def _same(got, want):
    if isinstance(want, dict):
        assert got == want
    elif isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    elif want is None:
        assert got is None
    elif hasattr(want, "numpy"):   # masks: the same nearest resize, exactly
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    else:
        np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64),
                                   atol=1e-6)


@pytest.mark.parametrize("to", ["tfrecord", "lmdb"])
def test_packed_boxes_and_area_follow_the_resize(tmp_path, to):
    path = _dataset(tmp_path)
    options = {"box_format": "ltrb"}
    _convert(path, tmp_path, to, options)
    got, raw = _compare(path, tmp_path / "out", tmp_path, options, ())
    # directly: the JSON's boxes times (sx, sy); the EXIF-rotated image comes out portrait
    h, w = got[3]["images"].shape[-2:]
    assert (h, w) == (MAX_SIDE, Resize(longer=MAX_SIDE).output_size(100, 40)[1])
    for g, r, (h0, w0, orientation) in zip(got, raw, IMAGES):
        H, W = (w0, h0) if orientation == 6 else (h0, w0)
        oh, ow = g["images"].shape[-2:]
        np.testing.assert_allclose(g["boxes"], r["boxes"] * [ow / W, oh / H, ow / W, oh / H], atol=1e-3)


@pytest.mark.parametrize("to", ["lmdb", "wds", "tfrecord"])
def test_packed_polygons_and_rles_follow_the_resize(tmp_path, to):
    path = _dataset(tmp_path)
    # TFRecords hold boxes the Object Detection API's way and read them back as ltrb: compare in ltrb
    options = {"masks": "polygons", **({"box_format": "ltrb"} if to == "tfrecord" else {})}
    _convert(path, tmp_path, to, options)
    got, raw = _compare(path, tmp_path / "out", tmp_path, options, ("polygons",))
    for g, r in zip(got, raw):
        oh, ow = g["images"].shape[-2:]
        tri, rect, rle = g["polygons"]
        tri0 = json.loads(r["polygons"])[0][0]
        H, W = json.loads(r["polygons"])[2]["size"]
        np.testing.assert_allclose(tri[0], (np.reshape(tri0, (-1, 2)) * [ow / W, oh / H]).ravel(), atol=1e-9)
        assert len(rect[0]) == 8
        assert rle["size"] == [oh, ow]


@pytest.mark.parametrize("to", ["lmdb", "tfrecord"])
def test_packed_masks_follow_the_resize(tmp_path, to):
    path = _dataset(tmp_path)
    options = {"masks": "masks", **({"box_format": "ltrb"} if to == "tfrecord" else {})}
    _convert(path, tmp_path, to, options)
    got, _ = _compare(path, tmp_path / "out", tmp_path, options, ("masks",))
    for g in got:
        assert tuple(g["masks"].shape[1:]) == tuple(g["images"].shape[-2:]) and g["masks"].sum() > 0


def test_relative_coordinates_stay(tmp_path):
    path = _dataset(tmp_path)
    options = {"masks": "polygons", "relative": True}
    _convert(path, tmp_path, "lmdb", options)
    packed = open_source(tmp_path / "out")
    assert packed.relative
    src = _open(path, tmp_path, **options)
    packed_records = [rec.fields for _, rec in iter_records(packed)]
    assert len(packed_records) == len(src)
    for i, got in enumerate(packed_records):
        want = src.parse(i, None).fields
        np.testing.assert_array_equal(got["boxes"], want["boxes"])
        g, w = json.loads(got["polygons"]), json.loads(want["polygons"])
        _same(g[:2], w[:2])                          # relative polygons as they were
        assert g[2]["size"] != w[2]["size"]          # the RLE is pixels: resized


def test_masks_that_do_not_fit_the_image_fail_the_sample():
    data = encode(Image.fromarray(textured(60, 80, 0)), "JPEG")
    record = Record(data, -1, {"boxes": np.array([[0, 0, 8, 8]], np.float32),
                               "masks": np.zeros((1, 30, 30), np.uint8)})
    with pytest.raises(CorruptRecordError, match="x.jpg.*do not fit the image of 60x80"):
        Transform(max_side=40).apply(record, "x.jpg", CpuDecoder(threads=1))
    # a small image keeps its bytes and its annotations
    small = Transform(max_side=100).apply(record, "x.jpg", CpuDecoder(threads=1))
    assert small.image is data and small.fields["masks"].shape == (1, 30, 30)


@pytest.mark.realworld
def test_realworld_subset_packed_at_max_side_reads_like_the_json_resized(tmp_path):
    root = realworld("coco/tiny_coco_train2017")
    options = {"images": str(root / "train_2017_small"), "masks": "polygons"}
    convert(str(root / "instances_train2017_small.json"), str(tmp_path / "out"), to="wds", max_side=320,
            source_options=options, progress=False)
    kw = {"batch_size": 1, "output": "dict", "shuffle": False}
    src = CocoSource(root / "instances_train2017_small.json", cache=False, **options)
    want = _samples(ingest.Loader(src, ops=[Resize(longer=320)], **kw))   # every image is larger than 320
    got = _samples(ingest.Loader(tmp_path / "out", **kw))
    assert len(got) == len(want) == 16
    for g, w in zip(got, want):
        assert g["images"].shape == w["images"].shape
        np.testing.assert_allclose(g["boxes"], w["boxes"], atol=1e-3)
        _same(g["polygons"], w["polygons"])   # 196 polygons and the crowd RLE
