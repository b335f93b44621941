"""`ingest convert`: any readable dataset to any writable format, in shards, in parallel, resumable.

1. **Plan** (driver). The source is opened and its samples are cut into output shards of ``shard_size``
   samples, or of about ``shard_bytes`` bytes (the samples' stored sizes; the exact pixel size for
   ``raw_size``). The plan depends only on the source and the options, never on who runs it. A format whose
   writer is not sharded (``Writer.sharded = False``, e.g. one LMDB) gets one shard.
2. **Write** (jobs). Each shard is one job: read its range of source samples, re-encode if asked
   (`transform`), write it with the format's `Writer` into ``DST/.ingest-tmp/<stem>/``, hash the files. Jobs
   run in the driver (``workers=1``), in worker processes (``workers=N``) or as Ray tasks (``ray=``, see
   `runners`). DST holds a lock file (``.ingest-lock``) while a conversion runs.
3. **Commit** (driver, in shard order). The files are renamed into DST and the shard is appended to the
   journal ``manifest.partial.jsonl``; at the end ``manifest.json`` is written and the journal removed
   (`manifest`).

Writers are deterministic, so the output is byte-identical whatever ran the jobs. ``resume=True`` keeps the
shards a killed run committed (their sha256 checked again) and redoes the rest, giving the same bytes as an
uninterrupted run. Bad samples are skipped and reported under ``max_failures`` (as in the Loader); with the
default 0 the first one stops the conversion, naming it. An error writing the output (a full disk, a
file-size limit) is not a bad sample: it stops the conversion whatever the budget (`WriteError`, naming the
file), and the shard it hit is never committed. DST may not lie inside the source nor the source inside DST;
a ``.ingest-lock`` or ``.ingest-tmp`` there that a conversion did not make is refused, never deleted.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import glob
import inspect
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import ConfigError, WriteError
from ..formats import check_options, detect, fields_of, open_source, writer_class
from ..formats.base import Field
from ..engine import Failures
from . import COMMANDS, manifest
from .jobs import Job, check_shard, writing
from .progress import Progress, Summary
from .runners import make_runner
from .source_view import SourceView
from .transform import Transform

#: Temporary directory inside DST where jobs write their shards before the commit renames them.
TMP_DIR = ".ingest-tmp"
#: Lock file a running conversion holds in DST.
LOCK = ".ingest-lock"
#: Shard size when neither ``shard_size`` nor ``shard_bytes`` is given.
DEFAULT_SHARD_BYTES = 256 * 10**6
_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9,
          "T": 10**12, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str | int) -> int:
    """``"256MB"``, ``"1GiB"``, ``"500k"`` or an int -> bytes (``MB`` = 10**6, ``MiB`` = 2**20)."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
        if not m or m.group(2).upper() not in _UNITS:
            raise ConfigError(f"cannot read {text!r} as a size; use e.g. 256MB, 1GiB or 500000")
        value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value < 1:
        raise ConfigError(f"a size must be >= 1 byte, got {text!r}")
    return value


def _output_fields(fields: dict[str, Field], drop: Sequence[str], unread: dict[str, str]) -> dict[str, Field]:
    """``fields`` less those named in ``drop`` (which must exist; 'image' cannot be dropped). ``unread``: what
    the source holds that its reader does not read (`Source.unread`, name -> how to read it); a conversion
    refuses to leave it out unless ``drop`` names it too, so nothing is lost without saying so."""
    missing = sorted(set(drop) - set(fields) - set(unread))
    if missing:
        raise ConfigError(f"cannot drop fields {missing}: the source has {', '.join(fields)}"
                          + (f" (and, unread, {', '.join(unread)})" if unread else ""))
    if "image" in drop:
        raise ConfigError("the 'image' field cannot be dropped")
    lost = [name for name in unread if name not in drop]
    if lost:
        raise ConfigError("the output would lose what the source holds but its reader does not read: "
                          + "; ".join(f"{name}: {unread[name]}" for name in lost)
                          + f". Read it, or leave it out on purpose with --drop {','.join(lost)}")
    return {name: f for name, f in fields.items() if name not in drop}


