"""COCO reader: fields and options on generated instances files, every malformed case, the parse cache, and
agreement with pycocotools (boxes, categories, areas, annToMask, loadRes) on the real-world files."""

from __future__ import annotations

import json
import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from ingest.errors import ConfigError, CorruptRecordError, SourceError
from ingest.formats import check_format, read_location
from ingest.formats import _coco_index as coco_index, coco
from ingest.formats.coco import CocoSource

from conftest import jpeg_bytes, realworld

SQUARE = [[2.0, 2.0, 12.0, 2.0, 12.0, 9.0, 2.0, 9.0]]


def ann(aid, image_id, bbox, category_id=1, **kw):
    return {"id": aid, "image_id": image_id, "category_id": category_id, "bbox": bbox,
            "area": kw.pop("area", bbox[2] * bbox[3] if bbox else 1.0), "iscrowd": kw.pop("iscrowd", 0),
            "segmentation": kw.pop("segmentation", SQUARE), **kw}


def write_coco(root: Path, anns: list, *, images=((1, 20, 30), (2, 24, 16), (3, 18, 18)),
               categories=((1, "cat"), (2, "dog")), name="instances.json", **extra) -> Path:
    """An instances file at root/annotations/<name> and its JPEGs (height x width as declared) in root/img."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    for iid, h, w in images:
        (root / "img" / f"{iid:06d}.jpg").write_bytes(jpeg_bytes(h, w, seed=iid))
    data = {"images": [{"id": iid, "file_name": f"{iid:06d}.jpg", "height": h, "width": w}
                       for iid, h, w in images],
            "categories": [{"id": cid, "name": cname, "supercategory": None} for cid, cname in categories],
            "annotations": anns, **extra}
    path = root / "annotations" / name
    path.write_text(json.dumps(data))
    return path


def open_coco(path, **kw) -> CocoSource:
    """The source, with boxes as COCO's ``bbox`` holds them (xywh) unless the test asks for another format."""
    kw.setdefault("cache", False)
    kw.setdefault("box_format", "xywh")
    return CocoSource(path, images=Path(path).parent.parent / "img", **kw)


@pytest.fixture
def basic(tmp_path):
    """Three images (ids 1..3), categories 1 and 2; image 3 has no objects."""
    return write_coco(tmp_path, [ann(10, 2, [1, 2, 6, 8], 2), ann(11, 1, [3, 4, 10, 5], 1),
                                 ann(12, 1, [0, 0, 4, 4], 2, iscrowd=1,
                                     segmentation={"size": [20, 30], "counts": [25, 5, 570]})])


def fields(source, i):
    return source.parse(i, read_location(source.locate(i))).fields


# -- fields and options ------------------------------------------------------------------------------------

def test_fields_follow_torchvision_targets(basic):
    source = open_coco(basic)
    check_format(source)
    assert len(source) == 3 and source.image_ids.tolist() == [1, 2, 3]
    assert source.classes == ["__background__", "cat", "dog"]
    assert (source.labels() == -1).all()
    first = source.parse(0, read_location(source.locate(0)))
    assert first.image == (basic.parent.parent / "img" / "000001.jpg").read_bytes()
    assert first.label == -1 and first.fields["image_id"] == 1
    np.testing.assert_array_equal(first.fields["boxes"], [[3, 4, 10, 5], [0, 0, 4, 4]])
    assert first.fields["boxes"].dtype == np.float32
    assert first.fields["categories"].tolist() == [1, 2] and first.fields["iscrowd"].tolist() == [0, 1]
    np.testing.assert_allclose(first.fields["area"], [50, 16])
    empty = fields(source, 2)
    assert empty["boxes"].shape == (0, 4) and empty["categories"].shape == (0,)


