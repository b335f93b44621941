"""The Loader end to end on the CPU: shapes, determinism, resumption, sharding, failures, shutdown."""

import contextlib
import gc
import pickle
import re
import threading
import time

from dataclasses import replace

import numpy as np
import pytest
import torch

import ingest
from ingest.errors import ConfigError, DecodeError, FailureBudgetExceeded
from ingest.ops import Flip, Normalize, RandomResizedCrop, Resize
from conftest import jpeg_bytes

MEAN, STD = (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)


def train_ops(size=32):
    return [RandomResizedCrop(size), Flip(p=0.5), Normalize(MEAN, STD)]


def collect(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def test_batches_shapes_and_labels(image_folder):
    loader = ingest.Loader(image_folder, batch_size=4, ops=train_ops(), num_threads=2)
    batches = collect(loader)
    assert len(batches) == len(loader) == 6  # 21 samples, partial last batch
    x, y = batches[0]
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32 and x.device.type == "cpu"
    assert y.dtype == torch.int64
    labels = torch.cat([y for _, y in batches]).tolist()
    assert labels == [0] * 7 + [1] * 5 + [2] * 9  # no shuffle: dataset order
    assert batches[-1][0].shape[0] == 1
    stats = loader.stats()
    assert stats["read_path"] == "posix" and stats["decode"] == "cpu"
    assert set(stats["decode_paths"]) == {"cpu"} and stats["decode_paths"]["cpu"] >= 21   # + the read-ahead
    assert stats["gpu_fallbacks"] == {}   # no GPU decoder, so no image refused by one
    assert set(stats["stages"]) == {"read", "decode", "ops"}
    assert stats["stages"]["decode"]["batches"] >= 6


def test_stage_cpu_seconds_count_the_threads_own_work_not_its_waits():
    """`StageStats` splits a stage's busy time into what its thread computed (the GIL it needs) and waits."""
    from ingest.engine import StageStats

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    stats = StageStats("read")
    stats.timed(spin, 0.2)
    stats.timed(time.sleep, 0.2)
    d = stats.as_dict(2)
    assert d["batches"] == 2 and d["seconds"] >= 0.4
    assert 0.1 < d["cpu_seconds"] < 0.3     # the spin, not the sleep


def test_the_ops_output_frees_the_decoded_arena_only_when_it_is_other_memory():
    from ingest.ops.base import ImageArena
    from ingest.engine.ops import _shares_memory
    arena = ImageArena(torch.zeros(64, dtype=torch.uint8), np.array([0, 12]), np.array([[2, 2], [2, 2]]))
    assert not _shares_memory(torch.zeros(2, 3, 2, 2), arena)          # the warp wrote a new tensor
    assert _shares_memory(arena.storage[12:24].view(1, 2, 2, 3), arena)  # a view of it (no ops)
    assert _shares_memory(list(arena), arena) and _shares_memory(arena, arena)
    assert _shares_memory(torch.zeros(1), [torch.zeros(1)])             # not an arena: nothing to free
    # a batch with an image turned (a copy) comes back as a list of the arena's views and that copy
    turned = [arena[0], arena[1].flip(0).contiguous()]
    assert not _shares_memory(torch.zeros(2, 3, 2, 2), turned)
    assert _shares_memory(arena.storage[12:24].view(1, 2, 2, 3), turned)


def test_arena_under_finds_the_buffer_a_batch_views():
    from ingest.decode.arena import ImageArena, arena_under
    arena = ImageArena(torch.zeros(64, dtype=torch.uint8), np.array([0, 12]), np.array([[2, 2], [2, 2]]))
    assert arena_under(arena) is arena.storage
    assert arena_under([torch.ones(2, 2, 3, dtype=torch.uint8), arena[1]]) is arena.storage
    assert arena_under([arena[0].clone()]) is None and arena_under(torch.zeros(3)) is None


def test_events_fall_back_to_torch_without_the_cuda_driver(monkeypatch):
    from ingest import _driver
    monkeypatch.setattr(_driver, "_driver", lambda: None)
    assert isinstance(_driver.new_event(), torch.cuda.Event)


def test_a_consuming_thread_is_put_on_the_loaders_device_only_where_needed(monkeypatch):
    """`_driver.on_device`: a thread with no current CUDA context is bound to the device for good; one on
    another device is switched for the block; one on the device is left alone."""
    import ctypes
    from ingest import _driver

    class Lib:   # the two driver calls, as ctypes would make them
        def __init__(self, ctx, device):
            self.ctx, self.device = ctx, device

        def cuCtxGetCurrent(self, out):
            ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = self.ctx
            return 0

        def cuCtxGetDevice(self, out):
            ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = self.device
            return 0

    bound = []
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    gpu1 = torch.device("cuda", 1)
    monkeypatch.setattr(_driver, "_driver", lambda: Lib(None, -1))
    with _driver.on_device(gpu1):
        pass
    assert bound == [gpu1]
    monkeypatch.setattr(_driver, "_driver", lambda: Lib(1234, 1))
    assert isinstance(_driver.on_device(gpu1), contextlib.nullcontext)
    monkeypatch.setattr(_driver, "_driver", lambda: Lib(1234, 0))
    switch = _driver.on_device(gpu1)
    assert isinstance(switch, torch.cuda.device) and switch.idx == 1 and bound == [gpu1]
    assert isinstance(_driver.on_device(torch.device("cpu")), contextlib.nullcontext)


def test_same_seed_same_batches_and_epochs_differ(image_folder):
    def run(seed):
        loader = ingest.Loader(image_folder, batch_size=5, ops=train_ops(), shuffle=True, seed=seed)
        return collect(loader), collect(loader)
    (e0, e1), (f0, _) = run(7), run(7)
    for (a, la), (b, lb) in zip(e0, f0):
        assert torch.equal(a, b) and torch.equal(la, lb)
    assert not all(torch.equal(a, b) for (a, _), (b, _) in zip(e0, e1))


@pytest.mark.parametrize("workers", [{}, {"num_workers": 2, "worker_stages": "read"}])
def test_resume_mid_epoch_matches_uninterrupted(image_folder, workers):
    kw = dict(batch_size=4, ops=train_ops(), shuffle=True, seed=1)
    ref = ingest.Loader(image_folder, **kw)
    collect(ref)                 # epoch 0
    full = collect(ref)          # epoch 1
    kw.update(workers)
    run = ingest.Loader(image_folder, **kw)
    collect(run)
    it = iter(run)
    head = [next(it) for _ in range(2)]
    state = run.state_dict()
    assert state["epoch"] == 1 and state["batch"] == 2
    del it
    resumed = ingest.Loader(image_folder, **kw)
    resumed.load_state_dict(state)
    tail = collect(resumed)
    got = [(x, y) for x, y in head] + tail
    assert len(got) == len(full)
    for (a, la), (b, lb) in zip(got, full):
        assert torch.equal(a, b) and torch.equal(la, lb)
    assert resumed.state_dict()["epoch"] == 2 and resumed.state_dict()["batch"] == 0


def test_load_state_dict_rejects_another_order(image_folder):
    a = ingest.Loader(image_folder, batch_size=4, ops=train_ops(), shuffle=True, seed=0)
    b = ingest.Loader(image_folder, batch_size=4, ops=train_ops(), shuffle=True, seed=1)
    with pytest.raises(ConfigError, match="seed=0/1"):
        b.load_state_dict(a.state_dict())


def test_shards_cover_dataset_with_pad(image_folder):
    seen, pads = [], 0
    for r in range(3):
        loader = ingest.Loader(image_folder, batch_size=4, ops=[Resize((16, 16))], shuffle=True, seed=2,
                               shard_id=r, num_shards=3, last_batch="pad", output="dict")
        for b in loader:
            assert b["images"].shape[0] == 4
            seen += b["indices"][~b["is_pad"]].tolist()
            pads += int(b["is_pad"].sum())
        assert len(loader) == 2
    assert sorted(seen) == list(range(21)) and pads == 3 * 8 - 21


def test_memory_source_and_stream():
    items = [jpeg_bytes(30 + i, 40, seed=i) for i in range(5)]
    loader = ingest.Loader(items, batch_size=2, ops=[Resize((8, 8))])
    batches = [x for x, _ in loader]
    # uint8 without Normalize: an NCHW shape over NHWC memory (torch's channels_last), as the Loader documents
    assert [tuple(x.shape) for x in batches] == [(2, 3, 8, 8), (2, 3, 8, 8), (1, 3, 8, 8)]
    assert all(x.dtype == torch.uint8 and x.is_contiguous(memory_format=torch.channels_last) for x in batches)
    stream = ingest.Loader(((b, i) for i, b in enumerate(items)), batch_size=3, ops=[Resize((8, 8))])
    labels = [y.tolist() for _, y in stream]
    assert labels == [[0, 1, 2], [3, 4]]
    with pytest.raises(TypeError):
        len(stream)


def test_corrupt_file_raises_typed_error_naming_it(image_folder):
    bad = image_folder / "dog" / "0002.jpg"
    bad.write_bytes(bad.read_bytes()[:200])
    loader = ingest.Loader(image_folder, batch_size=4, ops=train_ops())
    with pytest.raises(DecodeError) as e:
        collect(loader)
    assert "0002.jpg" in str(e.value)


def test_failure_budget_skips_and_reports(image_folder):
    for name in ("0001.jpg", "0003.jpg"):
        (image_folder / "cat" / name).write_bytes(b"\xff\xd8\xff garbage")
    loader = ingest.Loader(image_folder, batch_size=4, ops=train_ops(), max_failures=2)
    n = sum(len(y) for _, y in loader)
    assert n == 19
    failures = loader.stats()["failures"]
    assert [f[0].rsplit("/", 1)[-1] for f in failures] == ["0001.jpg", "0003.jpg"]
    assert all(f[1] == "decode" for f in failures)
    strict = ingest.Loader(image_folder, batch_size=4, ops=train_ops(), max_failures=1)
    with pytest.raises(FailureBudgetExceeded, match="2 samples failed.*decode: 2") as e:
        collect(strict)
    assert len(e.value.failures) == 2
    frac = ingest.Loader(image_folder, batch_size=4, ops=train_ops(), max_failures=0.1)  # 10% of 24 -> 2
    assert sum(len(y) for _, y in frac) == 19


def _read_thread():
    return [t for t in _stage_threads() if t.name == "ingest-read"]


def _wait_for_read_ahead(loader, batches: int) -> None:
    """Until the read stage has read past ``batches`` (the epoch just consumed) into the next epoch."""
    deadline = time.monotonic() + 10
    while loader.stats()["stages"]["read"]["batches"] <= batches:
        assert time.monotonic() < deadline, "the next epoch was not read ahead"
        time.sleep(0.01)


def test_epochs_run_on_without_draining(image_folder):
    """After an epoch the stage threads read on into the next one; the next iter() takes those batches when it
    asks for that epoch from its start with the same outputs (they equal a fresh loader's), and anything else
    starts over. Each epoch counts its failures against its own budget."""
    (image_folder / "cat" / "0001.jpg").write_bytes(b"\xff\xd8\xff garbage")
    kw = dict(batch_size=4, ops=train_ops(), shuffle=True, seed=5, max_failures=1)

    def epoch_of(e, output="tuple"):
        with ingest.Loader(image_folder, output=output, **kw) as fresh:
            fresh.set_epoch(e)
            return [(b["images"].clone(), b["labels"].clone()) if output == "dict" else (b[0].clone(), b[1].clone())
                    for b in fresh]

    def same(got, want):
        return len(got) == len(want) and all(torch.equal(a, c) and torch.equal(b, d)
                                            for (a, b), (c, d) in zip(got, want))

    loader = ingest.Loader(image_folder, **kw)
    assert same(collect(loader), epoch_of(0))
    reader = _read_thread()
    _wait_for_read_ahead(loader, 6)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batch"] == 0
    assert same(collect(loader), epoch_of(1))   # the epoch read ahead, taken over
    assert _read_thread() == reader and len(loader.stats()["failures"]) == 1   # epoch 1's own budget
    loader.set_epoch(2)                           # the epoch it reads ahead: taken over too
    assert same(collect(loader), epoch_of(2)) and _read_thread() == reader
    loader.set_epoch(7)                           # another epoch: the read-ahead is dropped
    assert same(collect(loader), epoch_of(7)) and _read_thread() != reader
    reader = _read_thread()
    loader.output = "dict"                        # other outputs: started over, with every field
    got = [(b["images"].clone(), b["labels"].clone()) for b in loader]
    assert same(got, epoch_of(8, "dict")) and _read_thread() != reader
    reader = _read_thread()
    for i, _ in enumerate(loader):                # a broken-off epoch is not run on
        if i == 1:
            break
    assert _read_thread() == []
    assert same([(b["images"].clone(), b["labels"].clone()) for b in loader], epoch_of(10, "dict"))
    loader.close()
    assert _read_thread() == []


def test_missing_file_is_reported(image_folder):
    loader = ingest.Loader(image_folder, batch_size=4, ops=train_ops())
    (image_folder / "emu" / "0000.jpg").unlink()
    with pytest.raises(ingest.SourceError, match="0000.jpg: cannot read"):
        collect(loader)


def _ingest_threads():
    return [t for t in threading.enumerate() if t.name.startswith("ingest-")]


def _stage_threads():
    """The executor's stage threads: read, each decode lane's, ops. A loader that finished an epoch keeps its
    threads, reading on into the next epoch, until it is closed or collected: earlier tests' loaders held in
    reference cycles (a caught exception's traceback and the test's frame) are collected first."""
    gc.collect()
    return [t for t in _ingest_threads() if re.fullmatch(r"ingest-(read|decode\d*|ops)", t.name)]


@pytest.mark.parametrize("lanes", [1, 2])
def test_break_and_errors_leave_no_threads(image_folder, lanes):
    before = len(_ingest_threads())
    with ingest.defaults.set(decode_batches=lanes):
        loader = ingest.Loader(image_folder, batch_size=2, ops=train_ops(), prefetch=1)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert _stage_threads() == []

    class Boom(Resize):
        def apply(self, images, params):
            raise RuntimeError("boom in a stage")
    bad = ingest.Loader(image_folder, batch_size=2, ops=[Boom((8, 8))])
    with pytest.raises(RuntimeError, match="boom in a stage") as e:
        collect(bad)
    assert any("apply" in str(tb.name) for tb in __import__("traceback").extract_tb(e.value.__traceback__))
    assert _stage_threads() == []
    loader.close(), bad.close()
    assert len(_ingest_threads()) <= before


@pytest.mark.parametrize("lanes", [2, 3])
def test_decode_lanes_keep_batches_in_order(image_folder, lanes):
    """Batches decoded by several lanes at once come out in order and equal to one lane's, over epochs and a
    resume; an error in any lane's batch reaches the caller after the batches before it, and no thread stays."""
    kw = dict(batch_size=2, ops=train_ops(), shuffle=True, seed=3, num_threads=2)
    one = ingest.Loader(image_folder, **kw)
    want = [collect(one), collect(one)]
    with ingest.defaults.set(decode_batches=lanes):
        many = ingest.Loader(image_folder, **kw)
        assert len(many.pipeline.lanes) == lanes
        for epoch in want:
            got = collect(many)
            assert len(got) == len(epoch) == 11
            for (a, la), (b, lb) in zip(got, epoch):
                assert torch.equal(a, b) and torch.equal(la, lb)
        many.close()   # the counts below include the third epoch's read-ahead, up to the queues' places
        assert 22 <= many.stats()["stages"]["decode"]["batches"] <= 22 + 3 * 2 + 3
        assert 42 <= sum(many.stats()["decode_paths"].values()) <= 42 + (3 * 2 + 3) * 2

        resumed = ingest.Loader(image_folder, **kw)
        it = iter(resumed)
        first = [next(it) for _ in range(3)]
        state = resumed.state_dict()
        resumed.close()
        rest = ingest.Loader(image_folder, **kw)
        rest.load_state_dict(state)
        got = [(x.clone(), y.clone()) for x, y in first] + collect(rest)
        for (a, la), (b, lb) in zip(got, want[0]):
            assert torch.equal(a, b) and torch.equal(la, lb)

        bad = image_folder / "dog" / "0002.jpg"   # dataset index 9: the fifth batch in order
        bad.write_bytes(bad.read_bytes()[:200])
        plain = ingest.Loader(image_folder, batch_size=2, ops=train_ops())
        seen = []
        with pytest.raises(DecodeError, match="0002.jpg"):
            for _, y in plain:
                seen.append(y.tolist())
        assert seen == [[0, 0], [0, 0], [0, 0], [0, 1]]
    one.close(), rest.close()   # they finished an epoch: their threads read on into the next until closed
    assert _stage_threads() == []


@pytest.mark.parametrize("lanes", [1, 2])
def test_stages_work_only_with_room_for_the_result(image_folder, lanes):
    """A stage takes its place in the queue after it before it starts a batch: while the consumer holds the
    first batch, the ops stage has made at most ``prefetch`` more (none finished and waiting in its thread),
    and the decode stage at most the places after it plus the one in the ops stage's hands."""
    import time
    with ingest.defaults.set(decode_batches=lanes):
        loader = ingest.Loader(image_folder, batch_size=1, ops=train_ops(), prefetch=2, num_threads=1)
    it = iter(loader)
    next(it)
    deadline = time.monotonic() + 20
    while loader.stats()["stages"]["ops"]["batches"] < 1 + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)   # time to run further, had a stage not waited for room
    stages = loader.stats()["stages"]
    assert stages["ops"]["batches"] == 1 + 2
    assert stages["decode"]["batches"] <= stages["ops"]["batches"] + 2 + 1
    assert stages["read"]["batches"] < 21
    loader.close()


