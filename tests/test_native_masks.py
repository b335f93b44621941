"""A mask field on the native engine, without a GPU: which tables carry one (`native.chain_for`: a TFRecord record's
mask key and the field's fill; other formats refused with a reason naming the mask), and the engine's own mask parse
and decode in dry mode: the masks it leaves to Python (another size than the image's, colour, 16-bit) keep their rows
as fallbacks, and nothing of the mask is read where the batches carry no fields. The GPU path (the warp of the masks
into the slot's output) is compared with the Python stages in test_native_emulated.py (a stand-in driver) and
test_native_gpu.py (CUDA)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ingest import native
from ingest.engine import Failures, Pipeline
from ingest.formats.base import Field
from ingest.formats.tfrecord import TFRecordSource
from ingest.formats.webdataset import WebDatasetSource
from ingest.ops import Flip, RandomResizedCrop
from ingest.sampler import Sampler
from conftest import jpeg_bytes
from test_native_emulated import deeplab_source
from test_native_records import example, hand_tar

pytestmark = pytest.mark.skipif(native.ENGINE is None, reason="ingest._engine was not built")
OPS = [RandomResizedCrop(24), Flip(p=0.5)]
MASK_KEY = "image/segmentation/class/encoded"


def test_a_deeplab_tfrecord_table_carries_its_mask_and_the_fields_fill(tmp_path):
    src = deeplab_source(tmp_path)
    chain, why = native.chain_for(src, OPS)
    assert chain is not None, why
    assert chain.table.mask == ("mask", MASK_KEY.encode()) and chain.mask_fill == 255
    declared = TFRecordSource(str(tmp_path / "seg.tfrecord"), features={
        "image": "image/encoded", "label": "image/class/label", "seg": (MASK_KEY, Field("mask", fill=0))})
    chain, why = native.chain_for(declared, OPS)
    assert chain is not None and chain.table.mask == ("seg", MASK_KEY.encode()) and chain.mask_fill == 0, why


def test_a_webdataset_mask_is_refused_with_a_reason_naming_it(tmp_path):
    png = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(png, "PNG")
    tar = hand_tar(tmp_path / "s.tar", [("a.jpg", jpeg_bytes(8, 8)), ("a.cls", b"1"), ("a.seg.mask.png", png.getvalue())])
    chain, why = native.chain_for(WebDatasetSource(str(tar)), OPS)
    assert chain is None and "mask field, seg," in why and "TFRecord records only" in why, why


def _dry(src, with_fields: bool):
    chain, why = native.chain_for(src, OPS)
    assert chain is not None, why
    sampler = Sampler(len(src), 4, shuffle=False, seed=1)
    ex = native.NativeExecutor(Pipeline(src, ops=OPS, device="cpu"), chain, sampler, epoch=0, start=0, offset=0,
                               failures=Failures(0, sampler.samples()), budget=lambda: Failures(0, sampler.samples()),
                               dry=True, with_fields=with_fields)
    try:
        batches = list(ex)
    finally:
        ex.close()
    rows = np.concatenate([b.rows for b in batches])
    why = {int(i): code for b in batches for i, _, stage, code, _ in b.notes or ()
           if stage == native.ENGINE.NOTE_FALLBACK}
    return rows, why


def test_masks_the_engine_leaves_to_python_keep_their_rows_as_fallbacks(tmp_path):
    """deeplab_source: record 3's image is a PNG (not a GPU JPEG), record 7's mask is off its image's size and
    record 10's mask is an RGB PNG: both left to Python as "mask" fallbacks; the palette mask (2) is decoded here."""
    src = deeplab_source(tmp_path)
    rows, why = _dry(src, with_fields=True)
    assert rows[:, 0].tolist() == list(range(12))
    assert why == {3: 1, 7: 6, 10: 6}, why
    assert rows[:, 2].tolist() == [int(i in (3, 7, 10)) for i in range(12)]
    rows, why = _dry(src, with_fields=False)   # (no fields asked for: the engine takes no mask)
    assert why == {3: 1}, why


def test_a_16_bit_or_empty_mask_is_left_to_python(tmp_path):
    frames = []
    for i in range(4):
        values = np.full((10, 12), 7 + i, np.uint16 if i == 1 else np.uint8)
        png = io.BytesIO()
        Image.fromarray(values).save(png, "PNG")
        mask = b"" if i == 2 else png.getvalue()
        frames.append(example(image__encoded=jpeg_bytes(10, 12, seed=i), image__class__label=i,
                              image__segmentation__class__encoded=mask))
    path = tmp_path / "m.tfrecord"
    path.write_bytes(b"".join(frames))
    rows, why = _dry(TFRecordSource(str(path)), with_fields=True)
    assert why == {1: 6, 2: 3}, why   # the 16-bit mask, and the empty one (a record the Python reader names)


def test_a_table_of_image_and_mask_without_a_label(tmp_path):
    """DeepLab's records as bench_segmentation reads them (features image and mask only): the engine's scan asks
    for the two keys, the label is -1, every mask decoded natively."""
    deeplab_source(tmp_path)
    src = TFRecordSource(str(tmp_path / "seg.tfrecord"), features={"image": "image/encoded",
                                                                    "mask": (MASK_KEY, "mask")})
    chain, why = native.chain_for(src, OPS)
    assert chain is not None and chain.table.keys == (b"image/encoded",), why
    rows, why = _dry(src, with_fields=True)
    assert why == {3: 1, 7: 6, 10: 6}, why
    assert (rows[:, 1] == -1).all()
