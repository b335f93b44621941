"""ingest vs NVIDIA DALI vs torch DataLoader on one GPU: loader throughput, decode-only, memory, training.

Variants (each runs in its own subprocess: a fresh CUDA context, and one crash cannot take the others down):

  a  ingest, decode="mixed" (nvImageCodec on the GPU), device cuda, the Loader's defaults (on CUDA: no worker
     processes, the pipeline on threads of the training process; the ``engine`` setting "auto": the native
     engine where eligible)
  p  the same with the ``engine`` setting "python" (the Python stages): with (a), the two engines on one tree
     (each ingest variant records ``engine``, the one that ran, and ``native_why_not``)
  w  the same with num_workers=4: four full worker processes, each with its own CUDA context
  r  num_workers=4, worker_stages="read": worker processes only read (no CUDA), decode and ops in this process
  b  ingest, decode="cpu", device cuda (CPU decode, upload, GPU augmentation)
  c  torch DataLoader + torchvision ImageFolder + PIL transforms, --workers processes, pin_memory, .cuda()
  d  DALI: readers.file -> decoders.image_random_crop(mixed) -> resize 224 -> crop_mirror_normalize(float, CHW)
  f  decode only, on preloaded bytes: nvImageCodec's batch decode (1 and 2 threads: the raw ceiling),
     ingest's GpuDecoder, ingest's CpuDecoder
  s  synthetic: the training loop of (e) on one constant batch already on the GPU (upper bound)

Inside a-d: (g) peak GPU memory during the loader-only phase (device-wide through NVML, else cudaMemGetInfo,
and per process through NVML / nvidia-smi where the process is visible; the same method for every variant),
then (e) a ResNet-18 (100 classes, bf16 autocast, channels_last, SGD) fed by that loader: training img/s and the
fraction of wall time spent blocked in ``next(it)`` (data wait); then, with ``--epochs-memory N``, N more
epochs' worth of batches (files // batch each) through the loader alone, with the device-wide memory in use
after each: its spread (max / min) says whether memory stays flat over epochs.

Every loader runs the same augmentation: RandomResizedCrop(224, scale 0.08-1, ratio 3/4-4/3), horizontal
flip p=0.5, normalise to float32 NCHW with ImageNet mean/std. Throughput = images / wall time over a timed
window after a warm-up (>= --warmup-batches and >= --warmup-seconds, which also drains any batches the
loader queued while it started), ending with a device synchronise. Epoch boundaries fall inside the window
(20k images = 78 batches of 256), as in training.

    python benchmarks/bench_gpu.py --data /dev/shm/ingest_bench_20k --out out/bench_gpu.json
    python benchmarks/bench_gpu.py --dry-run --out /tmp/dry.json     # CPU only, tiny, checks the code paths

The tree may hold JPEGs and PNGs (``make_data.py --png-frac``: 1.0 makes it all PNG); ``dataset.extensions``
counts its files by extension.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# The ingest of this script's tree first, not whichever one PYTHONPATH or the installed package names, so that
# a copy of another tree measures that tree (its child processes inherit the path).
sys.path.insert(0, str(REPO))
MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]
NUM_CLASSES = 100
LOADERS = {"a": "ingest_mixed", "p": "ingest_mixed_python", "w": "ingest_mixed_workers4",
           "r": "ingest_mixed_reader_procs", "b": "ingest_cpu_decode", "c": "torch_dataloader", "d": "dali_mixed"}
CHILDREN = {**LOADERS, "f": "decode_only", "s": "synthetic"}
ORDER = "apwrbcdsf"
IMAGE_EXT = (".jpg", ".jpeg", ".png")


# ==================================================================================================
# Parent: runs each variant in a subprocess, merges, derives ratios, prints, writes JSON


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--data", help="ImageFolder-layout JPEG directory (benchmarks/make_data.py)")
    p.add_argument("--out", required=True, help="JSON file to write (logs go next to it)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 256; 16 with --dry-run)")
    p.add_argument("--threads", type=int, default=None, help="ingest/DALI threads (default 16)")
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: --threads)")
    p.add_argument("--model", default="resnet18", help="torchvision model trained in (e) (default resnet18)")
    p.add_argument("--ingest-workers", type=int, default=None,
                   help="ingest Loader num_workers (default: the Loader's own default)")
    p.add_argument("--prefetch", type=int, default=2,
                   help="ingest Loader prefetch (batches queued after each stage; DALI's prefetch_queue_depth "
                        "is 2)")
    p.add_argument("--seconds", type=float, default=None, help="timed window per loader (default 10)")
    p.add_argument("--train-seconds", type=float, default=None, help="timed training window (default 10; 0 = skip e)")
    p.add_argument("--decode-seconds", type=float, default=None, help="timed window per decode-only case (5)")
    p.add_argument("--warmup-seconds", type=float, default=None, help="minimum warm-up (default 3)")
    p.add_argument("--warmup-batches", type=int, default=10)
    p.add_argument("--min-batches", type=int, default=20, help="the timed window holds at least this many")
    p.add_argument("--max-batches", type=int, default=100000)
    p.add_argument("--decode-images", type=int, default=2048, help="files preloaded for decode-only (f)")
    p.add_argument("--epochs-memory", type=int, default=0,
                   help="after training, this many epochs through each loader, memory after each (0: skip)")
    p.add_argument("--only", default=None,
                   help="comma-separated subset of a,p,w,r,b,c,d,f,s (e adds s; g is measured inside a-d)")
    p.add_argument("--repeat", type=int, default=1, help="run the chosen variants this many rounds (a,d,...,a,d)")
    p.add_argument("--dry-run", action="store_true", help="CPU only, tiny sizes; makes a tiny set if --data is absent")
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    dry = a.dry_run
    defaults = dict(batch=16 if dry else 256, threads=2 if dry else 16, seconds=2.0 if dry else 10.0,
                    train_seconds=3.0 if dry else 10.0, decode_seconds=1.0 if dry else 5.0,
                    warmup_seconds=0.5 if dry else 3.0)
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.workers is None:
        a.workers = a.threads
    if dry:
        a.warmup_batches, a.min_batches, a.decode_images = min(a.warmup_batches, 2), min(a.min_batches, 3), 64
    if a.batch < 1 or a.threads < 1 or a.workers < 1:
        p.error(f"`--batch`, `--threads` and `--workers` must be >= 1, got {a.batch}, {a.threads}, {a.workers}")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    logdir = out.with_suffix("").parent / (out.stem + "_logs")
    logdir.mkdir(exist_ok=True)

    if args.data is None or not Path(args.data).is_dir():
        if not args.dry_run:
            print(f"--data {args.data!r} is not a directory (make one with benchmarks/make_data.py)", file=sys.stderr)
            return 2
        sys.path.insert(0, str(HERE))
        import make_data
        args.data = args.data or str(Path(tempfile.gettempdir()) / "ingest_bench_dry")
        if not Path(args.data).is_dir():
            make_data.make_dataset(args.data, n=160, classes=4, seed=0, workers=2)
    args.data = str(Path(args.data).resolve())

    chosen = _chosen(args.only)
    report = {"benchmark": "bench_gpu", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "dry_run": args.dry_run, "argv": sys.argv[1:], "host": host_info(), "versions": versions(),
              "dataset": dataset_stats(args.data),
              "ingest_env": ingest_env(),
              "config": {k: v for k, v in vars(args).items() if not k.startswith("child")},
              "results": {}, "rounds": []}
    report["config"]["augmentation"] = ("RandomResizedCrop(224, scale=(0.08,1), ratio=(3/4,4/3)), flip p=0.5, "
                                        "normalize mean/std (ImageNet) -> float32 NCHW")
    argfile = logdir / "args.json"
    argfile.write_text(json.dumps(vars(args)))
    t_all = time.perf_counter()
    for rnd in range(args.repeat):
        this_round = {}
        for key in chosen:
            name = CHILDREN[key]
            print(f"[bench_gpu] round {rnd + 1}/{args.repeat}: {key} {name} ...", flush=True)
            res = run_child(key, args, argfile, logdir / f"{key}_{name}.r{rnd}.log")
            this_round[name] = res
            if rnd == 0 or _better(res, report["results"].get(name)):
                report["results"][name] = res
            print(f"[bench_gpu]   {_one_line(res)}", flush=True)
            report["derived"] = derive(report["results"])
            report["wall_seconds"] = round(time.perf_counter() - t_all, 1)
            _write(out, report)
        if args.repeat > 1:
            report["rounds"].append({k: _headline(v) for k, v in this_round.items()})
    for res in report["results"].values():
        if res.get("device_name"):
            report["device"] = res["device_name"]
            break
    else:
        report["device"] = "cpu (dry run)" if args.dry_run else _nvidia_smi_name()
    report["derived"] = derive(report["results"])
    report["wall_seconds"] = round(time.perf_counter() - t_all, 1)
    _write(out, report)
    print_table(report)
    print(f"[bench_gpu] wrote {out} ({report['wall_seconds']} s)")
    return 0


def _chosen(only: str | None) -> list[str]:
    if not only:
        return list(ORDER)
    keys = {k.strip() for k in only.split(",") if k.strip()}
    unknown = keys - set(CHILDREN) - {"e", "g"}
    if unknown:
        raise SystemExit(f"Unknown variant(s) {sorted(unknown)} in --only. Available: a, b, c, d, e, f, g, p, r, s, w")
    if "e" in keys:
        keys.add("s")
    return [k for k in ORDER if k in keys]


def _better(new: dict, old: dict | None) -> bool:
    """Across --repeat rounds keep each variant's best (highest throughput) run."""
    if old is None or old.get("error"):
        return True
    return (new.get("img_s") or 0) > (old.get("img_s") or 0)


