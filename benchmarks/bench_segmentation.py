"""Semantic segmentation loading on one GPU: ingest vs NVIDIA DALI, images and their label maps (issue 33).

Measured: samples per second that each loader delivers to a consumer that takes every batch on the GPU. Timed
over a window after a warm-up (>= --warmup-batches and >= --warmup-seconds, which also drains what the loader
queued while starting), ended by a device synchronise. Every variant runs in its own subprocess (a fresh CUDA
context; a crash, a hang past its budget or a missing DALI is recorded as that variant's ``error`` and the
others go on). Shuffled, batch 32, last partial batch dropped; epoch restarts fall inside the window.

The same work on both sides, on both inputs: decode (the JPEG on the GPU, the PNG map on the CPU), RandomResizedCrop
512 (scale 0.08-1, ratio 3/4-4/3, 10 attempts; the image bilinear antialiased, the label map nearest, one crop
window for both), a horizontal flip p=0.5 (one draw for the image and its map), and ImageNet's Normalize on the
image only (mean 123.675/116.28/103.53, std 58.395/57.12/57.375 in pixel units, to float32 NCHW). Both sides
deliver, per batch, two device tensors of the same shapes and dtypes:

  images  float32 [32, 3, 512, 512] (NCHW, normalized)
  masks   uint8   [32, 512, 512]    (the class ids as stored: 0-20, 255 on outlines and where nothing was)

  ingest         ingest.Loader(DIR, decode="mixed", device="cuda", output="dict", ops=[RandomResizedCrop(512),
                 Flip(0.5), Normalize(mean, std)], features={"image": DeepLab's image key, "mask": (its map's
                 key, "mask")}: the two features DALI reads): ``images`` as above; the map a ``mask`` field,
                 decoded on the CPU beside the GPU's JPEG decode, warped with the image's maps and
                 left alone by Normalize (``mask``); default worker processes (none for GPU decode: the native
                 engine runs it, masks included; the variant's ``engine`` says which engine ran, and
                 ``native_why_not`` why not the native one)
  dali           DALI: readers.tfrecord(DeepLab's keys) -> decoders.image_random_crop(mixed, RGB) and
                 decoders.image_random_crop(mixed, GRAY) with one seed (the same crop window for both: each draws
                 its windows from the seed and the sample's shape, which agree) -> resize 512 (linear antialiased /
                 nearest) -> one coin_flip: crop_mirror_normalize(mirror, float32 CHW) on the image, flip on the
                 map; DALIGenericIterator (the map's trailing channel of one dropped by a view)
  ingest_images  as ingest reading only the images (features={"image": "image/encoded"}): what the maps cost
  dali_images    as dali without the label maps
  ingest_w4      as ingest with num_workers=4 (last: the variant the run can spare)

Each variant's ``check`` describes its first batch (shapes, dtypes, devices, the label values) and
``agreement``: the share of label-map pixels (outside 255) whose class is the one the image's colour there says
(the image de-normalized; each class is drawn in its own colour), so a loader whose maps do not follow its
images shows (a crop or flip the map misses drops it far below an aligned map's ~0.98). ``derived`` holds the
ratios (``ingest_over_dali``, ``ingest_images_over_dali_images``, ...), ``target_met`` (issue 33: ingest >= 1.2x
DALI on both inputs) and ``ingest_outputs_match_dali`` (and the images-only pair's: both sides' outputs of one
shape, dtype and device).

Data: ``--make-data DIR --n N`` makes a VOC-shaped set in DeepLab's TFRecord layout on this machine
(``image/encoded`` JPEG ~500x375 at quality 90, ``image/segmentation/class/encoded`` an 8-bit gray PNG of class
ids 0-20 with 255 outlines, as DeepLab's ``build_voc2012_data.py`` writes from VOC's raw label maps; 16 shards
with DALI indexes, written by ingest's own TFRecordWriter; ~47 KB a sample), on all cores, deterministic from
--seed; ``DIR.meta.json`` beside it records how long that took (the JSON's ``dataset.made``). Skipped when DIR
exists (it is built under a temporary name and renamed).

On the device, from the repository root (DALI on PYTHONPATH and nvImageCodec on LD_LIBRARY_PATH, see
../shared/device), the data first, then the variants (on SIGTERM the running variant is killed with its
workers and the file keeps the finished ones):

    timeout -k 5 150 python3 benchmarks/bench_segmentation.py --make-data /dev/shm/ingest_seg_voc20k --n 20000
    timeout -k 10 150 python3 benchmarks/bench_segmentation.py --data /dev/shm/ingest_seg_voc20k --seconds 8 \\
        --out $OUT/bench_segmentation/h200/bench_segmentation.json

Here, without a GPU:

    python benchmarks/bench_segmentation.py --dry-run --out /tmp/seg.json   # tiny CPU run of the code paths

The dry run runs DALI's graph on DALI's CPU backend (``device_id=None``, the CPU decoders: the same operators and
arguments as on the GPU) where DALI is importable, else records it unavailable.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import bench_gpu  # noqa: E402 - the shared environment, memory and output helpers

SIZE, SCALE, RATIO = 512, (0.08, 1.0), (3 / 4, 4 / 3)
MEAN, STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)   # ImageNet's, in pixel units (both loaders')
CLASSES = 21                 # PASCAL VOC: background + 20
IMAGE_KEY, MASK_KEY = "image/encoded", "image/segmentation/class/encoded"
SHARDS = 16
AUGMENTATION = (f"RandomResizedCrop {SIZE} (scale {list(SCALE)}, ratio 3/4-4/3, 10 attempts; image bilinear "
                f"antialiased, map nearest), horizontal flip p=0.5, one draw for the image and its map; Normalize "
                f"(ImageNet mean/std) on the image only. Out: images float32 [B, 3, {SIZE}, {SIZE}], masks uint8 "
                f"[B, {SIZE}, {SIZE}], on the device")
PIPELINES = {
    "ingest": "Loader(DIR, decode=mixed, device=cuda, ops=[RandomResizedCrop(512), Flip(0.5), Normalize], "
              "output=dict, features image + mask), the map a mask field (DeepLab's key), default num_workers",
    "dali": "readers.tfrecord -> decoders.image_random_crop(mixed, RGB) + decoders.image_random_crop(mixed, GRAY), one "
            "seed -> resize(512, linear antialias / nearest) -> coin_flip: crop_mirror_normalize(mirror, float CHW) "
            "on the image, flip on the map -> DALIGenericIterator",
    "ingest_images": "as ingest, features={'image': 'image/encoded'}: the images only",
    "dali_images": "as dali, the images only",
    "ingest_w4": "as ingest, num_workers=4",
}
VARIANTS = tuple(PIPELINES)
DRY_DATA = Path(tempfile.gettempdir()) / "ingest_bench_seg_dry"


# ==================================================================================================
# Data: a VOC-shaped set in DeepLab's TFRecord layout


def palette() -> "np.ndarray":
    """Each class's colour in the images (class 0 a dark gray): far apart, so the check can tell them."""
    import numpy as np
    g = np.random.default_rng(1234)
    return np.concatenate([[[40, 40, 40]], g.integers(70, 256, (CLASSES - 1, 3))]).astype(np.uint8)


