"""ingest vs torch DataLoader on a CPU-only machine (no GPU): training-style batches in host memory.

  ingest      ingest.Loader(device="cpu", decode="cpu", num_threads=--threads)
  dataloader  torch DataLoader(num_workers=--threads) + torchvision ImageFolder + PIL transforms
  ingest_all_threads  (only with --only) ingest with INGEST_OPS_THREADS = cores: the ops thread on torch's
              default intra-op threads, as before the ops_threads setting (see `ingest.defaults`)

Both run RandomResizedCrop(224) -> horizontal flip p=0.5 -> float32 NCHW normalised with ImageNet mean/std,
shuffled, dropping the last partial batch. Each is timed in the loop a user writes, ``for x, y in loader``
(epochs restarting inside the timed window), with no other work on the main thread: no torch op runs there
before or during the window (the batch check runs after it), since one changes how torch's threads behave.
Each measurement runs in its own subprocess (no threads or worker processes left over from the other), in
alternating rounds (ingest, dataloader, ingest, ...); each variant's best round is its figure (on a shared
machine noise only slows a run down); the per-round ratios show the spread. Throughput = images / wall time
over the timed window after a warm-up.

    python benchmarks/bench_cpu.py --data /tmp/ingest_cpu_1500 --out out/bench_cpu.json
    (without an existing --data it first makes a 1500-image set there with make_data.py)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_gpu as bg  # noqa: E402 - shared helpers: builders, batch check, host/version/dataset info

VARIANTS = ("ingest", "dataloader", "ingest_all_threads")
DEFAULT_VARIANTS = VARIANTS[:2]
TARGET = 1.5  # ingest / DataLoader


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--data", required=True, help="ImageFolder JPEG directory (made here if absent)")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--n", type=int, default=1500, help="images to make when --data is absent")
    p.add_argument("--photos", action="append", default=[], help="passed to make_data.py when making --data")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=2, help="ingest threads = DataLoader workers")
    p.add_argument("--seconds", type=float, default=15.0, help="timed window per run")
    p.add_argument("--warmup-seconds", type=float, default=3.0)
    p.add_argument("--warmup-batches", type=int, default=3)
    p.add_argument("--min-batches", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", default=None, help="comma-separated subset of: " + ", ".join(VARIANTS)
                   + " (default: ingest, dataloader)")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.batch < 1 or a.threads < 1 or a.rounds < 1:
        p.error(f"`--batch`, `--threads` and `--rounds` must be >= 1, got {a.batch}, {a.threads}, {a.rounds}")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    t_all = time.perf_counter()
    made = None
    if not Path(args.data).is_dir():
        import make_data
        made = make_data.make_dataset(args.data, n=args.n, classes=min(100, max(1, args.n // 15)), seed=0,
                                      workers=os.cpu_count(), photo_dirs=args.photos)
        print(f"[bench_cpu] made {made['n']} files, mean {made['mean_bytes'] / 1e3:.1f} KB in {made['seconds']} s")
    args.data = str(Path(args.data).resolve())
    variants = [v for v in VARIANTS if v in ({s.strip() for s in args.only.split(",")} if args.only
                                             else DEFAULT_VARIANTS)]
    if not variants:
        raise SystemExit(f"--only {args.only!r} names no variant. Available: {', '.join(VARIANTS)}")
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"benchmark": "bench_cpu", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:],
              "device": "cpu", "host": bg.host_info(), "versions": bg.versions(),
              "dataset": bg.dataset_stats(args.data), "made_data_seconds": made and made["seconds"],
              "config": {k: v for k, v in vars(args).items() if not k.startswith("child")},
              "rounds": [], "results": {}}
    report["config"]["augmentation"] = ("RandomResizedCrop(224), flip p=0.5, normalize (ImageNet mean/std) "
                                        "-> float32 NCHW")
    for r in range(args.rounds):
        row = {}
        for v in (variants if r % 2 == 0 else variants[::-1]):
            print(f"[bench_cpu] round {r + 1}/{args.rounds}: {v} ...", flush=True)
            res = run_child(v, args)
            row[v] = res
            print(f"[bench_cpu]   {res.get('img_s')} img/s" + (f"  ERROR {res['error'][:300]}" if res.get("error") else ""),
                  flush=True)
            best = report["results"].get(v)
            if best is None or (res.get("img_s") or 0) > (best.get("img_s") or 0):
                report["results"][v] = res
        report["rounds"].append({v: row[v].get("img_s") for v in row})
    i, d = (report["results"].get(v, {}).get("img_s") for v in DEFAULT_VARIANTS)
    ratio = round(i / d, 3) if i and d else None
    per_round = [round(x["ingest"] / x["dataloader"], 3) for x in report["rounds"]
                 if x.get("ingest") and x.get("dataloader")]
    report["derived"] = {"ingest_over_dataloader": ratio, "per_round": per_round, "target": TARGET,
                         "target_met": ratio is not None and ratio >= TARGET}
    a = report["results"].get("ingest_all_threads", {}).get("img_s")
    if a and d:
        report["derived"]["ingest_all_threads_over_dataloader"] = round(a / d, 3)
    report["wall_seconds"] = round(time.perf_counter() - t_all, 1)
    report["loadavg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]  # other jobs on the machine
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"\n{report['host']['cpu']} ({report['host']['affinity']} cores) | {report['dataset']['n']} files, "
          f"mean {report['dataset']['mean_bytes'] / 1e3:.1f} KB | batch {args.batch}, {args.threads} threads/workers")
    for v in VARIANTS:
        res = report["results"].get(v)
        if res:
            print(f"  {v:<18} {bg._fmt(res.get('img_s')):>8} img/s   rounds {[x.get(v) for x in report['rounds']]}"
                  + (f"  ERROR {res['error'][:120]}" if res.get("error") else ""))
    print(f"  ingest / DataLoader = {ratio} (per round {per_round}; target >= {TARGET})")
    print(f"[bench_cpu] wrote {out} ({report['wall_seconds']} s)")
    return 0


def run_child(variant: str, args) -> dict:
    fd, path = tempfile.mkstemp(suffix=f".{variant}.json")
    os.close(fd)
    cmd = [sys.executable, os.path.abspath(__file__), "--data", args.data, "--out", args.out, "--child", variant,
           "--child-out", path, "--batch", str(args.batch), "--threads", str(args.threads),
           "--seconds", str(args.seconds), "--warmup-seconds", str(args.warmup_seconds),
           "--warmup-batches", str(args.warmup_batches), "--min-batches", str(args.min_batches)]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        env = dict(os.environ, INGEST_OPS_THREADS=str(os.cpu_count())) if variant == "ingest_all_threads" else None
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
        try:
            rc = p.wait(timeout=args.seconds + args.warmup_seconds + 120)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        try:
            os.killpg(p.pid, signal.SIGKILL)  # this child's group: the child (on timeout), leftover workers
        except ProcessLookupError:
            pass
        p.wait()
        log.seek(0)
        tail = log.read()[-1500:]
    try:
        res = json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        res = {}
    Path(path).unlink(missing_ok=True)
    res["child_seconds"] = round(time.perf_counter() - t0, 1)
    if rc != 0 and not res.get("error"):
        res["error"] = f"child exited with {rc}: {tail}"
    return res


def timed_loop(loader, seconds: float, min_batches: int, t_start: float | None = None):
    """``for x, y in loader`` over epochs until ``seconds`` have passed (from ``t_start``, default now) and
    ``min_batches`` batches came; returns (batches, images, elapsed seconds, the last batch)."""
    t0 = time.perf_counter() if t_start is None else t_start
    batches = images = 0
    while True:
        for x, y in loader:
            batches += 1
            images += len(y)
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds and batches >= min_batches:
                return batches, images, elapsed, (x, y)
        if batches == 0:
            raise RuntimeError("an epoch yielded no batch (dataset smaller than one batch?)")


def child(args) -> int:
    import torch
    res: dict = {"variant": args.child, "torch_threads": torch.get_num_threads()}
    dev = torch.device("cpu")
    ns = argparse.Namespace(data=args.data, batch=args.batch, threads=args.threads, workers=args.threads,
                            ingest_workers=None)   # the Loader's own default
    try:
        t0 = time.perf_counter()
        feed = bg.build_dataloader(ns, dev) if args.child == "dataloader" else bg.build_ingest(ns, dev, "cpu")
        loader = feed.iterable
        # Warm-up (thread pools, worker processes), timed from the start so the first batch shows too.
        n, _, _, _ = timed_loop(loader, args.warmup_seconds, args.warmup_batches, t_start=t0)
        res["warmup_batches"] = n
        n, images, el, (x, y) = timed_loop(loader, args.seconds, args.min_batches)
        res.update(img_s=round(images / el, 1), batches=n, seconds=round(el, 3))
        res["check"] = bg.describe_batch(x, y, args.batch)
        if feed.stats is not None:
            res["loader_stats"] = feed.stats()
        if feed.close is not None:
            feed.close()
    except Exception as err:  # noqa: BLE001 - recorded in the JSON
        import traceback
        res["error"] = f"{type(err).__name__}: {err}"
        res["traceback"] = traceback.format_exc()[-3000:]
    Path(args.child_out).write_text(json.dumps(res, default=str))
    sys.stdout.flush()
    os._exit(0)  # no teardown of worker processes / threads: the parent clears the process group


if __name__ == "__main__":
    sys.exit(main())
