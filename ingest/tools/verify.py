"""`ingest verify PATH [--decode]`: read a whole dataset and name every bad record.

Checks, in order: the converter's manifest (every listed file present, its size and sha256, the sample
count), each record file's index against its data (TFRecord, RecordIO, tar), then every record of every
shard: framing, CRCs (the per-record CRC32C of `ingest.formats.checks` wherever they were written) and the
format's own checks, as the readers apply them; with ``decode`` also that every
encoded image decodes (`ingest.decode.cpu.CpuDecoder`). A shard whose framing is broken is reported once, at
the offset where reading it stopped (framing cannot resynchronise past a bad length). Problems are
``(where, reason)``: the file, and the record's offset or key.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ConfigError, DecodeError, IngestError
from ..formats import detect, fields_of, open_source
from ..decode.cpu import CpuDecoder
from ..decode.masks import decode_mask
from . import COMMANDS, manifest, shardfiles
from .convert import _option
from .source_view import SourceView

#: Images decoded per batch with ``decode``.
_BATCH = 64


@dataclass
class Report:
    """What `verify` found: records read, images and masks decoded, problems ``(where, reason)``."""

    records: int = 0
    decoded: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(path: str, *, source_format: str | None = None, decode: bool = False,
           on_problem: Callable[[str, str], None] | None = None,
           source_options: dict[str, Any] | None = None) -> Report:
    """Check the dataset at ``path`` (see the module docstring); ``on_problem(where, reason)`` is called
    as each problem is found; ``source_options`` go to the reader (as `inspect`'s: a COCO file's ``images``
    directory). Raises FileNotFoundError / SourceError when ``path`` is not a dataset."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"path {path!r} does not exist")
    report = Report()

    def problem(where: str, reason: str) -> None:
        report.problems.append((where, reason))
        if on_problem is not None:
            on_problem(where, reason)

    listed = _check_manifest(path, problem) if os.path.isdir(path) else None
    try:
        fmt = source_format or detect(path)
    except IngestError as err:   # a malformed manifest names the format: reported above, nothing to read
        if listed is not False:
            problem(_where(err, path), _reason(err))
        return report
    if listed is False:
        listed = None
    parts = shardfiles.shard_files(path, fmt) or [(fmt, path)]   # indexed formats: shard by shard
    decoder = CpuDecoder() if decode else None
    try:
        for part_fmt, part in parts:
            if part_fmt in shardfiles.INDEXED:
                try:
                    stale = shardfiles.check_index(part_fmt, part)
                except (IngestError, OSError) as err:
                    stale = _reason(err)
                if stale:
                    problem(shardfiles.index_file(part_fmt, part), stale)
            _check_records(part, part_fmt, decoder, report, problem, dict(source_options or {}))
    finally:
        if decoder is not None:
            decoder.close()
    if listed is not None and listed != report.records:
        problem(os.path.join(path, manifest.MANIFEST),
                f"lists {listed} samples, {report.records} records were read")
    return report


def _check_manifest(directory: str, problem: Callable[[str, str], None]) -> int | bool | None:
    """Check the files the converter's manifest lists; returns its sample count (None: no final manifest;
    False: a manifest that cannot be read, reported)."""
    try:
        data, final = manifest.load(directory)
    except IngestError as err:
        problem(_where(err, directory), _reason(err))
        return False
    if data is None:
        return None
    if not final:
        problem(os.path.join(directory, manifest.PARTIAL),
                "the conversion is unfinished (only a partial manifest): rerun it with --resume")
    for shard in data.get("shards", []):
        for reason in manifest.check_shard(directory, shard):
            where, _, why = reason.partition(": ")
            problem(where, why)
    return data["count"] if final else None


def _check_records(path: str, fmt: str, decoder: CpuDecoder | None, report: Report,
                   problem: Callable[[str, str], None], options: dict[str, Any]) -> None:
    try:
        try:   # every record with a CRC written is checked, whatever the format's default (formats.checks)
            source = open_source(path, format=fmt, **{"check": "crc", **options})
        except ConfigError:   # a format without the option, or a dataset written without CRCs
            source = open_source(path, format=fmt, **options)
        view = SourceView(source)
    except (IngestError, OSError) as err:   # the file cannot even be indexed: framing broken
        problem(_where(err, path), _reason(err))
        return
    fields = fields_of(source)
    images = [name for name, f in fields.items() if f.kind == "image"]
    masks = [name for name, f in fields.items() if f.kind == "mask"]   # decoded to their values, checked too
    pending: list[tuple[str, Any]] = []
    for name, record, err in view.read(0, len(view)):
        if err is not None:
            problem(_where(err, name), _reason(err))
            continue
        report.records += 1
        if decoder is not None:
            pending += [(f"{name} [{field_name}]", record.get(field_name)) for field_name in images]
            for field_name in masks:
                try:
                    decode_mask(record.get(field_name), f"{name} [{field_name}]")
                    report.decoded += 1
                except DecodeError as err:
                    problem(f"{name} [{field_name}]", _reason(err))
            if len(pending) >= _BATCH:
                _decode(decoder, pending, report, problem)
    if decoder is not None and pending:
        _decode(decoder, pending, report, problem)


def _decode(decoder: CpuDecoder, pending: list[tuple[str, Any]], report: Report,
            problem: Callable[[str, str], None]) -> None:
    names, datas = [n for n, _ in pending], [d for _, d in pending]
    pending.clear()
    for name, result in zip(names, decoder.decode_batch(datas, names)):
        if isinstance(result, Exception):
            problem(name, _reason(result))
        else:
            report.decoded += 1


def _where(err: BaseException, default: str) -> str:
    path = getattr(err, "path", None) or getattr(err, "filename", None)
    if not path:
        return default
    offset = getattr(err, "offset", None)
    return f"{path}:{offset}" if offset is not None else str(path)


def _reason(err: BaseException) -> str:
    text = str(err)
    path = getattr(err, "path", None)
    if path and text.startswith(str(path)):   # CorruptRecordError puts the place first; `where` has it
        text = text[len(str(path)):].split(": ", 1)[-1]
    return f"{type(err).__name__}: {text}"


def add_parser(sub: Any) -> None:
    from ..formats import FORMATS
    p = sub.add_parser(
        "verify", help=COMMANDS["verify"].help,
        description="Read every record of the dataset at PATH and report every problem, one line each "
                    "(file, offset or key, reason): the converter's manifest (files, sizes, sha256, count), "
                    "index files against the data, record framing and CRCs, the format's own checks, and "
                    "with --decode that every image decodes. Exits 1 when anything is wrong.")
    p.add_argument("path", help="dataset: directory, shard file or glob")
    p.add_argument("--from", dest="source_format", metavar="FORMAT", choices=sorted(FORMATS),
                   help="format (default: detected from PATH)")
    p.add_argument("--decode", action="store_true", help="also decode every image (CPU)")
    p.add_argument("-s", "--source-option", dest="source_options", type=_option, action="append", default=[],
                   metavar="KEY=VALUE", help="reader option, e.g. -s images=train2017/ for a COCO file")
    p.set_defaults(run=run)


def run(args: Any) -> int:
    report = verify(args.path, source_format=args.source_format, decode=args.decode,
                    on_problem=lambda where, reason: print(f"BAD {where}: {reason}"),
                    source_options=dict(args.source_options))
    decoded = f", {report.decoded} images decoded" if args.decode else ""
    summary = f"{report.records} records read{decoded}, {len(report.problems)} problems"
    print(summary if report.ok else summary + f" (in {args.path})", file=sys.stdout)
    return 0 if report.ok else 1
