"""Developer probe (device machine): JPEG batches through the hardware decoder, alone and beside GPU work that fills
the device, by nvImageCodec (as the loader decodes) and by nvJPEG called directly on a stream of the probe's at
the default and at the highest priority.

Question: does the decode keep its rate beside a training step when its GPU work (the copies of each image's
bits, nvJPEG's per-image colour conversion) is queued on a high-priority stream? nvImageCodec queues it on
streams of its own at the default priority, which the priority of the caller's stream does not reach
(`dev/loader_beside_gpu.py` measures the whole loader).

The first ``--images`` JPEGs of DATA_DIR (those nvJPEG's hardware batch takes), in batches of ``--batch``, whole
images to interleaved RGB (nvImageCodec, nvJPEG) or to the planes as coded (nvJPEG's YUV output: no colour
conversion); nvJPEG also from bitstreams uploaded in one copy a batch (its hardware backend that reads them from
device memory) instead of one upload per image. Each way decodes on its own thread, waiting for each batch (as a loader does before it hands the
batch on); the GPU work runs on the main thread, synchronised every four calls: bf16 8192^3 matrix products (few
long kernels) or a ResNet-18 training step on a fixed batch (many short ones). Per way: img/s alone, what one
batch puts on the GPU (kernels and copies, by torch's profiler) and, per kind of work, img/s beside it and the
work's rate beside the decode over its rate alone.

Usage: python dev/nvjpeg_hw_beside_gpu.py DATA_DIR [--images 1024] [--batch 256] [--seconds 4] [--json OUT.json]
       [--ways nvimagecodec,nvimagecodec_two_batches_at_once] [--works resnet18_step]
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import threading
import time
from ctypes import POINTER, byref, c_int, c_size_t, c_void_p

from loader_beside_gpu import gpu_work_rate   # (dev/, beside this file)

HARDWARE, HARDWARE_DEVICE = 3, 5   # nvjpegBackend_t: the hardware engine, its bitstreams in host or device memory
YUV, RGBI = 1, 5   # nvjpegOutputFormat_t: NVJPEG_OUTPUT_YUV (planes as coded, chroma subsampled), NVJPEG_OUTPUT_RGBI


class Image(ctypes.Structure):   # nvjpegImage_t
    _fields_ = [("channel", c_void_p * 4), ("pitch", c_size_t * 4)]


class DirectDecoder:
    """nvJPEG's hardware batched decode (``nvjpegDecodeBatched``) of whole images to ``fmt`` (RGBI or planar YUV,
    the planes as coded: no colour conversion), on a given stream. ``device_bitstreams``: the batch's bitstreams
    uploaded in one copy from pinned memory and read by nvJPEG from the device (NVJPEG_BACKEND_HARDWARE_DEVICE),
    instead of an upload per image."""

    def __init__(self, torch, device, fmt: int = RGBI, device_bitstreams: bool = False):
        from ingest.decode import _nvjpeg
        path = _nvjpeg.wheel_copy()
        self.lib = ctypes.CDLL(str(path) if path else _nvjpeg.SONAME)   # CDLL: each call releases the GIL
        self.torch, self.device, self.fmt, self.device_bitstreams = torch, device, fmt, device_bitstreams
        self.handle, self.state = c_void_p(), c_void_p()
        backend = HARDWARE_DEVICE if device_bitstreams else HARDWARE
        self._check(self.lib.nvjpegCreateEx(backend, None, None, 0, byref(self.handle)), f"nvjpegCreateEx({backend})")
        self._check(self.lib.nvjpegJpegStateCreate(self.handle, byref(self.state)), "nvjpegJpegStateCreate")
        lib = self.lib
        lib.nvjpegGetImageInfo.argtypes = [c_void_p, ctypes.c_char_p, c_size_t, POINTER(c_int), POINTER(c_int),
                                           POINTER(c_int), POINTER(c_int)]
        lib.nvjpegJpegStreamCreate.argtypes = [c_void_p, POINTER(c_void_p)]
        lib.nvjpegJpegStreamParse.argtypes = [c_void_p, ctypes.c_char_p, c_size_t, c_int, c_int, c_void_p]
        lib.nvjpegJpegStreamDestroy.argtypes = [c_void_p]
        lib.nvjpegDecodeBatchedSupported.argtypes = [c_void_p, c_void_p, POINTER(c_int)]
        lib.nvjpegDecodeBatchedInitialize.argtypes = [c_void_p, c_void_p, c_int, c_int, c_int]
        lib.nvjpegDecodeBatched.argtypes = [c_void_p, c_void_p, POINTER(c_void_p), POINTER(c_size_t),
                                            POINTER(Image), c_void_p]
        self._batch = 0

    @staticmethod
    def _check(status: int, call: str) -> None:
        if status != 0:
            raise RuntimeError(f"{call} failed: nvjpegStatus_t {status}")

    def size(self, data: bytes) -> tuple[tuple[int, int], ...] | None:
        """Each component's (width, height) where the hardware batch takes the image (three components), else
        None."""
        n, css = c_int(), c_int()
        widths, heights = (c_int * 4)(), (c_int * 4)()
        if self.lib.nvjpegGetImageInfo(self.handle, data, len(data), byref(n), byref(css), widths, heights) or \
                n.value != 3:
            return None
        stream = c_void_p()
        self._check(self.lib.nvjpegJpegStreamCreate(self.handle, byref(stream)), "nvjpegJpegStreamCreate")
        try:
            supported = c_int(1)
            ok = (self.lib.nvjpegJpegStreamParse(self.handle, data, len(data), 0, 0, stream) == 0 and
                  self.lib.nvjpegDecodeBatchedSupported(self.handle, stream, byref(supported)) == 0)
        finally:
            self.lib.nvjpegJpegStreamDestroy(stream)
        return tuple(zip(widths[:3], heights[:3])) if ok and supported.value == 0 else None

    def prepare(self, datas: list[bytes], sizes: list[tuple[tuple[int, int], ...]]):
        """The call's arguments for one batch, with device outputs for it."""
        n = len(datas)
        if n != self._batch:
            self._check(self.lib.nvjpegDecodeBatchedInitialize(self.handle, self.state, n, 1, self.fmt),
                        "nvjpegDecodeBatchedInitialize")
            self._batch = n
        planes = [[(3 * c[0][0], c[0][1])] if self.fmt == RGBI else list(c) for c in sizes]   # (pitch, rows)
        outs = [self.torch.empty(sum(w * h for w, h in p), dtype=self.torch.uint8, device=self.device)
                for p in planes]
        images = (Image * n)()
        for img, out, p in zip(images, outs, planes):
            at = out.data_ptr()
            for c, (pitch, rows) in enumerate(p):
                img.channel[c], img.pitch[c] = at, pitch
                at += pitch * rows
        lengths = (c_size_t * n)(*[len(d) for d in datas])
        upload = None
        if self.device_bitstreams:   # one pinned buffer of the batch's bitstreams, uploaded in one copy a batch
            host = self.torch.frombuffer(bytearray(b"".join(datas)), dtype=self.torch.uint8).pin_memory()
            dev = self.torch.empty_like(host, device=self.device)
            starts = [0]
            for d in datas[:-1]:
                starts.append(starts[-1] + len(d))
            ptrs = (c_void_p * n)(*[dev.data_ptr() + at for at in starts])
            upload = (host, dev)
        else:
            ptrs = (c_void_p * n)(*[ctypes.cast(ctypes.c_char_p(d), c_void_p).value for d in datas])
        return datas, outs, images, ptrs, lengths, upload   # every buffer the call reads stays alive with it

    def decode(self, args, stream) -> None:
        _, _, images, ptrs, lengths, upload = args
        if upload is not None:
            with self.torch.cuda.stream(stream):
                upload[1].copy_(upload[0], non_blocking=True)
        self._check(self.lib.nvjpegDecodeBatched(self.handle, self.state, ptrs, lengths, images,
                                                 c_void_p(stream.cuda_stream)), "nvjpegDecodeBatched")