def test_generic_iterator(image_folder):
    loader = ingest.Loader(image_folder, batch_size=8, ops=train_ops())
    it = ingest.GenericIterator(loader, output_map=["data", "label"])
    steps = list(it)
    assert len(steps) == 3 and set(steps[0][0]) == {"data", "label"}
    assert steps[0][0]["data"].shape == (8, 3, 32, 32)
    it.reset()
    assert len(list(it)) == 3


def test_config_errors(image_folder):
    with pytest.raises(ConfigError, match="Unknown decode 'gpu'. Available: mixed, cpu"):
        ingest.Loader(image_folder, batch_size=2, decode="gpu")
    with pytest.raises(ConfigError, match="max_failures"):
        ingest.Loader(image_folder, batch_size=2, max_failures=-1)
    with pytest.raises(ConfigError, match="`prefetch` must be >= 1"):
        ingest.Loader(image_folder, batch_size=2, prefetch=0)
    with pytest.raises(TypeError):
        ingest.Loader(image_folder, batch_size=2, pin_memory=True)  # unknown options are rejected
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            ingest.Loader(image_folder, batch_size=2, device="cuda")


@pytest.mark.parametrize("stages,lanes", [("all", 1), ("read", 1), ("read", 2)])
def test_worker_processes_match_threads_and_survive_epochs(image_folder, stages, lanes):
    kw = dict(batch_size=4, ops=train_ops(), shuffle=True, seed=5)
    ref = ingest.Loader(image_folder, **kw)
    ref_epochs = [collect(ref), collect(ref)]
    with ingest.defaults.set(decode_batches=lanes):   # reader processes feed this process's decode lanes
        loader = ingest.Loader(image_folder, num_workers=2, worker_stages=stages, **kw)
    with loader:
        assert loader.worker_stages == stages
        first = collect(loader)
        it = iter(loader)          # epoch 1, abandoned after one batch
        next(it)
        del it
        loader.set_epoch(1)        # run epoch 1 again, in full
        second = collect(loader)
        for got, want in zip((first, second), ref_epochs):
            assert len(got) == len(want) == 6
            for (a, la), (b, lb) in zip(got, want):
                assert torch.equal(a, b) and torch.equal(la, lb)
        stats = loader.stats()
        assert stats["workers"] == 2 and stats["decode_paths"]["cpu"] >= 2 * 21 and stats["gpu_fallbacks"] == {}
        assert stats["stages"]["decode"]["batches"] >= 12
        if stages == "read":   # the workers only read: their read stage is reported beside this process's
            assert stats["worker_read"]["batches"] >= 12 and stats["worker_stages"] == "read"


