"""The Loader on CUDA (run on the device machine): mixed decode + fused ops against the CPU pipeline,
KvikIO reads, streams and shutdown."""

import numpy as np
import pytest
import torch

import ingest
from ingest.formats.base import Location
from ingest.io import ByteReader, kvikio_usable
from ingest.ops import Flip, Normalize, RandomResizedCrop, Resize
from conftest import make_image_folder

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
MEAN, STD = (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)


@pytest.fixture
def folder(tmp_path):
    return make_image_folder(tmp_path / "train", {"a": 10, "b": 9}, size=(120, 160))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("decode", ["mixed", "cpu"])
def test_cuda_matches_cpu_pipeline(folder, decode, workers):
    ops = [RandomResizedCrop(64), Flip(p=0.5), Normalize(MEAN, STD)]
    cpu = ingest.Loader(folder, batch_size=8, ops=ops, shuffle=True, seed=3)
    gpu = ingest.Loader(folder, batch_size=8, device="cuda", decode=decode, ops=ops, shuffle=True, seed=3,
                        num_workers=workers)
    n = 0
    for (xc, yc), (xg, yg) in zip(cpu, gpu):
        assert xg.is_cuda and yg.is_cuda and xg.shape == xc.shape and xg.dtype == xc.dtype
        assert torch.equal(yc, yg.cpu())
        diff = (xg.cpu() - xc).abs() * STD[0]  # back to pixel levels
        assert diff.mean() < 1.5, f"mean abs diff {diff.mean():.3f} levels"
        n += len(yg)
    assert n == 19
    stats = gpu.stats()
    assert stats["decode"] == decode
    if decode == "mixed":
        # an in-process loader reads on into the next epoch: its counts include that read-ahead
        assert sum(v for k, v in stats["decode_paths"].items() if k.startswith("gpu")) >= 19
    assert stats["read_path"] == "posix"


def test_uint8_output_fixed_size(folder):
    loader = ingest.Loader(folder, batch_size=5, device="cuda", ops=[Resize((32, 48))], num_workers=0)
    x, y = next(iter(loader))
    assert x.shape == (5, 3, 32, 48) and x.dtype == torch.uint8 and x.is_cuda
    loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_ragged_shapes_match_cpu(folder, workers):
    ops = [Resize(32)]   # shorter side 32: the widths differ with the aspect ratios
    cpu = next(iter(ingest.Loader(folder, batch_size=5, ops=ops, ragged=True)))[0]
    with ingest.Loader(folder, batch_size=5, device="cuda", ops=ops, num_workers=workers, ragged=True) as loader:
        gpu = next(iter(loader))[0]
        assert isinstance(cpu, list) and len({tuple(t.shape) for t in cpu}) > 1, "the batch must be ragged"
        assert isinstance(gpu, list) and [t.shape for t in gpu] == [t.shape for t in cpu]
        for a, b in zip(gpu, cpu):
            assert a.is_cuda and a.dtype == torch.uint8
            assert (a.cpu().float() - b.float()).abs().mean() < 1.5


@pytest.mark.parametrize("workers", [0, 2])
def test_training_step_on_other_stream_is_ordered(folder, workers):
    # The consumer uses the batch on its own stream: values must be complete (event wait), not racing.
    ops = [Resize((64, 64)), Normalize(MEAN, STD)]
    ref = [x.cpu() for x, _ in ingest.Loader(folder, batch_size=4, ops=ops)]
    side = torch.cuda.Stream()
    got = []
    with torch.cuda.stream(side):
        for x, _ in ingest.Loader(folder, batch_size=4, device="cuda", ops=ops, num_workers=workers):
            got.append((x * 1.0).cpu())
    for a, b in zip(ref, got):
        assert ((a - b).abs() * STD[0]).mean() < 1.5


