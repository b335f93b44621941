"""Developer probe (device machine): JPEG batches through the hardware decoder, alone and beside GPU work that fills
the device, by nvImageCodec (as the loader decodes) and by nvJPEG called directly on a stream of the probe's at
the default and at the highest priority.

Question: does the decode keep its rate beside a training step when its GPU work (the copies of each image's
bits, nvJPEG's per-image colour conversion) is queued on a high-priority stream? nvImageCodec queues it on
streams of its own at the default priority, which the priority of the caller's stream does not reach
(`dev/loader_beside_gpu.py` measures the whole loader).

The first ``--images`` JPEGs of DATA_DIR (those nvJPEG's hardware batch takes), in batches of ``--batch``, whole
images to interleaved RGB. Each way decodes on its own thread, waiting for each batch (as a loader does before it
hands the batch on); the GPU work runs on the main thread: bf16 8192^3 matrix products, synchronised every four.
Per way: img/s alone, img/s beside the products and the products' rate beside it over theirs alone.

Usage: python dev/nvjpeg_hw_beside_gpu.py DATA_DIR [--images 1024] [--batch 256] [--seconds 4] [--json OUT.json]
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

HARDWARE, RGBI = 3, 5   # nvjpegBackend_t NVJPEG_BACKEND_HARDWARE, nvjpegOutputFormat_t NVJPEG_OUTPUT_RGBI


class Image(ctypes.Structure):   # nvjpegImage_t
    _fields_ = [("channel", c_void_p * 4), ("pitch", c_size_t * 4)]


class DirectDecoder:
    """nvJPEG's hardware batched decode (``nvjpegDecodeBatched``) of whole images to RGBI, on a given stream."""

    def __init__(self, torch, device):
        from ingest.decode import _nvjpeg
        path = _nvjpeg.wheel_copy()
        self.lib = ctypes.CDLL(str(path) if path else _nvjpeg.SONAME)   # CDLL: each call releases the GIL
        self.torch, self.device = torch, device
        self.handle, self.state = c_void_p(), c_void_p()
        self._check(self.lib.nvjpegCreateEx(HARDWARE, None, None, 0, byref(self.handle)), "nvjpegCreateEx(HARDWARE)")
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

    def size(self, data: bytes) -> tuple[int, int] | None:
        """(width, height) where the hardware batch takes the image, else None."""
        n, css = c_int(), c_int()
        widths, heights = (c_int * 4)(), (c_int * 4)()
        if self.lib.nvjpegGetImageInfo(self.handle, data, len(data), byref(n), byref(css), widths, heights):
            return None
        stream = c_void_p()
        self._check(self.lib.nvjpegJpegStreamCreate(self.handle, byref(stream)), "nvjpegJpegStreamCreate")
        try:
            supported = c_int(1)
            ok = (self.lib.nvjpegJpegStreamParse(self.handle, data, len(data), 0, 0, stream) == 0 and
                  self.lib.nvjpegDecodeBatchedSupported(self.handle, stream, byref(supported)) == 0)
        finally:
            self.lib.nvjpegJpegStreamDestroy(stream)
        return (widths[0], heights[0]) if ok and supported.value == 0 else None

    def prepare(self, datas: list[bytes], sizes: list[tuple[int, int]]):
        """The call's arguments for one batch, with device outputs for it."""
        n = len(datas)
        if n != self._batch:
            self._check(self.lib.nvjpegDecodeBatchedInitialize(self.handle, self.state, n, 1, RGBI),
                        "nvjpegDecodeBatchedInitialize")
            self._batch = n
        outs = [self.torch.empty(h * w * 3, dtype=self.torch.uint8, device=self.device) for w, h in sizes]
        images = (Image * n)()
        for img, out, (w, _) in zip(images, outs, sizes):
            img.channel[0], img.pitch[0] = out.data_ptr(), 3 * w
        ptrs = (c_void_p * n)(*[ctypes.cast(ctypes.c_char_p(d), c_void_p).value for d in datas])
        lengths = (c_size_t * n)(*[len(d) for d in datas])
        return datas, outs, images, ptrs, lengths   # every buffer the call reads stays alive with it

    def decode(self, args, stream) -> None:
        _, _, images, ptrs, lengths = args
        self._check(self.lib.nvjpegDecodeBatched(self.handle, self.state, ptrs, lengths, images,
                                                 c_void_p(stream.cuda_stream)), "nvjpegDecodeBatched")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="a directory tree of JPEGs (benchmarks/make_data.py)")
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import torch
    from ingest.decode.cpu import CpuDecoder
    from ingest.decode.gpu import GpuDecoder
    dev = torch.device("cuda", 0)
    torch.cuda.init()   # torch's context first: nvJPEG's calls then run in it (the device's primary context)
    files = sorted(glob.glob(f"{args.data}/**/*.JPEG", recursive=True) + glob.glob(f"{args.data}/**/*.jpg",
                                                                                   recursive=True))
    direct = DirectDecoder(torch, dev)
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

    def products(seconds: float) -> float:
        return gpu_work_rate(lambda: torch.mm(a, b), seconds)

    nvimg = GpuDecoder(dev, CpuDecoder(threads=4), backend="hw")
    default_stream, high_stream = torch.cuda.Stream(dev, priority=0), torch.cuda.Stream(dev, priority=-100)
    prepared = [direct.prepare(d, s) for d, s in batches]

    def run_direct(stream):
        def one(k: int) -> None:
            direct.decode(prepared[k % len(prepared)], stream)
            stream.synchronize()
        return one

    def run_nvimg(k: int) -> None:
        d = batches[k % len(batches)][0]
        with torch.cuda.stream(default_stream):
            images, _, _ = nvimg.decode_batch(d, [f"img{i}" for i in range(len(d))], stream=default_stream)
        default_stream.synchronize()
        del images

    ways = {"nvimagecodec": run_nvimg, "direct_default_priority": run_direct(default_stream),
            "direct_highest_priority": run_direct(high_stream)}

    def decode_rate(one, stop: threading.Event, out: dict) -> None:
        torch.cuda.set_device(dev)
        k, t0 = 0, time.perf_counter()
        while not stop.is_set():
            one(k)
            k += 1
        out["img_s"] = args.batch * k / (time.perf_counter() - t0)

    products(0.5)
    for one in ways.values():   # first calls (buffers, the hardware's state) out of the figures
        for k in range(3):
            one(k)
    alone_products = products(args.seconds)
    report = {"probe": "nvjpeg_hw_beside_gpu", "device": torch.cuda.get_device_name(dev), "images": len(datas),
              "batch": args.batch, "products_alone_per_s": round(alone_products, 1), "ways": {}}
    for name, one in ways.items():
        stop, out = threading.Event(), {}
        threading.Timer(args.seconds, stop.set).start()
        decode_rate(one, stop, out)
        alone = out["img_s"]
        stop, out = threading.Event(), {}
        thread = threading.Thread(target=decode_rate, args=(one, stop, out))
        thread.start()
        beside = products(args.seconds)
        stop.set()
        thread.join()
        report["ways"][name] = {"alone_img_s": round(alone, 1), "beside_img_s": round(out["img_s"], 1),
                                "decode_ratio": round(out["img_s"] / alone, 3),
                                "products_ratio": round(beside / alone_products, 3)}
        print(f"{name}: alone {alone:.0f} img/s, beside the products {out['img_s']:.0f} "
              f"(x{out['img_s'] / alone:.3f}); the products x{beside / alone_products:.3f}", flush=True)
    nvimg.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
