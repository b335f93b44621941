"""The native engine's GPU path on the CPU: the engine loads a stand-in CUDA driver (``INGEST_CUDA_LIBRARY``) whose
device memory is host memory, whose copies are memcpy and whose kernel launch runs the warp kernel's own source
compiled as C++ (tests/test_ops.py's harness), and is given stand-in nvImageCodec functions that "decode" each
image (or region) as a known pattern of its absolute pixel coordinates. Every batch the engine makes must then
equal the kernel run on the Python planner's warp over whole pattern images: this checks the engine's regions,
origins, arena offsets, kernel arguments and rows, the labels' upload, the decode threads' shares, an image the
decoder refuses (its row left to Python), a RecordIO record whose CRC32C differs (its row dropped) and batches
and epoch ends reaching next() in order through host functions that run late on a thread of their own, without a
GPU; and, through the NativeExecutor, each record format's table (TFRecord, LMDB ours and Caffe, WebDataset) against
the Python stages, a TFRecord record whose CRC fails dropped, and a DeepLab set's masks (from TFRecord records, from
an LMDB of our layout's mask fields and from WebDataset mask members: decoded natively, warped by the mask kernel launch) equal to the Python stages' exactly; and raw tensor shards (kind "pixels": read,
uploaded in one copy per batch and warped with no decode) equal to the kernel over the Python planner's warp of the
same pixels exactly, with the Python stages' rows and labels, a sample whose CRC32C differs dropped and shards the
engine cannot take refused; and detection batches (a COCO set, the same samples as Object Detection API TFRecord
records whose boxes the engine scans from each record, those records it leaves to Python) equal to the Python
stages' fields exactly; and, where nvImageCodec's library is importable, the JPEGs the GPU path leaves
(progressive, CMYK, gray, Adobe RGB, EXIF orientations 2-8) decoded by its real CPU decoder on the engine, from a
file tree, TFRecord records and an LMDB of ours, equal to the Python stages' rows exactly, and the damaged ones left
to Python. Runs in a child process (the stand-in driver is loaded once per process)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ingest import native
from ingest.formats.base import read_location

from conftest import cpp_library

pytestmark = pytest.mark.skipif(native.ENGINE is None, reason="ingest._engine was not built")

_FAKE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

/* Host functions run later, in order, on a thread of their own (as the driver's do), so that what the engine
 * puts on its ready queue through them arrives after the engine's thread has gone on. */
/* (never destroyed: the thread still waits on them at exit, and destroying a waited-on condition blocks) */
static std::mutex &hf_lock = *new std::mutex;
static std::condition_variable &hf_cond = *new std::condition_variable;
static std::deque<std::pair<void (*)(void *), void *>> &hf_queue = *new std::deque<std::pair<void (*)(void *), void *>>;
static int hf_busy;
static void hf_main() {
    for (;;) {
        std::unique_lock<std::mutex> g(hf_lock);
        hf_cond.wait(g, [] { return !hf_queue.empty(); });
        auto call = hf_queue.front();
        hf_queue.pop_front();
        hf_busy = 1;
        g.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        call.first(call.second);
        g.lock();
        hf_busy = 0;
        hf_cond.notify_all();
    }
}

extern "C" {
/* -- the driver: host memory, synchronous copies, no-op events, the kernel run on the CPU, deferred host functions -- */
int cuLaunchHostFunc(void *, void (*fn)(void *), void *data) {
    static std::once_flag started;
    std::call_once(started, [] { std::thread(hf_main).detach(); });
    std::lock_guard<std::mutex> g(hf_lock);
    hf_queue.emplace_back(fn, data);
    hf_cond.notify_all();
    return 0;
}
int cuStreamSynchronize(void *) {
    std::unique_lock<std::mutex> g(hf_lock);
    hf_cond.wait(g, [] { return hf_queue.empty() && !hf_busy; });
    return 0;
}
int cuInit(unsigned) { return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int) { *c = (void *)0x1; return 0; }
int cuDevicePrimaryCtxRelease_v2(int) { return 0; }
int cuCtxSetCurrent(void *) { return 0; }
int cuCtxPushCurrent_v2(void *) { return 0; }
int cuCtxPopCurrent_v2(void **c) { if (c) *c = (void *)0x1; return 0; }
int cuStreamCreate(void **s, unsigned) { *s = malloc(1); return 0; }
int cuStreamDestroy_v2(void *s) { free(s); return 0; }
int cuStreamWaitEvent(void *, void *, unsigned) { return 0; }
int cuEventCreate(void **e, unsigned) { *e = malloc(1); return 0; }
int cuEventDestroy_v2(void *e) { free(e); return 0; }
int cuEventRecord(void *, void *) { return 0; }
int cuEventSynchronize(void *) { return 0; }
int cuMemAlloc_v2(unsigned long long *p, size_t n) { void *m = malloc(n); *p = (unsigned long long)(uintptr_t)m; return m ? 0 : 2; }
int cuMemFree_v2(unsigned long long p) { free((void *)(uintptr_t)p); return 0; }
int cuMemHostAlloc(void **p, size_t n, unsigned) { *p = malloc(n); return *p ? 0 : 2; }
int cuMemFreeHost(void *p) { free(p); return 0; }
int cuMemcpyHtoDAsync_v2(unsigned long long d, const void *s, size_t n, void *) {
    memcpy((void *)(uintptr_t)d, s, n);
    return 0;
}
static int launches;
int fake_launches(void) { return launches; }
void run(int, int, int, int, const long long *, const double *, unsigned char *, int, int, int, int);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned,
                   void *, void **p, void **) {
    if (bx != 32 || by != 8 || bz != 1) return 1;
    ++launches;
    run((int)(intptr_t)f - 1, gx, gy, gz, *(const long long **)p[0], *(const double **)p[1],
        *(unsigned char **)p[2], *(int *)p[3], *(int *)p[4], *(int *)p[5], *(int *)p[6]);
    return 0;
}
int cuGetErrorString(int, const char **s) { *s = "stand-in"; return 0; }

/* -- nvImageCodec: code streams, regions, images; "decoding" writes pattern(x, y, c) of absolute coordinates -- */
struct Stream { const unsigned char *data; size_t len; int x0, y0, sub; };
struct Image { unsigned char *buf; unsigned h, w; size_t stride; };
static long refused = -1;
void fake_refuse(long n) { refused = n; }
int nv_create(void *, void **h, const unsigned char *d, size_t n, const void *) {
    Stream *s = (Stream *)(*h ? *h : calloc(1, sizeof(Stream)));
    s->data = d, s->len = n, s->sub = 0, s->x0 = s->y0 = 0;
    *h = s;
    return 0;
}
int nv_info(void *, void *probe) { strcpy((char *)probe, "jpeg"); return 0; }
int nv_sub(void *parent, void **h, const void *view) {
    Stream *s = (Stream *)(*h ? *h : calloc(1, sizeof(Stream)));
    *s = *(Stream *)parent;
    const int *v = (const int *)view;   /* start (y, x) at 0, end (y, x) at 8 */
    s->y0 = v[0], s->x0 = v[1], s->sub = 1;
    *h = s;
    return 0;
}
int nv_image(void *, void **h, const void *info) {
    Image *im = (Image *)(*h ? *h : calloc(1, sizeof(Image)));
    const char *i = (const char *)info;   /* buffer 0, stream 8, height 16, width 20, row stride 24 */
    memcpy(&im->buf, i, 8), memcpy(&im->h, i + 16, 4), memcpy(&im->w, i + 20, 4), memcpy(&im->stride, i + 24, 8);
    *h = im;
    return 0;
}
static unsigned char level(size_t len, int x, int y, int c) {
    double v = 0.5 * (x + 2 * y) + 20 * c + (double)(len % 16);
    return v > 255 ? 255 : (unsigned char)v;
}
int nv_decode(void *, void *const *streams, void *const *images, int n, const void *, void **future) {
    uint32_t *st = (uint32_t *)calloc((size_t)n + 1, 4);
    st[0] = (uint32_t)n;
    for (int k = 0; k < n; ++k) {
        Stream *s = (Stream *)streams[k];
        Image *im = (Image *)images[k];
        if ((long)s->len == refused) { st[k + 1] = 0x7; continue; }
        for (unsigned y = 0; y < im->h; ++y)
            for (unsigned x = 0; x < im->w; ++x)
                for (int c = 0; c < 3; ++c)
                    im->buf[y * im->stride + x * 3 + c] = level(s->len, s->x0 + (int)x, s->y0 + (int)y, c);
        st[k + 1] = 1;
    }
    *future = st;
    return 0;
}
int nv_wait(void *) { return 0; }
int nv_status(void *f, uint32_t *out, size_t *size) {
    uint32_t *st = (uint32_t *)f;
    for (uint32_t k = 0; k < st[0]; ++k) out[k] = st[k + 1];
    *size = st[0];
    return 0;
}
int nv_future_destroy(void *f) { free(f); return 0; }
int nv_destroy(void *h) { free(h); return 0; }
}
"""

MEAN, STD = (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)


def chains():
    from ingest.ops import Flip, Normalize, RandomResizedCrop
    from ingest.ops.geometry import CenterCrop, Resize
    return {"rrc-flip-normalize": [RandomResizedCrop(24), Flip(p=0.5), Normalize(MEAN, STD)],
            "resize-crop-uint8": [Resize((40, 52)), CenterCrop(32), Flip(p=0.5)],
            # a crop, then one that pads past it, then a resize: the kernel's source is the first crop's window
            # (one fill: the first crop pads small images too, which with another fill the native engine refuses)
            "crop-pad-resize": [CenterCrop(20, fill=9), CenterCrop(40, fill=9), Resize(32)],
            # output sizes that follow the image's: one size over raw shards of one pixel shape
            "flip-normalize": [Flip(p=0.5), Normalize(MEAN, STD)],
            "shorter-flip": [Resize(shorter=20), Flip(p=0.5)]}


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> Path:
    from ingest.ops import _warp_kernel
    from test_ops import _DRIVER, _PRELUDE
    return cpp_library(tmp_path_factory.mktemp("stand_in"), _PRELUDE + _warp_kernel.SOURCE + _DRIVER + _FAKE,
                       "-std=c++17", "-Wno-unknown-pragmas")


