"""The read stage of each input format, alone and beside a busy pure-Python thread (any machine, no GPU).

A loader in the training process shares the GIL with the training loop. Whatever its read stage does while
giving the GIL up (a native call that releases it, numpy on large arrays, a C library's checksum) costs up to
one switch interval (5 ms) to get it back beside a thread that keeps the GIL busy. This times
`Pipeline.read` (read, parse, header probe, augmentation draws) per batch over the same JPEGs as a file tree
and packed into each record format by ``ingest convert``, alone and beside such a thread; the ratio says how
many hand-offs a batch makes. A worst case: a training loop hands the GIL back at every torch call.

    python benchmarks/bench_read_gil.py --out benchmarks/results/bench_read_gil/cpu-2core/bench_read_gil.json [--n 1024] [--note TEXT]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import torch  # noqa: E402

import make_data  # noqa: E402
from bench_gpu import host_info, versions  # noqa: E402
from ingest.formats import detect, open_source  # noqa: E402
from ingest.ops import Flip, Normalize, RandomResizedCrop  # noqa: E402
from ingest.engine import Pipeline  # noqa: E402
from ingest.sampler import Sampler  # noqa: E402

FORMATS = ("tfrecord", "lmdb", "recordio", "wds")


def per_batch_ms(pipeline: Pipeline, plans: list, seconds: float) -> tuple[float, float]:
    """Wall and this thread's CPU milliseconds per batch (the CPU leaves out the native read threads' work,
    and counts what the thread does with the GIL released, such as a batch's CRCs)."""
    start, cpu, n = time.perf_counter(), time.thread_time(), 0
    while time.perf_counter() - start < seconds or n < 2:
        for plan in plans:
            pipeline.read(plan)
            n += 1
    return (time.perf_counter() - start) / n * 1000, (time.thread_time() - cpu) / n * 1000


class Busy:
    """A thread that keeps the GIL busy with pure Python until the block ends."""

    def __enter__(self):
        self._stop = False
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()
        return self

    def _spin(self):
        x = 0
        while not self._stop:
            x += 1

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--data", default="/tmp/ingest_bench_read_gil")
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--note", default="", help="what the run measured (kept in the JSON's versions)")
    args = p.parse_args(argv)
    root = Path(args.data)
    jpegs = root / "jpegs"
    if not jpegs.exists():
        make_data.make_dataset(str(jpegs), n=args.n, classes=10, seed=0)
    inputs = {"filetree": jpegs}
    for fmt in FORMATS:
        out = root / fmt
        if not out.exists():
            subprocess.run([sys.executable, "-m", "ingest.tools.cli", "convert", str(jpegs), str(out), "--to", fmt],
                           check=True, capture_output=True)
        inputs[fmt] = out
    ops = [RandomResizedCrop(224), Flip(p=0.5), Normalize(mean=(124, 116, 104), std=(58, 57, 57),
                                                          dtype=torch.float32, layout="NCHW")]
    report = {"benchmark": "bench_read_gil", "host": host_info(),
              "versions": {**versions(), "ingest_git_note": args.note}, "args": vars(args),
              "switch_interval_s": sys.getswitchinterval(), "formats": {}}
    for name, path in inputs.items():
        source = open_source(str(path), detect(str(path)))
        pipeline = Pipeline(source, ops=ops, device="cpu", decode="cpu")
        plans = list(Sampler(len(source), batch_size=args.batch, shuffle=True, seed=0).batches(0, 0, 0))
        per_batch_ms(pipeline, plans[:1], 0)            # warm: page cache, handles, indexes
        alone, cpu = per_batch_ms(pipeline, plans, args.seconds)
        with Busy():
            beside, _ = per_batch_ms(pipeline, plans, args.seconds)
        pipeline.close()
        report["formats"][name] = {"source": type(source).__name__, "alone_ms": round(alone, 2),
                                   "thread_cpu_ms": round(cpu, 2), "beside_busy_ms": round(beside, 2),
                                   "beside_over_alone": round(beside / alone, 1)}
        print(f"{name:9s} read ms per {args.batch}-sample batch: alone {alone:7.2f} (thread CPU {cpu:6.2f}), "
              f"beside a busy thread {beside:8.2f}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