def resnet18_step(torch, device, batch: int):
    """One training step of ResNet-18 (bf16 autocast, channels_last, SGD) on a fixed batch: a training step's
    kernels, short and many, where the products' are few and long."""
    import torchvision
    model = torchvision.models.resnet18(num_classes=1000).to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=device)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="a directory tree of JPEGs (benchmarks/make_data.py)")
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--json", default=None)
    p.add_argument("--ways", default=None, help="comma-separated ways to run (default: all)")
    p.add_argument("--works", default=None, help="comma-separated kinds of GPU work (products, resnet18_step)")
    args = p.parse_args()
    import torch
    from ingest.decode.cpu import CpuDecoder
    from ingest.decode.gpu import GpuDecoder
    dev = torch.device("cuda", 0)
    torch.cuda.init()   # torch's context first: nvJPEG's calls then run in it (the device's primary context)
    files = sorted(glob.glob(f"{args.data}/**/*.JPEG", recursive=True) + glob.glob(f"{args.data}/**/*.jpg",
                                                                                   recursive=True))
    direct, direct_yuv = DirectDecoder(torch, dev), DirectDecoder(torch, dev, YUV)
    direct_dev = DirectDecoder(torch, dev, device_bitstreams=True)
    datas, sizes = [], []
    for f in files:
        data = open(f, "rb").read()
        size = direct.size(data)
        if size is not None:
            datas.append(data)
            sizes.append(size)
        if len(datas) == args.images:
            break
    batches = [(datas[i:i + args.batch], sizes[i:i + args.batch]) for i in range(0, len(datas), args.batch)]
    batches = [b for b in batches if len(b[0]) == args.batch]
    if not batches:
        raise SystemExit(f"{args.data}: fewer than {args.batch} JPEGs that nvJPEG's hardware batch takes "
                         f"({len(datas)} of {len(files)} files)")
    a, b = (torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) for _ in range(2))
    works = {"products": lambda: torch.mm(a, b), "resnet18_step": resnet18_step(torch, dev, args.batch)}

    nvimgs = [GpuDecoder(dev, CpuDecoder(threads=4), backend="hw") for _ in range(2)]
    default_stream, high_stream = torch.cuda.Stream(dev, priority=0), torch.cuda.Stream(dev, priority=-100)
    second_stream = torch.cuda.Stream(dev, priority=0)
    prepared = {id(x): [x.prepare(d, s) for d, s in batches] for x in (direct, direct_yuv, direct_dev)}

    def run_direct(stream, decoder=direct):
        def one(k: int) -> None:
            batch = prepared[id(decoder)]
            decoder.decode(batch[k % len(batch)], stream)
            stream.synchronize()
        return one

    def run_nvimg(nvimg, stream):
        def one(k: int) -> None:
            d = batches[k % len(batches)][0]
            with torch.cuda.stream(stream):
                images, _, _ = nvimg.decode_batch(d, [f"img{i}" for i in range(len(d))], stream=stream)
            stream.synchronize()
            del images
        return one

    # each way: one decode loop per thread (two: two batches decoded at once, by decoders of their own)
    ways = {"nvimagecodec": [run_nvimg(nvimgs[0], default_stream)],
            "nvimagecodec_two_batches_at_once": [run_nvimg(nvimgs[0], default_stream),
                                                 run_nvimg(nvimgs[1], second_stream)],
            "direct_default_priority": [run_direct(default_stream)],
            "direct_highest_priority": [run_direct(high_stream)],
            "direct_yuv_default_priority": [run_direct(default_stream, direct_yuv)],
            "direct_yuv_highest_priority": [run_direct(high_stream, direct_yuv)],
            "direct_device_bitstreams_highest_priority": [run_direct(high_stream, direct_dev)]}
    ways = {name: way for name, way in ways.items() if not args.ways or name in args.ways.split(",")}
    works = {name: work for name, work in works.items() if not args.works or name in args.works.split(",")}

    def gpu_calls(one) -> dict:
        """What one batch puts on the GPU: kernels by name and copies by kind, counted by torch's profiler."""
        from collections import Counter
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            one(0)
            torch.cuda.synchronize()
        counts: Counter[str] = Counter()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                counts[e.name[:60]] += 1
        return dict(counts.most_common(8))

    def decode_rate(way, stop: threading.Event, out: dict) -> None:
        counts = [0] * len(way)

        def loop(i: int) -> None:
            torch.cuda.set_device(dev)
            while not stop.is_set():
                way[i](counts[i] + i)
                counts[i] += 1
        t0 = time.perf_counter()
        threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(way))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out["img_s"] = args.batch * sum(counts) / (time.perf_counter() - t0)

    for call in works.values():   # cuBLAS's, cuDNN's and the allocator's first calls out of the figures
        gpu_work_rate(call, 1.0)
    for way in ways.values():   # first calls (buffers, the hardware's state) out of the figures
        for one in way:
            for k in range(3):
                one(k)
    works_alone = {w: gpu_work_rate(call, args.seconds) for w, call in works.items()}
    report = {"probe": "nvjpeg_hw_beside_gpu", "device": torch.cuda.get_device_name(dev), "images": len(datas),
              "batch": args.batch, "work_alone_per_s": {w: round(r, 2) for w, r in works_alone.items()}, "ways": {}}
    for name, way in ways.items():
        stop, out = threading.Event(), {}
        threading.Timer(args.seconds, stop.set).start()
        decode_rate(way, stop, out)
        alone = out["img_s"]
        row = report["ways"][name] = {"alone_img_s": round(alone, 1), "gpu_calls_a_batch": gpu_calls(way[0])}
        for work, call in works.items():
            stop, out = threading.Event(), {}
            thread = threading.Thread(target=decode_rate, args=(way, stop, out))
            thread.start()
            beside = gpu_work_rate(call, args.seconds)
            stop.set()
            thread.join()
            row[work] = {"beside_img_s": round(out["img_s"], 1), "decode_ratio": round(out["img_s"] / alone, 3),
                         "work_ratio": round(beside / works_alone[work], 3)}
            print(f"{name}: alone {alone:.0f} img/s; beside {work} {out['img_s']:.0f} (x{out['img_s'] / alone:.3f}), "
                  f"{work} x{beside / works_alone[work]:.3f}", flush=True)
        print(f"{name}: a batch on the GPU: {row['gpu_calls_a_batch']}", flush=True)
    for nvimg in nvimgs:
        nvimg.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
