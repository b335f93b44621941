"""Tar shards: one scan of the member headers, WebDataset's grouping of members into samples, and the index
that lets a shard be read at offsets without scanning it again. The index is ingest's own JSON (below), not
DALI's ``wds2idx`` text format: ingest neither reads nor writes that one.

**Scan.** Headers are parsed by Python's `tarfile` (pre-POSIX v7, ustar, GNU long names and pax headers all
parse); each regular member gives its data's byte range. `tarfile` ends an archive quietly at the first
header it cannot parse; the scan does not: whatever follows the last member must be the zero blocks of the
end-of-archive marker, else the header there is reported (bad checksum, garbage, a truncated file). A member
whose data runs past the end of the file, a sparse member and a name that escapes the shard root (absolute,
or with a ``..`` component) are typed errors too. Reads are chunked, so a corrupt size field never makes a
large allocation. Building an index first reads plain headers (no long names, pax records or sparse files)
with `fast_scan`, which costs far less CPU than `tarfile` (docs/measurements.md, Small per-batch costs), and
hands anything else, damage included, to the `tarfile` scan; property tests check that both find the same
members.

**Grouping** (webdataset's rules, `webdataset.tariterators`): only regular files count; names starting with a
``__...__`` component (metadata) and names without a dot in their base name are skipped. The key is the path
up to the first dot of the base name, the extension everything after it, lower-cased (``a/b.seg.png`` -> key
``a/b``, extension ``seg.png``; a base name starting with a dot follows webdataset's pattern: `split_key`).
Consecutive members with the same key form one sample; an extension seen twice in one sample is an error.

**Index file** ``<shard>.idx`` (e.g. ``train-0001.tar.idx``), JSON::

    {"format": "ingest-tar-index", "version": 1, "tar_size": <bytes of the tar>,
     "keys": [<sample key>, ...], "starts": [<first member of each sample>, ..., <member count>],
     "exts": [<extension of each member>], "offsets": [<data offset>], "sizes": [<data size>],
     "ints": [<value of a small integer member (cls, index, ...), else null>]}

An index is used only when its ``tar_size`` matches the shard; one that does not parse or whose ranges do not
fit the shard is a `CorruptRecordError` naming the index file. An index is not trusted beyond that: a reader
reads each member with the header block before its data and checks it against the index (`header_problem`:
checksum, regular file, size, name), so an index whose offsets, sizes, keys or extensions were edited, or
that belongs to another tar of the same size, is named when the member is read.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
import zlib
from dataclasses import dataclass
from typing import IO, Any, Iterator

import numpy as np

from .._atomic import atomic_write
from ..errors import CorruptRecordError

INDEX_FORMAT = "ingest-tar-index"
INDEX_VERSION = 1
#: Extensions whose (small) members hold one integer: read during the scan so labels need no extra reads.
INT_EXTENSIONS = ("cls", "cls2", "class", "index", "inx", "id", "count")
_SMALL = 64                       # bytes: integer members at most this long are read during the scan
_CHUNK = 1 << 20                  # bytes per read: bounds what a corrupt size field can allocate
_META = re.compile(r"__[^/]*__($|/)")


def index_path(shard: str) -> str:
    """Where the index of ``shard`` lives: beside it, named ``<shard>.idx``."""
    return shard + ".idx"


def split_key(name: str) -> tuple[str, str] | None:
    """WebDataset's ``(key, extension)`` of a member name (extension lower-cased), or None to skip it: the
    result of webdataset's ``^((?:.*/|)[^.]+)[.]([^/]*)$`` and its metadata rules, without the regex's
    backtracking cost."""
    if name.startswith("__") and _META.match(name):
        return None
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot < 0:
        return None
    if dot == slash + 1:
        # A base name starting with a dot: the pattern's key then reaches back over the last directory
        # ("a/.x.jpg" -> key "a/"), which must have no dot itself.
        if slash < 0 or "." in name[name.rfind("/", 0, slash) + 1:slash]:
            return None
    return name[:dot], name[dot + 1:].lower()


@dataclass
class Member:
    """A regular tar member: its name, data range and header offset; ``data`` when the scan read it."""

    name: str
    header: int
    offset: int
    size: int
    data: bytes | None = None


class _Tracked:
    """A file object for `tarfile` that reads in bounded chunks and remembers the last block it read."""

    def __init__(self, f: IO[bytes]):
        self._f = f
        self.last = (-1, b"")   # (offset, bytes) of the last read

    def tell(self) -> int:
        return self._f.tell()

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._f.seek(pos, whence)

    def read(self, n: int = -1) -> bytes:
        start = self._f.tell()
        parts, got = [], 0
        while n < 0 or got < n:
            chunk = self._f.read(_CHUNK if n < 0 else min(_CHUNK, n - got))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        data = b"".join(parts)
        self.last = (start, data[:tarfile.BLOCKSIZE])
        return data


def escapes(name: str) -> bool:
    """True for a member name that leaves the shard root (absolute, a drive, or a ``..`` component)."""
    if ".." not in name and ":" not in name and not name.startswith(("/", "\\")):
        return False
    return name.startswith("/") or name.startswith("\\") or ".." in re.split(r"[/\\]", name) or \
        bool(re.match(r"^[A-Za-z]:", name))


def scan(f: IO[bytes], path: str, *, size: int | None = None, read_all: bool = False) -> Iterator[Member]:
    """The regular members of the tar read from ``f`` (positioned at its start), in archive order.
    ``size``: the file's size when known (random access; member ranges are checked against it).
    ``read_all``: read every member's data (streaming); else only small integer members are read."""
    raw = _Tracked(f)
    tf = None
    last: Member | None = None
    try:
        tf = tarfile.TarFile(fileobj=raw, mode="r")
        while True:
            info = tf.next()
            if info is None:
                break
            tf.members.clear()   # the scan keeps no TarInfo list (shards may hold millions of members)
            if info.issparse():
                raise CorruptRecordError(f"sparse member {info.name!r} is not supported", path=path,
                                         offset=info.offset)
            if not info.isreg():
                continue
            if escapes(info.name):
                raise CorruptRecordError(f"member name {info.name!r} escapes the shard root", path=path,
                                         offset=info.offset)
            if size is not None and info.offset_data + info.size > size:
                raise CorruptRecordError(f"member {info.name!r} claims {info.size} bytes of data from byte "
                                         f"{info.offset_data}, past the end of the file ({size} bytes)",
                                         path=path, offset=info.offset)
            member = last = Member(info.name, info.offset, info.offset_data, info.size)
            if read_all or _small_int_member(info.name, info.size):
                data = tf.extractfile(info).read()
                if len(data) != info.size:
                    raise CorruptRecordError(f"member {info.name!r} is truncated ({len(data)} of {info.size} "
                                             "bytes)", path=path, offset=info.offset)
                member.data = data
            yield member
        _check_end(raw, tf.offset, path)
    except CorruptRecordError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError, OverflowError, UnicodeError, zlib.error) as err:
        where = tf.offset if tf is not None else 0
        after = f" (after member {last.name!r})" if last is not None else ""
        raise CorruptRecordError(f"not a valid tar{after}: {err}", path=path, offset=where) from err


