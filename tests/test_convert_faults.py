"""The converter under faults: write errors stop it whatever the budget, a killed driver leaves no process or
semaphore behind, and it keeps apart from the source and from files in DST it did not make."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_image_folder

from ingest.errors import ConfigError, WriteError
from ingest.formats import writer_class
from ingest.tools import convert as convert_mod
from ingest.tools import manifest
from ingest.tools.convert import convert

CLASSES = {"cat": 7, "dog": 5, "emu": 9}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "train", CLASSES)


def committed_shards_are_whole(out: Path) -> None:
    """No final manifest, and every shard the journal lists has the files, sizes and hashes it says."""
    assert not (out / manifest.MANIFEST).exists()
    data, _ = manifest.load(str(out))
    for shard in (data or {}).get("shards", []):
        assert manifest.check_shard(str(out), shard) == []


@pytest.mark.parametrize("fmt", ["tfrecord", "raw", "wds", "filetree"])
def test_a_full_disk_stops_the_conversion_whatever_the_budget(folder, tmp_path, monkeypatch, fmt):
    """ENOSPC from the writer after a few records: a WriteError naming the shard's file, not a bad sample."""
    cls = writer_class(fmt)
    original, calls = cls.add, []

    def add(self, record):
        calls.append(1)
        if len(calls) == 12:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        original(self, record)

    monkeypatch.setattr(cls, "add", add)
    out = tmp_path / "out"
    options = {"raw_size": (16, 16)} if fmt == "raw" else {}
    with pytest.raises(WriteError, match="No space left on device") as info:
        convert(str(folder), str(out), to=fmt, shard_size=4, max_failures=100, progress=False, **options)
    assert info.value.errno == errno.ENOSPC and "shard-00002-of-00006" in str(info.value)
    assert str(out / convert_mod.TMP_DIR) in info.value.path
    committed_shards_are_whole(out)
    assert len(manifest.load(str(out))[0]["shards"]) == 2   # the shards before the failing one


_UNDER_LIMIT = """
import resource, signal, sys
from ingest.tools.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # so write() fails with EFBIG instead of killing the process
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
src, out = sys.argv[1:3]
for fmt in ("tfrecord", "lmdb", "raw"):
    extra = ["--raw-size", "24x24"] if fmt == "raw" else []
    rc = main(["convert", src, f"{out}/{fmt}", "--to", fmt, "--shard-size", "16", "--max-failures", "100", "-q",
               *extra])
    print(f"{fmt} rc={rc}", flush=True)
"""


