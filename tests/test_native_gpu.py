"""The native engine on CUDA (run on the device machine): the same samples as the Python engine for the same seed
(order, labels, crops and flips; pixels within the decoders' tolerance) on a file tree with fallbacks (PNG,
EXIF-rotated, progressive JPEGs), on a RecordIO file and on each record format the engine reads (TFRecord, LMDB
ours and Caffe's, WebDataset), a TFRecord record whose CRC fails dropped by both, a DeepLab set's masks from
TFRecord records, from an LMDB of ours and from WebDataset mask members; PNG images of every colour mode decoded
by the engine's read team, and the JPEGs the GPU path leaves (progressive, CMYK, oriented) decoded by its CPU
decoder, equal to the Python stages' rows exactly (output="dict": the same keys, shapes, dtypes and mask values;
the samples whose mask fails dropped by both); raw tensor shards (one pixel shape and shapes that differ: the same batches exactly, the kernel's over the
same pixels and plans; a sample whose CRC32C differs dropped by both with the same error); a COCO set's detection
batches and the same samples as Object Detection API TFRecord records (boxes, their fields and counts exactly;
ragged and batch-padded images; records the engine leaves to Python); the output ring (a loop's
batches never rewritten behind its stream, batches and views the user keeps never written again); read failures
naming the file; shutdown."""

from __future__ import annotations

import os

import pytest
import torch

import ingest
from ingest import defaults, native
from ingest.errors import SourceError
from ingest.formats.base import Field, Record
from ingest.formats.recordio import RecordIOWriter
from ingest.ops import Flip, HorizontalFlip, Normalize, RandomResizedCrop
from ingest.ops.geometry import CenterCrop, Resize
from conftest import jpeg_bytes, make_image_folder
from test_native import tree_with_oddities

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(native.ENGINE is None, reason="ingest._engine was not built")]
MEAN, STD = (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)
CHAINS = {
    "rrc-flip-normalize": [RandomResizedCrop(64), Flip(p=0.5), Normalize(MEAN, STD)],
    "resize-crop-uint8": [Resize((72, 96)), CenterCrop(64), HorizontalFlip(p=0.5)],
    "rrc-nhwc-bf16": [RandomResizedCrop((48, 80)), Normalize(MEAN, STD, dtype=torch.bfloat16, layout="NHWC")],
}


def pair(path, ops, **kw):
    """The same Loader on the native engine and on the Python stages."""
    with defaults.set(engine="native"):
        a = ingest.Loader(path, device="cuda", ops=ops, num_workers=0, **kw)
    with defaults.set(engine="python"):
        b = ingest.Loader(path, device="cuda", ops=ops, num_workers=0, **kw)
    assert a.engine == "native" and b.engine == "python"
    return a, b


def levels(x: torch.Tensor, ops) -> torch.Tensor:
    """A batch back in pixel levels (undoing Normalize), float64 on the host."""
    x = x.double().cpu()
    if isinstance(ops[-1], Normalize):
        x = x * torch.tensor(STD, dtype=torch.float64).view((1, 3, 1, 1) if x.shape[1] == 3 else (1, 1, 1, 3))
    return x


def compare(a, b, ops, epochs=2, off_rows=None):
    """Both loaders' epochs: equal labels and shapes, pixels within the decoders' tolerance; with ``off_rows``,
    at most that many rows differ by more than a level (rows both engines decode with the same decoder and
    warp are equal; an EXIF-rotated JPEG is decoded on the GPU by one and on the CPU by the other, and the rows
    the native engine leaves to Python are warped in a batch of their own, whose filter could differ). Returns
    the batches compared."""
    n = off = 0
    for _ in range(epochs):
        for (xa, ya), (xb, yb) in zip(a, b):
            assert xa.is_cuda and ya.is_cuda and xa.shape == xb.shape and xa.dtype == xb.dtype
            assert torch.equal(ya.cpu(), yb.cpu())
            diff = (levels(xa, ops) - levels(xb, ops)).abs()
            assert diff.mean() < 1.5, f"mean abs diff {diff.mean():.3f} levels"
            off += int((diff.flatten(1).amax(1) > 1.0).sum())
            n += 1
    if off_rows is not None:
        assert off <= off_rows, f"{off} rows differ by more than a level"
    return n


