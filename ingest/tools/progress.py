"""A one-line progress display on stderr for long-running tools, and the summary `ingest convert` prints."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class Progress:
    """``done/total samples, shards, bytes, img/s, ETA`` redrawn in place on a terminal (at most every
    ``interval`` s, or when forced), or one line every ``interval * 40`` s when stderr is a file or pipe.

    Notes
    -----
    The counts shown never go down. The caller's counts come from two places that move at different
    times (samples of committed shards, and samples that jobs still running have handled, reported late or
    not at all when a shard commits), so a count given below one already shown is shown as that one."""

    def __init__(self, total: int, shards: int, *, stream: TextIO | None = None, enabled: bool = True,
                 interval: float = 0.25):
        self.total, self.shards = total, shards
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and getattr(self.stream, "isatty", lambda: False)()
        self.interval = interval if self.tty else interval * 40
        self.start = time.perf_counter()
        self._last = 0.0
        self._drawn = False
        self._shown = (0, 0, 0)   # samples, shards, bytes: the most shown so far

    def update(self, samples: int, shards: int, nbytes: int, *, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or ((not force or not self.tty) and now - self._last < self.interval):
            return
        self._last = now
        samples, shards, nbytes = self._shown = tuple(max(a, b) for a, b in zip(self._shown, (samples, shards, nbytes)))
        elapsed = max(now - self.start, 1e-9)
        rate = samples / elapsed
        eta = (self.total - samples) / rate if rate > 0 else 0.0
        line = (f"convert: {samples}/{self.total} samples, {shards}/{self.shards} shards, "
                f"{human_bytes(nbytes)}, {rate:,.0f} img/s, ETA {_clock(eta)}")
        if self.tty:
            self.stream.write("\r" + line.ljust(79))
        else:
            self.stream.write(line + "\n")
        self._drawn = True
        self.stream.flush()

    def close(self) -> None:
        if self._drawn and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@dataclass
class Summary:
    """What a conversion gave: samples, shards and bytes of the output, of which ``resumed`` shards were kept
    from an earlier run and ``written`` samples were converted by this one (in ``seconds``), and every sample
    that failed (name, stage, reason)."""

    samples: int = 0
    written: int = 0
    shards: int = 0
    bytes: int = 0
    seconds: float = 0.0
    resumed: int = 0
    failures: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.written / self.seconds if self.seconds > 0 else 0.0

    def lines(self) -> list[str]:
        out = [f"{self.samples} samples in {self.shards} shards, {human_bytes(self.bytes)}, "
               f"{self.seconds:.1f} s, {self.rate:,.0f} img/s"
               + (f" ({self.resumed} shards kept from the earlier run)" if self.resumed else "")]
        out.append(f"{len(self.failures)} samples failed" if self.failures else "no failures")
        out += [f"  skipped {name} ({stage}: {reason})" for name, stage, reason in self.failures]
        return out
