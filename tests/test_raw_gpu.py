"""Raw shards read straight into CUDA memory: KvikIO's path and the posix fallback (preadv into pinned memory +
one copy) give the bytes that were written, for dense and padded layouts, shuffled and repeated indices,
reads split into chunks, staged reads with uneven strides, and buffers with GPU work still queued on them; the
Python stages' direct reads (these tests pin ``engine="python"``: tests/test_native_gpu.py covers raw shards on the
native engine)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import requires_cuda, textured
from ingest import defaults
from ingest.formats import Field, Record
from ingest.formats.raw import RawSource, RawWriter
from ingest.io import READ_CHUNK, ByteReader
from ingest.engine import Pipeline

pytestmark = [pytest.mark.gpu, requires_cuda]


def kvikio_reader(*, threshold: int | None = None, **kw) -> ByteReader:
    """A KvikIO reader; ``threshold``: the read size from which it reads with KvikIO (its default: KvikIO's
    gds_threshold, 1 MiB, so that the small reads of these tests go the preadv + pinned copy way)."""
    pytest.importorskip("kvikio")
    pytest.importorskip("cupy")
    reader = ByteReader("kvikio", **kw)
    if threshold is not None:
        reader._kvikio_min_read = threshold
    return reader


def write(root, images, *, shards=1, align=4096, fields=None, extra=lambda i: {}) -> RawSource:
    fields = fields or {"image": Field("pixels", None, "uint8"), "label": Field("int")}
    per = -(-len(images) // shards)
    for k in range(shards):
        with RawWriter(root, f"s{k}", fields, align=align) as w:
            for i in range(k * per, min(len(images), (k + 1) * per)):
                w.add(Record(images[i], i % 5, extra(i)))
    return RawSource(root)


def images_of(n, h=16, w=16):
    return [textured(h, w, seed=i) for i in range(n)]


INDICES = {
    "sequential": lambda n: np.arange(n),
    "shuffled": lambda n: np.random.default_rng(0).permutation(n),
    "repeats": lambda n: np.random.default_rng(1).integers(0, n, n),
    "reversed": lambda n: np.arange(n)[::-1].copy(),
}


@pytest.mark.parametrize("align", [256, 4096])  # 768-byte samples: back to back (direct) or padded (staged)
@pytest.mark.parametrize("order", sorted(INDICES))
@pytest.mark.parametrize("io", ["kvikio", "kvikio every read", "kvikio large reads", "posix"])
def test_read_batch_into_cuda_equals_written_arrays(tmp_path, align, order, io):
    images = images_of(48)
    src = write(tmp_path, images, shards=3, align=align)
    idx = INDICES[order](48)
    threshold = {"kvikio every read": 0, "kvikio large reads": 3000}.get(io)
    reader = kvikio_reader(threads=4, threshold=threshold) if io != "posix" else ByteReader("posix", threads=4)
    with reader:
        out = src.read_batch(idx, src.batch_buffer(len(idx), "cuda"), reader)
    assert out.is_cuda
    assert np.array_equal(out.cpu().numpy(), np.stack([images[i] for i in idx]))


def test_kvikio_and_posix_paths_give_identical_bytes(tmp_path):
    images = [textured(64, 48, seed=i) for i in range(64)]
    src = write(tmp_path, images, shards=2)
    idx = np.random.default_rng(2).permutation(64)[:40]
    with kvikio_reader(threads=8, threshold=0) as kv, ByteReader("posix", threads=8) as px:
        a = src.read_batch(idx, src.batch_buffer(40, "cuda"), kv)
        b = src.read_batch(idx, src.batch_buffer(40, "cuda"), px)
        c = src.read_batch(idx, src.batch_buffer(40), px)
    assert torch.equal(a, b) and torch.equal(a.cpu(), c)


def test_kvikio_into_host_memory(tmp_path):
    images = images_of(10)
    src = write(tmp_path, images, align=4096)
    with kvikio_reader(threads=2, threshold=0) as reader:
        assert reader.path == "kvikio"
        out = src.read_batch([9, 0, 5, 6], src.batch_buffer(4), reader)
    assert np.array_equal(out.numpy(), np.stack([images[i] for i in (9, 0, 5, 6)]))


def test_reads_longer_than_a_chunk_are_split(tmp_path):
    images = images_of(120, 256, 256)  # 196608 bytes each: 120 back to back > READ_CHUNK
    assert 120 * 196608 > READ_CHUNK
    src = write(tmp_path, images)
    with kvikio_reader(threads=4) as reader:
        out = src.read_batch(np.arange(120), src.batch_buffer(120, "cuda"), reader)
    assert np.array_equal(out.cpu().numpy(), np.stack(images))


def test_staged_reads_with_uneven_strides(tmp_path):
    # A caption of varying length after each image: neighbours are coalesced but not evenly spaced.
    fields = {"image": Field("pixels", (16, 16, 3), "uint8"), "label": Field("int"), "caption": Field("text")}
    images = images_of(30)
    src = write(tmp_path, images, align=64, fields=fields, extra=lambda i: {"caption": "x" * (i * 37 % 300)})
    idx = np.arange(30)
    with kvikio_reader(threads=4, threshold=0) as reader:
        out = src.read_batch(idx, src.batch_buffer(30, "cuda"), reader)
    assert np.array_equal(out.cpu().numpy(), np.stack(images))


def test_read_waits_for_work_queued_on_the_buffer(tmp_path):
    images = images_of(8)
    src = write(tmp_path, images)
    out = src.batch_buffer(8, "cuda")
    with kvikio_reader(threads=4, threshold=0) as reader:
        torch.cuda._sleep(50_000_000)  # keep the stream busy, then a fill that must land before the read
        out.fill_(7)
        src.read_batch(np.arange(8), out, reader)
    assert np.array_equal(out.cpu().numpy(), np.stack(images))


def test_default_reader_takes_kvikio_for_device_tensors(tmp_path):
    pytest.importorskip("kvikio")
    images = images_of(6)
    src = write(tmp_path, images)
    out = src.read_batch([5, 1], src.batch_buffer(2, "cuda"))
    assert src._handles.get("reader", lambda: None).device_path == "kvikio"
    assert np.array_equal(out.cpu().numpy(), np.stack([images[5], images[1]]))
    src.close()


def test_float_arrays_to_the_gpu(tmp_path):
    fields = {"image": Field("pixels"), "label": Field("int"), "emb": Field("array", (3, 5), "float32")}
    embs = [np.random.default_rng(i).standard_normal((3, 5)).astype(np.float32) for i in range(9)]
    src = write(tmp_path, [textured(8 + i, 8, seed=i) for i in range(9)], fields=fields,
                extra=lambda i: {"emb": embs[i]})
    with kvikio_reader() as reader:
        out = src.read_batch([4, 8, 0], src.batch_buffer(3, "cuda", field="emb"), reader, field="emb")
    assert out.dtype == torch.float32 and np.array_equal(out.cpu().numpy(), np.stack([embs[4], embs[8], embs[0]]))


@pytest.mark.parametrize("threshold", [0, 3000, None])
def test_a_batch_split_between_kvikio_and_preadv_lands_each_row_in_place(tmp_path, threshold):
    """A batch of a consecutive block (one large read: KvikIO) and scattered rows (small reads: preadv into a
    pinned buffer of just those rows, copied in by row index) after GPU work queued on the buffer."""
    images = images_of(64)
    src = write(tmp_path, images, shards=2, align=256)
    rng = np.random.default_rng(4)
    idx = np.concatenate([np.arange(10, 30), rng.integers(0, 64, 12)])
    rng.shuffle(idx)
    out = src.batch_buffer(len(idx), "cuda")
    with kvikio_reader(threads=4, threshold=threshold) as reader:
        torch.cuda._sleep(50_000_000)
        out.fill_(7)
        src.read_batch(idx, out, reader)
    assert np.array_equal(out.cpu().numpy(), np.stack([images[i] for i in idx]))


def test_cuda_loaders_run_in_this_process_by_default(tmp_path, image_folder):
    """Raw shards and GPU-decoded JPEGs need no worker processes (they cost a CUDA context each); CPU decode
    feeding the GPU gets them."""
    import ingest
    images = images_of(8)
    (tmp_path / "raw").mkdir()
    write(tmp_path / "raw", images)
    raw = ingest.Loader(str(tmp_path / "raw"), batch_size=4, device="cuda")
    jpegs = ingest.Loader(str(image_folder), batch_size=4, device="cuda", ragged=True)
    cpu_decode = ingest.Loader(str(image_folder), batch_size=4, device="cuda", decode="cpu")
    try:
        assert raw.num_workers == 0 and jpegs.num_workers == 0 and cpu_decode.num_workers > 0
        images_out, _ = next(iter(jpegs))          # ragged: a list of [3, H, W] views
        assert all(im.is_cuda for im in images_out) and set(jpegs.stats()["decode_paths"]) == {"gpu"}
        x, y = next(iter(raw))
        from ingest.io import resolve_io
        assert x.is_cuda and x.shape[0] == 4 and raw.stats()["read_path"] == resolve_io("auto")[1]
    finally:
        raw.close()
        jpegs.close()
        cpu_decode.close()


def test_raw_loader_reuses_its_batch_tensors_and_matches_the_cpu_loader(tmp_path, monkeypatch):
    """The ops stage hands each direct-read batch tensor back once the ops wrote their output elsewhere, and the
    read stage reads the next batches into it (`ReadStage._direct_buffer`): no more allocations over three epochs
    than the pipeline holds batches at once, the reuse ordered after the ops that read it, each epoch's smaller
    last batch read into the first rows of one, and every batch equal to the CPU loader's."""
    import ingest
    from ingest.ops import Flip, Normalize, RandomResizedCrop
    images = images_of(48, 40, 40)
    (tmp_path / "raw").mkdir()
    write(tmp_path / "raw", images, shards=2)
    made = []
    real = RawSource.batch_buffer

    def counted(self, n, device="cpu", **kw):
        made.append(str(device))
        return real(self, n, device, **kw)
    monkeypatch.setattr(RawSource, "batch_buffer", counted)
    transform = Pipeline.transform

    def behind(self, work):   # the ops stream far behind the host: a reuse must wait for the ops' reads
        if self.ops_stream is not None:
            with torch.cuda.stream(self.ops_stream):
                torch.cuda._sleep(5_000_000)
        return transform(self, work)
    monkeypatch.setattr(Pipeline, "transform", behind)
    ops = [RandomResizedCrop(24), Flip(), Normalize([120.0] * 3, [60.0] * 3)]
    kw = dict(batch_size=10, ops=ops, shuffle=True, seed=3, num_workers=0, last_batch="partial")
    root = str(tmp_path / "raw")
    with defaults.set(engine="python"):   # (the Python stages' direct reads are what is tested)
        gpu, cpu = ingest.Loader(root, device="cuda", **kw), ingest.Loader(root, device="cpu", **kw)
    assert gpu.engine == "python"
    sizes = []
    try:
        for _ in range(3):
            for (xg, yg), (xc, yc) in zip(gpu, cpu):
                sizes.append(len(xg))
                assert torch.equal(yg.cpu(), yc)
                assert torch.allclose(xg.cpu(), xc, atol=0.05), float((xg.cpu() - xc).abs().max())
    finally:
        gpu.close()
        cpu.close()
    assert sizes == [10, 10, 10, 10, 8] * 3
    # 15 batches (and those read ahead) into the tensors the pipeline's queues hold at once, and no decoder
    assert made.count("cuda:0") <= 9, made
    assert gpu.pipeline.lanes[0][0] is None