def compare_rows(a, b, ops, exact) -> tuple[int, int]:
    """Two epochs of two ``output="dict"`` loaders: the same indices and labels; the rows of the files ``exact``
    names (a path -> bool) equal, the others within the decoders' tolerance. Returns the batches and the rows
    compared exactly."""
    n = equal = 0
    for _ in range(2):
        for da, db in zip(a, b):
            assert torch.equal(da["indices"], db["indices"]) and torch.equal(da["labels"].cpu(), db["labels"].cpu())
            for row, i in enumerate(da["indices"].tolist()):
                name = a.source.name(i)
                x, y = da["images"][row], db["images"][row]
                if exact(name):
                    assert torch.equal(x, y), name
                    equal += 1
                else:
                    assert (levels(x[None], ops) - levels(y[None], ops)).abs().mean() < 1.5, name
            n += 1
    return n, equal


@pytest.mark.parametrize("chain", list(CHAINS))
def test_file_tree_gives_the_python_engines_samples(tmp_path, chain):
    """One decoder backend (the CUDA decoder alone): the same samples, pixels and all; the rotated and the
    progressive JPEG decoded by the engine's CPU decoder (nvImageCodec's libjpeg-turbo), the PNG by its read
    team."""
    ops = CHAINS[chain]
    with defaults.set(hw_decoder_load=0):
        a, b = pair(tree_with_oddities(tmp_path / "t", (120, 160)), ops, batch_size=8, shuffle=True, seed=4)
        with a, b:
            assert compare(a, b, ops, off_rows=6) == 8   # the 3 odd files of 2 epochs at most
            stats = a.stats()
    assert stats["engine"] == "native"
    assert stats["native"]["fallbacks"] == {}, stats["native"]   # two epochs
    assert stats["decode_paths"]["gpu"] == 2 * 24 and stats["decode_paths"].get("cpu-fallback", 0) == 0
    assert stats["decode_paths"]["cpu-native"] == 2 * 3


def test_file_tree_with_the_hardware_split(tmp_path):
    """The default split between the hardware decoder and the CUDA decoder: an image's pixels depend on its place
    in a decoder's share (as with DALI), so only the labels and crops match exactly."""
    ops = CHAINS["rrc-flip-normalize"]
    a, b = pair(make_image_folder(tmp_path / "t", {"a": 20, "b": 12}, size=(120, 160)), ops, batch_size=16,
                shuffle=True, seed=7)
    with a, b:
        assert compare(a, b, ops) == 4


def test_recordio_gives_the_python_engines_samples(tmp_path):
    writer = RecordIOWriter(tmp_path, "data", {"image": Field("image"), "label": Field("int")})
    for i in range(21):
        writer.add(Record(jpeg_bytes(100 + 3 * i, 130 + 2 * i, seed=i), (5 * i) % 7))
    writer.close()
    ops = CHAINS["rrc-flip-normalize"]
    with defaults.set(hw_decoder_load=0):
        # check="none": both engines read the records unchecked (test_native.py covers the engine's CRC check)
        a, b = pair(tmp_path / "data.rec", ops, batch_size=8, shuffle=True, seed=1, reader_options={"check": "none"})
        with a, b:
            assert compare(a, b, ops, off_rows=0) == 6


@pytest.mark.parametrize("fmt", ["tfrecord", "lmdb", "caffe", "webdataset"])
def test_record_formats_give_the_python_engines_samples(tmp_path, fmt):
    """11 records of each format (record 3 a PNG, decoded by the engine's read team): the same labels, and the same
    pixels for the rows both decode on the GPU."""
    from test_native_emulated import record_source
    src, _ = record_source(tmp_path, fmt)
    ops = CHAINS["resize-crop-uint8"]
    with defaults.set(hw_decoder_load=0):
        a, b = pair(src, ops, batch_size=4, shuffle=True, seed=2)
        with a, b:
            assert compare(a, b, ops, off_rows=2) == 6
            stats = a.stats()
    assert stats["native"]["fallbacks"] == {} and stats["decode_paths"]["cpu-native"] == 2, stats