@pytest.mark.skipif(not kvikio_usable(), reason="needs KvikIO")
def test_kvikio_reads_host_and_device(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    path = tmp_path / "shard.bin"
    data.tofile(path)
    with ByteReader("kvikio") as reader:
        assert reader.path == reader.device_path == "kvikio"
        a, b = reader.read([Location(str(path), 100, 5000), Location(str(path))])
        assert np.array_equal(a, data[100:5100]) and np.array_equal(b, data)
        dev = torch.empty(4096, dtype=torch.uint8, device="cuda")
        reader.read_into(Location(str(path), 8192), dev)
        assert np.array_equal(dev.cpu().numpy(), data[8192:8192 + 4096])


def test_auto_reads_device_destinations_with_kvikio():
    with ByteReader("auto") as reader:
        assert reader.path == "posix"
        assert reader.device_path == ("kvikio" if kvikio_usable() else "posix")


def test_posix_read_into_device(tmp_path):
    data = np.arange(10000, dtype=np.uint8)
    path = tmp_path / "raw.bin"
    data.tofile(path)
    with ByteReader("posix") as reader:
        dev = torch.empty(100, dtype=torch.uint8, device="cuda")
        reader.read_into(Location(str(path), 50), dev)
        assert np.array_equal(dev.cpu().numpy(), data[50:150])


@pytest.mark.parametrize("stages", ["read", "all"])
def test_worker_processes_on_cuda_match_threads(folder, stages):
    ops = [RandomResizedCrop(64), Flip(p=0.5), Normalize(MEAN, STD)]
    kw = dict(batch_size=4, device="cuda", ops=ops, shuffle=True, seed=4)
    ref = [(x.cpu(), y.cpu()) for x, y in ingest.Loader(folder, **kw)]
    with ingest.Loader(folder, num_workers=2, worker_stages=stages, **kw) as loader:
        # "read": workers read, parse and plan; decode and ops run here, on this process's one CUDA context
        assert loader.worker_stages == stages
        for _ in range(2):   # the workers persist across epochs
            got = [(x, y) for x, y in loader]
        loader.set_epoch(0)
        got = [(x, y) for x, y in loader]
    assert len(got) == len(ref) == 5
    for (a, la), (b, lb) in zip(got, ref):
        assert a.is_cuda and la.is_cuda
        assert torch.equal(la.cpu(), lb)
        assert torch.equal(a.cpu(), b)   # same plan, same kernels: identical



@pytest.mark.parametrize("load", ["auto", 0.65])
def test_two_gpu_decoders_match_one(folder, load):
    """gpu_decoders=2: each half of a batch decoded by its own nvImageCodec decoder on its own thread (the
    compiled loop), into the same arena: the batches are identical to one decoder's where nvImageCodec picks the
    backend per image ("auto"). With the hardware/CUDA split each decoder gives the engine the first share of its
    half, so an image may be decoded by the other backend than with one decoder: within a level or two."""
    ops = [RandomResizedCrop(64), Flip(p=0.5), Normalize(MEAN, STD)]
    kw = dict(batch_size=8, device="cuda", ops=ops, shuffle=True, seed=5, num_workers=0)
    with ingest.defaults.set(hw_decoder_load=load):
        ref = [(x.cpu(), y.cpu()) for x, y in ingest.Loader(folder, **kw)]
    with ingest.defaults.set(gpu_decoders=2, hw_decoder_load=load):
        loader = ingest.Loader(folder, **kw)
        got = [(x.cpu(), y.cpu()) for x, y in loader]
    paths = loader.stats()["decode_paths"]   # the next epoch's read-ahead included
    assert set(paths) <= {"gpu", "gpu-roi"} and sum(paths.values()) >= 19
    assert len(got) == len(ref) == 3
    for (a, la), (b, lb) in zip(got, ref):
        assert torch.equal(la, lb)
        if load == "auto":
            assert torch.equal(a, b)
        else:
            assert float((a - b).abs().mean()) * STD[0] < 1.0   # in pixel levels


def test_decode_lanes_match_one_and_each_has_its_decoder_and_stream(folder):
    """decode_batches=2: two batches decoded at once, each on its own decoder, stream and thread; the batches
    come in order and equal to one lane's, over two epochs, while the consumer runs slow steps on its stream."""
    ops = [RandomResizedCrop(64), Flip(p=0.5), Normalize(MEAN, STD)]
    kw = dict(batch_size=4, device="cuda", ops=ops, shuffle=True, seed=5, num_workers=0)
    one = ingest.Loader(folder, **kw)
    ref = [[(x.cpu(), y.cpu()) for x, y in one] for _ in range(2)]
    side = torch.cuda.Stream()
    with ingest.defaults.set(decode_batches=2):
        loader = ingest.Loader(folder, **kw)
    (g0, s0), (g1, s1) = loader.pipeline.lanes
    assert g0 is not g1 and s0 != s1
    for epoch in ref:
        got = []
        with torch.cuda.stream(side):
            for x, y in loader:
                torch.cuda._sleep(2_000_000)   # a slow step on the consumer's stream
                got.append(((x * 1.0).cpu(), y.cpu()))
        assert len(got) == len(epoch) == 5
        for (a, la), (b, lb) in zip(got, epoch):
            assert torch.equal(la, lb) and torch.equal(a, b)
    assert sum(loader.stats()["decode_paths"].values()) >= 38   # + the third epoch's read-ahead
    loader.close()


def test_views_of_one_buffer_cross_and_copy_as_that_buffer():
    """A ragged batch's images (views of the warp's one output buffer) cross to the parent as one buffer and
    are copied once there, into views of a new buffer with the same values; separate tensors stay separate."""
    from ingest.engine.workers import _Views, _clone, _transport
    flat = torch.arange(2 * 3 * 3 + 4 * 5 * 3, dtype=torch.uint8, device="cuda")
    images = [flat[:18].view(2, 3, 3), flat[18:].view(4, 5, 3)]
    sent = _transport(images)
    assert isinstance(sent, _Views) and len(sent.views) == 2
    back = _transport(sent, back=True)
    copied = _clone(back)
    assert [c.shape for c in copied] == [(2, 3, 3), (4, 5, 3)]
    assert all(torch.equal(c, i) for c, i in zip(copied, images))
    storages = {c.untyped_storage().data_ptr() for c in copied}
    assert len(storages) == 1 and flat.untyped_storage().data_ptr() not in storages
    separate = [torch.zeros(2, 2, 3, dtype=torch.uint8, device="cuda") for _ in range(2)]
    assert _transport(separate) is separate
    assert len({c.untyped_storage().data_ptr() for c in _clone(separate)}) == 2


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_on_the_second_gpu_leaves_the_first_alone(folder, workers, tmp_path):
    """A torchrun rank on GPU 1: neither its process, nor its worker processes, nor any thread of theirs opens
    a context on GPU 0 (a thread's current CUDA device starts at 0)."""
    import json
    import subprocess
    import sys
    script = tmp_path / "rank1.py"
    # Worker processes are spawned, and spawn runs the main script again: its work goes under the guard.
    script.write_text(f"""
import json, os, sys
import pynvml, torch, ingest
from ingest.ops import Flip, RandomResizedCrop


def main():
    torch.cuda.set_device(1)
    loader = ingest.Loader({str(folder)!r}, batch_size=4, device="cuda:1", decode="mixed", num_workers={workers},
                           ops=[RandomResizedCrop(32), Flip()], shuffle=True)
    for _ in range(2):
        for x, y in loader:
            assert x.device.index == 1 and y.device.index == 1, (x.device, y.device)
    ours = {{os.getpid()}} | {{int(p) for p in os.listdir("/proc") if p.isdigit()
                              and open(f"/proc/{{p}}/stat").read().split(")")[-1].split()[1] == str(os.getpid())}}
    pynvml.nvmlInit()
    index = int(os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(",")[0])
    on_gpu0 = {{p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(index))}}
    print(json.dumps({{"ours": sorted(ours), "on_gpu0": sorted(on_gpu0 & ours)}}))


if __name__ == "__main__":
    main()
""")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(got["ours"]) >= 1 + workers and got["on_gpu0"] == [], got


@pytest.mark.parametrize("way", ["reused", "bounded", "neither"])
def test_outputs_in_flight_stay_bounded_behind_a_slow_consumer_stream(folder, way, monkeypatch):
    """The training loop's thread runs steps ahead of the GPU: each output it drops returns to torch's cache only
    once its stream has run past it. The ops stage reuses the outputs the loop dropped, queued after its stream
    (`Outputs.dense_output`), or, for batches it cannot (ragged ones), waits for the stream to pass the
    hand-over before (`Outputs.bound_outputs`), so the memory torch reserves stays put; with neither (to show
    the test can tell) every step behind takes a new output's memory."""
    from ingest.engine.outputs import Outputs
    if way != "reused":
        monkeypatch.setattr(Outputs, "dense_output", lambda self, work: None)
    if way == "neither":
        monkeypatch.setattr(Outputs, "bound_outputs", lambda self: None)
    ops = [RandomResizedCrop(256), Flip(p=0.5), Normalize(MEAN, STD)]
    # CPU decode: with GPU decode the unbounded control stayed within 3.3 outputs on an H200 (the loader did not
    # run ahead of the slow stream there: something else waits for it), so it could not tell
    loader = ingest.Loader(folder, batch_size=8, device="cuda", decode="cpu", ops=ops, shuffle=True, seed=1,
                           num_workers=0, last_batch="drop")
    out_bytes = 8 * 3 * 256 * 256 * 4
    steps = 0
    with loader:
        for epoch in range(12):
            for x, y in loader:
                torch.cuda._sleep(100_000_000)   # a slow step on the consumer's stream
                steps += 1
                if steps == 4:
                    torch.cuda.synchronize()
                    base = torch.cuda.memory_reserved()
        grown = torch.cuda.memory_reserved() - base
        torch.cuda.synchronize()
    assert steps == 24
    if way != "neither":
        assert grown <= 2 * out_bytes, f"{grown / out_bytes:.1f} outputs' worth of memory more"
    else:
        assert grown >= 6 * out_bytes


@pytest.mark.parametrize("decode", ["mixed", "cpu"])
def test_a_loop_uses_three_outputs_and_never_sees_one_rewritten_behind_its_stream(folder, decode):
    """`Outputs.dense_output`: a plain loop whose steps queue behind a slow stream gets every batch as it was
    made (each batch's sum, taken on the loop's stream after the sleep, equals a loader's whose loop waited for
    each batch), each in one of at most prefetch + 1 = 3 output buffers the ops stage keeps (two where the loop
    keeps up with the loader). Each epoch's smaller last batch is written into the first rows of one of them,
    and decoded into an arena of the same size as the others: neither is made again for it."""
    ops = [RandomResizedCrop(64), Flip(p=0.5), Normalize(MEAN, STD)]

    def make():   # 19 images: batches of 6, 6, 6 and 1; the Python executor's outputs (the native engine's ring:
        with ingest.defaults.set(engine="python"):   # tests/test_native_gpu.py)
            return ingest.Loader(folder, batch_size=6, device="cuda", decode=decode, ops=ops, shuffle=True, seed=5,
                                 num_workers=0, last_batch="partial", prefetch=2)

    with make() as loader:
        want = [x.double().sum().item() for epoch in range(3) for x, _ in loader]
    sums, kept = [], []
    with make() as loader:
        for epoch in range(3):
            for x, _ in loader:
                torch.cuda._sleep(20_000_000)   # the loop runs ahead of its stream
                sums.append(x.double().sum())
                buffers = [t.data_ptr() for t in loader.pipeline.ops_stage.outputs._kept]
                kept.append((x.untyped_storage().data_ptr() in buffers, len(buffers), len(x)))
        assert [t.shape[0] for t in loader.pipeline.ops_stage.outputs._kept] == [6] * len(loader.pipeline.ops_stage.outputs._kept)
        made = loader.stats()["buffers"]
        assert made["outputs_made"] <= 3, made
        if decode == "mixed":
            # each lane's batch, those queued for the ops stage and the ops stage's: never one more per epoch
            assert made["arenas_made"] <= len(loader.pipeline.lanes) + 2 + 1, made
    assert [s.item() for s in sums] == want
    assert [n for _, _, n in kept] == [6, 6, 6, 1] * 3
    assert all(inside and n <= 3 for inside, n, _ in kept), kept


def test_batches_the_user_keeps_are_never_written_again(folder):
    """Batches kept (a list of them all, and a view of one) are not reused: each still holds what it held
    when it was handed over, and a loader whose every output is kept still runs to the end."""
    ops = [RandomResizedCrop(64), Normalize(MEAN, STD)]
    loader = ingest.Loader(folder, batch_size=4, device="cuda", ops=ops, shuffle=True, seed=2, num_workers=0,
                           last_batch="drop")
    kept, copies, views = [], [], []
    with loader:
        for epoch in range(2):
            for k, (x, _) in enumerate(loader):
                copies.append(x.clone())
                if k % 2:
                    kept.append(x)
                else:
                    views.append(x[1:3, 0])   # only a view of this batch stays
    torch.cuda.synchronize()
    assert len(copies) == 8
    assert all(torch.equal(x, c) for x, c in zip(kept, copies[1::2]))
    assert all(torch.equal(v, c[1:3, 0]) for v, c in zip(views, copies[0::2]))


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_taken_on_a_thread_that_never_touched_cuda(folder, workers):
    """A loader iterated on a thread of the user's that never made a CUDA call (a prefetching thread): the
    driver calls at each hand-over need a current context there (`ingest._driver.on_device`), and the batches
    are those the making thread gets."""
    import threading
    kw = dict(batch_size=8, device="cuda", ops=[RandomResizedCrop(64), Flip(p=0.5), Normalize(MEAN, STD)],
              shuffle=True, seed=3, num_workers=workers)
    ref = [(x.cpu(), y.cpu()) for x, y in ingest.Loader(folder, **kw)]
    loader = ingest.Loader(folder, **kw)
    got, errors = [], []

    def consume():
        try:
            got.extend((x.cpu(), y.cpu()) for x, y in loader)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    thread = threading.Thread(target=consume)
    thread.start()
    thread.join(120)
    loader.close()
    assert not errors, errors
    assert len(got) == len(ref) == 3
    for (a, la), (b, lb) in zip(ref, got):
        assert torch.equal(la, lb) and (a - b).abs().mean() < 1e-3


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("ops, ragged", [([Resize((32, 32))], False), ([Resize(32)], True)],
                         ids=["dense", "ragged"])
def test_batches_of_gpu1_taken_on_a_thread_on_gpu0(folder, ops, ragged):
    """A thread working on GPU 0 takes a GPU 1 loader's batches: every image and label arrives on GPU 1, and
    the thread is left on GPU 0. `Resize(32)` keeps each image's aspect, so the folder's mixed sizes make
    ragged batches (a list of tensors); `Resize((32, 32))` makes one tensor per batch."""
    import threading
    loader = ingest.Loader(folder, batch_size=8, device="cuda:1", ops=ops, num_workers=0, ragged=ragged)
    seen = {"images": 0, "devices": set(), "lists": set()}

    def consume():
        try:
            torch.cuda.set_device(0)
            torch.ones(1, device="cuda:0")
            for x, y in loader:
                images = x if isinstance(x, list) else [x]
                seen["lists"].add(isinstance(x, list))
                seen["devices"] |= {t.device.index for t in images} | {y.device.index}
                seen["images"] += len(y)
            seen["after"] = torch.cuda.current_device()
        except BaseException as err:   # noqa: BLE001 - reported by the assert below, not lost in the thread
            seen["error"] = f"{type(err).__name__}: {err}"

    thread = threading.Thread(target=consume)
    thread.start()
    thread.join(120)
    loader.close()
    assert seen == {"images": 19, "devices": {1}, "lists": {ragged}, "after": 0}
