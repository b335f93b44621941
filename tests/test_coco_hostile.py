"""COCO files written by an adversary: no read outside the images root, no unbounded read, and every malformed
value a typed ingest error naming the file (and the image or annotation), never a Python or numpy one."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from conftest import jpeg_bytes
from test_coco import SQUARE, ann, write_coco

from ingest.errors import CorruptRecordError, IngestError, OutsideRootError, SourceError
from ingest.formats import read_location
from ingest.formats.coco import CocoSource
from ingest.tools.verify import verify


def open_coco(path, **kw) -> CocoSource:
    kw.setdefault("cache", False)
    return CocoSource(path, images=Path(path).parent.parent / "img", **kw)


def read(source, i):
    return source.parse(i, read_location(source.locate(i)))


def with_file_name(root: Path, name: str) -> Path:
    """An instances file of one image (20 x 30, its JPEG in root/img) whose file_name is ``name``."""
    path = write_coco(root, [ann(10, 1, [1, 2, 6, 8])], images=((1, 20, 30),))
    data = json.loads(path.read_text())
    data["images"][0]["file_name"] = name
    path.write_text(json.dumps(data))
    return path


def test_file_names_leading_outside_the_root_are_refused(tmp_path):
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(jpeg_bytes(20, 30, seed=9))
    (tmp_path / "img" / "sub").mkdir(parents=True)
    (tmp_path / "img" / "link.jpg").symlink_to(secret)
    for name in ("../secret.jpg", str(secret), "link.jpg", "sub/../../secret.jpg"):
        source = open_coco(with_file_name(tmp_path, name))
        with pytest.raises(OutsideRootError, match="leads outside the images root") as info:
            source.locate(0)
        assert "instances.json" in str(info.value) and "image id 1" in str(info.value)
        allowed = open_coco(with_file_name(tmp_path, name), allow_outside_root=True)
        assert read(allowed, 0).image == secret.read_bytes()


def test_only_regular_files_within_the_size_bound_are_read(tmp_path):
    source = open_coco(with_file_name(tmp_path, "/dev/zero"), allow_outside_root=True)
    with pytest.raises(SourceError, match="not a regular file"):
        source.locate(0)
    path = with_file_name(tmp_path, "000001.jpg")
    size = (tmp_path / "img" / "000001.jpg").stat().st_size
    with pytest.raises(SourceError, match=f"{size} bytes, over `max_bytes` {size - 1}"):
        open_coco(path, max_bytes=size - 1).locate(0)
    assert open_coco(path, max_bytes=size).locate(0).length == size


def test_verify_names_an_image_outside_the_root_and_reads_no_device(tmp_path):
    path = with_file_name(tmp_path, "/dev/zero")
    report = verify(str(path))
    assert report.records == 0 and len(report.problems) == 1
    where, reason = report.problems[0]
    assert "OutsideRootError" in reason and "/dev/zero" in reason


BIG = 2 ** 63
DEEP = "[" * 100_000 + "]" * 100_000


def _edit(data, image=None, annotation=None, top=None):
    data = copy.deepcopy(data)
    data["images"][0].update(image or {})
    data["annotations"][0].update(annotation or {})
    data.update(top or {})
    return data


# (name, edit, error, what its message says); error None: the file opens and sample 0's read raises it
HOSTILE = [
    ("image id >= 2**63", dict(image={"id": BIG}), CorruptRecordError, "images\\[0\\]: 'id' must be a 64-bit"),
    ("category id >= 2**63", dict(top={"categories": [{"id": BIG, "name": "x"}]}), CorruptRecordError,
     "categories\\[0\\]: 'id' must be a 64-bit"),
    ("categories: 5", dict(top={"categories": 5}), SourceError, "'categories' must be a list"),
    ("width >= 2**63", dict(image={"width": BIG}), None, "images\\[0\\] \\(id 1\\): width and height"),
    ("bbox past a double", dict(annotation={"bbox": [10 ** 400, 1, 2, 3]}), None, "annotations\\[0\\] \\(id 10\\)"),
    ("area past a double", dict(annotation={"area": 10 ** 400}), None, "annotations\\[0\\] \\(id 10\\)"),
    ("polygon past a double", dict(annotation={"segmentation": [[10 ** 400, 1, 5, 1, 5, 5]]}), None,
     "annotations\\[0\\] \\(id 10\\): coordinates"),
    ("nested polygon", dict(annotation={"segmentation": [[[1, [2]], 1, 5, 1, 5, 5], SQUARE[0]]}), None,
     "annotations\\[0\\] \\(id 10\\): coordinates"),
    ("RLE count >= 2**32", dict(annotation={"segmentation": {"size": [20, 30], "counts": [2 ** 40]}}), None,
     "annotations\\[0\\] \\(id 10\\): uncompressed RLE counts"),
    ("NUL in file_name", dict(image={"file_name": "a\0b.jpg"}), None, "image id 1: file_name .* NUL"),
    ("lone surrogate in file_name", dict(image={"file_name": "\ud800.jpg"}), None,
     "image id 1: file_name .* not valid Unicode"),
    ("declared size is not the image's", dict(image={"width": 300, "height": 200}), None,
     "image id 1 .* declares width x height 300 x 200, but the image is 30 x 20"),
]


@pytest.mark.parametrize("case,edit,error,says", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_malformed_values_are_typed_errors_naming_the_file(tmp_path, case, edit, error, says):
    path = write_coco(tmp_path, [ann(10, 1, [1, 2, 6, 8])], images=((1, 20, 30),))
    data = _edit(json.loads(path.read_text()), **edit)
    path.write_bytes(json.dumps(data).encode("utf-8", "surrogatepass"))
    if error is not None:
        with pytest.raises(error, match=says) as info:
            open_coco(path)
    else:
        source = open_coco(path, masks="masks")
        with pytest.raises(IngestError, match=says) as info:
            read(source, 0)
    assert str(path) in str(info.value)


def test_deeply_nested_json_is_a_source_error(tmp_path):
    path = write_coco(tmp_path, [ann(10, 1, [1, 2, 6, 8])], images=((1, 20, 30),))
    path.write_text(path.read_text()[:-1] + f', "extra": {DEEP}}}')
    with pytest.raises(SourceError, match="nests deeper") as info:
        open_coco(path)
    assert str(path) in str(info.value)


def test_a_declared_size_check_can_be_turned_off(tmp_path):
    path = write_coco(tmp_path, [ann(10, 1, [1, 2, 6, 8])], images=((1, 20, 30),))
    data = _edit(json.loads(path.read_text()), image={"width": 300, "height": 200})
    path.write_text(json.dumps(data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        record = read(open_coco(path, check_sizes=False, box_format="xywh"), 0)
    np.testing.assert_array_equal(record.fields["boxes"], [[1, 2, 6, 8]])


_UNDER_CAP = """
import resource, sys
from ingest.errors import CorruptRecordError
from ingest.formats import read_location
from ingest.formats.coco import CocoSource
source = CocoSource(sys.argv[1], images=sys.argv[2], masks="masks", cache=False)
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), resource.RLIM_INFINITY))
try:
    source.parse(0, read_location(source.locate(0)))