def plan_shards(n: int, *, shard_size: int | None = None, shard_bytes: int | None = None,
                sizes: np.ndarray | None = None) -> list[tuple[int, int]]:
    """Cut ``n`` samples into ``[start, stop)`` ranges: ``shard_size`` samples each, or greedily as many as
    fit in ``shard_bytes`` by ``sizes`` (at least one per shard)."""
    if n == 0:
        return []
    if shard_size is not None:
        return [(s, min(s + shard_size, n)) for s in range(0, n, shard_size)]
    ends = np.cumsum(sizes, dtype=np.int64)
    ranges, start = [], 0
    while start < n:
        base = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, base + shard_bytes, side="right")), start + 1)
        ranges.append((start, stop))
        start = stop
    return ranges


@dataclass
class Plan:
    """What a conversion will write: the job shared by all shards, the shards' stems and source ranges, and
    the manifest header (everything that decides the bytes)."""

    job: Job
    stems: list[str]
    ranges: list[tuple[int, int]]
    header: dict[str, Any]


def convert(src: Any, dst: str, *, to: str, source_format: str | None = None, shard_size: int | None = None,
            shard_bytes: int | str | None = None, workers: int = 1, max_side: int | None = None,
            quality: int | None = None, raw_size: tuple[int, int] | None = None, max_failures: int | float = 0,
            resume: bool = False, ray: bool | str = False, prefix: str = "shard",
            writer_options: dict[str, Any] | None = None, source_options: dict[str, Any] | None = None,
            drop_fields: Sequence[str] = (), progress: bool = True) -> Summary:
    """Convert the dataset at ``src`` into format ``to`` under directory ``dst``; see the module docstring.
    ``drop_fields``: source fields not to write (any but 'image'), and what the source holds but does not
    read (its ``unread``: refused unless dropped). ``ray``: False (local), True (``ray.init()``: the cluster at RAY_ADDRESS, else a new local Ray) or a
    cluster address (``"auto"``, ``"ray://head:10001"``)."""
    started = time.perf_counter()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"`workers` must be >= 1, got {workers}")
    if workers > 1 and ray not in (False, None):
        raise ConfigError("give `workers` or `ray`, not both: on Ray the cluster's CPUs set the parallelism")
    Failures(max_failures, 0)   # validate now
    if hasattr(src, "locate") and hasattr(src, "parse"):   # (its workers and a resume reopen the source by path)
        raise ConfigError(f"convert reads a dataset from its path (or a list of shard paths), not a source object "
                          f"({type(src).__name__}): give the path the source was opened from")
    _check_apart(src, dst)
    plan = plan_conversion(src, dst, to=to, source_format=source_format, shard_size=shard_size,
                           shard_bytes=shard_bytes, transform=Transform(max_side, quality,
                                                               None if raw_size is None else tuple(raw_size)),
                           prefix=prefix, writer_options=writer_options, source_options=source_options,
                           drop_fields=tuple(drop_fields), stop_on_failure=max_failures == 0)
    runner = make_runner(plan.job, workers=workers, ray=ray)
    bar = Progress(len(plan.job.view), len(plan.ranges), enabled=progress)
    try:
        with _exclusive(dst):
            kept = _previous_shards(dst, plan, resume)
            with writing(plan.job.tmp, "the temporary directory"):
                _fresh_tmp(plan.job.tmp, set(plan.stems))
            summary = _run(plan, dst, kept, runner, Failures(max_failures, len(plan.job.view)), bar)
    finally:
        runner.close()
        bar.close()
    summary.seconds = time.perf_counter() - started
    return summary


