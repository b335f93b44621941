"""timm's ImageNet augmentation recipe feeding ResNet-50 training: ingest vs DALI's auto_aug vs a DataLoader.

Variants (each in its own subprocess, as bench_gpu.py runs them):

  i  ingest (decode mixed, device cuda): RandomResizedCrop(224) + flip + RandAugment(2, 9) + RandomErasing(0.25)
     + Normalize + MixUpCutMix(0.8, 1.0, switch 0.5, label smoothing 0.1): timm's recipe
  p  ingest, the same without MixUp/CutMix: the pairing with DALI
  d  DALI (pipeline_def with enable_conditionals): decoders.image_random_crop (mixed; area 0.08-1, aspect
     3/4-4/3) + resize 224 + auto_aug.rand_augment(n=2, m=9) + fn.erase under a 0.25 coin + crop_mirror_normalize
     (flip p 0.5, ImageNet mean and std), no MixUp
  t  torch DataLoader, --workers processes: ImageFolder (PIL) + torchvision v2 RandomResizedCrop, flip,
     RandAugment(2, 9), PILToTensor, RandomErasing(0.25) in the workers; on the GPU normalize and v2
     MixUp(0.8)/CutMix(1.0) (one chosen per batch, torchvision's reference recipe)
  s  synthetic: the same training loop on one constant batch already on the GPU (the ceiling)

The same work in every variant: RandAugment as torchvision's (its 14 ops and magnitude tables at bin 9 of 31,
signs drawn per op, nearest-neighbour geometry filled with 0), RandomErasing with timm's area (0.02-1/3) and
log-uniform aspect (0.3-3.3) ranges filling 0 in pixel units (DALI's erase fills a constant), a flip with
probability 0.5 and an ImageNet normalize to float32 NCHW. Where DALI differs: its rand_augment's translations
reach at most 101 px (``max_translate_abs``; torchvision's 150/331 of the 224 side), its solarize thresholds
run from 256 rather than 255; its erase draws one rectangle with sides clamped below the image's instead of
torchvision's up to 10 attempts rejecting those that do not fit (slightly more erased area at large aspect
ratios); it flips after RandAugment and the erase (crop_mirror_normalize), which draws the same distribution
since their geometry and rectangles are drawn symmetrically.

Each loader variant times the loader alone (--seconds) and then ResNet-50 training fed by it (--train-seconds;
bf16 autocast, channels_last, SGD, soft labels through CrossEntropyLoss), as bench_gpu.py does. The ingest
child also measures the GPU time the augmentation adds per batch (``augment_cost``): its ops on a batch of
decoded 375 x 500 images already on the GPU, RandomResizedCrop + flip + Normalize with and without RandAugment
+ RandomErasing + MixUpCutMix, timed with CUDA events, and each of the three alone on the cropped batch.

Derived: ``ingest_over_dali_train`` (p / d, issue 35 asks >= 1.2), ``ingest_over_dataloader_train`` (i / t,
issue 35 asks >= 5), the same ratios of the loader-only rates, and ``augment_gpu_ms_per_batch``.

    python benchmarks/bench_augment.py --data /dev/shm/ingest_bench_20k   # GPU (made there if absent); JSON in
                                                      # benchmarks/results/bench_augment/<device>/ or --out
    python benchmarks/bench_augment.py --dry-run      # CPU only, tiny sizes: every variant; DALI's on its CPU
                                                      # backend (the same operators) when nvidia.dali imports
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(HERE))

import bench_gpu  # noqa: E402 - after the path: this tree's ingest and the benchmark helpers
from bench_gpu import MEAN, NUM_CLASSES, STD, Feed, describe_batch, sync, train_phase  # noqa: E402

VARIANTS = {"i": "ingest_timm", "p": "ingest_no_mix", "d": "dali_rand_augment", "t": "dataloader_v2", "s": "synthetic"}
ORDER = "ipdts"
ERASE = dict(p=0.25, scale=(0.02, 1 / 3), ratio=(0.3, 3.3))   # timm's RandomErasing
TRANSLATE_PX = round(150 / 331 * 224)   # torchvision RandAugment's largest translation of a 224 side


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--data", default=None, help="ImageFolder JPEG directory; made with make_data.py if absent "
                                                "(default /dev/shm/ingest_bench_aug_<N>)")
    p.add_argument("--images", type=int, default=None, help="files to make when --data is absent (default 10000)")
    p.add_argument("--out", default=None, help="JSON file (default benchmarks/results/bench_augment/<device>/"
                                               "bench_augment.json)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 256)")
    p.add_argument("--threads", type=int, default=None, help="DALI threads (default 16)")
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers (default 16)")
    p.add_argument("--model", default=None, help="torchvision model (default resnet50)")
    p.add_argument("--seconds", type=float, default=None, help="loader-only timed window (default 5)")
    p.add_argument("--train-seconds", type=float, default=None, help="training timed window (default 10)")
    p.add_argument("--warmup-seconds", type=float, default=None, help="minimum warm-up (default 3)")
    p.add_argument("--warmup-batches", type=int, default=8)
    p.add_argument("--min-batches", type=int, default=10)
    p.add_argument("--max-batches", type=int, default=100000)
    p.add_argument("--only", default=None, help="comma-separated subset of i,p,d,t,s")
    p.add_argument("--dry-run", action="store_true", help="CPU only, tiny sizes (DALI is reported unavailable)")
    p.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    dry = a.dry_run
    defaults = dict(images=64 if dry else 10000, batch=8 if dry else 256, threads=2 if dry else 16,
                    workers=2 if dry else 16, model="mobilenet_v3_small" if dry else "resnet50",
                    seconds=1.0 if dry else 5.0, train_seconds=1.5 if dry else 10.0,
                    warmup_seconds=0.3 if dry else 3.0)
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if dry:
        a.warmup_batches, a.min_batches = min(a.warmup_batches, 1), min(a.min_batches, 2)
    if a.data is None:
        a.data = str(Path(tempfile.gettempdir()) / "ingest_bench_aug_dry") if dry else \
            f"/dev/shm/ingest_bench_aug_{a.images}"
    unknown = set((a.only or ORDER).replace(",", "")) - set(VARIANTS)
    if unknown:
        p.error(f"Unknown variant(s) {sorted(unknown)} in --only. Available: {', '.join(ORDER)}")
    return a


def device_slug(dry: bool) -> str:
    if dry:
        return "cpu-dry-run"
    name = bench_gpu._nvidia_smi_name() or "gpu"
    m = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]*)\b", name)
    return (m.group(1) if m else re.sub(r"[^A-Za-z0-9]+", "-", name)).lower()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    t_all = time.perf_counter()
    out = Path(args.out or REPO / "benchmarks" / "results" / "bench_augment" / device_slug(args.dry_run) /
               "bench_augment.json").resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    logdir = out.parent / (out.stem + "_logs")
    logdir.mkdir(exist_ok=True)
    made = None
    if not Path(args.data).is_dir():
        import make_data
        t0 = time.perf_counter()
        print(f"[bench_augment] making {args.images} images in {args.data} ...", flush=True)
        make_data.make_dataset(args.data, n=args.images, classes=min(100, args.images), seed=0,
                               workers=2 if args.dry_run else os.cpu_count())
        made = round(time.perf_counter() - t0, 1)
    args.data = str(Path(args.data).resolve())
    report = {"benchmark": "bench_augment", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "dry_run": args.dry_run,
              "argv": sys.argv[1:], "host": bench_gpu.host_info(), "versions": bench_gpu.versions(),
              "dataset": {**bench_gpu.dataset_stats(args.data), "made_seconds": made},
              "config": {k: v for k, v in vars(args).items() if not k.startswith("child")}, "results": {}}
    report["config"]["recipe"] = ("RandomResizedCrop(224) + flip 0.5 + RandAugment(2, 9) + RandomErasing(0.25, "
                                  "value 0) + normalize (ImageNet) + MixUp(0.8)/CutMix(1.0) (i, t); p and d without "
                                  "MixUp/CutMix")
    argfile = logdir / "args.json"
    argfile.write_text(json.dumps(vars(args)))
    for key in [k for k in ORDER if k in (args.only or ORDER)]:
        name = VARIANTS[key]
        print(f"[bench_augment] {key} {name} ...", flush=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", key]
        env = dict(os.environ, INGEST_BENCH_ARGS=str(argfile), PYTHONUNBUFFERED="1")
        budget = 3 * args.warmup_seconds + args.seconds + 2 * args.train_seconds + 100   # a hung child is killed
        res = bench_gpu.run_json_child(cmd, env, budget, logdir / f"{key}_{name}.log", name)
        report["results"][name] = res
        print(f"[bench_augment]   {bench_gpu._one_line(res)}", flush=True)
        report["derived"] = derive(report["results"])
        report["wall_seconds"] = round(time.perf_counter() - t_all, 1)
        bench_gpu._write(out, report)
    bench_gpu.finish_report(report, out, derive(report["results"]), t_all, args.dry_run)
    print(json.dumps({"device": report["device"], **report["derived"]}, indent=1))
    print(f"[bench_augment] wrote {out} ({report['wall_seconds']} s)")
    return 0


def derive(results: dict) -> dict:
    g = lambda name, *path: bench_gpu._get(results.get(name, {}), *path)  # noqa: E731
    r = bench_gpu._ratio
    return {"ingest_over_dali_train": r(g("ingest_no_mix", "train", "img_s"), g("dali_rand_augment", "train", "img_s")),
            "ingest_over_dataloader_train": r(g("ingest_timm", "train", "img_s"), g("dataloader_v2", "train", "img_s")),
            "ingest_over_dali_loader": r(g("ingest_no_mix", "img_s"), g("dali_rand_augment", "img_s")),
            "ingest_over_dataloader_loader": r(g("ingest_timm", "img_s"), g("dataloader_v2", "img_s")),
            "train_over_synthetic": {k: r(g(k, "train", "img_s"), g("synthetic", "train", "img_s"))
                                     for k in ("ingest_timm", "ingest_no_mix", "dali_rand_augment", "dataloader_v2")},
            "augment_gpu_ms_per_batch": g("ingest_timm", "augment_cost", "added_gpu_ms"),
            "augment_host_ms_per_batch": g("ingest_timm", "augment_cost", "added_host_ms"),
            "augment_parts_ms": g("ingest_timm", "augment_cost", "parts")}


# ==================================================================================================
# Children

def child_main(args) -> int:
    key, out_path = args.child, args.child_out
    args = bench_gpu.child_args(args)

    def run(dev, res, flush):
        import torch
        torch.backends.cudnn.benchmark = True
        if key == "s":
            synthetic(args, dev, res)
            return
        feed = {"i": lambda: build_ingest(args, dev, mix=True), "p": lambda: build_ingest(args, dev, mix=False),
                "d": lambda: build_dali(args, dev), "t": lambda: build_dataloader(args, dev)}[key]()
        measure(feed, args, dev, res, flush)
        if key == "i":
            try:
                res["augment_cost"] = augment_cost(args, dev, rounds=2 if args.dry_run else 20)
            except Exception as err:  # noqa: BLE001 - recorded, the figures above stand
                res["augment_cost"] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}

    return bench_gpu.run_in_child(VARIANTS[key], out_path, args.dry_run, run)


def ingest_ops(mix: bool, erase_value=0):
    import torch
    from ingest.ops import Flip, MixUpCutMix, Normalize, RandAugment, RandomErasing, RandomResizedCrop
    ops = [RandomResizedCrop(224), Flip(p=0.5), RandAugment(2, 9), RandomErasing(**ERASE, value=erase_value),
           Normalize(mean=MEAN, std=STD, dtype=torch.float32, layout="NCHW")]
    if mix:
        ops.append(MixUpCutMix(0.8, 1.0, num_classes=NUM_CLASSES, switch_prob=0.5, label_smoothing=0.1))
    return ops


def build_ingest(args, dev, mix: bool) -> Feed:
    import ingest
    loader = ingest.Loader(args.data, batch_size=args.batch, device=str(dev),
                           decode="mixed" if dev.type == "cuda" else "cpu", ops=ingest_ops(mix), shuffle=True,
                           seed=0, prefetch=2, last_batch="drop")
    return Feed(loader, lambda b: (b[0], b[1]), stats=loader.stats, close=getattr(loader, "close", None))


def build_dali(args, dev) -> Feed:
    """DALI's pipeline of the pairing (the docstring's ``d``). On CUDA it decodes "mixed" and runs the rest on
    the GPU; on the CPU (a dry run) the same operators with the same arguments run on DALI's CPU backend, so
    every one the GPU run uses has been checked."""
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali import math as dmath
        from nvidia.dali.auto_aug import rand_augment
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except Exception as err:  # noqa: BLE001 - ImportError, or a missing shared library
        raise RuntimeError(f"unavailable: {type(err).__name__}: {err}") from err
    cuda = dev.type == "cuda"

    def erase(images):
        """timm's RandomErasing rectangle on 224 x 224 images: area and log-aspect uniform, the sides clamped
        below the image's, the anchor uniform where the rectangle fits (normalized coordinates), fill 0."""
        area = fn.random.uniform(range=list(ERASE["scale"]))
        aspect = dmath.exp(fn.random.uniform(range=[math.log(ERASE["ratio"][0]), math.log(ERASE["ratio"][1])]))
        h = dmath.min(dmath.sqrt(area * aspect), 0.995)
        w = dmath.min(dmath.sqrt(area / aspect), 0.995)
        y = fn.random.uniform(range=[0.0, 1.0]) * (1.0 - h)
        x = fn.random.uniform(range=[0.0, 1.0]) * (1.0 - w)
        return fn.erase(images, anchor=fn.stack(y, x), shape=fn.stack(h, w), axis_names="HW",
                        normalized_anchor=True, normalized_shape=True, fill_value=0)

    @pipeline_def(enable_conditionals=True)
    def train(root, with_erase):
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="mixed" if cuda else "cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = rand_augment.rand_augment(images, n=2, m=9, fill_value=0, interp_type=types.INTERP_NN,
                                           max_translate_abs=TRANSLATE_PX)
        if with_erase:
            if fn.random.coin_flip(probability=ERASE["p"], dtype=types.BOOL):
                images = erase(images)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=MEAN, std=STD,
                                          mirror=fn.random.coin_flip(probability=0.5))
        return images, labels.gpu() if cuda else labels

    def build(with_erase: bool):
        pipe = train(root=args.data, with_erase=with_erase, batch_size=args.batch, num_threads=args.threads,
                     device_id=(dev.index or 0) if cuda else None, seed=0, prefetch_queue_depth=2)
        pipe.build()
        return pipe

    note = None
    try:
        pipe = build(True)
    except Exception as err:  # noqa: BLE001 - recorded: the figures then lack the erase, and say so
        note = f"erase unavailable ({type(err).__name__}: {str(err)[:300]}); DALI ran without RandomErasing"
        pipe = build(False)
    it = DALIGenericIterator([pipe], ["data", "label"], reader_name="Reader",
                             last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)
    feed = Feed(it, lambda b: (b[0]["data"], b[0]["label"].reshape(-1).long()), first_iter=it)
    feed.note = note
    return feed


