"""The policy kernels (ingest/ops/_policy_kernel.py) against the policies' torch path, on the CPU: the CUDA
source compiled as C++ (a thread per CUDA thread of a statistics block, a barrier for ``__syncthreads``, the
apply kernel's blocks and threads as loops), run through the same host planning as on CUDA.

Tolerances: every colour op equals the torch path exactly (the same float32 operations, ``fmaf`` where torch
fuses); the geometry ops compute torch's grid in another float32 order than its ``bmm`` and ``grid_sample``,
so their pixels are within one level but for a rare nearest-neighbour tie.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from ingest.ops import AutoAugment, RandAugment, TrivialAugmentWide
from ingest.ops import _policy_kernel
from ingest.ops.augment import _GEOMETRY, NAMES, OP, _magnitudes

from conftest import cpp_library

_PRELUDE = r"""
#include <math.h>
#include <string.h>
#include <barrier>
#include <thread>
#include <vector>
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(n)
#define __shared__ static
#define INGEST_MEAN(sum, count) ((float)(sum) / (float)(count))   // torch's CPU mean: the sum, divided
struct Dim3 { unsigned x, y, z; };
static Dim3 blockIdx, blockDim;
static thread_local Dim3 threadIdx;
static std::barrier<>* block_barrier;
static inline void __syncthreads() { block_barrier->arrive_and_wait(); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
template <class T> static inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline int atomicMin(int* p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
static inline int atomicMax(int* p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
"""
_DRIVER = r"""
extern "C" void stats(int blocks, int threads, const unsigned char* in, long long sn, long long sc, long long sh,
                      long long sw, int H, int W, const int* prm, int* st) {
    blockDim = {(unsigned)threads, 1, 1};
    for (int b = 0; b < blocks; ++b) {
        blockIdx = {(unsigned)b, 0, 0};
        std::barrier<> bar(threads);
        block_barrier = &bar;
        std::vector<std::thread> team;
        for (int t = 0; t < threads; ++t)
            team.emplace_back([=] {
                threadIdx = {(unsigned)t, 0, 0};
                policy_stats(in, sn, sc, sh, sw, H, W, prm, st);
            });
        for (auto& member : team) member.join();
    }
}
extern "C" void apply(int gx, int gy, int gz, int bx, int by, const unsigned char* in, long long sn, long long sc,
                      long long sh, long long sw, int H, int W, const int* prm, const int* st, unsigned char* out,
                      int bilinear, int has_fill, float f0, float f1, float f2) {
    blockDim = {(unsigned)bx, (unsigned)by, 1};
    for (int z = 0; z < gz; ++z)
        for (int y = 0; y < gy; ++y)
            for (int x = 0; x < gx; ++x)
                for (int t = 0; t < bx * by; ++t) {
                    blockIdx = {(unsigned)x, (unsigned)y, (unsigned)z};
                    threadIdx = {(unsigned)(t % bx), (unsigned)(t / bx), 0};
                    policy_apply(in, sn, sc, sh, sw, H, W, prm, st, out, bilinear, has_fill, f0, f1, f2);
                }
}
"""

_STATS_THREADS = 7   # fewer than on the GPU (any count of 3 or more is correct), and not a divisor of the pixels


@pytest.fixture(scope="module")
def kernel_library(tmp_path_factory):
    # no contraction of a * b + c: the source's explicit fmaf are its only fused operations, as with --fmad=false
    lib = ctypes.CDLL(str(cpp_library(tmp_path_factory.mktemp("policy_kernel"),
                                      _PRELUDE + _policy_kernel.SOURCE + _DRIVER,
                                      "-std=c++20", "-pthread", "-ffp-contract=off")))
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_float
    lib.stats.argtypes = [i32, i32, p, i64, i64, i64, i64, i32, i32, p, p]
    lib.apply.argtypes = [i32] * 5 + [p, i64, i64, i64, i64, i32, i32, p, p, p, i32, i32, f32, f32, f32]
    return lib


@pytest.fixture
def on_cpu(kernel_library, monkeypatch):
    """The policy kernels' launches run by the C++ build on CPU tensors; returns the launches made."""
    launches = []

    def launch(name, grid, block, args):
        launches.append(name)
        values = [a.data_ptr() if isinstance(a, torch.Tensor) else a.item() for a in args]
        if name == "stats":
            kernel_library.stats(grid[0], _STATS_THREADS, *values)
        else:
            kernel_library.apply(*grid, *block[:2], *values)

    monkeypatch.setattr(_policy_kernel, "_launch", launch)
    return launches


#: Pixels whose luma's floor depends on torch's fused multiply-adds (found over all 2**24 colours).
_LUMA_EDGES = [(20, 152, 7), (40, 244, 244), (40, 252, 80), (110, 111, 26), (140, 160, 81)]


def nchw_batch(n: int, h: int, w: int, seed: int) -> torch.Tensor:
    """``[n, 3, h, w]`` over ``[n, h, w, 3]`` memory (as the policies get a batch), with a low-contrast sample, a
    one-level sample (equalize keeps it), a pure-colour one (each channel one level: autocontrast keeps it), and
    colours where the luma rounds differently without fused multiply-adds."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, h, w, 3), dtype=torch.uint8, generator=g)
    x[0].view(-1, 3)[:len(_LUMA_EDGES)] = torch.tensor(_LUMA_EDGES, dtype=torch.uint8)
    x[1] = x[1] // 5 + 90
    x[2] = 77
    if n > 3:
        x[3, ..., 0], x[3, ..., 1], x[3, ..., 2] = 255, 0, 128
    return x.permute(0, 3, 1, 2)


def far(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.int() - b.int()).abs() > 1).float().mean())


def check(op, x: torch.Tensor, ops: np.ndarray, mags: np.ndarray) -> None:
    """The kernels' round equals the torch path's: exactly where no sample drew a geometry op, else within a
    level on all but a tiny share of pixels (exactly on the samples without geometry)."""
    got, want = op._run_fused(x, ops, mags), op._run_groups(x, ops, mags)
    assert got.shape == want.shape and got.dtype == torch.uint8
    moved = np.isin(ops, _GEOMETRY).any(axis=1)
    assert torch.equal(got[~torch.from_numpy(moved)], want[~torch.from_numpy(moved)]), (ops, mags)
    if moved.any():
        assert far(got, want) < 2e-3, (ops, mags)


def forced(op, name: str, n: int, hw: tuple[int, int], rounds: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Every sample draws ``name`` in every round, at the table's smallest and largest magnitude bins, both
    signs, alternating over the samples."""
    space = op._space
    table = space[name]
    bins = 0 if table is None else len(table(*hw) if callable(table) else table)
    ops = np.full((n, rounds), OP[name])
    pick = np.arange(n * rounds).reshape(n, rounds)
    b = np.where(pick % 2 == 0, max(bins - 1, 0), 0)
    negative = (pick // 2) % 2 == 1
    return ops, _magnitudes(space, ops, b, negative, np.array([hw] * n))


POLICIES = [RandAugment(2, 9), RandAugment(1, 30, interpolation="bilinear", fill=(10, 200, 30)),
            TrivialAugmentWide(fill=128), AutoAugment(interpolation="bilinear")]


@pytest.mark.parametrize("op", POLICIES, ids=["rand", "rand-bilinear-fill", "wide-fill", "auto-bilinear"])
def test_every_op_through_the_kernels_equals_the_torch_path(on_cpu, op):
    names = [name for name in op._space if name != "Identity"]
    for k, name in enumerate(names):
        n, h, w = ((5, 29, 37), (3, 3, 40), (4, 17, 9))[k % 3]   # AutoContrast, Equalize: n > 3
        x = nchw_batch(n, h, w, seed=k)
        check(op, x, *forced(op, name, n, (h, w)))
    assert on_cpu.count("stats") == 3 * 2 and on_cpu.count("apply") == 2 * len(names)


@pytest.mark.parametrize("op", POLICIES, ids=["rand", "rand-bilinear-fill", "wide-fill", "auto-bilinear"])
def test_drawn_rounds_through_the_kernels_equal_the_torch_path(on_cpu, op):
    for seed, (n, h, w) in enumerate(((9, 31, 23), (6, 2, 5), (11, 16, 16))):
        x = nchw_batch(n, h, w, seed=seed + 10)
        params = op.draw([(h, w)] * n, seed)
        check(op, x, params.ops, params.magnitudes)


def test_a_mixed_round_reads_a_strided_batch(on_cpu):
    """Every op in one round, one sample each, on a batch that is a crop of a larger one (any strides)."""
    op = RandAugment(1, 20)
    names = [name for name in NAMES if name != "Invert"]
    big = nchw_batch(len(names), 40, 50, seed=3)
    x = big[:, :, 5:34, 7:44]
    ops = np.array([[OP[name]] for name in names])
    mags = np.stack([forced(op, name, 1, (29, 37), rounds=1)[1][0] for name in names])
    mags[5::2] *= -1
    check(op, x, ops, mags)
    assert on_cpu == ["stats", "apply"]


@pytest.mark.parametrize("hw", [(3, 3), (2, 9), (9, 2), (1, 1), (4, 3)])
def test_sharpness_and_statistics_on_the_smallest_images(on_cpu, hw):
    """Sharpness keeps the border (all of an image of 2 rows or columns); the statistics of an image of one
    pixel (equalize and autocontrast keep it)."""
    op = RandAugment(3, 25)
    g = torch.Generator().manual_seed(sum(hw))
    x = torch.randint(0, 256, (4, *hw, 3), dtype=torch.uint8, generator=g).permute(0, 3, 1, 2)
    ops = np.array([[OP["Sharpness"], OP["Equalize"], OP["Contrast"]], [OP["Sharpness"], OP["AutoContrast"],
                    OP["Color"]], [OP["Equalize"], OP["Sharpness"], OP["Sharpness"]], [OP["Posterize"]] * 3])
    mags = np.array([[0.9, 0.0, -0.9], [-0.9, 0.0, 0.9], [0.0, 0.5, -0.5], [4.0, 2.0, 0.0]])
    check(op, x, ops, mags)


def test_rounds_of_identity_launch_nothing(on_cpu):
    op = RandAugment(3, 9)
    x = nchw_batch(4, 12, 10, seed=1)
    ops = np.array([[OP["Identity"], OP["Brightness"], OP["Identity"]]] * 4)
    check(op, x, ops, np.full((4, 3), 0.5))
    assert on_cpu == ["apply"]


def _nvrtc():
    """libnvrtc where a CUDA wheel of torch brought it (no GPU needed to compile), else None."""
    import glob
    import site
    for root in site.getsitepackages():
        for path in sorted(glob.glob(f"{root}/nvidia/*/lib/libnvrtc.so*")):
            if "alt" not in path and "builtins" not in path:
                return ctypes.CDLL(path)
    return None


def _ptx(lib, options: list[str]) -> str:
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), _policy_kernel.SOURCE.encode(), b"policy.cu", 0, None,
                                  None) == 0
    given = [o.encode() for o in options] + [b"--gpu-architecture=compute_90"]
    done = lib.nvrtcCompileProgram(prog, len(given), (ctypes.c_char_p * len(given))(*given))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    assert done == 0, log.value.decode()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value.decode()


def test_kernel_source_compiles_for_the_gpu():
    """NVRTC (as CuPy's RawModule calls it, with the module's options) compiles the source for sm_90, and the
    options keep the compiler from fusing a multiply and an add where the source did not ask for ``fmaf``."""
    lib = _nvrtc()
    if lib is None:
        pytest.skip("no libnvrtc (a CUDA wheel of torch brings one)")
    text = _ptx(lib, list(_policy_kernel.OPTIONS))
    assert ".entry policy_stats(" in text and ".entry policy_apply(" in text
    assert 0 < text.count("fma.rn.f32") < _ptx(lib, ["--fmad=true"]).count("fma.rn.f32")