def plan_conversion(src: Any, dst: str, *, to: str, source_format: str | None, shard_size: int | None,
                    shard_bytes: int | str | None, transform: Transform, prefix: str,
                    writer_options: dict[str, Any] | None, source_options: dict[str, Any] | None,
                    drop_fields: Sequence[str], stop_on_failure: bool) -> Plan:
    """Open the source and cut it into shards (see the module docstring); validates every option."""
    writer = writer_class(to)
    if shard_size is not None and shard_bytes is not None:
        raise ConfigError("give `shard_size` or `shard_bytes`, not both")
    if shard_size is not None and (isinstance(shard_size, bool) or shard_size < 1):
        raise ConfigError(f"`shard_size` must be >= 1, got {shard_size}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", prefix):
        raise ConfigError(f"`prefix` must be a plain file name (letters, digits, _.-), got {prefix!r}")
    sharded = getattr(writer, "sharded", True)
    if shard_size is None and sharded:
        shard_bytes = parse_bytes(shard_bytes if shard_bytes is not None else DEFAULT_SHARD_BYTES)
    source_format = source_format or detect(src)
    source_options = dict(source_options or {})   # open_source refuses options its reader does not take
    # absolute paths: jobs may run where the working directory differs (Ray workers, other nodes)
    where = os.path.abspath(src) if isinstance(src, (str, os.PathLike)) else src
    view = SourceView(open_source(where, format=source_format, **source_options),
                      sizes=sharded and shard_size is None and transform.raw_size is None)
    n = len(view)
    fields = _output_fields(transform.fields(fields_of(view.source)), drop_fields,
                            dict(getattr(view.source, "unread", None) or {}))
    classes = [str(c) for c in view.source.classes]
    options = check_options(writer, f"{to} writer", dict(writer_options or {}))
    described = {"classes": classes, "box_format": getattr(view.source, "box_format", "xyxy"),
                 "relative": bool(getattr(view.source, "relative", False))}   # what a writer may need to know
    for name, value in described.items():
        if name in inspect.signature(writer).parameters and name not in options:
            options[name] = value
    with tempfile.TemporaryDirectory() as scratch:   # a writer refusing these fields fails here, not in a job
        with writing(scratch, "a probe of the writer"):
            writer(scratch, "probe", fields, **options).close()
    if not sharded:
        ranges = [(0, n)]
    elif transform.raw_size is not None and shard_size is None:   # every sample has the same, known size
        ranges = plan_shards(n, shard_bytes=shard_bytes, sizes=np.full(n, int(np.prod(fields["image"].shape))))
    else:
        ranges = plan_shards(n, shard_size=shard_size, shard_bytes=shard_bytes, sizes=view.sizes)
    width = max(5, len(str(len(ranges))))
    stems = [f"{prefix}-{k:0{width}d}-of-{len(ranges):0{width}d}" for k in range(len(ranges))]
    header = {"format": to, "version": manifest.VERSION,
              "source": {"path": os.fspath(src) if isinstance(src, (str, os.PathLike)) else str(src),
                         "format": source_format, "count": n},
              "options": {"shard_size": shard_size, "shard_bytes": None if shard_size else shard_bytes,
                          "max_side": transform.max_side, "quality": transform.quality,
                          "raw_size": list(transform.raw_size) if transform.raw_size else None, "prefix": prefix,
                          "drop_fields": sorted(drop_fields), "reader": _jsonable(source_options),
                          "writer": _jsonable({k: v for k, v in options.items() if k != "classes"})},
              "fields": manifest.fields_json(fields), "classes": classes}
    if "boxes" in fields and "box_format" not in inspect.signature(writer).parameters:
        # The format stores box values as they are: say how to read them (open_source applies it).
        header["boxes"] = {k: described[k] for k in ("box_format", "relative")}
    # Resizing moves the boxes and polygons unless they are relative to the image size.
    # and the mask fields (label maps) are resized with their image, nearest
    transform = replace(transform, relative=described["relative"],
                        masks=tuple(k for k, f in fields.items() if f.kind == "mask"))
    job = Job(view, to, fields, options, transform, os.path.join(os.path.abspath(dst), TMP_DIR), stop_on_failure)
    return Plan(job, stems, ranges, header)


