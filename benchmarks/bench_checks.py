"""What the per-record CRC32C check (``check="crc"``, `ingest.formats.checks`) costs each format's CPU loader.

For each format with per-record CRCs (RecordIO, LMDB, WebDataset, raw), the same JPEGs are packed by
``ingest convert`` (raw: decoded to 224x224), then:

- ``check_us``: the check's own work per record, timed alone: the CRC32C of every record's bytes as the
  reader checks them (best of 9 passes over the dataset, from memory: a pass takes milliseconds, so on a
  shared host one preemption can multiply it);
- ``loader_img_s``: ``ingest.Loader(device="cpu", decode="cpu")`` with RandomResizedCrop(224), flip and
  normalize, batch ``--batch``, with ``check="none"`` and ``check="crc"`` in alternating rounds, each in a
  fresh process; each mode's best round is its figure (noise on a shared machine only slows a run down);
- ``cost``: ``check_us * loader rate (none)``, the share of the loader's time per image the check adds where
  it runs on the loader's critical path (it runs in the read stage, on the thread that parses the batch);
  ``measured_ratio`` is crc / none from the rounds, which on a 2-core shared host moves by more than the
  effect.

A format's check is on by default (``check="auto"``) when ``cost`` is under 3% (`checks.DEFAULT_ON`).

    python benchmarks/bench_checks.py --out benchmarks/results/bench_checks/cpu-2core/bench_checks.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

FORMATS = ("recordio", "lmdb", "wds", "raw")
LIMIT = 0.03


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--data", default=None, help="ImageFolder JPEG directory (default: made in a temp dir)")
    p.add_argument("--n", type=int, default=400, help="images to make when --data is not given")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=8.0, help="timed window per loader run")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--child", nargs=2, metavar=("PATH", "CHECK"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def child(path: str, check: str, args) -> dict:
    """One loader run: img/s over the timed window after a warm-up batch (epochs restart inside it)."""
    import torch
    import ingest
    from ingest.ops import Flip, Normalize, RandomResizedCrop
    ops = [RandomResizedCrop(224), Flip(p=0.5),
           Normalize(mean=[123.7, 116.3, 103.5], std=[58.4, 57.1, 57.4], dtype=torch.float32, layout="NCHW")]
    loader = ingest.Loader(path, batch_size=args.batch, device="cpu", decode="cpu", ops=ops, shuffle=True,
                           num_threads=args.threads, reader_options={"check": check})
    images, start, first = 0, None, True
    while start is None or time.perf_counter() - start < args.seconds:
        for x, _ in loader:
            if first:
                first, start = False, time.perf_counter()
                continue
            images += len(x)
            if time.perf_counter() - start >= args.seconds:
                break
    seconds = time.perf_counter() - start
    return {"img_s": round(images / seconds, 1), "images": images, "seconds": round(seconds, 2)}


def check_us(path: str, fmt: str) -> dict:
    """The CRC32C of every record's bytes, as the reader checks them: best of 9 passes, per record."""
    from ingest.formats import checks, open_source, read_location
    src = open_source(path, format=fmt, check="crc")
    raws = []
    for i in range(len(src)):
        loc = src.locate(i)
        raw = read_location(loc)
        raws += [r[512:] for r in raw] if fmt == "wds" else [raw]   # tar members: the data after the header
    best = None
    for _ in range(9):
        t0 = time.perf_counter()
        for r in raws:
            checks.crc(r)
        best = min(best or 1e9, time.perf_counter() - t0)
    return {"check_us": round(best / len(src) * 1e6, 2), "records": len(src),
            "mean_record_bytes": round(sum(map(len, raws)) / len(src))}


def run_child(path: str, check: str, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--child", path, check,
           "--batch", str(args.batch), "--threads", str(args.threads), "--seconds", str(args.seconds)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds + 300)
    if p.returncode != 0:
        return {"error": p.stderr[-800:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_checks_") as tmp:
        return run(args, Path(tmp))


def run(args, tmp: Path) -> int:
    """The converted copies under ``tmp`` (removed by the caller), each format's check cost and its rounds."""
    from ingest.tools.cli import main as cli
    import bench_gpu as bg
    data = args.data
    if data is None:
        import make_data
        data = str(tmp / "jpeg")
        make_data.make_dataset(data, n=args.n, classes=10, seed=0, workers=os.cpu_count())
    report = {"benchmark": "bench_checks", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:],
              "device": "cpu", "host": bg.host_info(), "versions": bg.versions(), "dataset": bg.dataset_stats(data),
              "config": {k: v for k, v in vars(args).items() if k != "child"}, "results": {}}
    for fmt in args.formats.split(","):
        out = tmp / fmt
        extra = ["--raw-size", "224x224"] if fmt == "raw" else []
        if cli(["convert", data, str(out), "--to", fmt, "-q", *extra]) != 0:
            report["results"][fmt] = {"error": "convert failed"}
            continue
        res = check_us(str(out), fmt)
        rounds = []
        for r in range(args.rounds):
            modes = ("none", "crc") if r % 2 == 0 else ("crc", "none")
            row = {m: run_child(str(out), m, args) for m in modes}
            rounds.append({m: row[m].get("img_s") for m in ("none", "crc")})
            print(f"[bench_checks] {fmt} round {r + 1}: {rounds[-1]}", flush=True)
        best = {m: max((x[m] or 0) for x in rounds) for m in ("none", "crc")}
        cost = res["check_us"] * best["none"] / 1e6 if best["none"] else None
        res.update({"loader_img_s": best, "rounds": rounds,
                    "measured_ratio": round(best["crc"] / best["none"], 3) if best["none"] else None,
                    "cost": None if cost is None else round(cost, 4),
                    "default_on": cost is not None and cost < LIMIT})
        report["results"][fmt] = res
        print(f"[bench_checks] {fmt}: {res}", flush=True)
    report["limit"] = LIMIT
    report["loadavg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"[bench_checks] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
