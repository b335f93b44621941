import errno
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest import defaults
from ingest.errors import ConfigError, CorruptRecordError, SourceError
from ingest.formats.base import Location
from ingest import io as ingest_io
from ingest.io import ByteReader, resolve_io


def test_posix_reads_ranges_whole_files_and_memory(tmp_path, read_engine):
    data = np.random.default_rng(1).integers(0, 256, 70000, dtype=np.uint8)
    p = tmp_path / "f.bin"
    data.tofile(p)
    with ByteReader("posix", threads=3) as r:
        got = r.read([Location(str(p), 10, 100), Location(str(p)), Location("mem", data=b"abc")])
    assert np.array_equal(got[0], data[10:110]) and np.array_equal(got[1], data)
    assert bytes(got[2]) == b"abc"


def test_errors_are_values_naming_file_and_offset(tmp_path, read_engine):
    p = tmp_path / "short.bin"
    p.write_bytes(b"x" * 50)
    with ByteReader("posix") as r:
        missing, short = r.read([Location(str(tmp_path / "gone.jpg")), Location(str(p), 40, 20)])
    assert isinstance(missing, SourceError) and "gone.jpg: cannot read" in str(missing)
    assert missing.path == str(tmp_path / "gone.jpg") and isinstance(missing.__cause__, FileNotFoundError)
    assert isinstance(short, CorruptRecordError)
    assert "short.bin" in str(short) and "at byte 40" in str(short) and "10 of 20" in str(short)


def test_an_offset_past_the_end_of_a_file_read_to_its_end_is_an_error_beside_good_reads(tmp_path, read_engine):
    p = tmp_path / "f.bin"
    p.write_bytes(b"0123456789")
    with ByteReader("posix") as r:
        past, tail, whole = r.read([Location(str(p), 12), Location(str(p), 7), Location(str(p))])
    assert isinstance(past, CorruptRecordError) and "offset 12 is past the end" in str(past) and past.offset == 12
    assert bytes(tail) == b"789" and bytes(whole) == b"0123456789"


def test_a_large_batch_split_over_the_pool_keeps_every_file_in_its_place(tmp_path, read_engine):
    """Sizes looked up and files read in shares of several files per pool task: each result (bytes or error)
    still lands at its own position."""
    from ingest.io import MIN_SHARE
    rng = np.random.default_rng(2)
    locations, expect = [], []
    for k in range(5 * MIN_SHARE + 3):
        if k % 7 == 3:
            locations.append(Location(str(tmp_path / f"missing{k}.jpg")))
            expect.append(None)
            continue
        data = rng.integers(0, 256, int(rng.integers(1, 5000)), dtype=np.uint8)
        data.tofile(tmp_path / f"f{k}.bin")
        locations.append(Location(str(tmp_path / f"f{k}.bin")))   # length unknown: looked up on the pool
        expect.append(data)
    with ByteReader("posix", threads=4) as r:
        got = r.read(locations)
    for k, (g, e) in enumerate(zip(got, expect)):
        if e is None:
            assert isinstance(g, SourceError) and f"missing{k}.jpg" in str(g)
        else:
            assert np.array_equal(g, e), k


