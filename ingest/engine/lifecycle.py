"""How the executor's threads and worker processes end when the interpreter does: every `Executor` and
`WorkerPool` joins `CLOSE_AT_EXIT` while it runs (it leaves on ``close()``), and an exit hook closes those
left, before finalization: a stage thread left inside a torch call while the interpreter finalizes aborts the
process ("terminate called without an active exception")."""

from __future__ import annotations

import atexit
import weakref
from typing import Any


#: Executors and worker pools still open.
CLOSE_AT_EXIT: "weakref.WeakSet[Any]" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for obj in list(CLOSE_AT_EXIT):
        obj.close()
