"""In-memory sources: encoded images already in memory, as a request to a server or a test hands them over
(DALI's ``external_source``). `MemorySource` is a sized list; `Loader` also accepts any iterable of encoded
images or ``(image, label)`` pairs and then streams it in arrival order (no shuffle, no length)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import SourceError
from .base import Location, Record, check_index


class MemorySource:
    """A list of encoded images (bytes, bytearray, memoryview or uint8 numpy arrays) with optional labels."""

    def __init__(self, items: Sequence[Any], labels: Sequence[int] | None = None, classes: Sequence[str] = ()):
        self._items = list(items)
        for i, item in enumerate(self._items):
            if not isinstance(item, (bytes, bytearray, memoryview, np.ndarray)):
                raise SourceError(f"item {i} is a {type(item).__name__}; expected encoded image bytes "
                                  "(bytes, bytearray, memoryview or a uint8 numpy array)")
        n = len(self._items)
        self._labels = (np.full(n, -1, dtype=np.int64) if labels is None
                        else np.asarray(labels, dtype=np.int64))
        if self._labels.shape != (n,):
            raise SourceError(f"got {n} items but {len(self._labels)} labels")
        self.classes = list(classes)

    def __len__(self) -> int:
        return len(self._items)

    def locate(self, i: int) -> Location:
        i = check_index(i, len(self._items))
        return Location(self.name(i), data=self._items[i])

    def parse(self, i: int, raw) -> Record:
        return Record(raw, int(self._labels[i]))

    def labels(self) -> np.ndarray:
        return self._labels

    def name(self, i: int) -> str:
        return f"<memory item {i}>"