@pytest.mark.parametrize("chain", ["rrc-flip-normalize", "resize-crop-uint8", "rrc-nhwc-bf16"])
def test_png_images_give_the_python_engines_batches_exactly(tmp_path, chain):
    """A file tree of JPEGs and PNGs of every colour mode (`png_tree`): the PNGs the engine's read team decodes
    (all but the 16-bit one, completed in Python) are the Python stages' rows exactly (both warp the CPU decoder's
    pixels with the same kernel on the same plan), the JPEGs within the decoders' tolerance; the decode paths say
    which decoded what."""
    from test_native_emulated import PNG_MODES, png_tree
    root = png_tree(tmp_path / "t")
    ops = CHAINS[chain]
    with defaults.set(hw_decoder_load=0):
        a, b = pair(root, ops, batch_size=4, shuffle=True, seed=3, output="dict")
        with a, b:
            n, _ = compare_rows(a, b, ops, lambda name: name.endswith(".png") and not name.endswith(
                f"{2 + len(PNG_MODES):02d}.png"))
            stats = a.stats()
    pngs = len(PNG_MODES) - 1
    assert n == 6 and stats["engine"] == "native", stats["engine"]
    assert stats["native"]["fallbacks"] == {"not a GPU JPEG": 2}, stats["native"]   # the 16-bit PNG
    paths = stats["decode_paths"]
    assert (paths["gpu"], paths["cpu-native"], paths["cpu-fallback"]) == (2 * 3, 2 * pngs, 2), paths


@pytest.mark.parametrize("chain", ["rrc-flip-normalize", "resize-crop-uint8", "rrc-nhwc-bf16"])
def test_jpegs_the_gpu_path_leaves_give_the_python_engines_rows(tmp_path, chain):
    """A file tree of the JPEGs the GPU path does not take (`host_jpeg_tree`: progressive, CMYK, gray, Adobe RGB,
    EXIF orientations 2-8) among baseline ones and a PNG, and two damaged JPEGs: the engine's CPU decoder decodes
    them; those the Python stages decode on the CPU too (all but the oriented baseline ones, which they decode on
    the GPU) are their rows exactly, the rest within the decoders' tolerance; the damaged ones are dropped by both
    with the same errors."""
    from ingest.decode.cpu import jpeg_headers
    from ingest.decode.gpu import gpu_decodable
    from test_native_emulated import HOST_JPEGS, host_jpeg_tree
    root = host_jpeg_tree(tmp_path / "t")
    ops = CHAINS[chain]

    def on_cpu(name: str) -> bool:   # decoded on the CPU by both (the damaged ones: dropped by both)
        assert not os.path.basename(name).startswith("x_"), name
        with open(name, "rb") as f:
            gpu = gpu_decodable(jpeg_headers([f.read()]), 1 << 30)[0]
        return os.path.basename(name).startswith(("h_", "p_")) and not gpu

    with defaults.set(hw_decoder_load=0):
        a, b = pair(root, ops, batch_size=4, shuffle=True, seed=6, output="dict", max_failures=2)
        with a, b:
            n, equal = compare_rows(a, b, ops, on_cpu)
            stats = a.stats()
    # 9 of HOST_JPEGS (not the oriented baseline ones, the Python stages' GPU decodes) and the PNG, each epoch
    assert n == 10 and stats["engine"] == "native" and equal == 2 * 10, (n, equal, stats["engine"])
    assert stats["native"]["fallbacks"] == {"not a GPU JPEG": 2, "decoder": 2}, stats["native"]
    paths = stats["decode_paths"]
    assert (paths["gpu"], paths["cpu-native"], paths["cpu-fallback"]) == (2 * 3, 2 * (len(HOST_JPEGS) + 1), 4), \
        paths


