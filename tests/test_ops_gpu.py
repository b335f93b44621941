"""Ops on CUDA: the warp kernel against the torch reference and against the CPU eager ops, for ragged
batches of varied sizes and strides, every interpolation, antialias on and off, the fused normalize in every
dtype and layout, and each op's ``apply`` on CUDA against CPU.

Tolerances (levels of 0..255): kernel vs reference: the same math in float32 weights vs float64, so values
one level apart where a result sits on .5, nothing more (fraction of pixels > 1 level apart < 1e-3).
Kernel vs CPU eager: as tests/test_ops.py states for the reference (bilinear <= 1, bicubic <= 6, rotations
away from the border).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ingest.ops import CenterCrop, ColorJitter, Flip, Normalize, RandomResizedCrop, Resize, Rotate, compose, plan
from ingest.ops import _warp_kernel
from ingest.ops.base import as_list, sizes_of
from ingest.ops.resample import reference, warp

from test_ops import IMAGENET, border_band, centre_boxes, crop_then_pad_chains, diff, image, ragged

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
needs_cupy = pytest.mark.skipif(not _warp_kernel.available(), reason="needs CuPy for the warp kernel")


def cuda(images):
    return images.cuda() if isinstance(images, torch.Tensor) else [im.cuda() for im in images]


def cpu(images):
    return images.cpu() if isinstance(images, torch.Tensor) else [im.cpu() for im in images]


def gpu_batch() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A ragged CUDA batch with strided members (a crop view, a transposed view, a slice of a stacked
    batch), and the same images on CPU."""
    big = image(300, 400, 40).cuda()
    stacked = torch.stack([image(90, 120, 41), image(90, 120, 42)]).cuda()
    ims = cuda(ragged(6, seed=43, lo=30, hi=320)) + [big[17:260, 33:390], big.transpose(0, 1)[5:300], stacked[1]]
    return ims, [im.cpu() for im in ims]


def squares(ims: list[torch.Tensor]) -> torch.Tensor:
    """The batch cropped to its smallest side and stacked: a fixed-size [N, H, W, C] batch."""
    side = min(min(im.shape[:2]) for im in ims)
    return torch.stack([im[:side, :side] for im in ims])


def close_to_reference(a, b):
    for x, y in zip(as_list(a), as_list(b)):
        d = diff(x.cpu(), y.cpu())
        assert (d > 1).float().mean() < 1e-3 and d.float().mean() < 0.01


GEOMETRY = [
    lambda i, aa: [RandomResizedCrop((224, 200), interpolation=i, antialias=aa), Flip()],
    lambda i, aa: [Resize(160, interpolation=i, antialias=aa), CenterCrop((200, 150), fill=(9, 99, 199))],
    lambda i, aa: [Resize((400, 500), interpolation=i, antialias=aa)],  # upscale
    lambda i, aa: [Rotate((-40, 40), expand=True, fill=(250, 0, 120), interpolation=i)],
    lambda i, aa: [Rotate(90, expand=True), Resize((60, 88), interpolation=i, antialias=aa)],
]


@needs_cupy
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear", "bicubic"])
@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize("case", range(len(GEOMETRY)))
def test_kernel_matches_reference(interpolation, antialias, case):
    ims, host = gpu_batch()
    p = plan(GEOMETRY[case](interpolation, antialias), sizes_of(ims), np.random.default_rng(case))
    out = warp(ims, p.warp)
    assert as_list(out)[0].is_cuda
    close_to_reference(out, reference(host, p.warp))


@needs_cupy
@pytest.mark.parametrize("interpolation,max_diff", [("nearest", 1), ("bilinear", 1), ("bicubic", 6)])
def test_kernel_matches_cpu_eager(interpolation, max_diff):
    ims, host = gpu_batch()
    p = plan([RandomResizedCrop(112, interpolation=interpolation), Flip()], sizes_of(ims), np.random.default_rng(5))
    d = diff(p.execute(ims).cpu(), p.execute(host))
    assert d.max() <= max_diff and d.float().mean() < 0.5