def run_child(key: str, args, argfile: Path, log: Path) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--child", key]
    env = dict(os.environ, INGEST_BENCH_ARGS=str(argfile), PYTHONUNBUFFERED="1")
    budget = (args.warmup_seconds + args.seconds + 2 * args.train_seconds + args.warmup_seconds
              + 6 * args.decode_seconds + 30 * args.epochs_memory + 180)
    return run_json_child(cmd, env, budget, log, CHILDREN[key])


def run_json_child(cmd: list[str], env: dict, budget: float, log: Path, variant: str) -> dict:
    """Run ``cmd --child-out FILE`` in a session of its own, output to ``log``, and return the JSON it wrote to
    FILE with ``variant``, ``child_seconds``, ``log`` and, when it crashed or ran past ``budget`` seconds,
    ``error``. Its whole process group is killed at the end (a hung child, leftover worker processes)."""
    fd, res_path = tempfile.mkstemp(suffix=f".{variant}.json")
    os.close(fd)
    cmd = [*cmd, "--child-out", res_path]
    t0 = time.perf_counter()
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # this child's group: the child (on timeout), its leftover workers
        except ProcessLookupError:
            pass
        proc.wait()
    try:
        res = json.loads(Path(res_path).read_text() or "{}")
    except (OSError, ValueError):
        res = {}
    finally:
        Path(res_path).unlink(missing_ok=True)
    res.setdefault("variant", variant)
    res["child_seconds"] = round(time.perf_counter() - t0, 1)
    res["log"] = str(log)
    if rc != 0 and not res.get("error"):
        tail = log.read_text(errors="replace")[-1500:]
        res["error"] = f"child exited with {rc} ({'killed after %.0f s' % budget if rc == 'timeout' else 'crash'}); " \
                       f"log tail: {tail}"
    return res


