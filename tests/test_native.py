"""The native engine on the CPU (`ingest.native`, ``ingest._engine``): the tables sources hand it, its RecordIO
parse against the reader's, its read + parse + header scan + plan path (dry mode: no CUDA) against the Python
read stage and planner, the engine setting and its ConfigErrors, read failures through the failure budget, and
shutdown. The GPU path (decode, kernel, labels, events, fallbacks) is tests/test_native_gpu.py."""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ingest import defaults, native
from ingest.errors import ConfigError, CorruptRecordError, SourceError
from ingest.formats.base import Field, Record, read_location
from ingest.formats.filetree import FileList, FileTree
from ingest.formats.recordio import RecordIOSource, RecordIOWriter, chunks
from ingest.ops.color import ColorJitter
from ingest.decode.gpu import clip_regions
from ingest.ops.geometry import CenterCrop, HorizontalFlip, RandomResizedCrop, Resize
from ingest.engine import Failures, Pipeline
from ingest.sampler import Sampler
from ingest.torch import Loader
from conftest import encode, jpeg_bytes, make_image_folder, textured

pytestmark = pytest.mark.skipif(native.ENGINE is None, reason="ingest._engine was not built")

OPS = [RandomResizedCrop(24), HorizontalFlip()]


def dry(source, ops=OPS, *, batch_size=4, shuffle=True, seed=5, epoch=0, start=0, max_failures=0, prefetch=2,
        read_threads=3):
    """A dry NativeExecutor over ``source`` and the Python pipeline beside it."""
    chain, why = native.chain_for(source, ops)
    assert chain is not None, why
    pipe = Pipeline(source, ops=ops, device="cpu")
    sampler = Sampler(len(source), batch_size, shuffle=shuffle, seed=seed)
    failures = Failures(max_failures, sampler.samples())
    ex = native.NativeExecutor(pipe, chain, sampler, epoch=epoch, start=start, offset=0, failures=failures,
                               budget=lambda: Failures(max_failures, sampler.samples()), prefetch=prefetch,
                               dry=True, read_threads=read_threads)
    return ex, pipe, sampler


def python_rows(pipe: Pipeline, plan) -> dict:
    """What the Python read stage makes of a plan: indices, labels, probed sizes, the warp's regions, the
    regions the GPU decoder would decode, output sizes."""
    work = pipe.read(plan)
    warp = work.ops_plan.warp
    regions = warp.regions()
    return {"index": work.indices, "label": np.array([r.label for r in work.records]),
            "hw": np.array(work.sizes), "region": regions, "decode": clip_regions(regions, work.headers),
            "out": np.array(work.ops_plan.out_sizes)}


def check_same(batch, expected: dict) -> None:
    gpu = batch.column("status") == 0
    assert batch.column("index").tolist() == expected["index"].tolist()
    assert batch.column("label").tolist() == expected["label"].tolist()
    rows = batch.rows
    assert rows[gpu][:, 3:5].tolist() == expected["hw"][gpu].tolist()
    assert rows[gpu][:, 5:9].tolist() == expected["region"][gpu].tolist()
    assert rows[gpu][:, 9:13].tolist() == expected["decode"][gpu].tolist()
    assert rows[gpu][:, 13:15].tolist() == expected["out"][gpu].tolist()


# -- tables -------------------------------------------------------------------------------------------------


def test_file_tree_table_is_its_locations_and_labels(image_folder):
    src = FileTree(image_folder)
    t = src.native_table()
    assert t.kind == "whole" and t.labels.tolist() == src.labels().tolist()
    for i in range(len(src)):
        loc = src.locate(i)
        assert (t.paths[t.files[i]], t.offsets[i], t.sizes[i]) == (loc.path, loc.offset, loc.length)
    listed = FileList([src.name(0), src.name(1)])   # no sizes listed: whole files
    assert listed.native_table().sizes.tolist() == [-1, -1]