def _check_end(raw: _Tracked, end: int, path: str) -> None:
    """What follows the last member must be zero blocks (or nothing)."""
    at, block = raw.last
    if at != end:
        raw.seek(end)
        block = raw.read(tarfile.BLOCKSIZE)
        at = end
    else:
        raw.seek(end + len(block))
    if block.strip(b"\0"):
        raise CorruptRecordError("invalid tar header (bad checksum, garbage or a truncated file) where the "
                                 "next member or the end-of-archive marker should be", path=path, offset=end)
    pos = at + len(block)
    while True:
        chunk = raw._f.read(_CHUNK)
        if not chunk:
            return
        stripped = chunk.lstrip(b"\0")
        if stripped:
            raise CorruptRecordError("data after the end-of-archive marker (concatenated tars are not "
                                     "supported)", path=path, offset=pos + len(chunk) - len(stripped))
        pos += len(chunk)


@dataclass
class TarIndex:
    """The samples of one tar shard: ``keys[j]``'s members are ``starts[j]:starts[j+1]`` of the member arrays
    (extension, data offset, data size, integer value or `NO_INT`)."""

    keys: list[str]
    starts: np.ndarray
    exts: list[str]
    offsets: np.ndarray
    sizes: np.ndarray
    ints: np.ndarray
    tar_size: int = 0

    def __len__(self) -> int:
        return len(self.keys)

    def members(self, j: int) -> range:
        return range(int(self.starts[j]), int(self.starts[j + 1]))