def _run(plan: Plan, dst: str, kept: dict[int, dict[str, Any]], runner: Any, failures: Failures,
         bar: Progress) -> Summary:
    """Check the kept shards, run the others, commit all in order, write the manifest."""
    if kept:
        bad = runner.map(check_shard, [(dst, kept[k]) for k in sorted(kept)])
        kept = {k: s for (k, s), problems in zip(sorted(kept.items()), bad) if not problems}
    for shard in kept.values():
        for item in shard["failures"]:
            failures.record(*item)
    committed = dict(kept)
    with writing(os.path.join(dst, manifest.PARTIAL), "the journal"):
        journal = manifest.Journal(dst, plan.header, [kept[k] for k in sorted(kept)])
    done = {"samples": sum(s["stop"] - s["start"] for s in kept.values()),
            "bytes": sum(s["bytes"] for s in kept.values())}

    def commit(k: int, shard: dict[str, Any]) -> None:
        for item in shard["failures"]:
            failures.record(*item)   # raises past the budget, before anything of this shard is committed
        with writing(dst, f"shard {shard['stem']}"):
            _move_files(os.path.join(plan.job.tmp, shard["stem"]), dst, shard["files"])
            journal.commit(shard)
        committed[k] = shard
        done["samples"] += shard["stop"] - shard["start"]
        done["bytes"] += shard["bytes"]
        bar.update(done["samples"], len(committed), done["bytes"], force=True)

    todo = [(k, plan.stems[k], *plan.ranges[k]) for k in range(len(plan.ranges)) if k not in kept]
    resumed_samples = done["samples"]
    runner.run_in_order(todo, commit, lambda seen: bar.update(done["samples"] + seen, len(committed),
                                                               done["bytes"]))
    shards = [committed[k] for k in range(len(plan.ranges))]
    total = {"count": sum(s["count"] for s in shards), "bytes": sum(s["bytes"] for s in shards)}
    with writing(os.path.join(dst, manifest.MANIFEST), "the manifest"):
        manifest.write_atomic(os.path.join(dst, manifest.MANIFEST), {**plan.header, "shards": shards, **total})
    journal.remove()
    shutil.rmtree(plan.job.tmp, ignore_errors=True)
    return Summary(samples=total["count"], written=done["samples"] - resumed_samples, shards=len(shards),
                   bytes=total["bytes"], resumed=len(kept), failures=[tuple(f) for f in failures.items])


def _jsonable(options: dict[str, Any]) -> Any:
    """Options as the manifest records them (values JSON cannot hold by their repr)."""
    return json.loads(json.dumps(options, default=repr, sort_keys=True))


@contextlib.contextmanager
def _exclusive(dst: str) -> Iterator[None]:
    """Create ``dst`` and hold its lock file for the conversion: a second conversion into the same directory
    fails at once instead of interleaving its shards.

    Notes: the lock file holds `_LOCK_MAGIC`, this process's pid and a random token. An existing one is taken
    over only when no process holds it and it is a conversion's (the magic line; or empty, as older versions
    left it, beside a converter manifest or journal); anything else under that name is the user's and is
    refused, untouched. At the end the file is removed only while it still holds this run's token."""
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise ConfigError(f"output {dst!r} exists and is not a directory")
    os.makedirs(dst, exist_ok=True)
    path = os.path.join(dst, LOCK)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        created = True
    except FileExistsError:
        if os.path.islink(path) or not os.path.isfile(path):
            raise ConfigError(f"{path} is not a lock file a conversion wrote; move it away or choose another "
                              "output directory") from None
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        created = False
    try:   # raw descriptor calls: a buffered file would raise a failed flush again when closed
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"another conversion is writing into {dst!r} (it holds {path})") from None
        if not created and not _stale_lock(dst, os.pread(fd, len(_LOCK_MAGIC) + 1, 0)):
            raise ConfigError(f"{path} was not written by a conversion (its first line is not "
                              f"{_LOCK_MAGIC!r}); move it away or choose another output directory")
        content = f"{_LOCK_MAGIC}\npid {os.getpid()}\ntoken {secrets.token_hex(16)}\n".encode()
        try:
            with writing(path, "the lock file"):
                os.ftruncate(fd, 0)
                if os.pwrite(fd, content, 0) != len(content):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except WriteError:
            if created:   # a lock file this run made and could not fill is no one's
                with contextlib.suppress(OSError):
                    os.remove(path)
            raise
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                if os.pread(fd, len(content) + 1, 0) == content and os.path.samestat(
                        os.stat(path, follow_symlinks=False), os.fstat(fd)):
                    os.remove(path)
    finally:
        os.close(fd)


#: First line of the lock file a conversion holds (`_exclusive`).
_LOCK_MAGIC = "ingest convert lock"
#: The file that marks ``DST/.ingest-tmp`` as made by a conversion (`_fresh_tmp`).
TMP_OWNER = ".made-by-ingest-convert"


def _stale_lock(dst: str, head: bytes) -> bool:
    """Whether a lock file no process holds, starting with ``head``, is a conversion's own."""
    if head == (_LOCK_MAGIC + "\n").encode():
        return True
    return head == b"" and any(os.path.exists(os.path.join(dst, name)) for name in (manifest.PARTIAL,
                                                                                   manifest.MANIFEST))


