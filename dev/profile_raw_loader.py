"""Developer script (device machine): where the raw-shard Loader's time goes.

Runs ``ingest.Loader`` over bench_raw.py's raw dataset (made if missing) with RandomResizedCrop 224 + Flip +
Normalize fp16, shuffled, ``num_workers=0``, for ``--seconds``: img/s, then ``stats()`` (each stage's busy
seconds and mean queue occupancy). The stage that is busy nearly all the wall time is the limit; stages all
well below it point at the GIL or at hand-offs between them. ``--sample`` adds py-spy-free sampling of
the stage threads' Python stacks (sys._current_frames every millisecond) with the top frames per thread.

Usage: python dev/profile_raw_loader.py [--batch 512] [--seconds 5] [--prefetch 2] [--sample] [--switch S]
       [--json F]     (INGEST_IO_THREADS sets the read threads)
"""

import argparse
import collections
import json
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_raw  # noqa: E402

import ingest  # noqa: E402


def sample_stacks(stop: threading.Event, counts: dict, names: dict) -> None:
    me = threading.get_ident()
    while not stop.is_set():
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            where = []
            while frame is not None and len(where) < 3:
                where.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}:{frame.f_lineno}")
                frame = frame.f_back
            counts[names.get(ident, str(ident))][" < ".join(where)] += 1
        time.sleep(0.001)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--prefetch", type=int, default=None)
    p.add_argument("--sample", action="store_true")
    p.add_argument("--switch", type=float, default=None, help="sys.setswitchinterval for the run (seconds)")
    p.add_argument("--json")
    args = p.parse_args()
    bargs = bench_raw.parse_args(["--out", "/dev/null"])
    bargs.data = bargs.data or f"/dev/shm/ingest_raw_{bargs.n}_{bargs.size}"
    bench_raw.make_dataset(bargs)
    if args.switch is not None:
        sys.setswitchinterval(args.switch)
    kw = {} if args.prefetch is None else {"prefetch": args.prefetch}
    loader = ingest.Loader(bargs.data, batch_size=args.batch, device="cuda", ops=bench_raw.make_ops(),
                           shuffle=True, num_workers=0, **kw)
    it = endless(loader)
    for _ in range(5):
        next(it)
    torch.cuda.synchronize()
    counts: dict = collections.defaultdict(collections.Counter)
    stop = threading.Event()
    sampler = None
    if args.sample:
        names = {t.ident: t.name for t in threading.enumerate()}
        sampler = threading.Thread(target=sample_stacks, args=(stop, counts, names), daemon=True)
        sampler.start()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < args.seconds:
        n += len(next(it)[0])
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    stop.set()
    finish({"img_per_s": round(n / wall, 1), "wall_s": round(wall, 2), "stats": loader.stats()}, loader,
           counts if args.sample else None, args.json)


def endless(loader):
    """The loader's batches across epochs (``iter()`` again at each epoch's end)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise RuntimeError("an epoch yielded no batch (dataset smaller than one batch?)")


def finish(out: dict, loader, stacks: dict | None, path: str | None) -> None:
    """Add the sampled stacks (if any) to ``out``, close the loader, print ``out`` and write it to ``path``."""
    if stacks is not None:
        out["stacks"] = {t: c.most_common(8) for t, c in stacks.items()}
    loader.close()
    print(json.dumps(out, indent=1, default=str))
    if path:
        Path(path).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