def write_records(directory: Path, records: list[Record], stem="data") -> Path:
    writer = RecordIOWriter(directory, stem, {"image": Field("image"), "label": Field("int")})
    for r in records:
        writer.add(r)
    writer.close()
    return directory / f"{stem}.rec"


def test_recordio_table_is_its_locations(tmp_path):
    rec = write_records(tmp_path, [Record(jpeg_bytes(20 + i, 30, seed=i), i % 3) for i in range(6)])
    src = RecordIOSource(rec)
    t = src.native_table()
    assert t.kind == "recordio" and t.labels is None
    for i in range(len(src)):
        loc = src.locate(i)
        assert (t.paths[t.files[i]], t.offsets[i], t.sizes[i]) == (loc.path, loc.offset, loc.length)


# -- the RecordIO parse in C against the reader ---------------------------------------------------------------


def record_cases() -> dict[str, bytes]:
    image = jpeg_bytes(12, 12)
    head = struct.Struct("<IfQQ")
    labels = np.array([2, 5, 0.5], np.float32).tobytes()
    split = bytearray(jpeg_bytes(16, 16))
    split[0:4] = struct.pack("<I", 0xCED7230A)   # the writer splits the record there
    return {
        "plain": chunks(head.pack(0, 3.0, 7, 0) + image),
        "float label": chunks(head.pack(0, 0.25, 7, 0) + image),
        "negative label": chunks(head.pack(0, -1.0, 7, 0) + image),
        "huge label": chunks(head.pack(0, 2.0 ** 31, 7, 0) + image),
        "nan label": chunks(head.pack(0, float("nan"), 7, 0) + image),
        "three float labels": chunks(head.pack(3, 0.0, 7, 0) + labels + image),
        "flag past the end": chunks(head.pack(1000, 0.0, 7, 0) + b"x" * 12),
        "no image": chunks(head.pack(0, 1.0, 7, 0)),
        "short payload": chunks(b"short"),
        "split": chunks(head.pack(0, 1.0, 7, 0) + bytes(split)),
        "wrong magic": b"\x00" * 4 + chunks(head.pack(0, 1.0, 7, 0) + image)[4:],
        "truncated": chunks(head.pack(0, 1.0, 7, 0) + image)[:40],
    }


@pytest.mark.parametrize("name", list(record_cases()))
def test_recordio_parse_matches_the_reader(tmp_path, name):
    """Where the engine takes a record, it finds the reader's image and label; what it leaves (split records,
    damage) goes to the Python reader, which joins or reports it."""
    raw = record_cases()[name]
    (tmp_path / "x.rec").write_bytes(raw)
    (tmp_path / "x.idx").write_text("0\t0\n")
    src = RecordIOSource(tmp_path / "x.rec")
    got = native.ENGINE.recordio_image(raw)
    try:
        record = src.parse(0, read_location(src.locate(0)))
    except CorruptRecordError:
        record = None
    if name in ("split", "flag past the end", "no image", "short payload", "wrong magic", "truncated"):
        assert got is None
        return
    assert record is not None and got is not None
    start, end, label = got
    assert raw[start:end] == bytes(record.image) and label == record.label


# -- the dry run against the Python read stage and planner ------------------------------------------------


def tree_with_oddities(root: Path, size=(48, 64)) -> Path:
    """An image folder with a PNG, an EXIF-rotated JPEG and a progressive JPEG among baseline ones (images of
    about ``size``)."""
    make_image_folder(root, {"a": 6, "b": 5, "c": 4} if size == (48, 64) else {"a": 9, "b": 8, "c": 7}, size=size)
    h, w = size
    Image.fromarray(textured(h - 8, w - 14, 1)).save(root / "a" / "z.png")
    exif = Image.Exif()
    exif[0x0112] = 6
    (root / "b" / "z_rotated.jpg").write_bytes(encode(Image.fromarray(textured(h - 18, w - 20, 2)), "JPEG",
                                                      exif=exif))
    (root / "c" / "z_progressive.jpg").write_bytes(encode(Image.fromarray(textured(h - 12, w - 24, 3)), "JPEG",
                                                          progressive=True))
    return root


