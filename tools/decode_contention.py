"""Developer script: how nvImageCodec's batch decode time reacts to what else the process does.
Usage: python tools/decode_contention.py DATA_DIR"""
import os
import sys
import threading
import time

import torch
from nvidia import nvimgcodec

from ingest.formats import FileTree

tree = FileTree(sys.argv[1])
files = [tree.name(i) for i in range(len(tree))]
datas = [open(f, "rb").read() for f in files[:2048]]
stream = torch.cuda.Stream()


def decode_rate(dec, seconds=2.0):
    k, n, t = 0, 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        batch = datas[(k * 256) % 2048:(k * 256) % 2048 + 256]
        out = dec.decode([nvimgcodec.CodeStream(b) for b in batch], cuda_stream=stream.cuda_stream)
        images = [torch.as_tensor(o, device="cuda") for o in out]
        k, n = k + 1, n + len(batch)
    stream.synchronize()
    return round((time.perf_counter() - t) / k * 1000, 2)


def background(kind, stop):
    if kind == "python":
        while not stop.is_set():
            sum(range(2000))
    elif kind == "pread":
        while not stop.is_set():
            for f in files[:256]:
                fd = os.open(f, os.O_RDONLY)
                os.preadv(fd, [bytearray(os.fstat(fd).st_size)], 0)
                os.close(fd)
                if stop.is_set():
                    break
    elif kind == "kernel":
        x = torch.randn(256, 3, 224, 224, device="cuda")
        s = torch.cuda.Stream()
        while not stop.is_set():
            with torch.cuda.stream(s):
                y = x * 2 + 1
            s.synchronize()
    elif kind == "sleep_poll":
        while not stop.is_set():
            time.sleep(0.0005)


res = {}
dec = nvimgcodec.Decoder()
decode_rate(dec, 1)
for kind, nthreads in [("none", 0), ("python", 1), ("pread", 8), ("pread", 2), ("kernel", 1), ("sleep_poll", 4)]:
    stop = threading.Event()
    ts = [threading.Thread(target=background, args=(kind, stop)) for _ in range(nthreads)]
    for t in ts:
        t.start()
    res[f"{kind}x{nthreads}"] = decode_rate(dec)
    stop.set()
    for t in ts:
        t.join()
for threads in (4, 8, 32):
    d = nvimgcodec.Decoder(max_num_cpu_threads=threads)
    decode_rate(d, 0.5)
    res[f"cpu_threads{threads}"] = decode_rate(d)
    stop = threading.Event()
    ts = [threading.Thread(target=background, args=("python", stop))]
    ts[0].start()
    res[f"cpu_threads{threads}+python"] = decode_rate(d)
    stop.set()
    ts[0].join()
print("ms per 256-image batch:", res)
