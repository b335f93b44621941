"""Segmentation masks (kind ``mask``): decoded to their stored values, moved by the geometry ops with the
image (nearest, fill 255 unless declared), left alone by colour ops, inferred from DeepLab's TFRecord keys,
carried by every writer and back; COCO's instance masks batched without ops (issue 33, defect 3)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import ingest
from ingest import ops as O
from ingest.decode.masks import decode_mask
from ingest.errors import ConfigError, DecodeError
from ingest.formats.base import Field, Record
from ingest.formats._example import SEGMENTATION_KEY
from ingest.formats.tfrecord import TFRecordSource, TFRecordWriter
from ingest.ops.planner import _MaskBatch, plan
from ingest.tools.convert import convert

from conftest import requires_cuda


def png(values: np.ndarray, mode: str = "P") -> bytes:
    """``values`` as a PNG: palette indices (with a colour palette, as VOC's), 8-bit or 16-bit gray, or RGB."""
    if mode == "P":
        img = Image.fromarray(values.astype(np.uint8)).convert("P")
        img.putpalette([(i * 53 + c * 91) % 256 for i in range(256) for c in range(3)])
    else:
        img = Image.fromarray(values)
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


def class_ids(h: int, w: int, seed: int) -> np.ndarray:
    """Blocks of class ids 0..20 (no 255: any 255 that comes out is padding)."""
    g = np.random.default_rng(seed)
    blocks = g.integers(0, 21, (-(-h // 4), -(-w // 4))).astype(np.uint8)
    return np.kron(blocks, np.ones((4, 4), np.uint8))[:h, :w]


def voc(tmp_path: Path, n: int = 6, *, sizes=None, feature_kind: str = "bytes") -> tuple[Path, list[np.ndarray]]:
    """A DeepLab-shaped TFRecord: ``image/encoded`` (a lossless PNG whose every channel holds the class ids,
    so that the image's pixels show where the mask's labels went), the palette PNG label map under
    ``image/segmentation/class/encoded`` written as plain bytes (as DeepLab's script does), its format,
    the image's size and file name."""
    root = tmp_path / "voc"
    root.mkdir()
    fields = {"image": Field("image"), "mask": Field(feature_kind), "image/segmentation/class/format": Field("bytes"),
              "image/height": Field("int"), "image/width": Field("int"), "image/filename": Field("bytes")}
    writer = TFRecordWriter(root, "train-00000-of-00001", fields, keys={"mask": SEGMENTATION_KEY})
    ids = []
    for k in range(n):
        h, w = sizes[k] if sizes else (40 + 2 * k, 52 - k)
        m = class_ids(h, w, k)
        ids.append(m)
        writer.add(Record(png(np.repeat(m[:, :, None], 3, axis=2), "RGB"), fields={
            "mask": png(m), "image/segmentation/class/format": b"png", "image/height": h, "image/width": w,
            "image/filename": f"{k:06d}.jpg".encode()}))
    writer.close()
    return root, ids


def batches(source, ops=(), **kw):
    kw.setdefault("batch_size", 3)
    return list(ingest.Loader(source, output="dict", ops=list(ops), num_workers=0, **kw))


# -- decoding ------------------------------------------------------------------------------------------------

def test_decoded_values_are_the_stored_ones():
    ids = np.array([[0, 1, 15], [255, 7, 0]], np.uint8)
    assert np.array_equal(decode_mask(png(ids), "p"), ids)                 # palette indices, not colours
    assert np.array_equal(decode_mask(png(ids, "L"), "l"), ids)             # gray levels
    deep = np.array([[0, 1, 40000], [65535, 256, 7]], np.uint16)
    got = decode_mask(png(deep, "L"), "16")
    assert got.dtype == np.uint16 and np.array_equal(got, deep)             # 16-bit kept
    bits = io.BytesIO()
    Image.fromarray(ids > 5).save(bits, "PNG")
    assert np.array_equal(decode_mask(bits.getvalue(), "1"), (ids > 5).astype(np.uint8))
    assert decode_mask(ids, "array") is not None and np.array_equal(decode_mask(deep, "a16"), deep)
    with pytest.raises(DecodeError, match="RGB image: a mask must be single-channel") as err:
        decode_mask(png(np.zeros((2, 2, 3), np.uint8), "RGB"), "sample-7")
    assert "sample-7" in str(err.value)
    with pytest.raises(DecodeError, match="uint8 or uint16"):
        decode_mask(np.zeros((2, 2), np.float32), "f")
    with pytest.raises(DecodeError, match="not an image"):
        decode_mask(b"not a png", "junk")


# -- TFRecord: DeepLab keys ---------------------------------------------------------------------------------

def test_deeplab_keys_are_inferred_and_decode_to_class_ids(tmp_path):
    root, ids = voc(tmp_path, sizes=[(24, 20)] * 6)
    source = TFRecordSource(root)
    assert source.fields["mask"] == Field("mask")
    assert source.fields["image"].kind == "image"
    got = batches(source)
    assert [b["mask"].shape for b in got] == [(3, 24, 20)] * 2 and got[0]["mask"].dtype == torch.uint8
    assert all(np.array_equal(m.numpy(), want) for m, want in zip(torch.cat([b["mask"] for b in got]), ids))
    assert got[0]["images"].shape == (3, 3, 24, 20)   # images CHW, masks [N, H, W]


def test_any_feature_can_be_declared_a_mask_with_its_fill(tmp_path):
    root, _ = voc(tmp_path)
    features = {"image": "image/encoded", "seg": (SEGMENTATION_KEY, Field("mask", fill=7))}
    [b, _] = batches(TFRecordSource(root, features=features), [O.PadTo((64, 64))])
    assert b["seg"].shape == (3, 64, 64) and (b["seg"][:, 60:] == 7).all()
    json_spec = {"image": "image/encoded", "seg": [SEGMENTATION_KEY, "mask"]}   # the CLI's -s form
    assert TFRecordSource(root, features=json_spec).fields["seg"] == Field("mask")
    with pytest.raises(ValueError, match="padding value"):
        Field("int", fill=3)


# -- geometry ---------------------------------------------------------------------------------------------

GEOMETRY = {
    "crop+flip": lambda: [O.RandomResizedCrop(32, interpolation="nearest"), O.Flip(p=0.5)],
    "rotate": lambda: [O.Rotate((-40, 40), interpolation="nearest")],
    "rotate90": lambda: [O.Rotate(90, expand=True, interpolation="nearest"), O.Flip(p=0.5, vertical=True)],
    "iou crop": lambda: [O.RandomIoUCrop(), O.Flip(p=0.5)],
    "zoom out": lambda: [O.ZoomOut(p=1.0), O.CenterCrop(40)],
    "pad": lambda: [O.CenterCrop((48, 60)), O.PadTo((64, 64))],
}


@pytest.mark.parametrize("chain", list(GEOMETRY))
def test_masks_follow_the_images_geometry(tmp_path, chain):
    """The image's pixels are the class ids: after the ops, every mask pixel that is not padding holds what
    the image's pixel there holds, and the image is padding (0) where the mask is (255)."""
    root, _ = voc(tmp_path)
    ragged = chain in ("rotate", "rotate90", "iou crop")   # output sizes that follow the image's
    for b in batches(TFRecordSource(root), GEOMETRY[chain](), seed=3, ragged=ragged):
        images, masks = b["images"], b["mask"]
        for image, mask in zip(images, masks):
            assert image.shape[1:] == mask.shape and mask.dtype == torch.uint8
            pad = mask == 255
            assert torch.equal(image[0][~pad], mask[~pad])
            assert (image[:, pad] == 0).all()


def test_sampling_is_nearest_and_padding_is_255(tmp_path):
    root, ids = voc(tmp_path)
    values = set(np.unique(np.concatenate([m.ravel() for m in ids])).tolist())
    ops = [O.RandomResizedCrop(33, scale=(0.05, 1.0)), O.Rotate((-30, 30)), O.Flip()]   # bilinear images
    for b in batches(TFRecordSource(root), ops, seed=1):
        assert set(b["mask"].unique().tolist()) <= values | {255}   # no blended labels
    [b, _] = batches(TFRecordSource(root), [O.PadTo((64, 64))])
    for mask, m in zip(b["mask"], ids):
        h, w = m.shape
        assert np.array_equal(mask[:h, :w].numpy(), m) and (mask[h:] == 255).all() and (mask[:, w:] == 255).all()
    assert b["image_sizes"].tolist() == [list(m.shape) for m in ids[:3]]


def test_colour_ops_and_normalize_leave_masks_alone(tmp_path):
    root, ids = voc(tmp_path, sizes=[(24, 20)] * 6)
    ops = [O.ColorJitter(0.4, 0.4, 0.4, 0.1), O.RandomGrayscale(p=1.0), O.Normalize(127.5, 64.0)]
    got = batches(TFRecordSource(root), ops)
    assert got[0]["images"].dtype == torch.float32
    assert all(np.array_equal(m.numpy(), want) for m, want in zip(torch.cat([b["mask"] for b in got]), ids))


def test_policies_that_move_pixels_without_a_map_are_refused(tmp_path):
    root, _ = voc(tmp_path)
    with pytest.raises(ConfigError, match="boxes or masks"):
        ingest.Loader(TFRecordSource(root), batch_size=2, ops=[O.RandAugment()])


def test_without_ops_masks_batch_like_images(tmp_path):
    root, ids = voc(tmp_path)
    b = batches(TFRecordSource(root), ragged=True)[0]
    assert isinstance(b["mask"], list) and [tuple(m.shape) for m in b["mask"]] == [m.shape for m in ids[:3]]
    assert all(np.array_equal(m.numpy(), want) for m, want in zip(b["mask"], ids))


def test_a_mask_of_another_size_fails_its_sample(tmp_path):
    root = tmp_path / "bad"
    root.mkdir()
    writer = TFRecordWriter(root, "bad", {"image": Field("image"), "mask": Field("mask")})
    for k, (h, w) in enumerate([(20, 20), (20, 20), (20, 20)]):
        writer.add(Record(png(np.zeros((h, w, 3), np.uint8), "RGB"),
                          fields={"mask": png(np.zeros((h, w + (k == 1)), np.uint8))}))
    writer.close()
    with pytest.raises(DecodeError, match="mask 'mask' is 21x20, its image 20x20") as err:
        batches(TFRecordSource(root))
    assert "bad.tfrecord" in str(err.value)
    [b] = batches(TFRecordSource(root), max_failures=1)
    assert b["mask"].shape == (2, 20, 20) and b["indices"].tolist() == [0, 2]


# -- uint16 masks through the warp -----------------------------------------------------------------------------

def test_uint16_masks_move_whole():
    g = np.random.default_rng(5)
    sizes = [(30, 40), (25, 25), (41, 17)]
    masks = [g.choice(np.array([0, 3, 300, 40000, 65534], np.uint16), (1, h, w)) for h, w in sizes]
    for ops in ([O.Rotate(33), O.PadTo((64, 64))], [O.RandomResizedCrop(20), O.Flip(p=1.0)]):
        p = plan(ops, sizes, 9)
        cpu = p.warp_masks(masks, fill=65535)
        assert {0, 3, 300, 40000, 65534} >= set(torch.cat([m.reshape(-1) for m in cpu]).tolist()) - {65535}
        as_uint8 = p.warp_masks([(m % 251).astype(np.uint8) for m in masks], fill=255)   # the same map
        for a, b in zip(cpu, as_uint8):
            assert torch.equal((a[a != 65535].to(torch.int64) % 251).to(torch.uint8), b[a != 65535])
            assert (b[a == 65535] == 255).all()
        # the CUDA path's planes and bytes (one buffer, two channels per value), run on the CPU's reference warp
        batch = _MaskBatch.of(masks, torch.device("cpu"))
        for stage in p.stages:
            if stage.warp is not None:
                batch = batch.warped(stage.warp.for_masks((255.0, 255.0)))
        for a, b in zip(batch.per_sample(), cpu):
            assert a.dtype == torch.uint16 and torch.equal(a.to(torch.int64), b.to(torch.int64))


# -- COCO instance masks without ops (defect 3) -------------------------------------------------------------------

def test_coco_masks_batch_without_ops(tmp_path):
    from test_coco import ann, write_coco
    from ingest.formats.coco import CocoSource
    path = write_coco(tmp_path, [ann(1, 1, [2, 2, 10, 7]), ann(2, 1, [1, 1, 4, 4]), ann(3, 2, [0, 0, 5, 5])])
    loader = ingest.Loader(path, batch_size=3, output="dict", ragged=True,
                           reader_options={"images": str(tmp_path / "img"), "masks": "masks"})
    b = next(iter(loader))
    assert isinstance(b["masks"], list) and [tuple(m.shape) for m in b["masks"]] == [(2, 20, 30), (1, 24, 16),
                                                                                     (0, 18, 18)]
    assert b["masks_lengths"].tolist() == [2, 1, 0] and b["masks"][0].dtype == torch.uint8
    targets = ingest.torch.detection_targets(b)
    assert [tuple(t["masks"].shape) for t in targets] == [(2, 20, 30), (1, 24, 16), (0, 18, 18)]
    src = CocoSource(path, images=tmp_path / "img", masks="masks", cache=False)
    [b] = batches(src, [O.Resize((16, 16))], batch_size=3)   # with a fixed size: padded [N, K, H, W]
    assert b["masks"].shape == (3, 2, 16, 16) and b["masks_lengths"].tolist() == [2, 1, 0]


# -- formats and conversion ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["wds", "lmdb", "raw", "tfrecord"])
def test_conversion_keeps_masks(tmp_path, fmt):
    root, ids = voc(tmp_path, n=4)
    out, back = tmp_path / fmt, tmp_path / "back"
    convert(str(root), str(out), to=fmt, shard_size=3, progress=False)
    there = ingest.formats.open_source(str(out))
    assert there.fields["mask"].kind == "mask"
    got = [m for b in batches(there, ragged=True) for m in b["mask"]]
    assert len(got) == 4 and all(np.array_equal(m.numpy(), want) for m, want in zip(got, ids))
    convert(str(out), str(back), to="tfrecord", shard_size=3, progress=False)
    source = TFRecordSource(back)   # no manifest needed: the mask is under DeepLab's key
    assert source.fields["mask"].kind == "mask"
    got = [m for b in batches(source, ragged=True) for m in b["mask"]]
    assert all(np.array_equal(m.numpy(), want) for m, want in zip(got, ids))


def test_raw_size_conversion_resizes_masks_nearest(tmp_path):
    root, ids = voc(tmp_path, n=3)
    convert(str(root), str(tmp_path / "raw"), to="raw", raw_size=(16, 20), progress=False)
    [b] = batches(ingest.formats.open_source(str(tmp_path / "raw")))
    assert b["mask"].shape == (3, 16, 20) and b["images"].shape == (3, 3, 16, 20)
    assert set(b["mask"].unique().tolist()) <= set(np.unique(np.concatenate([m.ravel() for m in ids])).tolist())


def test_webdataset_masks_by_member_name_or_option(tmp_path):
    import tarfile
    path = tmp_path / "seg.tar"
    m = class_ids(12, 10, 1)
    with tarfile.open(path, "w") as tar:
        for k in range(2):
            for ext, data in (("jpg", png(np.repeat(m[:, :, None], 3, 2), "RGB")), ("seg.png", png(m)),
                              ("gt.mask.png", png(m))):
                info = tarfile.TarInfo(f"s{k}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    from ingest.formats.webdataset import WebDatasetSource
    plain = WebDatasetSource(path)
    assert plain.fields["seg"].kind == "image" and plain.fields["gt"].kind == "mask"
    source = WebDatasetSource(path, masks=("seg",))
    assert source.fields["seg"].kind == "mask"
    [b] = batches(str(path), batch_size=2, reader_options={"masks": ["seg"]})   # the Loader's way to say it
    assert np.array_equal(b["seg"][1].numpy(), m) and np.array_equal(b["gt"][0].numpy(), m)
    with pytest.raises(ConfigError, match="not an image field"):
        WebDatasetSource(path, masks=("nope",))


def test_demo_draws_a_segmentation_batch(tmp_path):
    from ingest.tools import demo
    [row] = demo.run_segmentation(tmp_path / "voc", tmp_path / "out", n=6, size=48)
    assert row["batch"] == "(6, 3, 48, 48) uint8 + masks (6, 48, 48) uint8"
    assert set(row["classes"].split(",")) <= {"0", "1", "2", "255"} and "255" in row["classes"]
    with Image.open(row["png"]) as im:
        assert im.size == (4 * 50, 2 * 50)


# -- CUDA ----------------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("decode", ["mixed", "cpu"])
def test_cuda_masks_equal_the_cpu_ones(tmp_path, decode):
    """Same draws on both devices: the masks (warped on the GPU, one launch per stage) equal the CPU's."""
    root, _ = voc(tmp_path, n=8)
    ops = [O.RandomResizedCrop(32, scale=(0.2, 1.0)), O.Flip(), O.Rotate((-20, 20)), O.PadTo((40, 40)),
           O.Normalize(127.5, 64.0)]
    cpu = batches(TFRecordSource(root), ops, batch_size=4, seed=2)
    gpu = batches(TFRecordSource(root), ops, batch_size=4, seed=2, device="cuda", decode=decode)
    for a, b in zip(cpu, gpu):
        assert b["mask"].device.type == "cuda" and b["mask"].shape == (4, 40, 40)
        assert torch.equal(a["mask"], b["mask"].cpu())


@pytest.mark.gpu
@requires_cuda
def test_cuda_uint16_label_maps_through_the_loader(tmp_path):
    source, _ = depth_set(tmp_path)
    ops = [O.Rotate((-30, 30)), O.PadTo((32, 32)), O.Flip()]
    cpu = batches(source, ops, batch_size=2, seed=4)
    gpu = batches(source, ops, batch_size=2, seed=4, device="cuda")
    for a, b in zip(cpu, gpu):
        assert b["depth"].is_cuda and b["depth"].dtype == torch.uint16
        assert torch.equal(a["depth"].to(torch.int64), b["depth"].cpu().to(torch.int64))
    [b, _] = batches(source, batch_size=2, device="cuda")   # no ops: decoded on the host, moved up
    assert b["depth"].is_cuda and b["depth"].dtype == torch.uint16 and b["depth"].shape == (2, 20, 24)


@pytest.mark.gpu
@requires_cuda
def test_cuda_uint16_masks_equal_the_cpu_ones():
    g = np.random.default_rng(2)
    sizes = [(30, 40), (25, 25), (41, 17)]
    masks = [g.integers(0, 65535, (2, h, w), dtype=np.uint16) for h, w in sizes]
    p = plan([O.Rotate(25), O.RandomResizedCrop(24), O.PadTo((30, 30))], sizes, 4)
    cpu = p.warp_masks(masks, fill=65535)
    gpu = p.warp_masks(masks, fill=65535, device="cuda")
    for a, b in zip(cpu, gpu):
        assert b.is_cuda and b.dtype == torch.uint16 and torch.equal(a.to(torch.int64), b.cpu().to(torch.int64))


def depth_set(tmp_path: Path) -> tuple[TFRecordSource, list[np.ndarray]]:
    """Four 20x24 samples with a uint16 map each (``depth``, given decoded: the writer stores a 16-bit PNG)."""
    root = tmp_path / "deep"
    root.mkdir()
    writer = TFRecordWriter(root, "d", {"image": Field("image"), "depth": Field("mask")})
    maps = [np.random.default_rng(k).choice(np.array([0, 700, 40000], np.uint16), (20, 24)) for k in range(4)]
    for m in maps:
        writer.add(Record(png(np.zeros((20, 24, 3), np.uint8), "RGB"), fields={"depth": m}))
    writer.close()
    return TFRecordSource(root, features={"image": "image/encoded", "depth": ("depth", "mask")}), maps


def test_uint16_label_maps_through_the_loader(tmp_path):
    source, maps = depth_set(tmp_path)
    [b, c] = batches(source, batch_size=2)
    assert b["depth"].dtype == torch.uint16 and np.array_equal(b["depth"].numpy(), np.stack(maps[:2]))
    [b, c] = batches(source, [O.PadTo((24, 30)), O.Flip(p=1.0)], batch_size=2)
    assert b["depth"].shape == (2, 24, 30) and (b["depth"][:, 20:].to(torch.int64) == 255).all()
    assert np.array_equal(b["depth"][0, :20, 6:].numpy(), maps[0][:, ::-1])


def test_verify_decodes_masks(tmp_path):
    from ingest.tools.verify import verify
    root, _ = voc(tmp_path, n=3)
    report = verify(str(root), decode=True)
    assert report.ok and report.records == 3 and report.decoded == 6   # 3 images and 3 masks
    bad = tmp_path / "bad"
    bad.mkdir()
    writer = TFRecordWriter(bad, "b", {"image": Field("image"), "mask": Field("bytes")},
                            keys={"mask": SEGMENTATION_KEY})
    rgb = png(np.zeros((4, 4, 3), np.uint8), "RGB")
    writer.add(Record(rgb, fields={"mask": rgb}))
    writer.close()
    report = verify(str(bad), decode=True)
    [(where, why)] = report.problems
    assert "[mask]" in where and why.startswith("DecodeError: mask is a RGB image: a mask must be single-channel")


def test_a_consumer_without_fields_does_not_decode_masks(tmp_path):
    root = tmp_path / "rgb"
    root.mkdir()
    writer = TFRecordWriter(root, "r", {"image": Field("image"), "mask": Field("mask")})
    rgb = png(np.zeros((4, 4, 3), np.uint8), "RGB")
    for _ in range(2):
        writer.add(Record(rgb, fields={"mask": rgb}))   # not a mask: decoding it would fail
    writer.close()
    [(images, labels)] = list(ingest.Loader(TFRecordSource(root), batch_size=2, num_workers=0))
    assert images.shape == (2, 3, 4, 4)
    with pytest.raises(DecodeError, match="RGB image"):
        batches(TFRecordSource(root), batch_size=2)


def test_lmdb_columnar_masks_by_prefix(tmp_path):
    from test_lmdb import write_lmdb
    from ingest.formats.lmdb import LMDBSource
    maps = [class_ids(12, 10, n) for n in range(3)]
    items = {}
    for n, m in enumerate(maps, 1):
        items[b"image-%09d" % n] = png(np.repeat(m[:, :, None], 3, 2), "RGB")
        items[b"mask-%09d" % n] = png(m)
    source = LMDBSource(write_lmdb(tmp_path / "col", items), layout="columnar")
    assert {k: f.kind for k, f in source.fields.items()} == {"image": "image", "mask": "mask"}
    [b] = batches(source, [O.Flip(p=1.0)])
    assert all(np.array_equal(got.numpy(), m[:, ::-1]) for got, m in zip(b["mask"], maps))
