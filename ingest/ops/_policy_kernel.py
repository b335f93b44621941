"""A policy round (RandAugment, TrivialAugmentWide, AutoAugment) on a uint8 RGB CUDA batch as two CUDA kernels
(CuPy ``RawModule``, compiled once per process, cached on disk by CuPy): ``policy_stats`` computes the
per-sample statistics the round's ops read (the luma mean of Contrast, the channel minima and maxima of
AutoContrast, the channel histograms of Equalize turned into its lookup tables), launched only when some
sample drew one of those; ``policy_apply`` writes every sample's op (the geometry resample, the pointwise
colour ops, sharpness, autocontrast, equalize, or a copy) from the batch into a new ``[N, H, W, 3]`` buffer.

The arithmetic is :mod:`ingest.ops.augment`'s torch path step for step in float32: the kernels are compiled
without multiply-add contraction, and ``fmaf`` stands where torch's kernels fuse (``add(alpha=)``,
``addcmul``, ``grid_sample``'s unnormalization and tap sums). Where the devices' torch differs (a mean is
``sum / n`` on the CPU, ``sum * (1 / n)`` on CUDA) ``INGEST_MEAN`` follows CUDA's; the CPU test harness
defines it as the CPU's.

Per-sample parameters: one int32 row of 12 per sample and round (layout in SOURCE's header), all rounds in one
upload; the launches are on the current torch CUDA stream.
"""

from __future__ import annotations

import numpy as np
import torch

from ._warp_kernel import _cupy_stream, _state, available

__all__ = ["available", "KINDS", "ROW", "STATS", "run_round"]