@pytest.mark.parametrize("fmt", ["tfrecord", "lmdb", "webdataset"])
@pytest.mark.parametrize("chain", ["rrc-flip-normalize", "resize-crop-uint8"])
def test_deeplab_masks_give_the_python_engines_batches(tmp_path, chain, fmt):
    """12 DeepLab samples (a palette mask, a PNG image, a mask of another size and an RGB mask among them) as
    TFRecord records, as an LMDB of our layout (a mask field between the image and the label) or as a WebDataset
    tar (mask members ``seg.mask.png`` with their CRC32Cs, before or after the image, one sample without its mask):
    the dicts of both engines have the same keys, shapes and dtypes, the same
    indices and labels, masks equal to the value, images within the decoders' tolerance; the bad masks (and the
    missing one) fail their samples in both."""
    from test_native_emulated import WDS_FAILED, deeplab_lmdb, deeplab_source, deeplab_tar
    src = {"tfrecord": deeplab_source, "lmdb": deeplab_lmdb}.get(fmt, lambda r: deeplab_tar(r, crcs=True))(tmp_path)
    name, failed = ("seg", WDS_FAILED) if fmt == "webdataset" else ("mask", (7, 10))
    ops = CHAINS[chain]
    with defaults.set(hw_decoder_load=0):
        a, b = pair(src, ops, batch_size=4, shuffle=True, seed=3, output="dict", max_failures=len(failed))
        with a, b:
            n = 0
            for _ in range(2):
                for da, db in zip(a, b):
                    assert set(da) == set(db) and name in da
                    for key in ("images", "labels", name):
                        assert da[key].is_cuda and da[key].shape == db[key].shape and da[key].dtype == db[key].dtype
                    assert torch.equal(da["indices"], db["indices"]) and torch.equal(da["labels"].cpu(),
                                                                                        db["labels"].cpu())
                    assert torch.equal(da[name].cpu(), db[name].cpu())
                    assert (levels(da["images"], ops) - levels(db["images"], ops)).abs().mean() < 1.5
                    n += 1
            stats, failures = a.stats(), [sorted({f[0] for f in x.stats()["failures"]}) for x in (a, b)]
    assert n == 6 and stats["engine"] == "native", stats["engine"]
    assert stats["native"]["fallbacks"]["mask"] == 4, stats["native"]
    assert failures[0] == failures[1] == sorted(src.name(i) for i in failed), failures


RAW_CHAINS = [(chain, case) for chain in CHAINS for case in ("fixed", "ragged")] + [("flip-normalize", "fixed")]


@pytest.mark.parametrize("chain, case", RAW_CHAINS)
def test_raw_shards_give_the_python_engines_batches_exactly(tmp_path, chain, case):
    """11 raw samples (one pixel shape: the Python stages' direct reads; or shapes that differ): both engines run
    the same kernel on the same plans over the same pixels, so every batch is equal, bit for bit, over two epochs;
    the native engine reads, uploads and warps them with no decoder and no fallback. Over one pixel shape a chain
    whose output follows the image's size (Flip and Normalize) runs natively too."""
    from ingest.formats.raw import RawSource
    from test_native_emulated import raw_source
    path, _ = raw_source(tmp_path / case, case)
    ops = CHAINS.get(chain) or [Flip(p=0.5), Normalize(MEAN, STD)]
    a, b = pair(RawSource(path), ops, batch_size=4, shuffle=True, seed=6, last_batch="partial")
    n = 0
    with a, b:
        for _ in range(2):
            for (xa, ya), (xb, yb) in zip(a, b):
                assert xa.is_cuda and xa.shape == xb.shape and xa.dtype == xb.dtype
                assert torch.equal(ya, yb) and torch.equal(xa, xb), (chain, case, n)
                n += 1
        stats = a.stats()
    assert n == 6 and stats["engine"] == "native" and stats["native"]["fallbacks"] == {}, stats
    assert set(stats["decode_paths"]) == {"none (raw, native)"}, stats["decode_paths"]


def test_a_raw_sample_whose_crc_fails_is_dropped_by_both_engines(tmp_path):
    from ingest.formats.raw import RawSource
    from test_native_emulated import raw_source
    path, bad = raw_source(tmp_path, "ragged-crc")
    ops = CHAINS["rrc-flip-normalize"]
    a, b = pair(RawSource(path, check="crc"), ops, batch_size=4, shuffle=False, max_failures=1)
    with a, b:
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(ya, yb) and torch.equal(xa, xb)
        failed = [[(f[0], f[2]) for f in x.stats()["failures"]] for x in (a, b)]
    assert failed[0] == failed[1] and [f[0] for f in failed[0]] == [RawSource(path).name(bad)], failed
    assert "field 'image': CRC32C" in failed[0][0][1], failed


