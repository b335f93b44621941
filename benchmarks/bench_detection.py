"""COCO-style detection loading on one GPU: ingest vs NVIDIA DALI vs torchvision (issue 8).

Measured: images per second that each loader delivers to a consumer that takes every batch's images, boxes
and labels in the loader's own batched form: ingest and DALI a list of GPU images (each padded to its own
size) plus boxes [B, K, 4] and labels [B, K] padded on the GPU, torchvision lists of per-image tensors
moved to the GPU. Timed over a window after a warm-up (>= --warmup-batches and >= --warmup-seconds, which
also drains what the loader queued while starting), ended by a device synchronise. Every variant runs in
its own subprocess (a fresh CUDA context; a crash, a hang or a missing DALI is recorded as that variant's
``error`` and the others go on). Shuffled, batch 32, last partial batch dropped; epoch restarts fall
inside the window.

The same augmentation everywhere, the SSD/Detectron recipe: IoU-constrained random crop (no-crop or a
minimum IoU of 0, .1, .3, .5, .7, .9; scale 0.3-1; aspect 0.5-2; 50 attempts), horizontal flip p=0.5,
resize shorter side 800 capped at longer side 1333 (bilinear, antialiased), pad bottom/right to a multiple
of 32 (per image). Output uint8 images, boxes ltrb.

  ingest       ingest.Loader(instances.json, decode="mixed", device="cuda", ops=[RandomIoUCrop, Flip,
               Resize(800, max_size=1333), PadTo(multiple=32)], output="dict", ragged=True: images a list), its
               default worker processes
               (none: detection runs in the training process, on the native engine where eligible: each
               variant's ``engine`` and ``native_why_not`` say which ran and why); the check splits targets with
               `ingest.torch.detection_targets`
  ingest_w0    the same with num_workers=0 (one process; the default's setting, named)
  ingest_w4    the same with num_workers=4 (the default before detection ran in the training process)
  ingest_read  the same with num_workers=4, worker_stages="read" (workers only read; one CUDA context)
  ingest_batch the same with PadTo(multiple=32, batch=True): one [B, 3, H, W] tensor padded to the batch's
               largest image, plus image_sizes (torchvision's ImageList; the other variants pad per image)
  ingest_w6, ingest_batch_w6  those two with num_workers=6 (as a DataLoader user
               sets num_workers; DALI here gets 16 threads)
  dali         DALI: readers.coco(ltrb, ratio) -> random_bbox_crop (cpu) -> decoders.image(mixed) -> slice
               -> flip + bb_flip (coin_flip) -> resize(resize_shorter=800, max_size=1333) -> pad(align 32,
               per image); boxes and labels padded (pad, -1); DALIRaggedIterator (images a list)
  dali_roi     the same with the crop fused into the decode (decoders.image_slice: DALI's fastest form)
  dali_batch   the same padded to the batch's largest image (pad with no minimum shape): one dense tensor,
               the counterpart of ingest_batch
  torchvision  CocoDetection + wrap_dataset_for_transforms_v2 + transforms.v2 (ToImage, RandomIoUCrop,
               RandomHorizontalFlip, Resize(800, max_size=1333), SanitizeBoundingBoxes), padding in the
               collate, DataLoader with --workers processes, pin_memory, images and targets moved to the GPU

The same samples packed as Object Detection API TFRecords (DIR/tfrecord, written by ``ingest convert``: the
image, ``image/object/bbox/{xmin,ymin,xmax,ymax}`` normalized, ``image/object/class/label``, ``is_crowd``,
``area``, ``image/source_id``, ``image/height``/``width``), the same augmentation:

  ingest_tfrecord         as ingest over DIR/tfrecord (the ``engine`` setting "auto": the native engine scans each
                          record's boxes where eligible; ``engine``, ``native_why_not`` and ``loader_stats`` say
                          which ran)
  ingest_tfrecord_python  the same with the ``engine`` setting "python" (the Python stages read the records)
  dali_tfrecord           DALI: readers.tfrecord(the OD keys) -> stack(xmin, ymin, xmax, ymax) as relative ltrb
                          boxes -> the rest of ``dali``'s graph
  dali_tfrecord_roi       the same with ``dali_roi``'s fused crop and decode

``derived`` holds each ingest variant over its DALI counterpart, and issue 32's figures: ``ingest`` (its
default, detection in the training process) over the fastest DALI variant (``ingest_over_dali_best_any``, target
>= 1.2) and its device memory over that variant's (``ingest_memory_over_dali_best``, target <= 1.5), both in
``target_32_met``.

Each variant's ``check`` describes its first batch (image shapes and layout, pixel mean, box count, boxes
inside their image, label range), so a pipeline that is fast because it is wrong shows. DALI's boxes are
relative (``ratio=True``: random_bbox_crop and bb_flip need them so, and a resize leaves them unchanged).

Data: ``--make-data DIR --from JPEG_TREE --n N`` links the first N JPEGs of an ImageFolder tree
(benchmarks/make_data.py; made there first when JPEG_TREE is absent) into DIR/images and writes
DIR/instances.json: real sizes from the JPEG headers, 3-7 random boxes per image (COCO's 80 non-contiguous
category ids, polygon = the box), deterministic from --seed. Skipped when DIR exists (it is built under a
temporary name and renamed, so a present DIR is complete). It then packs the set into DIR/tfrecord (`ingest
convert` to TFRecord on every core, one shard per core, the polygons dropped), as does a run of a TFRecord
variant over a DIR without it; a DIR/tfrecord with its manifest.json is complete and kept. An all-PNG tree
(make_data.py --png-frac 1.0) as --from makes the same set of PNGs (their sizes from the PNG headers).

On the device (DALI on PYTHONPATH, see ../shared/device; torchvision's CocoDetection needs pycocotools):

    python3 benchmarks/bench_detection.py --make-data /dev/shm/coco10k --from /dev/shm/ingest_bench_20k --n 10000
    python3 benchmarks/bench_detection.py --data /dev/shm/coco10k --out $OUT/bench_detection.json \
        --only ingest,ingest_batch,dali,dali_roi,dali_batch --seconds 6     # issue 32's figures
    python3 benchmarks/bench_detection.py --data /dev/shm/coco10k --out $OUT/bench_detection_tfrecord.json \
        --only ingest_tfrecord,ingest_tfrecord_python,dali_tfrecord,dali_tfrecord_roi,ingest,dali_roi --seconds 4

Making the set takes a few seconds (headers read on every core). Each variant takes its window and warm-up plus
its start (a new process, its CUDA context and the loader's build). Here, without a GPU:

    python benchmarks/bench_detection.py --dry-run --out /tmp/det.json   # tiny CPU run of the code paths

The dry run runs DALI's graph on DALI's CPU backend where DALI is importable (the same operators and arguments,
decoders on the CPU instead of "mixed", no copies to the GPU), else records it unavailable.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_gpu  # noqa: E402 - the shared environment, memory and output helpers

#: COCO 2017's 80 category ids (1..90 with gaps), so contiguous-id remapping is exercised as on COCO.
COCO_IDS = tuple(i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83))
MIN_IOUS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)   # plus "no crop"
CROP_SCALE, CROP_ASPECT, CROP_ATTEMPTS = (0.3, 1.0), (0.5, 2.0), 50
SHORTER, MAX_SIZE, ALIGN = 800, 1333, 32
AUGMENTATION = (f"IoU crop (no crop or min IoU {list(MIN_IOUS)}, scale {list(CROP_SCALE)}, aspect "
                f"{list(CROP_ASPECT)}, {CROP_ATTEMPTS} attempts), horizontal flip p=0.5, resize shorter "
                f"{SHORTER} max {MAX_SIZE} (bilinear, antialias), pad bottom/right to a multiple of {ALIGN}; uint8")
PIPELINES = {
    "ingest": "Loader(instances.json, box_format=ltrb, decode=mixed, device=cuda, ops=[RandomIoUCrop, Flip(0.5), "
              "Resize(800, max_size=1333), PadTo(multiple=32)], output=dict, default num_workers) + detection_targets",
    "ingest_w0": "as ingest, num_workers=0",
    "ingest_w4": "as ingest, num_workers=4",
    "ingest_read": "as ingest, num_workers=4, worker_stages='read' (workers read and plan; decode and ops in this "
                   "process)",
    "ingest_batch": "as ingest, PadTo(multiple=32, batch=True): one padded [B, 3, H, W] tensor + image_sizes",
    "ingest_w6": "as ingest, num_workers=6",
    "ingest_batch_w6": "as ingest_batch, num_workers=6",
    "dali": "readers.coco(ltrb, ratio, skip_empty, random_shuffle) -> random_bbox_crop(cpu) -> decoders.image(mixed) "
            "-> slice -> coin_flip: flip + bb_flip -> resize(resize_shorter=800, max_size=1333) -> "
            "pad(HW, align 32, per image) -> DALIRaggedIterator lists",
    "dali_roi": "as dali, the crop fused into the decode: decoders.image_slice(mixed)",
    "dali_batch": "as dali, pad(HW, align 32) to the batch's largest image: one dense [B, H, W, 3] tensor "
                  "(DALIRaggedIterator DENSE_TAG), the counterpart of ingest_batch",
    "torchvision": "CocoDetection + wrap_dataset_for_transforms_v2 + v2 [ToImage, RandomIoUCrop, RandomHorizontalFlip, "
                   "Resize(800, max_size=1333), SanitizeBoundingBoxes], pad in collate, DataLoader(--workers, "
                   "pin_memory, fork), .to(cuda, non_blocking)",
    "ingest_tfrecord": "as ingest over DIR/tfrecord (Object Detection API records), the engine setting 'auto'",
    "ingest_tfrecord_python": "as ingest_tfrecord, the engine setting 'python'",
    "dali_tfrecord": "as dali, readers.tfrecord(image/encoded, image/object/bbox/{xmin,ymin,xmax,ymax}, "
                     "image/object/class/label; random_shuffle) -> stack(axis=1): relative ltrb boxes",
    "dali_tfrecord_roi": "as dali_tfrecord, the crop fused into the decode: decoders.image_slice(mixed)",
}
VARIANTS = tuple(PIPELINES)
TFRECORD_VARIANTS = tuple(k for k in VARIANTS if "tfrecord" in k)   # over DIR/tfrecord
DRY_JPEGS = Path(tempfile.gettempdir()) / "ingest_bench_det_dry_jpegs"
DRY_DATA = Path(tempfile.gettempdir()) / "ingest_bench_det_dry"


# ==================================================================================================
# Data: a COCO-shaped set over an existing JPEG tree


def _image_size(path: str) -> tuple[int, int]:
    from PIL import Image
    with Image.open(path) as im:  # reads the header only
        return im.size


def make_coco(out: str, source: str, n: int, *, seed: int = 0, workers: int | None = None) -> dict:
    """Link the first ``n`` images of the ImageFolder tree ``source`` into ``out``/images and write
    ``out``/instances.json (see the module docstring). Returns the set's statistics."""
    import numpy as np
    out = os.path.abspath(out)
    files = bench_gpu.list_files(source)
    if len(files) < n:
        raise SystemExit(f"--from {source} holds {len(files)} images, fewer than --n {n}")
    files = files[:n]
    t0 = time.perf_counter()
    workers = workers or os.cpu_count() or 1
    with mp.get_context("fork").Pool(workers) as pool:
        sizes = pool.map(_image_size, files, chunksize=max(1, n // (8 * workers)))
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "images"))
    rng = np.random.default_rng(seed)
    images, annotations, linked = [], [], "hard links"
    for i, (path, (w, h)) in enumerate(zip(files, sizes)):
        name = f"{i:06d}{os.path.splitext(path)[1].lower()}"
        dst = os.path.join(tmp, "images", name)
        try:
            os.link(path, dst)
        except OSError:  # another file system, or links not allowed: a symlink reads the same
            os.symlink(os.path.abspath(path), dst)
            linked = "symlinks"
        images.append({"id": i + 1, "file_name": name, "width": w, "height": h})
        k = int(rng.integers(3, 8))
        u = rng.random((k, 4))
        bw, bh = np.floor((0.05 + 0.45 * u[:, 0]) * w * 100) / 100, np.floor((0.05 + 0.45 * u[:, 1]) * h * 100) / 100
        x, y = np.floor(u[:, 2] * (w - bw) * 100) / 100, np.floor(u[:, 3] * (h - bh) * 100) / 100
        cats = rng.choice(COCO_IDS, size=k)
        for j in range(k):
            x0, y0, x1, y1 = float(x[j]), float(y[j]), round(float(x[j] + bw[j]), 2), round(float(y[j] + bh[j]), 2)
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": int(cats[j]),
                                "bbox": [x0, y0, float(bw[j]), float(bh[j])], "area": round(float(bw[j] * bh[j]), 2),
                                "iscrowd": 0, "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]]})
    doc = {"info": {"description": f"bench_detection.py: {n} images of {source}, random boxes, seed {seed}"},
           "licenses": [], "images": images, "annotations": annotations,
           "categories": [{"id": c, "name": f"class_{c}", "supercategory": "none"} for c in COCO_IDS]}
    with open(os.path.join(tmp, "instances.json"), "w") as f:
        json.dump(doc, f)
    os.rename(tmp, out)
    stats = coco_stats(out)
    stats.update(source=os.path.abspath(source), seed=seed, linked=linked, seconds=round(time.perf_counter() - t0, 1))
    return stats


