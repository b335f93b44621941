"""JPEG 2000 and TIFF through RandomResizedCrop 224 on one GPU: ingest vs DALI, the loader and the decode alone.

Sets (ImageFolder layout, made once from make_data.py's ImageNet-shaped JPEGs by re-encoding each with Pillow;
in /dev/shm unless --root says otherwise):

  j2k_lossy      JPEG 2000 files (.jp2), irreversible 9/7 wavelet at 20:1, 6 resolution levels
  j2k_lossless   JPEG 2000 files (.jp2), reversible 5/3 wavelet
  tiff           8-bit RGB TIFF, LZW-compressed in strips (a kind nvTIFF decodes)
  j2k_large      each photo upscaled 4x (short side 1,200-2,000 px, as medical and satellite images are large),
                 irreversible 9/7 at 20:1, 6 resolution levels, 1024 x 1024 tiles: RandomResizedCrop 224 downscales
                 every crop of these at least 2x, so a decoder may skip resolution levels and tiles (not in the
                 default --sets)
  j2k_huge       the same at 12x (short side 3,600-6,000 px, as whole satellite scenes and scanned slides are):
                 RandomResizedCrop 224 downscales about 60% of its crops 16x or more, where nvJPEG2000 decodes a
                 reduced resolution in well under its full-resolution time (not in the default --sets; make it
                 with a small --images: each image takes seconds to encode)

Variants, per set (each in its own subprocess, as bench_gpu.py runs them; by default the JPEG 2000 sets run
i, d and f, the TIFF set all four):

  i  ingest Loader, decode="mixed": RandomResizedCrop(224) + flip + Normalize (float32 NCHW); ``decode_paths``
     says which decoder took the images (GPU, GPU region, CPU fallback)
  d  DALI: readers.file -> decoders.image_random_crop(device="mixed") -> resize 224 -> crop_mirror_normalize
  c  DALI with the decode on the CPU (decoders.image_random_crop(device="cpu")), the rest on the GPU: the TIFF
     pairing the issue names (DALI's CPU TIFF decode)
  f  decode only, on preloaded batches of --batch images: ingest's GpuDecoder with RandomResizedCrop regions
     (scale 0.08-1, ratio 3/4-4/3), and its CpuDecoder (for the sets of --cpu-decode)

A variant's ``library_messages`` are the lines of its log that name nvImageCodec's extensions or a library that
did not load (a DALI whose nvJPEG2000 did not load decodes JPEG 2000 on the CPU: that shows there).

Derived (``derived`` in the JSON): ``<set>_ingest_over_dali`` (i / d), ``tiff_ingest_over_dali_cpu`` (i / c;
issue 36 asks >= 1.2 for JPEG 2000 over DALI and >= 3 for TIFF on the GPU over DALI's CPU TIFF decode; ``targets``
says each against its bar), ``<set>_ingest_gpu_share`` (of the images ingest's loader decoded, warm-up included,
the share nvImageCodec took) and the decode-only rates.

Settings (``--setting NAME=INGEST_VAR=VALUE[,INGEST_VAR=VALUE]``, repeatable; bench_settings.py's syntax, each
variable one of ingest's settings): the ingest loader (i) runs once per setting, in its own process with those
variables, against the same DALI runs. The first setting is the headline (``<set>/ingest_mixed`` when it is
named ``default``, else ``<set>/ingest_mixed@NAME`` like the others); ``<set>_settings`` in ``derived`` gives each
setting's img/s and its ratio over DALI, ``<set>_best_setting`` the fastest. The decode-only run (f) takes the
first setting's variables.

Windows: JPEG 2000 decodes an order of magnitude slower than TIFF, so its sets' loaders are timed over
``--j2k-seconds`` and at least ``--j2k-min-batches`` (default 8 s and 20 batches; 3 s windows held 9 to 21
batches, too few to tell settings apart).

Running order: per set, the first setting's loader, DALI's, then the other settings'; then the decode-only runs.
``--budget`` bounds them all together (the sets' making aside), and a variant left too little time is recorded
as skipped.

    python benchmarks/bench_codecs.py                      # GPU; JSON in benchmarks/results/bench_codecs/<device>/
    python benchmarks/bench_codecs.py --dry-run            # CPU only, tiny sets; DALI on its CPU backend
    python benchmarks/bench_codecs.py --sets j2k_lossy,j2k_lossless --only i,d --budget 200 \\
        --setting default= --setting pad16=INGEST_JPEG2K_DEVICE_PADDING=16777216   # settings against the same DALI
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(HERE))

import bench_gpu  # noqa: E402 - after the path: this tree's ingest and the benchmark helpers
from bench_gpu import MEAN, STD, Feed, describe_batch, sync  # noqa: E402
from bench_settings import parse_setting  # noqa: E402

SETS = {"j2k_lossy": ".jp2", "j2k_lossless": ".jp2", "tiff": ".tif", "j2k_large": ".jp2", "j2k_huge": ".jp2"}
#: The sets run when --sets is not given (issue 36's).
DEFAULT_SETS = ("j2k_lossy", "j2k_lossless", "tiff")
VARIANTS = {"i": "ingest_mixed", "d": "dali_mixed", "c": "dali_cpu_decode", "f": "decode_only"}
ORDER = "idcf"
#: Variants each set runs unless --only says: DALI's CPU decode is the issue's comparison for TIFF only.
SET_VARIANTS = {"j2k_lossy": "idf", "j2k_lossless": "idf", "tiff": "idcf", "j2k_large": "idf", "j2k_huge": "idf"}
#: The least a variant is started with under --budget.
MIN_CHILD_SECONDS = 15
#: Sets timed over --j2k-seconds and --j2k-min-batches instead of --seconds and --min-batches.
J2K_SETS = ("j2k_lossy", "j2k_lossless", "j2k_large", "j2k_huge")
#: ingest's settings read in each loader child and recorded with its result (what the decode's concurrency is).
RECORDED_SETTINGS = ("gpu_decoders", "gpu_decode_threads", "decode_batches", "jpeg2k_device_padding",
                     "host_jpeg2k_share", "nvjpeg_host_padding", "nvjpeg_device_padding")
#: Issue 36's bars: derived figure -> the least it asks.
TARGETS = {"j2k_lossy_ingest_over_dali": 1.2, "j2k_lossless_ingest_over_dali": 1.2, "tiff_ingest_over_dali_cpu": 3.0}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--root", default=None, help="where the sets are made (default /dev/shm/ingest_bench_codecs_<N>)")
    p.add_argument("--images", type=int, default=None, help="images per set (default 1024)")
    p.add_argument("--workers", type=int, default=None, help="processes making the sets (default: one per core)")
    p.add_argument("--out", default=None, help="JSON file (default benchmarks/results/bench_codecs/<device>/"
                                               "bench_codecs.json)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 256)")
    p.add_argument("--threads", type=int, default=None, help="DALI and CPU decoder threads (default 16)")
    p.add_argument("--seconds", type=float, default=None, help="timed window per loader (default 3)")
    p.add_argument("--decode-seconds", type=float, default=None, help="timed window per decode case (default 2)")
    p.add_argument("--j2k-seconds", type=float, default=None,
                   help="timed window per loader of the JPEG 2000 sets (default 8)")
    p.add_argument("--j2k-min-batches", type=int, default=None,
                   help="the JPEG 2000 sets' timed windows hold at least this many batches (default 20)")
    p.add_argument("--setting", action="append", metavar="NAME=INGEST_VAR=VALUE[,INGEST_VAR=VALUE]",
                   help="a named setting the ingest loader runs under (NAME= alone: the defaults); repeatable, "
                        "the first is the headline (default: one setting, 'default')")
    p.add_argument("--warmup-seconds", type=float, default=None, help="minimum warm-up (default 1.5)")
    p.add_argument("--warmup-batches", type=int, default=2)
    p.add_argument("--min-batches", type=int, default=3)
    p.add_argument("--max-batches", type=int, default=100000)
    p.add_argument("--sets", default=",".join(DEFAULT_SETS),
                   help=f"comma-separated subset of {', '.join(SETS)} (default {','.join(DEFAULT_SETS)})")
    p.add_argument("--only", default=None, help="comma-separated subset of i,d,c,f for every set (default: "
                   + "; ".join(f"{k} {v}" for k, v in SET_VARIANTS.items()) + ")")
    p.add_argument("--cpu-decode", default="tiff", help="sets whose decode-only run also times ingest's CPU decoder")
    p.add_argument("--child-budget", type=float, default=None,
                   help="seconds a variant may take before it is killed (default: 60 + its windows)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds all variants together may take (the sets' making aside): a variant gets at most "
                        "what is left and is skipped when less than %d s is" % MIN_CHILD_SECONDS)
    p.add_argument("--dry-run", action="store_true", help="CPU only, tiny sizes (DALI is reported unavailable)")
    p.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    p.add_argument("--child-set", choices=sorted(SETS), help=argparse.SUPPRESS)
    p.add_argument("--child-setting", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    dry = a.dry_run
    defaults = dict(images=16 if dry else 1024, batch=8 if dry else 256, threads=2 if dry else 16,
                    seconds=0.5 if dry else 3.0, decode_seconds=0.5 if dry else 2.0,
                    j2k_seconds=0.5 if dry else 8.0, j2k_min_batches=1 if dry else 20,
                    warmup_seconds=0.2 if dry else 1.5, workers=2 if dry else os.cpu_count())
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if dry:
        a.warmup_batches, a.min_batches = 1, 1
    if a.root is None:
        a.root = str(Path(tempfile.gettempdir()) / "ingest_bench_codecs_dry") if dry else \
            f"/dev/shm/ingest_bench_codecs_{a.images}"
    a.sets = [s for s in a.sets.split(",") if s]
    a.cpu_decode = [s for s in a.cpu_decode.split(",") if s]
    if a.child_budget is None:
        a.child_budget = 60 + 3 * a.warmup_seconds + 2 * max(a.seconds, a.j2k_seconds) + 4 * a.decode_seconds
    try:
        a.settings = [parse_setting(s) for s in (a.setting or ["default="])]
    except SystemExit as err:
        p.error(str(err))
    names = [n for n, _ in a.settings]
    if len(set(names)) != len(names) or any(not re.fullmatch(r"[A-Za-z0-9_.-]+", n) for n in names):
        p.error(f"setting names must differ and be made of letters, digits, '_', '.' and '-'; got {names}")
    unknown_vars = sorted({v for _, env in a.settings for v in env} - known_variables())
    if unknown_vars:
        p.error(f"--setting: {', '.join(unknown_vars)} not among ingest's settings' variables "
                f"({', '.join(sorted(known_variables()))})")
    unknown = (set(a.sets + a.cpu_decode) - set(SETS)) | (set((a.only or ORDER).replace(",", "")) - set(VARIANTS))
    if unknown:
        p.error(f"Unknown set(s) or variant(s) {sorted(unknown)}. Sets: {', '.join(SETS)}; variants: "
                f"{', '.join(ORDER)}")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    from bench_augment import device_slug
    started = time.perf_counter()
    out = Path(args.out or REPO / "benchmarks" / "results" / "bench_codecs" / device_slug(args.dry_run) /
               "bench_codecs.json").resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    logdir = out.parent / (out.stem + "_logs")
    logdir.mkdir(exist_ok=True)
    made = make_sets(args)
    report = {"benchmark": "bench_codecs", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "dry_run": args.dry_run,
              "argv": sys.argv[1:], "host": bench_gpu.host_info(), "versions": versions(),
              "sets": made, "config": {k: v for k, v in vars(args).items() if not k.startswith("child")},
              "results": {}}
    argfile = logdir / "args.json"
    argfile.write_text(json.dumps(vars(args)))
    t_runs = time.perf_counter()
    settings = dict(args.settings)
    for name, key, setting in plan(args):
        label = variant_label(name, key, setting, args.settings[0][0])
        left = args.budget - (time.perf_counter() - t_runs) if args.budget else args.child_budget
        if left < MIN_CHILD_SECONDS:
            report["results"][label] = {"variant": label, "error": f"skipped: --budget {args.budget:g} s spent"}
            print(f"[bench_codecs] {label}: skipped, --budget spent", flush=True)
            continue
        print(f"[bench_codecs] {label} ...", flush=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", key, "--child-set", name]
        env = dict(os.environ, INGEST_BENCH_ARGS=str(argfile), PYTHONUNBUFFERED="1")
        if setting is not None:
            cmd += ["--child-setting", setting]
            env.update(settings[setting])
        log = logdir / (f"{name}_{key}" + (f"@{setting}" if setting is not None else "") + ".log")
        res = bench_gpu.run_json_child(cmd, env, min(args.child_budget, left), log, label.replace("/", "-"))
        res["library_messages"] = library_messages(log)
        if setting is not None:
            res["setting"], res["setting_env"] = setting, settings[setting]
        report["results"][label] = res
        print(f"[bench_codecs]   {bench_gpu._one_line(res)}", flush=True)
        report["derived"] = derive(report["results"])
        bench_gpu._write(out, report)
    report["runs_seconds"] = round(time.perf_counter() - t_runs, 1)
    bench_gpu.finish_report(report, out, derive(report["results"]), started, args.dry_run)
    print(json.dumps({"device": report["device"], **report["derived"]}, indent=1, default=str))
    print(f"[bench_codecs] wrote {out} ({report['wall_seconds']} s)")
    return 0


def plan(args) -> list[tuple[str, str, str | None]]:
    """(set, variant, setting name or None) in running order: per set, ingest's loader under the first setting,
    DALI's loaders, ingest's under the other settings (the figures the issue asks for first, so that a spent
    --budget cuts the extra settings), then the decode-only runs (under the first setting)."""
    want = {name: args.only or SET_VARIANTS[name] for name in args.sets}
    first, *others = [n for n, _ in args.settings]
    out = []
    for name in args.sets:
        if "i" in want[name]:
            out.append((name, "i", first))
        out += [(name, k, None) for k in ORDER if k in "dc" and k in want[name]]
        if "i" in want[name]:
            out += [(name, "i", s) for s in others]
    return out + [(name, "f", first) for name in args.sets if "f" in want[name]]


def variant_label(name: str, key: str, setting: str | None, headline: str) -> str:
    """The result's key: ``<set>/<variant>``, with ``@<setting>`` for ingest's loader under any setting but a
    headline one named ``default`` (the key earlier results have)."""
    label = f"{name}/{VARIANTS[key]}"
    if key == "i" and setting is not None and not (setting == headline == "default"):
        label += f"@{setting}"
    return label


def known_variables() -> set[str]:
    """The environment variables of ingest's settings (``ingest.defaults``)."""
    from ingest import defaults
    return {defaults.variable(name) for name in defaults.names()}


