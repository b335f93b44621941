"""What a source hands the native engine once, at start: every sample's byte range, its label where the source
knows it without reading, and each record's CRC32C where the source checks them (`ingest.native`). A source that
can give one has ``native_table()``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

#: How the engine finds the encoded image in a sample's bytes: "whole" (the range is the image) or "recordio"
#: (an MXNet record: the IRHeader, its float labels, then the image; the label from the header).
KINDS = ("whole", "recordio")


@dataclass(frozen=True)
class NativeTable:
    """Sample i is bytes ``offsets[i]`` to ``offsets[i] + sizes[i]`` of ``paths[files[i]]`` (size -1: to the end
    of the file), parsed as ``kind``; ``labels[i]`` its label (None: read from each record); ``crcs[i]`` the
    CRC32C of exactly those bytes (`ingest.formats.checks`), which the engine checks as it reads them (None: no
    check)."""

    paths: Sequence[str]
    files: np.ndarray     # int64
    offsets: np.ndarray   # int64
    sizes: np.ndarray     # int64, -1 for the whole file
    labels: np.ndarray | None   # int64
    kind: str
    crcs: np.ndarray | None = None   # uint32

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Unknown table kind {self.kind!r}. Available: {', '.join(KINDS)}")
        n = len(self.files)
        if len(self.offsets) != n or len(self.sizes) != n or any(
                column is not None and len(column) != n for column in (self.labels, self.crcs)):
            raise ValueError(f"a native table's columns differ in length ({n} files)")
