"""A mask field on the native engine, without a GPU: which tables carry one (`native.chain_for`: a TFRecord record's
mask key and the field's fill, an LMDB of ours' mask field, a WebDataset mask member's byte ranges; other formats and
field sets refused with a reason naming the mask), and the engine's own mask parse, read and decode in dry mode: the masks it leaves to Python (another size than
the image's, colour, 16-bit, a WebDataset mask member whose CRC32C differs) keep their rows as fallbacks, a sample
without its mask member is the table's to Python, and nothing of the mask is read where the batches carry no fields. The GPU path (the warp of the masks
into the slot's output) is compared with the Python stages in test_native_emulated.py (a stand-in driver) and
test_native_gpu.py (CUDA)."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ingest import native
from ingest.engine import Failures, Pipeline
from ingest.formats import checks
from ingest.errors import CorruptRecordError
from ingest.formats.base import Field, Record, read_location
from ingest.formats.lmdb import LMDBSource, LMDBWriter
from ingest.formats.tfrecord import TFRecordSource
from ingest.formats.webdataset import WebDatasetSource
from ingest.ops import Flip, RandomResizedCrop
from ingest.sampler import Sampler
from conftest import jpeg_bytes
from test_native_emulated import deeplab_source, deeplab_tar
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


def _png(h: int, w: int) -> bytes:
    png = io.BytesIO()
    Image.fromarray(np.zeros((h, w), np.uint8)).save(png, "PNG")
    return png.getvalue()


def test_a_webdataset_table_carries_its_mask_members_ranges(tmp_path):
    src = deeplab_tar(tmp_path, crcs=True)
    chain, why = native.chain_for(src, OPS)
    assert chain is not None and chain.table.mask == ("seg", None) and chain.mask_fill == 255, why
    table, mem = chain.table, src._members
    assert table.python.tolist() == [int(i == 11) for i in range(12)]   # (no mask member: Python names it)
    for i in range(11):
        m = mem.columns["seg"][i]
        assert (table.mask_offsets[i], table.mask_sizes[i], table.mask_crcs[i]) == (mem.offsets[m], mem.sizes[m],
                                                                                    src._crcs[m])
        assert table.offsets[i] == mem.offsets[mem.columns["image"][i]]
    assert native.why_not(src, OPS, device=torch.device("cpu"), decode="mixed", workers=0,
                          streamed=False, tuple_output=False, pipeline=None)[1].startswith("it decodes on the GPU")


def test_a_webdataset_image_member_declared_a_mask_rides_too_and_a_gzipped_one_is_refused(tmp_path):
    tar = hand_tar(tmp_path / "s.tar", [("a.jpg", jpeg_bytes(8, 8)), ("a.cls", b"1"), ("a.seg.png", _png(8, 8))])
    chain, why = native.chain_for(WebDatasetSource(str(tar), masks=("seg",)), OPS)
    assert chain is not None and chain.table.mask == ("seg", None), why
    chain, why = native.chain_for(WebDatasetSource(str(tar)), OPS)   # (an image field beside the image: refused)
    assert chain is None and "seg.png (image)" in why, why
    gz = hand_tar(tmp_path / "g.tar", [("a.jpg", jpeg_bytes(8, 8)), ("a.seg.mask.png.gz", gzip.compress(_png(8, 8)))])
    chain, why = native.chain_for(WebDatasetSource(str(gz), stream=False), OPS)
    assert chain is None and "not gzipped) mask member" in why and "seg.mask.png.gz (mask)" in why, why


def _lmdb(root: Path, fields: dict, name: str = "db") -> LMDBSource:
    writer = LMDBWriter(root, name, fields)
    for i in range(3):
        writer.add(Record(jpeg_bytes(8, 8, seed=i), i, {n: _png(8, 8) if f.kind == "mask" else b"x"
                                                          for n, f in fields.items() if n not in ("image", "label")}))
    writer.close()
    return LMDBSource(str(root / f"{name}.lmdb"), check="none")   # (the tests here parse records, not CRCs)


def test_an_lmdb_of_ours_carries_its_mask_field_in_any_declared_order(tmp_path):
    """The mask's field in our LMDB layout: the table gives the records' kind codes in declared order and the mask's
    code; the engine's dry run leaves to Python what the TFRecord set's does (7's and 10's masks)."""
    from test_native_emulated import deeplab_lmdb
    src = deeplab_lmdb(tmp_path)
    chain, why = native.chain_for(src, OPS)
    assert chain is not None and chain.table.mask == ("mask", b"\x0a") and chain.mask_fill == 255, why
    assert chain.table.kind == "framed" and chain.table.keys == (b"\x01\x0a\x03",)
    rows, why = _dry(src, with_fields=True)
    assert rows[:, 0].tolist() == list(range(12)) and rows[:, 1].tolist() == [i % 5 for i in range(12)]
    assert why == {7: 6, 10: 6}, why
    rows, why = _dry(src, with_fields=False)   # (no fields asked for: the records still parse, no mask taken)
    assert not why, why
    first = [("label", Field("int")), ("seg", Field("mask")), ("image", Field("image"))]
    chain, why = native.chain_for(_lmdb(tmp_path, dict(first), "first"), OPS)
    assert chain is not None and chain.table.keys == (b"\x03\x0a\x01",) and chain.table.mask[0] == "seg", why


@pytest.mark.parametrize("fields, named", [
    ({"image": Field("image"), "label": Field("int"), "seg": Field("mask"), "gt": Field("mask")}, "'gt': 'mask'"),
    ({"image": Field("image"), "label": Field("int"), "seg": Field("mask"), "name": Field("bytes")}, "'bytes'"),
    ({"image": Field("image"), "seg": Field("mask")}, "'seg': 'mask'"),
    ({"image": Field("image"), "label": Field("int"), "seg": Field("image")}, "'seg': 'image'"),
], ids=["two masks", "another field", "no label", "a second image"])
def test_other_lmdb_field_sets_stay_refused_with_a_reason_naming_them(tmp_path, fields, named):
    chain, why = native.chain_for(_lmdb(tmp_path, fields), OPS)
    assert chain is None and "an image, an int label and at most one mask" in why and named in why, why


def test_the_engines_framed_parse_with_a_mask_is_the_readers(tmp_path):
    """Every record of our LMDB layout holding a mask, whole and damaged, through the engine's parse: the reader's
    image, label and mask bytes, or a record left to the reader (which names its problem or reads it)."""
    from ingest import _engine as E
    from ingest.formats import _framed
    fields = {"image": Field("image"), "mask": Field("mask"), "label": Field("int")}
    plain = _framed.encode(Record(jpeg_bytes(8, 8), 4, {"mask": _png(8, 8)}), fields)
    at = 4 + 9 + len(jpeg_bytes(8, 8))   # the mask field's head
    cases = {"plain": plain, "empty mask": _framed.encode(Record(b"\xff", 4, {"mask": b""}), fields),
             "trailing byte": plain + b"\0", "short": plain[:-1], "mask of another kind": plain[:at] + b"\x08"
             + plain[at + 1:], "label of 4 bytes": plain[:-17] + b"\x03" + (4).to_bytes(8, "little") + b"\0" * 4,
             "mask claims more": plain[:at + 1] + (1 << 40).to_bytes(8, "little") + plain[at + 9:]}
    src = _lmdb(tmp_path, fields)
    keys = src.native_table().keys
    for name, raw in cases.items():
        got = E.record_image(raw, E.FRAMED, list(keys), False, b"\x0a")
        try:
            record = src.parse(0, raw)
        except CorruptRecordError:
            assert got is None, name
            continue
        if not len(record.fields["mask"]):
            assert got is None, name   # (the engine leaves an empty mask to the decode stage, which names it)
            continue
        start, end, label, mstart, mlen = got
        assert raw[start:end] == bytes(record.image) and label == record.label, name
        assert raw[mstart:mstart + mlen] == bytes(record.fields["mask"]), name
        assert E.record_image(raw, E.FRAMED, list(keys)) == (start, end, label), name   # (no mask taken)
    for keys, mask in [([b"\x01\x01"], None), ([b"\x01\x03\x0a\x0a"], None), ([b"\x01\x03"], b"\x0a"),
                       ([b"\x01\x08"], None), ([b"\x01\x0a"], b"\x03")]:
        with pytest.raises(ValueError, match="framed table's fields"):
            E.record_image(plain, E.FRAMED, keys, False, mask)


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
    """deeplab_source: record 3's image is a PNG (the read team decodes it), record 7's mask is off its image's size
    and record 10's mask is an RGB PNG: both left to Python as "mask" fallbacks; the palette mask (2) is decoded
    here."""
    src = deeplab_source(tmp_path)
    rows, why = _dry(src, with_fields=True)
    assert rows[:, 0].tolist() == list(range(12))
    assert why == {7: 6, 10: 6}, why
    assert rows[:, 2].tolist() == [int(i in (7, 10)) for i in range(12)]
    rows, why = _dry(src, with_fields=False)   # (no fields asked for: the engine takes no mask)
    assert not why, why


def test_webdataset_masks_the_engine_leaves_to_python_keep_their_rows(tmp_path):
    """deeplab_tar: sample 3's image is a PNG (the read team's), 7's mask off its image's size, 10's an RGB PNG ("mask" fallbacks:
    the Python stages fail them), 11 has no mask member (the table's, "record"); a mask member whose CRC32C differs
    from the file's (sample 4's) is left to Python too, which names the mismatch."""
    src = deeplab_tar(tmp_path, crcs=True)
    rows, why = _dry(src, with_fields=True)
    assert rows[:, 0].tolist() == list(range(12))
    assert why == {7: 6, 10: 6, 11: 3}, why
    rows, why = _dry(src, with_fields=False)
    assert why == {11: 3}, why
    crcs = np.array(src._crcs, np.uint32)   # (each member's, in the shard's order)
    crcs[src._members.columns["seg"][4]] ^= 1
    checks.write_file(src.shards[0] + checks.SUFFIX, crcs.tolist())
    src = WebDatasetSource(src.shards[0], fields={"image": ("jpg", "png"), "label": "cls", "seg": "seg.mask.png"})
    rows, why = _dry(src, with_fields=True)
    assert why == {4: 6, 7: 6, 10: 6, 11: 3}, why
    with pytest.raises(CorruptRecordError, match="CRC32C"):
        src.parse(4, read_location(src.locate(4)))


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
    assert why == {7: 6, 10: 6}, why
    assert (rows[:, 1] == -1).all()


def test_a_table_mask_is_a_records_key_or_a_whole_tables_ranges():
    from ingest.formats._native_table import NativeTable
    cols = (np.zeros(2, np.int64),) * 3
    ranges = {"mask_offsets": np.zeros(2, np.int64), "mask_sizes": np.ones(2, np.int64)}
    assert NativeTable(["a"], *cols, None, "whole", mask=("seg", None), **ranges).mask == ("seg", None)
    framed = {"keys": (b"\x01\x0a\x03",)}
    assert NativeTable(["a"], *cols, None, "framed", mask=("seg", b"\x0a"), **framed).mask == ("seg", b"\x0a")
    for kind, mask, extra in [("whole", ("seg", None), {}), ("whole", ("seg", b"k"), ranges),
                              ("framed", ("seg", None), ranges), ("whole", None, ranges),
                              ("framed", ("seg", b"\x0a"), {}), ("framed", ("seg", None), framed),
                              ("framed", ("seg", b"\x0a"), {"keys": (b"\x01\x03",)}),
                              ("whole", ("seg", None), {"mask_offsets": ranges["mask_offsets"]})]:
        with pytest.raises(ValueError, match="mask"):
            NativeTable(["a"], *cols, None, kind, mask=mask, **extra)