def test_staging_uploads_in_order_and_reuses_a_buffer_only_after_its_copy(monkeypatch):
    """`Staging` (copies queued with the GIL kept) lands each array where asked, with the GPU far behind the
    host: a ring buffer's next user waits for its last copy. Without the CUDA driver it copies with torch."""
    from ingest import _driver
    for driver in (True, False):
        if not driver:
            monkeypatch.setattr(_driver, "_driver", lambda: None)
        staging, stream = _driver.Staging(slots=2), torch.cuda.Stream()
        dst = torch.zeros((6, 1000), dtype=torch.int64, device="cuda")
        with torch.cuda.stream(stream):
            torch.cuda._sleep(100_000_000)   # the copies below are queued behind ~50+ ms of GPU time
        for k in range(6):
            staging.copy(np.full(1000, k + 1, dtype=np.int64), dst, stream, offset=k * 8000)
        half = staging.take(4000)
        half[:] = 9
        staging.upload(half, dst[5], stream, offset=4000)
        stream.synchronize()
        want = torch.arange(1, 7).repeat_interleave(1000).view(6, 1000)
        want[5, 500:] = 9 * 0x0101010101010101
        assert torch.equal(dst.cpu(), want), driver


def test_ops_stage_marks_the_outputs_for_the_training_loops_stream(tmp_path, monkeypatch):
    """The outputs are marked as used on the iterating thread's stream (`record_stream`) by the ops stage, not by
    the training loop's thread; a loop that switches streams gets its batches marked for the new one."""
    import threading
    import ingest
    (tmp_path / "raw").mkdir()
    write(tmp_path / "raw", images_of(32))
    calls = []
    real = torch.Tensor.record_stream

    def spy(self, stream):
        calls.append((threading.current_thread().name, stream.cuda_stream))
        return real(self, stream)
    monkeypatch.setattr(torch.Tensor, "record_stream", spy)
    with defaults.set(engine="python"):   # (the ops stage is what is tested)
        loader = ingest.Loader(str(tmp_path / "raw"), batch_size=4, device="cuda", num_workers=0)
    try:
        it = iter(loader)
        main = torch.cuda.current_stream().cuda_stream
        for _ in range(3):
            next(it)
        on_main = [who for who, s in calls if s == main]
        assert on_main and set(on_main) == {"ingest-ops"}, calls
        other = torch.cuda.Stream()
        with torch.cuda.stream(other):
            x, y = next(it)
        assert ("MainThread", other.cuda_stream) in calls
    finally:
        loader.close()