def test_box_formats_and_relative(basic):
    ltrb = fields(open_coco(basic, box_format="ltrb"), 1)["boxes"]
    np.testing.assert_array_equal(ltrb, [[1, 2, 7, 10]])
    rel = fields(open_coco(basic, box_format="ltrb", relative=True), 1)["boxes"]  # image 2 is 24 x 16
    np.testing.assert_allclose(rel, [[1 / 16, 2 / 24, 7 / 16, 10 / 24]], rtol=1e-6)
    np.testing.assert_array_equal(fields(open_coco(basic, box_format="xyxy"), 1)["boxes"], [[1, 2, 7, 10]])
    np.testing.assert_array_equal(fields(open_coco(basic, box_format="cxcywh"), 1)["boxes"], [[4, 6, 6, 8]])
    np.testing.assert_array_equal(fields(CocoSource(basic, images=basic.parent.parent / "img", cache=False), 1)["boxes"],
                                  [[1, 2, 7, 10]])   # the default: xyxy pixels, torchvision's
    with pytest.raises(ConfigError, match="box_format.*xyxy, xywh, cxcywh"):
        open_coco(basic, box_format="yxyx")


def test_category_ids_contiguous_or_original(tmp_path):
    path = write_coco(tmp_path, [ann(1, 1, [0, 0, 5, 5], 90), ann(2, 1, [0, 0, 5, 5], 3), ann(3, 2, [1, 1, 3, 3], 7)],
                      categories=((90, "toothbrush"), (3, "car"), (7, "train")))
    contiguous = open_coco(path)
    assert contiguous.classes == ["__background__", "car", "train", "toothbrush"]
    assert fields(contiguous, 0)["categories"].tolist() == [3, 1]
    original = open_coco(path, contiguous_ids=False)
    assert fields(original, 0)["categories"].tolist() == [90, 3]
    assert len(original.classes) == 91 and original.classes[0] == "__background__"
    assert original.classes[7] == "train" and original.classes[5] == "N/A"


def test_crowd_size_threshold_skip_empty_and_subset(basic):
    assert fields(open_coco(basic, include_crowd=False), 0)["iscrowd"].tolist() == [0]
    # Image 1's boxes are 10 x 5 and 4 x 4, image 2's 6 x 8: a threshold of 5 drops the 4 x 4 one only.
    thresholded = open_coco(basic, size_threshold=5)
    assert fields(thresholded, 0)["boxes"].tolist() == [[3, 4, 10, 5]]
    assert len(fields(thresholded, 1)["boxes"]) == 1
    assert open_coco(basic, skip_empty=True).image_ids.tolist() == [1, 2]
    assert open_coco(basic, size_threshold=6, skip_empty=True).image_ids.tolist() == [2]
    subset = open_coco(basic, image_ids=[3, 1])
    assert subset.image_ids.tolist() == [1, 3] and fields(subset, 1)["image_id"] == 3
    with pytest.raises(ConfigError, match="ids not in .*: 7, 8"):
        open_coco(basic, image_ids=[1, 7, 8])
    with pytest.raises(ConfigError, match="size_threshold"):
        open_coco(basic, size_threshold=-1)


def test_masks_and_polygons_agree_with_pycocotools(tmp_path):
    compressed = mask_utils.encode(np.asfortranarray((np.arange(18 * 18).reshape(18, 18) % 7 == 0)
                                                     .astype(np.uint8)))
    anns = [ann(1, 1, [2, 2, 10, 7], segmentation=SQUARE + [[20, 10, 28, 10, 24, 18]]),
            ann(2, 1, [0, 0, 4, 4], iscrowd=1, segmentation={"size": [20, 30], "counts": [25, 5, 570]}),
            ann(3, 3, [0, 0, 18, 18], segmentation={"size": [18, 18], "counts": compressed["counts"].decode()})]
    path = write_coco(tmp_path, anns)
    truth = COCO(str(path))
    masks = open_coco(path, masks="masks")
    check_format(masks)
    for i, iid in enumerate(masks.image_ids.tolist()):
        got = fields(masks, i)["masks"]
        want = [truth.annToMask(a) for a in truth.imgToAnns[iid]]
        assert got.dtype == np.uint8 and got.shape == (len(want), truth.imgs[iid]["height"], truth.imgs[iid]["width"])
        if want:
            np.testing.assert_array_equal(got, np.stack(want))
    polygons = open_coco(path, masks="polygons")
    assert json.loads(fields(polygons, 0)["polygons"]) == [anns[0]["segmentation"], {
        "size": [20, 30], "counts": truth.annToRLE(truth.anns[2])["counts"].decode()}]
    relative = json.loads(fields(open_coco(path, masks="polygons", relative=True), 0)["polygons"])
    assert relative[0][0][:2] == [2 / 30, 2 / 20]
    with pytest.raises(ConfigError, match="masks"):
        open_coco(path, masks="rle")