def _write(path: Path, report: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    tmp.replace(path)


def _ratio(x, y):
    return round(x / y, 3) if x and y else None


def derive(results: dict) -> dict:
    g = lambda name, *path: _get(results.get(name, {}), *path)  # noqa: E731
    a, b, c, d = (g(LOADERS[k], "img_s") for k in "abcd")
    dec = results.get("decode_only", {}).get("decode", {})
    raw = max([v.get("img_s") or 0 for k, v in dec.items() if k.startswith("nvimgcodec")] or [0]) or None
    ing_dec = max([v.get("img_s") or 0 for k, v in dec.items() if k in ("ingest_gpu_1thr", "ingest_gpu_2thr")]
                  or [0]) or None
    alone = lambda name: _get(dec, name, "img_s")  # noqa: E731
    synth = g("synthetic", "train", "img_s")
    p = g(LOADERS["p"], "img_s")
    r = {
        "a_over_d": _ratio(a, d), "a_over_c": _ratio(a, c), "p_over_d": _ratio(p, d), "a_over_p": _ratio(a, p),
        "b_over_d": _ratio(b, d), "b_over_c": _ratio(b, c),
        "d_over_c": _ratio(d, c),
        "a_over_f_raw": _ratio(a, raw), "f_ingest_decoder_over_f_raw": _ratio(ing_dec, raw),
        "f_ingest_engine_picks_over_f_raw": _ratio(_get(dec, "ingest_gpu_2thr_engine_picks", "img_s"), raw),
        "f_raw_nvimgcodec_img_s": raw,
        # Each beside-busy case over the same configuration alone (one caller thread, one decoder thread; the
        # Loader's lanes). Before 2026-11-23 these divided by the best of 1thr and 2thr, understating them.
        "f_beside_busy_over_alone": _ratio(alone("ingest_gpu_beside_busy"), alone("ingest_gpu_1thr")),
        "f_beside_busy_switch_500us_over_alone": _ratio(alone("ingest_gpu_beside_busy_switch_500us"),
                                                        alone("ingest_gpu_1thr")),
        "f_lanes_beside_busy_over_alone": _ratio(alone("ingest_lanes_beside_busy"), alone("ingest_lanes")),
    }
    # Device-wide first: ingest's worker processes are other PIDs, which a per-process figure would miss.
    for m in ("device_peak_mb", "pid_peak_mb"):
        ma, md = g(LOADERS["a"], "memory", m), g(LOADERS["d"], "memory", m)
        if ma and md:
            r["mem_a_over_d"], r["mem_method"] = _ratio(ma, md), m
            break
    ta, tc, td = (g(LOADERS[k], "train", "img_s") for k in "acd")
    rr, tr = g(LOADERS["r"], "img_s"), g(LOADERS["r"], "train", "img_s")
    mr, md = g(LOADERS["r"], "memory", "device_peak_mb"), g(LOADERS["d"], "memory", "device_peak_mb")
    r.update({"r_over_d": _ratio(rr, d), "train_r_over_d": _ratio(tr, td), "mem_r_over_d": _ratio(mr, md),
              "train_r_over_a": _ratio(tr, ta)})
    w, tw, mw = g(LOADERS["w"], "img_s"), g(LOADERS["w"], "train", "img_s"), g(LOADERS["w"], "memory", "device_peak_mb")
    r.update({"w_over_d": _ratio(w, d), "train_w_over_d": _ratio(tw, td), "mem_w_over_d": _ratio(mw, md),
              "train_a_over_w": _ratio(ta, tw)})
    for k in "awrd":
        spread = g(LOADERS[k], "epochs_memory", "max_over_min")
        if spread is not None:
            r[f"epochs_memory_{k}_max_over_min"] = spread
    tp = g(LOADERS["p"], "train", "img_s")
    r.update({"train_p_over_d": _ratio(tp, td), "train_a_over_p": _ratio(ta, tp),
              "mem_p_over_d": _ratio(g(LOADERS["p"], "memory", "device_peak_mb"), md)})
    r.update({"train_a_over_d": _ratio(ta, td), "train_a_over_c": _ratio(ta, tc),
              "train_a_over_synthetic": _ratio(ta, synth), "train_d_over_synthetic": _ratio(td, synth),
              "train_c_over_synthetic": _ratio(tc, synth)})
    return r


def _get(d, *path):
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def _headline(res: dict) -> dict:
    return {"img_s": res.get("img_s"), "train_img_s": _get(res, "train", "img_s"),
            "gpu_step_ms": _get(res, "train", "gpu_step_ms"),
            "gpu_data_stall_frac": _get(res, "train", "gpu_data_stall_frac"), "error": res.get("error")}


def _one_line(res: dict) -> str:
    if res.get("error"):
        return f"ERROR {res['error'][:300]}"
    if "decode" in res:
        return ", ".join(f"{k} {v.get('img_s', 'ERR ' + str(v.get('error', ''))[:80])}" for k, v in res["decode"].items())
    parts = [f"{res.get('img_s')} img/s"] if res.get("img_s") else []
    if res.get("train"):
        t = res["train"]
        parts.append(f"train {t.get('img_s')} img/s, data wait {t.get('data_wait_frac')}, GPU step "
                     f"{t.get('gpu_step_ms')} ms, GPU data stall {t.get('gpu_data_stall_frac')}" if "img_s" in t
                     else f"train ERROR {str(t.get('error'))[:200]}")
    if _get(res, "memory", "device_peak_mb") is not None:
        parts.append(f"peak {res['memory']['device_peak_mb']} MB")
    return "; ".join(parts) + f" ({res.get('child_seconds')} s)"


def print_table(report: dict) -> None:
    R = report["results"]
    print(f"\n{report.get('device')}  |  {report['dataset'].get('n')} files, mean "
          f"{(report['dataset'].get('mean_bytes') or 0) / 1e3:.1f} KB  |  batch {report['config']['batch']}, "
          f"threads {report['config']['threads']}")
    print(f"{'variant':<26}{'img/s':>10}{'train img/s':>13}{'data wait':>11}{'peak MB':>10}{'pid MB':>9}  note")
    for name, res in R.items():
        if name == "decode_only":
            continue
        t = res.get("train") or {}
        m = res.get("memory") or {}
        note = ("ERROR " + res["error"][:60].replace("\n", " ")) if res.get("error") else \
            ("train ERROR " + str(t["error"])[:50] if t.get("error") else "")
        stats = res.get("loader_stats")
        if isinstance(stats, dict) and stats.get("engine"):
            note = f"{note} engine={stats['engine']}".strip()
        print(f"{name:<26}{_fmt(res.get('img_s')):>10}{_fmt(t.get('img_s')):>13}{_fmt(t.get('data_wait_frac'), 3):>11}"
              f"{_fmt(m.get('device_peak_mb')):>10}{_fmt(m.get('pid_peak_mb')):>9}  {note}")
    for k, v in (R.get("decode_only", {}).get("decode") or {}).items():
        note = "ERROR " + str(v["error"])[:60].replace("\n", " ") if v.get("error") else v.get("note", "")
        print(f"{'decode: ' + k:<26}{_fmt(v.get('img_s')):>10}{'':>13}{'':>11}{'':>10}{'':>9}  {note}")
    if R.get("decode_only", {}).get("error"):
        print(f"{'decode_only':<26}  ERROR {R['decode_only']['error'][:100]}")
    print("ratios: " + ", ".join(f"{k}={v}" for k, v in report["derived"].items() if v is not None))


def _fmt(v, nd=0):
    if v is None:
        return "-"
    return f"{v:.{nd}f}" if isinstance(v, (int, float)) else str(v)


# -- environment ---------------------------------------------------------------------------------


def versions() -> dict:
    from importlib import metadata
    dists = {"torch": ["torch"], "torchvision": ["torchvision"], "numpy": ["numpy"], "pillow": ["pillow"],
             "cupy": ["cupy-cuda13x", "cupy-cuda12x", "cupy"], "kvikio": ["kvikio-cu13", "kvikio-cu12", "kvikio"],
             "nvimgcodec": ["nvidia-nvimgcodec-cu13", "nvidia-nvimgcodec-cu12", "nvidia-nvimgcodec"],
             "nvjpeg": ["nvidia-nvjpeg", "nvidia-nvjpeg-cu13"], "simplejpeg": ["simplejpeg"],
             "dali": ["nvidia-dali-cuda130", "nvidia-dali-cuda120", "nvidia-dali"], "pynvml": ["nvidia-ml-py"]}
    out = {"python": platform.python_version()}
    for key, names in dists.items():
        out[key] = None
        for n in names:
            try:
                out[key] = metadata.version(n)
                break
            except metadata.PackageNotFoundError:
                continue
    init = REPO / "ingest" / "__init__.py"
    m = re.search(r'__version__\s*=\s*"([^"]+)"', init.read_text()) if init.exists() else None
    out["ingest"] = m.group(1) if m else None
    if os.environ.get("INGEST_GIT"):   # the commit run, where the tree's .git is missing or stale (device machine)
        out["ingest_git"] = os.environ["INGEST_GIT"]
        return out
    try:
        out["ingest_git"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], text=True,
                                           capture_output=True, timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "ingest"], text=True,
                               capture_output=True, timeout=10).stdout.strip()
        out["ingest_git_dirty"] = bool(dirty)
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def host_info() -> dict:
    cpu = None
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "platform": platform.platform(), "hostname": platform.node()}


def _nvidia_smi_name() -> str | None:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], text=True,
                              capture_output=True, timeout=20).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def list_files(root: str) -> list[str]:
    out = []
    for cls in sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")):
        d = os.path.join(root, cls)
        out += [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.lower().endswith(IMAGE_EXT)]
    return out


def dataset_stats(root: str) -> dict:
    files = list_files(root)
    sizes = [os.path.getsize(f) for f in files]
    exts: dict[str, int] = {}
    for f in files:
        ext = os.path.splitext(f)[1].lower()
        exts[ext] = exts.get(ext, 0) + 1
    st = {"path": root, "n": len(files), "classes": len({os.path.dirname(f) for f in files}),
          "mean_bytes": round(sum(sizes) / max(len(sizes), 1), 1), "total_mb": round(sum(sizes) / 2 ** 20, 1),
          "extensions": exts}
    meta = Path(root.rstrip("/") + ".meta.json")
    if meta.exists():
        try:
            st["made_by"] = json.loads(meta.read_text())
        except ValueError:
            pass
    return st


# ==================================================================================================
# Child: one variant


def child_args(args: argparse.Namespace) -> argparse.Namespace:
    """A child's arguments: the parent's, saved at ``INGEST_BENCH_ARGS``, with this child's key and output."""
    saved = json.loads(Path(os.environ["INGEST_BENCH_ARGS"]).read_text())
    return argparse.Namespace(**{**saved, "child": args.child, "child_out": args.child_out})