@needs_cupy
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.uint8])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_kernel_fused_normalize(dtype, layout):
    ims, host = gpu_batch()
    norm = Normalize(**IMAGENET, dtype=dtype, layout=layout, scale=50 if dtype == torch.uint8 else 1,
                     shift=128 if dtype == torch.uint8 else 0)
    p = plan([RandomResizedCrop(64), Flip(), norm], sizes_of(ims), np.random.default_rng(6))
    assert p.stages[0].epilogue is norm
    out = p.execute(ims)
    ref = reference(host, p.warp, epilogue=norm.epilogue(3))
    assert out.is_cuda and out.dtype == dtype and out.shape == ref.shape and out.is_contiguous()
    step = 1.0 if dtype == torch.uint8 else 1.01 / min(IMAGENET["std"])  # one level apart, at most
    d = (out.cpu().float() - ref.float()).abs()
    assert d.max() <= step + (0.02 if dtype == torch.bfloat16 else 0.002)
    assert (d > 1e-2).float().mean() < 1e-3 if dtype != torch.uint8 else (d > 0).float().mean() < 1e-3


@needs_cupy
@pytest.mark.parametrize("ops", crop_then_pad_chains(), ids=str)
def test_kernel_fills_past_a_crop_as_cpu_eager(ops):
    """A crop, then a pad (and maybe a resize): the padding is fill on CUDA too, ragged or fixed-size."""
    ims, host = gpu_batch()
    for batch, on_host in ((ims, host), (squares(ims), squares(host))):
        p = plan(ops, sizes_of(batch), np.random.default_rng(8), boxes=centre_boxes(on_host))
        for a, b in zip(as_list(p.execute(batch)), as_list(p.execute(on_host))):
            assert a.is_cuda and diff(a.cpu(), b).max() <= 1, ops


@needs_cupy
def test_kernel_ragged_output_and_fill():
    ims, host = gpu_batch()
    p = plan([Rotate((-30, 30), expand=True, fill=(1, 2, 3))], sizes_of(ims), np.random.default_rng(7))
    out = warp(ims, p.warp)
    assert isinstance(out, list) and [tuple(o.shape[:2]) for o in out] == p.warp.out_sizes
    assert all(o[0, 0].tolist() == [1, 2, 3] for o in out)  # expanded corners come from outside the source
    close_to_reference(out, reference(host, p.warp))


@needs_cupy
def test_kernel_runs_on_the_current_stream():
    ims, host = gpu_batch()
    p = plan([RandomResizedCrop(96), Flip(), Normalize(**IMAGENET)], sizes_of(ims), np.random.default_rng(8))
    expected = p.execute(ims)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = p.execute(ims)
        out = out.clone()  # ordered after the kernel only if the kernel ran on `side`
    side.synchronize()
    assert torch.equal(out, expected)


@needs_cupy
def test_region_of_interest_and_downscaled_sources():
    ims, host = gpu_batch()
    p = plan([RandomResizedCrop(80), Flip()], sizes_of(ims), np.random.default_rng(9))
    full = p.execute(ims)
    rois = p.warp.roi()
    crops = [im[y0:y1, x0:x1] for im, (x0, y0, x1, y1) in zip(ims, rois)]
    roi = p.execute(crops, origins=[(x0, y0) for x0, y0, _, _ in rois])
    assert diff(roi.cpu(), full.cpu()).max() <= 1
    half = [torch.nn.functional.avg_pool2d(im.permute(2, 0, 1)[None].float(), 2, ceil_mode=True)[0]
            .round().to(torch.uint8).permute(1, 2, 0).contiguous() for im in ims]
    small = p.execute(half)
    assert small.shape == full.shape
    close_to_reference(small, reference(cpu(half), p.warp.rescaled(sizes_of(half))))


@pytest.mark.parametrize("op", [Resize(64), Resize((50, 70), interpolation="bicubic"), Resize(longer=90),
                                CenterCrop((120, 150)), RandomResizedCrop(56), Flip(vertical=True),
                                Rotate((-30, 30), fill=(7, 7, 7))], ids=repr)
