"""A conversion's shard jobs: what every job shares (`Job`) and what one job does (`write_shard`: read a range
of the source, transform, write one shard into the temporary directory). The runners (`ingest.tools.runners`)
run them wherever they run; the converter (`ingest.tools.convert`) plans them and commits their shards.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..decode.cpu import CpuDecoder
from ..errors import IngestError, WriteError
from ..formats import writer_class
from ..formats.base import Field, Record
from . import manifest
from .source_view import SourceView
from .transform import Transform


@dataclass(frozen=True)
class Job:
    """What every shard job of one conversion shares (shipped once to each worker process or Ray node)."""

    view: SourceView
    format: str
    fields: dict[str, Field]
    options: dict[str, Any]      # writer options
    transform: Transform
    tmp: str                     # DST/.ingest-tmp
    stop_on_failure: bool


#: Called once per sample a job has handled (the progress counter of the process running the job).
_tick: Callable[[], None] = lambda: None


def set_tick(fn: Callable[[], None]) -> None:
    global _tick
    _tick = fn


def write_shard(job: Job, stem: str, start: int, stop: int) -> dict[str, Any]:
    """Write source samples ``[start, stop)`` as shard ``stem`` into ``job.tmp/stem/``; return its manifest
    entry (with ``files`` empty when it stopped at a failure under ``stop_on_failure``).

    Notes: a sample the reader, the transform or the writer refuses (IngestError, ValueError, an unreadable
    source file) is a bad sample, counted against the budget. An error writing the output (OSError from the
    writer: a full disk, a file-size limit, an I/O error) is not: it raises `WriteError` naming the file,
    whatever the budget, and the shard, which may hold part of a record, is never committed."""
    directory = os.path.join(job.tmp, stem)
    shutil.rmtree(directory, ignore_errors=True)
    writer = writer_class(job.format)
    decodes = "decode" in inspect.signature(writer).parameters   # a writer that stores pixels (raw)
    decoder = CpuDecoder(threads=1) if job.transform.active or decodes else None
    failures, count = [], 0
    try:
        with writing(directory, f"shard {stem}"):
            os.makedirs(directory)
            writer = writer(directory, stem, job.fields, **job.options,
                            **({"decode": decoder.decode} if decodes else {}))
        where = getattr(writer, "path", directory)
        for name, record, err in job.view.read(start, stop):
            stage = "read"
            if err is None:
                stage = "transform"
                try:
                    record = _project(job.transform.apply(record, name, decoder), job.fields)
                    stage = "write"
                    with writing(where, f"shard {stem} (source sample {start + count})"):
                        writer.add(record)
                    count += 1
                except (IngestError, ValueError, OSError) as e:
                    if isinstance(e, WriteError):
                        raise
                    err = e
            _tick()
            if err is not None:
                failures.append([name, stage, f"{type(err).__name__}: {err}"])
                if job.stop_on_failure:   # the driver fails the conversion on it; the shard is never committed
                    with contextlib.suppress(IngestError, ValueError, OSError):
                        writer.close()
                    return {"stem": stem, "start": start, "stop": stop, "count": 0, "bytes": 0, "files": [],
                            "failures": failures}
        with writing(where, f"shard {stem}"):
            files = [manifest.file_entry(directory, name) for name in writer.close()]
    finally:
        if decoder is not None:
            decoder.close()
    return {"stem": stem, "start": start, "stop": stop, "count": count,
            "bytes": sum(f["bytes"] for f in files), "files": files, "failures": failures}


@contextlib.contextmanager
def writing(path: str, what: str) -> Iterator[None]:
    """An OSError inside the block (writing ``what`` into ``path``) becomes a `WriteError` naming the file
    the system names, else ``path``."""
    try:
        yield
    except OSError as err:
        reason = err.strerror or (str(err.args[0]) if len(err.args) == 1 else str(err))
        code = f" (errno {err.errno})" if err.errno is not None else ""
        raise WriteError(f"writing {what} failed: {reason}{code}; nothing of it was committed",
                         path=err.filename or path, errno=err.errno) from err


def _project(record: Record, fields: dict[str, Field]) -> Record:
    """The record holding only the declared ``fields`` (the label -1 when 'label' is not one of them)."""
    return Record(record.image, record.label if "label" in fields else -1,
                  {k: v for k, v in record.fields.items() if k in fields})


def check_shard(dst: str, shard: dict[str, Any]) -> list[str]:
    """`manifest.check_shard` as a job (hashing a kept shard on resume runs where the writing does)."""
    return manifest.check_shard(dst, shard)