def build_dataloader(args, dev) -> Feed:
    import torch
    import torchvision
    from torchvision.transforms import v2
    tf = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(), v2.RandAugment(2, 9),
                     v2.PILToTensor(), v2.RandomErasing(**ERASE, value=0)])
    ds = torchvision.datasets.ImageFolder(args.data, transform=tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                     pin_memory=dev.type == "cuda", drop_last=True, persistent_workers=True,
                                     prefetch_factor=2, multiprocessing_context="fork")
    mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1)
    inv_std = 1.0 / torch.tensor(STD, device=dev).view(1, 3, 1, 1)
    mix = v2.RandomChoice([v2.MixUp(alpha=0.8, num_classes=NUM_CLASSES), v2.CutMix(alpha=1.0, num_classes=NUM_CLASSES)])
    nb = dev.type == "cuda"

    def adapt(b):
        x = b[0].to(dev, non_blocking=nb).float().sub_(mean).mul_(inv_std)
        return mix(x, b[1].to(dev, non_blocking=nb))

    first = iter(dl)   # forks the workers now
    return Feed(dl, adapt, first_iter=first)


def measure(feed: Feed, args, dev, res: dict, flush) -> None:
    """The loader alone over a timed window after a warm-up, then training fed by it (bench_gpu's phases)."""
    gen = feed.endless()
    t0 = time.perf_counter()
    x, y = next(gen)
    sync(dev)
    res["first_batch_seconds"] = round(time.perf_counter() - t0, 3)
    res["check"] = describe_batch(x, y if y.dim() == 1 else y.argmax(1), args.batch)
    res["check"]["labels_shape"] = list(y.shape)
    if y.dim() == 2:
        res["check"]["soft_labels_sum_min"] = round(float(y.sum(1).min()), 5)
    if getattr(feed, "note", None):
        res["note"] = feed.note
    del x, y
    res.update(bench_gpu.loader_window(gen, args, dev))
    flush()
    if args.train_seconds > 0:
        res["train"] = train_phase(gen, args, dev)
        flush()
    if feed.stats is not None:
        res["loader_stats"] = bench_gpu.loader_stats(feed.stats)
    if feed.close is not None:
        feed.close()


