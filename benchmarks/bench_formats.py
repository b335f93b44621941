"""Record formats against the file tree, in one run: the same JPEGs packed by `ingest convert` into each
format, then the training pipeline of `bench_gpu.py` (variant a: mixed decode, RandomResizedCrop 224 + flip
+ normalize) over each. Reports converter throughput per format (images/s) and each format's loader rate
as a ratio to the file tree's.

    python benchmarks/bench_formats.py --data /dev/shm/ingest_bench_20k --work /dev/shm/packed \\
        --out out/bench_formats.json [--formats tfrecord,recordio,lmdb,wds] [--seconds 10]

Each loader runs in its own `bench_gpu.py --only a` subprocess (a fresh CUDA context); the file tree is
measured first and last in every round (``--rounds``, alternating the order), and each ratio is a format's
mean over the file tree's, so drift of the shared machine shows and falls on every input alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FORMATS = ("tfrecord", "recordio", "lmdb", "wds")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="ImageFolder JPEG directory (benchmarks/make_data.py)")
    p.add_argument("--work", required=True, help="where the packed copies go (e.g. /dev/shm/packed)")
    p.add_argument("--out", required=True, help="JSON file to write (logs go next to it)")
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="converter workers")
    p.add_argument("--seconds", type=float, default=10.0, help="timed loader window per format")
    p.add_argument("--rounds", type=int, default=1,
                   help="loader rounds: each the file tree, every format, the file tree again, every other round "
                        "in reverse order; ratios use the means (drift of a shared machine falls on all alike)")
    p.add_argument("--bench-args", default="", help="extra arguments for bench_gpu.py (e.g. '--dry-run')")
    return p.parse_args(argv)


def convert(src: str, dst: Path, fmt: str, workers: int, log: Path, extra: tuple[str, ...] = ()) -> dict:
    """Pack ``src`` into ``dst`` with the CLI (``extra``: more of its options, e.g. ``--raw-size``), timed;
    images/s from the manifest's count."""
    if dst.exists():
        shutil.rmtree(dst)
    cmd = [sys.executable, "-m", "ingest.tools.cli", "convert", src, str(dst), "--to", fmt,
           "--workers", str(workers), *extra]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - t0
    if rc != 0:
        return {"error": f"convert exited {rc}; see {log.name}"}
    count = json.loads((dst / "manifest.json").read_text()).get("count")
    size = sum(p.stat().st_size for p in dst.rglob("*") if p.is_file())
    return {"seconds": round(seconds, 2), "images": count, "images_per_s": round(count / seconds, 1),
            "bytes": size}


def loader_rate(data: str, out: Path, args, log: Path) -> dict:
    cmd = [sys.executable, str(HERE / "bench_gpu.py"), "--data", data, "--out", str(out), "--only", "a",
           "--train-seconds", "0", "--seconds", str(args.seconds), *args.bench_args.split()]
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not out.exists():
        return {"error": f"bench_gpu exited {rc}; see {log.name}"}
    report = json.loads(out.read_text())
    res = next(iter(report["results"].values()))   # the one variant run (a, or the one --bench-args names)
    keep = ("variant", "img_s", "batches", "seconds", "first_batch_seconds", "error", "note")
    stats = res.get("loader_stats") if isinstance(res.get("loader_stats"), dict) else {}
    return {k: res[k] for k in keep if k in res} | {"read_path": stats.get("read_path"), "stages": stats.get("stages")}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    logs = out.with_suffix("")
    logs.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE))
    from bench_gpu import host_info, versions
    report: dict = {"data": args.data, "workers": args.workers, "seconds": args.seconds, "versions": versions(),
                    "host": host_info(), "convert": {}, "loader": {}}

    def flush():
        out.write_text(json.dumps(report, indent=2))

    formats = args.formats.split(",")
    sources = {"filetree": args.data}
    for fmt in formats:
        dst = work / fmt
        report["convert"][fmt] = convert(args.data, dst, fmt, args.workers, logs / f"convert_{fmt}.log")
        flush()
        if "error" not in report["convert"][fmt]:
            sources[fmt] = str(dst)
    # Round r: the file tree, every format, the file tree again; every other round in reverse order.
    rates: dict[str, list] = {name: [] for name in sources}
    for r in range(args.rounds):
        order = ["filetree", *formats, "filetree"]
        for k, name in enumerate(order if r % 2 == 0 else order[::-1]):
            if name not in sources:
                continue
            tag = f"{name}{'2' if k == len(order) - 1 else ''}.r{r}"
            res = loader_rate(sources[name], logs / f"{tag}.json", args, logs / f"{tag}.log")
            report["loader"].setdefault(name, []).append(res)
            rates[name].append(res.get("img_s"))
            flush()
    mean = {name: sum(x for x in v if x) / len([x for x in v if x]) for name, v in rates.items() if any(v)}
    report["img_s_mean"] = {name: round(v, 1) for name, v in mean.items()}
    if "filetree" in mean:
        report["ratio_to_filetree"] = {fmt: round(mean[fmt] / mean["filetree"], 3) for fmt in formats if fmt in mean}
    flush()
    print(json.dumps({"convert": report["convert"], "ratio_to_filetree": report.get("ratio_to_filetree")},
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
