"""glibc malloc settings for the processes where ingest reads records (`keep_freed_memory`): the training
process when a Loader runs its pipeline there, and every worker process."""

from __future__ import annotations

import ctypes

#: glibc malloc settings where ingest reads records (`keep_freed_memory`): freed memory up to this much stays in the
#: heap, and blocks up to this size (glibc's largest allowed: a batch's read arena of 256 x 81 KB is 21 MB)
#: come from it rather than from their own mmap. Setting either turns off glibc's own adjustment of both.
TRIM_THRESHOLD = 64 << 20
MMAP_THRESHOLD = 32 << 20


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse in this process (True where it took the settings).

    By default glibc hands freed heap memory back to the kernel once 128 KB are free at the top of the heap,
    so a loop that copies an 87 KB image out of each record (a TFRecord's protobuf, an LMDB value), decodes
    into a new array or reads a batch into a new arena faults those pages in again every time; in a VM each
    fault is slow, and runs with the GIL held (docs/measurements.md, Reads). Worker processes always take
    them; the training process does when a Loader runs its pipeline there, unless the ``keep_freed_memory``
    setting is "off" (`ingest.defaults`)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):   # not glibc (musl, macOS, Windows): nothing to tune
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3   # malloc.h
    return bool(mallopt(m_trim_threshold, TRIM_THRESHOLD)) & bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD))