@pytest.mark.parametrize("batch_size", [4, 1])   # 1: the bad sample's batch fails whole, its worker skips it
def test_worker_failures_count_in_every_epoch(image_folder, batch_size):
    """A failed sample counts against each epoch's budget once, also when its whole batch failed and the
    worker skipped it (its failures then come with the worker's next message, or with its end)."""
    (image_folder / "dog" / "0002.jpg").write_bytes(b"\xff\xd8\xff garbage")
    kw = dict(batch_size=batch_size, ops=train_ops(), shuffle=True, seed=4, max_failures=1)
    with ingest.Loader(image_folder, num_workers=2, **kw) as loader:
        for _ in range(4):
            assert sum(len(y) for _, y in loader) == 20
            assert [f[0].rsplit("/", 1)[-1] for f in loader.stats()["failures"]] == ["0002.jpg"]


@pytest.mark.parametrize("stages", ["all", "read"])
@pytest.mark.parametrize("cut", [300, 30])   # a truncated scan fails the decode; no frame header, the probe
def test_worker_errors_reach_the_caller(image_folder, stages, cut):
    bad = image_folder / "emu" / "0004.jpg"
    bad.write_bytes(bad.read_bytes()[:cut])
    kw = dict(batch_size=4, ops=train_ops(), num_workers=2, worker_stages=stages)
    with ingest.Loader(image_folder, **kw) as loader:
        with pytest.raises(DecodeError) as e:
            collect(loader)
        assert "0004.jpg" in str(e.value)
        if stages == "all" or cut == 30:   # raised in a worker: its traceback comes along
            assert "Traceback" in str(e.value.__cause__)
    with ingest.Loader(image_folder, max_failures=1, **kw) as loader:
        assert sum(len(y) for _, y in loader) == 20
        assert [f[0].rsplit("/", 1)[-1] for f in loader.stats()["failures"]] == ["0004.jpg"]
    with pytest.raises(ConfigError, match="`num_workers` must be an int >= 0"):
        ingest.Loader(image_folder, batch_size=4, num_workers=-1)