NO_INT = np.iinfo(np.int64).min


def parse_int(data: bytes) -> int | None:
    """The integer an ASCII member holds (surrounding whitespace allowed), or None."""
    text = data.strip()
    if not re.fullmatch(rb"[+-]?\d{1,18}", text):
        return None
    return int(text)


def group(members: Iterator[Member], path: str) -> Iterator[tuple[str, list[tuple[str, Member]]]]:
    """WebDataset samples: ``(key, [(extension, member), ...])`` of consecutive members sharing a key."""
    key, parts = None, []
    for member in members:
        split = split_key(member.name)
        if split is None:
            continue
        k, ext = split
        if k != key:
            if parts:
                yield key, parts
            key, parts = k, []
        if any(ext == e for e, _ in parts):
            raise CorruptRecordError(f"sample {k!r} has two {ext!r} members ({member.name!r} twice?)",
                                     path=path, offset=member.header)
        parts.append((ext, member))
    if parts:
        yield key, parts


def build(path: str) -> TarIndex:
    """Scan the tar at ``path`` and group its members (see the module docstring)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        members = fast_scan(f, path, size)
        return from_members(iter(members) if members is not None else scan(f, path, size=size), path, size)


def from_members(members: Iterator[Member], path: str, size: int) -> TarIndex:
    """The index of the tar at ``path`` (``size`` bytes) holding the regular ``members``, in archive order;
    a member's ``data``, where given, is kept as its integer value when it is a small integer member."""
    keys, starts, exts, offsets, sizes, ints = [], [0], [], [], [], []
    for key, parts in group(members, path):
        keys.append(key)
        for ext, m in parts:
            exts.append(ext)
            offsets.append(m.offset)
            sizes.append(m.size)
            value = parse_int(m.data) if m.data is not None and _small_int_member(m.name, m.size) else None
            ints.append(NO_INT if value is None else value)
        starts.append(len(exts))
    return TarIndex(keys, np.array(starts, np.int64), exts, np.array(offsets, np.int64),
                    np.array(sizes, np.int64), np.array(ints, np.int64), size)


def _octal(field: bytes) -> int:
    """A header number field read as `tarfile` reads it (ValueError where it would refuse it, and for the
    base-256 form, left to `tarfile`)."""
    if field[0] in (0o200, 0o377):
        raise ValueError("base-256 number")
    return int(field.split(b"\0", 1)[0].decode("ascii").strip() or "0", 8)


def _small_int_member(name: str, size: int) -> bool:
    key = split_key(name)
    return key is not None and key[1] in INT_EXTENSIONS and size <= _SMALL