def add_window_options(p: argparse.ArgumentParser, variants: Sequence[str], seconds: float) -> None:
    """The options every variant benchmark takes: batch, DALI threads, the warm-up and timed window (default
    ``seconds``), rounds, ``--only``, ``--dry-run`` and the child's own; `window_defaults` fills them in."""
    p.add_argument("--batch", type=int, default=None, help="batch size (default 32; 4 with --dry-run)")
    p.add_argument("--threads", type=int, default=None, help="DALI threads (default 16); ingest picks its own")
    p.add_argument("--seconds", type=float, default=None, help=f"timed window per variant (default {seconds:g})")
    p.add_argument("--warmup-seconds", type=float, default=None, help="minimum warm-up (default 3)")
    p.add_argument("--warmup-batches", type=int, default=None, help="minimum warm-up batches (default 10)")
    p.add_argument("--min-batches", type=int, default=None, help="the timed window holds at least this many (20)")
    p.add_argument("--max-batches", type=int, default=100000)
    p.add_argument("--rounds", type=int, default=1,
                   help="run every variant this many times, in reverse order every other round (drift of a "
                        "shared machine falls on all alike); img_s is the mean, img_s_rounds each")
    p.add_argument("--only", default=None, help=f"comma-separated subset of {', '.join(variants)}")
    p.add_argument("--dry-run", action="store_true", help="CPU only, tiny sizes; makes a tiny set if --data is absent")
    p.add_argument("--child", choices=variants, help=argparse.SUPPRESS)
    p.add_argument("--child-args", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.set_defaults(window_seconds=seconds)


def window_defaults(a: argparse.Namespace, **more) -> None:
    """`add_window_options`' defaults (tiny ones with ``--dry-run``), and ``more`` as (default, dry-run default)
    pairs, where the user gave none."""
    dry = a.dry_run
    pairs = dict(batch=(32, 4), threads=(16, 2), seconds=(a.window_seconds, 1.5), warmup_seconds=(3.0, 0.3),
                 warmup_batches=(10, 1), min_batches=(20, 2), **more)
    for k, (full, tiny) in pairs.items():
        if getattr(a, k) is None:
            setattr(a, k, tiny if dry else full)


def choose_variants(only: str | None, variants: Sequence[str]) -> list[str]:
    """The variants ``--only`` names (comma-separated; all when None), in ``variants``' order."""
    if not only:
        return list(variants)
    keys = {k.strip() for k in only.split(",") if k.strip()}
    unknown = keys - set(variants)
    if unknown:
        raise SystemExit(f"Unknown variant(s) {sorted(unknown)} in --only. Available: {', '.join(variants)}")
    return [k for k in variants if k in keys]


def run_rounds(tag: str, chosen: Sequence[str], args, report: dict, out: Path, run_child, derive) -> None:
    """Each of ``chosen`` ``args.rounds`` times (every other round in reverse order, so that the drift of a shared
    machine falls on all alike) through ``run_child(name, log)``; with rounds, a variant's ``img_s`` is the mean
    and ``img_s_rounds`` each. ``report`` (its results, ``derive``'s ratios, wall time) is written to ``out``
    after every run."""
    t_all = time.perf_counter()
    logdir = out.parent / (out.stem + "_logs")
    report["results"] = {name: {} for name in chosen}   # in variant order, whatever order they run in
    for r in range(args.rounds):
        for name in chosen if r % 2 == 0 else chosen[::-1]:
            print(f"[{tag}] {name}" + (f" (round {r + 1}/{args.rounds})" if args.rounds > 1 else "") + " ...",
                  flush=True)
            res = run_child(name, logdir / (f"{name}.log" if args.rounds == 1 else f"{name}.r{r}.log"))
            if args.rounds > 1:
                rates = report["results"][name].get("img_s_rounds", []) + [res.get("img_s")]
                done = [x for x in rates if x is not None]
                res.update(img_s_rounds=rates, img_s=round(sum(done) / len(done), 1) if done else None)
            report["results"][name] = res
            report["derived"] = derive(report["results"])
            report["wall_seconds"] = round(time.perf_counter() - t_all, 1)
            _write(out, report)


def variant_child(args, run_variant) -> int:
    """A ``--child`` of a variant benchmark: the parent's arguments (saved at ``--child-args``) with this child's,
    and ``run_variant(name, args, dev, res, flush)`` in `run_in_child`."""
    saved = json.loads(Path(args.child_args).read_text())
    name = args.child
    args = argparse.Namespace(**{**saved, "child": name, "child_out": args.child_out})
    return run_in_child(name, args.child_out, args.dry_run,
                        lambda dev, res, flush: run_variant(name, args, dev, res, flush))


def finish_report(report: dict, out: Path, derived: dict, started: float, dry_run: bool) -> None:
    """The report's device (the first result's, else nvidia-smi's), derived figures and wall time, written."""
    report["device"] = next((r["device_name"] for r in report["results"].values() if r.get("device_name")),
                            "cpu (dry run)" if dry_run else _nvidia_smi_name())
    report["derived"] = derived
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    _write(out, report)


def child_main(args) -> int:
    key, out_path = args.child, args.child_out
    args = child_args(args)

    def run(dev, res, flush):
        import torch
        torch.backends.cudnn.benchmark = True
        if key in LOADERS:
            loader_variant(key, args, dev, res, flush)
        elif key == "s":
            synthetic_variant(args, dev, res, flush)
        elif key == "f":
            decode_variant(args, dev, res, flush)

    return run_in_child(CHILDREN[key], out_path, args.dry_run, run)


def run_in_child(variant: str, out_path: str, dry_run: bool, run) -> int:
    """The child's side of `run_json_child`: ``run(dev, res, flush)`` on a fresh CUDA context (the CPU for a dry
    run), every figure in ``res``; an exception is recorded as ``error`` with its traceback. Then the process
    ends without teardown."""
    res: dict = {"variant": variant}

    def flush():
        Path(out_path).write_text(json.dumps(res, default=str))

    try:
        import torch
        dev = torch.device("cpu" if dry_run else "cuda")
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("CUDA is not available (use --dry-run on a machine without a GPU)")
            torch.zeros(1, device=dev)
            torch.cuda.synchronize()
            res["device_name"] = torch.cuda.get_device_name(dev)
        res["torch"] = torch.__version__
        run(dev, res, flush)
    except BaseException as err:  # noqa: BLE001 - recorded in the JSON, the other variants go on
        res["error"] = f"{type(err).__name__}: {err}"
        res["traceback"] = traceback.format_exc()[-4000:]
        print(res["traceback"], file=sys.stderr)
    finally:
        flush()
    # Skip interpreter teardown: DataLoader workers, DALI and CUDA libraries can hang or crash at exit, and
    # the result is already written. The parent then clears this child's process group.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def sync(dev) -> None:
    if dev.type == "cuda":
        import torch
        torch.cuda.synchronize(dev)


def ingest_env() -> dict[str, str]:
    """The ``INGEST_*`` settings in this process's environment (what a run measured beside the defaults)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("INGEST_")}


def _kwargs_for(fn, **kw) -> dict:
    """The keyword arguments ``fn`` accepts (the library is young: tolerate a renamed optional argument)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return kw
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return kw
    return {k: v for k, v in kw.items() if k in params}


# -- the four loaders, each as: an iterable (epochs), a batch adapter, stats ----------------------


class Feed:
    """A loader as the timed loops take it; ``info``: what its variant records about it (the engine that runs)."""

    def __init__(self, iterable, adapt, stats=None, close=None, first_iter=None, info=None):
        self.iterable, self.adapt, self.stats, self.close = iterable, adapt, stats, close
        self.first_iter, self.info = first_iter, info or {}

    def endless(self):
        """Batches across epochs, as (images, labels) on the device."""
        it = self.first_iter if self.first_iter is not None else iter(self.iterable)
        while True:
            got = False
            for batch in it:
                got = True
                yield self.adapt(batch)
            if not got:
                raise RuntimeError("an epoch yielded no batch (dataset smaller than one batch?)")
            it = iter(self.iterable)


def build_ingest(args, dev, decode: str, stages: str | None = None, workers: int | None = None,
                 engine: str | None = None) -> Feed:
    """ingest's Loader with the training pipeline; ``engine`` sets the ``engine`` setting for this process (None:
    as it is, by default "auto")."""
    import torch
    import ingest
    from ingest import defaults
    from ingest.ops import Flip, Normalize, RandomResizedCrop
    if engine is not None:
        defaults.set(engine=engine)   # the whole child: the Loader reads it at build and at every iter()
    ops = [RandomResizedCrop(224), Flip(p=0.5),
           Normalize(mean=MEAN, std=STD, dtype=torch.float32, layout="NCHW")]
    # bench_cpu.py and bench_ddp.py build this loader from options of their own, without --prefetch
    loader = ingest.Loader(args.data, batch_size=args.batch, device=str(dev), decode=decode, ops=ops,
                           shuffle=True, seed=0, prefetch=getattr(args, "prefetch", 2), last_batch="drop",
                           num_workers=args.ingest_workers if workers is None else workers,
                           **({} if stages is None else {"worker_stages": stages}))
    info = {"engine": getattr(loader, "engine", None), "engine_setting": defaults.get("engine"),
            "native_why_not": getattr(loader, "native_why_not", None)}
    if dev.type != "cuda":
        info["native_chain_why_not"] = native_chain(loader.source, ops)
    return Feed(loader, lambda b: (b[0], b[1]), stats=loader.stats, close=getattr(loader, "close", None), info=info)


def native_chain(source, ops) -> str:
    """On a dry run (no GPU, so no native engine): whether the native engine would take this source and chain
    apart from the device (`ingest.native.chain_for`, and the fields a dict output asks for), else why not."""
    from ingest import native
    from ingest.formats.base import fields_of
    chain, why = native.chain_for(source, ops)
    if chain is None:
        return why
    extra = set(fields_of(source)) - {"image", "label"} - chain.fields
    return f"fields it does not collate: {sorted(extra)}" if extra else "eligible apart from the device"


def build_dataloader(args, dev) -> Feed:
    import torch
    import torchvision
    from torchvision import transforms as T
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([m / 255 for m in MEAN], [s / 255 for s in STD])])
    ds = torchvision.datasets.ImageFolder(args.data, transform=tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                     pin_memory=dev.type == "cuda", drop_last=True, persistent_workers=True,
                                     prefetch_factor=2, multiprocessing_context="fork")
    first = iter(dl)  # forks the workers now, before the memory sampler thread starts
    nb = dev.type == "cuda"
    return Feed(dl, lambda b: (b[0].to(dev, non_blocking=nb), b[1].to(dev, non_blocking=nb)), first_iter=first)