SOURCE = r"""
// prm: int32, ROW (12) per sample: 0 kind (KINDS), 1 blend (0 none, 1 luma: Color, 2 luma mean: Contrast),
//      2 posterize mask, 3 statistics needed (1 luma sum, 2 channel min/max, 4 channel histograms),
//      4..11 float32: warp: the grid matrix [3][2] (base (x, y, 1) times it: normalized source coordinates);
//      pointwise: a, b, threshold (out = x * a + other * b, clamped, truncated, & mask, inverted at or above
//      the threshold); sharpness: f, 1 - f.
// stats: int32, STATS (200) per sample: 0..191 three 256-byte lookup tables (Equalize), 192..194 channel
//      minima, 195..197 maxima, 198 the luma mean (float32 bits).
#define K_COPY 0
#define K_WARP 1
#define K_POINT 2
#define K_SHARP 3
#define K_AUTO 4
#define K_EQUALIZE 5
#define ROW 12
#define STATS 200
#ifndef INGEST_MEAN
#define INGEST_MEAN(sum, count) __fmul_rn((float)(sum), 1.0f / (float)(count))
#endif

__device__ __forceinline__ float luma(float r, float g, float b) {  // torch: r * 0.2989 + g * 0.587 (alpha) ...
    return floorf(fmaf(b, 0.114f, fmaf(g, 0.587f, __fmul_rn(r, 0.2989f))));
}

__device__ __forceinline__ unsigned char to_u8(float v) {  // clamp, then truncate (torch's float -> uint8)
    return (unsigned char)(int)fminf(fmaxf(v, 0.0f), 255.0f);
}

extern "C" __global__ void __launch_bounds__(512)
policy_stats(const unsigned char* __restrict__ in, long long sn, long long sc, long long sh, long long sw, int H,
             int W, const int* __restrict__ prm, int* __restrict__ stats) {
    __shared__ unsigned int hist[768];
    __shared__ unsigned long long total;
    __shared__ int lo[3], hi[3];
    const int n = blockIdx.x;
    const int need = prm[ROW * n + 3];
    if (need == 0) return;  // the whole block
    const int t = threadIdx.x, T = blockDim.x;
    for (int i = t; i < 768; i += T) hist[i] = 0u;
    if (t == 0) {
        total = 0ull;
        for (int c = 0; c < 3; ++c) { lo[c] = 255; hi[c] = 0; }
    }
    __syncthreads();
    const unsigned char* src = in + n * sn;
    unsigned long long sum = 0ull;
    int mn[3] = {255, 255, 255}, mx[3] = {0, 0, 0};
    int level[3] = {0, 0, 0};  // histograms: a run of one level counted locally, one atomic per run (flat
    unsigned int run[3] = {0u, 0u, 0u};  // regions would otherwise make every thread add to one bin)
    const unsigned int count = (unsigned int)H * (unsigned int)W;  // 32-bit: a division per pixel
    for (unsigned int i = t; i < count; i += T) {
        const int y = (int)(i / (unsigned int)W), x = (int)(i % (unsigned int)W);
        const unsigned char* p = src + y * sh + x * sw;
        const int v[3] = {p[0], p[sc], p[2 * sc]};
        if (need & 1) sum += (unsigned long long)luma((float)v[0], (float)v[1], (float)v[2]);
        if (need & 2)
            for (int c = 0; c < 3; ++c) { mn[c] = v[c] < mn[c] ? v[c] : mn[c]; mx[c] = v[c] > mx[c] ? v[c] : mx[c]; }
        if (need & 4)
            for (int c = 0; c < 3; ++c) {
                if (v[c] != level[c] && run[c] != 0u) {
                    atomicAdd(&hist[256 * c + level[c]], run[c]);
                    run[c] = 0u;
                }
                level[c] = v[c];
                ++run[c];
            }
    }
    if (need & 4)
        for (int c = 0; c < 3; ++c)
            if (run[c] != 0u) atomicAdd(&hist[256 * c + level[c]], run[c]);
    if (need & 1) atomicAdd(&total, sum);
    if (need & 2)
        for (int c = 0; c < 3; ++c) { atomicMin(&lo[c], mn[c]); atomicMax(&hi[c], mx[c]); }
    __syncthreads();
    int* S = stats + (long long)STATS * n;
    if ((need & 4) && t < 3) {  // torchvision's equalize table of channel t
        const unsigned int* h = hist + 256 * t;
        unsigned char* lut = reinterpret_cast<unsigned char*>(S) + 256 * t;
        int last = 255;  // the last level present (the first maximum of the cumulative histogram)
        while (last > 0 && h[last] == 0u) --last;
        const long long step = ((long long)count - (long long)h[last]) / 255;
        if (step == 0) {  // one level: kept
            for (int i = 0; i < 256; ++i) lut[i] = (unsigned char)i;
        } else {
            long long cum = 0;
            lut[0] = 0;
            for (int i = 0; i < 255; ++i) {
                cum += h[i];
                const long long v = (cum + step / 2) / step;
                lut[i + 1] = (unsigned char)(v > 255 ? 255 : v);
            }
        }
    }
    if (t == 0) {
        for (int c = 0; c < 3; ++c) { S[192 + c] = lo[c]; S[195 + c] = hi[c]; }
        S[198] = __float_as_int(INGEST_MEAN(total, count));
    }
}

// One output pixel (all three channels) per thread; blockIdx.z the sample.
extern "C" __global__ void __launch_bounds__(256)
policy_apply(const unsigned char* __restrict__ in, long long sn, long long sc, long long sh, long long sw, int H,
             int W, const int* __restrict__ prm, const int* __restrict__ stats, unsigned char* __restrict__ out,
             int bilinear, int has_fill, float fill0, float fill1, float fill2) {
    const int n = blockIdx.z;
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= W || y >= H) return;
    const int* P = prm + ROW * n;
    const float* Pf = reinterpret_cast<const float*>(P + 4);
    const int kind = P[0];
    const unsigned char* src = in + n * sn;
    const unsigned char* p = src + y * sh + x * sw;
    unsigned char* o = out + (((long long)n * H + y) * W + x) * 3;
    const int* S = stats + (long long)STATS * n;
    if (kind == K_WARP) {  // torch's grid (base times matrix), then grid_sample's (align_corners=False, zeros)
        const float bx = (float)x + (float)(1 - W) * 0.5f, by = (float)y + (float)(1 - H) * 0.5f;
        const float gx = __fadd_rn(__fadd_rn(__fmul_rn(bx, Pf[0]), __fmul_rn(by, Pf[2])), Pf[4]);
        const float gy = __fadd_rn(__fadd_rn(__fmul_rn(bx, Pf[1]), __fmul_rn(by, Pf[3])), Pf[5]);
        const float ix = fmaf(__fadd_rn(gx, 1.0f), (float)W, -1.0f) / 2.0f;
        const float iy = fmaf(__fadd_rn(gy, 1.0f), (float)H, -1.0f) / 2.0f;
        const float fill[3] = {fill0, fill1, fill2};
        float acc[3] = {0.0f, 0.0f, 0.0f}, mask = 0.0f;
        if (!bilinear) {
            const int xi = (int)rintf(ix), yi = (int)rintf(iy);
            if (xi >= 0 && xi < W && yi >= 0 && yi < H) {
                const unsigned char* q = src + yi * sh + xi * sw;
                for (int c = 0; c < 3; ++c) acc[c] = (float)q[c * sc];
                mask = 1.0f;
            }
        } else {
            const float fx = floorf(ix), fy = floorf(iy);
            const int x0 = (int)fx, y0 = (int)fy;
            const float ex = __fadd_rn(fx, 1.0f), ey = __fadd_rn(fy, 1.0f);
            const float wgt[4] = {__fmul_rn(__fsub_rn(ex, ix), __fsub_rn(ey, iy)),   // nw
                                  __fmul_rn(__fsub_rn(ix, fx), __fsub_rn(ey, iy)),   // ne
                                  __fmul_rn(__fsub_rn(ex, ix), __fsub_rn(iy, fy)),   // sw
                                  __fmul_rn(__fsub_rn(ix, fx), __fsub_rn(iy, fy))};  // se
            for (int k = 0; k < 4; ++k) {
                const int xk = x0 + (k & 1), yk = y0 + (k >> 1);
                if (xk < 0 || xk >= W || yk < 0 || yk >= H) continue;
                const unsigned char* q = src + yk * sh + xk * sw;
                for (int c = 0; c < 3; ++c) acc[c] = fmaf((float)q[c * sc], wgt[k], acc[c]);
                mask = fmaf(1.0f, wgt[k], mask);
            }
        }
        for (int c = 0; c < 3; ++c) {
            float v = acc[c];
            if (has_fill)
                v = bilinear ? __fadd_rn(__fmul_rn(__fsub_rn(v, fill[c]), mask), fill[c]) : (mask < 0.5f ? fill[c] : v);
            o[c] = (unsigned char)(int)fminf(fmaxf(rintf(v), 0.0f), 255.0f);
        }
        return;
    }
    const int v[3] = {p[0], p[sc], p[2 * sc]};
    if (kind == K_POINT) {
        const int blend = P[1], mask = P[2];
        const float other = blend == 1 ? luma((float)v[0], (float)v[1], (float)v[2])
                          : (blend == 2 ? __int_as_float(S[198]) : 0.0f);
        for (int c = 0; c < 3; ++c) {
            float f = __fmul_rn((float)v[c], Pf[0]);
            if (blend) f = fmaf(other, Pf[1], f);
            int u = to_u8(f) & mask;
            o[c] = (unsigned char)((float)u >= Pf[2] ? 255 - u : u);
        }
    } else if (kind == K_SHARP && H > 2 && W > 2 && x > 0 && y > 0 && x < W - 1 && y < H - 1) {
        for (int c = 0; c < 3; ++c) {  // PIL's smoothing kernel (1 1 1, 1 5 1, 1 1 1) / 13, rounded
            float s = 0.0f;
            for (int dy = -1; dy <= 1; ++dy)
                for (int dx = -1; dx <= 1; ++dx)
                    s = __fadd_rn(s, __fmul_rn((float)p[dy * sh + dx * sw + c * sc],
                                               dx == 0 && dy == 0 ? 5.0f / 13.0f : 1.0f / 13.0f));
            const float view = (float)v[c];
            o[c] = to_u8(fmaf(__fsub_rn(rintf(s), view), Pf[1], view));
        }
    } else if (kind == K_AUTO) {
        for (int c = 0; c < 3; ++c) {
            const int lo = S[192 + c], hi = S[195 + c];
            const float minimum = lo == hi ? 0.0f : (float)lo;
            const float inv = lo == hi ? 1.0f : __fmul_rn(__fsub_rn((float)hi, (float)lo), (float)(1.0 / 255.0));
            o[c] = to_u8(__fdiv_rn(__fsub_rn((float)v[c], minimum), inv));
        }
    } else if (kind == K_EQUALIZE) {
        const unsigned char* lut = reinterpret_cast<const unsigned char*>(S);
        for (int c = 0; c < 3; ++c) o[c] = lut[256 * c + v[c]];
    } else {
        for (int c = 0; c < 3; ++c) o[c] = (unsigned char)v[c];
    }
}
"""