def _child(stand_in: Path, root: str, chain: str, mode: str) -> subprocess.CompletedProcess:
    """This file run as a child process on the stand-in driver (``mode``: regions 0/1, executor, crc, records);
    asserts it exited 0."""
    env = dict(os.environ, INGEST_CUDA_LIBRARY=str(stand_in),
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, __file__, str(stand_in), root, chain, mode], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.parametrize("regions", [True, False], ids=["regions", "whole"])
@pytest.mark.parametrize("chain", ["rrc-flip-normalize", "resize-crop-uint8", "crop-pad-resize"])
def test_gpu_path_on_a_stand_in_driver_matches_the_planner(tmp_path, stand_in, chain, regions):
    from test_native import tree_with_oddities
    root = tree_with_oddities(tmp_path / "t")
    done = _child(stand_in, str(root), chain, str(int(regions)))
    assert "batches compared: 5" in done.stdout, done.stdout


@pytest.mark.parametrize("chain", ["rrc-flip-normalize", "resize-crop-uint8"])
def test_executor_on_a_stand_in_driver_keeps_what_the_loop_keeps(tmp_path, stand_in, chain):
    from test_native import tree_with_oddities
    root = tree_with_oddities(tmp_path / "t")
    done = _child(stand_in, str(root), chain, "executor")
    assert "executor batches compared: 15" in done.stdout, done.stdout


def test_a_record_whose_crc_differs_is_dropped_on_the_gpu_path(tmp_path, stand_in):
    done = _child(stand_in, str(tmp_path), "rrc-flip-normalize", "crc")
    assert "crc batches compared: 3" in done.stdout, done.stdout


RECORD_FORMATS = ["tfrecord", "tfrecord-crc", "lmdb", "caffe", "webdataset"]


def test_record_formats_on_a_stand_in_driver_match_the_python_stages(tmp_path, stand_in):
    done = _child(stand_in, str(tmp_path), "rrc-flip-normalize", "records")
    for fmt in RECORD_FORMATS:
        assert f"{fmt}: record batches compared: 6" in done.stdout, done.stdout


def test_masks_on_a_stand_in_driver_equal_the_python_stages(tmp_path, stand_in):
    done = _child(stand_in, str(tmp_path), "rrc-flip-normalize", "masks")
    assert "mask batches compared: 6" in done.stdout, done.stdout
    (tmp_path / "2").mkdir()
    (tmp_path / "3").mkdir()
    done = _child(stand_in, str(tmp_path / "2"), "resize-crop-uint8", "masks")
    assert "mask batches compared: 6" in done.stdout, done.stdout
    done = _child(stand_in, str(tmp_path / "3"), "crop-pad-resize", "masks")
    assert "mask batches compared: 6" in done.stdout, done.stdout


@pytest.mark.parametrize("chain", ["rrc-flip-normalize", "crop-pad-resize"])
def test_webdataset_masks_on_a_stand_in_driver_equal_the_python_stages(tmp_path, stand_in, chain):
    done = _child(stand_in, str(tmp_path), chain, "masks-wds")
    assert "mask batches compared: 6" in done.stdout, done.stdout


@pytest.mark.parametrize("chain", ["rrc-flip-normalize", "crop-pad-resize"])
def test_lmdb_masks_on_a_stand_in_driver_equal_the_python_stages(tmp_path, stand_in, chain):
    done = _child(stand_in, str(tmp_path), chain, "masks-lmdb")
    assert "mask batches compared: 6" in done.stdout, done.stdout


@pytest.mark.parametrize("chain", ["rrc-flip-normalize", "resize-crop-uint8"])
def test_png_images_on_a_stand_in_driver_equal_the_python_stages(tmp_path, stand_in, chain):
    done = _child(stand_in, str(png_tree(tmp_path / "t")), chain, "png")
    assert "png batches compared: 6" in done.stdout, done.stdout


def test_a_mostly_png_file_tree_is_the_native_engines(tmp_path):
    from ingest.formats.filetree import FileTree
    chain, why = native.chain_for(FileTree(str(png_tree(tmp_path))), chains()["rrc-flip-normalize"])
    assert chain is not None and not native.mostly_other_codecs(chain.table), why


#: The PNG colour modes of `png_tree` (Pillow's), besides its JPEGs: the read team decodes them all but the 16-bit.
PNG_MODES = ("RGB", "RGBA", "P", "P+tRNS", "L", "LA", "1", "I;16")


def png_tree(root: Path) -> Path:
    """A file tree of 3 JPEGs and a PNG of each of `PNG_MODES` (images of varied sizes, two classes)."""
    from PIL import Image
    from conftest import encode, jpeg_bytes, textured
    for k in range(3 + len(PNG_MODES)):
        d = root / "ab"[k % 2]
        d.mkdir(parents=True, exist_ok=True)
        h, w = 30 + 5 * k, 44 - 2 * k
        if k < 3:
            (d / f"{k:02d}.jpg").write_bytes(jpeg_bytes(h, w, seed=k))
            continue
        mode = PNG_MODES[k - 3]
        rgb = Image.fromarray(textured(h, w, k))
        if mode.startswith("P"):
            im, kw = rgb.quantize(colors=17 + k), ({"transparency": 3} if mode == "P+tRNS" else {})
        elif mode == "I;16":
            im, kw = Image.fromarray((textured(h, w, k)[..., 0].astype(np.uint16) * 257)), {}
        else:
            im, kw = (rgb.convert(mode) if mode != "RGBA" else Image.fromarray(
                np.dstack([textured(h, w, k), textured(h, w, k + 1)[..., :1]]))), {}
        (d / f"{k:02d}.png").write_bytes(encode(im, "PNG", **kw))
    return root


def child_png(lib_path: str, root: str, chain_name: str) -> None:
    """The NativeExecutor over the stand-ins on `png_tree` for two epochs, against the Python stages: the same rows
    and labels; each PNG the read team decodes (not the 16-bit one, Python's) warped exactly as the kernel warps the
    Python stages' CPU decode of it on their plan (what the Python stages run on a GPU), and within a level of their
    CPU warp; the decode paths counted."""
    from ingest.engine import Failures, Pipeline
    from ingest.formats.filetree import FileTree
    from ingest.sampler import Sampler

    ops = chains()[chain_name]
    src = FileTree(root)
    fake, gpu, _ = stand_in_gpu(lib_path, src, True, refused=-1)
    chain, why = native.chain_for(src, ops)
    assert chain is not None, why
    pipe = Pipeline(src, ops=ops, device="cpu")
    sampler = Sampler(len(src), 4, shuffle=True, seed=4)
    ex = native.NativeExecutor(pipe, chain, sampler, epoch=0, start=0, offset=0, failures=Failures(0, 0),
                               budget=lambda: Failures(0, 0), prefetch=1, gpu=gpu)
    seen = [(b.indices.clone() if b.indices is not None else None, b.images.clone(), b.labels.clone())
            for _ in range(2) for b in ex]
    stats = ex.stats()
    ex.close()
    pngs = len(PNG_MODES) - 1
    assert stats["fallbacks"] == {"not a GPU JPEG": 2}, stats   # the 16-bit PNG, each epoch
    assert pipe.decode_stage.decode_paths == {"gpu": 2 * 3, "cpu-native": 2 * pngs, "cpu-fallback": 2}, \
        pipe.decode_stage.decode_paths
    reference = Pipeline(src, ops=ops, device="cpu")
    compared = 0
    for epoch in range(2):
        for plan in sampler.batches(epoch):
            _, x, y = seen[compared]
            work = reference.read(plan)
            want = kernel_reference(fake, work, ops)
            python = reference.run(plan)
            assert torch.equal(y, python.labels), (epoch, plan.number, y, python.labels)
            for row, i in enumerate(plan.indices):
                got, name = x[row].permute(1, 2, 0) if chain.layout is None else x[row], src.name(i)
                if not name.endswith(".png"):   # (the stand-in's pattern)
                    assert_close(got, want[row], ops, f"epoch {epoch} row {row} {name}")
                    continue
                if Image_mode(name) != "I;16":
                    assert torch.equal(got, want[row]), (epoch, plan.number, row, name)
                assert_close(x[row], python.images[row], ops, f"epoch {epoch} row {row} {name}")
            compared += 1
    print(f"png batches compared: {compared}")


#: nvImageCodec's C library with its CPU (libjpeg-turbo) decoder, where importable (``nvidia-nvimgcodec-cu13``).
def host_decoder_available() -> bool:
    from ingest.decode import _nvimgcodec as nv
    try:
        nv.BatchDecoder(nv.load(), nv.DEVICE_CPU_ONLY, backends=["CPU_ONLY"]).close()
    except nv.Unavailable:
        return False
    return True


#: The JPEGs of `host_jpeg_tree` the GPU path does not take, decoded on the engine by nvImageCodec's CPU decoder:
#: name -> (kind, save options); h_orient<o> carry EXIF orientation o.
HOST_JPEGS = {"h_progressive": ("RGB", {"progressive": True}),
              "h_progressive444": ("RGB", {"progressive": True, "subsampling": 0}),
              "h_cmyk": ("CMYK", {}), "h_cmyk_progressive": ("CMYK", {"progressive": True}),
              "h_gray_progressive": ("L", {"progressive": True}), "h_adobe_rgb": ("RGB", {"keep_rgb": True}),
              "h_orient2": ("RGB", {"subsampling": 2}), "h_orient3": ("RGB", {"subsampling": 1}),
              "h_orient4": ("RGB", {"subsampling": 0}), "h_orient5": ("L", {}),
              "h_orient6": ("RGB", {"progressive": True}), "h_orient7": ("CMYK", {}),
              "h_orient8": ("RGB", {"progressive": True, "subsampling": 0})}