def build_dali(args, dev, shard: tuple[int, int] = (0, 1), reader=None, decode: str = "mixed") -> Feed:
    """DALI's mixed training pipeline; ``shard`` is (this rank, ranks) under torchrun (bench_ddp). ``reader(fn,
    types, shard)`` -> (encoded images, labels) replaces ``readers.file`` over ``args.data`` (bench_gil: the
    record formats' readers); it names its reader "Reader". ``decode`` "cpu" decodes on the CPU and moves the
    crops to the GPU for the rest (bench_codecs). On the CPU (a dry run) the same pipeline runs on DALI's CPU
    backend, which checks every operator argument."""
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except Exception as err:  # noqa: BLE001 - ImportError, or a missing shared library (OSError/RuntimeError)
        raise RuntimeError(f"unavailable: {type(err).__name__}: {err}") from err
    cuda = dev.type == "cuda"

    @pipeline_def
    def train(root):
        if reader is None:
            jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader", shard_id=shard[0],
                                            num_shards=shard[1])
        else:
            jpegs, labels = reader(fn, types, shard)
        images = fn.decoders.image_random_crop(jpegs, device=decode if cuda else "cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        if cuda and decode == "cpu":
            images = images.gpu()
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=MEAN, std=STD,
                                          mirror=fn.random.coin_flip(probability=0.5))
        return images, labels.gpu() if cuda else labels

    pipe = train(root=args.data, batch_size=args.batch, num_threads=args.threads,
                 device_id=(dev.index or 0) if cuda else None, seed=0, prefetch_queue_depth=2)
    pipe.build()
    it = DALIGenericIterator([pipe], ["data", "label"], reader_name="Reader",
                             last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)
    return Feed(it, lambda b: (b[0]["data"], b[0]["label"].reshape(-1).long()), first_iter=it)


def loader_variant(key, args, dev, res, flush) -> None:
    mem = MemSampler(dev)
    res["memory"] = {"method": mem.describe()}
    build = {"a": lambda: build_ingest(args, dev, "mixed" if dev.type == "cuda" else "cpu"),
             "p": lambda: build_ingest(args, dev, "mixed" if dev.type == "cuda" else "cpu", engine="python"),
             "w": lambda: build_ingest(args, dev, "mixed" if dev.type == "cuda" else "cpu", workers=4),
             "r": lambda: build_ingest(args, dev, "mixed" if dev.type == "cuda" else "cpu", stages="read",
                                       workers=4),
             "b": lambda: build_ingest(args, dev, "cpu"),
             "c": lambda: build_dataloader(args, dev),
             "d": lambda: build_dali(args, dev)}[key]
    if key in "apwr" and dev.type != "cuda":
        res["note"] = "dry run: mixed decode needs CUDA, ran decode='cpu'"
    t0 = time.perf_counter()
    if key != "c":
        mem.start()
    feed = build()
    mem.start()
    gen = feed.endless()
    res["build_seconds"] = round(time.perf_counter() - t0, 3)
    res.update(feed.info)

    # warm-up (also drains whatever the loader queued while starting)
    t0 = time.perf_counter()
    x, y = next(gen)
    sync(dev)
    res["first_batch_seconds"] = round(time.perf_counter() - t0, 3)
    res["check"] = describe_batch(x, y, args.batch)
    del x, y   # a user's loop holds only the batch of its step: held here, it would be one more batch in memory
    res.update(loader_window(gen, args, dev))
    mem.stop()
    res["memory"].update(mem.result())
    if feed.stats is not None:
        res["loader_stats"] = loader_stats(feed.stats)
    flush()

    if args.train_seconds > 0:
        try:
            before = loader_stats(feed.stats) if feed.stats is not None else None
            res["train"] = train_phase(gen, args, dev)
            if before is not None:
                res["train"]["loader_stages"] = stage_delta(before, loader_stats(feed.stats))
        except Exception as err:  # noqa: BLE001
            res["train"] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
        flush()
    if args.epochs_memory > 0:
        res["epochs_memory"] = epochs_memory(gen, args, dev)
        flush()
    if feed.close is not None:
        feed.close()