@pytest.mark.parametrize("fmt", ["coco", "tfrecord"])
@pytest.mark.parametrize("chain", ["iou-flip-resize-pad", "iou-flip-resize-padbatch", "resize-crop-pad"])
def test_detection_gives_the_python_engines_batches(tmp_path, chain, fmt):
    """12 COCO images (a PNG among them, an image without boxes, one whose boxes the crop drops), or the same as
    Object Detection API TFRecord records (the engine scans each record's boxes): the dicts of both engines have the
    same keys in the same order, the same indices, boxes, categories, iscrowd, area, counts, image ids and image
    sizes exactly (on the device), images of the same shapes within the decoders' tolerance; per-image lists
    (ragged) or one padded tensor (a batch-wide PadTo)."""
    from test_native_emulated import detection_chains, detection_source
    src, _ = detection_source(tmp_path, fmt, chain)
    ops = detection_chains()[chain]
    batchwide = chain.endswith("padbatch")
    with defaults.set(hw_decoder_load=0):
        a, b = pair(src, ops, batch_size=4, shuffle=True, seed=3, output="dict", ragged=not batchwide)
        with a, b:
            n = 0
            for _ in range(2):
                for da, db in zip(a, b):
                    assert list(da) == list(db) and "boxes_lengths" in da
                    for key in da:
                        if key == "images":
                            continue
                        assert da[key].device == db[key].device and da[key].dtype == db[key].dtype, key
                        assert torch.equal(da[key].cpu(), db[key].cpu()), (key, da[key], db[key])
                    ia = [da["images"]] if batchwide else da["images"]
                    ib = [db["images"]] if batchwide else db["images"]
                    assert [x.shape for x in ia] == [x.shape for x in ib] and ia[0].is_cuda
                    for x, y in zip(ia, ib):
                        assert (x.double() - y.double()).abs().mean() < 1.5
                    n += 1
            stats = a.stats()
    assert n == 6 and stats["engine"] == "native", stats["engine"]
    assert stats["native"]["fallbacks"] == {}, stats["native"]   # (the PNG: decoded by the engine's read team)


def test_tfrecord_detection_records_left_to_python_give_the_python_engines_batches(tmp_path, monkeypatch):
    """Object Detection API records the engine leaves to Python: record 3's coordinate lists differ in length (both
    engines drop it, a budget of one failure per epoch), and with the slots holding 3 boxes per sample the records
    of 4 boxes fall back ("boxes"); the batches' fields are the Python engine's exactly."""
    from ingest.engine import native_boxes
    from test_native_emulated import detection_chains, od_tfrecord
    monkeypatch.setattr(native_boxes, "RECORD_BOXES", 3)
    src, _ = od_tfrecord(tmp_path, "xywh", damaged=(3,))
    ops = detection_chains()["iou-flip-resize-pad"]
    with defaults.set(hw_decoder_load=0):
        a, b = pair(src, ops, batch_size=4, shuffle=False, output="dict", ragged=True, max_failures=1)
        with a, b:
            n = 0
            for da, db in zip(a, b):
                assert list(da) == list(db)
                for key in da:
                    if key != "images":
                        assert torch.equal(da[key].cpu(), db[key].cpu()), (key, da[key], db[key])
                assert [x.shape for x in da["images"]] == [x.shape for x in db["images"]]
                n += 1
            stats = a.stats()
    # (the PNG record's image: decoded by the read team, not a fallback)
    assert n == 3 and stats["native"]["fallbacks"] == {"boxes": 3, "record": 1}, stats["native"]


def test_a_tfrecord_record_whose_crc_fails_is_dropped_by_both_engines(tmp_path):
    from test_native_emulated import record_source
    src, bad = record_source(tmp_path, "tfrecord-crc")
    ops = CHAINS["rrc-flip-normalize"]
    with defaults.set(hw_decoder_load=0):
        a, b = pair(src, ops, batch_size=4, shuffle=False, max_failures=1)
        with a, b:
            assert compare(a, b, ops, epochs=1, off_rows=1) == 3
            failed = [stats["failures"] for stats in (a.stats(), b.stats())]
    assert [[f[0] for f in x] for x in failed] == [[src.name(bad)]] * 2
    assert all("bad data CRC" in x[0][2] for x in failed)