def host_jpeg_tree(root: Path) -> Path:
    """A file tree of 3 baseline JPEGs (the GPU path's), the `HOST_JPEGS`, a PNG, a JPEG cut short (no EOI: not
    the engine's) and one whose scans are cut out (header and EOI: nvImageCodec's CPU decoder refuses it), in two
    classes, images of varied sizes."""
    from PIL import Image
    from conftest import encode, jpeg_bytes, textured
    files = {f"gpu_{k}.jpg": jpeg_bytes(30 + 3 * k, 41 - 2 * k, seed=k) for k in range(3)}
    for k, (name, (mode, kw)) in enumerate(HOST_JPEGS.items()):
        im = Image.fromarray(textured(27 + 2 * k, 45 - k, 10 + k)).convert(mode)
        if name.startswith("h_orient"):
            exif = Image.Exif()
            exif[0x0112] = int(name[-1])
            kw = {**kw, "exif": exif.tobytes()}
        files[f"{name}.jpg"] = encode(im, "JPEG", quality=90, **kw)
    files["p_image.png"] = encode(Image.fromarray(textured(33, 29, 40)), "PNG")
    whole = jpeg_bytes(36, 40, seed=41, progressive=True)
    files["x_truncated.jpg"] = whole[:len(whole) // 2]
    files["x_scanless.jpg"] = whole[:whole.index(b"\xff\xda")] + b"\xff\xd9"
    for k, (name, data) in enumerate(files.items()):
        (root / "ab"[k % 2]).mkdir(parents=True, exist_ok=True)
        (root / "ab"[k % 2] / name).write_bytes(data)
    return root


def host_jpeg_source(root: Path, fmt: str):
    """`host_jpeg_tree` as a file tree (``fmt`` "tree"), or its files in name order as the records of a TFRecord
    file or an LMDB of ours; with each sample's file name."""
    from test_native_records import write_lmdb_ours, write_tfrecord
    from ingest.formats.base import Record
    from ingest.formats.filetree import FileTree
    from ingest.formats.tfrecord import TFRecordSource
    tree = host_jpeg_tree(root / "tree")
    if fmt == "tree":
        src = FileTree(str(tree))
        return src, [os.path.basename(src.name(i)) for i in range(len(src))]
    files = sorted(tree.rglob("*.*"), key=lambda p: p.name)
    records = [Record(p.read_bytes(), k % 3) for k, p in enumerate(files)]
    (root / fmt).mkdir()
    src = TFRecordSource(str(write_tfrecord(root / fmt, records))) if fmt == "tfrecord" else \
        write_lmdb_ours(root / fmt, records)
    return src, [p.name for p in files]


@pytest.mark.skipif(not host_decoder_available(), reason="nvImageCodec's CPU decoder (nvidia-nvimgcodec-cu13) "
                                                          "is not importable")
@pytest.mark.parametrize("chain, fmt", [("rrc-flip-normalize", "tree"), ("resize-crop-uint8", "tree"),
                                        ("rrc-flip-normalize", "tfrecord"), ("resize-crop-uint8", "lmdb")])
def test_jpegs_the_gpu_path_leaves_decoded_on_the_engine_equal_the_python_stages(tmp_path, stand_in, chain, fmt):
    done = _child(stand_in, str(tmp_path), chain, f"host-jpegs-{fmt}")
    assert "host jpeg batches compared: 10" in done.stdout, done.stdout


@pytest.mark.skipif(not host_decoder_available(), reason="nvImageCodec's CPU decoder (nvidia-nvimgcodec-cu13) "
                                                          "is not importable")
@pytest.mark.parametrize("share", ["1.0", "0.5"])
def test_a_share_of_the_gpus_jpegs_decoded_on_the_host_equals_the_python_stages(tmp_path, stand_in, share):
    """``host_jpeg_share``: that share of the JPEGs the GPU path takes (picked by their dataset index's hash) goes
    to nvImageCodec's CPU decoder instead, its pixels the Python stages' CPU decode through the same kernel."""
    done = _child(stand_in, str(tmp_path), "rrc-flip-normalize", f"host-share-{share}")
    assert "host jpeg batches compared: 10" in done.stdout, done.stdout


def host_share_picks(indices, share: float) -> set[int]:
    """The dataset indices the engine's host_share_pick takes at ``share``: the hash of each index under the
    "hostJPEG" salt (ingest.random's combine), as a double in [0, 1), below the share."""
    from ingest.random import _combine
    bits = _combine(np.asarray([0x686F73744A504547], np.uint64), np.asarray(list(indices), np.uint64))
    return {i for i, b in zip(indices, bits.tolist()) if (b >> 11) * 2.0 ** -53 < share}


def test_without_nvimgcodecs_library_the_engine_has_no_cpu_decoder(monkeypatch):
    """Where nvImageCodec's library (or its CPU backend) is not there, `host_decoder` gives None: the engine then
    leaves the JPEGs its GPU path does not take to the Python stages."""
    from ingest.decode import _nvimgcodec as nv

    def missing(path=None):
        raise nv.Unavailable("cannot load nvImageCodec's C library")

    monkeypatch.setattr(nv, "load", missing)
    assert native.host_decoder(2) is None


def child_host_jpegs(lib_path: str, root: str, chain_name: str, fmt: str, share: float = 0.0) -> None:
    """The NativeExecutor over the stand-ins (the GPU) and nvImageCodec's real CPU decoder on `host_jpeg_tree` (as
    a file tree or the records of ``fmt``: `host_jpeg_source`) for two epochs, against the Python stages: the same rows, indices and labels; each JPEG of `HOST_JPEGS` (turned by
    its orientation) and the PNG warped exactly as the kernel warps the Python stages' CPU decode of it on their
    plan; the two damaged JPEGs left to Python, which drops them with its own errors; the decode paths counted.
    ``share``: the ``host_jpeg_share`` setting; the GPU's JPEGs it picks (`host_share_picks`) are host-decoded too."""
    from ingest import defaults
    from ingest.decode.cpu import CpuDecoder
    from ingest.engine import Failures, Pipeline
    from ingest.formats.filetree import FileTree
    from ingest.sampler import Sampler

    ops = chains()[chain_name]
    src, files = host_jpeg_source(Path(root), fmt)
    fake, gpu, _ = stand_in_gpu(lib_path, src, True, refused=-1)
    chain, why = native.chain_for(src, ops)
    assert chain is not None, why
    sampler = Sampler(len(src), 4, shuffle=True, seed=5)
    pipe = Pipeline(src, ops=ops, device="cpu")
    picked = host_share_picks([i for i, f in enumerate(files) if f.startswith("gpu_")], share)
    assert 0 < len(picked) < 3 if share == 0.5 else len(picked) == round(3 * share), picked   # (the test's premise)
    with defaults.set(host_jpeg_share=share):
        seen, reasons, stats = two_epochs(pipe, chain, sampler, 2, gpu, host_jpegs=True)
    assert stats["fallbacks"] == {"not a GPU JPEG": 2, "decoder": 2}, stats   # truncated, scanless: each epoch
    paths = {k: v for k, v in pipe.decode_stage.decode_paths.items() if v}
    want_paths = {"gpu": 2 * (3 - len(picked)), "cpu-native": 2 * (len(HOST_JPEGS) + 1 + len(picked)),
                  "cpu-fallback": 2 * 2}
    assert paths == {k: v for k, v in want_paths.items() if v}, paths
    cpu, reference = CpuDecoder(), Pipeline(src, ops=ops, device="cpu")
    compared, want_reasons = 0, []
    for epoch in range(2):
        python_failures = Failures(2, sampler.samples())
        for plan in sampler.batches(epoch):
            idx, x, y = seen[compared]
            reference.start_epoch(Failures(2, sampler.samples()))
            work = reference.read(plan)
            names = [files[i] for i in work.indices.tolist()]
            on_host = [name[0] in "hp" or i in picked for name, i in zip(names, work.indices.tolist())]
            ims = [torch.from_numpy(cpu.decode(bytes(memoryview(r.image).cast("B")), name)
                                    if host else np.zeros((hh, ww, 3), np.uint8) if name[0] == "x"
                                    else pattern(hh, ww, len(memoryview(r.image).cast("B"))))
                   for name, host, (hh, ww), r in zip(names, on_host, work.sizes, work.records)]
            want = kernel_reference(fake, work, ops, ims)
            reference.start_epoch(python_failures)
            python = reference.run(plan)
            assert torch.equal(idx, python.indices) and torch.equal(y, python.labels), (epoch, plan.number, idx,
                                                                                       python.indices)
            where = work.indices.tolist()
            for row, i in enumerate(idx.tolist()):
                name, w = files[i], want[where.index(i)]
                got = x[row] if chain.layout is not None else x[row].permute(1, 2, 0)
                assert name[0] != "x", name
                if name[0] in "hp" or i in picked:   # decoded on the host: the Python stages' pixels, the same kernel
                    assert torch.equal(got, w), (epoch, plan.number, row, name)
                    assert_kernel_row(x[row], python.images[row].permute(1, 2, 0) if chain.layout is None
                                      else python.images[row], chain, ops, f"epoch {epoch} row {row} {name}")
                else:   # (the stand-in's pattern)
                    assert_close(got, w, ops, f"epoch {epoch} row {row} {name}")
            compared += 1
        want_reasons += [(name, reason) for name, _, reason in python_failures.items]
    assert sorted(reasons) == sorted(want_reasons) and len(reasons) == 4, (reasons, want_reasons)
    damaged = {src.name(files.index(name)) for name in ("x_truncated.jpg", "x_scanless.jpg")}
    assert {name for name, _ in reasons} == damaged, reasons
    print(f"host jpeg batches compared: {compared}")


def Image_mode(path: str) -> str:
    from PIL import Image
    with Image.open(path) as im:
        return im.mode


def test_raw_shards_on_a_stand_in_driver_equal_the_kernel_on_the_python_plan(tmp_path, stand_in):
    done = _child(stand_in, str(tmp_path), "rrc-flip-normalize", "raw")
    for case in RAW_CASES:
        assert f"{case}: raw batches compared: 6" in done.stdout, done.stdout
    for k, chain in enumerate(["crop-pad-resize", "flip-normalize", "shorter-flip"]):
        (tmp_path / str(k)).mkdir()
        done = _child(stand_in, str(tmp_path / str(k)), chain, "raw")
        assert "fixed: raw batches compared: 6" in done.stdout, done.stdout


def test_raw_shards_the_engine_cannot_take_are_refused(tmp_path):
    from ingest.formats.raw import RawSource
    ops = chains()["rrc-flip-normalize"]
    gray = RawSource(raw_source(tmp_path / "gray", "gray")[0])
    _, why = native.chain_for(gray, ops)
    assert why == "RawSource gives no native table here: its pixels have 1 channel, and the native engine takes 3 (RGB)"
    _, why = native.chain_for(RawSource(raw_source(tmp_path / "arrays", "arrays")[0]), ops)
    assert why == "RawSource gives no native table here: its shards hold no 'image' field of pixels", why
    # an output size that follows the image's: one size over one pixel shape, none over shapes that differ
    ragged = RawSource(raw_source(tmp_path / "ragged", "ragged")[0])
    fixed = RawSource(raw_source(tmp_path / "fixed", "fixed")[0])
    for name, size in (("flip-normalize", (28, 36)), ("shorter-flip", (20, 25))):
        chain, why = native.chain_for(fixed, chains()[name])
        assert chain is not None and chain.size == size, (name, why, chain and chain.size)
        _, why = native.chain_for(ragged, chains()[name])
        assert why == "its op chain's output size depends on the image's (the output ring is made at start)", why


RAW_CASES = ["fixed", "ragged-crc"]


def raw_source(root: Path, case: str) -> tuple[Path, int | None]:
    """A raw dataset of 11 samples of ``case``: "fixed" (one pixel shape: the Python stages' direct reads), "ragged"
    (shapes that differ), "ragged-crc" (the same, sample 6's pixels with a changed byte), "gray" (1 channel) or
    "arrays" (no image field); its directory and the index of the sample whose CRC
    fails (None: none)."""
    from ingest.formats.base import Field, Record
    from ingest.formats.raw import RawWriter
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    if case == "arrays":
        fields = {"x": Field("array"), "label": Field("int")}
    else:
        fields = {"image": Field("pixels"), "label": Field("int")}
    with RawWriter(root, "part-000", fields) as w:
        for i in range(11):
            h, ww = (28, 36) if case == "fixed" else (20 + 3 * i, 30 + 2 * (i % 5))
            pixels = rng.integers(0, 256, (h, ww, 1 if case == "gray" else 3), dtype=np.uint8)
            w.add(Record(None, i % 4, {"x": pixels}) if case == "arrays" else Record(pixels, i % 4, {}))
    if case != "ragged-crc":
        return root, None
    from ingest.formats.raw import RawSource
    src = RawSource(root)
    at = int(src.ranges([6])[1][0]) + 100
    path = Path(src.paths[0])
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    return root, 6


def child_raw(lib_path: str, root: str, chain_name: str, case: str) -> None:
    """The NativeExecutor over the stand-in driver on a raw dataset for two epochs (with each batch's indices),
    against the Python stages: the same rows, indices and labels (a sample whose CRC fails dropped with the error
    the raw reader gives), and each image exactly the kernel run on the Python planner's warp over its pixels (what
    the Python stages run on a GPU; on the CPU they run op by op, within a level of it)."""
    from ingest.engine import Failures, Pipeline
    from ingest.formats.raw import RawSource
    from ingest.sampler import Sampler

    ops = chains()[chain_name]
    path, bad = raw_source(Path(root), case)
    src = RawSource(path, check="crc" if bad is not None else None)
    fake, _, _ = stand_in_gpu(lib_path, src, True, refused=-1)
    gpu = (0, (1, 2, 3))   # a pixels table decodes nothing: the device and the kernels
    chain, why = native.chain_for(src, ops)
    assert chain is not None and chain.table.kind == "pixels", why
    assert (chain.table.crcs is not None) == (bad is not None)
    sampler = Sampler(len(src), 4, shuffle=True, seed=11)
    budget = 0 if bad is None else 2
    pipe = Pipeline(src, ops=ops, device="cpu")
    assert pipe.direct == (case == "fixed")
    seen, reasons, stats = two_epochs(pipe, chain, sampler, budget, gpu)
    assert not stats["fallbacks"] and stats["failures"] == (0 if bad is None else 2), stats
    reference = Pipeline(src, ops=ops, device="cpu")
    compared, want_reasons = 0, []
    for epoch in range(2):
        python_failures = Failures(budget, sampler.samples())
        for plan in sampler.batches(epoch):
            idx, x, y = seen[compared]
            reference.start_epoch(Failures(budget, sampler.samples()))
            work = reference.read(plan)
            if work.ops_plan is None:   # a direct read: its draws are made in the decode stage
                work = reference.decode_stage.run(work)
            want = pixel_kernel_reference(fake, work, ops)
            reference.start_epoch(python_failures)
            python = reference.run(plan)
            assert torch.equal(idx, python.indices) and torch.equal(y, python.labels), (epoch, plan.number, idx,
                                                                                       python.indices)
            assert bad is None or bad not in idx.tolist()
            for row in range(len(idx)):
                got = x[row] if chain.layout is not None else x[row].permute(1, 2, 0)
                assert torch.equal(got, want[row]), f"{case} epoch {epoch} batch {plan.number} row {row}"
                assert_kernel_row(x[row], python.images[row].permute(1, 2, 0) if chain.layout is None
                                  else python.images[row], chain, ops, f"{case} epoch {epoch} row {row}")
            compared += 1
        want_reasons += [(name, reason) for name, _, reason in python_failures.items]
    # the sample whose CRC fails: dropped in each epoch with the error the raw reader raises
    assert reasons == want_reasons == ([] if bad is None else [(src.name(bad), want_reasons[0][1])] * 2), reasons
    assert bad is None or "field 'image': CRC32C" in reasons[0][1], reasons
    print(f"{case}: raw batches compared: {compared}")


def two_epochs(pipe, chain, sampler, budget: int, gpu, **kw) -> tuple[list, list, dict]:
    """Two epochs of a NativeExecutor (with each batch's indices, ``budget`` failures allowed per epoch): each
    batch's (indices, images, labels), the failures' (name, reason) in order, its stats."""
    from ingest.engine import Failures
    failures = Failures(budget, sampler.samples())
    ex = native.NativeExecutor(pipe, chain, sampler, epoch=0, start=0, offset=0, failures=failures,
                               budget=lambda: Failures(budget, sampler.samples()), prefetch=1, gpu=gpu,
                               with_fields=True, **kw)
    seen, reasons = [], []
    for epoch in range(2):
        seen += [(b.indices.clone(), b.images.clone(), b.labels.clone()) for b in ex]
        reasons += [(name, reason) for name, _, reason in (failures if epoch == 0 else ex._failures[1]).items]
    stats = ex.stats()
    ex.close()
    return seen, reasons, stats


def pixel_kernel_reference(fake, work, ops) -> torch.Tensor:
    """The kernel run on the Python planner's warp over the batch's own pixels (a direct read's batch tensor, else
    each record's), as the Python stages run it on a GPU."""
    if isinstance(work.images, torch.Tensor):
        ims = [work.images[k].contiguous() for k in range(len(work.images))]
    else:
        ims = [torch.from_numpy(np.ascontiguousarray(r.image)) for r in work.records]
    return kernel_reference(fake, work, ops, ims)


@pytest.mark.parametrize("fmt", ["coco", "tfrecord"])
@pytest.mark.parametrize("chain", ["iou-flip-resize-pad", "iou-flip-resize-padbatch", "resize-crop-pad"])
def test_detection_on_a_stand_in_driver_equals_the_python_stages(tmp_path, stand_in, chain, fmt):
    done = _child(stand_in, str(tmp_path), chain, f"detection-{fmt}")
    assert "detection batches compared: 6" in done.stdout, done.stdout


@pytest.mark.parametrize("fmt", ["coco", "tfrecord"])
@pytest.mark.parametrize("chain", ["iou-flip-resize-pad", "iou-flip-resize-padbatch"])
def test_a_detection_loader_on_a_stand_in_driver_hands_out_the_python_engines_dicts(tmp_path, stand_in, chain, fmt):
    done = _child(stand_in, str(tmp_path), chain, f"detection-loader-{fmt}")
    assert "loader batches compared: 6" in done.stdout, done.stdout


def test_tfrecord_detection_records_the_engine_does_not_take_fall_back(tmp_path, stand_in):
    done = _child(stand_in, str(tmp_path), "iou-flip-resize-pad", "detection-tfrecord-fallback")
    assert "fallback batches compared: 3" in done.stdout, done.stdout


def deeplab_samples(count: int = 12) -> list[tuple[bytes, int, bytes]]:
    """(image, label, mask PNG) of ``count`` segmentation samples: 8-bit gray masks of class ids with 255 edges,
    sample 2's a palette PNG, sample 3's image a PNG (the engine's read team decodes it), sample 7's mask a size off
    its image's and
    sample 10's an RGB PNG (the Python stages fail both samples), sample 5 the image the stand-in decoder refuses."""
    from test_native_records import jpeg_bytes
    from PIL import Image
    from conftest import encode, textured

    out = []
    for i in range(count):
        h, w = 20 + 3 * i, 30 + 2 * (i % 5)
        values = ((np.arange(h)[:, None] // 3 + np.arange(w)[None] // 4 + i) % 21).astype(np.uint8)
        values[::7] = 255
        mask = Image.fromarray(values[:-2] if i == 7 else values, mode="L")
        if i == 2:
            mask = mask.convert("P")
        elif i == 10:
            mask = mask.convert("RGB")
        image = encode(Image.fromarray(textured(h, w, i)), "PNG") if i == 3 else jpeg_bytes(h, w, seed=i)
        out.append((image, i % 5, encode(mask, "PNG")))
    return out


def deeplab_source(root: Path):
    """A DeepLab-layout TFRecord file of the 12 `deeplab_samples` (``image/encoded``, ``image/class/label``,
    ``image/segmentation/class/encoded``)."""
    from test_native_records import example
    from ingest.formats.tfrecord import TFRecordSource

    path = root / "seg.tfrecord"
    path.write_bytes(b"".join(example(image__encoded=image, image__class__label=label,
                                      image__segmentation__class__encoded=mask)
                              for image, label, mask in deeplab_samples()))
    return TFRecordSource(str(path))


def deeplab_lmdb(root: Path):
    """The 12 `deeplab_samples` as an LMDB of our layout written by `LMDBWriter`, the mask field declared between
    the image and the label (the engine finds each field by the record's kind codes)."""
    from ingest.formats.base import Field, Record
    from ingest.formats.lmdb import LMDBSource, LMDBWriter

    writer = LMDBWriter(root, "seg", {"image": Field("image"), "mask": Field("mask"), "label": Field("int")})
    for image, label, mask in deeplab_samples():
        writer.add(Record(image, label, {"mask": mask}))
    writer.close()
    return LMDBSource(str(root / "seg.lmdb"))


#: The WebDataset set's samples the Python stages fail: masks of another size than the image's (7), RGB (10) and
#: missing (11).
WDS_FAILED = (7, 10, 11)


def deeplab_tar(root: Path, *, crcs: bool = False):
    """The 12 `deeplab_samples` as a WebDataset tar (``<key>.jpg`` or ``.png``, ``.cls``, the mask field ``seg`` as
    ``<key>.seg.mask.png``): an even sample's mask member follows its label (read with its image in one read), an
    odd one's comes first (read on its own), sample 11 has none. ``crcs``: with the members' CRC32C file."""
    from test_native_records import hand_tar
    from ingest.formats import checks
    from ingest.formats.webdataset import WebDatasetSource

    members = []
    for i, (image, label, mask) in enumerate(deeplab_samples()):
        own = [(f"{i:06d}.{'png' if i == 3 else 'jpg'}", image), (f"{i:06d}.cls", str(label).encode())]
        seg = [(f"{i:06d}.seg.mask.png", mask)] if i != 11 else []
        members += seg + own if i % 2 else own + seg
    tar = hand_tar(root / "seg.tar", members)
    if crcs:
        checks.write_file(str(tar) + checks.SUFFIX, [checks.crc(data) for _, data in members])
    return WebDatasetSource(str(tar), fields={"image": ("jpg", "png"), "label": "cls", "seg": "seg.mask.png"})


def child_masks(lib_path: str, root: str, chain_name: str, fmt: str = "tfrecord") -> None:
    """The NativeExecutor over the stand-ins on a DeepLab set (``fmt``: the TFRecord file, the LMDB of our layout
    with its records' CRC32Cs, or the WebDataset tar with its members' CRC32Cs) with its batches' fields, two epochs, against the Python stages: the same rows (the samples
    whose mask fails dropped, with the Python engine's failures), labels and masks exactly; images as the kernel
    over the stand-in's patterns, the fallback rows' as Python's."""
    from ingest.engine import Failures, Pipeline
    from ingest.sampler import Sampler

    ops = chains()[chain_name]
    src = {"tfrecord": deeplab_source, "lmdb": deeplab_lmdb}.get(fmt, lambda r: deeplab_tar(r, crcs=True))(Path(root))
    refused = len(src.parse(5, read_location(src.locate(5))).image)
    fake, gpu, _ = stand_in_gpu(lib_path, src, True, refused=refused)
    chain, why = native.chain_for(src, ops)
    name, failed = ("seg", WDS_FAILED) if fmt == "webdataset" else ("mask", (7, 10))
    assert chain is not None and chain.table.mask == {"tfrecord": (name, b"image/segmentation/class/encoded"),
                                                      "lmdb": (name, b"\x0a")}.get(fmt, (name, None)), why
    assert fmt != "webdataset" or chain.table.mask_crcs is not None   # (the members' CRC32Cs, checked as read)
    assert fmt != "lmdb" or chain.table.crcs is not None and chain.table.keys == (b"\x01\x0a\x03",)
    sampler = Sampler(len(src), 4, shuffle=True, seed=5)
    failures = Failures(len(failed), sampler.samples())
    ex = native.NativeExecutor(Pipeline(src, ops=ops, device="cpu"), chain, sampler, epoch=0, start=0, offset=0,
                               failures=failures, budget=lambda: Failures(len(failed), sampler.samples()),
                               prefetch=1, gpu=gpu, with_fields=True)
    seen = []
    for epoch in range(2):
        seen += [(b.indices.clone(), b.images.clone(), b.labels.clone(), b.fields[name].clone()) for b in ex]
    stats = ex.stats()
    ex.close()
    assert stats["fallbacks"].get("mask") == 2 * 2, stats   # samples 7 and 10, each epoch (11: the table's)
    assert sorted(name for name, _, _ in failures.items) == sorted(src.name(i) for i in failed), failures.items
    reference = Pipeline(src, ops=ops, device="cpu")
    compared = 0
    for epoch in range(2):
        for plan in sampler.batches(epoch):
            idx, x, y, m = seen[compared]
            reference.start_epoch(Failures(len(failed), sampler.samples()))
            work = reference.read(plan)
            want = kernel_reference(fake, work, ops)
            reference.start_epoch(Failures(len(failed), sampler.samples()))
            python = reference.run(plan)
            assert torch.equal(idx, python.indices) and torch.equal(y, python.labels), (epoch, plan.number, idx,
                                                                                       python.indices, y, python.labels)
            assert m.dtype == torch.uint8 and torch.equal(m, python.fields[name]), (epoch, plan.number)
            for row, i in enumerate(idx.tolist()):
                k = work.indices.tolist().index(i)
                if i == 5:   # (3's PNG image the read team decodes: the kernel over its pixels)
                    assert_close(x[row], python.images[row], ops, f"epoch {epoch} fallback row {row}")
                else:
                    assert_kernel_row(x[row], want[k], chain, ops, f"epoch {epoch} row {row}")
            compared += 1
    print(f"mask batches compared: {compared}")


def record_source(root: Path, fmt: str):
    """A source of ``fmt`` holding the same 11 records (record 3 a PNG), and the index of the record whose CRC fails
    (None: none)."""
    from test_native_records import (datum, flip, images, lmdb_source_of, write_lmdb_ours, write_tar,
                                     write_tfrecord)
    from ingest.formats.tfrecord import TFRecordSource
    from ingest.formats.webdataset import WebDatasetSource
    records = images(11, png=(3,))
    if fmt.startswith("tfrecord"):
        path = write_tfrecord(root, records)
        if fmt == "tfrecord-crc":
            loc = TFRecordSource(str(path)).locate(6)
            flip(path, loc.offset + loc.length - 30)
            return TFRecordSource(str(path)), 6
        return TFRecordSource(str(path)), None
    if fmt == "lmdb":
        return write_lmdb_ours(root, records), None
    if fmt == "caffe":
        return lmdb_source_of(root, [datum(r.label, bytes(r.image)) for r in records]), None
    return WebDatasetSource(str(write_tar(root, records))), None


def child_records(lib_path: str, root: str, chain_name: str, fmt: str) -> None:
    """The NativeExecutor over the stand-ins on a record format for two epochs, against the Python stages: the same
    labels and rows (the refused image's filled by Python; the PNG's decoded by the read team, equal to the kernel
    over its pixels), a record whose CRC fails dropped (with a budget of one failure) and named as the reader names
    it."""
    from ingest.engine import Failures, Pipeline
    from ingest.sampler import Sampler

    ops = chains()[chain_name]
    src, bad = record_source(Path(root), fmt)
    refused = len(src.parse(5, read_location(src.locate(5))).image)   # the stand-in decoder refuses this one
    fake, gpu, _ = stand_in_gpu(lib_path, src, True, refused=refused)
    chain, why = native.chain_for(src, ops)
    assert chain is not None, why
    sampler = Sampler(len(src), 4, shuffle=True, seed=3)
    budget = 0 if bad is None else 1
    failures = Failures(budget, sampler.samples())
    ex = native.NativeExecutor(Pipeline(src, ops=ops, device="cpu"), chain, sampler, epoch=0, start=0, offset=0,
                               failures=failures, budget=lambda: Failures(budget, sampler.samples()), prefetch=1,
                               gpu=gpu)
    seen = []
    for epoch in range(2):
        seen += [(batch.indices.clone(), batch.images.clone(), batch.labels.clone()) for batch in ex]
    ex.close()
    reference = Pipeline(src, ops=ops, device="cpu")
    compared = 0
    for epoch in range(2):
        for plan in sampler.batches(epoch):
            _, x, y = seen[compared]
            reference.start_epoch(Failures(budget, sampler.samples()))   # (a budget each: read, then run)
            work = reference.read(plan)
            want = kernel_reference(fake, work, ops)
            reference.start_epoch(Failures(budget, sampler.samples()))
            python = reference.run(plan)
            assert torch.equal(y, python.labels), (epoch, plan.number, y, python.labels)
            for row, record in enumerate(work.records):
                image = bytes(memoryview(record.image).cast("B"))
                if len(image) == refused:
                    assert_close(x[row], python.images[row], ops, f"{fmt} epoch {epoch} fallback row {row}")
                else:
                    assert_close(x[row], want[row], ops, f"{fmt} epoch {epoch} row {row}")
            compared += 1
    if bad is not None:
        [(name, stage, reason)] = failures.items
        assert name == src.name(bad) and "bad data CRC" in reason, failures.items
    print(f"{fmt}: record batches compared: {compared}")


def child_crc(lib_path: str, root: str, chain_name: str) -> None:
    """The NativeExecutor over the stand-ins on a checked RecordIO file whose record 4 has a changed byte: with a
    budget of one failure, that row is missing from its batch (labels as the Python stages give them) and the
    failure names the record."""
    from ingest.engine import Failures, Pipeline
    from ingest.formats.recordio import RecordIOSource
    from ingest.sampler import Sampler
    from test_native import _corrupt_record

    ops = chains()[chain_name]
    rec, _ = _corrupt_record(Path(root))
    src = RecordIOSource(rec)
    _, gpu, _ = stand_in_gpu(lib_path, src, True, refused=-1)
    chain, why = native.chain_for(src, ops)
    assert chain is not None and chain.table.crcs is not None, why
    sampler = Sampler(len(src), 4, shuffle=False, seed=9)
    failures = Failures(1, sampler.samples())
    ex = native.NativeExecutor(Pipeline(src, ops=ops, device="cpu"), chain, sampler, epoch=0, start=0, offset=0,
                               failures=failures, budget=lambda: Failures(1, sampler.samples()), prefetch=1,
                               gpu=gpu)
    got = [batch.labels.clone() for batch in ex]
    ex.close()
    reference = Pipeline(src, ops=ops, device="cpu")
    reference.start_epoch(Failures(1, sampler.samples()))
    want = [reference.run(plan).labels for plan in sampler.batches(0)]
    assert [len(y) for y in got] == [4, 3, 1]
    assert all(torch.equal(g, w) for g, w in zip(got, want)), (got, want)
    [(name, stage, reason)] = failures.items
    assert (name, stage) == (src.name(4), "read") and "CRC32C" in reason, failures.items
    print(f"crc batches compared: {len(got)}")


def child(lib_path: str, root: str, chain_name: str, regions: bool) -> None:
    """Run one epoch (and the next one's first batches) on the engine with the stand-ins, then compare."""
    from ingest.formats.filetree import FileTree
    from ingest.engine import Pipeline
    from ingest.sampler import Sampler

    ops = chains()[chain_name]
    src = FileTree(root)
    fake, gpu, refused = stand_in_gpu(lib_path, src, regions)
    chain, why = native.chain_for(src, ops)
    assert chain is not None, why
    B, slots = 4, 3
    sampler = Sampler(len(src), B, shuffle=True, seed=9)
    t = chain.table
    engine = native.ENGINE.Engine(list(t.paths), t.files, t.offsets, t.sizes, t.labels, 0, chain.desc, sampler.seed,
                                  B, slots, 2, 89_478_485, regions, gpu)
    h, w = chain.size
    shape = (B, 3, h, w) if chain.layout == "NCHW" else (B, h, w, 3)
    outs = [torch.full(shape, 7, dtype=chain.dtype) for _ in range(slots)]
    labels = [torch.full((B,), -5, dtype=torch.int64) for _ in range(slots)]
    indices = [np.zeros(B, np.int64) for _ in range(slots)]
    pads = [np.zeros(B, np.uint8) for _ in range(slots)]
    for k in range(slots):
        engine.set_slot(k, outs[k].data_ptr(), labels[k].data_ptr(), indices[k], pads[k])
    for epoch in (0, 1):
        idx, bounds, pad = native.epoch_arrays(sampler, epoch)
        engine.add_epoch(epoch, 0, idx, bounds, pad)
    got = []
    while True:
        kind, k, epoch, number, rows, notes = engine.next()
        if kind == native.ENGINE.EPOCH_END:
            break
        got.append((number, outs[k][:rows].clone(), labels[k][:rows].clone(), indices[k][:rows].copy(), notes))
        engine.release(k, 0)
    stats = engine.stats()
    engine.close()
    assert fake.fake_launches() >= len(got) and stats["arenas_made"] >= 1

    pipe = Pipeline(src, ops=ops, device="cpu")
    compared = 0
    for (number, out, lab, idx, notes), plan in zip(got, sampler.batches(0)):
        work = pipe.read(plan)
        assert idx.tolist() == work.indices.tolist() and lab.tolist() == [r.label for r in work.records]
        fallback = {row: code for _, row, stage, code, _ in notes or () if stage == native.ENGINE.NOTE_FALLBACK}
        assert set(fallback) == set(fallback_rows(src, idx, refused))
        host = {row for _, row, stage, _, _ in notes or () if stage == native.ENGINE.NOTE_HOST}
        assert host == {row for row, i in enumerate(idx.tolist()) if src.name(i).endswith(".png")}, (host, idx)
        assert all(code == 4 for row, code in fallback.items() if os.path.getsize(src.name(idx[row])) == refused)
        want = kernel_reference(fake, work, ops)
        for row in range(len(idx)):
            if row not in fallback:
                assert_close(out[row], want[row], ops, f"batch {number} row {row}")
        compared += 1
    print(f"batches compared: {compared}")


def stand_in_gpu(lib_path: str, src, regions: bool, refused: int | None = None):
    """The stand-in library, the engine's `gpu` argument for it, and the byte size of the image it refuses (default:
    that of the file tree's image 1)."""
    fake = ctypes.CDLL(lib_path)

    def address(name):
        return ctypes.cast(getattr(fake, name), ctypes.c_void_p).value

    if refused is None:
        refused = os.path.getsize(src.name(1))   # the stand-in decoder refuses images of this many bytes
    fake.fake_refuse(ctypes.c_long(refused))
    fns = tuple(address(n) for n in ("nv_create", "nv_info", "nv_sub", "nv_image", "nv_decode", "nv_wait",
                                     "nv_status", "nv_future_destroy"))
    gpu = (0, fns, (address("nv_destroy"), address("nv_destroy")), 1, (11, 12), 1,
           (bytes(32), 0, 8, 16, 20, 24), (bytes(16), 0, 8), (bytes(16), 0), (1, 2, 3))
    return fake, gpu, refused


def fallback_rows(src, idx, refused: int) -> list[int]:
    """The rows Python fills: the rotated and the progressive JPEG, and the image the decoder refuses (the PNG's the
    engine's read team decodes)."""
    return [row for row, i in enumerate(idx.tolist())
            if os.path.basename(src.name(i)).startswith("z_") or os.path.getsize(src.name(i)) == refused]


def kernel_reference(fake, work, ops, ims: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The kernel run on the Python planner's warp over whole images as the engine has them (`kernel_source`: the
    stand-in's patterns, a PNG's pixels), or over ``ims`` where given."""
    from ingest.ops import Normalize, _warp_kernel
    from ingest.ops.base import sizes_of
    from ingest.ops.resample import _fill_values, _setup
    normalize = ops[-1] if isinstance(ops[-1], Normalize) else None
    if ims is None:
        ims = [torch.from_numpy(kernel_source(hh, ww, r.image)) for (hh, ww), r in zip(work.sizes, work.records)]
    warp, c = work.ops_plan.warp, 3
    coefficients = normalize.epilogue(c)[:2] if normalize else None
    packed = _warp_kernel.pack(ims, warp.out_sizes, _setup(warp, sizes_of(ims)), _fill_values(warp.fill, c),
                               coefficients)
    dtype = normalize.dtype if normalize else torch.uint8
    nchw = normalize is not None and normalize.layout == "NCHW"
    want, _ = _warp_kernel.output(packed, dtype, "cpu", nchw)
    fake.run(["nearest", "bilinear", "bicubic"].index(warp.interpolation), *packed.grid,
             ctypes.c_void_p(packed.ip.ctypes.data), ctypes.c_void_p(packed.fp.ctypes.data),
             ctypes.c_void_p(want.data_ptr()), c, _warp_kernel._KINDS[dtype], int(nchw), int(normalize is not None))
    return want


def assert_close(got: torch.Tensor, want: torch.Tensor, ops, what: str) -> None:
    from ingest.ops import Normalize
    scale = STD[0] if isinstance(ops[-1], Normalize) else 1.0
    diff = (got.double() - want.double()).abs() * scale
    assert diff.max() <= 1.05, f"{what}: {diff.max():.3f} levels off"   # (a level of the channel of least std)


def assert_kernel_row(got: torch.Tensor, want: torch.Tensor, chain, ops, what: str) -> None:
    """An executor's image row against the kernel's (HWC) output; NHWC memory is handed out as NCHW views."""
    assert_close(got.permute(1, 2, 0) if chain.layout is None else got, want, ops, what)


def child_executor(lib_path: str, root: str, chain_name: str) -> None:
    """The NativeExecutor over the stand-ins (a CPU pipeline, host tensors as its ring) for three epochs, the loop
    keeping every other batch whole and a view of the others: slots held are replaced, a starved engine gets
    the oldest slot out back, fallback rows are filled by the Python pipeline; every batch is as planned and
    what the loop kept is never written again."""
    from ingest.formats.filetree import FileTree
    from ingest.engine import Failures, Pipeline
    from ingest.sampler import Sampler

    ops = chains()[chain_name]
    src = FileTree(root)
    fake, gpu, refused = stand_in_gpu(lib_path, src, True)
    chain, why = native.chain_for(src, ops)
    pipe = Pipeline(src, ops=ops, device="cpu")
    sampler = Sampler(len(src), 4, shuffle=True, seed=9)
    ex = native.NativeExecutor(pipe, chain, sampler, epoch=0, start=0, offset=0, failures=Failures(0, 0),
                               budget=lambda: Failures(0, 0), prefetch=1, gpu=gpu)
    kept, views, seen = [], [], []
    for epoch in range(3):
        for k, batch in enumerate(ex):
            x, y = batch.images, batch.labels
            seen.append((epoch, batch.number, x.clone(), y.clone()))
            if k % 2:
                kept.append((len(seen) - 1, x, y))
            else:
                views.append((len(seen) - 1, x[:1, 0]))
            del batch, x, y
        assert ex.ended.epoch == epoch + 1
    stats = ex.stats()
    ex.close()
    assert stats["slot_waits"] > 0 and sum(stats["fallbacks"].values()) == 3 * 3, stats
    assert stats["outputs_made"] > 2, stats   # slots held by the loop were replaced
    # the decode paths: every sample's row the engine's (the PNG's decoded by its read team) but the fallback rows,
    # over three epochs
    assert pipe.decode_stage.decode_paths == {"gpu": 3 * len(src) - 12, "cpu-fallback": 9, "cpu-native": 3}, \
        pipe.decode_paths
    for at, x, y in kept:
        assert torch.equal(x, seen[at][2]) and torch.equal(y, seen[at][3])
    for at, v in views:
        assert torch.equal(v, seen[at][2][:1, 0])
    reference = Pipeline(src, ops=ops, device="cpu")
    compared = 0
    for epoch in range(3):
        for plan in sampler.batches(epoch):
            _, number, x, y = seen[compared]
            work = reference.read(plan)
            want = kernel_reference(fake, work, ops)
            python = reference.run(plan)   # the Python stages' batch: the fallback rows' reference
            assert torch.equal(y, python.labels)
            rows = fallback_rows(src, plan.indices, refused)
            for row in range(len(plan.indices)):
                if row in rows:
                    assert_close(x[row], python.images[row], ops, f"epoch {epoch} batch {number} fallback row {row}")
                else:
                    assert_kernel_row(x[row], want[row], chain, ops, f"epoch {epoch} batch {number} row {row}")
            compared += 1
    print(f"executor batches compared: {compared}")


def detection_chains():
    from ingest.ops import Flip, PadTo, RandomIoUCrop, Resize
    from ingest.ops.geometry import CenterCrop
    return {"iou-flip-resize-pad": [RandomIoUCrop(), Flip(p=0.5), Resize(40, max_size=64), PadTo(multiple=32)],
            "iou-flip-resize-padbatch": [RandomIoUCrop(), Flip(p=0.5), Resize(40, max_size=64),
                                         PadTo(multiple=32, batch=True)],
            # the centre crop drops the corner boxes of image 4 (all of them)
            "resize-crop-pad": [Resize(48, max_size=80), CenterCrop(32), Flip(p=0.5), PadTo(multiple=16)]}


def coco_source(root: Path):
    """A COCO set of 12 JPEG images with 0 to 4 boxes each (image 7 none, image 4 only boxes in its top-left
    corner), xywh boxes given back as asked (cxcywh), image 9 a PNG named .jpg (the engine's read team decodes it);
    and the byte
    size of image 5, which the stand-in decoder refuses."""
    from test_coco import ann, write_coco
    from PIL import Image
    from conftest import encode, textured
    from ingest.formats.coco import CocoSource
    images = [(i + 1, 40 + 7 * i, 60 + 5 * (i % 4)) for i in range(12)]
    anns, aid = [], 1
    for iid, h, w in images:
        boxes = [] if iid == 8 else ([[0, 0, 3, 3], [1, 1, 4, 2]] if iid == 5 else
                                     [[2 + 3 * k, 3 + 2 * k, 10 + k, 8 + 3 * k] for k in range(1 + iid % 4)])
        for b in boxes:
            anns.append(ann(aid, iid, b, 1 + aid % 2, iscrowd=int(aid % 5 == 0), area=float(aid) + 0.5))
            aid += 1
    path = write_coco(root, anns, images=images)
    (root / "img" / "000010.jpg").write_bytes(encode(Image.fromarray(textured(images[9][1], images[9][2], 9)),
                                                      "PNG"))
    src = CocoSource(path, images=root / "img", cache=False, box_format="cxcywh", check_sizes=False)
    return src, os.path.getsize(root / "img" / "000006.jpg")


#: The box format each chain's TFRecord source is read in (the engine converts a record's boxes as the reader does).
TF_BOX_FORMATS = {"iou-flip-resize-pad": "cxcywh", "iou-flip-resize-padbatch": "xyxy", "resize-crop-pad": "xywh"}


def od_tfrecord(root: Path, box_format: str, damaged: tuple[int, ...] = (), key: str = "image/object/bbox/xmin"):
    """`coco_source`'s samples as TFRecord records of the Object Detection API layout (normalized boxes, the image's
    height and width, categories, iscrowd, area, a decimal source id; image 9 the PNG), read back with boxes as
    ``box_format``; the records ``damaged`` hold one value fewer in list ``key`` (default: one xmin fewer than their
    other coordinate lists). Returns the source and the byte size of image 5, which the stand-in decoder refuses."""
    from ingest.formats import _protos
    from ingest.formats.tfrecord import TFRecordSource, TFRecordWriter, frame, iter_stream, write_index
    coco, refused = coco_source(root)
    writer = TFRecordWriter(root, "od", coco.fields, box_format="cxcywh")
    for i in range(len(coco)):
        writer.add(coco.parse(i, read_location(coco.locate(i))))
    writer.close()
    path = root / "od.tfrecord"
    if damaged:
        records = []
        for k, (_, data) in enumerate(iter_stream(str(path))):
            if k in damaged:
                example = _protos.Example.FromString(data)
                feature = example.features.feature[key]
                getattr(feature, feature.WhichOneof("kind")).value.pop()
                data = example.SerializeToString(deterministic=True)
            records.append(frame(data))
        path.write_bytes(b"".join(records))
        write_index(str(path))
    return TFRecordSource(str(path), box_format=box_format), refused


def detection_source(root: Path, fmt: str, chain_name: str):
    """The detection set of ``fmt`` ("coco" or "tfrecord", the same samples) and the refused image's byte size."""
    return coco_source(root) if fmt == "coco" else od_tfrecord(root, TF_BOX_FORMATS[chain_name])


def kernel_parts(fake, work, ops) -> list[torch.Tensor]:
    """`kernel_reference` per sample, HWC at each sample's own size."""
    from ingest.ops import _warp_kernel
    from ingest.ops.base import sizes_of
    from ingest.ops.resample import _fill_values, _setup
    ims = [torch.from_numpy(kernel_source(hh, ww, r.image)) for (hh, ww), r in zip(work.sizes, work.records)]
    warp = work.ops_plan.warp
    packed = _warp_kernel.pack(ims, warp.out_sizes, _setup(warp, sizes_of(ims)), _fill_values(warp.fill, 3), None)
    buffer, parts = _warp_kernel.output(packed, torch.uint8, "cpu", False)
    fake.run(["nearest", "bilinear", "bicubic"].index(warp.interpolation), *packed.grid,
             ctypes.c_void_p(packed.ip.ctypes.data), ctypes.c_void_p(packed.fp.ctypes.data),
             ctypes.c_void_p(buffer.data_ptr()), 3, 0, 0, 0)
    return list(parts.unbind(0)) if isinstance(parts, torch.Tensor) else parts


def child_detection(lib_path: str, root: str, chain_name: str, fmt: str = "coco") -> None:
    """The NativeExecutor over the stand-ins on a COCO set (or the same samples as Object Detection API TFRecord
    records, whose boxes the engine scans out of each record) with its batches' fields, two epochs, against the
    Python stages: the same rows, boxes, categories, iscrowd, area, image ids, counts and image sizes exactly (the
    refused image's rows filled by Python), images as the kernel over the stand-in's patterns (the PNG's over its
    pixels); what the loop keeps of a batch (all of it, or one image's view and one count) is never written again."""
    from ingest.engine import Failures, Pipeline
    from ingest.sampler import Sampler

    ops = detection_chains()[chain_name]
    src, refused = detection_source(Path(root), fmt, chain_name)
    given = np.array([len(src.parse(i, read_location(src.locate(i))).fields["boxes"]) for i in range(len(src))])
    fake, gpu, _ = stand_in_gpu(lib_path, src, True, refused=refused)
    chain, why = native.chain_for(src, ops)
    assert chain is not None and chain.detection is not None, why
    sampler = Sampler(len(src), 4, shuffle=True, seed=5)
    ex = native.NativeExecutor(Pipeline(src, ops=ops, device="cpu"), chain, sampler, epoch=0, start=0, offset=0,
                               failures=Failures(0, sampler.samples()), budget=lambda: Failures(0, sampler.samples()),
                               prefetch=1, gpu=gpu, with_fields=True)
    seen, kept = [], []
    for epoch in range(2):
        for b in ex:
            images = [im.clone() for im in b.images] if isinstance(b.images, list) else b.images.clone()
            seen.append((b.indices.clone(), images, b.labels.clone(), {k: v.clone() for k, v in b.fields.items()}))
            if len(seen) % 2:   # kept whole (its slot gets new buffers), or one box count and one image's view
                kept.append((len(seen) - 1, b.images, b.fields))
            else:
                kept.append((len(seen) - 1, [b.images[-1]], {"boxes_lengths": b.fields["boxes_lengths"]}))
            del b
    stats = ex.stats()
    ex.close()
    assert sum(stats["fallbacks"].values()) == 2, stats   # the refused image, each epoch (the PNG: the read team's)
    assert stats["outputs_made"] > 2, stats   # slots held by the loop were replaced
    for at, images, fields in kept:   # what the loop kept was never written again
        if isinstance(images, list) and len(images) == 1:
            assert torch.equal(images[0], seen[at][1][-1])
        else:
            assert all(torch.equal(a, b) for a, b in zip(images, seen[at][1]))
        assert all(torch.equal(v, seen[at][3][k]) for k, v in fields.items())
    reference = Pipeline(src, ops=ops, device="cpu")
    reference.deliver(None, with_fields=True)
    compared = pruned = 0
    batchwide = chain.detection.batchwide
    for epoch in range(2):
        for plan in sampler.batches(epoch):
            idx, x, y, fields = seen[compared]
            reference.start_epoch(Failures(0, sampler.samples()))
            work = reference.read(plan)
            want = kernel_parts(fake, work, ops)
            reference.start_epoch(Failures(0, sampler.samples()))
            python = reference.run(plan)
            assert torch.equal(idx, python.indices) and torch.equal(y, python.labels)
            assert list(fields) == list(python.fields), (list(fields), list(python.fields))
            for name, value in python.fields.items():
                assert fields[name].dtype == value.dtype and torch.equal(fields[name], value), \
                    (epoch, plan.number, name, fields[name], value)
            pruned += int(((fields["boxes_lengths"] == 0) & torch.from_numpy(given[idx.numpy()] > 0)).sum())
            python_images = list(python.images.unbind(0)) if batchwide else python.images
            ours = list(x.unbind(0)) if batchwide else x
            assert [tuple(t.shape) for t in ours] == [tuple(t.shape) for t in python_images]
            for row, i in enumerate(idx.tolist()):
                if i == 5:   # the refused image (9's PNG: the kernel over its pixels)
                    assert_close(ours[row], python_images[row], ops, f"epoch {epoch} fallback row {row}")
                else:
                    assert_close(ours[row].permute(1, 2, 0), want[row], ops, f"epoch {epoch} row {row}")
            compared += 1
    assert chain_name != "resize-crop-pad" or pruned >= 2, pruned
    print(f"detection batches compared: {compared}")


def child_detection_fallback(lib_path: str, root: str, chain_name: str) -> None:
    """The NativeExecutor over the stand-ins on Object Detection API records that the engine leaves to Python, one
    epoch with the fields, against the Python stages: record 3, whose xmin list is one shorter than its other
    coordinate lists, falls back and is dropped by the reader's error naming it and the key (a budget of one
    failure); with the slots holding 3 boxes per sample, the records of 4 boxes (2, 6 and 10) fall back ("boxes")
    and come out as the Python stages give them. A record whose categories are fewer than its boxes falls back too,
    and the Python stages' error names the field."""
    from ingest.engine import Failures, Pipeline, native_boxes
    from ingest.sampler import Sampler

    native_boxes.RECORD_BOXES = 3
    ops = detection_chains()[chain_name]
    src, refused = od_tfrecord(Path(root), "xyxy", damaged=(3,))
    _, gpu, _ = stand_in_gpu(lib_path, src, True, refused=refused)
    chain, why = native.chain_for(src, ops)
    assert chain is not None and chain.detection.most == 3, why
    sampler = Sampler(len(src), 4, shuffle=False, seed=5)
    failures = Failures(1, sampler.samples())
    ex = native.NativeExecutor(Pipeline(src, ops=ops, device="cpu"), chain, sampler, epoch=0, start=0, offset=0,
                               failures=failures, budget=lambda: Failures(1, sampler.samples()), prefetch=1, gpu=gpu,
                               with_fields=True)
    got = [(b.indices.clone(), b.labels.clone(), [tuple(im.shape) for im in b.images],
            {k: v.clone() for k, v in b.fields.items()}) for b in ex]
    stats = ex.stats()
    ex.close()
    assert stats["fallbacks"] == {"boxes": 3, "record": 1, "decoder": 1}, stats   # (the PNG: the read team's)
    [(name, stage, reason)] = failures.items
    assert name == src.name(3) and "image/object/bbox" in reason and "different lengths" in reason, failures.items
    reference = Pipeline(src, ops=ops, device="cpu")
    reference.deliver(None, with_fields=True)
    reference.start_epoch(Failures(1, sampler.samples()))
    for (idx, y, shapes, fields), plan in zip(got, sampler.batches(0)):
        python = reference.run(plan)
        assert torch.equal(idx, python.indices) and torch.equal(y, python.labels)
        assert shapes == [tuple(im.shape) for im in python.images]
        assert list(fields) == list(python.fields)
        for name, value in python.fields.items():
            assert fields[name].dtype == value.dtype and torch.equal(fields[name], value), (plan.number, name)
    assert [len(idx) for idx, *_ in got] == [3, 4, 4] and 3 not in got[0][0].tolist()
    # record 2's categories one shorter than its boxes: it falls back, and the Python stages' error is raised
    (Path(root) / "short").mkdir()
    native_boxes.RECORD_BOXES = 256
    src, _ = od_tfrecord(Path(root) / "short", "xyxy", damaged=(2,), key="image/object/class/label")
    chain, why = native.chain_for(src, ops)
    ex = native.NativeExecutor(Pipeline(src, ops=ops, device="cpu"), chain, sampler, epoch=0, start=0, offset=0,
                               failures=Failures(0, sampler.samples()), budget=lambda: Failures(0, sampler.samples()),
                               prefetch=1, gpu=gpu, with_fields=True)
    try:
        next(ex)
        raise AssertionError("record 2's short categories were not refused")
    except ValueError as err:
        assert "`categories` has 3 entries for 4 boxes" in str(err) and ex.fallbacks == {"record": 1}, \
            (err, ex.fallbacks)
    finally:
        ex.close()
    print(f"fallback batches compared: {len(got)}")


def child_detection_loader(lib_path: str, root: str, chain_name: str, fmt: str = "coco") -> None:
    """A Loader (output="dict", ragged as the chain needs) whose native engine runs on the stand-ins, against the
    same Loader on the Python engine: the same keys in the same order, fields equal, images of the same shapes."""
    import ingest
    from ingest import defaults

    ops = detection_chains()[chain_name]
    src, refused = detection_source(Path(root), fmt, chain_name)
    _, gpu, _ = stand_in_gpu(lib_path, src, True, refused=refused)
    chain, why = native.chain_for(src, ops)
    assert chain is not None, why
    batchwide = chain.detection.batchwide
    options = dict(batch_size=4, shuffle=True, seed=2, output="dict", ragged=not batchwide, num_workers=0)
    with defaults.set(engine="python"):
        python = ingest.Loader(src, ops=ops, device="cpu", decode="cpu", **options)
        want = [b for _ in range(2) for b in python]
    ours = ingest.Loader(src, ops=ops, device="cpu", decode="cpu", **options)
    ours._native, native._gpu_arguments = chain, lambda pipeline, table: gpu   # (the stand-ins as the GPU)
    got = [b for _ in range(2) for b in ours]
    assert ours.stats()["engine"] == "native" and len(got) == len(want) == 6
    for a, b in zip(got, want):
        assert list(a) == list(b)
        for key in a:
            if key == "images":
                ia, ib = ([a[key]], [b[key]]) if batchwide else (a[key], b[key])
                assert [x.shape for x in ia] == [x.shape for x in ib]
            else:
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
    print(f"loader batches compared: {len(got)}")


def kernel_source(h: int, w: int, image) -> np.ndarray:
    """What the engine's kernel reads for an image of the probed size (h, w): a PNG as the read team decodes it (the
    CPU decoder's pixels: Pillow's), anything else as the stand-in decoder "decodes" it."""
    data = bytes(memoryview(image).cast("B"))
    if data.startswith(b"\x89PNG"):
        from ingest.decode.cpu import CpuDecoder
        return CpuDecoder().decode(data, "png")
    return pattern(h, w, len(data))


def pattern(h: int, w: int, length: int) -> np.ndarray:
    """What the stand-in decoder writes for a whole image of ``length`` encoded bytes."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    out = np.stack([0.5 * (x + 2 * y) + 20 * c + length % 16 for c in range(3)], -1)
    return np.minimum(out, 255).astype(np.uint8)


if __name__ == "__main__":
    if sys.argv[4] == "executor":
        child_executor(sys.argv[1], sys.argv[2], sys.argv[3])
    elif sys.argv[4] == "masks":
        child_masks(sys.argv[1], sys.argv[2], sys.argv[3])
    elif sys.argv[4] == "masks-wds":
        child_masks(sys.argv[1], sys.argv[2], sys.argv[3], "webdataset")
    elif sys.argv[4] == "png":
        child_png(sys.argv[1], sys.argv[2], sys.argv[3])
    elif sys.argv[4].startswith("host-share-"):
        child_host_jpegs(sys.argv[1], sys.argv[2], sys.argv[3], "tree", float(sys.argv[4].rsplit("-", 1)[1]))
    elif sys.argv[4].startswith("host-jpegs-"):
        child_host_jpegs(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].rsplit("-", 1)[1])
    elif sys.argv[4] == "masks-lmdb":
        child_masks(sys.argv[1], sys.argv[2], sys.argv[3], "lmdb")
    elif sys.argv[4] == "raw":
        cases = RAW_CASES if sys.argv[3] == "rrc-flip-normalize" else ["fixed"]
        for name in cases:
            child_raw(sys.argv[1], os.path.join(sys.argv[2], name), sys.argv[3], name)
    elif sys.argv[4] == "detection-tfrecord-fallback":
        child_detection_fallback(sys.argv[1], sys.argv[2], sys.argv[3])
    elif sys.argv[4].startswith("detection-loader-"):
        child_detection_loader(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].rsplit("-", 1)[1])
    elif sys.argv[4].startswith("detection-"):
        child_detection(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].rsplit("-", 1)[1])
    elif sys.argv[4] == "crc":
        child_crc(sys.argv[1], sys.argv[2], sys.argv[3])
    elif sys.argv[4] == "records":
        for name in RECORD_FORMATS:
            os.makedirs(os.path.join(sys.argv[2], name))
            child_records(sys.argv[1], os.path.join(sys.argv[2], name), sys.argv[3], name)
    else:
        child(sys.argv[1], sys.argv[2], sys.argv[3], bool(int(sys.argv[4])))