def _fresh_tmp(tmp: str, stems: Sequence[str]) -> None:
    """Make ``tmp`` (``DST/.ingest-tmp``) empty, marked as this tool's. An existing one is removed only when
    it is a conversion's: it holds the mark, or (as older versions left it) only shard directories named
    like this plan's ``stems``. Anything else of that name is the user's: refused, never deleted."""
    if os.path.lexists(tmp):
        entries = os.listdir(tmp) if os.path.isdir(tmp) and not os.path.islink(tmp) else None
        mine = entries is not None and (TMP_OWNER in entries or bool(entries) and all(
            e in stems and os.path.isdir(os.path.join(tmp, e)) for e in entries))
        if not mine:
            raise ConfigError(f"{tmp} was not made by a conversion (no {TMP_OWNER} in it); move it away or "
                              "choose another output directory")
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    try:
        with open(os.path.join(tmp, TMP_OWNER), "w") as f:
            f.write("ingest convert writes its shards here before it renames them into the directory above\n")
    except OSError:   # made just now and holding nothing else: without its mark a next run would refuse it
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_apart(src: Any, dst: str) -> None:
    """Refuse an output directory inside a source directory (the source would read the output as it grows)
    or equal to it, and a source inside the output (a resume would write over it). Links are resolved."""
    paths = [src] if isinstance(src, (str, os.PathLike)) else src if isinstance(src, (list, tuple)) else []
    out = os.path.realpath(dst)
    for path in paths:
        if not isinstance(path, (str, os.PathLike)):
            continue
        path = os.fspath(path)
        root = path
        while glob.has_magic(root):   # a glob reads below its fixed directory part
            root = os.path.dirname(root)
        real = os.path.realpath(root or ".")
        if os.path.isdir(real) and _within(out, real):
            raise ConfigError(f"the output directory {dst!r} is inside the source {path!r}; choose one outside it")
        if _within(real, out):
            raise ConfigError(f"the source {path!r} is inside the output directory {dst!r}; choose another output")


def _within(path: str, directory: str) -> bool:
    """Whether the resolved ``path`` is ``directory`` or below it."""
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _previous_shards(dst: str, plan: Plan, resume: bool) -> dict[int, dict[str, Any]]:
    """The shards an earlier run committed to ``dst`` that this one may keep (``resume``), by shard index.
    Refuses a non-empty ``dst`` without ``resume``, and a ``dst`` written with other settings."""
    header, ranges, stems = plan.header, plan.ranges, plan.stems
    previous, _ = manifest.load(dst)
    if not resume:
        if any(e not in (TMP_DIR, LOCK) for e in os.listdir(dst)):
            raise ConfigError(f"output directory {dst!r} is not empty; pass --resume to finish an interrupted "
                              "conversion there, or choose an empty directory")
        return {}
    if previous is None:
        return {}
    for key in ("format", "version", "options", "fields", "classes"):
        if previous.get(key) != header[key]:
            raise ConfigError(f"cannot resume in {dst!r}: it was written with other {key} "
                              f"({previous.get(key)!r}, now {header[key]!r})")
    if previous["source"]["count"] != header["source"]["count"]:
        raise ConfigError(f"cannot resume in {dst!r}: the source had {previous['source']['count']} samples, "
                          f"now {header['source']['count']}")
    by_stem = {stem: k for k, stem in enumerate(stems)}
    kept = {}
    for shard in previous["shards"]:
        k = by_stem.get(shard["stem"])
        if k is not None and (shard["start"], shard["stop"]) == ranges[k]:
            kept[k] = shard
    return kept


def _move_files(src_dir: str, dst: str, files: list[dict[str, Any]]) -> None:
    for entry in files:
        target = os.path.join(dst, entry["name"])
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        os.replace(os.path.join(src_dir, entry["name"]), target)
    shutil.rmtree(src_dir, ignore_errors=True)


# -- command line ------------------------------------------------------------------------------------

def _size_hw(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)[xX](\d+)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"must be HxW (e.g. 256x256), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def _budget(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a count or a fraction, got {text!r}") from None