@pytest.mark.parametrize("stages", ["all", "read"])
def test_closing_workers_mid_epoch_is_prompt(image_folder, stages):
    import time
    loader = ingest.Loader(image_folder, batch_size=2, ops=train_ops(), num_workers=2, prefetch=1,
                           worker_stages=stages)
    it = iter(loader)
    next(it)
    procs = list(loader._pool._procs)
    t0 = time.perf_counter()
    loader.close()
    assert time.perf_counter() - t0 < 8, "workers should stop at the next batch, not be killed on a timeout"
    assert procs and all(p.exitcode == 0 for p in procs)  # exited by themselves, not terminated


def test_read_stage_batches_cross_processes_as_buffer_ranges(tmp_path):
    """A reader process's batch crosses as ranges of its shared buffer: images read there, and encoded images
    the parse made elsewhere (copied in after the reads, the buffer grown when they do not fit); other values
    travel by value."""
    from ingest.formats.base import Location, Record
    from ingest.io import ByteReader
    from ingest.engine.batch import Failures, _Work
    from ingest.sampler import BatchPlan
    from ingest.engine.workers import _InArena, pack_work, take_buffer, unpack_work
    (tmp_path / "data").write_bytes(bytes(range(100)))
    reader = ByteReader("posix", shared=2)
    read = reader.read([Location(str(tmp_path / "data"), 0, 100)])[0]
    slot, buffer, _, new = reader.last_arena
    assert (slot, new, buffer.numel()) == (0, True, 125)
    outside = bytes(range(200, 240))   # 40 bytes: 140 in all do not fit in 125
    pixels = np.zeros((2, 2, 3), np.uint8)
    plan = BatchPlan(epoch=0, number=3, indices=np.arange(4), is_pad=np.zeros(4, bool), seed=np.random.SeedSequence(0))
    work = _Work(plan, list("abcd"), plan.indices, plan.is_pad,
                 [Record(read[10:30], 1), Record(outside, 2), Record(read[60:61], 3), Record(pixels, 4)],
                 failures=Failures(0, 0))
    announced: set[int] = {0}
    packed, shared = payload = pack_work(work, reader, announced)
    assert packed.failures is None and pickle.loads(pickle.dumps(packed)).indices.tolist() == [0, 1, 2, 3]
    grown = reader.last_arena[1]
    assert grown is not buffer and grown.numel() >= 140 and 0 not in announced   # grown: sent again
    assert shared.slot == 0 and shared.nbytes == 140 and shared.buffer is grown
    assert [r.image for r in packed.records[:3]] == [_InArena(10, 20), _InArena(100, 40), _InArena(60, 1)]
    assert packed.records[3].image is pixels   # not an encoded image: travels by value
    received: list = [None, None]
    take_buffer(payload, received)
    assert received[0] is grown
    budget = Failures(2, 0)
    back = unpack_work(payload, received, budget)
    assert back.failures is budget   # later stages count against the receiver's budget
    grown.zero_()   # the sender reuses its buffer: what was received is a copy
    assert [r.label for r in back.records] == [1, 2, 3, 4]
    assert np.array_equal(back.records[0].image, np.arange(10, 30))
    assert bytes(back.records[1].image) == outside
    assert np.array_equal(back.records[2].image, [60]) and back.records[3].image is pixels
    announced.add(0)
    reader.last_arena = (0, grown, 100, False)   # the next batch, read into the grown buffer
    again = pack_work(replace(work, records=[Record(grown.numpy()[5:9], 1)]), reader, announced)
    assert again[0].records[0].image == _InArena(5, 4)
    assert (again[1].nbytes, again[1].buffer) == (100, None)   # the receiver has the buffer: only the slot
    reader.last_arena = None
    assert pack_work(work, reader, announced) == (replace(work, failures=None), None)   # nothing read into a shared buffer