def test_masks_need_a_segmentation(tmp_path):
    path = write_coco(tmp_path, [ann(5, 1, [0, 0, 3, 3], segmentation=None)])
    assert json.loads(fields(open_coco(path, masks="polygons"), 0)["polygons"]) == [None]
    with pytest.raises(CorruptRecordError, match="annotation id 5 has no segmentation"):
        fields(open_coco(path, masks="masks"), 0)


def test_pixel_masks_are_bounded(tmp_path, monkeypatch):
    far = [[0, 0, 1e9, 0, 1e9, 5]]  # pycocotools would allocate ~5e9 boundary points for it
    path = write_coco(tmp_path, [ann(5, 1, [0, 0, 3, 3], segmentation=far), ann(6, 2, [0, 0, 3, 3])])
    assert fields(open_coco(path), 0)["boxes"].tolist() == [[0, 0, 3, 3]]
    masks = open_coco(path, masks="masks")
    with pytest.raises(CorruptRecordError, match="annotation id 5: polygon coordinates reach more than"):
        fields(masks, 0)
    monkeypatch.setattr(coco, "MAX_MASK_BYTES", 24 * 16 - 1)  # image 2 is 24 x 16
    with pytest.raises(CorruptRecordError, match="1 masks of 24x16 would take more than 383 bytes"):
        fields(masks, 1)


def test_summary_for_inspect(basic):
    summary = open_coco(basic).summary()
    assert summary["images"] == 3 and summary["annotations"] == 3 and summary["categories"] == 2
    assert summary["crowd"] == 1 and summary["empty_images"] == 1
    assert summary["per_category"] == {"cat": 1, "dog": 2}
    assert summary["invalid_images"] == 0 and summary["first_error"] is None
    assert open_coco(basic, include_crowd=False).summary()["per_category"] == {"cat": 1, "dog": 1}


def test_images_default_to_the_json_directory(tmp_path):
    path = write_coco(tmp_path, [ann(1, 1, [0, 0, 3, 3])])
    data = json.loads(path.read_text())
    data["images"][0]["file_name"] = "img/Zürich ünï.jpg"
    os.rename(tmp_path / "img" / "000001.jpg", tmp_path / "img" / "Zürich ünï.jpg")
    moved = tmp_path / "instances.json"
    moved.write_text(json.dumps(data))
    source = CocoSource(moved, cache=tmp_path)
    assert source.name(0) == str(tmp_path / "img" / "Zürich ünï.jpg")
    assert read_location(source.locate(0)) == (tmp_path / "img" / "Zürich ünï.jpg").read_bytes()


def test_loader_batches_the_targets_padded(basic):
    import ingest
    loader = ingest.Loader(open_coco(basic, box_format="ltrb"), batch_size=3, output="dict", ragged=True)
    batch = next(iter(loader))
    assert batch["image_id"].tolist() == [1, 2, 3] and batch["boxes_lengths"].tolist() == [2, 1, 0]
    assert batch["boxes"].shape == (3, 2, 4) and batch["boxes"][1, 0].tolist() == [1, 2, 7, 10]
    assert batch["categories"].tolist() == [[1, 2], [2, -1], [-1, -1]]


def test_missing_image_file_fails_its_read_naming_it(basic):
    import ingest
    os.remove(basic.parent.parent / "img" / "000002.jpg")
    loader = ingest.Loader(open_coco(basic), batch_size=3, output="dict", shuffle=False)
    with pytest.raises(SourceError, match="000002.jpg: cannot read"):
        next(iter(loader))