@pytest.mark.parametrize("ops", [OPS, [Resize((20, 30)), CenterCrop(16)], [CenterCrop(40), HorizontalFlip(p=0.3)]],
                         ids=["rrc-flip", "resize-crop", "crop-padded"])
def test_dry_run_plans_what_the_python_stages_plan(tmp_path, ops):
    src = FileTree(tree_with_oddities(tmp_path / "t"))
    ex, pipe, sampler = dry(src, ops)
    try:
        for epoch in range(2):
            plans = list(sampler.batches(epoch))
            got = list(ex)
            assert [b.number for b in got] == [p.number for p in plans]
            assert ex.ended.epoch == epoch + 1
            for batch, plan in zip(got, plans):
                check_same(batch, python_rows(pipe, plan))
            statuses = np.concatenate([b.column("status") for b in got])
            indices = np.concatenate([b.column("index") for b in got])
            odd = {i for i in range(len(src)) if os.path.basename(src.name(i)).startswith("z_")}
            assert {int(i) for i in indices[statuses == 1]} == odd   # rotated, progressive: Python's (the PNG: ours)
            assert ex.fallbacks == {"not a GPU JPEG": epoch + 1, "oriented": epoch + 1}
    finally:
        ex.close()


def test_dry_run_of_a_recordio_file_reads_labels_from_the_records(tmp_path):
    records = [Record(jpeg_bytes(20 + i, 30 + 2 * i, seed=i), (7 * i) % 5) for i in range(9)]
    src = RecordIOSource(write_records(tmp_path, records))   # checked: the engine checks each record's CRC32C
    ex, pipe, sampler = dry(src, batch_size=4)
    try:
        for batch, plan in zip(ex, sampler.batches(0)):
            check_same(batch, python_rows(pipe, plan))
            assert (batch.column("status") == 0).all()
    finally:
        ex.close()


def test_stage_times_show_where_batches_wait(image_folder):
    """stats()' stage times: each batch's reads are timed, and a consumer slower than the engine shows as the
    decode thread's wait for an output slot."""
    ex, _, _ = dry(FileTree(image_folder), prefetch=1)   # two output slots
    try:
        taken = 0
        for batch in ex:
            time.sleep(0.02)
            taken += 1
            del batch
        stats = ex.stats()
    finally:
        ex.close()
    stages = {"reader_wait_job", "read", "prepare", "reader_wait_queue", "decoder_wait_batch", "wait_arena",
              "decode", "wait_slot", "output"}
    first = stats["first_stage_ms"]
    assert set(stats["stage_ms"]) == set(first) == stages
    assert stats["batches"] >= taken >= 5 and all(len(v) == stats["batches"] for v in first.values())
    assert all(t > 0 for t in first["read"]) and all(t >= 0 for v in first.values() for t in v)
    assert not any(first["wait_arena"])   # (dry: no device arenas)
    assert first["wait_slot"][0] < 10 and sum(t > 15 for t in first["wait_slot"]) >= taken - 3, first["wait_slot"]
    assert stats["stage_ms"]["wait_slot"] > stats["stage_ms"]["read"], stats["stage_ms"]


def test_dry_run_of_a_file_list_without_sizes_reads_whole_files(image_folder):
    tree = FileTree(image_folder)
    src = FileList([tree.name(i) for i in range(len(tree))], tree.labels())   # no sizes: the engine stats them
    assert (src.native_table().sizes == -1).all()
    ex, pipe, sampler = dry(src)
    try:
        for batch, plan in zip(ex, sampler.batches(0)):
            check_same(batch, python_rows(pipe, plan))
        total = sum(os.path.getsize(src.name(i)) for i in range(len(src)))
        assert ex.stats()["bytes_read"] >= total   # (and the next epoch's read-ahead)
    finally:
        ex.close()