def test_reader_processes_over_tfrecord_match_the_pipeline_here(tmp_path, image_folder):
    """TFRecord images are copies the parse makes (they cross in the shared buffer, after the reads): the
    batches are those of the pipeline run here."""
    from ingest.tools.cli import main as cli
    assert cli(["convert", str(image_folder), str(tmp_path / "tf"), "--to", "tfrecord"]) == 0
    kw = dict(batch_size=4, ops=train_ops(), shuffle=True, seed=3)
    want = collect(ingest.Loader(tmp_path / "tf", **kw))
    with ingest.Loader(tmp_path / "tf", num_workers=2, worker_stages="read", **kw) as loader:
        got = collect(loader)
    assert len(got) == len(want) == 6
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_worker_stages_choices(image_folder):
    assert ingest.Loader(image_folder, batch_size=4, num_workers=1).worker_stages == "all"   # CPU decode: auto
    assert ingest.Loader(image_folder, batch_size=4).worker_stages is None
    with pytest.raises(ConfigError, match="Unknown worker_stages 'decode'. Available: auto, all, read"):
        ingest.Loader(image_folder, batch_size=4, num_workers=1, worker_stages="decode")
    from test_fields import Pixels   # a source of decoded pixels: nothing for a reader process to hand over
    with pytest.raises(ConfigError, match="worker_stages='read' needs a source of encoded images; this one has "
                                          "pixels images"):
        ingest.Loader(Pixels(), batch_size=2, num_workers=1, worker_stages="read", output="dict")


