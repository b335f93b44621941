"""Developer script: which per-batch calls of the GPU decode path give up the GIL per image (and so stall
behind any busy Python thread). Usage: python tools/gil_probe.py DATA_DIR"""
import sys
import threading
import time

import torch
from nvidia import nvimgcodec

from ingest.formats import FileTree

tree = FileTree(sys.argv[1])
datas = [open(tree.name(i), "rb").read() for i in range(256)]
stream = torch.cuda.Stream()
dec = nvimgcodec.Decoder()
region = nvimgcodec.Region(start=(10, 10), end=(200, 200))


def steps():
    t = {}
    t0 = time.perf_counter()
    cs = [nvimgcodec.CodeStream(b) for b in datas]
    t["codestream"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    subs = [c.get_sub_code_stream(region=region) for c in cs]
    t["sub"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = dec.decode(subs, cuda_stream=stream.cuda_stream)
    t["decode"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    cais = [o.__cuda_array_interface__ for o in out]
    t["cai"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ts = [torch.as_tensor(o, device="cuda") for o in out]
    t["as_tensor"] = time.perf_counter() - t0
    stream.synchronize()
    return {k: round(v * 1000, 2) for k, v in t.items()}


def busy(stop):
    while not stop.is_set():
        sum(range(2000))


steps()
print("alone", steps())
for interval in (0.005, 0.0001):
    sys.setswitchinterval(interval)
    stop = threading.Event()
    th = threading.Thread(target=busy, args=(stop,))
    th.start()
    print(f"busy thread, switch {interval}", steps())
    stop.set()
    th.join()
