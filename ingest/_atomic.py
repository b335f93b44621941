"""Writing a file so that readers see the old one or the whole new one, never half of it."""

from __future__ import annotations

import contextlib
import os
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open ``<path>.tmp`` for writing (``mode`` 'w' or 'wb'); when the block ends without an exception the
    file is flushed, fsynced and renamed over ``path``, else it is removed and ``path`` is left as it was."""
    path = os.fspath(path)
    tmp = path + ".tmp"
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