#: The kernel's op kinds.
KINDS = {"copy": 0, "warp": 1, "pointwise": 2, "Sharpness": 3, "AutoContrast": 4, "Equalize": 5}
#: int32 values per sample of a round's parameters, and of the statistics.
ROW, STATS = 12, 200
_BLOCK = (32, 8, 1)
#: NVRTC's options: no multiply-add contraction (the source's ``fmaf`` are its fused operations).
OPTIONS = ("--fmad=false",)
#: Threads of a statistics block (one block per sample; the source's launch bounds).
STATS_THREADS = 512


def _function(name: str):
    key = "policy_" + name
    if key not in _state:
        if "policy_module" not in _state:
            _state["policy_module"] = _state["cupy"].RawModule(code=SOURCE, options=OPTIONS)
        _state[key] = _state["policy_module"].get_function(key)
    return _state[key]


def _launch(name: str, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple) -> None:
    """Launch kernel ``policy_<name>`` on the current torch stream; tensors in ``args`` go as their pointers."""
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    values = tuple(np.uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else a for a in args)
    stream = torch.cuda.current_stream(device)
    with _state["cupy"].cuda.Device(device.index), _cupy_stream(stream, device.index):
        _function(name)(grid, block, values)


def run_round(x: torch.Tensor, prm: torch.Tensor, stats: torch.Tensor | None, interpolation: str,
              fill: list[float] | None) -> torch.Tensor:
    """One policy round on ``x`` (``[N, 3, H, W]`` uint8 on CUDA, any strides): ``prm`` its ``[N, ROW]`` int32
    parameters on the device, ``stats`` an ``[N, STATS]`` int32 buffer when some sample needs statistics
    (None: no statistics launch). Returns a new batch, ``[N, 3, H, W]`` over ``[N, H, W, 3]`` memory."""
    n, _, h, w = x.shape
    out = torch.empty((n, h, w, 3), dtype=torch.uint8, device=x.device)
    geometry = (np.int64(x.stride(0)), np.int64(x.stride(1)), np.int64(x.stride(2)), np.int64(x.stride(3)),
                np.int32(h), np.int32(w))
    if stats is not None:
        _launch("stats", (n, 1, 1), (STATS_THREADS, 1, 1), (x, *geometry, prm, stats))
    f = [0.0, 0.0, 0.0] if fill is None else fill
    grid = (-(-w // _BLOCK[0]), -(-h // _BLOCK[1]), n)
    _launch("apply", grid, _BLOCK, (x, *geometry, prm, prm if stats is None else stats, out,
                                    np.int32(interpolation == "bilinear"), np.int32(fill is not None),
                                    *(np.float32(v) for v in f)))
    return out.permute(0, 3, 1, 2)
