"""Developer script: time each piece of the mixed pipeline on one batch, in isolation, then the whole Loader.
Usage: python tools/profile_stages.py DATA_DIR [--batch 256] [--out FILE.json]"""

import argparse
import json
import time

import numpy as np
import torch

import ingest
from ingest.formats import FileTree
from ingest.io import ByteReader
from ingest.ops import Flip, Normalize, RandomResizedCrop
from ingest.ops import planner
from ingest.decode.cpu import CpuDecoder
from ingest.decode.gpu import GpuDecoder
from profile_raw_loader import endless  # this folder, on sys.path when run as a script

MEAN, STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)


def timeit(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        out = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1000, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--out")
    a = ap.parse_args()
    src = FileTree(a.data)
    idx = np.random.default_rng(0).permutation(len(src))[:a.batch]
    locs = [src.locate(int(i)) for i in idx]
    names = [src.name(int(i)) for i in idx]
    res = {}
    for io in ("posix", "kvikio"):
        with ByteReader(io, pin=True) as r:
            res[f"read_{io}_ms"], datas = timeit(lambda: r.read(locs))
    cpu = CpuDecoder(threads=16)
    res["probe_ms"], (sizes, headers) = timeit(lambda: cpu.probe_batch(datas, names))
    ops = [RandomResizedCrop(224), Flip(p=0.5), Normalize(MEAN, STD)]
    rng = np.random.default_rng(0)
    res["plan_ms"], plan = timeit(lambda: planner.plan(ops, sizes, rng))
    res["roi_ms"], rois = timeit(lambda: plan.warp.roi())
    dev = torch.device("cuda", 0)
    stream = torch.cuda.Stream()
    for threads in (1, 2):
        gpu = GpuDecoder(dev, cpu, threads=threads)
        res[f"decode_full_t{threads}_ms"], _ = timeit(lambda: gpu.decode_batch(datas, names, stream=stream))
        res[f"decode_roi_t{threads}_ms"], (images, origins, paths) = timeit(
            lambda: gpu.decode_batch(datas, names, rois=rois, stream=stream, headers=headers))
    res["paths"] = {p: paths.count(p) for p in set(paths)}
    res["execute_ms"], out = timeit(lambda: plan.execute(images, origins=origins))
    res["out"] = [list(out.shape), str(out.dtype)]
    try:
        from nvidia import nvimgcodec
        dec = nvimgcodec.Decoder()
        raw = [bytes(d) for d in datas]
        res["nvimgcodec_raw_ms"], _ = timeit(lambda: dec.decode(raw, cuda_stream=stream.cuda_stream))
        cs = [nvimgcodec.CodeStream(b) for b in raw]
        res["codestream_make_ms"], _ = timeit(lambda: [nvimgcodec.CodeStream(b) for b in raw])
        subs = lambda: [c.get_sub_code_stream(region=nvimgcodec.Region(start=(r[1], r[0]), end=(r[3], r[2])))
                        for c, r in zip(cs, rois)]
        res["subcodestream_ms"], ss = timeit(subs)
        res["nvimgcodec_roi_ms"], _ = timeit(lambda: dec.decode(ss, cuda_stream=stream.cuda_stream))
    except Exception as e:  # noqa: BLE001
        res["nvimgcodec_err"] = repr(e)
    variants = [("posix", 8, 0), ("posix", 8, 1), ("posix", 8, 2), ("posix", 8, 3), ("posix", 8, 4)]
    for io, threads, workers in variants:
        free0 = torch.cuda.mem_get_info()[0]
        peak_used = 0
        with ingest.defaults.set(io_threads=threads):
            loader = ingest.Loader(a.data, batch_size=a.batch, device="cuda", ops=ops, shuffle=True, io=io,
                                   last_batch="drop", num_workers=workers)
        it = endless(loader)
        for _ in range(5):
            next(it)
        torch.cuda.synchronize()
        t, n = time.perf_counter(), 0
        while time.perf_counter() - t < a.seconds:
            n += len(next(it)[1])
            peak_used = max(peak_used, free0 - torch.cuda.mem_get_info()[0])
        torch.cuda.synchronize()
        key = f"loader_{io}_t{threads}_w{workers}"
        res[key + "_img_s"] = n / (time.perf_counter() - t)
        res[key + "_device_mb_over_start"] = round(peak_used / 2**20)
        res[key + "_ms_per_batch"] = {k: round(v["seconds"] / max(v["batches"], 1) * 1000, 2)
                                      for k, v in loader.stats()["stages"].items()}
        loader.close()
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