def synthetic(args, dev, res: dict) -> None:
    import torch
    x = torch.randn(args.batch, 3, 224, 224, device=dev)
    y = torch.softmax(torch.randn(args.batch, NUM_CLASSES, device=dev), 1)

    def const():
        while True:
            yield x, y
    res["train"] = train_phase(const(), args, dev)


def augment_cost(args, dev, rounds: int = 20, source: tuple[int, int] = (375, 500)) -> dict:
    """GPU (CUDA events) and host time per batch of ingest's ops on a batch of decoded ``source`` (h, w) images
    already on the device, as the Loader runs them after decoding: RandomResizedCrop + flip + Normalize (the
    plain recipe, Normalize fused into the crop's warp) vs the same with RandAugment(2, 9) + RandomErasing(0.25)
    + MixUpCutMix (timm's: the policy and the erasing are stages of their own between the warp and Normalize).
    The difference is what the augmentation adds. ``parts``: each augmentation op alone on the cropped batch
    (224 x 224 uint8, MixUpCutMix on its float32 NCHW normalized form); ``rand_augment_torch_calls``: RandAugment's
    same draws by torch calls, the path CUDA takes without CuPy (RandAugment's own kernels otherwise)."""
    import numpy as np
    import torch
    from ingest.ops import plan
    from ingest.ops.augment import on_batches
    ops = ingest_ops(True)
    plain, full, mixer = ops[:2] + ops[4:5], ops[:5], ops[5]
    sizes = [source] * args.batch
    images = torch.randint(0, 256, (args.batch, *source, 3), dtype=torch.uint8, device=dev)
    labels = np.arange(args.batch) % NUM_CLASSES
    cuda = dev.type == "cuda"

    def run(chain, mix, seed):
        out = plan(chain, sizes, seed).execute(images)
        if mix:
            params = mixer.draw(sizes, seed)
            out = mixer.mix_images(out, params)
            mixer.mix_labels(labels, params)
        return out

    def timed(fn) -> dict:
        for k in range(3):
            fn(k)
        sync(dev)
        gpu, host = [], []
        for k in range(rounds):
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
            t0 = time.perf_counter()
            fn(100 + k)
            host.append(time.perf_counter() - t0)
            if cuda:
                end.record()
                gpu.append((begin, end))
        sync(dev)
        out = {"host_ms": round(1000 * sum(host) / rounds, 3)}
        if cuda:
            out["gpu_ms"] = round(sum(b.elapsed_time(e) for b, e in gpu) / rounds, 3)
        return out

    res = {"source_hw": list(source), "batch": args.batch, "rounds": rounds}
    for name, chain, mix in (("plain", plain, False), ("recipe", full, True)):
        res[name] = {"out_shape": list(run(chain, mix, 0).shape), **timed(lambda k: run(chain, mix, k))}
    for key in ("gpu_ms", "host_ms") if cuda else ("host_ms",):
        res[f"added_{key}"] = round(res["recipe"][key] - res["plain"][key], 3)
    cropped = plan(ops[:2], sizes, 0).execute(images)
    out_sizes = [tuple(cropped.shape[1:3])] * args.batch
    normalized = plan(ops[4:5], out_sizes, 0).execute(cropped)
    policy, erasing = ops[2], ops[3]

    def torch_calls(params):
        ops, mags = params
        return on_batches(cropped, lambda x, rows: policy._run_groups(x, ops[rows], mags[rows]))
    drawn = {name: [op.draw(out_sizes, 1000 + k) for k in range(rounds + 3)]
             for name, op in (("policy", policy), ("erasing", erasing), ("mix", mixer))}
    res["parts"] = {
        "rand_augment": timed(lambda k: policy.apply(cropped, drawn["policy"][k % len(drawn["policy"])])),
        "random_erasing": timed(lambda k: erasing.apply(cropped, drawn["erasing"][k % len(drawn["erasing"])])),
        "mix_images": timed(lambda k: mixer.mix_images(normalized, drawn["mix"][k % len(drawn["mix"])])),
        # the same draws as torch calls (what CUDA runs without CuPy): the policy kernels' gain
        "rand_augment_torch_calls": timed(lambda k: torch_calls(drawn["policy"][k % len(drawn["policy"])]))}
    return res


if __name__ == "__main__":
    sys.exit(main())
