"""The batched warp as one CUDA kernel (CuPy ``RawModule``, compiled once per process and device, cached on
disk by CuPy). Same math as :func:`ingest.ops.resample.reference`; the module docstring of
:mod:`ingest.ops.resample` states it.

One launch covers the whole batch: ``blockIdx.z`` is the sample, each thread one output pixel (all channels).
Per-sample parameters (source pointer, size and strides, so ragged and strided sources need no copy; matrix,
box, filter support; output offset and size) travel in one small pinned buffer uploaded per batch. Output goes
straight into the final tensor, optionally through the epilogue (``x * a + b`` per channel, then
uint8 / float32 / float16 / bfloat16, NHWC or NCHW). The launch is on the current torch CUDA stream.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch

from .._driver import Staging
from .._numpy import assign, zeros
from .base import ImageArena, device_and_channels, size_array

SOURCE = r"""
// ip: int64, 16 per sample: 0 source pointer, 1 output offset (elements), 2 source height, 3 source width,
//     4..6 source strides (bytes) of row, column, channel, 7..10 tap box x0 y0 x1 y1 (end exclusive; taps
//     outside the image read fill), 11 output height, 12 output width, 13 antialias (separable filter) or not.
// fp: float64 rows of 16: row 0 fill[4], a[4], b[4] (normalize: out = v * a + b);
//     row 1 + n: matrix (6), box x0 y0 x1 y1, support x y, 1/scale x y.
// Source coordinates are mapped in double precision (pixel-edge ties of nearest sampling then resolve as in
// exact arithmetic, and huge images keep sub-pixel accuracy); filter weights are float.
#define NEAREST 0
#define BILINEAR 1
#define BICUBIC 2

struct Source {
    const unsigned char* p;
    long long sh, sw, sc;
    int h, w;
    const double* fill;  // what pixels outside the image read (taps of a box that reaches past it)
};