def fast_scan(f: IO[bytes], path: str, size: int) -> list[Member] | None:
    """The members of a plain tar (v7, ustar or GNU headers without long names, pax records or sparse
    files) read straight from its header blocks: the same members `scan` finds, several times faster.
    Returns None when a header needs more or is damaged: `scan` then reads the file with `tarfile` (which
    also words the error). Checksums are verified together, before any member is trusted."""
    if size == 0:
        return None   # tarfile refuses an empty file
    members: list[Member] = []
    heads: list[bytes] = []
    plain: set[bytes] = set()     # mode/uid/gid/mtime/device fields already seen to be plain numbers
    pos, fd, end_marker = 0, f.fileno(), False
    while pos < size:
        block = os.pread(fd, 2 * tarfile.BLOCKSIZE, pos)
        head = block[:tarfile.BLOCKSIZE]
        if len(head) < tarfile.BLOCKSIZE:
            return None
        if not head.strip(b"\0"):
            end_marker = True
            break
        kind = head[156:157]
        numbers = head[100:124] + head[136:148] + head[329:345]
        try:
            if numbers not in plain:
                for a in (0, 8, 16, 24, 36, 44):
                    _octal(numbers[a:a + (12 if a == 24 else 8)])
                plain.add(numbers)
            length = _octal(head[124:136])
            name = head[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            prefix = head[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        except ValueError:
            return None
        if kind not in (b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"\0"):
            return None
        heads.append(head)
        if prefix:
            name = prefix + "/" + name
        data = pos + tarfile.BLOCKSIZE
        if not (kind in (b"0", b"7") or (kind == b"\0" and not name.endswith("/"))):   # not a regular file
            pos = data
            continue
        pos = data + -(-length // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
        if pos > size:
            return None
        small = block[tarfile.BLOCKSIZE:tarfile.BLOCKSIZE + length] if _small_int_member(name, length) else None
        members.append(Member(name, data - tarfile.BLOCKSIZE, data, length, small))
    if heads and not _checksums_ok(heads):
        return None
    for m in members:
        if escapes(m.name):
            raise CorruptRecordError(f"member name {m.name!r} escapes the shard root", path=path, offset=m.header)
    if end_marker:
        _check_end(_Tracked(f), pos, path)
    return members


def _checksums_ok(heads: list[bytes]) -> bool:
    """Every header's stored checksum equals the unsigned byte sum with the checksum field as spaces (the
    rare signed-sum writers are left to `tarfile`)."""
    blocks = np.frombuffer(b"".join(heads), np.uint8).reshape(len(heads), tarfile.BLOCKSIZE)
    sums = blocks.sum(1, dtype=np.int64) - blocks[:, 148:156].sum(1, dtype=np.int64) + 8 * 32
    try:
        stored = np.array([_octal(h[148:156]) for h in heads], np.int64)
    except ValueError:
        return False
    return bool(np.array_equal(sums, stored))


def save(index: TarIndex, path: str) -> None:
    """Write ``index`` to ``path`` (through a temporary name, then renamed)."""
    doc = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "tar_size": index.tar_size, "keys": index.keys,
           "starts": index.starts.tolist(), "exts": index.exts, "offsets": index.offsets.tolist(),
           "sizes": index.sizes.tolist(),
           "ints": [None if v == NO_INT else int(v) for v in index.ints.tolist()]}
    with atomic_write(path) as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


def load(path: str, tar_size: int) -> TarIndex | None:
    """The index saved at ``path`` for a tar of ``tar_size`` bytes; None if it was made for another size
    (a rewritten shard). Raises CorruptRecordError if it is malformed or its ranges do not fit."""
    try:
        with open(path) as f:
            doc = json.load(f)
        if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT:
            raise ValueError("not an ingest tar index")
        if doc.get("version") != INDEX_VERSION:
            raise ValueError(f"version {doc.get('version')!r}, expected {INDEX_VERSION}")
        if doc["tar_size"] != tar_size:
            return None
        m = len(doc["exts"])
        index = TarIndex([str(k) for k in doc["keys"]], np.array(doc["starts"], np.int64),
                         [str(e) for e in doc["exts"]], np.array(doc["offsets"], np.int64),
                         np.array(doc["sizes"], np.int64),
                         np.array([NO_INT if v is None else v for v in doc["ints"]], np.int64), tar_size)
    except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError) as err:
        raise CorruptRecordError(f"unreadable tar index: {err}", path=path) from None
    ok = (index.starts.shape == (len(index.keys) + 1,) and index.starts[0] == 0 and index.starts[-1] == m
          and np.all(np.diff(index.starts) > 0) and index.offsets.shape == index.sizes.shape == index.ints.shape
          == (m,) and np.all(index.sizes >= 0) and np.all(index.offsets % tarfile.BLOCKSIZE == 0)
          and np.all(index.offsets >= tarfile.BLOCKSIZE)
          and np.all(index.offsets + index.sizes <= tar_size) and np.all(np.diff(index.offsets) > 0))
    if not ok:
        raise CorruptRecordError("tar index entries do not fit the shard (stale or corrupt index: delete it "
                                 "to rebuild)", path=path)
    return index


def header_problem(block: Any, key: str, ext: str, size: int) -> str | None:
    """What is wrong with ``block`` (the 512 bytes before a member's data) as the header of the regular
    member ``key.ext`` of ``size`` bytes, or None: a checksum that does not match, another member type, size
    or name. A name longer than the header's name field (a pax or GNU long name) is compared as far as the
    field holds it; ``ext`` is compared ignoring case (the index keeps it lower-cased). A header whose name
    and size fields hold exactly what the index gives (as `tarfile` and GNU tar write them: the name and a
    NUL, eleven octal digits and a NUL) is taken at once; any other is checked in full."""
    head = bytes(block[:tarfile.BLOCKSIZE])
    if len(head) < tarfile.BLOCKSIZE:
        return "the member's header is cut short"
    name = f"{key}.{ext}".encode("utf-8", "surrogateescape")
    if len(name) < 100 and head.startswith(name) and head[len(name)] == 0 and \
            head[124:136] == b"%011o\0" % size and head[156:157] in (b"0", b"\0"):
        return None
    try:
        stored = _octal(head[148:156])
    except (ValueError, UnicodeDecodeError):
        return "the header's checksum field is not a number: not a member header"
    if sum(head) - sum(head[148:156]) + 8 * 32 != stored:
        return "the header's checksum does not match: not a member header (an index entry off its member?)"
    if head[156:157] not in (b"0", b"7", b"\0"):
        return f"the header is of member type {head[156:157]!r}, not a regular file"
    try:
        if _octal(head[124:136]) != size:
            return f"the header gives {_octal(head[124:136])} bytes of data, the index {size}"
    except (ValueError, UnicodeDecodeError):
        pass   # base-256 sizes (past 8 GB) are left to the name check
    name = head[:100].split(b"\0", 1)[0]
    prefix = head[345:500].split(b"\0", 1)[0] if head[257:262] == b"ustar" else b""
    got = (prefix + b"/" + name if prefix else name).decode("utf-8", "surrogateescape")
    want = f"{key}.{ext}"
    if split_key(got) == (key, ext) or (len(name) >= 99 and want.lower().startswith(got.lower())
                                        and want.startswith(got[:len(key)])):
        return None
    return f"the header names member {got[:120]!r}, the index {want[:120]!r}"


def open_index(shard: str, *, write: bool = False, path: str | None = None) -> TarIndex:
    """The index of ``shard``: loaded from ``<shard>.idx`` when it is there and matches, else built by a
    scan (and saved when ``write``). ``path``: an index file to use instead, which must match the shard."""
    try:
        tar_size = os.stat(shard).st_size
    except OSError as err:
        raise FileNotFoundError(f"tar shard {shard!r} cannot be read: {err.strerror}") from err
    if path is not None:
        index = load(path, tar_size)
        if index is None:
            raise CorruptRecordError(f"index made for a tar of another size, not {shard!r} ({tar_size} bytes)",
                                     path=path)
        return index
    saved = index_path(shard)
    if os.path.exists(saved):
        index = load(saved, tar_size)
        if index is not None:
            return index
    index = build(shard)
    if write:
        save(index, saved)
    return index