def _files(tmp_path, count: int, seed: int) -> tuple[list[Location], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    locations, datas = [], []
    for k in range(count):
        data = rng.integers(0, 256, int(rng.integers(1, 3000)), dtype=np.uint8)
        data.tofile(tmp_path / f"s{seed}_{k}.bin")
        locations.append(Location(str(tmp_path / f"s{seed}_{k}.bin"), 0, len(data)))
        datas.append(data)
    return locations, datas


def test_batches_from_several_threads_at_once_each_get_their_own_bytes(tmp_path, read_engine):
    """The native reader runs one batch at a time on its kept helper threads; a batch that finds them busy
    starts threads of its own. Either way every thread's batch is read whole and in place."""
    import threading
    jobs = [_files(tmp_path, 40, seed) for seed in range(6)]
    errors: list = []

    def read(locations, datas):
        try:
            with ByteReader("posix", threads=8) as r:
                for _ in range(30):
                    got = r.read(locations)
                    assert all(np.array_equal(g, d) for g, d in zip(got, datas))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)
    threads = [threading.Thread(target=read, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and errors == []


def test_a_forked_child_reads_with_threads_of_its_own(tmp_path):
    """A fork taken while another thread's batch runs on the native helper threads: the child has none of
    them, nor the locks they held at that moment, and its reads start threads of their own and finish (an
    alarm ends a child that hangs). The Python fallback's thread pool is not fork-safe, as no
    ThreadPoolExecutor is: ingest's own processes are spawned."""
    import os
    import signal
    import threading
    from ingest import io as ingest_io
    if ingest_io.NATIVE is None:
        pytest.skip("ingest._readv was not built")
    locations, datas = _files(tmp_path, 64, 9)
    stop = threading.Event()

    def keep_reading():
        with ByteReader("posix", threads=8) as r:
            while not stop.is_set():
                r.read(locations)
    busy = threading.Thread(target=keep_reading)
    busy.start()
    try:
        for _ in range(20):
            pid = os.fork()
            if pid == 0:   # the child: exit code 0 only if its reads come back right
                ok = False
                try:
                    signal.alarm(20)
                    with ByteReader("posix", threads=8) as r:
                        ok = all(np.array_equal(g, d) for _ in range(3) for g, d in zip(r.read(locations), datas))
                finally:
                    os._exit(0 if ok else 1)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
    finally:
        stop.set()
        busy.join()


def test_read_into_cpu_tensor(tmp_path, read_engine):
    p = tmp_path / "t.bin"
    np.arange(64, dtype=np.float32).tofile(p)
    out = torch.empty(16, dtype=torch.float32)
    with ByteReader("posix") as r:
        r.read_into(Location(str(p), 16 * 4), out)
    assert out.tolist() == list(range(16, 32))


def test_io_choice_and_defaults(monkeypatch):
    assert resolve_io("posix") == ("posix", "posix")
    assert resolve_io("auto")[0] == "posix"  # host destinations: preadv (see resolve_io)
    if not torch.cuda.is_available():
        assert resolve_io("auto") == ("posix", "posix")
        with pytest.raises(ConfigError, match="needs CUDA and KvikIO"):
            resolve_io("kvikio")
    with pytest.raises(ConfigError, match="Available: auto, kvikio, posix"):
        resolve_io("gds")
    monkeypatch.setenv("INGEST_IO_THREADS", "3")
    assert defaults.get("io_threads") == 3
    with defaults.set(io_threads=5):
        assert defaults.get("io_threads") == 5
    assert defaults.get("io_threads") == 3
    with pytest.raises(ConfigError, match="Unknown setting 'iothreads'. Available:"):
        defaults.get("iothreads")
    with pytest.raises(ConfigError, match="`io_threads` must be an integer >= 1, got 0"):
        defaults.set(io_threads=0)


def test_decode_threads_and_num_workers_settings(monkeypatch):
    from ingest.decode.cpu import CpuDecoder
    with defaults.set(decode_threads=3):
        with CpuDecoder() as dec:
            assert dec.threads == 3
    monkeypatch.setenv("INGEST_NUM_WORKERS", "auto")
    assert defaults.get("num_workers") == "auto"
    with defaults.set(num_workers="2"):
        assert defaults.get("num_workers") == 2
    with pytest.raises(ConfigError, match="`num_workers` must be 'auto' or an integer >= 0, got -1"):
        defaults.set(num_workers=-1)


def test_thread_defaults_follow_this_process_share_of_the_host(monkeypatch):
    """The CPUs this process may run on (not the machine's count) over torchrun's ranks on the host."""
    from ingest.decode.gpu import cpu_threads_each
    for name in ("INGEST_IO_THREADS", "INGEST_DECODE_THREADS", "INGEST_OPS_THREADS", "INGEST_GPU_DECODE_THREADS",
                 "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 128)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(40, 72)), raising=False)  # a 32-CPU cpuset
    monkeypatch.setattr(defaults, "job_cpus", lambda: 32)   # the job's cpuset: every rank may run on all of it
    assert defaults.cores() == 32
    assert [defaults.get("io_threads"), defaults.get("decode_threads"), defaults.ops_threads()] == [32, 32, 16]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")   # two torchrun ranks share it: each gets what 16 cores give
    assert defaults.cores() == 16 and cpu_threads_each(2) == 8
    assert [defaults.get("io_threads"), defaults.get("decode_threads"), defaults.ops_threads()] == [16, 16, 8]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert defaults.get("io_threads") == 8, "reads that wait on a disk still get 8"
    assert [defaults.cores(), defaults.get("decode_threads"), defaults.ops_threads()] == [4, 4, 2]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert [defaults.cores(), defaults.get("decode_threads"), defaults.ops_threads()] == [1, 1, 1]  # never none
    monkeypatch.setenv("INGEST_DECODE_THREADS", "12")   # a set count is taken as it is
    assert defaults.get("decode_threads") == 12
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE must be a process count, got 'two'"):
        defaults.cores()


def test_ranks_bound_to_their_own_cores_or_numa_node_keep_their_share(monkeypatch):
    """torchrun --numa-binding narrows each rank's affinity inside the job's cpuset: the ranks sharing it are
    the part of the job's CPUs it covers, not all of LOCAL_WORLD_SIZE (which left an exclusively bound rank of
    eight 2 of its 16 cores)."""
    for name in ("INGEST_DECODE_THREADS", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setattr(defaults, "job_cpus", lambda: 128)   # 8 GPUs, 128 CPUs in two NUMA nodes of 64
    for affinity, share in ((range(16, 32), 16),     # --numa-binding=exclusive: its own 16 cores
                            (range(64, 128), 16),    # =node: four ranks to a node
                            (range(0, 128), 16),     # not bound: all eight share all of them
                            (range(0, 24), 12)):     # uneven: 1.5 ranks' worth of CPUs, taken as 2
        monkeypatch.setattr("os.sched_getaffinity", lambda pid, a=affinity: set(a), raising=False)
        assert defaults.cores() == share and defaults.get("decode_threads") == share, affinity
    monkeypatch.setattr(defaults, "job_cpus", lambda: None)   # no cpuset found: every rank shares the affinity
    assert defaults.cores() == 3
    assert [defaults.sharing(16, 8, j) for j in (None, 8, 16, 32, 128, 1000)] == [8, 8, 8, 4, 1, 1]


@pytest.mark.parametrize("layout", ["v2", "v2-parent", "v1", "none"])
def test_the_job_cpuset_is_read_from_the_process_cgroup(tmp_path, monkeypatch, layout):
    fs = tmp_path / "cgroup"
    if layout.startswith("v2"):
        (tmp_path / "self").write_text("0::/job.slice/step_0\n")
        group = fs / "job.slice" / "step_0"
        group.mkdir(parents=True)   # the step's own group has no cpuset controller: its parent's set applies
        ((fs / "job.slice") if layout == "v2-parent" else group).joinpath("cpuset.cpus.effective").write_text(
            "0-15,64-79\n")
    elif layout == "v1":
        (tmp_path / "self").write_text("4:memory:/other\n3:cpuset,cpuacct:/docker/abc\n0::/\n")
        (fs / "cpuset" / "docker" / "abc").mkdir(parents=True)
        (fs / "cpuset" / "docker" / "abc" / "cpuset.effective_cpus").write_text("0-15,64-79\n")
    else:
        (tmp_path / "self").write_text("0::/\n")
        fs.mkdir()
    monkeypatch.setattr(defaults, "CGROUPS", tmp_path / "self")
    monkeypatch.setattr(defaults, "CGROUP_FS", fs)
    assert defaults.job_cpus() == (None if layout == "none" else 32)
    monkeypatch.setattr(defaults, "CGROUPS", tmp_path / "missing")
    assert defaults.job_cpus() is None
    assert [defaults.cpu_list_size(t) for t in ("0", "0-3,8-11", "5,7\n", "")] == [1, 8, 2, 0]
    with pytest.raises(ValueError):
        defaults.cpu_list_size("0-x")


def test_shared_reader_takes_its_buffers_in_turn_and_grows_them(tmp_path):
    """A reader process's reader: K shared buffers used in turn; a buffer is new (its handle must cross to the
    parent) the first time and when a batch outgrows it, and reused, same storage, otherwise."""
    path = tmp_path / "data.bin"
    data = np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    reader = ByteReader("posix", threads=2, shared=2)
    seen = []
    for size in (100, 200, 90, 150, 1000):
        views = reader.read([Location(str(path), 7, size), Location(str(path), 2000, 10)])
        assert np.array_equal(views[0], data[7:7 + size]) and np.array_equal(views[1], data[2000:2010])
        slot, buffer, nbytes, new = reader.last_arena
        assert nbytes == size + 10 and buffer.is_shared() and buffer.numel() >= nbytes
        assert views[0].ctypes.data == buffer.data_ptr()   # read straight into the shared buffer
        seen.append((slot, new, buffer.data_ptr()))
    assert [(s, n) for s, n, _ in seen] == [(0, True), (1, True), (0, False), (1, False), (0, True)]
    assert seen[2][2] == seen[0][2] and seen[3][2] == seen[1][2]   # reused: the same memory
    reader.close()


def test_a_directory_or_unreadable_file_is_a_source_error_beside_good_reads(tmp_path, read_engine):
    """One task's failure (a directory, a file without read permission) is that location's error value; the
    others in the same batch still read."""
    good = tmp_path / "good.bin"
    good.write_bytes(b"0123456789")
    (tmp_path / "adir").mkdir()
    with ByteReader("posix", threads=2) as r:
        got = r.read([Location(str(tmp_path / "adir")), Location(str(good), 2, 5), Location(str(tmp_path / "adir"), 0, 4)])
    assert isinstance(got[0], SourceError) and "adir: cannot read" in str(got[0])
    assert isinstance(got[0].__cause__, OSError) and got[0].__cause__.errno == errno.EISDIR
    assert bytes(got[1]) == b"23456" and isinstance(got[2], SourceError)


def test_one_task_of_more_segments_than_one_preadv_takes(tmp_path):
    """The native loop splits a task's segments over several preadv calls (IOV_MAX each) and resumes a read
    that stopped inside a segment; gaps (start -1) are read and dropped."""
    from ingest import io as ingest_io
    if ingest_io.NATIVE is None:
        pytest.skip("ingest._readv was not built")
    data = np.random.default_rng(3).integers(0, 256, 3 * 2500, dtype=np.uint8)
    p = tmp_path / "f.bin"
    data.tofile(p)
    out = np.zeros(2 * 2500, dtype=np.uint8)
    starts = np.array([x for k in range(2500) for x in (2 * k, -1)])
    lens = np.array([2, 1] * 2500)
    tasks = ingest_io._Tasks(out, [str(p)], np.array([-1]), np.array([0]), np.array([0, 5000]), starts, lens)
    assert tasks.run_native(3).tolist() == [len(data)]
    assert np.array_equal(out.reshape(-1, 2), data.reshape(-1, 3)[:, :2])
    tasks = ingest_io._Tasks.whole(out, [str(p)], [0], [10], [10**6 - 10])   # past the buffer: refused before any read
    with pytest.raises(ValueError, match="past its buffer"):
        tasks.run_native(1)


def test_native_addresses_of_buffers():
    from ingest import io as ingest_io
    if ingest_io.NATIVE is None:
        pytest.skip("ingest._readv was not built")
    arena = np.zeros(100, np.uint8)
    views = [arena[3:10], memoryview(arena)[50:], arena[99:]]
    out = np.empty(3, np.int64)
    ingest_io.NATIVE.addresses(views, out)
    assert (out - arena.ctypes.data).tolist() == [3, 50, 99]
    with pytest.raises(ValueError, match="too small"):
        ingest_io.NATIVE.addresses(views, np.empty(2, np.int64))
    with pytest.raises(TypeError):
        ingest_io.NATIVE.addresses([object()], out)


def test_hw_decoder_load_setting(monkeypatch):
    monkeypatch.delenv("INGEST_HW_DECODER_LOAD", raising=False)
    assert defaults.get("hw_decoder_load") == 1.0   # every JPEG to the hardware engine
    monkeypatch.setenv("INGEST_HW_DECODER_LOAD", "0.9")
    assert defaults.get("hw_decoder_load") == 0.9
    monkeypatch.setenv("INGEST_HW_DECODER_LOAD", "auto")
    assert defaults.get("hw_decoder_load") == "auto"
    with pytest.raises(ConfigError, match="`hw_decoder_load` must be 'auto' or a number from 0 to 1, got 1.5"):
        defaults.set(hw_decoder_load=1.5)


def test_host_jpeg_share_setting(monkeypatch):
    monkeypatch.delenv("INGEST_HOST_JPEG_SHARE", raising=False)
    assert defaults.get("host_jpeg_share") == 0.0   # every JPEG the GPU takes stays on the GPU
    monkeypatch.setenv("INGEST_HOST_JPEG_SHARE", "0.25")
    assert defaults.get("host_jpeg_share") == 0.25
    for bad in ("auto", -0.1, 2):
        with pytest.raises(ConfigError, match="`host_jpeg_share` must be a number from 0 to 1"):
            defaults.set(host_jpeg_share=bad)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_readers_and_decoders_work_in_a_forked_child(tmp_path, monkeypatch):
    """A forked child (a torch DataLoader worker, by default on Linux) reads and decodes with the objects its
    parent made and used: their thread pools are made again in the child (`ingest._threads`), where the
    parent's copy would have waited forever for threads that fork did not copy."""
    import signal
    from conftest import jpeg_bytes
    from ingest.decode.cpu import CpuDecoder
    monkeypatch.setattr(ingest_io, "NATIVE", None)   # the reads on Python threads
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 40)
    reader, decoder = ingest_io.ByteReader("posix", threads=4), CpuDecoder(threads=2)
    jpeg = jpeg_bytes(24, 32)
    locations = [Location(str(path), 7 * k, 100) for k in range(40)]

    def work():
        views = reader.read(locations)
        images = decoder.decode_batch([jpeg] * 8, ["x.jpg"] * 8)
        return all(bytes(v) == (bytes(range(256)) * 40)[7 * k:7 * k + 100] for k, v in enumerate(views)) and \
            all(im.shape == (24, 32, 3) for im in images)
    assert work()
    pid = os.fork()
    if pid == 0:   # the child: exit 0 only if both worked; killed by the alarm if a pool hangs
        signal.alarm(20)
        os._exit(0 if work() else 1)
    _, status = os.waitpid(pid, 0)
    reader.close()
    decoder.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    with pytest.raises(RuntimeError, match="shut down"):
        reader.read(locations)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 90)), min_size=1, max_size=60),
       st.integers(1, 40), st.sampled_from([0, 7, 64 * 1024]), st.sampled_from([1, 50, 16 << 20]),
       st.sampled_from([1, 3, 512]))