def test_small_cpu_tensors_cross_to_the_parent_by_value():
    from ingest.engine import Batch
    from ingest.engine.workers import _ByValue, _transport
    big = torch.zeros(1 << 15, dtype=torch.int64)   # 256 KiB: shared as torch shares tensors
    batch = Batch(torch.zeros(2, 3, 4, 4), torch.tensor([3, 4]), torch.tensor([10, 11]), torch.tensor([False, True]),
                  {"boxes_lengths": torch.tensor([1, 0]), "big": big, "caption": ["a", "b"]}, None, 5)
    sent = _transport(batch)
    assert isinstance(sent.indices, _ByValue) and isinstance(sent.fields["boxes_lengths"], _ByValue)
    assert isinstance(sent.images, _ByValue)   # 384 bytes of CPU images: by value too
    assert sent.fields["big"] is big and sent.fields["caption"] == ["a", "b"]
    back = _transport(sent, back=True)
    for name in ("images", "labels", "indices", "is_pad"):
        assert torch.equal(getattr(back, name), getattr(batch, name))
    assert torch.equal(back.fields["boxes_lengths"], batch.fields["boxes_lengths"]) and back.number == 5


def test_read_ahead_reads_the_next_batch_while_this_one_is_used():
    """A full worker's read-ahead: items in order, each the read stage's result, the next one read on another
    thread before the consumer asks for it; a read's error comes out at its own item; close() waits."""
    import threading
    from ingest.engine import StageStats
    from ingest.engine.workers import _ReadAhead

    class Reads:
        def __init__(self):
            self.device = torch.device("cpu")
            self.stage_stats = [StageStats("read")]
            self.started = {plan: threading.Event() for plan in range(5)}
            self.threads = set()

        def read(self, plan):
            self.started[plan].set()
            self.threads.add(threading.current_thread().name)
            if plan == 3:
                raise ValueError("bad batch 3")
            return ("work", plan)

    pipeline = Reads()
    ahead = _ReadAhead(pipeline, iter(range(5)))
    try:
        assert next(ahead) == ("work", 0)
        assert pipeline.started[1].wait(5)       # batch 1 is read while the consumer holds batch 0
        assert next(ahead) == ("work", 1) and next(ahead) == ("work", 2)
        with pytest.raises(ValueError, match="bad batch 3"):
            next(ahead)
        assert next(ahead) == ("work", 4)
        with pytest.raises(StopIteration):
            next(ahead)
    finally:
        ahead.close()
    assert pipeline.threads and all(n.startswith("ingest-read-ahead") for n in pipeline.threads)
    assert pipeline.stage_stats[0].batches == 5   # timed as the read stage, failures included


_FREED_TOP = """
import ctypes, json, sys
libc = ctypes.CDLL(None)
if not hasattr(libc, "mallinfo2"):
    print("skip"); sys.exit()
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = Info
def freed_top(n=16, size=1 << 20):
    mapped = libc.mallinfo2().hblks
    blocks = [bytearray(size) for _ in range(n)]
    mapped = libc.mallinfo2().hblks - mapped
    del blocks
    return mapped, libc.mallinfo2().keepcost
"""


def _heap_after(setup: str, env: dict | None = None):
    """(setup's printed value, (1 MB blocks given their own mappings, bytes kept free at the heap top)) in a
    fresh interpreter; skips where glibc has no mallinfo2."""
    import json
    import os
    import subprocess
    import sys
    script = _FREED_TOP + setup + "\nprint(json.dumps([took, freed_top()]))\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    if done.stdout.strip() == "skip":
        pytest.skip("no mallinfo2 (glibc < 2.33 or not glibc)")
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_worker_processes_keep_freed_memory_in_their_heap():
    """Worker processes tune glibc so that freed blocks stay in the heap for the next record (see
    `ingest._malloc.keep_freed_memory`): blocks of 1 MB come from the heap and, freed, stay there."""
    took, (mapped, kept) = _heap_after("from ingest._malloc import keep_freed_memory\ntook = keep_freed_memory()")
    assert took is True
    assert mapped == 0                 # 1 MB blocks come from the heap, not mmaps of their own
    assert kept >= 16 << 20            # freed, they stay at the top of the heap