def loader_window(gen, args, dev) -> dict:
    """The loader alone: a warm-up (>= ``warmup_batches`` and ``warmup_seconds``, which also drains what it
    queued while starting), then a timed window (>= ``seconds`` and ``min_batches``) ending with a device
    synchronise: ``warmup_batches``, ``img_s``, ``batches``, ``images``, ``seconds``, and ``cpu_cores``: the
    process's CPU time over the window (every thread's, user and system) per second of it, so how many cores it
    kept busy, against ``cores`` it may run on. A batch's images are a tensor or a list of them (ragged batches):
    ``len`` counts either."""
    n, tw = 1, time.perf_counter()
    while n < args.warmup_batches or time.perf_counter() - tw < args.warmup_seconds:
        next(gen)
        n += 1
    sync(dev)
    out = {"warmup_batches": n}
    n, count, t0, c0 = 0, 0, time.perf_counter(), os.times()
    while True:
        x, _ = next(gen)
        n += 1
        count += len(x)
        el = time.perf_counter() - t0
        if (el >= args.seconds and n >= args.min_batches) or n >= args.max_batches:
            break
    sync(dev)
    el, c1 = time.perf_counter() - t0, os.times()
    out.update(img_s=round(count / el, 1), batches=n, images=count, seconds=round(el, 3),
               cpu_cores=round((c1.user - c0.user + c1.system - c0.system) / el, 2),
               cores=len(os.sched_getaffinity(0)))
    return out


def epochs_memory(gen, args, dev) -> dict:
    """``--epochs-memory`` epochs' worth of batches through the loader alone; device-wide MB in use after each
    (total - free: every process's memory on the device, the loader's workers included)."""
    import torch
    per_epoch = max(1, len(list_files(args.data)) // args.batch)
    used = []
    for _ in range(args.epochs_memory):
        for _ in range(per_epoch):
            next(gen)
        sync(dev)
        if dev.type == "cuda":
            free, total = torch.cuda.mem_get_info(dev)
            used.append(round((total - free) / 2**20, 1))
    out = {"epochs": args.epochs_memory, "batches_per_epoch": per_epoch, "device_used_mb": used}
    if used:
        out["max_over_min"] = round(max(used) / min(used), 4)
        out["last_over_first"] = round(used[-1] / used[0], 4)
    return out


def loader_stats(stats) -> dict | str:
    """A loader's ``stats()`` for the JSON, or why it failed (recorded, the run goes on)."""
    try:
        return stats()
    except Exception as err:  # noqa: BLE001
        return f"stats() failed: {type(err).__name__}: {err}"


def stage_delta(before, after) -> dict | str:
    """Each stage's work between two ``stats()`` snapshots, per batch: wall ms busy, thread CPU ms (where the
    loader reports them): which stage holds the loader back beside training."""
    if not isinstance(before, dict) or not isinstance(after, dict) or "stages" not in after:
        return "no stage stats"
    out = {}
    for name, a in after["stages"].items():
        b = before.get("stages", {}).get(name, {})
        n = a.get("batches", 0) - b.get("batches", 0)
        if n <= 0:
            continue
        row = {"batches": n}
        for key, label in (("seconds", "busy_ms_per_batch"), ("cpu_seconds", "cpu_ms_per_batch")):
            if key in a:
                row[label] = round(1000 * (a[key] - b.get(key, 0.0)) / n, 2)
        out[name] = row
    return out


def describe_batch(x, y, batch: int) -> dict:
    """Shape/dtype/device and pixel statistics of one batch: a pipeline producing garbage shows here."""
    import torch
    xf = x.float()
    return {"shape": list(x.shape), "dtype": str(x.dtype), "device": str(x.device),
            "labels_dtype": str(y.dtype), "labels_device": str(y.device),
            "mean_per_channel": [round(v, 3) for v in xf.mean(dim=(0, 2, 3)).tolist()] if x.dim() == 4 else None,
            "std": round(float(xf.std()), 3), "labels_min": int(y.min()), "labels_max": int(y.max()),
            "distinct_images": int(torch.unique(xf.flatten(1)[:, ::997].sum(1)).numel()) if x.dim() == 4 else None,
            "batch_ok": list(x.shape) == [batch, 3, 224, 224] and x.dtype == torch.float32}


# -- training (e) and its synthetic upper bound ----------------------------------------------------


def make_step(dev, args, wrap=None):
    """One training step of ``args.model`` (AMP, channels_last, SGD) and its AMP dtype; ``wrap`` wraps the
    model first (bench_ddp: DistributedDataParallel)."""
    import torch
    import torchvision
    model = getattr(torchvision.models, args.model)(num_classes=NUM_CLASSES)
    model = model.to(dev).to(memory_format=torch.channels_last)
    if wrap is not None:
        model = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    amp = dev.type == "cuda"
    dtype = torch.bfloat16 if not amp or torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler(enabled=amp and dtype == torch.float16)

    def step(x, y):
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(dev.type, dtype=dtype, enabled=amp):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    return step, str(dtype) if amp else "float32 (cpu)"


def train_phase(gen, args, dev) -> dict:
    """The training loop's rate and where its time went. ``data_wait_frac``: wall time the loop's thread spent
    in ``next()``. On CUDA also the GPU's side, from an event recorded on the training stream before and after
    each step: ``gpu_step_ms`` (mean span of a step's work on the GPU: its kernels, plus any gaps while the
    thread that launches them waited, e.g. for the GIL) and ``gpu_data_stall_frac`` (share of the window
    between one step's end and the next one's start: the stream waiting for the batch, or for the thread to
    launch). The thread can run steps ahead of the GPU, so its data wait alone does not say the GPU waited."""
    import torch
    step, dtype = make_step(dev, args)
    k, tw = 0, time.perf_counter()
    while k < 5 or time.perf_counter() - tw < args.warmup_seconds:
        x, y = next(gen)
        loss = step(x, y)
        k += 1
    sync(dev)
    cuda = dev.type == "cuda"
    marks: list[tuple] = []
    wait, steps, t0 = 0.0, 0, time.perf_counter()
    while True:
        a = time.perf_counter()
        x, y = next(gen)
        b = time.perf_counter()
        wait += b - a
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        loss = step(x, y)
        if cuda:
            end.record()
            marks.append((begin, end))
        steps += 1
        if (b - t0 >= args.train_seconds and steps >= 3) or steps >= args.max_batches:
            break
    sync(dev)
    el = time.perf_counter() - t0
    out = {"img_s": round(steps * x.shape[0] / el, 1), "data_wait_frac": round(wait / el, 4), "steps": steps,
           "seconds": round(el, 3), "warmup_steps": k, "amp_dtype": dtype, "final_loss": round(float(loss), 4),
           "model": f"{args.model}(num_classes={NUM_CLASSES}), channels_last, SGD"}
    out.update(gpu_timeline(marks))
    return out


def gpu_timeline(marks: list[tuple]) -> dict:
    """From CUDA events recorded on the training stream before and after each step (the stream synchronized
    since): ``gpu_step_ms``, the mean span of a step on the GPU, and ``gpu_data_stall_frac``, the share of the
    window the stream spent between steps (waiting for the batch, or for the thread to launch)."""
    if len(marks) < 2:
        return {}
    spans = [b.elapsed_time(e) for b, e in marks]
    gaps = [marks[i - 1][1].elapsed_time(marks[i][0]) for i in range(1, len(marks))]
    whole = marks[0][0].elapsed_time(marks[-1][1])
    return {"gpu_step_ms": round(sum(spans) / len(spans), 3), "gpu_data_stall_frac": round(sum(gaps) / whole, 4)}


def synthetic_variant(args, dev, res, flush) -> None:
    import torch
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224, generator=g).to(dev)
    y = torch.randint(0, NUM_CLASSES, (args.batch,), generator=g).to(dev)

    def const():
        while True:
            yield x, y

    res["train"] = train_phase(const(), args, dev) if args.train_seconds > 0 else {"skipped": "--train-seconds 0"}
    flush()


# -- decode only (f) ---------------------------------------------------------------------------


