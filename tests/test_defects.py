"""Regression tests of issue 5: defects a new user met (exit abort, orphaned workers, a stale iterator's hang,
uneven DDP batch counts, the failure budget, decompression bombs, untyped read errors, checkpoint checks)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import ingest
import ingest.torch as ingest_torch
from ingest import defaults
from ingest.errors import ConfigError, DecodeError, FailureBudgetExceeded, SourceError
from ingest.formats import check_format
from ingest.ops import Flip, Normalize, RandomResizedCrop, Resize
from ingest.decode.cpu import CpuDecoder
from ingest.engine import Failures
from conftest import jpeg_bytes, make_image_folder

MEAN, STD = (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)
REPO = Path(__file__).resolve().parents[1]


def train_ops(size=32):
    return [RandomResizedCrop(size), Flip(p=0.5), Normalize(MEAN, STD)]


def run_python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def call_with_timeout(fn, seconds: float):
    """``fn()``'s result or exception; AssertionError if it has not returned after ``seconds``."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


# -- 1: a loader left mid-epoch shuts down cleanly at exit, as after break / raise / del / close ----------

EXIT_SCRIPT = """
    import sys, threading
    import ingest
    from ingest.ops import Flip, Normalize, RandomResizedCrop

    def loader():
        return ingest.Loader(sys.argv[1], batch_size=8, device="cpu", prefetch=1,
                             ops=[RandomResizedCrop(224), Flip(), Normalize((124, 116, 104), (58, 57, 57))])

    def stage_threads():
        return [t for t in threading.enumerate() if t.name in ("ingest-read", "ingest-decode", "ingest-ops")]

    for how in ("break", "raise", "del", "close"):
        L = loader()
        it = iter(L)
        if how == "break":
            for _ in it:
                break
            it.close()   # what a for loop's end does to a generator it made itself
        elif how == "raise":
            try:
                for _ in L:
                    raise KeyError("in the loop body")
            except KeyError:
                pass
        elif how == "del":
            next(it)
            del it
        else:
            next(it)
            L.close()
        assert stage_threads() == [], (how, stage_threads())
    it = iter(loader())   # left mid-epoch at exit
    next(it); next(it)
    print("done")
"""


def test_loader_left_mid_epoch_exits_cleanly(tmp_path):
    root = make_image_folder(tmp_path / "big", {"a": 16, "b": 16}, size=(200, 260))
    for _ in range(2):
        res = run_python(EXIT_SCRIPT, str(root))
        assert res.returncode == 0 and "terminate called" not in res.stderr, res.stderr[-2000:]
        assert res.stdout.strip() == "done"


WORKER_EXIT_SCRIPT = """
    import atexit, sys
    procs = []
    atexit.register(lambda: print("exit codes", [p.exitcode for p in procs], flush=True))  # after ingest's hook
    import ingest
    from ingest.ops import RandomResizedCrop

    if __name__ == "__main__":
        L = ingest.Loader(sys.argv[1], batch_size=4, num_workers=2, ops=[RandomResizedCrop(64)])
        it = iter(L)
        next(it); next(it)
        procs.extend(L._pool._procs)
"""


def test_worker_loader_left_mid_epoch_exits_cleanly(image_folder, tmp_path):
    script = tmp_path / "left.py"
    script.write_text(textwrap.dedent(WORKER_EXIT_SCRIPT))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, str(script), str(image_folder)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert res.returncode == 0 and "terminate called" not in res.stderr, res.stderr[-2000:]
    assert "exit codes [0, 0]" in res.stdout   # the workers ended themselves, neither killed nor aborted


# -- 2: workers exit when their parent is killed ---------------------------------------------------------

