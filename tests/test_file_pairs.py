"""Segmentation from image and mask files of their own (`FileList(masks=)`, `FileList.pairs`): the same batches as
the same samples in a DeepLab TFRecord, masks following every geometry op; pairing by stem, in a names file's order;
what is missing or ambiguous named; such a list left to the Python stages, and refused by the converter, which
reads datasets by path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ingest import ops as O
from ingest.errors import ConfigError, SourceError
from ingest.formats._native_table import NotNative
from ingest.formats.filetree import FileList

from test_masks import batches, png, voc


def split_voc(tmp_path, n=6):
    """The samples of `test_masks.voc` twice: in its TFRecord, and as VOC's raw layout (JPEGImages holding the
    images, here lossless PNGs, SegmentationClass the palette PNG masks), stems 000000, 000001, ..."""
    root, ids = voc(tmp_path, n)
    images, masks = tmp_path / "JPEGImages", tmp_path / "SegmentationClass"
    images.mkdir()
    masks.mkdir()
    for k, m in enumerate(ids):
        (images / f"{k:06d}.png").write_bytes(png(np.repeat(m[:, :, None], 3, axis=2), "RGB"))
        (masks / f"{k:06d}.png").write_bytes(png(m))
    return root, images, masks, ids


@pytest.mark.parametrize("ops", [[], [O.RandomResizedCrop(24), O.Flip(p=0.5)],
                                 [O.Resize(30), O.CenterCrop(28), O.Rotate(20, fill=7)]])
def test_file_pairs_give_the_tfrecords_batches(tmp_path, ops):
    root, images, masks, ids = split_voc(tmp_path)
    ragged = not ops
    pairs = batches(FileList.pairs(images, masks), ops, seed=3, ragged=ragged)
    records = batches(str(root), ops, seed=3, ragged=ragged)
    assert len(pairs) == len(records) == 2
    for a, b in zip(pairs, records):
        for key in ("images", "mask"):
            xa, xb = (list(x) if ragged else [x] for x in (a[key], b[key]))
            assert all(torch.equal(u, v) for u, v in zip(xa, xb)), key
    if ragged:   # the stored class ids come back where no op moved them
        assert all(np.array_equal(pairs[k // 3]["mask"][k % 3].numpy(), m) for k, m in enumerate(ids))


def test_names_choose_the_samples_and_their_order(tmp_path):
    _, images, masks, ids = split_voc(tmp_path)
    listing = tmp_path / "train.txt"
    listing.write_text("000004\n000001\n\n000002\n")
    source = FileList.pairs(images, masks, names=listing, mask_fill=0)
    assert [source.name(i).rsplit("/", 1)[-1] for i in range(len(source))] == ["000004.png", "000001.png",
                                                                                 "000002.png"]
    assert source.fields["mask"].kind == "mask" and source.fields["mask"].mask_fill == 0
    [b] = batches(source, [], batch_size=3, ragged=True)
    assert [np.array_equal(m.numpy(), ids[k]) for m, k in zip(b["mask"], (4, 1, 2))] == [True] * 3


def test_what_cannot_be_paired_is_named(tmp_path):
    _, images, masks, _ = split_voc(tmp_path, n=3)
    with pytest.raises(SourceError, match="no image file .*000009"):
        FileList.pairs(images, masks, names=["000001", "000009"])
    (images / "000002.jpg").write_bytes(b"")
    with pytest.raises(SourceError, match="two image files of stem '000002'"):
        FileList.pairs(images, masks)
    (images / "000002.jpg").unlink()
    (masks / "000001.png").unlink()
    with pytest.raises(SourceError, match="1 sample has no mask file .*000001"):
        FileList.pairs(images, masks, names=["000000", "000001"])
    with pytest.raises(SourceError, match="cannot read the list of names"):
        FileList.pairs(images, masks, names=tmp_path / "absent.txt")
    with pytest.raises(SourceError, match="no samples"):
        FileList.pairs(images, tmp_path / "JPEGImages", mask_extensions=(".bmp",))
    with pytest.raises(SourceError, match="2 paths but 1 masks"):
        FileList(["a.jpg", "b.jpg"], masks=["a.png"])
    with pytest.raises(ConfigError, match="mask_fill"):
        FileList(["a.jpg"], mask_fill=3)


def test_a_list_with_masks_is_left_to_the_python_stages(tmp_path):
    from ingest.tools.convert import convert
    _, images, masks, _ = split_voc(tmp_path, n=2)
    with pytest.raises(NotNative, match="files of their own"):
        FileList.pairs(images, masks).native_table()
    with pytest.raises(ConfigError, match="not a source object .FileList."):
        convert(FileList.pairs(images, masks), str(tmp_path / "out"), to="tfrecord", progress=False)
    assert FileList([str(p) for p in sorted(images.iterdir())]).native_table().kind == "whole"
