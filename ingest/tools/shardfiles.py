"""Which shard files a dataset path holds, and their index files: what `index` writes and `verify` checks.

Indexed formats: TFRecord (DALI ``tfrecord2idx``: ``offset size`` lines, `formats.tfrecord.write_index`),
MXNet RecordIO (``key<TAB>offset`` lines beside ``<name>.rec`` as ``<name>.idx``) and tar shards
(`formats.tarindex`, JSON ``<shard>.idx``). Compressed shards (``.gz``) cannot be read at offsets and have
no index.
"""

from __future__ import annotations

import glob
import os

import numpy as np

from ..errors import SourceError
from ..formats import MANIFEST, detect

INDEXED = ("tfrecord", "recordio", "wds")
_TAR = (".tar", ".tar.gz", ".tgz")


def _is_shard(name: str, fmt: str) -> bool:
    low = name.lower()
    if fmt == "tfrecord":
        from ..formats import tfrecord
        return tfrecord._is_shard_name(name)
    if fmt == "recordio":
        return low.endswith(".rec")
    return low.endswith(_TAR)


def compressed(path: str) -> bool:
    """True for a shard that can only be streamed (gzip)."""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def shard_files(path: str, fmt: str | None = None) -> list[tuple[str, str]]:
    """``(format, file)`` of every indexable shard at ``path`` (a shard file, a glob or a directory; ``fmt``
    overrides detection). Empty for a dataset of another format. Raises FileNotFoundError / SourceError."""
    if any(c in path for c in "*?[") and not os.path.exists(path):
        files = sorted(p for p in glob.glob(path) if os.path.isfile(p))
        if not files:
            raise FileNotFoundError(f"no files match {path!r}")
        return [pair for f in files for pair in shard_files(f, fmt)]
    if not os.path.exists(path):
        raise FileNotFoundError(f"path {path!r} does not exist")
    fmt = fmt or detect(path)
    if fmt not in INDEXED:
        return []
    if os.path.isfile(path):
        return [(fmt, path)]
    files = sorted(e.path for e in os.scandir(path) if e.is_file() and e.name != MANIFEST and _is_shard(e.name, fmt))
    if not files:
        raise SourceError(f"no {fmt} shard files in {path!r}", path=path)
    return [(fmt, f) for f in files]


def index_file(fmt: str, shard: str) -> str:
    """Where the index of ``shard`` lives."""
    return os.path.splitext(shard)[0] + ".idx" if fmt == "recordio" else shard + ".idx"


def write_index(fmt: str, shard: str) -> tuple[str, int]:
    """Write the index of one shard (replacing any); returns (index path, records or samples indexed)."""
    from ..formats import recordio, tarindex, tfrecord
    if compressed(shard):
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
    """What is wrong with the index file of ``shard`` (None: it matches the data, or there is none)."""
    from ..formats import recordio, tarindex, tfrecord
    path = index_file(fmt, shard)
    if not os.path.isfile(path) or compressed(shard):
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
            return f"{path}: made for a tar of another size (stale); `ingest index` rewrites it"
        actual = tarindex.build(shard)
        same = saved.keys == actual.keys and np.array_equal(saved.offsets, actual.offsets) \
            and np.array_equal(saved.sizes, actual.sizes) and saved.exts == actual.exts
        saved = saved.keys
    if same:
        return None
    return (f"{path}: disagrees with the data ({len(saved)} entries, the shard holds {len(actual)}); "
            f"`ingest index` rewrites it")