except CorruptRecordError as err:
    print("refused:", err)
"""


def test_masks_beyond_the_address_space_are_refused_not_a_crash(tmp_path):
    """600 RLE masks of 1000 x 1000 (600 MB, under MAX_MASK_BYTES) with 512 MB of address space left."""
    h = w = 1000
    rle = {"size": [h, w], "counts": [h * w // 2, h * w - h * w // 2]}
    anns = [ann(k + 1, 1, [1, 1, 5, 5], segmentation=rle, iscrowd=1) for k in range(600)]
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "000001.jpg").write_bytes(jpeg_bytes(h, w, seed=1))
    data = {"images": [{"id": 1, "file_name": "000001.jpg", "height": h, "width": w}],
            "categories": [{"id": 1, "name": "cat"}], "annotations": anns}
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, "-c", _UNDER_CAP, str(path), str(tmp_path / "img")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout and "do not fit in memory" in proc.stdout and str(path) in proc.stdout


# -- fuzz: any JSON value at any place of a valid file ----------------------------------------------------

_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2 ** 70, max_value=2 ** 70),
                    st.sampled_from([2 ** 63, -2 ** 63 - 1, 2 ** 64, 10 ** 400, 0, -1, 1, 1e308, -0.0]),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=6), st.sampled_from(["\0", "\ud800", "../x.jpg", "/dev/zero", "", "a/../b"]))
_VALUES = st.recursive(_LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=7),
                                                        st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                       max_leaves=12)


def _paths(node, prefix=()):
    """Every path (a tuple of keys and indices) into a JSON document."""
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _paths(child, (*prefix, key))


def _replaced(node, path, value):
    if not path:
        return value
    node = copy.copy(node)
    node[path[0]] = _replaced(node[path[0]], path[1:], value)
    return node


@pytest.fixture(scope="module")
def seed_coco(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    rle = {"size": [24, 16], "counts": [100, 50, 234]}
    path = write_coco(root, [ann(10, 1, [1, 2, 6, 8]), ann(11, 2, [0, 0, 4, 4], 2, iscrowd=1, segmentation=rle),
                             ann(12, 1, [3, 3, 5, 5], 1, segmentation=None)])
    return path, json.loads(path.read_text())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_coco_json_gives_records_or_ingest_errors(seed_coco, data):
    """Replace up to three places of a valid instances file by random JSON values: opening it and reading
    every image (boxes, masks and polygons) gives records or IngestErrors, never another exception, and
    never reads a file outside the images root."""
    path, doc = seed_coco
    for _ in range(data.draw(st.integers(1, 3))):
        place = data.draw(st.sampled_from(list(_paths(doc))))
        doc = _replaced(doc, place, data.draw(_VALUES))
    path.write_bytes(json.dumps(doc).encode("utf-8", "surrogatepass"))
    root = path.parent.parent / "img"
    for masks in ("masks", "polygons"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                source = open_coco(path, masks=masks)
        except IngestError:
            continue
        for i in range(len(source)):
            try:
                loc = source.locate(i)
                assert os.path.realpath(loc.path).startswith(str(root.resolve()) + os.sep)
                source.parse(i, read_location(loc))
            except IngestError:
                pass