def test_a_sliced_plan_on_cuda_writes_what_one_plan_does():
    """Each slice's warp writes its rows of one output (`planner.Sliced`): the batch is the one plan's, bit for bit,
    and the warp checks the buffer it is given."""
    from ingest.ops import Flip, Normalize, RandomResizedCrop, planner, resample
    from ingest.random import SampleRandom
    n = planner.SLICE + 100
    ims = torch.from_numpy(np.stack(images_of(n, 32, 40))).cuda()
    keys = np.arange(n) * 7
    sizes = [(32, 40)] * n
    for ops in ([RandomResizedCrop(24), Flip(), Normalize([120.0] * 3, [60.0] * 3, dtype=torch.float16)],
                [RandomResizedCrop((20, 28)), Flip()]):
        sliced = planner.plan_sliced(ops, sizes, lambda a, b: SampleRandom.keyed(1, 0, keys[a:b]))
        whole = planner.plan(ops, sizes, SampleRandom.keyed(1, 0, keys))
        assert len(sliced.plans) == 2
        got, want = sliced.execute(ims), whole.execute(ims)
        assert got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)
    w = whole.warp
    out = torch.zeros((n, 20, 28, 3), dtype=torch.uint8, device="cuda")
    assert resample.warp(ims, w, out=out) is out and torch.equal(out, want)
    for bad in (torch.zeros((n, 20, 27, 3), dtype=torch.uint8, device="cuda"),
                torch.zeros((n, 20, 28, 3), dtype=torch.float32, device="cuda"),
                torch.zeros((n, 28, 20, 3), dtype=torch.uint8, device="cuda").transpose(1, 2),
                torch.zeros((n, 20, 28, 3), dtype=torch.uint8)):
        with pytest.raises(ValueError, match="`out` must be a contiguous"):
            resample.warp(ims, w, out=bad)
