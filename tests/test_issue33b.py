"""Regression tests of issue 33's defects 1, 2, 8 and the rest of 9: fields and their kinds through a
conversion, one box convention, one batch type per Loader, a quick command line."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import jpeg_bytes, make_image_folder

REPO = Path(__file__).resolve().parents[1]


def _python(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, env=env)


# -- 9: --help and --version load no torch; a torchvision transform in ops ------------------------------------

@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_do_not_import_torch(flag):
    out = _python("-X", "importtime", "-m", "ingest.tools.cli", flag)
    assert out.returncode == 0, out.stderr
    assert ("usage: ingest" in out.stdout) if flag == "--help" else out.stdout.startswith("ingest ")
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time")}
    assert "ingest.tools" in imported   # the command line ran (as __main__, not listed itself)
    assert not {m for m in imported if m.split(".")[0] in ("torch", "numpy")}, "--help imported torch or numpy"


def test_the_lazy_package_still_gives_its_submodules_as_attributes():
    """``import ingest`` loads nothing heavy, yet ``ingest.ops.Resize`` works as it did from an eager package."""
    out = _python("-c", "import ingest, sys; print('torch' in sys.modules); print(ingest.ops.Resize.__name__, "
                        "ingest.Loader.__name__)\ntry:\n    ingest.nothing\nexcept AttributeError: print('missing')")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "Resize", "Loader", "missing"]


def test_every_subcommand_is_listed_and_runs_its_own_help():
    out = _python("-m", "ingest.tools.cli", "--help")
    for name in ("demo", "convert", "index", "verify", "inspect"):
        assert re.search(rf"^\s+{name}\s+\S", out.stdout, re.M), name
    out = _python("-m", "ingest.tools.cli", "inspect", "--help")
    assert out.returncode == 0 and "usage: ingest inspect" in out.stdout


def test_a_torchvision_v1_transform_in_ops_is_a_clear_config_error(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    import ingest
    from ingest.errors import ConfigError
    from torchvision.transforms import v2
    root = make_image_folder(tmp_path / "t", {"a": 2}, size=(20, 24))
    with pytest.raises(ConfigError, match=r"ops\[0\] .*not an op.*torchvision.transforms.v2"):
        ingest.Loader(str(root), batch_size=2, ops=[torchvision.transforms.RandomHorizontalFlip()])
    images, _ = next(iter(ingest.Loader(str(root), batch_size=2, ops=[ingest.ops.Resize((16, 16)),
                                                                      v2.RandomHorizontalFlip(p=1.0)])))
    assert images.shape == (2, 3, 16, 16)


# -- 8: one batch type per Loader ------------------------------------------------------------------------------

def _mixed(tmp_path: Path) -> Path:
    """Six images: the first batch of two has one size, the others differ within their batch."""
    root = tmp_path / "mixed" / "a"
    root.mkdir(parents=True)
    for i, (h, w) in enumerate([(20, 24), (20, 24), (20, 24), (30, 18), (16, 16), (22, 40)]):
        (root / f"{i}.jpg").write_bytes(jpeg_bytes(h, w, seed=i))
    return root.parent


def test_images_of_different_sizes_without_a_size_op_are_a_clear_error(tmp_path):
    import ingest
    from ingest.errors import ConfigError
    loader = ingest.Loader(str(_mixed(tmp_path)), batch_size=2)
    batches = iter(loader)
    assert isinstance(next(batches)[0], torch.Tensor)   # same sizes: a tensor ...
    with pytest.raises(ConfigError, match=r"differ in size .*Resize\(\(h, w\)\), CenterCrop, RandomResizedCrop.*"
                                          r"ragged=True"):
        next(batches)                                   # ... and different ones never a list
    loader.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_ragged_always_gives_lists_and_dense_always_tensors(tmp_path, workers):
    import ingest
    root = str(_mixed(tmp_path))
    with ingest.Loader(root, batch_size=2, ragged=True, num_workers=workers) as loader:
        batches = [images for images, _ in loader]
    assert all(isinstance(b, list) and len(b) == 2 for b in batches)
    assert [tuple(im.shape) for im in batches[0]] == [(3, 20, 24)] * 2
    assert tuple(batches[1][1].shape) == (3, 30, 18)
    with ingest.Loader(root, batch_size=2, ragged=True, ops=[ingest.ops.Resize((8, 8))], output="dict") as loader:
        assert all(isinstance(b["images"], list) and b["images"][0].shape == (3, 8, 8) for b in loader)
    with ingest.Loader(root, batch_size=2, ops=[ingest.ops.CenterCrop(12)], num_workers=workers) as loader:
        assert all(isinstance(images, torch.Tensor) and images.shape == (2, 3, 12, 12) for images, _ in loader)


def test_ragged_must_be_a_bool():
    import ingest
    from ingest.errors import ConfigError
    with pytest.raises(ConfigError, match="`ragged` must be True or False"):
        ingest.Loader([jpeg_bytes(8, 8)], batch_size=1, ragged="yes")


# -- 2: boxes come out in the format asked for, from every reader ------------------------------------------------

def _boxes_coco(tmp_path: Path) -> Path:
    """Three 60x80 images with COCO bboxes (xywh) [4, 10, 30, 20] and [60, 40, 12, 10]."""
    from test_detection import _coco
    return _coco(tmp_path, n=3)


XYWH = np.array([[4, 10, 30, 20], [60, 40, 12, 10]], dtype=np.float32)
WANT = {"xyxy": np.array([[4, 10, 34, 30], [60, 40, 72, 50]]), "xywh": XYWH,
        "cxcywh": np.array([[19, 20, 30, 20], [66, 45, 12, 10]])}


def test_box_format_conversions_round_trip():
    from ingest.errors import ConfigError
    from ingest.formats.boxes import BOX_FORMATS, box_format, convert
    for src in BOX_FORMATS:
        for dst in BOX_FORMATS:
            np.testing.assert_allclose(convert(WANT[src], src, dst), WANT[dst])
    np.testing.assert_allclose(convert(WANT["xyxy"], "ltrb", "xywh"), XYWH)   # ltrb: xyxy's other name
    assert box_format("ltrb") == "xyxy"
    with pytest.raises(ConfigError, match="xyxy, xywh, cxcywh"):
        box_format("yolo")


@pytest.mark.parametrize("fmt", ["tfrecord", "wds", "lmdb"])
def test_every_reader_gives_the_box_format_asked_for_and_xyxy_by_default(tmp_path, fmt):
    from ingest.formats import open_source
    from ingest.formats.base import iter_records
    from ingest.formats.coco import CocoSource
    from ingest.tools.convert import convert
    path = _boxes_coco(tmp_path)
    images = str(tmp_path / "img")
    first = lambda src: next(iter_records(src))[1].fields["boxes"]   # noqa: E731
    assert CocoSource(path, images=images, cache=False).box_format == "xyxy"
    np.testing.assert_allclose(first(CocoSource(path, images=images, cache=False)), WANT["xyxy"])
    for stored in ("xywh", "cxcywh"):   # what the converter read (and the writer records)
        out = tmp_path / f"{fmt}-{stored}"
        convert(str(path), str(out), to=fmt, source_options={"images": images, "box_format": stored,
                                                              "masks": "polygons"}, progress=False)
        np.testing.assert_allclose(first(open_source(str(out))), WANT["xyxy"], atol=1e-3)
        for wanted in ("xyxy", "xywh", "cxcywh", "ltrb"):
            src = open_source(str(out), box_format=wanted)
            assert src.box_format == ("xyxy" if wanted == "ltrb" else wanted)
            np.testing.assert_allclose(first(src), WANT[src.box_format], atol=1e-3)
            np.testing.assert_allclose(first(CocoSource(path, images=images, cache=False, box_format=wanted)),
                                       WANT[src.box_format])


def test_box_format_is_refused_by_a_reader_without_boxes(tmp_path):
    from ingest.errors import ConfigError
    from ingest.formats import open_source
    root = make_image_folder(tmp_path / "t", {"a": 1})
    with pytest.raises(ConfigError, match="no option 'box_format'"):
        open_source(str(root), box_format="xywh")


@pytest.mark.parametrize("box_format", ["xyxy", "xywh", "cxcywh"])
def test_ops_and_detection_targets_give_torchvision_xyxy_whatever_the_format(tmp_path, box_format):
    import ingest
    from ingest.ops import Flip, Resize
    path = _boxes_coco(tmp_path)
    loader = ingest.Loader(str(path), batch_size=3, output="dict", ops=[Flip(p=1.0), Resize((30, 160))],
                           reader_options={"images": str(tmp_path / "img"), "box_format": box_format})
    batch = next(iter(loader))
    loader.close()
    # flipped in an 80-wide image, then x * 2, y / 2: xyxy [(80 - 34) * 2, 5, (80 - 4) * 2, 15], ...
    want = np.array([[92, 5, 152, 15], [16, 20, 40, 25]], dtype=np.float32)
    from ingest.formats.boxes import convert
    np.testing.assert_allclose(batch["boxes"][0].numpy(), convert(want, "xyxy", box_format), atol=1e-4)
    targets = ingest.torch.detection_targets(batch, box_format=box_format)
    np.testing.assert_allclose(targets[0]["boxes"].numpy(), want, atol=1e-4)


# -- 1: every field goes through a conversion with its name and kind, or the conversion says why not ----------

KINDS = {"image": "image", "label": "int", "image/height": "int", "score": "float", "image/object/ids": "ints",
         "weights": "floats", "caption": "text", "image/filename": "bytes", "embedding": "array"}


def _value(kind: str, i: int):
    return {"int": 20 + i, "float": 0.5 + i, "ints": np.arange(i + 1, dtype=np.int64),
            "floats": np.linspace(0, 1, i + 2).astype(np.float32), "text": f"a caption {i}",
            "bytes": b"file-%d.jpg" % i, "array": np.full((2, 3), i, dtype=np.int16)}[kind]


def _every_kind(tmp_path: Path) -> str:
    from ingest.formats.base import Field, Record
    from ingest.formats.lmdb import LMDBWriter
    fields = {name: Field(kind) for name, kind in KINDS.items()}
    writer = LMDBWriter(tmp_path, "src", fields)
    for i in range(3):
        writer.add(Record(jpeg_bytes(20, 24, seed=i), i % 2,
                          {name: _value(kind, i) for name, kind in KINDS.items() if name not in ("image", "label")}))
    writer.close()
    return str(tmp_path / "src.lmdb")


def _same_records(a, b) -> None:
    from ingest.formats.base import fields_of, iter_records
    assert {n: f.kind for n, f in fields_of(b).items()} == {n: f.kind for n, f in fields_of(a).items()} == KINDS
    for (_, x), (_, y) in zip(iter_records(a), iter_records(b)):
        assert bytes(x.image) == bytes(y.image) and x.label == y.label
        for name, value in x.fields.items():
            got = y.fields[name]
            if isinstance(value, (bytes, str, int, float)):
                assert got == value and type(got) is type(value), (name, got, value)
            else:
                np.testing.assert_array_equal(np.asarray(got), value)
                assert np.asarray(got).dtype == value.dtype, name


@pytest.mark.parametrize("chain", [["wds"], ["tfrecord"], ["lmdb"], ["wds", "tfrecord", "wds"],
                                   ["tfrecord", "wds", "tfrecord"]])
def test_every_field_keeps_its_name_kind_and_value_through_conversions(tmp_path, chain):
    from ingest.formats import open_source
    from ingest.tools.convert import convert
    src = _every_kind(tmp_path)
    first = open_source(src)
    for k, fmt in enumerate(chain):
        out = str(tmp_path / f"{k}-{fmt}")
        convert(src, out, to=fmt, progress=False)
        src = out
    _same_records(first, open_source(src))


def test_what_a_reader_does_not_read_is_listed_and_never_dropped_silently(tmp_path):
    from ingest.errors import ConfigError
    from ingest.formats import _protos, open_source
    from ingest.tools.convert import convert
    from ingest.formats.tfrecord import _write_index_file, frame
    example = _protos.Example()
    fmap = example.features.feature
    fmap["image/encoded"].bytes_list.value.append(jpeg_bytes(20, 24))
    fmap["image/format"].bytes_list.value.append(b"jpeg")
    fmap["image/filename"].bytes_list.value.append(b"0001.jpg")
    fmap["image/height"].int64_list.value.append(20)
    fmap["image/object/class/text"].bytes_list.value.extend([b"cat", b"dog"])
    data = frame(example.SerializeToString())
    (tmp_path / "a.tfrecord").write_bytes(data)
    src = open_source(str(tmp_path / "a.tfrecord"))
    assert {n: f.kind for n, f in src.fields.items()} == {"image": "image", "image/filename": "bytes",
                                                           "image/height": "ints"}
    assert list(src.unread) == ["image/object/class/text"]   # image/format: the writer derives it
    out = _python("-m", "ingest.tools.cli", "inspect", str(tmp_path / "a.tfrecord"))
    assert "not read: image/object/class/text" in out.stdout
    with pytest.raises(ConfigError, match=r"would lose .*image/object/class/text.*--drop image/object/class/text"):
        convert(str(tmp_path / "a.tfrecord"), str(tmp_path / "out"), to="wds", progress=False)
    convert(str(tmp_path / "a.tfrecord"), str(tmp_path / "out"), to="wds", progress=False,
            drop_fields=["image/object/class/text"])
    back = open_source(str(tmp_path / "out"))
    assert {n: f.kind for n, f in back.fields.items()} == {n: f.kind for n, f in src.fields.items()}


def test_coco_segmentation_is_converted_or_refused_by_name(tmp_path):
    from ingest.errors import ConfigError
    from ingest.formats import open_source
    from ingest.tools.convert import convert
    path = _boxes_coco(tmp_path)
    images = {"images": str(tmp_path / "img")}
    with pytest.raises(ConfigError, match=r"segmentation: .*masks=polygons.*--drop segmentation"):
        convert(str(path), str(tmp_path / "a"), to="wds", source_options=images, progress=False)
    convert(str(path), str(tmp_path / "b"), to="wds", source_options={**images, "masks": "polygons"}, progress=False)
    assert open_source(str(tmp_path / "b")).fields["polygons"].kind == "text"
    convert(str(path), str(tmp_path / "c"), to="wds", source_options=images, drop_fields=["segmentation"],
            progress=False)
    assert "polygons" not in open_source(str(tmp_path / "c")).fields


def test_raw_keeps_every_other_field_and_its_kind(tmp_path):
    from ingest.formats import open_source
    from ingest.tools.convert import convert
    src = open_source(_every_kind(tmp_path))
    convert(str(tmp_path / "src.lmdb"), str(tmp_path / "raw"), to="raw", raw_size=(20, 24), progress=False)
    raw = open_source(str(tmp_path / "raw"))
    assert {n: f.kind for n, f in raw.fields.items()} == {**KINDS, "image": "pixels"}
    from ingest.formats.base import iter_records
    for (_, a), (_, b) in zip(iter_records(src), iter_records(raw)):
        for name, value in a.fields.items():
            np.testing.assert_array_equal(np.asarray(b.fields[name]), np.asarray(value))


def test_a_deeplab_voc_tfrecord_keeps_every_feature_through_wds_and_back(tmp_path):
    """The DeepLab PASCAL VOC layout: the label map, file name and formats were left out of a wds conversion
    that reported no failures."""
    import io
    from PIL import Image
    from ingest.formats import _protos, open_source
    from ingest.formats.base import fields_of, iter_records
    from ingest.formats.tfrecord import frame
    from ingest.tools.convert import convert
    data = b""
    for i in range(3):
        png = io.BytesIO()
        Image.fromarray(np.full((20, 24), i, dtype=np.uint8), mode="P").save(png, "PNG")
        example = _protos.Example()
        fmap = example.features.feature
        for key, value in {"image/encoded": jpeg_bytes(20, 24, seed=i), "image/filename": b"%d.jpg" % i,
                           "image/format": b"jpeg", "image/segmentation/class/encoded": png.getvalue(),
                           "image/segmentation/class/format": b"png"}.items():
            fmap[key].bytes_list.value.append(value)
        for key, value in {"image/height": 20, "image/width": 24, "image/channels": 3}.items():
            fmap[key].int64_list.value.append(value)
        data += frame(example.SerializeToString())
    (tmp_path / "voc.tfrecord").write_bytes(data)
    src = open_source(str(tmp_path / "voc.tfrecord"))
    assert not src.unread
    assert set(fields_of(src)) == {"image", "image/filename", "mask",   # (DeepLab's label map: a mask)
                                   "image/segmentation/class/format", "image/height", "image/width", "image/channels"}
    convert(str(tmp_path / "voc.tfrecord"), str(tmp_path / "wds"), to="wds", progress=False)
    convert(str(tmp_path / "wds"), str(tmp_path / "back"), to="tfrecord", progress=False)
    for out in (open_source(str(tmp_path / "wds")), open_source(str(tmp_path / "back"))):
        assert {n: f.kind for n, f in fields_of(out).items()} == {n: f.kind for n, f in fields_of(src).items()}
        for (_, a), (_, b) in zip(iter_records(src), iter_records(out)):
            assert bytes(a.image) == bytes(b.image)
            for name, value in a.fields.items():
                got = b.fields[name]
                if isinstance(value, bytes):
                    assert bytes(got) == value, name
                else:
                    np.testing.assert_array_equal(np.asarray(got), np.asarray(value))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("engine", ["python", "native"])
def test_ragged_and_dense_on_cuda_with_either_engine(tmp_path, engine):
    """On CUDA the same rule: ragged=True gives lists of CUDA tensors (views of the batch the native engine
    made, which keep its slot from being reused while held), dense a tensor or the ConfigError."""
    import ingest
    from ingest import defaults
    from ingest.errors import ConfigError
    from test_native_gpu import CHAINS   # a chain the native engine takes
    root = str(_mixed(tmp_path))
    ops = CHAINS["rrc-flip-normalize"]
    with defaults.set(engine="auto" if engine == "python" else engine):
        with ingest.Loader(root, batch_size=2, device="cuda", ops=ops, ragged=True) as loader:
            kept = [images for images, _ in loader]
            if engine == "native":
                assert loader.stats()["engine"] == "native"
        assert all(isinstance(b, list) and all(im.is_cuda and im.shape == (3, 64, 64) for im in b) for b in kept)
        with ingest.Loader(root, batch_size=2, device="cuda", ops=ops) as loader:
            assert all(isinstance(images, torch.Tensor) and images.is_cuda for images, _ in loader)
    with ingest.Loader(root, batch_size=2, device="cuda") as loader, pytest.raises(ConfigError, match="ragged=True"):
        list(loader)