def derive(results: dict) -> dict:
    g = lambda label, *path: bench_gpu._get(results.get(label, {}), *path)  # noqa: E731
    r = bench_gpu._ratio
    out = {}
    for name in SETS:
        loaders = [k for k in results if k == f"{name}/ingest_mixed" or k.startswith(f"{name}/ingest_mixed@")]
        headline = loaders[0] if loaders else f"{name}/ingest_mixed"
        if len(loaders) > 1:
            per = {results[k].get("setting", k.partition("@")[2] or "default"):
                   {"img_s": g(k, "img_s"), "over_dali": r(g(k, "img_s"), g(f"{name}/dali_mixed", "img_s")),
                    "env": results[k].get("setting_env")} for k in loaders}
            out[f"{name}_settings"] = per
            timed = {s: v["img_s"] for s, v in per.items() if v["img_s"] is not None}
            if timed:
                best = max(timed, key=timed.get)
                out[f"{name}_best_setting"] = {"setting": best, **per[best]}
        out[f"{name}_ingest_over_dali"] = r(g(headline, "img_s"), g(f"{name}/dali_mixed", "img_s"))
        out[f"{name}_ingest_over_dali_cpu"] = r(g(headline, "img_s"), g(f"{name}/dali_cpu_decode", "img_s"))
        out[f"{name}_ingest_gpu_share"] = gpu_share(g(headline, "loader_stats", "decode_paths"))
        out[f"{name}_decode_gpu_img_s"] = g(f"{name}/decode_only", "decode", "ingest_gpu_regions", "img_s")
        out[f"{name}_decode_gpu_paths"] = g(f"{name}/decode_only", "decode", "ingest_gpu_regions",
                                            "paths_first_batch")
        out[f"{name}_decode_cpu_img_s"] = g(f"{name}/decode_only", "decode", "ingest_cpu", "img_s")
    out = {k: v for k, v in out.items() if v is not None}
    targets = {k: {"value": out.get(k), "at_least": bar, "met": None if out.get(k) is None else out[k] >= bar}
               for k, bar in TARGETS.items()}
    return {**out, "targets": targets}


