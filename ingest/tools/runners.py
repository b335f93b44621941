"""Where the converter's shard jobs run: in the driver (`InlineRunner`), in spawned worker processes
(`PoolRunner`) or as tasks on a Ray cluster (`RayRunner`). All three take the same jobs and hand results
back to the driver in shard order (`run_in_order`), keeping a bounded window of jobs in flight, so the
output does not depend on which one ran.

The shared `Job` (the source view and the options) travels once per worker process (pool initializer) or
once per cluster (``ray.put``); a job itself is only ``(stem, start, stop)``. With Ray, every node must see
the source and the output directory at the same paths (a shared file system) and have ingest installed.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable, Sequence

from ..errors import ConfigError
from . import jobs

#: How long the driver waits for the next shard before redrawing the progress line (seconds).
_POLL = 0.25

Commit = Callable[[int, dict], None]
Progress = Callable[[int], None]


def make_runner(job: "jobs.Job", *, workers: int, ray: bool | str) -> "Runner":
    if ray is not False and ray is not None:
        return RayRunner(job, None if ray is True else ray)
    return PoolRunner(job, workers) if workers > 1 else InlineRunner(job)


class Runner:
    """Runs shard jobs; subclasses say how (`_submit`, `_done`, `_result`, `map`)."""

    window = 1

    def run_in_order(self, todo: Sequence[tuple[int, str, int, int]], commit: Commit, progress: Progress) -> None:
        """Run every ``(k, stem, start, stop)`` job and call ``commit(k, shard)`` in the order of ``todo``;
        ``progress(samples)`` is called while waiting with the samples handled by uncommitted jobs."""
        pending: collections.deque = collections.deque()
        jobs = iter(todo)
        self._committed_samples = 0
        while True:
            while len(pending) < self.window and (nxt := next(jobs, None)) is not None:
                k, stem, start, stop = nxt
                pending.append((k, stop - start, self._submit(stem, start, stop)))
            if not pending:
                return
            k, size, handle = pending[0]
            if self._done(handle, _POLL):
                pending.popleft()
                commit(k, self._result(handle))
                self._committed_samples += size
            else:
                progress(self.seen() - self._committed_samples)

    def seen(self) -> int:
        """Samples handled by this runner's jobs so far (committed or not)."""
        return self._committed_samples

    def map(self, fn: Callable, args: Sequence[tuple]) -> list:
        """``[fn(*a) for a in args]``, run where the jobs run."""
        return [fn(*a) for a in args]

    def close(self) -> None:
        """Release the workers; jobs still running are stopped."""


class InlineRunner(Runner):
    """Runs each job in the driver when its turn comes (``workers=1``)."""

    def __init__(self, job: "jobs.Job"):
        self.job = job
        self._seen = 0

    def run_in_order(self, todo, commit, progress):
        def tick():
            self._seen += 1
            progress(self._seen - self._committed_samples)
        jobs.set_tick(tick)
        try:
            super().run_in_order(todo, commit, progress)
        finally:
            jobs.set_tick(lambda: None)

    def seen(self) -> int:
        return self._seen

    def _submit(self, stem, start, stop):
        return (stem, start, stop)

    def _done(self, handle, timeout):
        return True

    def _result(self, handle):
        return jobs.write_shard(self.job, *handle)


_worker_job = None
_worker_counter = None


def _init_worker(job, counter, driver) -> None:
    global _worker_job, _worker_counter
    _exit_with_driver(driver)
    import torch
    torch.set_num_threads(1)   # one job per process; the processes are the parallelism
    _worker_job, _worker_counter = job, counter
    jobs.set_tick(_count)


def _exit_with_driver(driver) -> None:
    """Exit this worker process when ``driver`` (the read end of a pipe whose only write end the driver holds)
    reaches its end: the driver closed it or died, even by SIGKILL. Without this a worker waits on the job
    queue forever (it holds that queue's write end itself), and with it the fork server and the resource
    tracker, which exit after the last worker and then remove the semaphores."""
    def watch() -> None:
        try:
            driver.recv_bytes()
        except (EOFError, OSError):
            pass
        os._exit(1)
    threading.Thread(target=watch, name="ingest-convert-driver-watch", daemon=True).start()


def _count() -> None:
    with _worker_counter.get_lock():
        _worker_counter.value += 1


def _write_in_worker(stem: str, start: int, stop: int) -> dict:
    return jobs.write_shard(_worker_job, stem, start, stop)


class PoolRunner(Runner):
    """Runs jobs in ``workers`` processes, two jobs per process in flight. The processes fork from a server
    process that has imported ingest (and torch) once, instead of each importing it again (spawn); the server
    has run no threads, so forking it is safe. Workers exit when the driver does, however it ends."""

    def __init__(self, job: "jobs.Job", workers: int):
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([jobs.__name__])
        self._counter = ctx.Value("q", 0)
        # Workers exit when this pipe's write end closes, which only this process holds (`_exit_with_driver`).
        self._alive_r, self._alive_w = ctx.Pipe(duplex=False)
        self._pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                         initargs=(job, self._counter, self._alive_r))
        self.window = 2 * workers

    def _submit(self, stem, start, stop):
        return self._pool.submit(_write_in_worker, stem, start, stop)

    def _done(self, handle, timeout):
        return bool(wait([handle], timeout, return_when=FIRST_COMPLETED).done)

    def _result(self, handle):
        return handle.result()

    def seen(self) -> int:
        return self._counter.value

    def map(self, fn, args):
        return [f.result() for f in [self._pool.submit(fn, *a) for a in args]]

    def close(self) -> None:
        # Python < 3.14 has no public way to stop running jobs; after an error or an interrupt the workers
        # would otherwise finish their shards into a temporary directory the next run is about to clear.
        for process in list(getattr(self._pool, "_processes", {}).values()):
            if process.is_alive():
                process.terminate()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._alive_w.close()
        self._alive_r.close()


class RayRunner(Runner):
    """Runs one Ray task per shard on the cluster at ``address`` (None: ``ray.init()``'s own choice: the
    cluster at ``RAY_ADDRESS``, else a new local one), up to two per cluster CPU in flight. A Ray already
    initialized in this process (e.g. by the caller) is used as it is."""

    def __init__(self, job: "jobs.Job", address: str | None):
        try:
            import ray
        except ImportError as err:
            raise ConfigError("--ray needs Ray: pip install 'ingest[ray]' (or pip install 'ray>=2.9')") from err
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, logging_level="WARNING", log_to_driver=True)
        self._job = ray.put(job)
        self._write = ray.remote(num_cpus=1)(jobs.write_shard)
        self.window = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
        self._pending: list = []

    def _submit(self, stem, start, stop):
        ref = self._write.remote(self._job, stem, start, stop)
        self._pending.append(ref)
        return ref

    def _done(self, handle, timeout):
        ready, _ = self.ray.wait([handle], timeout=timeout)
        return bool(ready)

    def _result(self, handle):
        self._pending.remove(handle)
        return self._get(handle)

    def _get(self, refs):
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as err:   # re-raise what the task raised, as its own type
            raise err.as_instanceof_cause() from None

    def map(self, fn, args):
        task = self.ray.remote(num_cpus=1)(fn)
        return self._get([task.remote(*a) for a in args])

    def close(self) -> None:
        for ref in self._pending:
            self.ray.cancel(ref, force=True)
        self._pending.clear()


__all__ = ["make_runner", "Runner", "InlineRunner", "PoolRunner", "RayRunner"]
