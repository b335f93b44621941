"""Developer script: host time of planning a batch (no GPU needed), the per-batch Python work that sits
in front of the GPU ops on the raw-shard path.

Times, for one batch: the per-sample random source (``BatchPlan.sample_rngs``), ``planner.plan`` of
RandomResizedCrop + Flip + Normalize on fixed-size sources plus ``warp.roi()``, RandomIoUCrop + Resize on
ragged sources with boxes, and the warp kernel's host setup (``resample._setup`` + ``_warp_kernel.pack`` of a
``[B, H, W, 3]`` CPU tensor, the same code as on CUDA). Prints the minimum and median of ``--reps`` runs in
milliseconds; ``--cprofile`` adds the top functions of the RRC plan.

Usage: python tools/plan_profile.py [--batch 512] [--reps 50] [--cprofile] [--json FILE]
"""

import argparse
import cProfile
import json
import pstats
import time

import numpy as np
import torch

from ingest.ops import Flip, Normalize, RandomIoUCrop, RandomResizedCrop, Resize, _warp_kernel, planner
from ingest.ops.resample import _fill_values, _setup
from ingest.sampler import Sampler

MEAN, STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)


def timed(fn, reps: int) -> dict:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return {"min_ms": round(min(times), 3), "median_ms": round(float(np.median(times)), 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    bp = next(Sampler(1_000_000, a.batch, shuffle=True, seed=1).batches(0))
    rrc = [RandomResizedCrop(224), Flip(), Normalize(MEAN, STD, dtype=torch.float16)]
    fixed = [(256, 256)] * a.batch

    def plan_rrc():
        p = planner.plan(rrc, fixed, bp.sample_rngs())
        p.warp.roi()
        return p

    rng = np.random.default_rng(0)
    ragged = [(int(h), int(w)) for h, w in rng.integers(300, 640, (a.batch, 2))]
    boxes = []
    for h, w in ragged:
        xy = np.sort(rng.uniform(0, 1, (int(rng.integers(1, 8)), 2, 2)), axis=1)  # [K, (lo, hi), (x, y)]
        boxes.append(np.concatenate([xy[:, 0] * (w, h), xy[:, 1] * (w, h)], axis=1))
    iou = [RandomIoUCrop(), Resize((300, 300)), Flip()]
    images = torch.zeros((a.batch, 256, 256, 3), dtype=torch.uint8)
    warp = plan_rrc().warp

    def host_setup():
        _warp_kernel.pack(images, warp.out_sizes, _setup(warp, fixed), _fill_values(warp.fill, 3), None)

    res = {"batch": a.batch,
           "sample_rngs": timed(bp.sample_rngs, a.reps),
           "plan_rrc_flip_normalize+roi": timed(plan_rrc, a.reps),
           "plan_ioucrop_resize_flip": timed(lambda: planner.plan(iou, ragged, bp.sample_rngs(), boxes=boxes),
                                             a.reps),
           "warp_host_setup": timed(host_setup, a.reps)}
    for k, v in res.items():
        print(f"{k:32s} {v}")
    if a.cprofile:
        prof = cProfile.Profile()
        prof.runcall(lambda: [plan_rrc() for _ in range(a.reps)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