def gpu_share(paths) -> float | None:
    """The share of ``decode_paths`` (a loader's count per decode path) nvImageCodec decoded (path "gpu*")."""
    if not isinstance(paths, dict) or not sum(paths.values()):
        return None
    return round(sum(v for k, v in paths.items() if k.startswith("gpu")) / sum(paths.values()), 4)


def library_messages(log: Path, most: int = 12) -> list[str]:
    """The distinct lines of a child's log that name an nvImageCodec extension or a library that did not load."""
    keys = ("_ext]", "failed to load", "cannot open shared object")
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        line = re.sub(r"\x1b\[[0-9;]*m", "", line).strip()   # the colour codes nvImageCodec's logger writes
        if line and line not in out and any(k in line.lower() for k in keys):
            out.append(line[:300])
    return out[:most]


def versions() -> dict:
    from importlib import metadata
    out = bench_gpu.versions()
    for key, dist in (("imagecodecs", "imagecodecs"), ("tifffile", "tifffile"), ("nvjpeg2k", "nvidia-nvjpeg2k-cu13"),
                      ("nvtiff", "nvidia-nvtiff-cu13"), ("nvcomp", "nvidia-libnvcomp-cu13")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = None
    return out


# ==================================================================================================
# Data


def make_sets(args) -> dict:
    """Each set of `SETS` under ``args.root`` (made where absent, from a JPEG set made there too), with stats."""
    from PIL import features
    missing = [f for f in ("jpg_2000", "libtiff") if not features.check(f)]
    if missing:
        raise SystemExit(f"[bench_codecs] this Pillow lacks {', '.join(missing)}: it cannot write the sets")
    root = Path(args.root)
    source = root / "jpeg"
    if not source.is_dir():
        import make_data
        print(f"[bench_codecs] making {args.images} JPEGs in {source} ...", flush=True)
        t0 = time.perf_counter()
        make_data.make_dataset(str(source), n=args.images, classes=min(100, args.images), seed=0,
                               workers=args.workers)
        print(f"[bench_codecs]   {time.perf_counter() - t0:.1f} s", flush=True)
    stats = {}
    for name in args.sets:
        target = root / name
        t0 = time.perf_counter()
        if not target.is_dir():
            print(f"[bench_codecs] encoding {name} in {target} ...", flush=True)
            tmp = root / f".{name}.tmp"
            jobs = [(str(path), str(tmp / path.parent.name / (path.stem + SETS[name])), name)
                    for path in sorted(source.glob("*/*.jpg"))]
            with ProcessPoolExecutor(args.workers) as pool:
                list(pool.map(_encode, jobs, chunksize=16))
            tmp.rename(target)
        files = list_files(target)
        sizes = [f.stat().st_size for f in files]
        stats[name] = {"path": str(target), "n": len(files), "mean_bytes": round(sum(sizes) / max(1, len(sizes)), 1),
                       "made_seconds": round(time.perf_counter() - t0, 1)}
    return stats


def _encode(job: tuple[str, str, str]) -> None:
    src, dst, name = job
    from PIL import Image
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    img = Image.open(src).convert("RGB")
    if name == "j2k_lossy":
        img.save(dst, "JPEG2000", irreversible=True, quality_mode="rates", quality_layers=[20], num_resolutions=6)
    elif name == "j2k_lossless":
        img.save(dst, "JPEG2000", num_resolutions=6)
    elif name in ("j2k_large", "j2k_huge"):
        scale = 4 if name == "j2k_large" else 12
        img = img.resize((scale * img.width, scale * img.height), Image.BICUBIC)
        img.save(dst, "JPEG2000", irreversible=True, quality_mode="rates", quality_layers=[20], num_resolutions=6,
                 tile_size=(1024, 1024))
    else:
        img.save(dst, "TIFF", compression="tiff_lzw")


def list_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*/*") if p.suffix in (".jp2", ".tif"))


# ==================================================================================================
# Children


def child_main(args) -> int:
    key, name, out_path, setting = args.child, args.child_set, args.child_out, args.child_setting
    args = bench_gpu.child_args(args)
    args.data = str(Path(args.root) / name)
    if name in J2K_SETS:   # the longer window (see the module doc)
        args.seconds, args.min_batches = args.j2k_seconds, max(args.min_batches, args.j2k_min_batches)

    def run(dev, res, flush):
        res["set"] = name
        if setting is not None:
            from ingest import defaults
            res["setting"] = setting
            res["ingest_settings"] = {k: defaults.get(k) for k in RECORDED_SETTINGS}
        if key == "f":
            decode_only(args, dev, res, flush)
            return
        # start_seconds: from the loader's construction to its first batch (DALI's iterator runs its first batch
        # while it is made, so first_batch_seconds alone would leave DALI's out)
        t0 = time.perf_counter()
        feed = {"i": lambda: build_ingest(args, dev), "d": lambda: build_dali(args, dev, "mixed"),
                "c": lambda: build_dali(args, dev, "cpu")}[key]()
        gen = feed.endless()
        t1 = time.perf_counter()
        x, y = next(gen)
        sync(dev)
        t2 = time.perf_counter()
        res.update(build_seconds=round(t1 - t0, 3), first_batch_seconds=round(t2 - t1, 3),
                   start_seconds=round(t2 - t0, 3))
        res["check"] = describe_batch(x, y, args.batch)
        del x, y
        res.update(bench_gpu.loader_window(gen, args, dev))
        if feed.stats is not None:
            res["loader_stats"] = bench_gpu.loader_stats(feed.stats)
        flush()
        if feed.close is not None:
            feed.close()

    return bench_gpu.run_in_child(f"{name}/{VARIANTS[key]}", out_path, args.dry_run, run)


def build_ingest(args, dev) -> Feed:
    import torch
    import ingest
    from ingest.ops import Flip, Normalize, RandomResizedCrop
    ops = [RandomResizedCrop(224), Flip(p=0.5), Normalize(mean=MEAN, std=STD, dtype=torch.float32, layout="NCHW")]
    loader = ingest.Loader(args.data, batch_size=args.batch, device=str(dev),
                           decode="mixed" if dev.type == "cuda" else "cpu", ops=ops, shuffle=True, seed=0,
                           last_batch="drop")
    return Feed(loader, lambda b: (b[0], b[1]), stats=loader.stats, close=getattr(loader, "close", None))


def build_dali(args, dev, decode: str) -> Feed:
    """bench_gpu's DALI pipeline over the set's files, its decode on ``decode`` ("mixed" or "cpu")."""
    def reader(fn, types, shard):
        return fn.readers.file(file_root=args.data, random_shuffle=True, name="Reader", shard_id=shard[0],
                               num_shards=shard[1], file_filters=["*.jp2", "*.tif"])
    return bench_gpu.build_dali(args, dev, reader=reader, decode=decode)


def decode_only(args, dev, res, flush) -> None:
    """ingest's GpuDecoder (regions as RandomResizedCrop draws them) and CpuDecoder on preloaded batches."""
    import numpy as np
    files = list_files(Path(args.data))
    datas = [f.read_bytes() for f in files]
    names = [str(f) for f in files]
    B = args.batch
    batches = [(datas[i:i + B], names[i:i + B]) for i in range(0, len(datas) - B + 1, B)]
    res["decode"] = {}
    from ingest.decode.cpu import CpuDecoder
    cpu = CpuDecoder(threads=args.threads)
    rng = np.random.default_rng(0)
    regions = [random_crops([cpu.probe(d, n) for d, n in zip(*batch)], rng) for batch in batches]
    cases = [("ingest_gpu_regions", lambda: gpu_case(batches, regions, cpu, dev, args))]
    if args.dry_run or Path(args.data).name in args.cpu_decode:
        cases.append(("ingest_cpu", lambda: bench_gpu.ingest_cpu_case(batches, args)))
    for case, run in cases:
        try:
            res["decode"][case] = run()
        except Exception as err:  # noqa: BLE001 - recorded, the other cases go on
            res["decode"][case] = {"error": f"{type(err).__name__}: {err}"}
        flush()
    cpu.close()


def random_crops(sizes, rng) -> "np.ndarray":
    """[n, 4] x0 y0 x1 y1 regions as RandomResizedCrop draws them (area 0.08-1, log-uniform ratio 3/4-4/3)."""
    import math
    import numpy as np
    out = np.zeros((len(sizes), 4), np.int64)
    for k, (h, w) in enumerate(sizes):
        for _ in range(10):
            area = h * w * rng.uniform(0.08, 1.0)
            ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
            if 0 < cw <= w and 0 < ch <= h:
                x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
                out[k] = (x0, y0, x0 + cw, y0 + ch)
                break
        else:
            out[k] = (0, 0, w, h)
    return out


def gpu_case(batches, regions, cpu, dev, args) -> dict:
    if dev.type != "cuda":
        raise RuntimeError("unavailable: needs a GPU")
    import torch
    from ingest.decode.gpu import GpuDecoder
    gpu = GpuDecoder(dev, cpu)
    stream = torch.cuda.Stream(dev)
    with torch.cuda.stream(stream):
        images, _, paths = gpu.decode_batch(*batches[0], rois=regions[0], stream=stream)
    first = {p: paths.count(p) for p in set(paths)}
    failed = sum(isinstance(im, BaseException) for im in images)

    def run(j, tid):
        with torch.cuda.stream(stream):
            images, _, _ = gpu.decode_batch(*batches[j], rois=regions[j], stream=stream)
        n = len(images) if not isinstance(images, list) else sum(not isinstance(im, BaseException) for im in images)
        gpu.recycle(images)   # the next batch decodes into its arena (a loader's ops stage does the same)
        return n

    r = bench_gpu.timed(run, len(batches), args, dev, 1)
    r.update(paths_first_batch=first, failed_in_first_batch=failed, fallbacks=dict(gpu.fallbacks),
             messages=gpu.messages[:20])
    gpu.close()
    return r


if __name__ == "__main__":
    sys.exit(main())