def test_dry_run_resumes_mid_epoch_and_runs_on(image_folder):
    src = FileTree(image_folder)
    ex, pipe, sampler = dry(src, start=2, epoch=3)
    try:
        got = list(ex)
        plans = list(sampler.batches(3, 2))
        assert [b.number for b in got] == [p.number for p in plans]
        for batch, plan in zip(got, plans):
            check_same(batch, python_rows(pipe, plan))
        assert len(list(ex)) == len(sampler)   # epoch 4, whole
    finally:
        ex.close()


# -- failures -----------------------------------------------------------------------------------------------


def test_a_missing_file_raises_its_read_error_naming_it(image_folder):
    src = FileTree(image_folder)
    gone = src.name(3)
    os.remove(gone)
    ex, _, _ = dry(src, shuffle=False)
    try:
        with pytest.raises(SourceError, match=f"{gone}: cannot read"):
            list(ex)
    finally:
        ex.close()


def test_read_failures_count_against_the_budget_and_drop_their_samples(image_folder):
    src = FileTree(image_folder)
    gone, short = src.name(3), src.name(5)
    os.remove(gone)
    Path(short).write_bytes(Path(short).read_bytes()[:10])   # shorter than its listed size
    ex, _, _ = dry(src, shuffle=False, max_failures=2)
    try:
        got = list(ex)
        indices = np.concatenate([b.column("index") for b in got]).tolist()
        assert indices == [i for i in range(len(src)) if i not in (3, 5)]
        failed = ex._failures[0].items
        assert [(name, stage) for name, stage, _ in failed] == [(gone, "read"), (short, "read")]
        assert "short read" in failed[1][2]
    finally:
        ex.close()


# -- the engine setting ---------------------------------------------------------------------------------------


def test_engine_native_names_why_a_loader_is_not_eligible(image_folder):
    with defaults.set(engine="native"):
        with pytest.raises(ConfigError, match="engine='native'.*CUDA device"):
            Loader(image_folder, batch_size=2, ops=OPS)
    loader = Loader(image_folder, batch_size=2, ops=OPS)   # auto: the Python stages here
    assert loader.engine == "python"
    next(iter(loader))
    assert loader.stats()["engine"] == "python"
    loader.close()
    with pytest.raises(ConfigError, match="engine"):
        defaults.set(engine="rust")


def test_records_checked_against_their_crcs_are_eligible(tmp_path):
    """A RecordIO file written with per-record CRC32C, read with the default check, runs on the native engine,
    whose table carries the CRCs the reader checks (none with check="none")."""
    rec = write_records(tmp_path, [Record(jpeg_bytes(20, 30, seed=s), s) for s in range(3)])
    cuda = dict(device=torch.device("cuda"), decode="mixed", workers=0, streamed=False, tuple_output=True)
    checked = RecordIOSource(rec)
    assert checked.native_table().crcs is not None
    why = native.why_not(checked, OPS, **cuda, pipeline=Pipeline(checked, ops=OPS))[1]
    assert why is None or "CRC32C" not in why   # (on a host without nvImageCodec it fails later, for that)
    chain, why = native.chain_for(checked, OPS)
    assert why is None
    assert chain.table.crcs.tolist() == list(checked._crcs)
    assert native.chain_for(RecordIOSource(rec, check="none"), OPS)[0].table.crcs is None


def _corrupt_record(tmp_path, n=9, bad=4):
    """A RecordIO file of ``n`` records whose record ``bad`` has a byte of its JPEG's tail changed (its framing
    and header whole: only the CRC tells), with the path and offset of that record."""
    rec = write_records(tmp_path, [Record(jpeg_bytes(20 + i, 30, seed=i), i % 5) for i in range(n)])
    loc = RecordIOSource(rec, check="none").locate(bad)
    with open(rec, "r+b") as f:
        f.seek(loc.offset + loc.length - 40)
        byte = f.read(1)
        f.seek(loc.offset + loc.length - 40)
        f.write(bytes([byte[0] ^ 0x10]))
    return rec, loc


