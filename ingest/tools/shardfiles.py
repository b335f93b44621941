"""Which shard files a dataset path holds, and their index files: what `index` writes and `verify` checks.

Indexed formats: TFRecord (DALI ``tfrecord2idx``: ``offset size`` lines, `formats.tfrecord.write_index`),
MXNet RecordIO (``key<TAB>offset`` lines beside ``<name>.rec`` as ``<name>.idx``) and tar shards
(`formats.tarindex`, JSON ``<shard>.idx``). Compressed shards (``.gz``) cannot be read at offsets and have
no index.
"""

from __future__ import annotations

import importlib
import os

import numpy as np

from ..errors import SourceError
from ..formats import FORMATS, detect
from ..formats._shards import gzipped

INDEXED = ("tfrecord", "recordio", "wds")


def shard_files(path: str, fmt: str | None = None) -> list[tuple[str, str]]:
    """``(format, file)`` of every indexable shard at ``path`` (a shard file, a glob or a directory, found as
    the format's reader finds them: its ``find_shards``; ``fmt`` overrides detection). Empty for a dataset of
    another format. Raises FileNotFoundError / SourceError."""
    fmt = fmt or detect(path)
    if fmt not in INDEXED:
        return []
    module = importlib.import_module(f"..formats.{FORMATS[fmt][0]}", __package__)
    return [(fmt, shard) for shard in module.find_shards(path)]


def index_file(fmt: str, shard: str) -> str:
    """Where the index of ``shard`` lives."""
    return os.path.splitext(shard)[0] + ".idx" if fmt == "recordio" else shard + ".idx"


def write_index(fmt: str, shard: str) -> tuple[str, int]:
    """Write the index of one shard (replacing any); returns (index path, records or samples indexed)."""
    from ..formats import recordio, tarindex, tfrecord
    if gzipped(shard):
        raise SourceError(f"{shard} is compressed: it can only be streamed and has no index", path=shard)
    if fmt == "tfrecord":
        path = tfrecord.write_index(shard)
        return path, len(tfrecord.read_index(path, shard))
    if fmt == "recordio":
        path = recordio.write_index(shard, index_file(fmt, shard))
        return path, len(recordio.read_index(path, shard))
    index = tarindex.build(shard)
    path = tarindex.index_path(shard)
    tarindex.save(index, path)
    return path, len(index)


def check_index(fmt: str, shard: str) -> str | None:
    """What is wrong with the index file of ``shard`` (None: it matches the data, or there is none): an index
    that does not parse or fit its shard raises the reader's CorruptRecordError, one that fits but differs
    from a fresh scan (entries, offsets, sizes, names, a tar index's labels) is described."""
    from ..formats import recordio, tarindex, tfrecord
    path = index_file(fmt, shard)
    if not os.path.isfile(path) or gzipped(shard):
        return None
    if fmt == "tfrecord":
        saved, actual = tfrecord.read_index(path, shard), tfrecord.scan(shard)
        same = np.array_equal(saved, actual)
    elif fmt == "recordio":
        saved, actual = recordio.read_index(path, shard)[:, 0], recordio.scan(shard)[:, 0]
        same = np.array_equal(saved, actual)
    else:
        saved = tarindex.load(path, os.path.getsize(shard))
        if saved is None:
            return "made for a tar of another size (stale); `ingest index` rewrites it"
        actual = tarindex.build(shard)
        same = saved.keys == actual.keys and np.array_equal(saved.offsets, actual.offsets) \
            and np.array_equal(saved.sizes, actual.sizes) and saved.exts == actual.exts \
            and np.array_equal(saved.ints, actual.ints)
        saved = saved.keys
    if same:
        return None
    return (f"disagrees with the data ({len(saved)} entries, the shard holds {len(actual)}; or their offsets, "
            f"sizes, names or labels differ); `ingest index` rewrites it")
