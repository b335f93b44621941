"""Checking an LMDB data file before liblmdb maps it: what its meta pages promise, and that the B-tree of its
main database is sound wherever a read-only cursor or lookup goes.

liblmdb trusts its file. A file shorter than its meta page's last page number is mapped as promised, and
touching a page past the end of the file kills the process with SIGBUS; a branch page with fewer than two keys,
a root page number below 2 or a node whose flags say duplicates make liblmdb abort on an assertion. So before
an environment is opened (`check`):

- **Meta pages** (pages 0 and 1, each a page header then ``MDB_meta``: magic ``0xBEEFC0DE``, version 1, map
  size, the free and main databases' ``MDB_db`` records, ``mm_last_pg``, ``mm_txnid``): both must carry the
  meta flag, the magic and the version; the page size (the free database's ``md_pad``) must be a power of two
  from 512 to 65536; the meta liblmdb picks (the higher txnid) must promise no more than the file holds,
  ``(mm_last_pg + 1) * page size`` bytes.
- **The main tree**, level by level from its root (numpy over a read-only map of the file, a few gathers per
  level): every page number inside ``2..mm_last_pg`` and reached once; page headers naming their own page
  number, branch pages above the leaves and leaf pages at ``md_depth``, no other page kinds; ``lower`` and
  ``upper`` inside the page with ``lower <= upper``; branch pages holding at least two keys; every node and
  its key (and a leaf's inline value) inside its page, keys of at most 511 bytes; a leaf value on overflow
  pages lying inside the file; no duplicate or sub-database nodes (this reader opens plain databases); the
  leaf, branch and entry counts equal to what the main ``MDB_db`` says.

Anything else is a `CorruptRecordError` naming the data file and the byte offset of the page. A tree that
passes can be walked by liblmdb's read paths without reaching an assertion or a page outside the file; the
values it gives are still only as good as their bytes (per-record checks: `ingest.formats.checks`).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptRecordError

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
PAGE_HEADER = 16                 # mp_pgno u64, mp_pad u16, mp_flags u16, lower u16, upper u16
NODE_HEADER = 8                  # mn_lo u16, mn_hi u16, mn_flags u16, mn_ksize u16
P_BRANCH, P_LEAF, P_META = 0x01, 0x02, 0x08
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
P_INVALID = 2 ** 64 - 1
MAX_DEPTH = 32                   # liblmdb's cursor stack
MAX_KEY = 511
#: MDB_db: md_pad u32, md_flags u16, md_depth u16, branch, leaf, overflow pages, entries, root (u64 each)
_DB = struct.Struct("<IHHQQQQQ")
_META = struct.Struct("<II QQ 48s48s QQ")    # magic, version, address, mapsize, free db, main db, last_pg, txnid
_PAGE = np.dtype([("pgno", "<u8"), ("pad", "<u2"), ("flags", "<u2"), ("lower", "<u2"), ("upper", "<u2")])
_NODE = np.dtype([("lo", "<u2"), ("hi", "<u2"), ("flags", "<u2"), ("ksize", "<u2")])


@dataclass(frozen=True)
class Meta:
    """What the picked meta page of an LMDB says: page size, last page, txn id, and the main database."""

    page_size: int
    last_page: int
    txnid: int
    depth: int
    branch_pages: int
    leaf_pages: int
    entries: int
    root: int
    flags: int


def read_meta(path: str, size: int) -> Meta:
    """The meta page liblmdb would pick (the higher txnid), both meta pages checked; CorruptRecordError names
    ``path`` and the offset of the page at fault."""
    with open(path, "rb") as f:
        first = os.pread(f.fileno(), PAGE_HEADER + _META.size, 0)
        metas = [_meta(first, path, 0)]
        psize = metas[0][0]
        metas.append(_meta(os.pread(f.fileno(), PAGE_HEADER + _META.size, psize), path, psize))
    if metas[1][0] != psize:
        raise CorruptRecordError(f"meta pages disagree on the page size ({psize} and {metas[1][0]})", path=path,
                                 offset=psize)
    _, last, txnid, main = metas[1] if metas[1][2] > metas[0][2] else metas[0]
    need = (last + 1) * psize
    if last < 1 or need > size:
        raise CorruptRecordError(f"truncated or damaged LMDB: its meta page promises {last + 1} pages of {psize} "
                                 f"bytes ({need} bytes), the file holds {size}", path=path, offset=min(size, need))
    _, flags, depth, branch, leaf, _, entries, root = main
    return Meta(psize, last, txnid, depth, branch, leaf, entries, root, flags)


def _meta(raw: bytes, path: str, offset: int) -> tuple[int, int, int, tuple]:
    """(page size, last page, txnid, main MDB_db fields) of one meta page."""
    if len(raw) < PAGE_HEADER + _META.size:
        raise CorruptRecordError(f"file of {offset + len(raw)} bytes is too short for an LMDB meta page", path=path,
                                 offset=offset)
    flags = struct.unpack_from("<H", raw, 10)[0]
    magic, version, _, _, free, main, last, txnid = _META.unpack_from(raw, PAGE_HEADER)
    if not flags & P_META or magic != MAGIC:
        raise CorruptRecordError(f"not an LMDB meta page (flags 0x{flags:x}, magic 0x{magic:08x}, expected "
                                 f"0x{MAGIC:08x})", path=path, offset=offset)
    if version != DATA_VERSION:
        raise CorruptRecordError(f"LMDB data version {version}, this reader knows {DATA_VERSION}", path=path,
                                 offset=offset)
    psize = _DB.unpack(free)[0]
    if psize < 512 or psize > 65536 or psize & (psize - 1):
        raise CorruptRecordError(f"page size {psize} is not a power of two from 512 to 65536", path=path,
                                 offset=offset)
    return psize, last, txnid, _DB.unpack(main)


def check(path: str) -> Meta:
    """Check the LMDB data file at ``path`` (module docstring) and return its picked meta page."""
    try:
        size = os.stat(path).st_size
    except OSError as err:
        raise CorruptRecordError(f"cannot read the LMDB data file: {err.strerror or err}", path=path) from err
    meta = read_meta(path, size)
    if meta.flags & 0x04:   # MDB_DUPSORT: sub-pages and sub-databases this reader does not walk
        raise CorruptRecordError("the main database is DUPSORT, which this reader does not open", path=path)
    if meta.entries == 0 or meta.root == P_INVALID:
        if meta.entries or meta.root != P_INVALID or meta.depth:
            raise CorruptRecordError(f"main database says {meta.entries} entries, root page {meta.root} and depth "
                                     f"{meta.depth}", path=path, offset=0)
        return meta
    data = np.memmap(path, np.uint8, "r", shape=((meta.last_page + 1) * meta.page_size,))
    try:
        _Tree(data, meta, path, size).walk()
    finally:
        del data   # the map closes with its last view, an error's traceback included
    return meta


class _Tree:
    """One pass over the main tree of an LMDB map, a level at a time."""

    def __init__(self, data: np.ndarray, meta: Meta, path: str, size: int):
        self.data, self.meta, self.path, self.size = data, meta, path, size
        self.psize = meta.page_size

    def bad(self, message: str, page: int) -> CorruptRecordError:
        return CorruptRecordError(message, path=self.path, offset=int(page) * self.psize)

    def gather(self, starts: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """``dtype`` records at byte offsets ``starts`` of the map."""
        at = starts.astype(np.int64)[:, None] + np.arange(dtype.itemsize, dtype=np.int64)
        return self.data[at].view(dtype).reshape(-1)

    def walk(self) -> None:
        meta = self.meta
        if not 1 <= meta.depth <= MAX_DEPTH:
            raise self.bad(f"main database depth {meta.depth} is outside 1..{MAX_DEPTH}", 0)
        seen = np.zeros(0, np.int64)   # pages of the levels above
        pages = np.array([meta.root], np.uint64)
        counts = {"branch": 0, "leaf": 0, "entries": 0}
        for level in range(meta.depth):
            leaf = level == meta.depth - 1
            level_pages = pages
            pages = self.level(pages, seen, leaf, counts)
            seen = np.concatenate([seen, level_pages.astype(np.int64)])
        if (counts["branch"], counts["leaf"], counts["entries"]) != (meta.branch_pages, meta.leaf_pages,
                                                                     meta.entries):
            raise self.bad(f"the main tree holds {counts['branch']} branch and {counts['leaf']} leaf pages and "
                           f"{counts['entries']} entries; its meta page says {meta.branch_pages}, "
                           f"{meta.leaf_pages} and {meta.entries}", 0)

    def level(self, pages: np.ndarray, seen: np.ndarray, leaf: bool, counts: dict) -> np.ndarray:
        """Check the pages of one level; the next level's page numbers (none below the leaves)."""
        psize, last = self.psize, self.meta.last_page
        out = (pages < 2) | (pages > last)
        if out.any():
            raise self.bad(f"page number {int(pages[out][0])} is outside 2..{last}", 0)
        pages = pages.astype(np.int64)
        again = np.isin(pages, seen)
        if again.any() or len(np.unique(pages)) != len(pages):
            raise self.bad("a page is reached twice in the tree", int(pages[again][0]) if again.any() else 0)
        base = pages * psize
        head = self.gather(base, _PAGE)
        kind = P_LEAF if leaf else P_BRANCH
        wrong = (head["pgno"] != pages.astype(np.uint64)) | ((head["flags"] & ~np.uint16(0x10)) != kind)
        if wrong.any():
            j = int(np.flatnonzero(wrong)[0])
            raise self.bad(f"page header says page {int(head['pgno'][j])}, flags 0x{int(head['flags'][j]):x}; "
                           f"expected page {int(pages[j])}, a {'leaf' if leaf else 'branch'} page", pages[j])
        lower, upper = head["lower"].astype(np.int64), head["upper"].astype(np.int64)
        keys = (lower - PAGE_HEADER) >> 1
        wrong = (lower < PAGE_HEADER) | (lower & 1).astype(bool) | (lower > upper) | (upper > psize) | \
            (keys < (1 if leaf else 2))
        if wrong.any():
            j = int(np.flatnonzero(wrong)[0])
            raise self.bad(f"page bounds lower {int(lower[j])}, upper {int(upper[j])} ({int(keys[j])} keys) do not "
                           f"fit a {'leaf' if leaf else 'branch'} page of {psize} bytes", pages[j])
        counts["leaf" if leaf else "branch"] += len(pages)
        owner = np.repeat(np.arange(len(pages)), keys)            # each node's page (position in `pages`)
        k = np.arange(len(owner)) - np.repeat(np.cumsum(keys) - keys, keys)
        ptrs = self.gather(base[owner] + PAGE_HEADER + 2 * k, np.dtype("<u2")).astype(np.int64)
        wrong = (ptrs < upper[owner]) | (ptrs + NODE_HEADER > psize) | (ptrs & 1).astype(bool)
        if wrong.any():
            j = int(owner[np.flatnonzero(wrong)[0]])
            raise self.bad("a node offset lies outside the page's node area", pages[j])
        node_at = base[owner] + ptrs
        nodes = self.gather(node_at, _NODE)
        ksize = nodes["ksize"].astype(np.int64)
        end = ptrs + NODE_HEADER + ksize
        low = nodes["lo"].astype(np.int64) | nodes["hi"].astype(np.int64) << 16
        if not leaf:
            wrong = (ksize > MAX_KEY) | (end > psize)
            if wrong.any():
                j = int(owner[np.flatnonzero(wrong)[0]])
                raise self.bad("a branch node's key runs past its page", pages[j])
            return (low | nodes["flags"].astype(np.int64) << 32).astype(np.uint64)
        counts["entries"] += len(owner)
        flags = nodes["flags"].astype(np.int64)
        big = (flags & F_BIGDATA).astype(bool)
        inline = np.where(big, 8, low)
        wrong = (ksize > MAX_KEY) | (end + inline > psize) | (flags & ~F_BIGDATA).astype(bool)
        if wrong.any():
            j = int(owner[np.flatnonzero(wrong)[0]])
            raise self.bad("a leaf node runs past its page or has duplicate/sub-database flags", pages[j])
        if big.any():
            over = self.gather(node_at[big] + NODE_HEADER + ksize[big], np.dtype("<u8"))
            spans = (PAGE_HEADER + low[big] + psize - 1) // psize
            wrong = (over < 2) | (over > last) | (over.astype(np.float64) + spans > last + 1) | \
                (over.astype(np.float64) * psize + PAGE_HEADER + low[big] > self.size)
            if wrong.any():
                j = int(owner[big][np.flatnonzero(wrong)[0]])
                raise self.bad(f"a value on overflow pages from page {int(over[np.flatnonzero(wrong)[0]])} "
                               f"({int(low[big][np.flatnonzero(wrong)[0]])} bytes) lies outside the file", pages[j])
        return np.zeros(0, np.uint64)