# -- malformed files ---------------------------------------------------------------------------------------

def good(aid=1, image_id=1):
    return ann(aid, image_id, [1, 1, 5, 5])


@pytest.mark.parametrize("bad, message", [
    (ann(7, 1, [1, 1, -3, 5]), r"annotations\[1\] \(id 7\): bbox .* negative width or height"),
    (ann(7, 1, [1, 1, 3, 5], 42), r"annotations\[1\] \(id 7\): category_id 42 is not in categories"),
    (ann(7, 1, [1, 1, 3, 5], segmentation={"size": [10, 30], "counts": [300]}), r"RLE size \[10, 30\] differs"),
    (ann(7, 1, [1, 1, 3, 5], segmentation={"size": [20, 30], "counts": [5, 10]}), "RLE counts sum to 15, not"),
    (ann(7, 1, [1, 1, 3, 5], segmentation={"size": [20, 30], "counts": "0;"}), "RLE counts sum to 11, not"),
    (ann(7, 1, [1, 1, 3, 5], segmentation={"size": [20, 30], "counts": "0 ~"}), "not valid COCO RLE"),
    (ann(7, 1, [1, 1, 3, 5], segmentation=[[1, 1, 5, 1, 5]]), "odd number of coordinates"),
    (ann(7, 1, [1, 1, 3, 5], segmentation=[[1, 1, 5, None, 5, 5]]), "must be finite numbers"),
    (ann(7, 1, [1, 1, 3, 5], segmentation=[[1, 1, 5, "1.5", 5, 5]]), "must be finite numbers"),
    (ann(7, 1, [1, 1, 3, 5], segmentation=[{"size": [20, 30], "counts": [600]}]), "must be a list of coordinates"),
    (ann(7, 1, [1, 1, 3, 5], iscrowd=2), "iscrowd must be 0 or 1"),
    (ann(7, 1, [1, 1, "3", 5]), "bbox must be 4 finite numbers"),
    (ann(7, 1, [float("inf"), 1, 3, 5]), "coordinates must be finite numbers"),
    (ann(7, 1, [1, 1, 3, 5], area=-1), "area must be a number >= 0"),
])
def test_a_bad_annotation_fails_its_image_only(tmp_path, bad, message):
    path = write_coco(tmp_path, [good(), bad, good(2, 2)])
    source = open_coco(path)
    with pytest.raises(CorruptRecordError, match=message) as info:
        fields(source, 0)
    assert str(path) in str(info.value) and info.value.path == str(path)
    assert len(fields(source, 1)["boxes"]) == 1  # other images read normally
    summary = source.summary()
    assert summary["invalid_images"] == 1 and "(id 7)" in summary["first_error"]
    assert open_coco(path, skip_empty=True, image_ids=[1]).image_ids.tolist() == [1]  # still reported


def test_image_without_size_fails_its_reads(tmp_path):
    path = write_coco(tmp_path, [good()])
    data = json.loads(path.read_text())
    data["images"][0]["height"] = None
    path.write_text(json.dumps(data))
    with pytest.raises(CorruptRecordError, match=r"images\[0\] \(id 1\): width and height"):
        fields(open_coco(path), 0)


@pytest.mark.parametrize("change, error, message", [
    (lambda d: d["annotations"].append(ann(9, 99, [0, 0, 1, 1])), CorruptRecordError,
     r"annotations\[1\] \(id 9\): image_id 99 is not in images"),
    (lambda d: d["images"].append(dict(d["images"][0])), CorruptRecordError, "image id 1 appears more than once"),
    (lambda d: d["categories"].append({"id": 1, "name": "x"}), CorruptRecordError, "category id 1 appears more"),
    (lambda d: d["images"][0].update(file_name=None), CorruptRecordError, "'file_name' must be a path"),
    (lambda d: d.pop("images"), SourceError, "not a COCO instances file"),
])
def test_structural_errors_raise_at_open(tmp_path, change, error, message):
    path = write_coco(tmp_path, [good()])
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(error, match=message) as info:
        open_coco(path)
    assert str(path) in str(info.value)


