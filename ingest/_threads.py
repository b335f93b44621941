"""Thread pools that survive ``fork``.

A ``ThreadPoolExecutor``'s threads do not: a forked child (a torch DataLoader worker is one, by default on
Linux) that submits to its copy of the parent's pool waits forever for threads that are not there. So a
:class:`Threads` makes its pool on first use in each process.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor


class Threads:
    """A pool of ``workers`` threads named ``prefix``-N, made on first use in each process. :meth:`shutdown`
    ends it; using it after that raises RuntimeError."""

    def __init__(self, workers: int, prefix: str):
        self.workers, self.prefix = workers, prefix
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1
        self._closed = False

    @property
    def pool(self) -> ThreadPoolExecutor:
        """This process's pool."""
        if self._closed:
            raise RuntimeError(f"the {self.prefix} thread pool was shut down")
        if self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix=self.prefix)
            self._pid = os.getpid()
        return self._pool

    def map(self, fn, *iterables):
        return self.pool.map(fn, *iterables)

    def submit(self, fn, *args):
        return self.pool.submit(fn, *args)

    def shutdown(self) -> None:
        """Wait for this process's threads (a parent's pool is left to the parent)."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool, self._closed = None, True
