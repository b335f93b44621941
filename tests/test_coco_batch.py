"""The batch paths of COCO detection give what the per-sample paths give: `CocoSource.parse_batch` (size check by
the native JPEG header scan) against `CocoSource.parse`, and the ops stage's batched targets (`OpsStage._batch_targets`)
against its per-sample targets, through the Loader."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import ingest
from ingest import defaults
from ingest.engine.ops import OpsStage
from ingest.native_plan import Planner
from ingest.formats import coco
from ingest.formats.base import _same_record
from ingest.ops import Flip, PadTo, RandomIoUCrop, Resize

from conftest import jpeg_bytes, textured
from test_coco import ann, open_coco, write_coco


def _turned_jpeg(h: int, w: int) -> bytes:
    """A JPEG stored h x w whose EXIF orientation (6) shows it w x h."""
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    Image.fromarray(textured(h, w, 5)).save(out, "JPEG", exif=exif.tobytes())
    return out.getvalue()


@pytest.fixture
def mixed(tmp_path):
    """Six images: 1 and 2 plain JPEGs, 3 a JPEG of another size than declared, 4 EXIF-turned (declared as shown),
    5 a PNG, 6 with an invalid annotation."""
    images = ((1, 20, 30), (2, 24, 16), (3, 18, 18), (4, 30, 20), (5, 16, 22), (6, 20, 20))
    anns = [ann(10, 1, [1, 2, 6, 8], 2, segmentation=[[1, 2, 7, 2, 7, 10, 1, 10]]),
            ann(11, 1, [3, 4, 10, 5], segmentation=[[3, 4, 13, 4, 13, 9]]), ann(12, 2, [0, 0, 4, 4]),
            ann(13, 3, [1, 1, 5, 5]), ann(14, 4, [2, 2, 8, 8]), ann(15, 5, [1, 1, 9, 9]), ann(16, 6, [1, 1, -3, 5])]
    path = write_coco(tmp_path, anns, images=images)
    img = tmp_path / "img"
    (img / "000003.jpg").write_bytes(jpeg_bytes(10, 12, seed=3))
    (img / "000004.jpg").write_bytes(_turned_jpeg(20, 30))
    png = io.BytesIO()
    Image.fromarray(textured(16, 22, 7)).save(png, "PNG")
    (img / "000005.jpg").write_bytes(png.getvalue())
    return path


def _same(a, b) -> bool:
    if isinstance(a, BaseException) or isinstance(b, BaseException):
        return type(a) is type(b) and str(a) == str(b)
    return _same_record(a, b)


@pytest.mark.parametrize("masks", [None, "polygons", "masks"])
@pytest.mark.parametrize("native", [True, False])
def test_parse_batch_gives_what_parse_gives(mixed, native, masks, monkeypatch):
    """Image 1's objects have polygons, the others none (masks="masks" fails them)."""
    if native and coco.NATIVE_HEADERS is None:
        pytest.skip("ingest.formats._jpeg was not built")
    if not native:
        monkeypatch.setattr(coco, "NATIVE_HEADERS", None)
    source = open_coco(mixed, box_format="ltrb", masks=masks)
    picks = [0, 1, 2, 3, 4, 5, -6, np.int64(1)]
    raws = [(source.root + "/" + source.name(i).rsplit("/", 1)[1]) for i in picks]
    raws = [open(p, "rb").read() for p in raws]
    got = source.parse_batch(picks, raws)
    want = []
    for i, raw in zip(picks, raws):
        try:
            want.append(source.parse(i, raw))
        except (ingest.errors.IngestError, ValueError) as err:
            want.append(err)
    assert all(map(_same, got, want)), (got, want)
    if masks is not None:
        assert isinstance(got[0], ingest.formats.Record) and got[0].fields[masks] is not None
        return
    kinds = [type(g).__name__ for g in got]
    assert kinds == ["Record", "Record", "CorruptRecordError", "Record", "Record", "CorruptRecordError", "Record",
                     "Record"]
    assert "declares width x height 18 x 18, but the image is 12 x 10" in str(got[2])
    # a record's arrays are its own: changing one leaves the others and the source as they were
    got[0].fields["boxes"][:] = -1
    assert (got[1].fields["boxes"] >= 0).all() and (source.parse(0, raws[0]).fields["boxes"] >= 0).all()


def test_kept_rows_leave_out_the_failed_samples():
    """A batch whose samples failed in decoding (on the GPU path they reach the ops stage) keeps the others' rows."""
    from ingest.engine.ops import _kept_rows
    flat, starts = np.arange(12).reshape(6, 2), np.array([0, 2, 2, 5, 6])
    (got, offsets), = _kept_rows({"x": (flat, starts)}, [0, 2], 4).values()
    assert got.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]] and offsets.tolist() == [0, 2, 5]
    assert _kept_rows({"x": (flat, starts)}, [0, 1, 2, 3], 4)["x"][0] is flat