def test_a_loader_running_its_pipeline_here_keeps_freed_memory():
    """The training process gets the same glibc settings once a Loader runs its pipeline in it (its read
    stage copies records there)."""
    setup = "import ingest\nloader = ingest.Loader([b'x'], batch_size=1, num_workers=0)\ntook = None"
    _, (mapped, kept) = _heap_after(setup)
    assert mapped == 0 and kept >= 16 << 20


@pytest.mark.parametrize("setting, workers, called", [("auto", 0, 1), ("off", 0, 0), ("auto", 1, 0)])
def test_keep_freed_memory_is_taken_where_the_pipeline_runs_unless_off(monkeypatch, setting, workers, called):
    """Not with the setting "off", nor where full worker processes run the pipeline (they tune themselves)."""
    calls = []
    monkeypatch.setattr("ingest.torch.keep_freed_memory", lambda: calls.append(1))
    with ingest.defaults.set(keep_freed_memory=setting):
        ingest.Loader([b"x"], batch_size=1, num_workers=workers)
    assert len(calls) == called


def test_auto_workers_only_where_cpu_decode_feeds_a_gpu(monkeypatch):
    from ingest.formats.base import Field
    from ingest.torch import auto_workers
    monkeypatch.setattr("ingest.defaults.cores", lambda: 16)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    plain = {"image": Field("image"), "label": Field("int")}
    boxes = {**plain, "boxes": Field("floats")}
    assert auto_workers(cuda, "mixed", plain) == 0, "GPU decode runs in the training process"
    assert auto_workers(cuda, "cpu", plain) == 4
    assert auto_workers(cuda, "mixed", boxes) == 0, "detection targets: whole-batch arrays, in the training process"
    assert auto_workers(cuda, "cpu", boxes) == 4
    assert auto_workers(cpu, "cpu", plain) == 0 and auto_workers(cpu, "cpu", boxes) == 0
    monkeypatch.setattr("ingest.defaults.cores", lambda: 2)
    assert auto_workers(cuda, "cpu", plain) == 1


def test_shares_memory_of_a_direct_read_batch_tensor():
    """A raw batch tensor goes back for reuse only when the ops' output is one tensor in other memory."""
    from ingest.engine.ops import _shares_memory
    read = torch.zeros(4, 8, 8, 3, dtype=torch.uint8)
    assert _shares_memory(read, read) and _shares_memory(read[1:], read) and _shares_memory(read[:, 2:6], read)
    assert not _shares_memory(torch.zeros(4, 3, 4, 4), read)
    assert _shares_memory([read[0], read[1]], read)   # a list of views: not handed back


def test_the_ops_stage_waits_for_the_hand_over_an_output_bound_behind(monkeypatch):
    """`Outputs.bound_outputs`: before output n the ops stage waits (host) for the consumer's stream to pass the
    hand-over of output n - ahead, only where that event has not completed; never for one not handed over."""
    from ingest.engine import outputs as pl

    class Event:
        def __init__(self, k):
            self.k, self.complete, self.waited = k, False, False

        def done(self):
            return self.complete

        def synchronize(self):
            self.waited = self.complete = True

    made = []
    monkeypatch.setattr(pl, "recorded", lambda stream: made.append(Event(len(made))) or made[-1])
    p = pl.Outputs(torch.device("cpu"), "image", None)
    p.start_outputs(3)
    for n in range(3):   # the first outputs wait for nothing
        p.bound_outputs()
        p._outputs += 1
        p.handed_over(None)
    made[1].complete = True
    p.bound_outputs()    # output 3 waits for hand-over 0
    assert [e.waited for e in made] == [True, False, False]
    p._outputs += 1
    p.bound_outputs()    # output 4: hand-over 1 has run, no wait
    assert [e.waited for e in made] == [True, False, False]
    p._outputs += 2      # output 6: hand-over 3 has not happened yet: no wait
    p.bound_outputs()
    assert not any(e.waited for e in made[1:])
    p.handed_over(None)
    p.bound_outputs()
    assert made[3].waited
    for _ in range(100):  # past the deque's length: indices still line up
        p.handed_over(None)
        p._outputs += 1
    p._outputs = p._handed_count + 2   # output n waits for hand-over n - 3
    p.bound_outputs()
    assert [e.k for e in made if e.waited][-1] == p._handed_count - 1
    p.start_outputs(None)   # no bound: never waits
    p._outputs = 50
    p.bound_outputs()