def test_a_record_whose_crc_differs_is_dropped_against_the_budget(tmp_path):
    rec, loc = _corrupt_record(tmp_path)
    src = RecordIOSource(rec)
    ex, pipe, sampler = dry(src, shuffle=False, max_failures=1)
    try:
        got = list(ex)
        indices = np.concatenate([b.column("index") for b in got]).tolist()
        assert indices == [i for i in range(len(src)) if i != 4]
        assert ex.stats()["failures"] >= 1
        [(name, stage, reason)] = ex._failures[0].items
        assert (name, stage) == (src.name(4), "read")
        assert reason.startswith("CorruptRecordError: ") and "CRC32C" in reason and str(rec) in reason
        assert f"at byte {loc.offset}" in reason
    finally:
        ex.close()
    unchecked, _, _ = dry(RecordIOSource(rec, check="none"), shuffle=False)   # unchecked: the record is read
    try:
        assert np.concatenate([b.column("index") for b in unchecked]).tolist() == list(range(len(src)))
    finally:
        unchecked.close()


def test_a_record_whose_crc_differs_raises_without_a_budget(tmp_path):
    rec, loc = _corrupt_record(tmp_path)
    src = RecordIOSource(rec)
    ex, _, _ = dry(src, shuffle=False)
    try:
        with pytest.raises(CorruptRecordError, match=r"CRC32C [0-9a-f]{8} of the record's \d+ bytes differs") as err:
            list(ex)
        assert (err.value.path, err.value.offset, err.value.index) == (str(rec), loc.offset, 4)
        python = src.parse_batch([4], [read_location(src.locate(4))])[0]   # the Python reader's error
        assert str(err.value) == str(python)
    finally:
        ex.close()


@pytest.mark.parametrize("ops, why", [
    ([Resize(shorter=20)], "output size depends"),
    ([RandomResizedCrop(24), ColorJitter(0.2)], "not one the native planner runs"),
])
def test_chains_the_engine_does_not_run(image_folder, ops, why):
    chain, reason = native.chain_for(FileTree(image_folder), ops)
    assert chain is None and why in reason
    with pytest.raises(ConfigError, match=why):
        native.choose("native", chain, reason)
    assert native.choose("auto", chain, reason) is None


# -- shutdown -----------------------------------------------------------------------------------------------


def native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_close_mid_epoch_leaves_no_thread(image_folder):
    before = native_threads()
    for _ in range(3):
        ex, _, _ = dry(FileTree(image_folder), batch_size=2, read_threads=4)
        assert native_threads() >= before + 5   # reader, decode thread, 3 read helpers
        next(ex)
        ex.close()
        with pytest.raises(StopIteration):
            next(ex)
    assert native_threads() == before


def test_close_from_another_thread_while_next_waits(image_folder):
    """A next() waiting for a batch (here: the two epochs queued are taken, no third is) returns, raising, when
    another thread closes the engine; close() waits for it to leave before freeing anything."""
    ex, _, _ = dry(FileTree(image_folder), batch_size=4)
    engine, ends, errors = ex._engine, [], []

    def take():
        try:
            while True:
                kind, slot, epoch, *_ = engine.next()
                if kind == native.ENGINE.EPOCH_END:
                    ends.append(epoch)
                else:
                    engine.release(slot)
        except RuntimeError as err:
            errors.append(str(err))

    t = threading.Thread(target=take)
    t.start()
    t.join(timeout=1.0)
    assert t.is_alive() and ends == [0, 1]   # waiting for an epoch that never comes
    ex.close()
    t.join(timeout=5)
    assert not t.is_alive() and errors == ["the native engine stopped"]


def test_a_forked_child_cannot_use_the_engine(image_folder):
    ex, _, _ = dry(FileTree(image_folder))
    try:
        pid = os.fork()
        if pid == 0:   # the child: every call raises, and closing or dropping touches nothing of the parent's
            try:
                ex._engine.next()
                code = 1
            except RuntimeError as err:
                code = 0 if "parent process" in str(err) else 2
            try:
                ex.close()
            except Exception:  # noqa: BLE001 - reported through the exit code
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert len(list(ex)) > 0   # the parent's engine goes on
    finally:
        ex.close()


