"""The host cost of a detection batch's box work, per batch, before and after a change (issue 32).

Measured: what the pipeline does per batch for a source with boxes, without the pixels: the boxes converted
from the reader's format (COCO's xywh) to absolute ltrb, ``plan`` with the boxes (every op's draws, the
IoU crop's against the boxes as mapped so far), and the targets (boxes mapped through every op, empty and
rejected ones dropped, ``categories``/``iscrowd``/``area`` pruned with them, boxes back to xywh). On a
COCO-like batch: image sizes 300-640 px a side, Poisson(7) boxes per image (so some have none), ops
ZoomOut, RandomIoUCrop, HorizontalFlip, Resize(800, max_size=1333).

Two code versions in one run: ``before`` is the ``ingest`` package of git revision ``--baseline`` (extracted
with ``git archive`` into a temporary directory, its C extensions built there), ``after`` this tree (built in
place). Each runs in its own subprocess, in alternating order round by
round, and each ``ms`` figure is the median over the batches of a round (``--batches`` distinct batches,
each timed ``--repeat`` times, the minimum kept), then the median over rounds. ``beside_busy_thread``: the same
while a pure-Python thread spins in the process (the training loop's place; the GIL switch interval at
Python's default), so GIL hand-offs show. Both versions' outputs are hashed batch by batch and compared
(``same_outputs``).

    python benchmarks/bench_detection_targets.py --baseline 52e4655 \\
        --out benchmarks/results/bench_detection_targets/cpu-2core/<name>.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PER_BOX = ["categories", "iscrowd", "area"]


def make_batch(n: int, seed: int) -> tuple[list[tuple[int, int]], list[dict]]:
    """COCO-like records of ``n`` images: sizes and the fields `CocoSource.parse` gives (xywh boxes)."""
    g = np.random.default_rng(seed)
    sizes = [(int(h), int(w)) for h, w in g.integers(300, 641, (n, 2))]
    records = []
    for h, w in sizes:
        k = int(g.poisson(7))
        wh = g.uniform(0.02, 0.7, (k, 2)) * (w, h)
        xy = g.uniform(0, 1, (k, 2)) * ((w, h) - wh)
        records.append({"image_id": int(g.integers(1, 1 << 30)),
                        "boxes": np.concatenate([xy, wh], 1).astype(np.float32),
                        "categories": g.integers(1, 91, k).astype(np.int64), "iscrowd": (g.random(k) < 0.01).astype(np.int64),
                        "area": (wh[:, 0] * wh[:, 1] * 0.7).astype(np.float32)})
    return sizes, records


def ops():
    from ingest.ops import HorizontalFlip, RandomIoUCrop, Resize, ZoomOut
    return [ZoomOut(), RandomIoUCrop(), HorizontalFlip(), Resize(800, max_size=1333)]


def work_before(ops_, sizes, records, rngs):
    """The per-sample path (`Pipeline._plan` and `Pipeline._targets` of the baseline), for xywh absolute boxes."""
    from ingest.ops import planner

    def to_ltrb(boxes):
        b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
        b[:, 2:] += b[:, :2]
        return b

    def from_ltrb(boxes):
        b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
        b[:, 2:] -= b[:, :2]
        return b.astype(np.float32)

    boxes = [to_ltrb(r["boxes"]) for r in records]
    p = planner.plan(ops_, sizes, rngs, boxes=boxes)
    mapped = p.targets([dict(v, boxes=b) for v, b in zip(records, boxes)], per_box=PER_BOX)
    for v in mapped:
        v["boxes"] = from_ltrb(v["boxes"])
    return p, mapped


def work_after(ops_, sizes, records, rngs):
    """The batch path (`Pipeline._to_ltrb`, `plan`, `Plan.batch_targets`), for xywh absolute boxes."""
    from ingest.ops import planner
    from ingest.ops.base import size_array
    from ingest.ops.boxes import BoxBatch, to_ltrb
    boxes = to_ltrb(BoxBatch.of([r["boxes"] for r in records]), size_array(sizes), "xywh", False)
    p = planner.plan(ops_, sizes, rngs, boxes=boxes)
    return p, p.batch_targets(records, boxes, per_box=PER_BOX, box_format="xywh")


def digest(p, mapped) -> str:
    h = hashlib.sha256()
    for _, params in p.drawn:
        if params is not None:
            h.update(np.ascontiguousarray(params).tobytes())
    for v in mapped:
        for name in ["boxes", *PER_BOX]:
            h.update(np.ascontiguousarray(v[name]).tobytes())
    return h.hexdigest()


def child(args) -> None:
    from ingest.random import SampleRandom
    work = work_before if args.child == "before" else work_after
    ops_ = ops()
    batches = [make_batch(args.batch, seed) for seed in range(args.batches)]
    keys = [SampleRandom.keyed(0, seed, np.arange(args.batch)).keys for seed in range(args.batches)]

    def run_all() -> list[float]:
        times = []
        for (sizes, records), k in zip(batches, keys):
            best = float("inf")
            for _ in range(args.repeat):
                t = time.perf_counter()
                work(ops_, sizes, records, SampleRandom(k))
                best = min(best, time.perf_counter() - t)
            times.append(best * 1e3)
        return times

    run_all()   # warm-up
    alone = run_all()
    stop = threading.Event()

    def spin():
        n = 0
        while not stop.is_set():
            n += 1

    busy = threading.Thread(target=spin, daemon=True)
    busy.start()
    beside = run_all()
    stop.set()
    busy.join()
    digests = [digest(*work(ops_, sizes, records, SampleRandom(k))) for (sizes, records), k in zip(batches, keys)]
    import ingest.ops.detection as detection
    print(json.dumps({"ms": statistics.median(alone), "beside_busy_thread_ms": statistics.median(beside),
                      "digests": digests, "native_iou_crop": getattr(detection, "NATIVE", None) is not None}))


def baseline_tree(rev: str, into: Path) -> Path:
    """The ``ingest`` package of ``rev`` under ``into``, its C extensions built in place (as this tree's are)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "ingest", "setup.py"], check=True,
                             capture_output=True).stdout
    path = into / "archive.tar"
    path.write_bytes(archive)
    with tarfile.open(path) as tar:
        tar.extractall(into, filter="data")
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=into, check=True,
                   capture_output=True)
    return into