def test_native_row_plan_reads_what_the_numpy_plan_reads(tmp_path, rows, row, gap, chunk, max_rows):
    """`ingest._readv.plan_rows` (one call, the GIL kept) makes the tasks `plan_rows` + `_rows_posix` make with
    numpy: the same reads (one per run, the same bytes each), landing every row where it belongs, for rows
    in any order, repeated, overlapping, back to back or gaps apart."""
    if ingest_io.NATIVE is None:
        pytest.skip("ingest._readv was not built")
    data = [bytes((i * 7 + f * 31) % 251 for i in range(4000)) for f in range(3)]
    paths = []
    for f, blob in enumerate(data):
        (tmp_path / f"s{f}").write_bytes(blob)
        paths.append(str(tmp_path / f"s{f}"))
    files = np.array([f for f, _ in rows], dtype=np.int64)
    offsets = np.array([o * 13 for _, o in rows], dtype=np.int64)
    n = len(rows)
    host = np.zeros(n * row + 5, dtype=np.uint8)
    table = np.array([os.open(p, os.O_RDONLY) for p in paths], dtype=np.int64)
    try:
        fds, starts, want, dense = (np.empty(n, dtype=np.int64) for _ in range(4))
        first, lens, addrs = np.empty(n + 1, np.int64), np.empty(2 * n, np.int64), np.empty(2 * n, np.uint64)
        tasks, segments, total, longest = ingest_io.NATIVE.plan_rows(
            files, offsets, None, table, row, gap, chunk, max_rows, host.ctypes.data, host.nbytes,
            fds, starts, first, addrs, lens, want, dense)
        plan = ingest_io.plan_rows(files, offsets, row, gap=gap, chunk=chunk) if max_rows == ingest_io.MAX_RUN_ROWS \
            else None
        if plan is not None:   # the numpy plan's runs: same count, starts, sizes and density
            lead = np.flatnonzero(plan.lead)
            assert tasks == len(plan.nbytes) and starts[:tasks].tolist() == plan.pos[lead].tolist()
            assert want[:tasks].tolist() == plan.nbytes.tolist() and dense[:tasks].tolist() == plan.dense.tolist()
        for t in np.flatnonzero(dense[:tasks]).tolist():   # a dense task's rows land back to back, no gap read
            a, b = first[t], first[t + 1]
            assert (lens[a:b] == row).all() and (np.diff(addrs[a:b].astype(np.int64)) == row).all()
        assert longest == want[:tasks].max() and total == lens[:segments].sum()
        assert (np.diff(first[:tasks + 1]) > 0).all()   # every task has a segment
        got = np.empty(tasks, dtype=np.int64)
        ingest_io.NATIVE.read([None] * tasks, fds[:tasks], starts[:tasks], first[:tasks + 1], addrs[:segments],
                              lens[:segments], got, 2)
        assert got.tolist() == want[:tasks].tolist()
        for k, (f, o) in enumerate(zip(files.tolist(), offsets.tolist())):
            assert host[k * row:(k + 1) * row].tobytes() == data[f][o:o + row], k
        assert not host[n * row:].any()   # nothing past the rows
    finally:
        for fd in table.tolist():
            os.close(fd)