__device__ __forceinline__ int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }
__device__ __forceinline__ int maxi(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ int mini(int a, int b) { return a < b ? a : b; }

__device__ __forceinline__ float texel(const Source& s, int y, int x, int c) {
    if ((unsigned)y >= (unsigned)s.h || (unsigned)x >= (unsigned)s.w) return (float)s.fill[c];
    return (float)__ldg(s.p + y * s.sh + x * s.sw + c * s.sc);
}

__device__ __forceinline__ float keys(float x, float a) {
    x = fabsf(x);
    if (x < 1.0f) return ((a + 2.0f) * x - (a + 3.0f)) * x * x + 1.0f;
    if (x < 2.0f) return ((a * x - 5.0f * a) * x + 8.0f * a) * x - 4.0f * a;
    return 0.0f;
}

template <int INTERP>
__device__ __forceinline__ float aa_filter(float x) {
    if (INTERP == BICUBIC) return keys(x, -0.5f);
    x = fabsf(x);
    return x < 1.0f ? 1.0f - x : 0.0f;
}

// Separable antialiasing filter centred at (x, y); false if no tap has weight.
template <int INTERP>
__device__ bool sample_aa(const Source& s, int C, double x, double y, const double* P,
                          int bx0, int by0, int bx1, int by1, float acc[4]) {
    const double sx = P[10], sy = P[11];
    const float ix = (float)P[12], iy = (float)P[13];
    const int x0 = maxi((int)floor(x - sx + 0.5), bx0), x1 = mini((int)floor(x + sx + 0.5), bx1);
    const int y0 = maxi((int)floor(y - sy + 0.5), by0), y1 = mini((int)floor(y + sy + 0.5), by1);
    const float dx0 = (float)(x0 + 0.5 - x), dy0 = (float)(y0 + 0.5 - y);  // first tap centre - sample point
    float wxs = 0.0f, wys = 0.0f;
    for (int k = 0; k < x1 - x0; ++k) wxs += aa_filter<INTERP>((dx0 + k) * ix);
    for (int k = 0; k < y1 - y0; ++k) wys += aa_filter<INTERP>((dy0 + k) * iy);
    const float total = wxs * wys;
    if (!(fabsf(total) > 1e-12f)) return false;
    for (int ty = y0; ty < y1; ++ty) {
        const float wy = aa_filter<INTERP>((dy0 + (ty - y0)) * iy);
        if (wy == 0.0f) continue;
        float row[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int tx = x0; tx < x1; ++tx) {
            const float wx = aa_filter<INTERP>((dx0 + (tx - x0)) * ix);
#pragma unroll
            for (int c = 0; c < 4; ++c)
                if (c < C) row[c] += wx * texel(s, ty, tx, c);
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[c] += wy * row[c];
    }
    const float inv = 1.0f / total;
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[c] *= inv;
    return true;
}

// Plain sampling at (x, y), taps clamped to the box.
template <int INTERP>
__device__ void sample_plain(const Source& s, int C, double x, double y,
                             int bx0, int by0, int bx1, int by1, float acc[4]) {
    if (INTERP == NEAREST) {
        const int xi = clampi((int)floor(x), bx0, bx1 - 1), yi = clampi((int)floor(y), by0, by1 - 1);
#pragma unroll
        for (int c = 0; c < 4; ++c)
            if (c < C) acc[c] = texel(s, yi, xi, c);
        return;
    }
    const double xf = floor(x - 0.5), yf = floor(y - 0.5);
    const float tx = (float)(x - 0.5 - xf), ty = (float)(y - 0.5 - yf);
    const int xb = (int)xf, yb = (int)yf;
    if (INTERP == BILINEAR) {
        const int xa = clampi(xb, bx0, bx1 - 1), xc = clampi(xb + 1, bx0, bx1 - 1);
        const int ya = clampi(yb, by0, by1 - 1), yc = clampi(yb + 1, by0, by1 - 1);
#pragma unroll
        for (int c = 0; c < 4; ++c)
            if (c < C)
                acc[c] = (1.0f - ty) * ((1.0f - tx) * texel(s, ya, xa, c) + tx * texel(s, ya, xc, c))
                       + ty * ((1.0f - tx) * texel(s, yc, xa, c) + tx * texel(s, yc, xc, c));
        return;
    }
    // BICUBIC, Keys a = -0.75 (torch's non-antialiased bicubic)
    float wx[4], wy[4];
    int xs[4], ys[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        wx[k] = keys(tx - (k - 1), -0.75f);
        wy[k] = keys(ty - (k - 1), -0.75f);
        xs[k] = clampi(xb + k - 1, bx0, bx1 - 1);
        ys[k] = clampi(yb + k - 1, by0, by1 - 1);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float w = wy[j] * wx[k];
#pragma unroll
            for (int c = 0; c < 4; ++c)
                if (c < C) acc[c] += w * texel(s, ys[j], xs[k], c);
        }
    }
}

#ifndef INGEST_HOST_EMULATION  // (the CPU test harness compiles this file as C++ and brings its own)
__device__ __forceinline__ unsigned short half_bits(float v) {  // round to nearest even
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
#endif

__device__ __forceinline__ void store(unsigned char* out, long long i, float v, int kind) {
    if (kind == 0) {
        out[i] = (unsigned char)rintf(fminf(fmaxf(v, 0.0f), 255.0f));
    } else if (kind == 1) {
        reinterpret_cast<float*>(out)[i] = v;
    } else if (kind == 2) {
        reinterpret_cast<unsigned short*>(out)[i] = half_bits(v);
    } else {  // bfloat16, round to nearest even
        unsigned int u = __float_as_uint(v);
        u += 0x7fffu + ((u >> 16) & 1u);
        reinterpret_cast<unsigned short*>(out)[i] = (unsigned short)(u >> 16);
    }
}

template <int INTERP>
__device__ void warp_body(const long long* __restrict__ ip, const double* __restrict__ fp,
                          unsigned char* __restrict__ out, int C, int kind, int nchw, int normalize) {
    const int n = blockIdx.z;
    const long long* I = ip + 16LL * n;
    const int oh = (int)I[11], ow = (int)I[12];
    const int xo = blockIdx.x * blockDim.x + threadIdx.x;
    const int yo = blockIdx.y * blockDim.y + threadIdx.y;
    if (xo >= ow || yo >= oh) return;
    const double* P = fp + 16LL * (n + 1);
    Source s;
    s.p = reinterpret_cast<const unsigned char*>(I[0]);
    s.sh = I[4];
    s.sw = I[5];
    s.sc = I[6];
    s.h = (int)I[2];
    s.w = (int)I[3];
    s.fill = fp;  // row 0 starts with the fill colour
    const int bx0 = (int)I[7], by0 = (int)I[8], bx1 = (int)I[9], by1 = (int)I[10];
    const double px = xo + 0.5, py = yo + 0.5;
    const double x = P[0] * px + P[1] * py + P[2];
    const double y = P[3] * px + P[4] * py + P[5];
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    bool inside = bx1 > bx0 && by1 > by0 && x >= P[6] && x <= P[8] && y >= P[7] && y <= P[9];
    if (inside) {
        if (INTERP != NEAREST && I[13] != 0)
            inside = sample_aa<INTERP>(s, C, x, y, P, bx0, by0, bx1, by1, acc);
        else
            sample_plain<INTERP>(s, C, x, y, bx0, by0, bx1, by1, acc);
    }
    const long long plane = (long long)oh * ow;
    const long long pixel = (long long)yo * ow + xo;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        if (c < C) {
            float v = inside ? acc[c] : (float)fp[c];
            v = rintf(fminf(fmaxf(v, 0.0f), 255.0f));  // whole levels, as the eager path's uint8 images
            if (normalize) v = v * (float)fp[4 + c] + (float)fp[8 + c];
            store(out, I[1] + (nchw ? c * plane + pixel : pixel * C + c), v, kind);
        }
    }
}

#define WARP_ARGS const long long* __restrict__ ip, const double* __restrict__ fp, \
                  unsigned char* __restrict__ out, int C, int kind, int nchw, int normalize
extern "C" __global__ void __launch_bounds__(256) warp_nearest(WARP_ARGS) {
    warp_body<NEAREST>(ip, fp, out, C, kind, nchw, normalize);
}
extern "C" __global__ void __launch_bounds__(256) warp_bilinear(WARP_ARGS) {
    warp_body<BILINEAR>(ip, fp, out, C, kind, nchw, normalize);
}
extern "C" __global__ void __launch_bounds__(256) warp_bicubic(WARP_ARGS) {
    warp_body<BICUBIC>(ip, fp, out, C, kind, nchw, normalize);
}
"""

_KINDS = {torch.uint8: 0, torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
_BLOCK = (32, 8, 1)
_state: dict = {}


def available() -> bool:
    """True when CuPy imports (checked once)."""
    if "cupy" not in _state:
        try:
            import cupy
        except Exception:  # not installed, or no CUDA runtime it can load
            cupy = None
        _state["cupy"] = cupy
    return _state["cupy"] is not None


def _cupy_stream(stream: torch.cuda.Stream, device: int):
    """cupy's wrapper of the torch ``stream`` (not owned), made once per stream: ``Stream.from_external`` through
    the CUDA stream protocol where cupy and torch both have it (cupy's ``ExternalStream`` is deprecated), else
    ``ExternalStream`` of the handle."""
    key = ("stream", stream.cuda_stream, device)
    if key not in _state:
        cuda = _state["cupy"].cuda
        try:
            _state[key] = cuda.Stream.from_external(stream)
        except (TypeError, AttributeError):   # an older cupy or torch: no protocol on one side
            _state[key] = cuda.ExternalStream(stream.cuda_stream, device)
    return _state[key]


def _function(interpolation: str):
    key = "warp_" + interpolation
    if key not in _state:
        if "module" not in _state:
            _state["module"] = _state["cupy"].RawModule(code=SOURCE)
        _state[key] = _state["module"].get_function(key)
    return _state[key]


class Packed(NamedTuple):
    """One batch's kernel arguments, on the host: ``ip`` and ``fp`` are views of ``buf`` (one upload)."""

    buf: np.ndarray      # int64, ip then fp
    ip: np.ndarray       # (N, 16) int64, layout in SOURCE's header
    fp: np.ndarray       # (N + 1, 16) float64
    out_hw: np.ndarray   # (N, 2) output sizes
    count: np.ndarray    # (N,) output elements per sample
    channels: int
    grid: tuple[int, int, int]


def pack(images: torch.Tensor | list[torch.Tensor] | ImageArena, out_sizes: Sequence[tuple[int, int]], setup,
         fill: Sequence[float], coefficients: tuple[Sequence[float], Sequence[float]] | None) -> Packed:
    """The per-sample argument arrays for ``images`` (an ``[N, H, W, C]`` uint8 tensor, or a list of
    ``[H, W, C]`` ones; any strides, C <= 4); ``setup`` is the geometry from
    :func:`ingest.ops.resample._setup`. A batch tensor's source pointers are computed, not read per image. The
    kernel's source is the setup's window of each image (pointer at its corner, its size), so pixels outside
    the window read fill."""
    n = len(images)
    c = device_and_channels(images)[1]
    out_hw = size_array(out_sizes)
    count = out_hw[:, 0] * out_hw[:, 1] * c
    buf = zeros(16 * (2 * n + 1), np.int64)   # np.zeros of 1 KB and more gives the GIL up (ingest._numpy)
    ip = buf[:16 * n].reshape(n, 16)
    fp = buf[16 * n:].view(np.float64).reshape(n + 1, 16)
    # Filled column by column: numpy gives the GIL up in an operation on more than 500 items (ingest._numpy).
    if isinstance(images, torch.Tensor):
        step = images.stride(0) * images.element_size()
        ip[:, 0] = images.data_ptr() + step * np.arange(n, dtype=np.int64)
        for j, value in enumerate((*images.shape[1:3], *images.stride()[1:])):
            ip[:, 2 + j] = value
    elif isinstance(images, ImageArena):
        ip[:, 0] = images.pointers()
        ip[:, 2], ip[:, 3] = images.hw[:, 0], images.hw[:, 1]
        ip[:, 4], ip[:, 5], ip[:, 6] = images.hw[:, 1] * c, c, 1
    else:
        ip[:, 0] = [im.data_ptr() for im in images]
        layout = [im.shape[:2] + im.stride() for im in images]
        for j in range(5):
            ip[:, 2 + j] = [v[j] for v in layout]
    # Only the window is read: its corner is the source pointer, its size the source size
    ip[:, 0] += setup.window[:, 1] * ip[:, 4] + setup.window[:, 0] * ip[:, 5]
    ip[:, 2], ip[:, 3] = setup.window[:, 3] - setup.window[:, 1], setup.window[:, 2] - setup.window[:, 0]
    ip[:, 1] = np.concatenate([[0], np.cumsum(count)[:-1]])
    assign(ip[:, 7:11], setup.taps)
    assign(ip[:, 11:13], out_hw)
    ip[:, 13] = setup.aa
    fp[0, :c] = fill
    if coefficients is not None:
        fp[0, 4:4 + c], fp[0, 8:8 + c] = coefficients
    for r in range(2):
        assign(fp[1:, 3 * r:3 * r + 3], setup.matrix[:, r, :])
    assign(fp[1:, 6:10], setup.box)
    assign(fp[1:, 10:12], setup.support)
    assign(fp[1:, 12:14], setup.inv_scale)
    grid = (int(-(-out_hw[:, 1].max() // _BLOCK[0])), int(-(-out_hw[:, 0].max() // _BLOCK[1])), n)
    return Packed(buf, ip, fp, out_hw, count, c, grid)


def output(packed: Packed, dtype: torch.dtype, device: torch.device | str, nchw: bool,
           out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | list[torch.Tensor]]:
    """A new buffer the kernel writes a batch's output to, and the output as the caller gets it: that buffer
    as ``[N, ...]`` when all samples share a size (allocated in that shape: a view would be one more torch
    call, and each gives the GIL up), else a list of views of it, one per sample. ``out``: the caller's
    buffer for a batch of one size, checked, instead of a new one."""
    n, c, hw = len(packed.out_hw), packed.channels, packed.out_hw
    uniform = n and (hw[:, 0] == hw[0, 0]).all() and (hw[:, 1] == hw[0, 1]).all()
    if uniform:
        h, w = int(hw[0, 0]), int(hw[0, 1])
        shape = (n, c, h, w) if nchw else (n, h, w, c)
        if out is None:
            out = torch.empty(shape, dtype=dtype, device=device)
        elif (tuple(out.shape) != shape or out.dtype != dtype or out.device != torch.device(device)
              or not out.is_contiguous()):
            raise ValueError(f"`out` must be a contiguous {shape} {dtype} tensor on {device}, got "
                             f"{tuple(out.shape)} {out.dtype} on {out.device}"
                             + ("" if out.is_contiguous() else ", not contiguous"))
        return out, out
    if out is not None:
        raise ValueError("`out` takes a batch whose outputs share a size")
    out = torch.empty(int(packed.count.sum()), dtype=dtype, device=device)
    return out, [part.view((c, h, w) if nchw else (h, w, c))
                 for part, (h, w) in zip(out.split(packed.count.tolist()), hw.tolist())]


def launch(images: torch.Tensor | list[torch.Tensor], out_sizes: Sequence[tuple[int, int]], setup, interpolation: str,
           fill: Sequence[float], coefficients: tuple[Sequence[float], Sequence[float]] | None,
           dtype: torch.dtype, nchw: bool, out: torch.Tensor | None = None) -> torch.Tensor | list[torch.Tensor]:
    """Run the warp kernel on CUDA ``images`` on the current torch stream; returns the output as one new
    ``[N, ...]`` tensor of ``dtype`` when all samples share a size (or ``out``), else as views of one
    (:func:`output`)."""
    cupy = _state["cupy"]
    device, channels = device_and_channels(images)
    packed = pack(images, out_sizes, setup, fill, coefficients)
    out, result = output(packed, dtype, device, nchw, out)
    if out.numel():
        # The arguments go up through pinned staging with the GIL kept (`ingest._driver.Staging`) into this
        # stream's argument buffer: the next batch's copy is queued on the same stream, after this kernel.
        stream = torch.cuda.current_stream(device)
        args_d = _arguments(device, stream, packed.buf.nbytes)
        _STAGING.copy(packed.buf, args_d, stream)
        ip = args_d.data_ptr()
        args = (np.uint64(ip), np.uint64(ip + packed.ip.nbytes), np.uint64(out.data_ptr()),
                np.int32(channels), np.int32(_KINDS[dtype]), np.int32(nchw),
                np.int32(coefficients is not None))
        with cupy.cuda.Device(device.index), _cupy_stream(stream, device.index):
            _function(interpolation)(packed.grid, _BLOCK, args)
    return result


#: Pinned staging for the kernel arguments, and each stream's device buffer for them, kept and grown: a
#: pinned tensor plus a device copy per batch were two torch calls (each gives the GIL up) and two allocations.
_STAGING = Staging()
_ARGUMENTS: dict[tuple[int, int], torch.Tensor] = {}


def _arguments(device: torch.device, stream: torch.cuda.Stream, nbytes: int) -> torch.Tensor:
    """The argument buffer of ``stream`` (at least ``nbytes``). Only work queued on that stream uses it, in
    order, so it is overwritten only after the kernels that read it. A stream handle the driver reuses after its
    stream was destroyed (with its work run) takes the buffer over."""
    key = (device.index, stream.cuda_stream)
    buffer = _ARGUMENTS.get(key)
    if buffer is None or buffer.numel() < nbytes:
        with torch.cuda.stream(stream):
            buffer = _ARGUMENTS[key] = torch.empty(nbytes + nbytes // 4, dtype=torch.uint8, device=device)
    return buffer