def _option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def add_parser(sub: Any) -> None:
    from ..formats import FORMATS
    writable = sorted(k for k, v in FORMATS.items() if v[2])
    p = sub.add_parser(
        "convert", help=COMMANDS["convert"].help,
        description="Read the dataset at SRC (any readable format: file tree, TFRecord, RecordIO, LMDB, "
                    "WebDataset tars, raw shards, COCO) and write it to the directory DST in format --to, in "
                    "shards written under temporary names and renamed when complete, with a manifest.json "
                    "holding each shard's files, sample range and sha256. The output is byte-identical "
                    "whatever --workers or --ray ran it; --resume finishes an interrupted run.")
    p.add_argument("src", help="dataset to read (directory, shard file, glob)")
    p.add_argument("dst", help="output directory (created; must be empty unless --resume)")
    p.add_argument("--to", required=True, choices=writable, help="output format")
    p.add_argument("--from", dest="source_format", metavar="FORMAT", choices=sorted(FORMATS),
                   help="source format (default: detected from SRC)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--shard-size", type=int, metavar="N", help="samples per shard")
    size.add_argument("--shard-bytes", metavar="SIZE",
                      help=f"shard size by stored sample bytes, e.g. 256MB, 1GiB (default "
                           f"{DEFAULT_SHARD_BYTES // 10**6}MB; a format written as one file, LMDB, ignores it)")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="worker processes (default 1)")
    p.add_argument("--ray", nargs="?", const=True, default=False, metavar="ADDRESS",
                   help="run the shard jobs as Ray tasks: on the cluster at ADDRESS ('auto': the one this "
                        "machine belongs to; 'ray://head:10001': Ray Client), at RAY_ADDRESS when omitted, else on "
                        "a new local Ray. SRC and DST must be on storage every node sees at the same path, and "
                        "ingest must be installed on every node")
    p.add_argument("--max-side", type=int, metavar="S",
                   help="resize images whose longer side exceeds S to S and re-encode them as JPEG")
    p.add_argument("--quality", type=int, metavar="Q", help="re-encode every image as JPEG at quality Q (1-100)")
    p.add_argument("--raw-size", type=_size_hw, metavar="HxW",
                   help="decode and resize every image to HxW uint8 pixels (for --to raw)")
    p.add_argument("--max-failures", type=_budget, default=0, metavar="N",
                   help="skip and report up to N bad samples (a count, or a fraction like 0.01); default 0: "
                        "the first bad sample stops the conversion")
    p.add_argument("--resume", action="store_true",
                   help="keep the shards an interrupted run completed in DST (checksums checked), redo the rest")
    p.add_argument("--prefix", default="shard", help="shard file name prefix (default shard)")
    p.add_argument("-o", "--option", dest="options", type=_option, action="append", default=[],
                   metavar="KEY=VALUE", help="writer option (JSON value or string), e.g. -o compression=gzip")
    p.add_argument("-s", "--source-option", dest="source_options", type=_option, action="append", default=[],
                   metavar="KEY=VALUE", help="reader option, e.g. -s images=train2017/ for COCO, "
                                             "-s compression=gzip for TFRecords")
    p.add_argument("--drop", dest="drop_fields", default="", metavar="FIELD,...",
                   help="source fields not to write (e.g. --drop area,iscrowd to leave them out of a COCO set's "
                        "shards), and what the source holds but its reader does not read, which is otherwise "
                        "refused by name (e.g. --drop segmentation: COCO polygons read without -s masks=polygons)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    p.set_defaults(run=run)


def run(args: Any) -> int:
    try:
        summary = _convert_args(args)
    except KeyboardInterrupt:
        print("ingest convert: interrupted; run the same command with --resume to finish", file=sys.stderr)
        return 130
    print("\n".join(summary.lines()))
    return 0


def _convert_args(args: Any) -> Summary:
    return convert(args.src, args.dst, to=args.to, source_format=args.source_format, shard_size=args.shard_size,
                   shard_bytes=args.shard_bytes, workers=args.workers, max_side=args.max_side,
                   quality=args.quality, raw_size=args.raw_size, max_failures=args.max_failures,
                   resume=args.resume, ray=args.ray, prefix=args.prefix, writer_options=dict(args.options),
                   source_options=dict(args.source_options),
                   drop_fields=[f for f in args.drop_fields.split(",") if f], progress=not args.quiet)