def run_child(version: str, path: Path, args, batch: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(path))
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", version, "--batch", str(batch),
                           "--batches", str(args.batches), "--repeat", str(args.repeat)],
                          env=env, capture_output=True, text=True, timeout=1800, cwd=str(path))
    if done.returncode:
        raise RuntimeError(f"{version} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", help="git revision whose ingest package is 'before'")
    ap.add_argument("--batch-sizes", default="64,256")
    ap.add_argument("--batches", type=int, default=10, help="distinct batches per round")
    ap.add_argument("--repeat", type=int, default=3, help="timings per batch (the minimum is kept)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", choices=["before", "after"], help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=64, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if not args.baseline or not args.out:
        ap.error("--baseline and --out are needed")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        before = baseline_tree(args.baseline, Path(tmp))
        for batch in map(int, args.batch_sizes.split(",")):
            rounds = []
            for r in range(args.rounds):
                order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
                got = {v: run_child(v, before if v == "before" else ROOT, args, batch) for v in order}
                rounds.append(got)
                print(f"batch {batch} round {r}: before {got['before']['ms']:.2f} ms, after {got['after']['ms']:.2f} ms"
                      f" (beside a busy thread {got['before']['beside_busy_thread_ms']:.2f} / "
                      f"{got['after']['beside_busy_thread_ms']:.2f})", flush=True)
            entry = {}
            for key in ("ms", "beside_busy_thread_ms"):
                b = statistics.median(g["before"][key] for g in rounds)
                a = statistics.median(g["after"][key] for g in rounds)
                entry[key] = {"before": round(b, 3), "after": round(a, 3), "before_over_after": round(b / a, 2),
                              "rounds": [{v: round(g[v][key], 3) for v in ("before", "after")} for g in rounds]}
            entry["same_outputs"] = all(g["before"]["digests"] == g["after"]["digests"] for g in rounds)
            entry["native_iou_crop_after"] = rounds[0]["after"]["native_iou_crop"]
            results[str(batch)] = entry
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "ingest"], capture_output=True,
                                text=True).stdout.strip())
    out = {"benchmark": "bench_detection_targets", "device": "cpu", "cores": os.cpu_count(),
           "host": platform.node(), "python": platform.python_version(), "numpy": np.__version__,
           "baseline": args.baseline, "after": rev + ("+dirty" if dirty else ""),
           "config": {"ops": "ZoomOut, RandomIoUCrop, HorizontalFlip, Resize(800, max_size=1333)",
                      "boxes_per_image": "Poisson(7)", "box_format": "xywh", "per_box": PER_BOX,
                      "batches": args.batches, "repeat": args.repeat, "rounds": args.rounds},
           "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