_native_plan = Planner.plan   # the real one, for the counting stand-in


def _batches(path, n: int, *, batched: bool, monkeypatch, device: str = "cpu", native: bool = True,
             **options) -> list[dict]:
    """``n`` batches; ``batched``: the ops stage's batched targets (else per sample), ``native``: the read stage
    plans with the native planner (else `planner.plan`; its use is checked)."""
    if not batched:
        monkeypatch.setattr(OpsStage, "_batch_targets", lambda self, work: None)
    planned = []
    if native:
        monkeypatch.setattr(Planner, "plan", lambda self, *a, **k: planned.append(1) or _native_plan(self, *a, **k))
    else:
        monkeypatch.setattr(Planner, "of", classmethod(lambda cls, *a, **k: None))
    ops = [RandomIoUCrop(min_ious=(None, 0.1, 0.5, 0.9), attempts=20), Flip(p=0.5), Resize(40, max_size=64),
           PadTo(multiple=8)]
    # the Python stages' planners are under test: on CUDA the native engine would take these batches whole
    with defaults.set(engine="python"):
        loader = ingest.Loader(str(path), reader_options={"images": str(path.parent.parent / "img"), "cache": False,
                                                          **options},
                               batch_size=4, ops=ops, device=device, shuffle=True, seed=3, output="dict",
                               num_workers=0, max_failures=5, ragged=True)
        try:
            it = iter(loader)
            out = [next(it) for _ in range(n)]
            assert bool(planned) == native
            return out
        finally:
            loader.close()
            monkeypatch.undo()


@pytest.mark.parametrize("native", [True, False], ids=["native-planner", "python-planner"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("options", [{"box_format": "ltrb"}, {"box_format": "xywh", "relative": True}])
def test_batched_targets_equal_the_per_sample_ones(tmp_path, monkeypatch, options, device, native):
    """Varying box counts (padding), an image without objects, a sample failing to decode (on the GPU path its
    row reaches the ops stage and is left out of the batched fields). The reference: per-sample targets of
    `planner.plan`'s plans; against it the batched targets of the native planner's plans and of `planner.plan`'s."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rng = np.random.default_rng(0)
    images = [(k, 30 + k % 7, 40 + k % 5) for k in range(1, 13)]
    anns, aid = [], 1
    for k, h, w in images:
        for _ in range(k % 4):   # 0..3 objects
            x, y = rng.uniform(0, w - 10), rng.uniform(0, h - 10)
            anns.append(ann(aid, k, [x, y, rng.uniform(3, 10), rng.uniform(3, 10)], int(rng.integers(1, 3)),
                            area=float(rng.uniform(1, 50))))
            aid += 1
    path = write_coco(tmp_path, anns, images=images)
    whole = jpeg_bytes(37, 42, seed=7)
    (tmp_path / "img" / "000007.jpg").write_bytes(whole[:len(whole) * 2 // 3])   # its header reads, its pixels fail
    want = _batches(path, 3, batched=False, monkeypatch=monkeypatch, device=device, native=False, **options)
    got = _batches(path, 3, batched=True, monkeypatch=monkeypatch, device=device, native=native, **options)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for key in g:
            a, b = g[key], w[key]
            if isinstance(a, torch.Tensor):
                assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu()), key
            elif isinstance(a, list):
                assert len(a) == len(b) and all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b)), key
    if device == "cpu":   # (a GPU decoder may take the truncated file)
        assert sum(len(b["images"]) for b in got) < 12   # the broken image was left out
    assert any(len(set(b["boxes_lengths"].tolist())) > 1 for b in got)   # padded


def test_kept_names_are_the_kept_samples_names(mixed):
    """The ops stage names a batch's kept samples on demand (for messages): indexed, sliced and iterated, they are
    the source's names of those samples."""
    from ingest.engine.batch import _Names
    from ingest.engine.ops import _kept_names
    source = open_coco(mixed)
    names = _Names(source, np.array([5, 0, 3, 1]))
    kept = _kept_names(names, [0, 2, 3])
    want = [source.name(5), source.name(3), source.name(1)]
    assert list(kept) == want and kept[:2] == want[:2] and kept[1] == want[1] and len(kept) == 3
    assert _kept_names(names, [0, 1, 2, 3]) is names
    assert _kept_names(["a", "b", "c"], [0, 2]) == ["a", "c"]
