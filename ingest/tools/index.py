"""`ingest index PATH...`: write the index files that let readers seek into record files without scanning
them: TFRecord (DALI ``tfrecord2idx`` format), MXNet RecordIO (``.idx``) and tar shards (see `shardfiles`).
Readers build these indexes in memory when they are missing; writing them once saves that scan on every
open (and DALI's readers need the TFRecord ones)."""

from __future__ import annotations

import os
import sys
from typing import Any

from ..errors import IngestError, SourceError
from ..formats._shards import gzipped
from . import COMMANDS, shardfiles


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "index", help=COMMANDS["index"].help,
        description="Write the index of every TFRecord (<file>.idx, DALI tfrecord2idx format: 'offset size' "
                    "per record), MXNet RecordIO (<name>.idx beside <name>.rec, 'key<TAB>offset') and tar "
                    "shard (<file>.idx, ingest's own JSON) at each PATH: a shard file, a glob or a directory of shards (of one "
                    "format, or several: each shard is indexed by its own). "
                    "Existing index files are replaced. Compressed shards have no index and are skipped.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="shard file, glob or directory")
    p.add_argument("--from", dest="source_format", choices=shardfiles.INDEXED, metavar="FORMAT",
                   help=f"format of the shards (default: from the names); one of {', '.join(shardfiles.INDEXED)}")
    p.set_defaults(run=run)


def run(args: Any) -> int:
    pairs = [pair for path in args.paths for pair in _shards(path, args.source_format)]
    bad = 0
    for fmt, shard in pairs:
        if gzipped(shard):
            print(f"{shard}: skipped: compressed shards are streamed and have no index")
            continue
        try:
            path, n = shardfiles.write_index(fmt, shard)
        except IngestError as err:
            print(f"{shard}: not indexed: {err}", file=sys.stderr)
            bad += 1
            continue
        print(f"{path}: {n} {'samples' if fmt == 'wds' else 'records'}")
    return 1 if bad else 0


def _shards(path: str, fmt: str | None) -> list[tuple[str, str]]:
    """The shards to index at ``path``: of format ``fmt``, else of the format detected from the path; a
    directory whose shards are of several indexed formats (a ``.rec`` beside a ``.tfrecord``) gives every
    shard of each, each indexed by its own format."""
    pairs = shardfiles.shard_files(path, fmt)
    if not pairs and fmt is None and os.path.isdir(path):
        seen: set[str] = set()
        for other in shardfiles.INDEXED:
            try:
                found = shardfiles.shard_files(path, other)
            except SourceError:   # none of this format here
                continue
            pairs += [(f, shard) for f, shard in found if shard not in seen]
            seen.update(shard for _, shard in found)
    if not pairs:
        raise SourceError(f"{path!r} holds no TFRecord, RecordIO or tar shards (give --from if their names do "
                          "not say)")
    return pairs