def test_a_file_size_limit_fails_every_format_with_one_line(folder, tmp_path):
    """Under RLIMIT_FSIZE the CLI exits 1 with a WriteError line naming the file (LMDB's liblmdb error too),
    no traceback, and commits no shard holding a truncated record."""
    proc = subprocess.run([sys.executable, "-c", _UNDER_LIMIT, str(folder), str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["tfrecord", "rc=1", "lmdb", "rc=1", "raw", "rc=1"]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("ingest convert:")]
    assert len(lines) == 3 and all("WriteError" in line for line in lines), proc.stderr
    assert ".lmdb" in lines[1] and ".raw" in lines[2]
    for fmt in ("tfrecord", "lmdb", "raw"):
        committed_shards_are_whole(tmp_path / fmt)


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (by parent pid, from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _semaphores(pid: int) -> set[str]:
    """The POSIX semaphores ``pid`` has mapped (multiprocessing's live in /dev/shm as sem.*)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {line.split()[-1] for line in f if "/dev/shm/sem." in line}
    except OSError:
        return set()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_the_driver_leaves_no_worker_and_no_semaphore(tmp_path):
    src = make_image_folder(tmp_path / "src", {"a": 60, "b": 60})
    out = tmp_path / "out"
    code = ("import sys; from ingest.tools.convert import convert\n"
            "if __name__ == '__main__':\n"
            "    convert(sys.argv[1], sys.argv[2], to='tfrecord', shard_size=1, quality=60, workers=2, "
            "progress=False)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(src), str(out)])
    try:
        deadline = time.monotonic() + 90
        started = False
        while time.monotonic() < deadline and proc.poll() is None:
            partial = out / manifest.PARTIAL
            if partial.exists() and len(partial.read_text().splitlines()) > 3:   # workers are writing
                started = True
                break
            time.sleep(0.02)
        below, sems = _descendants(proc.pid), _semaphores(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    if not started:
        pytest.skip("the conversion ended before the workers were seen writing")
    assert len(below) >= 3   # the workers, the fork server, the resource tracker
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in below):
        time.sleep(0.05)
    left = [p for p in below if _alive(p)]
    for pid in left:   # so that a failure leaves nothing running either
        os.kill(pid, signal.SIGKILL)
    assert not left
    time.sleep(0.2)
    assert sems and not [s for s in sems if os.path.exists(s)]


def test_the_output_and_the_source_are_kept_apart(folder, tmp_path):
    inside = folder / "cat" / "out"
    with pytest.raises(ConfigError, match="inside the source"):
        convert(str(folder), str(inside), to="filetree", progress=False)
    assert not inside.exists()
    with pytest.raises(ConfigError, match="inside the source"):
        convert(str(folder), str(folder), to="tfrecord", resume=True, progress=False)
    link = tmp_path / "link"
    link.symlink_to(folder / "dog")
    with pytest.raises(ConfigError, match="inside the source"):
        convert(str(folder), str(link / "x"), to="tfrecord", progress=False)
    with pytest.raises(ConfigError, match="inside the output"):
        convert(str(folder), str(tmp_path), to="tfrecord", resume=True, progress=False)
    with pytest.raises(ConfigError, match="inside the source"):
        convert(str(folder / "*"), str(folder / "dog" / "x"), to="tfrecord", source_format="filetree",
                progress=False)
    assert sorted(p.name for p in (folder / "cat").iterdir()) == [f"{i:04d}.jpg" for i in range(7)]


def test_files_of_the_user_in_the_output_are_not_deleted(folder, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / convert_mod.LOCK).write_text("my notes\n")
    with pytest.raises(ConfigError, match="not written by a conversion"):
        convert(str(folder), str(out), to="tfrecord", progress=False)
    assert (out / convert_mod.LOCK).read_text() == "my notes\n"
    (out / convert_mod.LOCK).unlink()
    tmp = out / convert_mod.TMP_DIR
    tmp.mkdir()
    (tmp / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not made by a conversion"):
        convert(str(folder), str(out), to="tfrecord", progress=False)
    assert (tmp / "keep.txt").read_text() == "mine" and not (out / convert_mod.LOCK).exists()
    (tmp / "keep.txt").unlink()
    tmp.rmdir()
    convert(str(folder), str(out), to="tfrecord", progress=False)
    assert not (out / convert_mod.LOCK).exists() and not tmp.exists()


def test_a_stale_lock_and_temporary_directory_of_a_killed_run_are_taken_over(folder, tmp_path):
    out = tmp_path / "out"
    convert(str(folder), str(out), to="tfrecord", shard_size=4, progress=False)
    whole = {p.name: p.read_bytes() for p in out.iterdir()}
    data = json.loads((out / manifest.MANIFEST).read_text())
    (out / manifest.MANIFEST).unlink()
    journal = [{k: v for k, v in data.items() if k not in ("shards", "count", "bytes")}, *data["shards"][:2]]
    (out / manifest.PARTIAL).write_text("".join(json.dumps(e) + "\n" for e in journal))
    (out / convert_mod.LOCK).write_text(f"{convert_mod._LOCK_MAGIC}\npid 1\ntoken x\n")
    (out / convert_mod.TMP_DIR / "shard-00002-of-00006").mkdir(parents=True)   # as an older version left it
    summary = convert(str(folder), str(out), to="tfrecord", shard_size=4, resume=True, progress=False)
    assert summary.resumed == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == whole


def test_a_lock_file_that_cannot_be_written_is_a_write_error_and_is_not_left(folder, tmp_path, monkeypatch):
    out = tmp_path / "out"

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(convert_mod.os, "pwrite", full)
        with pytest.raises(WriteError, match="the lock file.*No space left") as info:
            convert(str(folder), str(out), to="tfrecord", progress=False)
    assert info.value.path.endswith(convert_mod.LOCK) and os.listdir(out) == []
    (out / convert_mod.LOCK).write_bytes(b"\xff\xfe binary notes")   # the user's, not UTF-8
    with pytest.raises(ConfigError, match="not written by a conversion"):
        convert(str(folder), str(out), to="tfrecord", progress=False)
    assert (out / convert_mod.LOCK).read_bytes() == b"\xff\xfe binary notes"
