"""Per-record CRC32C checks for the formats whose framing carries none (RecordIO, LMDB, WebDataset, raw).

Their writers record the CRC32C (Castagnoli, the `crc32c` package) of each record's bytes as they write them,
in the shard's side files, and a reader made with ``check="crc"`` compares every record's bytes with it as
they are read: a record whose bytes changed fails alone, as a `CorruptRecordError` naming the file and the
record's offset (the failure budget decides what happens next), instead of reaching training silently.

=============  =================================================  ==========================================
format         what is checksummed                                 where the CRCs are kept
=============  =================================================  ==========================================
RecordIO       each record's bytes as indexed (chunks + padding)   ``<stem>.crc32c`` beside ``<stem>.rec``
LMDB (ours)    each sample's value (the framed record)             key ``__crc32c__`` in the database
WebDataset     each member's data                                  ``<stem>.tar.crc32c`` beside the tar
raw            each stored field of each sample                    ``arrays["<field>.crc32c"]`` of the index
=============  =================================================  ==========================================

A batch's CRCs are computed by `crcs` in one native call that releases the GIL once (``ingest._readv.crcs``,
the C CRC32C of ``ingest/_native/crc32c.h``, which the native engine also runs on its read team); `crc` is the
reference and the fallback where that was not built.

TFRecord frames carry their own CRCs (``check_crc``, on by default). File trees, COCO and files other tools
wrote have no per-record checks; ``ingest verify`` compares whole files with the manifest's sha256.

**Modes** (``check=`` of each reader above; default the ``check`` setting, ``INGEST_CHECK``):

- ``"auto"`` (the default): check where CRCs were written and the format's check costs under 3% of its
  loader's rate (`DEFAULT_ON`: measured by ``benchmarks/bench_checks.py``, figures in docs/checks.md);
- ``"crc"``: check every record that has a CRC; a dataset written without them is a `ConfigError` naming it;
- ``"none"``: no per-record check.

**Side file** ``*.crc32c``: the magic ``b"IGC1"``, the record count (uint64 LE), then one uint32 LE CRC per
record in record order. One whose size or count disagrees with its shard is a `CorruptRecordError` naming it.
"""

from __future__ import annotations

from array import array
from typing import Any, Sequence

import crc32c as _crc32c
import numpy as np

from .. import _numpy, defaults
from .._atomic import atomic_write
from ..errors import ConfigError, CorruptRecordError

try:
    from .. import _readv as NATIVE
except ImportError:   # built where a C compiler was found (setup.py)
    NATIVE = None

MODES = ("auto", "crc", "none")
#: Formats checked under "auto" (their check costs under 3% of the loader's rate; docs/checks.md).
DEFAULT_ON = frozenset({"recordio", "lmdb", "wds"})
SUFFIX = ".crc32c"
MAGIC = b"IGC1"
_HEAD = len(MAGIC) + 8


def crc(data: Any) -> int:
    """The CRC32C of a buffer. The GIL is kept (the package gives it up above 32 KB by default): a record's
    CRC takes microseconds, and getting the GIL back beside a busy thread up to a switch interval."""
    return _crc32c.crc32c(data, gil_release_mode=0)


def crcs(buffers: Sequence[Any]) -> np.ndarray:
    """The CRC32C of each buffer of a batch, as a uint32 array: one native call that releases the GIL once for the
    batch (``ingest._readv.crcs``), or `crc` of each where that was not built (the reference). Buffers are
    C-contiguous; the CRC covers all of each one's bytes."""
    out = _numpy.zeros(len(buffers), np.uint32)
    if NATIVE is not None:
        NATIVE.crcs(buffers, out)
    else:
        for k, data in enumerate(buffers):
            out[k] = crc(data)
    return out


def matches(buffers: Sequence[Any], indices: Sequence[int], table: array) -> np.ndarray:
    """Whether each buffer of a batch has the CRC written for its record: ``crcs(buffers)[k] == table[indices[k]]``,
    an (n,) bool array (a reader's `parse_batch`; `mismatch` names a record that fails)."""
    want = _numpy.take(np.frombuffer(table, np.uint32), np.asarray(indices, np.int64))
    return crcs(buffers) == want


def mode(check: str | None) -> str:
    """A reader's ``check`` option: as given, or the ``check`` setting when None; ConfigError otherwise."""
    value = defaults.get("check") if check is None else check
    if value not in MODES:
        raise ConfigError(f"`check` must be one of {', '.join(MODES)}; got {value!r}")
    return value


def enabled(check: str | None, fmt: str, have: bool, where: str) -> bool:
    """Whether a reader of format ``fmt`` checks its records: per `mode`, given whether its CRCs were written
    (``have``); ``"crc"`` without them is a ConfigError naming ``where``."""
    value = mode(check)
    if value == "crc" and not have:
        raise ConfigError(f"check='crc': {where} holds no per-record CRC32C (written by another tool or an "
                          "older ingest); rewrite it with `ingest convert`, or pass check='none'")
    return have and (value == "crc" or (value == "auto" and fmt in DEFAULT_ON))


def write_file(path: str, crcs: Any) -> None:
    """Write a side file of per-record CRCs (module docstring), through a temporary name."""
    values = np.asarray(crcs, dtype="<u4")
    with atomic_write(path, "wb") as f:
        f.write(MAGIC + len(values).to_bytes(8, "little") + values.tobytes())


def read_file(path: str, count: int) -> np.ndarray | None:
    """The CRCs of the side file at ``path`` for a shard of ``count`` records (None: there is none)."""
    try:
        with open(path, "rb") as f:
            data = f.read(_HEAD + 4 * count + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CorruptRecordError(f"cannot read the CRC file: {err.strerror or err}", path=path) from err
    stored = int.from_bytes(data[len(MAGIC):_HEAD], "little") if len(data) >= _HEAD else -1
    if not data.startswith(MAGIC) or stored < 0:
        raise CorruptRecordError(f"not a CRC file (starts {data[:8]!r})", path=path)
    if stored != count:
        raise CorruptRecordError(f"holds the CRCs of {stored} records, but the shard's index gives {count} (the "
                                 "index, or this file, does not belong to the shard)", path=path)
    if len(data) != _HEAD + 4 * count:
        raise CorruptRecordError(f"{len(data)} bytes, a CRC file of {count} records has {_HEAD + 4 * count}",
                                 path=path, offset=min(len(data), _HEAD + 4 * count))
    return np.frombuffer(data, "<u4", count, _HEAD).astype(np.uint32)


def mismatch(data: Any, want: int, *, path: str, index: Any, offset: int | None) -> CorruptRecordError | None:
    """The error for a record whose bytes ``data`` do not have the CRC ``want``, else None."""
    got = crc(data)
    if got == want:
        return None
    return mismatch_error(got, want, len(memoryview(data).cast("B")), path=path, index=index, offset=offset)


def mismatch_error(got: int, want: int, size: int, *, path: str, index: Any,
                   offset: int | None) -> CorruptRecordError:
    """The error for a record of ``size`` bytes whose CRC32C is ``got`` where ``want`` was written (`mismatch`;
    the native engine's and the batch check's reports)."""
    return CorruptRecordError(f"CRC32C {got:08x} of the record's {size} bytes differs from the {want:08x} written "
                              "with it: its bytes changed", path=path, index=index, offset=offset)


def table(parts: list[np.ndarray | None]) -> array | None:
    """The CRCs of several shards as one flat column (indexing gives a Python int), or None when a shard
    has none."""
    if not parts or any(p is None for p in parts):
        return None
    return array("I", np.concatenate(parts).astype(np.uint32).tobytes())