def decode_variant(args, dev, res, flush) -> None:
    import random
    files = list_files(args.data)
    random.Random(0).shuffle(files)
    files = files[:max(args.batch, min(args.decode_images, len(files)))]
    datas = [Path(f).read_bytes() for f in files]
    names = [str(f) for f in files]
    B = args.batch
    batches = [(datas[i:i + B], names[i:i + B]) for i in range(0, len(datas) - B + 1, B)]
    res["decode_files"] = len(datas)
    res["decode_mean_bytes"] = round(sum(map(len, datas)) / len(datas), 1)
    res["decode"] = {}
    cases = [("nvimgcodec_1thr", lambda: nvimgcodec_case(batches, dev, args, 1)),
             ("nvimgcodec_2thr", lambda: nvimgcodec_case(batches, dev, args, 2)),
             ("ingest_gpu_1thr", lambda: ingest_gpu_case(batches, dev, args, 1)),
             ("ingest_gpu_2thr", lambda: ingest_gpu_case(batches, dev, args, 2)),
             # like for like with nvImageCodec's defaults: every JPEG the hardware engine takes goes to it
             ("ingest_gpu_2thr_engine_picks", lambda: engine_picks(ingest_gpu_case, batches, dev, args, 2)),
             ("ingest_gpu_beside_busy", lambda: beside_busy(ingest_gpu_case, batches, dev, args, None)),
             ("ingest_gpu_beside_busy_switch_500us",
              lambda: beside_busy(ingest_gpu_case, batches, dev, args, 0.0005)),
             ("ingest_lanes", lambda: ingest_lanes_case(batches, dev, args)),
             ("ingest_lanes_beside_busy", lambda: beside_busy(ingest_lanes_case, batches, dev, args, None)),
             ("ingest_cpu", lambda: ingest_cpu_case(batches, args))]
    for name, case in cases:
        try:
            res["decode"][name] = case()
        except Exception as err:  # noqa: BLE001
            res["decode"][name] = {"error": f"{type(err).__name__}: {err}",
                                   "traceback": traceback.format_exc()[-2000:]}
        flush()


def timed(run_batch, n_batches: int, args, dev, threads: int = 1) -> dict:
    """Run ``run_batch(j, tid)`` -> images decoded, from ``threads`` threads, for --decode-seconds after a
    warm-up of 2 batches per thread; batches are dealt round-robin."""
    barrier = threading.Barrier(threads + 1)
    counts, errors = [0] * threads, []
    stop, failed = threading.Event(), threading.Event()

    def worker(tid):
        try:
            for j in range(2):
                run_batch((tid + j * threads) % n_batches, tid)
            sync(dev)
            barrier.wait()
            j = 0
            while not stop.is_set():
                counts[tid] += run_batch((tid + j * threads) % n_batches, tid)
                j += 1
        except BaseException as err:  # noqa: BLE001
            errors.append(err)
            failed.set()
            barrier.abort()

    ts = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for t in ts:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    t0 = time.perf_counter()
    # One wait, not a polling loop: a thread waking every few ms would be one more taker of the GIL beside the
    # decode threads (and the busy thread of `beside_busy`), which a training process does not have.
    failed.wait(args.decode_seconds)
    stop.set()
    for t in ts:
        t.join()
    sync(dev)
    el = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return {"img_s": round(sum(counts) / el, 1), "images": sum(counts), "seconds": round(el, 3), "threads": threads}


def nvimgcodec_case(batches, dev, args, threads: int) -> dict:
    if dev.type != "cuda":
        raise RuntimeError("unavailable: needs a GPU")
    import torch
    try:
        from nvidia import nvimgcodec
    except Exception as err:  # noqa: BLE001
        raise RuntimeError(f"unavailable: {type(err).__name__}: {err}") from err
    decoders = [nvimgcodec.Decoder() for _ in range(threads)]
    streams = [torch.cuda.Stream(dev) for _ in range(threads)]
    keep = [None] * threads
    out = decoders[0].decode(batches[0][0], cuda_stream=streams[0].cuda_stream)
    failed = sum(o is None for o in out)
    shape0 = list(out[0].shape) if out and out[0] is not None else None

    def run(j, tid):
        imgs = decoders[tid].decode(batches[j][0], cuda_stream=streams[tid].cuda_stream)
        keep[tid] = imgs  # alive until the next batch of this thread
        return sum(im is not None for im in imgs)

    r = timed(run, len(batches), args, dev, threads)
    r.update(failed_in_first_batch=failed, first_shape=shape0,
             note="Decoder() defaults, whole images, bytes in, one CUDA stream per thread")
    return r


def engine_picks(case, batches, dev, args, threads: int) -> dict:
    """``case`` with ingest's ``hw_decoder_load`` set to "auto": nvImageCodec picks each image's backend, as its
    own `Decoder()` does by default (ingest's default splits a batch between the hardware and CUDA decoders)."""
    from ingest import defaults
    if "hw_decoder_load" not in defaults.names():
        raise RuntimeError("unavailable: this ingest has no hw_decoder_load setting")
    with defaults.set(hw_decoder_load="auto"):
        return case(batches, dev, args, threads)


def ingest_gpu_case(batches, dev, args, threads: int) -> dict:
    if dev.type != "cuda":
        raise RuntimeError("unavailable: needs a GPU")
    import torch
    from ingest.decode.cpu import CpuDecoder
    from ingest.decode.gpu import GpuDecoder
    cpu = CpuDecoder(**_kwargs_for(CpuDecoder, threads=args.threads))
    ctor = _kwargs_for(GpuDecoder, threads=threads)
    if threads > 1 and not ctor:
        raise RuntimeError("unavailable: GpuDecoder takes no `threads`")
    gpu = GpuDecoder(dev, cpu, **ctor)
    stream = torch.cuda.Stream(dev)
    kw = _kwargs_for(gpu.decode_batch, rois=None, stream=stream)
    paths: dict[str, int] = {}
    with torch.cuda.stream(stream):
        images, _, p = gpu.decode_batch(batches[0][0], batches[0][1], **kw)
    failed = sum(isinstance(im, BaseException) for im in images)
    for q in p:
        paths[str(q)] = paths.get(str(q), 0) + 1

    recycle = getattr(gpu, "recycle", lambda images: None)

    def run(j, tid):
        with torch.cuda.stream(stream):
            images, _, _ = gpu.decode_batch(batches[j][0], batches[j][1], **kw)
        if not isinstance(images, list):  # one ImageArena: every image decoded (a view each costs a torch call)
            recycle(images)   # nothing reads it: its memory takes the next batch, as the Loader's ops stage does
            return len(images)
        return sum(not isinstance(im, BaseException) for im in images)

    r = timed(run, len(batches), args, dev, 1)
    r.update(failed_in_first_batch=failed, paths_first_batch=paths,
             note=f"GpuDecoder({ctor or 'defaults'}).decode_batch from one caller thread, whole images, "
                  "each arena handed back (recycle) once counted")
    for obj in (gpu, cpu):
        if hasattr(obj, "close"):
            obj.close()
    return r


