"""Developer script: run the mixed-decode training Loader for a while (for profilers such as py-spy).
Usage: python tools/loader_loop.py DATA_DIR [SECONDS] [memory]   ('memory': preload the files first)"""
import sys
import time

import torch

import ingest
from ingest.formats import FileTree
from ingest.ops import Flip, Normalize, RandomResizedCrop

data, seconds = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 10
source = data
if "memory" in sys.argv[3:]:
    tree = FileTree(data)
    source = ingest.MemorySource([open(tree.name(i), "rb").read() for i in range(len(tree))], tree.labels())
ops = [RandomResizedCrop(224), Flip(p=0.5), Normalize((123.7, 116.3, 103.5), (58.4, 57.1, 57.4))]
loader = ingest.Loader(source, batch_size=256, device="cuda", ops=ops, shuffle=True, last_batch="drop")
t, n = time.perf_counter(), 0
while time.perf_counter() - t < seconds:
    for x, y in loader:
        n += len(y)
torch.cuda.synchronize()
print(f"{n / (time.perf_counter() - t):.0f} img/s", {k: round(v["seconds"] / max(v["batches"], 1) * 1000, 2)
                                                     for k, v in loader.stats()["stages"].items()})
loader.close()