def make_sample(i: int, seed: int) -> tuple[bytes, bytes]:
    """Sample ``i``: a ~500x375 JPEG of 1-6 ellipses and rectangles, each class in its colour over a background of
    class 0, with texture and noise, and its gray PNG label map (class ids, 255 along each object's outline)."""
    import numpy as np
    from PIL import Image, ImageDraw
    g = np.random.default_rng([seed, i])
    w, h = (500, int(g.integers(330, 376))) if g.random() < 0.7 else (int(g.integers(330, 376)), 500)
    label = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(label)
    for _ in range(int(g.integers(1, 7))):
        cls = int(g.integers(1, CLASSES))
        bw, bh = (int(v) for v in g.integers(40, min(w, h) * 3 // 4, 2))
        x, y = int(g.integers(0, w - bw)), int(g.integers(0, h - bh))
        (draw.ellipse if g.random() < 0.5 else draw.rectangle)([x, y, x + bw, y + bh], fill=cls, outline=255,
                                                                width=3)
    ids = np.asarray(label)
    colours = palette()[np.minimum(ids, CLASSES - 1)].astype(np.int16)
    colours[ids == 255] = 255
    noise = g.normal(0, 6, colours.shape) + 12 * np.sin(np.arange(w) / 9.0)[None, :, None]
    image = Image.fromarray(np.clip(colours + noise, 0, 255).astype(np.uint8))
    jpeg, png = io.BytesIO(), io.BytesIO()
    image.save(jpeg, "JPEG", quality=90)
    label.save(png, "PNG")
    return jpeg.getvalue(), png.getvalue()


def _write_shard(job: tuple[str, int, int, int, int]) -> int:
    from ingest.formats.base import Field, Record
    from ingest.formats.tfrecord import TFRecordWriter
    directory, k, start, stop, seed = job
    fields = {"image": Field("image"), "mask": Field("mask"), "image/height": Field("int"),
              "image/width": Field("int")}
    writer = TFRecordWriter(directory, f"train-{k:05d}-of-{SHARDS:05d}", fields, keys={"mask": MASK_KEY})
    size = 0
    for i in range(start, stop):
        jpeg, png = make_sample(i, seed)
        from PIL import Image
        with Image.open(io.BytesIO(png)) as im:
            w, h = im.size
        writer.add(Record(jpeg, fields={"mask": png, "image/height": h, "image/width": w}))
        size += len(jpeg) + len(png)
    writer.close()
    return size


def make_voc(out: str, n: int, *, seed: int = 0, workers: int | None = None) -> dict:
    """``SHARDS`` TFRecord shards of ``n`` samples (`make_sample`) at ``out``, built under a temporary name and
    renamed. Returns the set's statistics, also written to ``out.meta.json`` beside it (``seconds``: the making's
    wall time on ``workers`` processes), which `voc_stats` reads back."""
    out = os.path.abspath(out)
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    bounds = [(n * k // SHARDS, n * (k + 1) // SHARDS) for k in range(SHARDS)]
    t0 = time.perf_counter()
    workers = workers or os.cpu_count() or 1
    with mp.get_context("fork").Pool(workers) as pool:
        sizes = pool.map(_write_shard, [(tmp, k, a, b, seed) for k, (a, b) in enumerate(bounds)], chunksize=1)
    os.rename(tmp, out)
    made = {"seed": seed, "bytes_per_sample": round(sum(sizes) / max(n, 1), 1), "workers": workers,
            "seconds": round(time.perf_counter() - t0, 1)}
    Path(out + ".meta.json").write_text(json.dumps(made))
    return voc_stats(out)


def shards(root: str) -> list[str]:
    return sorted(str(p) for p in Path(root).glob("*.tfrecord"))


def voc_stats(root: str) -> dict:
    files = shards(root)
    total = sum(os.path.getsize(f) for f in files)
    count = sum(len(Path(f + ".idx").read_text().split("\n")) - 1 for f in files)
    out = {"path": root, "n": count, "shards": len(files), "total_mb": round(total / 2 ** 20, 1),
           "mean_record_kb": round(total / max(count, 1) / 1e3, 1)}
    meta = Path(root.rstrip("/") + ".meta.json")
    if meta.exists():
        out["made"] = json.loads(meta.read_text())
    return out


def ensure_data(out: str, n: int, seed: int) -> None:
    if shards(out):
        print(f"[bench_segmentation] {out} exists: kept", flush=True)
        return
    stats = make_voc(out, n, seed=seed)
    print(f"[bench_segmentation] made {out}: {json.dumps(stats)}", flush=True)


# ==================================================================================================
# Parent: runs each variant in a subprocess, derives ratios, prints, writes JSON


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--data", help="a set made by --make-data (TFRecord shards in DeepLab's layout)")
    p.add_argument("--out", help="JSON file to write (logs go next to it)")
    p.add_argument("--make-data", metavar="DIR", help="make the set at DIR and exit unless --out is given")
    p.add_argument("--n", type=int, default=20000, help="samples in --make-data's set (default 20000)")
    p.add_argument("--seed", type=int, default=0, help="--make-data's seed (default 0)")
    bench_gpu.add_window_options(p, VARIANTS, seconds=8.0)
    a = p.parse_args(argv)
    bench_gpu.window_defaults(a)
    if min(a.batch, a.threads, a.n) < 1:
        p.error(f"`--batch`, `--threads` and `--n` must be >= 1, got {a.batch}, {a.threads}, {a.n}")
    if a.out is None and a.make_data is None and a.child is None:
        p.error("--out is required (unless only --make-data is asked for)")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    if args.make_data:
        ensure_data(args.make_data, args.n, args.seed)
        if args.out is None:
            return 0
        args.data = args.data or args.make_data
    if args.data is None or not shards(args.data):
        if not args.dry_run:
            print(f"--data {args.data!r} holds no TFRecord shards (make them with --make-data)", file=sys.stderr)
            return 2
        args.data = args.data or str(DRY_DATA)
        if not shards(args.data):
            make_voc(args.data, 48, seed=0, workers=2)
    args.data = str(Path(args.data).resolve())
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    logdir = out.parent / (out.stem + "_logs")
    logdir.mkdir(exist_ok=True)
    chosen = bench_gpu.choose_variants(args.only, VARIANTS)
    config = {k: v for k, v in vars(args).items() if not k.startswith("child") and k != "make_data"}
    config.update(augmentation=AUGMENTATION, pipelines={k: PIPELINES[k] for k in chosen})
    report = {"benchmark": "bench_segmentation", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "dry_run": args.dry_run, "argv": sys.argv[1:], "host": bench_gpu.host_info(),
              "versions": bench_gpu.versions(), "dataset": voc_stats(args.data), "config": config,
              "results": {}}
    # in the file before the first variant, so that a run cut short still names its device and set
    report["device"] = "cpu (dry run)" if args.dry_run else bench_gpu._nvidia_smi_name()
    out.write_text(json.dumps(report, indent=1, default=str))
    argfile = logdir / "args.json"
    argfile.write_text(json.dumps(vars(args)))
    signal.signal(signal.SIGTERM, _end_children)
    t_all = time.perf_counter()

    # A variant's start (interpreter, CUDA context, workers, DALI's build, first batch) takes seconds; more than a
    # minute past its window is a hang, cut short so that the variants after it still run.
    budget = args.warmup_seconds + args.seconds + (120 if args.dry_run else 60)

    def child(name, log):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--child-args", str(argfile)]
        res = bench_gpu.run_json_child(cmd, dict(os.environ, PYTHONUNBUFFERED="1"), budget, log, name)
        print(f"[bench_segmentation]   {_one_line(res)}", flush=True)
        return res

    bench_gpu.run_rounds("bench_segmentation", chosen, args, report, out, child, derive)
    bench_gpu.finish_report(report, out, derive(report["results"]), t_all, args.dry_run)
    print_table(report)
    print(f"[bench_segmentation] wrote {out} ({report['wall_seconds']} s)")
    return 0


def _end_children(signum, frame) -> None:
    """On SIGTERM (an outer ``timeout``): kill the running variant's process group, which its own session keeps
    out of this one's reach, so that nothing of it goes on holding the GPU; the file keeps the finished variants."""
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = stat.read_text().rsplit(") ", 1)[1].split()[1]   # after the name: state, ppid, ...
        except (OSError, IndexError):
            continue
        if ppid == me:
            try:
                os.killpg(int(stat.parent.name), signal.SIGKILL)   # a variant leads its own group
            except OSError:
                pass
    raise SystemExit(128 + signum)


def derive(results: dict) -> dict:
    g = lambda name: (results.get(name) or {}).get("img_s")  # noqa: E731
    r = bench_gpu._ratio
    best = max(g("ingest") or 0, g("ingest_w4") or 0) or None
    out = {"ingest_over_dali": r(g("ingest"), g("dali")), "ingest_w4_over_dali": r(g("ingest_w4"), g("dali")),
           "ingest_best_over_dali": r(best, g("dali")),
           "ingest_images_over_dali_images": r(g("ingest_images"), g("dali_images")),
           "ingest_masks_cost": r(g("ingest"), g("ingest_images")), "dali_masks_cost": r(g("dali"), g("dali_images"))}
    if out["ingest_over_dali"] is not None:
        out["target_met"] = out["ingest_over_dali"] >= 1.2   # issue 33: >= 1.2x DALI on both inputs
    for ours, theirs in (("ingest", "dali"), ("ingest_images", "dali_images")):
        a, b = ((results.get(k) or {}).get("check") for k in (ours, theirs))
        if a and b:   # [shape, dtype, device] of each output
            out[f"{ours}_outputs_match_{theirs}"] = all(a.get(k) == b.get(k) for k in ("images", "masks"))
    return out


def _one_line(res: dict) -> str:
    if res.get("error"):
        return f"ERROR {res['error'][:300]}"
    c = res.get("check") or {}
    return (f"{res.get('img_s')} samples/s; first batch: images {c.get('images')}, masks {c.get('masks')}, "
            f"agreement {c.get('agreement')} ({res.get('child_seconds')} s)")


def print_table(report: dict) -> None:
    ds, cfg = report["dataset"], report["config"]
    print(f"\n{report.get('device')}  |  {ds.get('n')} samples, {ds.get('mean_record_kb')} KB a record  |  batch "
          f"{cfg['batch']}, DALI threads {cfg['threads']}")
    print(f"{'variant':<15}{'img/s':>9}{'batches':>9}{'peak MB':>9}  check / note")
    for name, res in report["results"].items():
        c = res.get("check") or {}
        mem = (res.get("memory") or {}).get("device_peak_mb")
        note = ("ERROR " + res["error"][:70].replace("\n", " ")) if res.get("error") else \
            f"masks={c.get('masks')} agreement={c.get('agreement')}"
        print(f"{name:<15}{bench_gpu._fmt(res.get('img_s')):>9}{bench_gpu._fmt(res.get('batches')):>9}"
              f"{bench_gpu._fmt(mem):>9}  {note}")
    print("ratios: " + ", ".join(f"{k}={v}" for k, v in report["derived"].items() if v is not None))


# ==================================================================================================
# Child: one variant


def child_main(args) -> int:
    return bench_gpu.variant_child(args, run_variant)


def run_variant(name: str, args, dev, res: dict, flush) -> None:
    mem = bench_gpu.MemSampler(dev)
    res["memory"] = {"method": mem.describe()}
    build = {"ingest": lambda: build_ingest(args, dev, workers=None),
             "ingest_w4": lambda: build_ingest(args, dev, workers=4),
             "ingest_images": lambda: build_ingest(args, dev, workers=None, masks=False),
             "dali": lambda: build_dali(args, dev, masks=True),
             "dali_images": lambda: build_dali(args, dev, masks=False)}[name]
    t0 = time.perf_counter()
    mem.start()
    loader = build()
    gen = loader.endless()
    res["build_seconds"] = round(time.perf_counter() - t0, 3)
    res.update(loader.info)
    t0 = time.perf_counter()
    images, masks = next(gen)
    bench_gpu.sync(dev)
    res["first_batch_seconds"] = round(time.perf_counter() - t0, 3)
    if loader.stats is not None:   # which of ingest's engines runs the variant (the native one where eligible)
        stats = bench_gpu.loader_stats(loader.stats)
        res["engine"] = stats.get("engine") if isinstance(stats, dict) else stats
    res["check"] = describe_batch(images, masks)
    flush()
    res.update(bench_gpu.loader_window(gen, args, dev))   # warm-up, then the timed window
    mem.stop()
    res["memory"].update(mem.result())
    if loader.stats is not None:
        res["loader_stats"] = bench_gpu.loader_stats(loader.stats)
    flush()
    if loader.close is not None:
        loader.close()


def describe_batch(images, masks) -> dict:
    """Shapes, dtypes and devices of one batch, the label values, and how far the maps agree with their images:
    each label pixel (outside 255) against the class whose colour is nearest the image's pixel there (the image
    de-normalized first)."""
    import torch
    x = images.float().cpu()
    if x.shape[-1] == 3:   # NHWC -> NCHW (neither loader gives it; kept for a loader that would)
        x = x.permute(0, 3, 1, 2)
    if images.dtype.is_floating_point:
        x = x * torch.tensor(STD)[:, None, None] + torch.tensor(MEAN)[:, None, None]
    out = {"images": [list(images.shape), str(images.dtype), str(images.device)]}
    if masks is None:
        return out
    m = masks.cpu().to(torch.int64).reshape(x.shape[0], *x.shape[2:])
    colours = torch.from_numpy(palette()).float()
    nearest = ((x.permute(0, 2, 3, 1)[..., None, :] - colours) ** 2).sum(-1).argmin(-1)
    labelled = m != 255
    agree = (nearest == m) & labelled
    out.update(masks=[list(masks.shape), str(masks.dtype), str(masks.device)],
               values=sorted(set(torch.unique(m).tolist()))[:24],
               agreement=round(float(agree.sum() / labelled.sum().clamp(min=1)), 3))
    return out


# -- the loaders -------------------------------------------------------------------------------------


def build_ingest(args, dev, workers: int | None, masks: bool = True) -> bench_gpu.Feed:
    """images float32 [B, 3, 512, 512] and masks uint8 [B, 512, 512] (None with ``masks=False``) on ``dev``."""
    import ingest
    from ingest.ops import Flip, Normalize, RandomResizedCrop
    # the two features DALI's reader is given too (the records' image/height and image/width are not asked for:
    # as fields, the output dict would carry them, and the native engine collates only the image and its mask)
    options = {"features": {"image": IMAGE_KEY, **({"mask": (MASK_KEY, "mask")} if masks else {})}}
    loader = ingest.Loader(args.data, batch_size=args.batch, device=str(dev),
                           decode="mixed" if dev.type == "cuda" else "cpu", shuffle=True, seed=0, output="dict",
                           last_batch="drop", num_workers=workers, reader_options=options,
                           ops=[RandomResizedCrop(SIZE, scale=SCALE, ratio=RATIO), Flip(p=0.5), Normalize(MEAN, STD)])
    f = bench_gpu.Feed(loader, lambda b: (b["images"], b.get("mask")), stats=loader.stats, close=loader.close)
    f.info = {"num_workers": loader.num_workers, "worker_stages": loader.worker_stages,
              "native_why_not": loader.native_why_not}
    if dev.type != "cuda":
        f.info["note"] = "dry run: mixed decode needs CUDA, ran decode='cpu'"
    return f


def build_dali(args, dev, masks: bool) -> bench_gpu.Feed:
    """DALI's pipeline: images float32 [B, 3, 512, 512] and masks uint8 [B, 512, 512] (None with ``masks=False``)
    on ``dev``. On a dry run (no GPU) the same graph, every operator with the same arguments, on DALI's CPU
    backend: ``device_id=None`` and the decoders on ``cpu`` instead of ``mixed``."""
    cuda = dev.type == "cuda"
    decode = "mixed" if cuda else "cpu"
    try:
        import nvidia.dali.tfrecord as tfrec
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except Exception as err:  # noqa: BLE001 - ImportError, or a missing shared library
        raise RuntimeError(f"unavailable: {type(err).__name__}: {err}") from err
    files = shards(args.data)
    # One seed for both decoders: each draws a sample's window from its own generator (seeded from this) and the
    # sample's shape, and the image and its map have one shape, so the windows are the same.
    crop = dict(random_area=list(SCALE), random_aspect_ratio=list(RATIO), num_attempts=10, seed=1234)

    @pipeline_def
    def segmentation():
        features = {IMAGE_KEY: tfrec.FixedLenFeature((), tfrec.string, "")}
        if masks:
            features[MASK_KEY] = tfrec.FixedLenFeature((), tfrec.string, "")
        inputs = fn.readers.tfrecord(path=files, index_path=[f + ".idx" for f in files], features=features,
                                     random_shuffle=True, name="Reader")
        flip = fn.random.coin_flip(probability=0.5)
        images = fn.decoders.image_random_crop(inputs[IMAGE_KEY], device=decode, output_type=types.RGB, **crop)
        images = fn.resize(images, size=[SIZE, SIZE], interp_type=types.INTERP_LINEAR, antialias=True)
        images = fn.crop_mirror_normalize(images, mirror=flip, mean=list(MEAN), std=list(STD), dtype=types.FLOAT,
                                          output_layout="CHW")
        if not masks:
            return images
        labels = fn.decoders.image_random_crop(inputs[MASK_KEY], device=decode, output_type=types.GRAY, **crop)
        labels = fn.resize(labels, size=[SIZE, SIZE], interp_type=types.INTERP_NN, antialias=False)
        return images, fn.flip(labels, horizontal=flip)

    pipe = segmentation(batch_size=args.batch, num_threads=args.threads, device_id=(dev.index or 0) if cuda else None,
                        seed=0, prefetch_queue_depth=2)
    pipe.build()
    names = ["images", "masks"] if masks else ["images"]
    it = DALIGenericIterator([pipe], names, reader_name="Reader", last_batch_policy=LastBatchPolicy.DROP,
                             auto_reset=True)

    def adapt(batch):   # images NCHW; maps [B, H, W, 1] -> [B, H, W], a view
        b = batch[0]
        return b["images"], (b["masks"][..., 0] if masks else None)

    f = bench_gpu.Feed(it, adapt, first_iter=it)
    f.info = {"threads": args.threads} if cuda else {"threads": args.threads, "note": "dry run: DALI's CPU backend"}
    return f


if __name__ == "__main__":
    sys.exit(main())