def test_not_json_and_results_files_are_told_apart(tmp_path):
    bad = tmp_path / "instances.json"
    bad.write_text('{"images": [')
    with pytest.raises(SourceError, match="is not valid JSON"):
        CocoSource(bad, cache=False)
    bad.write_text(json.dumps([{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": 0.5}]))
    with pytest.raises(SourceError, match=r"results file \(1 detections.*CocoSource.results"):
        CocoSource(bad, cache=False)


# -- repairs -----------------------------------------------------------------------------------------------

def test_boxes_outside_the_image_are_clipped_and_empty_ones_dropped(tmp_path):
    anns = [ann(1, 1, [-4, 2, 10, 30]),    # image 1 is 20 x 30: clipped to [0, 2, 6, 18]
            ann(2, 1, [40, 2, 5, 5]),      # entirely right of the image: empty after clipping
            ann(3, 1, [3, 3, 0, 4]),       # zero width
            ann(4, 1, [1, 1, 2, 2])]
    path = write_coco(tmp_path, anns)
    with pytest.warns(UserWarning, match="1 clipped boxes, 2 empty boxes dropped"):
        source = open_coco(path)
    got = fields(source, 0)
    np.testing.assert_array_equal(got["boxes"], [[0, 2, 6, 18], [1, 1, 2, 2]])
    assert source.repairs["clipped_boxes"] == 1 and source.repairs["empty_boxes_dropped"] == 2
    assert got["area"].tolist() == [300, 4]  # COCO's area is kept as written


def test_null_fields_are_repaired_like_pycocotools_would_compute_them(tmp_path):
    seg = [[2.5, 3.0, 14.0, 3.5, 9.0, 15.0], [1, 1, 3, 3]]  # the second part is 2 points: no pixels
    anns = [ann(1, 1, None, segmentation=seg, area=None, iscrowd=None)]
    path = write_coco(tmp_path, anns, categories=((1, None),))
    with pytest.warns(UserWarning, match="null iscrowd"):
        source = open_coco(path, masks="masks")
    rle = mask_utils.merge(mask_utils.frPyObjects(seg[:1], 20, 30))
    got = fields(source, 0)
    np.testing.assert_allclose(got["boxes"][0], mask_utils.toBbox(rle))
    assert got["area"][0] == mask_utils.area(rle) and got["iscrowd"].tolist() == [0]
    np.testing.assert_array_equal(got["masks"][0], mask_utils.decode(rle))
    assert source.classes == ["__background__", "1"]
    assert source.repairs == {"clipped_boxes": 0, "empty_boxes_dropped": 0, "null_iscrowd": 1, "null_area": 1,
                              "null_bbox": 1, "short_polygon_parts": 1, "null_category_name": 1}


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 12), st.integers(0, 2 ** 32 - 1))
def test_rle_string_total_reads_pycocotools_strings(h, w, seed):
    mask = np.random.default_rng(seed).random((h, w)) < 0.4
    counts = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"]
    assert coco_index.rle_string_total(counts) == h * w
    assert coco_index.rle_string_total(counts + b"1") != h * w


# -- the parse cache ---------------------------------------------------------------------------------------

def test_cache_is_used_then_invalidated(basic, tmp_path, monkeypatch):
    first = open_coco(basic, cache=tmp_path / "cache")
    cached = list((tmp_path / "cache").iterdir())
    assert len(cached) == 1 and cached[0].name.startswith(".instances.json.")

    def no_parse(path):
        raise AssertionError("the JSON was parsed again")
    monkeypatch.setattr(coco_index, "load_json", no_parse)
    again = open_coco(basic, cache=tmp_path / "cache", box_format="ltrb", skip_empty=True)  # options: no reparse
    assert len(again) == 2 and fields(again, 0)["boxes"].tolist()[0] == [3, 4, 13, 9]
    assert fields(first, 0)["image_id"] == 1
    monkeypatch.undo()

    data = json.loads(basic.read_text())
    data["annotations"][0]["bbox"] = [2, 2, 3, 3]
    basic.write_text(json.dumps(data))
    changed = open_coco(basic, cache=tmp_path / "cache")
    assert fields(changed, 1)["boxes"].tolist() == [[2, 2, 3, 3]]
    assert len(list((tmp_path / "cache").iterdir())) == 1  # replaced, not piled up


def test_cache_location_and_opt_out(basic, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    open_coco(basic, cache=True)
    assert len(list((tmp_path / "xdg" / "ingest").iterdir())) == 1
    assert not [p.name for p in basic.parent.iterdir() if p.name.endswith(".ingest-coco")]  # data untouched
    monkeypatch.undo()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    open_coco(basic, cache=False)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    with pytest.raises(ConfigError, match="cache"):
        open_coco(basic, cache=3)


def test_a_damaged_or_unwritable_cache_costs_only_speed(basic, tmp_path, monkeypatch):
    open_coco(basic, cache=tmp_path / "cache")
    (cached,) = (tmp_path / "cache").iterdir()
    (cached / "ann_box.npy").write_bytes(b"not an array")
    parses = []
    real = coco_index.load_json
    monkeypatch.setattr(coco_index, "load_json", lambda path: parses.append(path) or real(path))
    assert fields(open_coco(basic, cache=tmp_path / "cache"), 0)["boxes"].tolist() == [[3, 4, 10, 5], [0, 0, 4, 4]]
    assert parses == [str(basic)]
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache directory would go")
    with pytest.warns(UserWarning, match="could not write the COCO annotation cache"):
        unwritable = open_coco(basic, cache=blocker)
    assert fields(pickle.loads(pickle.dumps(unwritable)), 1)["boxes"].tolist() == [[1, 2, 6, 8]]


def test_pickled_source_maps_the_cache_instead_of_carrying_it(basic, tmp_path):
    source = open_coco(basic, cache=tmp_path / "cache", masks="masks")
    blob = pickle.dumps(source)
    assert b"coords" not in blob and b"img_file" not in blob
    clone = pickle.loads(blob)
    for i in range(len(source)):
        for k, v in fields(source, i).items():
            np.testing.assert_array_equal(fields(clone, i)[k], v)
    uncached = open_coco(basic, cache=False)
    assert fields(pickle.loads(pickle.dumps(uncached)), 0)["categories"].tolist() == [1, 2]
    basic.write_text(basic.read_text() + " ")
    open_coco(basic, cache=tmp_path / "cache")  # rebuilt under the clone
    with pytest.raises(SourceError, match="changed or vanished"):
        pickle.loads(blob)


# -- real files written by other tools ---------------------------------------------------------------------

def agree_with_pycocotools(source: CocoSource, truth: COCO, ids=None) -> None:
    """Boxes, categories, areas, crowd flags and (when the source has them) masks of every image, where
    the source holds the images ``ids`` (default: all of ``truth``'s)."""
    assert source.image_ids.tolist() == sorted(truth.getImgIds() if ids is None else ids)
    for i, iid in enumerate(source.image_ids.tolist()):
        anns = truth.imgToAnns.get(iid, [])
        got = source.parse(i, b"").fields  # the targets are compared, not the images
        xywh = np.array([a["bbox"] for a in anns], np.float64).reshape(-1, 4)
        want = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)   # the reader's default: xyxy
        np.testing.assert_allclose(got["boxes"], want, rtol=1e-6)
        assert got["categories"].tolist() == [a["category_id"] for a in anns]
        np.testing.assert_allclose(got["area"], [a["area"] for a in anns], rtol=1e-6)
        assert got["iscrowd"].tolist() == [a.get("iscrowd", 0) for a in anns]
        if "masks" in got and anns:
            assert np.array_equal(got["masks"], np.stack([truth.annToMask(a) for a in anns]))


def test_official_coco_subset_agrees_with_pycocotools():
    root = realworld("coco/tiny_coco_train2017")
    path = root / "instances_train2017_small.json"
    source = CocoSource(path, images=root / "train_2017_small", masks="masks", contiguous_ids=False, cache=False)
    check_format(source)
    truth = COCO(str(path))
    agree_with_pycocotools(source, truth)
    assert [source.classes[c["id"]] for c in truth.dataset["categories"]] == \
        [c["name"] for c in truth.dataset["categories"]]
    summary = source.summary()
    assert (summary["images"], summary["annotations"], summary["categories"], summary["crowd"]) == (16, 197, 80, 1)
    assert sum(summary["per_category"].values()) == 197 and summary["repairs"]["clipped_boxes"] == 0


def test_labelme_export_with_null_fields():
    path = realworld("coco/labelme_voc_sample") / "annotations.json"
    source = CocoSource(path, masks="masks", contiguous_ids=False, cache=False)  # file_name: JPEGImages/...
    check_format(source)
    agree_with_pycocotools(source, COCO(str(path)))
    assert source.classes[0] == "_background_" and source.summary()["annotations"] == 12


def results_ground_truth(tmp_path: Path) -> Path:
    """A ground-truth file holding the images the cocoapi demo results refer to (sizes from the segm RLEs)."""
    results = realworld("coco/cocoapi_results")
    sizes = {r["image_id"]: r["segmentation"]["size"]
             for r in json.loads((results / "instances_val2014_fakesegm100_results.json").read_text())}
    for r in json.loads((results / "person_keypoints_val2014_fakekeypoints100_results.json").read_text()):
        sizes.setdefault(r["image_id"], [640, 640])
    gt = {"images": [{"id": i, "file_name": f"{i}.jpg", "height": h, "width": w} for i, (h, w) in sizes.items()],
          "categories": [{"id": i, "name": str(i)} for i in range(1, 91)], "annotations": []}
    path = tmp_path / "instances_val2014.json"
    path.write_text(json.dumps(gt))
    return path


@pytest.mark.parametrize("name, masks", [("instances_val2014_fakebbox100_results.json", True),
                                         ("instances_val2014_fakesegm100_results.json", True),
                                         ("person_keypoints_val2014_fakekeypoints100_results.json", False)])
def test_results_files_agree_with_load_res(tmp_path, name, masks):
    gt = results_ground_truth(tmp_path)
    path = realworld("coco/cocoapi_results") / name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # keypoint results hold one zero-size box, dropped (a repair)
        source = CocoSource.results(path, gt, contiguous_ids=False, cache=tmp_path)
    res = COCO(str(gt)).loadRes(str(path))
    if not masks:  # drop what the reader drops: the empty boxes
        res.imgToAnns = {i: [a for a in anns if a["bbox"][2] > 0 and a["bbox"][3] > 0]
                         for i, anns in res.imgToAnns.items()}
        assert source.repairs["empty_boxes_dropped"] == 1
    agree_with_pycocotools(source, res)
    if masks:  # the masks of 12 images (all of them take seconds)
        ids = source.image_ids[:12].tolist()
        agree_with_pycocotools(CocoSource.results(path, gt, contiguous_ids=False, cache=tmp_path, masks="masks",
                                                  image_ids=ids), res, ids)
    scores = np.concatenate([source.parse(i, b"").fields["scores"] for i in range(len(source))])
    assert len(scores) == sum(map(len, res.imgToAnns.values()))
    np.testing.assert_allclose(np.sort(scores), np.sort([a["score"] for anns in res.imgToAnns.values()
                                                         for a in anns]), rtol=1e-6)


def test_results_need_their_images_in_the_ground_truth(tmp_path):
    gt = write_coco(tmp_path, [])
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": 5, "category_id": 1, "bbox": [0, 0, 2, 2], "score": 0.9}]))
    with pytest.raises(CorruptRecordError, match=r"results\[0\] .*image_id 5 is not in images") as info:
        CocoSource.results(results, gt, cache=False)
    assert info.value.path == str(results)
    with pytest.raises(ConfigError, match="Unknown option.* ltrb. Available: allow_outside_root, box_format, cache"):
        CocoSource.results(results, gt, ltrb=True)
