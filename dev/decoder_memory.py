"""Developer script (device machine): how much GPU memory nvImageCodec itself holds for a loader's decoders.

Device-wide used memory (cudaMemGetInfo) minus what torch's allocator has reserved (the decode arenas), after
making ``--decoders`` GpuDecoders (as many as the Loader's lanes) and after each decodes ``--batches`` batches of
JPEGs from DATA_DIR with RandomResizedCrop-like regions, for each backend choice (``auto``: the
``hw_decoder_load`` split, ``hw``, ``hybrid``) and nvImageCodec CPU-thread count, each case in a fresh process
so nothing is left from the one before. A context's own memory is measured first, after a tiny torch
allocation, and taken off.

Usage: python dev/decoder_memory.py DATA_DIR OUT.json [--batch 256] [--batches 12] [--decoders 2]
    [--cases auto:8,hw:8,hybrid:8,auto:2]
"""

import argparse
import glob
import json
import subprocess
import sys

CASE = r'''
import glob, json, sys
import numpy as np
import ingest  # noqa: F401 - first: ingest's nvJPEG
import torch
from ingest.decode.cpu import CpuDecoder
from ingest.decode.gpu import GpuDecoder
data, backend, threads, decoders, batch, batches = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
    int(sys.argv[5]), int(sys.argv[6])
mb = lambda b: round(b / 2**20, 1)
def used():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free
torch.ones(1, device="cuda")
base = used() - torch.cuda.memory_reserved()
files = sorted(glob.glob(f"{data}/*/*.jpg"))[: batch * batches]
datas = [open(f, "rb").read() for f in files]
cpu = CpuDecoder(threads=4)
sizes = [cpu.probe(d, str(k)) for k, d in enumerate(datas)]
rng = np.random.default_rng(0)
rois = []
for h, w in sizes:
    area = rng.uniform(0.08, 1.0) * h * w
    cw, ch = min(w, int(area ** 0.5)), min(h, int(area ** 0.5))
    x0, y0 = rng.integers(0, w - cw + 1), rng.integers(0, h - ch + 1)
    rois.append((int(x0), int(y0), int(x0 + cw), int(y0 + ch)))
gpus = [GpuDecoder("cuda", cpu, backend=backend, cpu_threads=threads) for _ in range(decoders)]
streams = [torch.cuda.Stream() for _ in gpus]
made = used() - torch.cuda.memory_reserved() - base
paths = {}
for k in range(batches):
    lo = k * batch
    for gpu, stream in zip(gpus, streams):
        images, _, got = gpu.decode_batch(datas[lo:lo + batch], [str(i) for i in range(batch)],
                                          rois=rois[lo:lo + batch], stream=stream)
        for p in got:
            paths[p] = paths.get(p, 0) + 1
        stream.synchronize()
        gpu.recycle(images)   # an arena comes back for the next batch, as the loader's ops stage does
        del images
after = used() - torch.cuda.memory_reserved() - base
print(json.dumps({"backend": backend, "cpu_threads": threads, "decoders": decoders, "made_mb": mb(made),
                  "after_decoding_mb": mb(after), "torch_reserved_mb": mb(torch.cuda.memory_reserved()),
                  "paths": paths}))
'''


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--decoders", type=int, default=2)
    p.add_argument("--cases", default="auto:8,hw:8,hybrid:8,auto:2")
    a = p.parse_args()
    assert glob.glob(f"{a.data}/*/*.jpg"), f"no JPEGs under {a.data}/<class>/"
    rows = []
    for case in a.cases.split(","):
        backend, threads = case.split(":")
        done = subprocess.run([sys.executable, "-c", CASE, a.data, backend, threads, str(a.decoders), str(a.batch),
                               str(a.batches)], capture_output=True, text=True, timeout=300)
        row = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else \
            {"case": case, "error": done.stderr[-2000:]}
        print(row, flush=True)
        rows.append(row)
    with open(a.out, "w") as f:
        json.dump({"batch": a.batch, "batches": a.batches, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