def coco_stats(root: str) -> dict:
    doc = json.loads(Path(root, "instances.json").read_text())
    ims = doc["images"]
    sizes = [os.path.getsize(os.path.join(root, "images", im["file_name"])) for im in ims]
    n = max(len(ims), 1)
    return {"path": root, "n": len(ims), "annotations": len(doc["annotations"]),
            "boxes_per_image": round(len(doc["annotations"]) / n, 2), "categories": len(doc["categories"]),
            "mean_width": round(sum(im["width"] for im in ims) / n, 1),
            "mean_height": round(sum(im["height"] for im in ims) / n, 1),
            "mean_bytes": round(sum(sizes) / n, 1), "total_mb": round(sum(sizes) / 2 ** 20, 1)}


def make_tfrecord(root: str, *, workers: int | None = None) -> dict:
    """Pack the COCO set at ``root`` into ``root``/tfrecord with `ingest convert` (the Object Detection API's
    layout, one shard per worker, the polygons dropped) unless its manifest is there. Returns its statistics."""
    dst = os.path.join(root, "tfrecord")
    if not os.path.isfile(os.path.join(dst, "manifest.json")):
        from ingest.tools.convert import convert
        workers = workers or os.cpu_count() or 1
        n = len(json.loads(Path(root, "instances.json").read_text())["images"])
        t0 = time.perf_counter()
        convert(os.path.join(root, "instances.json"), dst, to="tfrecord", source_format="coco",
                source_options={"images": os.path.join(root, "images")}, drop_fields=["segmentation"],
                shard_size=max(1, -(-n // workers)), workers=workers, progress=False)
        print(f"[bench_detection] packed {root} into {dst} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return tfrecord_stats(dst)


def tfrecord_stats(dst: str) -> dict:
    shards = sorted(Path(dst).glob("*.tfrecord"))
    return {"path": dst, "shards": len(shards), "total_mb": round(sum(p.stat().st_size for p in shards) / 2 ** 20, 1)}


def ensure_data(out: str, source: str, n: int, seed: int) -> None:
    """--make-data: the COCO set at ``out`` over the JPEG tree ``source`` (made first when absent), all cores,
    and its TFRecord copy."""
    if os.path.exists(os.path.join(out, "instances.json")):
        print(f"[bench_detection] {out} exists: kept", flush=True)
    else:
        if not os.path.isdir(source):
            import make_data
            print(f"[bench_detection] {source} is absent: making {n} JPEGs there (make_data.py)", flush=True)
            make_data.make_dataset(source, n=n, classes=min(100, n), seed=seed)
        stats = make_coco(out, source, n, seed=seed)
        print(f"[bench_detection] made {out}: {json.dumps(stats)}", flush=True)
    make_tfrecord(out)


# ==================================================================================================
# Parent: runs each variant in a subprocess, derives ratios, prints, writes JSON


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--data", help="a COCO-shaped set made by --make-data (DIR/instances.json, DIR/images)")
    p.add_argument("--out", help="JSON file to write (logs go next to it)")
    p.add_argument("--make-data", metavar="DIR", help="make a COCO-shaped set at DIR (from --from) and exit "
                                                      "unless --out is given")
    p.add_argument("--from", dest="source", metavar="JPEG_TREE", default="/dev/shm/ingest_bench_20k",
                   help="ImageFolder JPEG tree for --make-data (made by make_data.py when absent)")
    p.add_argument("--n", type=int, default=10000, help="images in --make-data's set (default 10000)")
    p.add_argument("--seed", type=int, default=0, help="--make-data's seed (default 0)")
    p.add_argument("--workers", type=int, default=None, help="torchvision DataLoader workers (default 16)")
    bench_gpu.add_window_options(p, VARIANTS, seconds=8.0)
    a = p.parse_args(argv)
    bench_gpu.window_defaults(a, workers=(16, 2))
    if min(a.batch, a.threads, a.workers, a.n) < 1:
        p.error(f"`--batch`, `--threads`, `--workers` and `--n` must be >= 1, got {a.batch}, {a.threads}, "
                f"{a.workers}, {a.n}")
    if a.out is None and a.make_data is None and a.child is None:
        p.error("--out is required (unless only --make-data is asked for)")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    if args.make_data:
        ensure_data(args.make_data, args.source, args.n, args.seed)
        if args.out is None:
            return 0
        args.data = args.data or args.make_data
    if args.data is None or not Path(args.data, "instances.json").is_file():
        if not args.dry_run:
            print(f"--data {args.data!r} holds no instances.json (make one with --make-data)", file=sys.stderr)
            return 2
        args.data = args.data or str(DRY_DATA)
        if not Path(args.data, "instances.json").is_file():
            import make_data
            if not DRY_JPEGS.is_dir():
                make_data.make_dataset(str(DRY_JPEGS), n=24, classes=2, seed=0, workers=2)
            make_coco(args.data, str(DRY_JPEGS), 24, seed=0, workers=2)
    args.data = str(Path(args.data).resolve())
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    logdir = out.parent / (out.stem + "_logs")
    logdir.mkdir(exist_ok=True)
    chosen = bench_gpu.choose_variants(args.only, VARIANTS)
    dataset = coco_stats(args.data)
    if set(chosen) & set(TFRECORD_VARIANTS):
        dataset["tfrecord"] = make_tfrecord(args.data, workers=2 if args.dry_run else None)
    config = {k: v for k, v in vars(args).items() if not k.startswith("child") and k not in ("make_data", "source")}
    config["augmentation"] = AUGMENTATION
    config["pipelines"] = {k: PIPELINES[k] for k in chosen}
    report = {"benchmark": "bench_detection", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "dry_run": args.dry_run, "argv": sys.argv[1:], "host": bench_gpu.host_info(), "versions": versions(),
              "dataset": dataset, "config": config, "results": {}}
    argfile = logdir / "args.json"
    argfile.write_text(json.dumps(vars(args)))
    t_all = time.perf_counter()

    def child(name, log):
        res = run_child(name, args, argfile, log)
        print(f"[bench_detection]   {_one_line(res)}", flush=True)
        return res

    bench_gpu.run_rounds("bench_detection", chosen, args, report, out, child, derive)
    bench_gpu.finish_report(report, out, derive(report["results"]), t_all, args.dry_run)
    print_table(report)
    print(f"[bench_detection] wrote {out} ({report['wall_seconds']} s)")
    return 0


def versions() -> dict:
    from importlib import metadata
    out = bench_gpu.versions()
    try:
        out["pycocotools"] = metadata.version("pycocotools")
    except metadata.PackageNotFoundError:
        out["pycocotools"] = None
    return out


def run_child(name: str, args, argfile: Path, log: Path) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--child-args", str(argfile)]
    return bench_gpu.run_json_child(cmd, dict(os.environ, PYTHONUNBUFFERED="1"),
                                    args.warmup_seconds + args.seconds + 60, log, name)


def derive(results: dict) -> dict:
    g = lambda name: (results.get(name) or {}).get("img_s")  # noqa: E731
    r = bench_gpu._ratio
    best_dali = max(g("dali") or 0, g("dali_roi") or 0) or None
    out = {"ingest_over_dali": r(g("ingest"), g("dali")), "ingest_over_dali_roi": r(g("ingest"), g("dali_roi")),
           "ingest_over_dali_best": r(g("ingest"), best_dali),
           "ingest_over_torchvision": r(g("ingest"), g("torchvision")),
           "dali_over_torchvision": r(g("dali"), g("torchvision")),
           "ingest_w0_over_dali": r(g("ingest_w0"), g("dali")), "ingest_w0_over_ingest": r(g("ingest_w0"), g("ingest")),
           "ingest_over_ingest_w4": r(g("ingest"), g("ingest_w4")), "ingest_w4_over_dali": r(g("ingest_w4"), g("dali")),
           "ingest_read_over_dali": r(g("ingest_read"), g("dali")),
           "ingest_batch_over_dali": r(g("ingest_batch"), g("dali")),
           "ingest_batch_over_dali_batch": r(g("ingest_batch"), g("dali_batch")),
           "ingest_w6_over_dali": r(g("ingest_w6"), g("dali")),
           "ingest_batch_w6_over_dali_batch": r(g("ingest_batch_w6"), g("dali_batch")),
           # the TFRecord copy: the native engine's record scan against the Python stages and against DALI
           "ingest_tfrecord_over_ingest_tfrecord_python": r(g("ingest_tfrecord"), g("ingest_tfrecord_python")),
           "ingest_tfrecord_over_dali_tfrecord": r(g("ingest_tfrecord"), g("dali_tfrecord")),
           "ingest_tfrecord_over_dali_tfrecord_best": r(g("ingest_tfrecord"),
                                                        max(g("dali_tfrecord") or 0, g("dali_tfrecord_roi") or 0)
                                                        or None),
           "ingest_tfrecord_python_over_dali_tfrecord": r(g("ingest_tfrecord_python"), g("dali_tfrecord")),
           "ingest_tfrecord_over_ingest": r(g("ingest_tfrecord"), g("ingest")),
           "dali_tfrecord_over_dali": r(g("dali_tfrecord"), g("dali"))}
    # issue 8: >= 1.0x DALI in the same run, each output form against DALI's counterpart; with the default
    # number of workers, and with 6
    out["ingest_w6_over_dali_best"] = r(g("ingest_w6"), best_dali)
    out.update(issue_32(results))
    for key, pair in (("target_met", ("ingest_over_dali_best", "ingest_batch_over_dali_batch")),
                      ("target_met_w6", ("ingest_w6_over_dali_best", "ingest_batch_w6_over_dali_batch"))):
        met = [out[k] >= 1.0 for k in pair if out[k] is not None]
        if met:
            out[key] = all(met)
    return out


def issue_32(results: dict) -> dict:
    """Issue 32's figures: ingest's default (detection in the training process, no worker processes) against
    the fastest of DALI's variants, in speed (target >= 1.2) and device memory (target <= 1.5); and the
    batch-padded forms against each other."""
    def get(name, *path):
        v = results.get(name) or {}
        for key in path:
            v = v.get(key) if isinstance(v, dict) else None
        return v

    mem = lambda name: get(name, "memory", "device_peak_mb")  # noqa: E731
    ran = [k for k in ("dali", "dali_roi", "dali_batch") if get(k, "img_s")]
    best = max(ran, key=lambda k: get(k, "img_s")) if ran else None
    out = {"dali_best_variant": best, "ingest_num_workers": get("ingest", "num_workers"),
           "ingest_over_dali_best_any": bench_gpu._ratio(get("ingest", "img_s"), get(best, "img_s")),
           "ingest_memory_over_dali_best": bench_gpu._ratio(mem("ingest"), mem(best)),
           "ingest_batch_memory_over_dali_batch": bench_gpu._ratio(mem("ingest_batch"), mem("dali_batch"))}
    speed, memory = out["ingest_over_dali_best_any"], out["ingest_memory_over_dali_best"]
    if speed is not None and memory is not None:
        out["target_32_met"] = speed >= 1.2 and memory <= 1.5 and out["ingest_num_workers"] == 0
    return out


def _one_line(res: dict) -> str:
    if res.get("error"):
        return f"ERROR {res['error'][:300]}"
    c = res.get("check") or {}
    return (f"{res.get('img_s')} img/s; first batch: {c.get('images')} images {c.get('shapes', [])[:2]}..., "
            f"{c.get('boxes')} boxes, inside {c.get('boxes_inside')} ({res.get('child_seconds')} s)")


def print_table(report: dict) -> None:
    ds, cfg = report["dataset"], report["config"]
    print(f"\n{report.get('device')}  |  {ds.get('n')} images, {ds.get('boxes_per_image')} boxes each, mean "
          f"{(ds.get('mean_bytes') or 0) / 1e3:.1f} KB  |  batch {cfg['batch']}, DALI threads {cfg['threads']}, "
          f"DataLoader workers {cfg['workers']}")
    print(f"{'variant':<23}{'img/s':>9}{'batches':>9}{'peak MB':>9}{'boxes/img':>11}  check / note")
    for name, res in report["results"].items():
        c = res.get("check") or {}
        mem = (res.get("memory") or {}).get("device_peak_mb")
        note = ("ERROR " + res["error"][:70].replace("\n", " ")) if res.get("error") else \
            f"inside={c.get('boxes_inside')} aligned={c.get('aligned')} {c.get('layout')}"
        stats = res.get("loader_stats")
        note += f" engine={stats['engine']}" if isinstance(stats, dict) and stats.get("engine") else ""
        per = round(c["boxes"] / c["images"], 2) if c.get("images") else None
        print(f"{name:<23}{bench_gpu._fmt(res.get('img_s')):>9}{bench_gpu._fmt(res.get('batches')):>9}"
              f"{bench_gpu._fmt(mem):>9}{bench_gpu._fmt(per, 2):>11}  {note}")
    print("ratios: " + ", ".join(f"{k}={v}" for k, v in report["derived"].items() if v is not None))


# ==================================================================================================
# Child: one variant


def child_main(args) -> int:
    return bench_gpu.variant_child(args, run_variant)


def run_variant(name: str, args, dev, res: dict, flush) -> None:
    mem = bench_gpu.MemSampler(dev)
    res["memory"] = {"method": mem.describe()}
    build = {"ingest": lambda: build_ingest(args, dev, workers=None),
             "ingest_w0": lambda: build_ingest(args, dev, workers=0),
             "ingest_w4": lambda: build_ingest(args, dev, workers=4),
             "ingest_read": lambda: build_ingest(args, dev, workers=4, stages="read"),
             "ingest_batch": lambda: build_ingest(args, dev, workers=None, batch_pad=True),
             "ingest_w6": lambda: build_ingest(args, dev, workers=6),
             "ingest_batch_w6": lambda: build_ingest(args, dev, workers=6, batch_pad=True),
             "dali": lambda: build_dali(args, dev, roi=False), "dali_roi": lambda: build_dali(args, dev, roi=True),
             "dali_batch": lambda: build_dali(args, dev, roi=False, batch_pad=True),
             "torchvision": lambda: build_torchvision(args, dev),
             "ingest_tfrecord": lambda: build_ingest(args, dev, workers=None, tfrecord=True),
             "ingest_tfrecord_python": lambda: build_ingest(args, dev, workers=None, tfrecord=True, engine="python"),
             "dali_tfrecord": lambda: build_dali(args, dev, roi=False, tfrecord=True),
             "dali_tfrecord_roi": lambda: build_dali(args, dev, roi=True, tfrecord=True)}[name]
    t0 = time.perf_counter()
    if name != "torchvision":
        mem.start()
    loader = build()
    mem.start()   # after the DataLoader forked its workers (a no-op when already running)
    gen = loader.endless()
    res["build_seconds"] = round(time.perf_counter() - t0, 3)
    res.update(loader.info)

    t0 = time.perf_counter()
    images, targets = next(gen)
    bench_gpu.sync(dev)
    res["first_batch_seconds"] = round(time.perf_counter() - t0, 3)
    res["check"] = describe_batch(images, loader.per_image(targets), relative=loader.relative_boxes)
    flush()
    res.update(bench_gpu.loader_window(gen, args, dev))   # warm-up, then the timed window
    mem.stop()
    res["memory"].update(mem.result())
    if loader.stats is not None:
        res["loader_stats"] = bench_gpu.loader_stats(loader.stats)
    flush()
    if loader.close is not None:
        loader.close()


def feed(iterable, adapt, per_image, *, relative_boxes=False, info=None, **kw) -> bench_gpu.Feed:
    """bench_gpu's Feed: epochs of raw batches, ``adapt`` taking one to (images, targets) on the device in the
    loader's own batched form (what the timed loop touches); plus ``per_image`` (targets -> one
    ``{"boxes", "labels"}`` dict per image, for the first batch's check), whether boxes are relative, and
    what to record."""
    f = bench_gpu.Feed(iterable, adapt, info=info, **kw)
    f.per_image, f.relative_boxes = per_image, relative_boxes
    return f


def describe_batch(images, targets, *, relative: bool) -> dict:
    """Shapes, layout and pixel mean of one batch's images, and whether its boxes lie inside their images:
    a pipeline that is fast because it is wrong shows here."""
    import torch
    ims = list(images)
    chw = ims[0].dim() == 3 and ims[0].shape[0] == 3 and ims[0].shape[-1] != 3
    hw = [tuple(im.shape[1:]) if chw else tuple(im.shape[:2]) for im in ims]
    inside, total, labels = True, 0, []
    for (h, w), t in zip(hw, targets):
        b = t["boxes"].float().cpu()
        total += len(b)
        labels += t["labels"].reshape(-1).tolist()
        if len(b):
            lim = torch.tensor([1.0, 1.0, 1.0, 1.0]) if relative else torch.tensor([w, h, w, h], dtype=torch.float32)
            ok = (b >= -1e-3).all() and (b <= lim + 1e-3).all() and (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all()
            inside = inside and bool(ok)
    return {"images": len(ims), "layout": "CHW" if chw else "HWC", "dtype": str(ims[0].dtype),
            "device": str(ims[0].device), "shapes": [list(s) for s in hw[:4]],
            "min_hw": [min(s[0] for s in hw), min(s[1] for s in hw)],
            "max_hw": [max(s[0] for s in hw), max(s[1] for s in hw)],
            "aligned": all(h % ALIGN == 0 and w % ALIGN == 0 for h, w in hw),
            "pixel_mean": round(float(sum(im.float().mean() for im in ims) / len(ims)), 2),
            "boxes": total, "boxes_relative": relative, "boxes_inside": inside,
            "boxes_device": str(targets[0]["boxes"].device) if targets else None,
            "labels_min": min(labels) if labels else None, "labels_max": max(labels) if labels else None}


# -- the loaders -------------------------------------------------------------------------------------


def build_ingest(args, dev, workers: int | None, stages: str = "auto", batch_pad: bool = False,
                 tfrecord: bool = False, engine: str | None = None) -> bench_gpu.Feed:
    """ingest's Loader over the COCO set, or with ``tfrecord`` over its TFRecord copy; ``engine`` sets the
    ``engine`` setting for this process (None: the default, "auto")."""
    import ingest
    from ingest import defaults
    from ingest.ops import Flip, PadTo, RandomIoUCrop, Resize
    from ingest.torch import detection_targets
    if engine is not None:
        defaults.set(engine=engine)   # the whole child: the Loader reads it at build and at every iter()
    ops = [RandomIoUCrop(min_ious=(None, *MIN_IOUS), scale=CROP_SCALE, aspect=CROP_ASPECT, attempts=CROP_ATTEMPTS),
           Flip(p=0.5), Resize(SHORTER, max_size=MAX_SIZE), PadTo(multiple=ALIGN, batch=batch_pad)]
    if tfrecord:
        where, options = os.path.join(args.data, "tfrecord"), {"box_format": "ltrb"}
    else:
        where = os.path.join(args.data, "instances.json")
        options = {"images": os.path.join(args.data, "images"), "box_format": "ltrb"}
    loader = ingest.Loader(where, reader_options=options, batch_size=args.batch, device=str(dev), decode="mixed" if dev.type == "cuda" else "cpu",
                           ops=ops, shuffle=True, seed=0, output="dict", last_batch="drop", num_workers=workers,
                           worker_stages=stages, ragged=not batch_pad)
    # the engine that runs it (ingest.native: detection in the training process runs natively where eligible)
    info = {"num_workers": loader.num_workers, "worker_stages": loader.worker_stages, "engine": loader.engine,
            "engine_setting": defaults.get("engine"), "native_why_not": loader.native_why_not,
            "source": type(loader.source).__name__}
    if dev.type != "cuda":
        info["note"] = "dry run: mixed decode needs CUDA, ran decode='cpu'"
        info["native_chain_why_not"] = bench_gpu.native_chain(loader.source, ops)

    def adapt(batch):  # images, and boxes [B, K, 4] / categories [B, K] padded, with boxes_lengths [B]
        return batch["images"], {k: batch[k] for k in ("boxes", "categories", "boxes_lengths")}

    return feed(loader, adapt, detection_targets, stats=loader.stats, close=loader.close, info=info)


def build_dali(args, dev, roi: bool, batch_pad: bool = False, tfrecord: bool = False) -> bench_gpu.Feed:
    """DALI's pipeline over the COCO set, or with ``tfrecord`` over its TFRecord copy (the OD API's keys; the
    boxes stored normalized, so relative ltrb as readers.coco's with ``ratio``); on a dry run (no GPU), where
    DALI is importable, the same graph on DALI's CPU backend (cpu decode, ``device_id=None``), which checks
    every operator argument."""
    cuda = dev.type == "cuda"
    decode = "mixed" if cuda else "cpu"
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIRaggedIterator, LastBatchPolicy
    except Exception as err:  # noqa: BLE001 - ImportError, or a missing shared library (OSError/RuntimeError)
        raise RuntimeError(f"unavailable: {type(err).__name__}: {err}") from err

    def tfrecords():
        import nvidia.dali.tfrecord as tfrec
        files = sorted(str(p) for p in Path(args.data, "tfrecord").glob("*.tfrecord"))
        features = {"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                    "image/object/class/label": tfrec.VarLenFeature(tfrec.int64, -1),
                    **{f"image/object/bbox/{k}": tfrec.VarLenFeature(tfrec.float32, 0.0)
                       for k in ("xmin", "ymin", "xmax", "ymax")}}
        out = fn.readers.tfrecord(path=files, index_path=[f + ".idx" for f in files], features=features,
                                  random_shuffle=True, name="Reader")   # the converter writes DALI's indexes
        bboxes = fn.stack(*(out[f"image/object/bbox/{k}"] for k in ("xmin", "ymin", "xmax", "ymax")), axis=1)
        return out["image/encoded"], bboxes, fn.cast(out["image/object/class/label"], dtype=types.INT32)

    @pipeline_def
    def detection(root: str, annotations: str):
        if tfrecord:
            jpegs, bboxes, labels = tfrecords()
        else:
            jpegs, bboxes, labels = fn.readers.coco(file_root=root, annotations_file=annotations, ltrb=True,
                                                    ratio=True, skip_empty=True, random_shuffle=True, name="Reader")
        anchor, shape, bboxes, labels = fn.random_bbox_crop(
            bboxes, labels, device="cpu", aspect_ratio=list(CROP_ASPECT), thresholds=list(MIN_IOUS),
            scaling=list(CROP_SCALE), bbox_layout="xyXY", allow_no_crop=True, num_attempts=CROP_ATTEMPTS)
        if roi:
            images = fn.decoders.image_slice(jpegs, anchor, shape, device=decode, output_type=types.RGB)
        else:
            images = fn.decoders.image(jpegs, device=decode, output_type=types.RGB)
            images = fn.slice(images, anchor, shape, out_of_bounds_policy="trim_to_shape")
        flip = fn.random.coin_flip(probability=0.5)
        images = fn.flip(images, horizontal=flip)
        bboxes = fn.bb_flip(bboxes, ltrb=True, horizontal=flip)
        images = fn.resize(images, resize_shorter=SHORTER, max_size=MAX_SIZE)
        if batch_pad:   # no shape: to the batch's largest image, then to a multiple of 32
            images = fn.pad(images, axis_names="HW", align=[ALIGN, ALIGN])
        else:   # shape (1, 1) is a minimum: each image padded to its own multiple of 32
            images = fn.pad(images, axis_names="HW", align=[ALIGN, ALIGN], shape=[1, 1])
        bboxes = fn.pad(bboxes, fill_value=-1.0, axes=[0])   # [B, K, 4] and [B, K] padded with -1, as ingest's
        labels = fn.pad(labels, fill_value=-1, axes=[0])
        return (images, bboxes.gpu(), labels.gpu()) if cuda else (images, bboxes, labels)

    pipe = detection(root=os.path.join(args.data, "images"), annotations=os.path.join(args.data, "instances.json"),
                     batch_size=args.batch, num_threads=args.threads, device_id=(dev.index or 0) if cuda else None, seed=0,
                     prefetch_queue_depth=2)
    pipe.build()
    dense = DALIRaggedIterator.DENSE_TAG
    it = DALIRaggedIterator([pipe], ["images", "boxes", "labels"],
                            output_types=[dense if batch_pad else DALIRaggedIterator.SPARSE_LIST_TAG, dense, dense],
                            reader_name="Reader", last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)

    def adapt(batch):  # a list of images; boxes and labels padded
        b = batch[0]
        return b["images"], {"boxes": b["boxes"], "labels": b["labels"]}

    def per_image(t):
        labels = t["labels"].reshape(t["labels"].shape[0], -1)
        return [{"boxes": t["boxes"][n, :k], "labels": labels[n, :k]} for n, k in enumerate((labels >= 0).sum(1).tolist())]

    info = {"threads": args.threads} if cuda else {"threads": args.threads, "note": "dry run: DALI's CPU backend"}
    return feed(it, adapt, per_image, relative_boxes=True, first_iter=it, info=info)


def build_torchvision(args, dev) -> bench_gpu.Feed:
    import torch
    from torchvision import datasets
    from torchvision.transforms import v2
    tf = v2.Compose([
        v2.ToImage(),
        v2.RandomIoUCrop(min_scale=CROP_SCALE[0], max_scale=CROP_SCALE[1], min_aspect_ratio=CROP_ASPECT[0],
                         max_aspect_ratio=CROP_ASPECT[1], sampler_options=[*MIN_IOUS, 1.0], trials=CROP_ATTEMPTS),
        v2.RandomHorizontalFlip(p=0.5),
        v2.Resize(SHORTER, max_size=MAX_SIZE, antialias=True),
        v2.SanitizeBoundingBoxes(),
    ])
    ds = datasets.CocoDetection(os.path.join(args.data, "images"), os.path.join(args.data, "instances.json"),
                                transforms=tf)
    ds = datasets.wrap_dataset_for_transforms_v2(ds, target_keys={"boxes", "labels"})
    cuda = dev.type == "cuda"
    dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                     collate_fn=pad_collate, pin_memory=cuda, drop_last=True, persistent_workers=True,
                                     prefetch_factor=2, multiprocessing_context="fork")
    first = iter(dl)  # forks the workers now, before the memory sampler thread starts

    def adapt(batch):
        images = [im.to(dev, non_blocking=cuda) for im, _ in batch]
        return images, [{"boxes": t["boxes"].to(dev, non_blocking=cuda), "labels": t["labels"].to(dev, non_blocking=cuda)}
                        for _, t in batch]

    return feed(dl, adapt, lambda targets: targets, first_iter=first, info={"workers": args.workers})


def pad_collate(batch):
    """Pad each image bottom/right to a multiple of ALIGN (its boxes stay put); the batch stays a list of
    (image [3, H, W] uint8, {"boxes", "labels"}), as torchvision's detection references collate."""
    import torch
    import torch.nn.functional as F
    out = []
    for image, target in batch:
        h, w = image.shape[-2:]
        image = F.pad(image.as_subclass(torch.Tensor), (0, -w % ALIGN, 0, -h % ALIGN))
        out.append((image, {"boxes": target["boxes"].as_subclass(torch.Tensor), "labels": target["labels"]}))
    return out


if __name__ == "__main__":
    sys.exit(main())