class Busy:
    """A thread spinning on pure Python (a stand-in for a training loop's Python side); counts iterations."""

    def __init__(self):
        self.count, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            sum(range(2000))
            self.count += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def ingest_lanes_case(batches, dev, args, _threads: int = 1) -> dict:
    """The Loader's GPU decode: ``decode_batches`` lanes (2 by default), each a caller thread with its own
    `GpuDecoder` (``gpu_decoders`` threads, CPU threads shared out as the pipeline does) and CUDA stream,
    batches dealt to them in turn, so one lane's Python work and GIL waits overlap the other's decode."""
    if dev.type != "cuda":
        raise RuntimeError("unavailable: needs a GPU")
    import torch
    from ingest import defaults
    from ingest.decode.cpu import CpuDecoder
    from ingest.decode.gpu import GpuDecoder, cpu_threads_each
    lanes = defaults.get("decode_batches")
    lanes = 2 if lanes == "auto" else int(lanes)
    each = defaults.get("gpu_decoders")
    cpu = CpuDecoder(**_kwargs_for(CpuDecoder, threads=args.threads))
    decoders = [GpuDecoder(dev, cpu, threads=each, cpu_threads=cpu_threads_each(each * lanes)) for _ in range(lanes)]
    streams = [torch.cuda.Stream(dev) for _ in range(lanes)]

    def run(j, tid):
        gpu, stream = decoders[tid], streams[tid]
        with torch.cuda.stream(stream):
            images, _, _ = gpu.decode_batch(batches[j][0], batches[j][1], stream=stream)
        if not isinstance(images, list):
            gpu.recycle(images)
            return len(images)
        return sum(not isinstance(im, BaseException) for im in images)

    r = timed(run, len(batches), args, dev, lanes)
    r.update(note=f"{lanes} lanes as the Loader decodes: a caller thread each, GpuDecoder(threads={each}) and a "
                  "stream each, batches in turn, whole images, arenas handed back")
    for obj in (*decoders, cpu):
        obj.close()
    return r


def beside_busy(case, batches, dev, args, interval) -> dict:
    """``case`` run while a busy pure-Python thread shares the GIL. ``interval``: CPython's switch interval
    meanwhile, in seconds (None: leave it, 5 ms unless the program changed it). Each GIL hand-off costs up to
    one interval beside the busy thread."""
    old = sys.getswitchinterval()
    if interval is not None:
        sys.setswitchinterval(interval)
    applied = sys.getswitchinterval()
    try:
        with Busy() as busy:
            t0 = time.perf_counter()
            r = case(batches, dev, args, 1)
            spin = busy.count / (time.perf_counter() - t0)
    finally:
        sys.setswitchinterval(old)
    with Busy() as busy:  # its rate alone, for how much the decode held it back
        time.sleep(1.0)
    r.update(switch_interval_s=applied, busy_thread_progress=round(spin / max(busy.count, 1), 3))
    return r


def ingest_cpu_case(batches, args) -> dict:
    import torch
    from ingest.decode.cpu import CpuDecoder
    cpu = CpuDecoder(**_kwargs_for(CpuDecoder, threads=args.threads))
    out = cpu.decode_batch(batches[0][0], batches[0][1])
    failed = sum(isinstance(im, BaseException) for im in out)

    def run(j, tid):
        return sum(not isinstance(im, BaseException) for im in cpu.decode_batch(batches[j][0], batches[j][1]))

    r = timed(run, len(batches), args, torch.device("cpu"), 1)
    r.update(failed_in_first_batch=failed, note=f"CpuDecoder(threads={args.threads}).decode_batch to host memory")
    if hasattr(cpu, "close"):
        cpu.close()
    return r


# -- GPU memory (g) -------------------------------------------------------------------------------


class MemSampler:
    """Peak GPU memory of this process while a loader runs, net of the CUDA context that existed before the
    loader was built. Two readings, the same for every variant:

    * ``device_peak_mb``: device-wide used memory (every 20 ms) minus the level after context creation. Valid
      because variants run one at a time and the parent never touches the GPU. Read through NVML where pynvml
      finds the device (no CUDA call from the sampling thread beside the training thread's launches), else
      cudaMemGetInfo.
    * ``pid_peak_mb``: this process's used memory from NVML (pynvml) or ``nvidia-smi --query-compute-apps``,
      where the process is visible (not always inside containers), minus its value at context creation.

    Both count what DALI's own allocator and torch's caching allocator hold, which
    ``torch.cuda.max_memory_allocated`` would not (also reported, for ingest's share through torch)."""

    def __init__(self, dev, interval: float = 0.02):
        self.dev, self.interval = dev, interval
        self.cuda = dev.type == "cuda"
        self._stop = threading.Event()
        self._thread = None
        self.pid_method = None
        self._nvml = None
        if not self.cuda:
            return
        import torch
        self._torch = torch
        torch.cuda.reset_peak_memory_stats(dev)
        self._handle = self._nvml_handle()
        self.ctx_used = self._device_used()
        self.peak = self.ctx_used
        self.pid_ctx = self._pid_used_probe()
        self.pid_peak = self.pid_ctx

    def describe(self) -> str:
        if not self.cuda:
            return "n/a (no CUDA)"
        device = "NVML device-wide" if self._handle is not None else "cudaMemGetInfo device-wide"
        return device + (f" + per-process via {self.pid_method}" if self.pid_method else "")

    def _nvml_handle(self):
        """pynvml's handle of this device, found by its UUID (NVML and CUDA may number devices differently), or
        None where pynvml is absent or does not know it."""
        try:
            import pynvml
            pynvml.nvmlInit()
            uuid = str(self._torch.cuda.get_device_properties(self.dev).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            pynvml.nvmlDeviceGetMemoryInfo(handle)
            return handle
        except Exception:  # noqa: BLE001 - not installed, not permitted, or an older torch: cudaMemGetInfo
            return None

    def _device_used(self) -> int:
        if self._handle is not None:
            import pynvml
            return int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        free, total = self._torch.cuda.mem_get_info(self.dev)
        return total - free

    def _pid_used_probe(self):
        pid = os.getpid()
        try:
            import pynvml
            h = self._handle
            if h is None:
                pynvml.nvmlInit()
                idx = self.dev.index or 0
                vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                if vis and vis[0].strip().isdigit():
                    idx = int(vis[idx].strip())
                h = pynvml.nvmlDeviceGetHandleByIndex(idx)

            def q():
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    if p.pid == pid and p.usedGpuMemory is not None:
                        return int(p.usedGpuMemory)
                return None

            v = q()
            if v is not None:
                self._nvml, self.pid_method = q, "pynvml"
                return v
        except Exception:  # noqa: BLE001 - not installed / not permitted: try nvidia-smi
            pass
        try:
            def q():
                r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                    "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
                for line in r.stdout.splitlines():
                    parts = [s.strip() for s in line.split(",")]
                    if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
                        return int(parts[1]) * 2 ** 20
                return None

            v = q()
            if v is not None:
                self._nvml, self.pid_method = q, "nvidia-smi"
                return v
        except (OSError, subprocess.SubprocessError):
            pass
        return None

    def start(self) -> None:
        if not self.cuda or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="mem-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        k = 0
        every = 1 if self.pid_method == "pynvml" else 10  # nvidia-smi is a process spawn: ~every 0.2 s
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self._device_used())
                if self._nvml is not None and k % every == 0:
                    v = self._nvml()
                    if v is not None:
                        self.pid_peak = max(self.pid_peak or 0, v)
            except Exception:  # noqa: BLE001 - sampling must never break the benchmark
                pass
            k += 1
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.cuda:  # one last reading
            self.peak = max(self.peak, self._device_used())

    def result(self) -> dict:
        if not self.cuda:
            return {}
        mb = lambda v: round(v / 2 ** 20, 1) if v is not None else None  # noqa: E731
        t = self._torch.cuda
        return {"device_peak_mb": mb(self.peak - self.ctx_used), "context_mb": mb(self.ctx_used),
                "pid_peak_mb": mb(self.pid_peak - self.pid_ctx) if self.pid_ctx is not None else None,
                "torch_max_allocated_mb": mb(t.max_memory_allocated(self.dev)),
                "torch_max_reserved_mb": mb(t.max_memory_reserved(self.dev))}


if __name__ == "__main__":
    sys.exit(main())