def test_a_loop_behind_its_stream_never_sees_a_batch_rewritten(tmp_path):
    """Each batch's sum, taken on the loop's stream after a sleep that puts the loop ahead of the GPU, equals the
    one taken when the loop waits for each batch; the batches live in the ring of prefetch + 1 outputs."""
    folder = make_image_folder(tmp_path / "t", {"a": 10, "b": 9}, size=(120, 160))
    ops = CHAINS["rrc-flip-normalize"]

    def make():   # 19 images: batches of 6, 6, 6 and 1
        with defaults.set(engine="native"):
            return ingest.Loader(folder, batch_size=6, device="cuda", ops=ops, shuffle=True, seed=5,
                                 last_batch="partial", prefetch=2)

    with make() as loader:
        want = [x.double().sum().item() for epoch in range(3) for x, _ in loader]
    sums, places = [], set()
    with make() as loader:
        for epoch in range(3):
            for x, _ in loader:
                torch.cuda._sleep(20_000_000)
                sums.append(x.double().sum())
                places.add(x.untyped_storage().data_ptr())
        made = loader.stats()["native"]["outputs_made"]
    assert [s.item() for s in sums] == want
    assert len(places) <= 3 and made == 3, (places, made)   # the ring made at start, and nothing after


def test_batches_and_views_the_user_keeps_are_never_written_again(tmp_path):
    folder = make_image_folder(tmp_path / "t", {"a": 10, "b": 9}, size=(120, 160))
    ops = [RandomResizedCrop(64), Normalize(MEAN, STD)]
    with defaults.set(engine="native"):
        loader = ingest.Loader(folder, batch_size=4, device="cuda", ops=ops, shuffle=True, seed=2, last_batch="drop",
                               prefetch=1)
    kept, copies, views = [], [], []
    with loader:
        for epoch in range(3):
            for k, (x, y) in enumerate(loader):
                copies.append((x.clone(), y.clone()))
                if k % 2:
                    kept.append((x, y))       # every other batch kept whole: its slot is replaced
                else:
                    views.append(x[1:3, 0])   # only a view of this one stays: its slot too
    torch.cuda.synchronize()
    assert len(copies) == 12
    assert all(torch.equal(x, c) and torch.equal(y, d) for (x, y), (c, d) in zip(kept, copies[1::2]))
    assert all(torch.equal(v, c[1:3, 0]) for v, (c, _) in zip(views, copies[0::2]))


def test_a_missing_file_fails_its_batch_with_an_error_naming_it(tmp_path):
    folder = make_image_folder(tmp_path / "t", {"a": 6, "b": 6}, size=(120, 160))
    gone = sorted((folder / "b").iterdir())[2]
    ops = CHAINS["rrc-flip-normalize"]
    with defaults.set(engine="native"):
        strict = ingest.Loader(folder, batch_size=4, device="cuda", ops=ops)
        lenient = ingest.Loader(folder, batch_size=4, device="cuda", ops=ops, max_failures=1)
    os.remove(gone)
    with strict, pytest.raises(SourceError, match=f"{gone}: cannot read"):
        list(strict)
    with lenient:
        got = sum(len(y) for _, y in lenient)
        assert got == 11 and [f[0] for f in lenient.stats()["failures"]] == [str(gone)]


def test_close_mid_epoch_leaves_no_thread_and_frees_the_engine(tmp_path):
    folder = make_image_folder(tmp_path / "t", {"a": 12, "b": 12}, size=(120, 160))

    def run_two_batches():
        with defaults.set(engine="native"):
            loader = ingest.Loader(folder, batch_size=4, device="cuda", ops=CHAINS["rrc-flip-normalize"])
        it = iter(loader)
        next(it)
        next(it)
        loader.close()

    run_two_batches()   # nvImageCodec's and CUDA's own threads, started once per process
    before = len(os.listdir("/proc/self/task"))
    for _ in range(3):
        run_two_batches()
    torch.cuda.synchronize()
    assert len(os.listdir("/proc/self/task")) <= before


def test_engine_auto_picks_native_and_python_where_not_eligible(tmp_path):
    folder = make_image_folder(tmp_path / "t", {"a": 4}, size=(120, 160))
    with ingest.Loader(folder, batch_size=2, device="cuda", ops=CHAINS["rrc-flip-normalize"]) as loader:
        next(iter(loader))
        assert loader.stats()["engine"] == "native"
    with ingest.Loader(folder, batch_size=2, device="cuda", ops=[Resize(shorter=64)], ragged=True) as loader:
        next(iter(loader))
        assert loader.stats()["engine"] == "python"