def test_release_twice_is_refused(image_folder):
    ex, _, _ = dry(FileTree(image_folder), batch_size=2)
    try:
        kind, slot, *_ = ex._engine.next()
        ex._engine.release(slot)
        with pytest.raises(ValueError, match="released twice"):
            ex._engine.release(slot)
    finally:
        ex.close()


def _engine_nice_values() -> dict[str, int]:
    """The nice value (field 19 of /proc/self/task/TID/stat) of each of this process's engine threads (named
    ingest-*), by thread id."""
    values = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:   # a thread that ended meanwhile
            continue
        name, _, rest = stat.partition("(")[2].rpartition(")")
        if name.startswith("ingest-"):
            values[tid] = int(rest.split()[16])
    return values


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread nice values are read from Linux /proc")
@pytest.mark.parametrize("nice", [0, 7])
def test_the_engine_threads_run_at_the_engine_nice_setting(image_folder, nice):
    before = _engine_nice_values()   # (an earlier test's loader not yet collected may still run its threads)
    with defaults.set(engine_nice=nice):
        ex, _, _ = dry(FileTree(image_folder), batch_size=2, read_threads=3)
    try:
        next(ex)
        values = [v for tid, v in _engine_nice_values().items() if tid not in before]
        assert len(values) >= 4   # reader, decode thread, 2 read helpers
        assert set(values) == {min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)}
    finally:
        ex.close()
    assert set(_engine_nice_values()) <= set(before)


# -- the hand-over ------------------------------------------------------------------------------------------


class _Owner:
    """The part of a NativeExecutor a batch's drops reach: its slots and `_give_back` (noting the slot and
    whether it was lost)."""

    _closed = False

    def __init__(self, slot):
        self._slots, self.back = [slot], []

    def _give_back(self, k):
        self.back.append((k, self._slots[k].lost))


def test_a_slot_goes_back_when_the_last_tensor_handed_from_it_is_dropped():
    slot = native._Slot(torch.zeros(4, 2, 2, 3), torch.zeros(4, dtype=torch.int64), None, 4,
                        torch.zeros(4, 2, 2, dtype=torch.uint8))
    owner = _Owner(slot)

    def hand():
        handed = slot.shown[...], slot.labels[...], slot.masks[...]   # (as a full batch hands them out)
        slot.watching = native._Handed(owner, 0, slot, handed, None)
        return handed

    x, y, m = hand()
    assert x.shape == (4, 3, 2, 2) and x.data_ptr() == slot.address
    del x, y
    assert owner.back == []
    del m
    assert owner.back == [(0, False)]
    # a view of a handed tensor kept: given back as lost (the executor makes new tensors before reusing it)
    x, y, m = hand()
    v = x[1:, 0]
    del x, y, m
    assert owner.back == [(0, False), (0, True)]
    del v
    # so is the memory kept another way (another tensor on its storage)
    slot.lost = False
    x, y, m = hand()
    kept = torch.empty(0, dtype=torch.int64).set_(y.untyped_storage())
    del x, y, m
    assert owner.back[-1] == (0, True) and len(owner.back) == 3
    del kept
    # drops of a batch from an earlier generation (the slot given back meanwhile) do nothing
    slot.lost = False
    x, y, m = hand()
    slot.generation += 1
    del x, y, m
    assert len(owner.back) == 3


def test_decode_paths_add_the_running_tallies(image_folder):
    stage = Pipeline(FileTree(image_folder), ops=OPS, device="cpu").decode_stage
    stage.count_paths({"cpu": 3})
    gpu = stage.tally("gpu")
    assert stage.tally("gpu") is gpu and stage.decode_paths == {"cpu": 3}   # (a tally of 0 is not shown)
    gpu[0] += 5
    stage.tally("cpu")[0] += 2
    stage.count_paths({"gpu": 1})
    assert stage.decode_paths == {"cpu": 5, "gpu": 6}