def test_native_row_plan_refuses_rows_outside_their_buffer_or_files():
    if ingest_io.NATIVE is None:
        pytest.skip("ingest._readv was not built")
    n, row = 3, 8
    out = [np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n + 1, np.int64), np.empty(2 * n, np.uint64),
           np.empty(2 * n, np.int64), np.empty(n, np.int64)]
    files, offsets, table = np.zeros(n, np.int64), np.arange(n, dtype=np.int64) * row, np.zeros(1, np.int64)
    host = np.zeros(n * row - 1, np.uint8)   # one byte short
    with pytest.raises(ValueError, match="out of range"):
        ingest_io.NATIVE.plan_rows(files, offsets, None, table, row, 0, 0, 4, host.ctypes.data, host.nbytes, *out)
    host = np.zeros(n * row, np.uint8)
    with pytest.raises(ValueError, match="out of range"):   # a file the table has no descriptor for
        ingest_io.NATIVE.plan_rows(files + 1, offsets, None, table, row, 0, 0, 4, host.ctypes.data, host.nbytes,
                                   *out)
    with pytest.raises(ValueError, match="out of range"):   # a slot past the buffer
        ingest_io.NATIVE.plan_rows(files, offsets, np.array([0, 1, 3]), table, row, 0, 0, 4, host.ctypes.data,
                                   host.nbytes, *out)