ORPHAN_SCRIPT = """
    import sys, time
    import ingest

    if __name__ == "__main__":
        L = ingest.Loader(sys.argv[1], batch_size=4, num_workers=2, ragged=True)
        it = iter(L)
        next(it)
        print(" ".join(str(p.pid) for p in L._pool._procs), flush=True)
        time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")   # a zombie has exited; only its reaping is left


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_workers_exit_when_the_parent_is_killed(image_folder, tmp_path):
    script = tmp_path / "orphan.py"
    script.write_text(textwrap.dedent(ORPHAN_SCRIPT))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, str(script), str(image_folder)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids), (line, proc.stderr.read() if not line else "")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 8
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, "worker processes outlived their parent"


# -- 3: an iterator of an older epoch ends promptly, with or without workers -----------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_stale_iterator_stops_after_a_newer_epoch(image_folder, workers):
    with ingest.Loader(image_folder, batch_size=4, ops=[Resize((16, 16))], num_workers=workers) as loader:
        it1 = iter(loader)
        next(it1)
        assert sum(len(y) for _, y in loader) == 21   # a full newer epoch
        with pytest.raises(StopIteration):
            call_with_timeout(lambda: next(it1), 20)
        assert loader.state_dict()["epoch"] == 2      # the old iterator did not move the position
        assert sum(len(y) for _, y in loader) == 21


# -- 4: automatic sharding gives every rank the same number of batches -----------------------------------

def test_automatic_sharding_gives_equal_batch_counts(image_folder, monkeypatch):
    counts, seen = [], []
    for rank in range(2):
        monkeypatch.setattr(ingest_torch, "_distributed_rank", lambda rank=rank: (rank, 2))
        loader = ingest.Loader(image_folder, batch_size=5, ops=[Resize((8, 8))], output="dict")
        batches = list(loader)
        counts.append((len(loader), len(batches)))
        for b in batches:
            seen += b["indices"][~b["is_pad"]].tolist()
        assert sum(int(b["is_pad"].sum()) for b in batches) == 15 - len(range(rank, 21, 2))
    assert counts == [(3, 3), (3, 3)]   # 21 samples, 2 ranks, batch 5: not 3 and 2
    assert sorted(seen) == list(range(21))
    monkeypatch.setattr(ingest_torch, "_distributed_rank", lambda: (0, 1))
    assert len(ingest.Loader(image_folder, batch_size=5)) == 5   # unsharded: partial last batch


# -- 5: a fractional budget is a share of the samples the epoch reads ------------------------------------

def test_fractional_budget_counts_samples(tmp_path):
    root = make_image_folder(tmp_path / "t", {"a": 30})
    for i in range(20):
        (root / "a" / f"{i:04d}.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    with pytest.raises(FailureBudgetExceeded, match="16 samples failed.*\\(15\\)"):
        list(ingest.Loader(root, batch_size=64, ops=[Resize((8, 8))], max_failures=0.5))
    assert sum(len(y) for _, y in ingest.Loader(root, batch_size=64, ops=[Resize((8, 8))], max_failures=0.7)) == 10
    assert Failures(0.5, 300).budget == 150
    with pytest.raises(ConfigError, match="streamed iterator"):
        Failures(0.5, None)


def test_sampler_samples_per_epoch():
    from ingest.sampler import Sampler
    assert Sampler(300, 256).samples() == 300
    assert Sampler(300, 256, last_batch="drop").samples() == 256
    assert Sampler(21, 5, shard_id=1, num_shards=2, last_batch="pad").samples() == 15
    assert Sampler(21, 5, shard_id=1, num_shards=2).samples(1) == 5
    assert Sampler(21, 5).samples(9) == 0


# -- 6: decompression bombs ------------------------------------------------------------------------------

def _claiming(data: bytes, height: int, width: int) -> bytes:
    """``data`` (a baseline JPEG) with its frame header claiming another size."""
    sof = data.index(b"\xff\xc0")
    return data[:sof + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[sof + 9:]


def test_default_max_pixels_refuses_a_tiny_bomb_and_says_how_to_raise_it():
    from PIL import Image
    bomb = _claiming(jpeg_bytes(16, 16), 16000, 16000)
    assert len(bomb) < 2000
    decoder = CpuDecoder(threads=1)
    assert decoder.max_pixels <= Image.MAX_IMAGE_PIXELS * 2   # never above Pillow's own error limit
    with pytest.raises(DecodeError, match="max_pixels") as e:
        decoder.probe(bomb, "bomb.jpg")
    assert "bomb.jpg" in str(e.value) and "INGEST_MAX_PIXELS" in str(e.value)
    with defaults.set(max_pixels=2**28):
        assert CpuDecoder(threads=1).probe(bomb, "bomb.jpg") == (16000, 16000)
    with pytest.raises(ConfigError, match="max_pixels"):
        defaults.set(max_pixels=0)


def test_failed_sample_stand_in_is_sized_from_the_output(tmp_path):
    # Header says 4000 x 6000 (24 Mpx, under the limit); the data is 16 x 16, so the decode fails.
    root = make_image_folder(tmp_path / "t", {"a": 4}, size=(40, 50))
    (root / "a" / "0001.jpg").write_bytes(_claiming(jpeg_bytes(16, 16), 4000, 6000))
    pipe = ingest.Pipeline(ingest.formats.FileTree(root), ops=train_ops(24), num_threads=1)
    pipe.start_epoch(Failures(1, 4))
    plan = next(ingest.sampler.Sampler(4, 4).batches(0))
    work = pipe.decode(pipe.read(plan))
    stand_in = work.images[1]
    assert tuple(stand_in.shape[:2]) == tuple(work.ops_plan.out_sizes[1]) == (24, 24)
    batch = pipe.transform(work)
    assert batch.images.shape == (3, 3, 24, 24) and batch.indices.tolist() == [0, 2, 3]
    pipe.close()


# -- 7: read errors are typed, name the file and count against the budget -------------------------------

def test_unreadable_files_give_source_errors(image_folder):
    strict = ingest.Loader(image_folder, batch_size=4, ops=[Resize((8, 8))])
    tolerant = ingest.Loader(image_folder, batch_size=4, ops=[Resize((8, 8))], max_failures=2)
    gone, odd = image_folder / "emu" / "0000.jpg", image_folder / "cat" / "0002.jpg"
    gone.unlink()
    with pytest.raises(SourceError, match="0000.jpg") as e:
        list(strict)
    assert e.value.path == str(gone) and isinstance(e.value.__cause__, FileNotFoundError)
    odd.unlink()
    odd.mkdir()   # a directory where the file was: EISDIR on read
    assert sum(len(y) for _, y in tolerant) == 19
    failures = tolerant.stats()["failures"]
    assert sorted(f[0].rsplit("/", 2)[-2] for f in failures) == ["cat", "emu"]
    assert {f[1] for f in failures} == {"read"} and all("SourceError" in f[2] for f in failures)


# -- 8, 9: checkpoints ------------------------------------------------------------------------------------

def test_load_state_dict_validates_the_position(image_folder):
    loader = ingest.Loader(image_folder, batch_size=4)
    state = loader.state_dict()
    for key, bad, says in (("batch", 999, "in \\[0, 6\\]"), ("batch", -1, ">= 0"), ("epoch", -2, ">= 0"),
                           ("epoch", "1", ">= 0")):
        with pytest.raises(ConfigError, match=f"`{key}`.*{says}"):
            loader.load_state_dict({**state, key: bad})
    with pytest.raises(ConfigError, match="missing batch"):
        loader.load_state_dict({k: v for k, v in state.items() if k != "batch"})
    loader.load_state_dict({**state, "batch": 6})   # after the last batch: the epoch is over
    assert list(loader) == []


def test_resume_after_a_dropped_batch_does_not_replay(tmp_path):
    root = make_image_folder(tmp_path / "t", {"a": 10})
    for i in (2, 3):
        (root / "a" / f"{i:04d}.jpg").write_bytes(b"\xff\xd8\xff broken")
    kw = dict(batch_size=2, ops=[Resize((8, 8))], output="dict", max_failures=2)
    loader = ingest.Loader(root, **kw)
    it = iter(loader)
    got = [next(it)["indices"].tolist() for _ in range(2)]
    assert got == [[0, 1], [4, 5]]
    state = loader.state_dict()
    assert state["batch"] == 3
    resumed = ingest.Loader(root, **kw)
    resumed.load_state_dict(state)
    assert [b["indices"].tolist() for b in resumed] == [[6, 7], [8, 9]]


# -- 11: the streamed iterator source passes the format check --------------------------------------------

def test_streamed_iterator_source_passes_check_format():
    items = [(jpeg_bytes(20, 30, seed=i), i % 2) for i in range(5)]
    check_format(ingest_torch._Stream(items))
    loader = ingest.Loader(iter(items), batch_size=2, ops=[Resize((8, 8))])
    assert [y.tolist() for _, y in loader] == [[0, 1], [0, 1], [0]]
    with pytest.raises(ConfigError, match="fractional"):
        list(ingest.Loader(iter(items), batch_size=2, max_failures=0.5))


# -- 13: CLI papercuts -------------------------------------------------------------------------------------

def test_cli_version_and_one_line_demo_errors(capsys, tmp_path):
    from ingest.tools.cli import main
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ingest {ingest.__version__}"
    assert main(["demo", "--per-class", "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--per-class" in err and "Traceback" not in err
    if not torch.cuda.is_available():
        assert main(["demo", "--device", "cuda", "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "CUDA is not available" in err and "Traceback" not in err


def test_demo_table_explains_its_columns(capsys, tmp_path):
    from ingest.tools import demo
    rows = demo.run(tmp_path, per_class=2, batch_size=4, min_seconds=0.2, devices=("cpu",))
    demo.print_table(rows)
    out = capsys.readouterr().out
    assert rows[0]["device"] == "cpu" and rows[0]["img/s"] > 0 and (tmp_path / "ingest-demo-cpu.png").is_file()
    assert all(f"  {col}" in out for col in rows[0]) and "indicative" in out