def test_an_output_is_reused_once_nothing_but_the_ops_stage_holds_it(monkeypatch):
    """`Outputs.dense_output`: while fewer than ``ahead`` outputs exist a new one is made; then one that no
    tensor of the user's holds (not even a view) is reused, its reuse queued after events recorded on every
    stream the consumer took batches on when its batch was dropped (not after what the loop queued since);
    while all are held it waits for one to be dropped, and makes a new one rather than wait once the consumer
    has taken every batch made."""
    from types import SimpleNamespace
    from ingest.engine import outputs as pl
    from ingest.ops.base import ImageSpec

    stamps = iter(range(1000))
    monkeypatch.setattr(pl, "recorded", lambda stream: ("event on", stream, next(stamps)))
    waits = []
    p = pl.Outputs(torch.device("cpu"), "image", SimpleNamespace(wait_event=waits.append))
    stop = threading.Event()
    p.start_outputs(3, stop)
    plan = SimpleNamespace(out_sizes=[(4, 5)] * 2, output=ImageSpec(torch.float32, "NCHW"))
    work = SimpleNamespace(ops_plan=plan, images=torch.zeros(2, 6, 7, 3, dtype=torch.uint8), records=[1, 2])

    def make():
        out = p.dense_output(work)
        p._outputs += 1
        handed = out.detach()
        p.watch(handed, out)
        return out, handed

    made = [make() for _ in range(3)]
    assert [tuple(o.shape) for o, _ in made] == [(2, 3, 4, 5)] * 3 and not waits
    assert len({o.data_ptr() for o, _ in made}) == 3
    p.handed_over("loop")
    p.handed_over("side")
    view = made[0][1][0, 1]   # the user keeps a view of batch 0 and drops batch 1
    made[0] = made[0][0], None
    made[1] = made[1][0], None
    at_drop = sorted(p._dropped[id(made[1][0])][1])
    assert [(e[0], e[1]) for e in at_drop] == [("event on", "loop"), ("event on", "side")]
    p.handed_over("loop")                         # the loop queues more after the drop
    out, _ = make()
    assert out is made[1][0]                      # the one nothing holds, not batch 0 (its view is held)
    assert sorted(waits) == at_drop               # after the drop, not after what came since

    def drop_later():
        time.sleep(0.2)
        made[2] = made[2][0], None

    waits.clear()
    threading.Thread(target=drop_later).start()
    t0 = time.perf_counter()
    again, held = make()                           # all three held: waits for batch 2 to be dropped
    assert again is made[2][0] and time.perf_counter() - t0 >= 0.15 and len(waits) == 2
    p._handed_count = p._outputs                   # the consumer took every batch made: no wait, a new one
    t0 = time.perf_counter()
    new, _ = make()
    assert time.perf_counter() - t0 < 0.1 and all(new is not o for o, _ in made)
    assert len(p._kept) == 3 and view.shape == (4, 5)
    p.start_outputs(None)
    assert p.dense_output(work) is None          # no executor bound: torch allocates


def test_a_smaller_batch_is_written_into_a_kept_output_and_another_shape_replaces_one(monkeypatch):
    """`Outputs.dense_output`: an epoch's smaller last batch takes a kept output that nothing holds (its first
    rows), with no wait and nothing made; a batch of another output size makes a new one, which replaces a
    kept output that does not fit it rather than one that does."""
    from types import SimpleNamespace
    from ingest.engine import outputs as pl
    from ingest.ops.base import ImageSpec

    monkeypatch.setattr(pl, "recorded", lambda stream: None)
    p = pl.Outputs(torch.device("cpu"), "image", SimpleNamespace(wait_event=lambda event: None))
    p.start_outputs(2, threading.Event())

    def work(n, size=(4, 5)):
        plan = SimpleNamespace(out_sizes=[size] * n, output=ImageSpec(torch.float32, "NCHW"))
        return SimpleNamespace(ops_plan=plan, images=torch.zeros(n, 6, 7, 3, dtype=torch.uint8), records=[0] * n)

    def make(w):
        out = p.dense_output(w)
        p._outputs += 1
        handed = out[:len(w.records)]
        p.watch(handed, out)
        return out, handed

    a, b = make(work(3)), make(work(3))
    held = b[1]
    a = a[0]
    t0 = time.perf_counter()
    small, _ = make(work(1))                 # batch b is held, a is not: a's first row takes it
    assert small is a and time.perf_counter() - t0 < 0.04
    assert [tuple(o.shape) for o in p._kept] == [(3, 3, 4, 5)] * 2
    wide, _ = make(work(3, (4, 9)))          # another size: a new output, replacing the oldest that fits
    assert tuple(wide.shape) == (3, 3, 4, 9) and len(p._kept) == 2 and held.shape == (3, 3, 4, 5)
    again, _ = make(work(3))                 # back to the first size: the wide one does not fit, so it goes
    assert [tuple(o.shape) for o in p._kept] == [(3, 3, 4, 5)] * 2 and again is not wide
    keep = [o[:1] for o in p._kept]          # both held, the consumer took every batch made: a smaller batch's
    p._handed_count = p._outputs             # new output has a full batch's rows
    last, _ = make(work(1))
    assert tuple(last.shape) == (3, 3, 4, 5) and len(keep) == 2


def test_held_elsewhere_counts_views_and_other_tensors_of_the_memory():
    from ingest.engine.outputs import _held_elsewhere
    t = torch.empty(8)
    assert not _held_elsewhere(t)
    v = t.view(2, 4).permute(1, 0)
    assert _held_elsewhere(t)
    del v
    assert not _held_elsewhere(t)


def test_closing_an_old_executor_leaves_the_outputs_of_the_one_running_now():
    """`Executor.close` lets the outputs kept for reuse go only if they are its own: an executor closed (or
    collected) after another started on the same pipeline leaves that one's."""
    from ingest.formats import MemorySource
    from ingest.engine import Executor
    p = ingest.Pipeline(MemorySource([jpeg_bytes(8, 8)] * 2, labels=[0, 1]), num_threads=1)
    old, new = Executor(p, iter([]), prefetch=1), Executor(p, iter([]), prefetch=1)
    kept = p.ops_stage.outputs._kept
    kept.append(torch.zeros(1))
    old.close()
    assert len(p.ops_stage.outputs._kept) == 1
    new.close()
    assert p.ops_stage.outputs._kept == []