def test_geometry_apply_on_cuda_matches_cpu(op):
    ims, host = gpu_batch()
    params = op.draw(sizes_of(ims), np.random.default_rng(10))
    a, b = op.apply(ims, params), op.apply(host, params)
    for n, (x, y) in enumerate(zip(as_list(a), as_list(b))):
        assert x.is_cuda and x.shape == y.shape
        d = diff(x.cpu(), y)
        if isinstance(op, Rotate):  # torchvision's CPU rotate blends the border towards fill
            d = d[~border_band(compose([op.steps(sizes_of(ims), params)], sizes_of(ims)), n, host[n].shape[:2])]
        limit = 6 if getattr(op, "interpolation", None) == "bicubic" else 1
        assert d.max() <= limit and d.float().mean() < 0.5


@pytest.mark.parametrize("kwargs", [dict(brightness=0.5), dict(contrast=0.5), dict(saturation=0.5),
                                    dict(hue=0.3), dict(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)],
                         ids=str)
def test_color_jitter_on_cuda_matches_cpu(kwargs):
    ims, host = gpu_batch()
    op = ColorJitter(**kwargs)
    params = op.draw(sizes_of(ims), np.random.default_rng(11))
    ragged_out = op.apply(ims, params)  # one sequence of kernels over all pixels
    for x, y in zip(ragged_out, op.apply(host, params)):
        assert x.is_cuda and diff(x.cpu(), y).max() <= 2 and diff(x.cpu(), y).float().mean() < 0.05
    stacked = squares(ims)
    a, b = op.apply(stacked, params), op.apply(stacked.cpu(), params)
    assert diff(a.cpu(), b).max() <= 2 and diff(a.cpu(), b).float().mean() < 0.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.uint8])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_normalize_on_cuda_matches_cpu(dtype, layout):
    ims, host = gpu_batch()
    norm = Normalize(**IMAGENET, dtype=dtype, layout=layout, scale=50 if dtype == torch.uint8 else 1,
                     shift=128 if dtype == torch.uint8 else 0)
    for a, b in [(norm.apply(ims), norm.apply(host)), (norm.apply(squares(ims)), norm.apply(squares(host)))]:
        for x, y in zip(as_list(a), as_list(b)):
            assert x.is_cuda and x.dtype == dtype and x.shape == y.shape
            assert torch.allclose(x.cpu().float(), y.float(), atol=1e-5 if dtype == torch.float32 else 1e-2)


def test_reference_runs_on_cuda():
    """The fallback when CuPy is absent: the torch reference on CUDA tensors."""
    ims, host = gpu_batch()
    p = plan([RandomResizedCrop(48), Flip(), Normalize(**IMAGENET)], sizes_of(ims), np.random.default_rng(12))
    a = reference(ims, p.warp, epilogue=p.stages[0].epilogue.epilogue(3))
    b = reference(host, p.warp, epilogue=p.stages[0].epilogue.epilogue(3))
    assert a.is_cuda and torch.allclose(a.cpu(), b, atol=1.01 / min(IMAGENET["std"]))


def test_warp_arguments_buffer_is_reused_in_stream_order():
    """The kernel arguments go through one device buffer per stream (`_warp_kernel._arguments`): batches of
    different sizes launched back to back behind a long GPU delay give what each gives launched alone."""
    from ingest.ops import run_ops
    stream = torch.cuda.Stream()
    batches = [[torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, device="cuda") for h, w in sizes]
               for sizes in ([(40, 60), (33, 21)], [(64, 64)] * 5, [(25, 80), (90, 30), (50, 50)])]
    ops = [RandomResizedCrop(16)]
    wants = []
    for k, batch in enumerate(batches):
        wants.append(run_ops(ops, batch, rng=k, device_kind="cuda").cpu())
        torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)
        gots = [run_ops(ops, batch, rng=k, device_kind="cuda") for k, batch in enumerate(batches)]
    stream.synchronize()
    for want, got in zip(wants, gots):
        assert torch.equal(want, got.cpu())


def test_run_ops_from_cuda_to_the_cpu_waits_for_the_copy():
    """CUDA images run on the CPU are copied back with the host waiting: a copy queued behind GPU work and not
    waited for was read before it landed."""
    from ingest.ops import run_ops
    images = torch.randint(0, 256, (2, 40, 40, 3), dtype=torch.uint8, device="cuda")
    want = run_ops([Resize(20)], images.cpu(), rng=0)
    torch.cuda._sleep(100_000_000)
    assert torch.equal(run_ops([Resize(20)], images, rng=0), want)
