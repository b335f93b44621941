"""Batched image primitives with ``torchvision.transforms.v2.functional``'s names and meaning.

Every function takes a batch ``[N, C, H, W]`` (uint8 in 0..255 or float in 0..1, CPU or CUDA) and returns a
new batch of the same dtype, shape and device. A parameter is a number (the whole batch) or one value per
sample: a sequence, numpy array or tensor of N values. The arithmetic is torchvision's, step for step, in
float32, so a uint8 result equals torchvision's within one level (equal where the parameter is a number; a
per-sample factor changes the order of one float32 multiply-add) and a float result within float32 rounding.
Each is a fixed number of batched torch operations: no loop over samples, and no wait for the device: per-sample
parameters given on the host go to the device in one asynchronous copy (:func:`upload`), constants are made
once per device.

Geometry: :func:`rotate` and :func:`affine` sample the batch through per-sample matrices with
``grid_sample``, as torchvision does (same grid, same fill blend), keeping the size of the batch. Inside a
Loader use the ops (`ingest.ops.Rotate`, `ingest.ops.augment.RandomAffine`): their maps fold into the one
fused warp of the geometry around them.

Rules: images must have 1 or 3 channels where torchvision requires it (colour ops); factors must be >= 0
(checked where they are on the host); ``hue`` in [-0.5, 0.5]; ``bits`` in 0..8.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .._driver import Staging

__all__ = [
    "adjust_brightness", "adjust_contrast", "adjust_hue", "adjust_saturation", "adjust_sharpness", "affine",
    "autocontrast", "equalize", "erase", "gaussian_blur", "inverse_affine_matrices", "invert", "posterize",
    "rgb_to_grayscale", "rotate", "solarize",
]

Value = Any   # a number, or N values (sequence, numpy array or tensor)


# --------------------------------------------------------------------------------------------------
# Helpers

#: Pinned buffers of the parameter uploads: a buffer is reused once its copy has run, so with a few uploads per
#: batch the ring covers several batches queued ahead of the GPU before the host would wait for one.
_STAGING = Staging(slots=32)
_CONSTANTS: OrderedDict[tuple, torch.Tensor] = OrderedDict()
_CONSTANTS_LOCK = threading.Lock()
_KEPT = 32   # constants kept (base grids are per image size: a ragged stream of sizes must not grow it)


def _to_device_bytes(host: np.ndarray, device: torch.device) -> torch.Tensor:
    """The C-contiguous uint8 array ``host`` as a tensor on ``device``: itself on the CPU; on CUDA one
    asynchronous copy on the current stream through a ring of pinned staging buffers (no pinning per call,
    no wait for the GPU)."""
    if device.type != "cuda":
        return torch.from_numpy(host)
    dst = torch.empty(host.nbytes, dtype=torch.uint8, device=device)
    _STAGING.copy(host, dst, torch.cuda.current_stream(device))
    return dst


def upload(arrays: Sequence[np.ndarray], device: torch.device | str) -> list[torch.Tensor]:
    """Host arrays as tensors of their dtypes and shapes on ``device``, all in one copy (on the CPU: the arrays'
    memory, no copy). How the ops send a batch's per-sample parameters: one upload, then views of it."""
    device = torch.device(device)
    arrays = [np.ascontiguousarray(a) for a in arrays]
    if device.type != "cuda" or not arrays:
        return [torch.from_numpy(a) for a in arrays]
    starts, end = [], 0
    for a in arrays:
        starts.append(end)
        end += -(-a.nbytes // 8) * 8   # every array 8-byte aligned, so each views as its dtype
    host = np.zeros(max(end, 8), dtype=np.uint8)
    for a, at in zip(arrays, starts):
        host[at:at + a.nbytes] = a.reshape(-1).view(np.uint8)
    dev = _to_device_bytes(host, device)
    return [dev[at:at + a.nbytes].view(torch.from_numpy(a[:0].reshape(-1)).dtype).view(a.shape)
            for a, at in zip(arrays, starts)]


def _stream_key(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def _cached(key: tuple, build: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The tensor ``build()`` made once per ``key`` (the most recent few are kept). Keys of CUDA tensors hold
    the stream (:func:`_stream_key`): a tensor is used on the stream that made it, so dropping it is safe."""
    with _CONSTANTS_LOCK:
        t = _CONSTANTS.get(key)
        if t is not None:
            _CONSTANTS.move_to_end(key)
            return t
    t = build()
    with _CONSTANTS_LOCK:
        _CONSTANTS[key] = t
        while len(_CONSTANTS) > _KEPT:
            _CONSTANTS.popitem(last=False)
    return t


def _constant(key: tuple, make: Callable[[], np.ndarray], device: torch.device,
              dtype: torch.dtype | None = None) -> torch.Tensor:
    """A constant tensor made on the host by ``make()`` (a numpy array), in ``dtype`` (default its own), kept
    per ``key``, device and dtype: made and uploaded once."""
    def build() -> torch.Tensor:
        t = upload([make()], device)[0]
        return t if dtype is None else t.to(dtype)
    return _cached(key + (str(device), _stream_key(device), dtype), build)


def _check(images: torch.Tensor, *, channels: Sequence[int] | None = (1, 3)) -> None:
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        raise ValueError(f"expected a [N, C, H, W] batch tensor, got "
                         f"{tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__}")
    if channels is not None and images.shape[1] not in channels:
        raise TypeError(f"expected images of {' or '.join(map(str, channels))} channels, got {images.shape[1]}")


def _bound(images: torch.Tensor) -> float:
    return 1.0 if images.is_floating_point() else 255.0


def _host(value: Value) -> np.ndarray | None:
    """``value`` as a float64 numpy array when it is on the host (None for a tensor on a device)."""
    if isinstance(value, torch.Tensor):
        return value.detach().double().numpy() if value.device.type == "cpu" else None
    return np.asarray(value, dtype=np.float64)


def _per_sample(value: Value, images: torch.Tensor, name: str, *, low: float | None = None,
                high: float | None = None) -> float | torch.Tensor:
    """A number as a float, or N values as a float32 ``[N, 1, 1, 1]`` tensor on the images' device (a float
    images' dtype); values on the host are checked against [low, high]."""
    host = _host(value)
    if host is not None:
        if (low is not None and (host < low).any()) or (high is not None and (host > high).any()):
            raise ValueError(f"`{name}` must lie in [{low}, {high}], got {value!r}")
        if host.ndim == 0:
            return float(host)
    n = images.shape[0]
    dtype = images.dtype if images.is_floating_point() else torch.float32
    if isinstance(value, torch.Tensor):
        t = value.to(device=images.device, dtype=dtype)
    else:
        t = upload([host.astype(np.float32 if dtype == torch.float32 else np.float64)], images.device)[0].to(dtype)
    if t.numel() not in (1, n):
        raise ValueError(f"`{name}` has {t.numel()} values for a batch of {n}")
    return t.reshape(-1, 1, 1, 1)


def _to_dtype(out: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    return out if images.is_floating_point() else out.to(images.dtype)


def _ratio(value: Value, images: torch.Tensor, name: str) -> tuple[float | torch.Tensor, float | torch.Tensor]:
    """A blend factor (>= 0) and one minus it, each a float or ``[N, 1, 1, 1]``; on the host ``1 - f`` is taken
    in float64 before the cast, as torchvision's ``alpha=1 - f`` is, so results are torchvision's exactly."""
    f = _per_sample(value, images, name, low=0.0)
    host = _host(value)
    if isinstance(f, float):
        return f, 1.0 - f
    return f, (1.0 - f) if host is None else _per_sample(1.0 - host.reshape(-1), images, name)


def _blend(image1: torch.Tensor, image2: torch.Tensor, value: Value, name: str) -> torch.Tensor:
    """torchvision's ``_blend``: ``image1 * f + image2 * (1 - f)``, clamped, in image1's dtype."""
    f, g = _ratio(value, image1, name)
    if isinstance(f, float):
        out = image1.mul(f).add_(image2, alpha=g)
    else:
        out = image1.mul(f).addcmul_(image2, g)
    return _to_dtype(out.clamp_(0, _bound(image1)), image1)


def _gray_float(images: torch.Tensor) -> torch.Tensor:
    """Luma ``[N, 1, H, W]`` in float, truncated to whole levels for uint8 (torchvision's rule)."""
    r, g, b = images.unbind(dim=1)
    gray = r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(1)
    return gray if images.is_floating_point() else gray.floor_()


# --------------------------------------------------------------------------------------------------
# Colour

def rgb_to_grayscale(images: torch.Tensor, num_output_channels: int = 1) -> torch.Tensor:
    """Luma (ITU-R 601: 0.2989 R + 0.587 G + 0.114 B) as 1 or 3 channels of the input dtype."""
    _check(images)
    if num_output_channels not in (1, 3):
        raise ValueError(f"`num_output_channels` must be 1 or 3, got {num_output_channels}")
    if images.shape[1] == 1:
        return images.clone() if num_output_channels == 1 else images.repeat(1, 3, 1, 1)
    r, g, b = images.unbind(dim=1)
    gray = r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(1).to(images.dtype)
    return gray if num_output_channels == 1 else gray.expand(images.shape).contiguous()


def adjust_brightness(images: torch.Tensor, brightness_factor: Value) -> torch.Tensor:
    """Multiply by the factor (>= 0), clamped to the range."""
    _check(images)
    f = _per_sample(brightness_factor, images, "brightness_factor", low=0.0)
    return _to_dtype(images.mul(f).clamp_(0, _bound(images)), images)


def adjust_contrast(images: torch.Tensor, contrast_factor: Value) -> torch.Tensor:
    """Blend each image with the mean of its luma by the factor (>= 0)."""
    _check(images)
    gray = _gray_float(images) if images.shape[1] == 3 else images.to(torch.float32) \
        if not images.is_floating_point() else images
    return _blend(images, gray.mean(dim=(-3, -2, -1), keepdim=True), contrast_factor, "contrast_factor")


def adjust_saturation(images: torch.Tensor, saturation_factor: Value) -> torch.Tensor:
    """Blend each image with its luma by the factor (>= 0); 1-channel images are returned as they are."""
    _check(images)
    if images.shape[1] == 1:
        return images
    return _blend(images, _gray_float(images), saturation_factor, "saturation_factor")


def _rgb_to_hsv(image: torch.Tensor) -> torch.Tensor:
    """torchvision's (Pillow's) RGB -> HSV of float ``[N, 3, H, W]`` in 0..1."""
    r, g, _ = image.unbind(dim=-3)
    minc, maxc = torch.aminmax(image, dim=-3)
    eqc = maxc == minc
    channels_range = maxc - minc
    ones = torch.ones_like(maxc)
    s = channels_range / torch.where(eqc, ones, maxc)
    divisor = torch.where(eqc, ones, channels_range).unsqueeze_(dim=-3)
    rc, gc, bc = ((maxc.unsqueeze(dim=-3) - image) / divisor).unbind(dim=-3)
    neq_r = maxc != r
    eq_g = maxc == g
    hg = rc.add(2.0).sub_(bc).mul_(eq_g & neq_r)
    hr = bc.sub_(gc).mul_(~neq_r)
    hb = gc.add_(4.0).sub_(rc).mul_(neq_r.logical_and_(eq_g.logical_not_()))
    h = hr.add_(hg).add_(hb).mul_(1.0 / 6.0).add_(1.0).fmod_(1.0)
    return torch.stack((h, s, maxc), dim=-3)


_HSV_SELECT = np.array([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]], dtype=np.int64)


def _hsv_to_rgb(img: torch.Tensor) -> torch.Tensor:
    """torchvision's HSV -> RGB of float ``[N, 3, H, W]``."""
    h, s, v = img.unbind(dim=-3)
    h6 = h.mul(6)
    i = torch.floor(h6)
    f = h6.sub_(i)
    i = i.to(dtype=torch.int32).remainder_(6)
    sxf = s * f
    one_minus_s = 1.0 - s
    q = (1.0 - sxf).mul_(v).clamp_(0.0, 1.0)
    t = sxf.add_(one_minus_s).mul_(v).clamp_(0.0, 1.0)
    p = one_minus_s.mul_(v).clamp_(0.0, 1.0)
    vpqt = torch.stack((v, p, q, t), dim=-3)
    select = _constant(("hsv",), lambda: _HSV_SELECT, img.device)[:, i].moveaxis(0, -3)
    return vpqt.gather(-3, select)


def adjust_hue(images: torch.Tensor, hue_factor: Value) -> torch.Tensor:
    """Rotate the hue (HSV) by the factor, in turns (in [-0.5, 0.5]); 1-channel images are returned as they are."""
    _check(images)
    f = _per_sample(hue_factor, images, "hue_factor", low=-0.5, high=0.5)
    if images.shape[1] == 1 or images.numel() == 0:
        return images
    x = images.to(torch.float32) if images.is_floating_point() else images.to(torch.float32).mul_(1.0 / 255.0)
    hsv = _rgb_to_hsv(x)
    h, s, v = hsv.unbind(dim=-3)
    h = h.add_(f[:, 0] if isinstance(f, torch.Tensor) else f).remainder_(1.0)
    out = _hsv_to_rgb(torch.stack((h, s, v), dim=-3))
    if images.is_floating_point():
        return out.to(images.dtype)
    return out.mul_(255.0 + 1.0 - 1e-3).to(images.dtype)   # torchvision's float -> uint8 rule


def adjust_sharpness(images: torch.Tensor, sharpness_factor: Value) -> torch.Tensor:
    """Blend with the image smoothed by PIL's 3x3 kernel (border pixels kept) by the factor (>= 0)."""
    _check(images)
    f, g = _ratio(sharpness_factor, images, "sharpness_factor")
    return _sharpen(images, f, g)


def _sharpen(images: torch.Tensor, f: float | torch.Tensor, g: float | torch.Tensor) -> torch.Tensor:
    """:func:`adjust_sharpness` with the factor ``f`` and ``g = 1 - f`` given (numbers or ``[N, 1, 1, 1]``)."""
    n, c, h, w = images.shape
    if images.numel() == 0 or h <= 2 or w <= 2:
        return images
    fp = images.is_floating_point()
    dtype = images.dtype if fp else torch.float32
    a, b = 1.0 / 13.0, 5.0 / 13.0
    kernel = _constant(("sharpness",), lambda: np.array([[a, a, a], [a, b, a], [a, a, a]]), images.device,
                       dtype).expand(c, 1, 3, 3)
    out = images.to(dtype=dtype, copy=True)
    blurred = F.conv2d(out, kernel, groups=c)
    if not fp:
        blurred = blurred.round_()
    view = out[..., 1:-1, 1:-1]
    if isinstance(f, float):
        view.add_(blurred.sub_(view), alpha=g)
    else:
        view.addcmul_(blurred.sub_(view), g)
    return _to_dtype(out.clamp_(0, _bound(images)), images)


def posterize(images: torch.Tensor, bits: Value) -> torch.Tensor:
    """Keep the ``bits`` (0..8) high bits of each channel (float: ``floor(x * 2**bits) / 2**bits``)."""
    _check(images, channels=None)
    host = _host(bits)
    if host is not None and ((host < 0).any() or (host > 8).any() or (host != np.round(host)).any()):
        raise ValueError(f"`bits` must be integers in 0..8, got {bits!r}")
    if images.is_floating_point():
        levels = 2.0 ** _per_sample(bits, images, "bits")
        if isinstance(levels, float):
            return images.mul(levels).floor_().clamp_(0, levels - 1).mul_(1.0 / levels)
        return torch.minimum(images.mul(levels).floor_().clamp_(min=0), levels - 1).mul_(1.0 / levels)
    if host is not None and host.ndim == 0:
        b = int(host)
        return images.clone() if b >= 8 else images & (((1 << b) - 1) << (8 - b))
    b = _per_sample(bits, images, "bits").to(torch.int32)
    mask = ((1 << 8) - (1 << (8 - b))).to(torch.uint8)   # (2**b - 1) << (8 - b), 255 for b = 8
    return images & mask


def invert(images: torch.Tensor) -> torch.Tensor:
    """``1 - x`` (float) or ``255 - x`` (uint8)."""
    _check(images, channels=None)
    return 1.0 - images if images.is_floating_point() else images.bitwise_not()


def solarize(images: torch.Tensor, threshold: Value) -> torch.Tensor:
    """Invert the values at or above ``threshold`` (in the images' range)."""
    _check(images, channels=None)
    t = _per_sample(threshold, images, "threshold", high=_bound(images))
    return torch.where(images >= t, invert(images), images)


def autocontrast(images: torch.Tensor) -> torch.Tensor:
    """Stretch each channel of each image so its minimum maps to 0 and its maximum to the top of the range."""
    _check(images)
    if images.numel() == 0:
        return images
    bound = _bound(images)
    x = images if images.is_floating_point() else images.to(torch.float32)
    minimum = x.amin(dim=(-2, -1), keepdim=True)
    maximum = x.amax(dim=(-2, -1), keepdim=True)
    eq = maximum == minimum
    inv_scale = maximum.sub_(minimum).mul_(1.0 / bound)
    minimum = minimum.masked_fill_(eq, 0.0)
    inv_scale = inv_scale.masked_fill_(eq, 1.0)
    diff = x.sub(minimum) if images.is_floating_point() else x.sub_(minimum)
    return diff.div_(inv_scale).clamp_(0, bound).to(images.dtype)


def equalize(images: torch.Tensor) -> torch.Tensor:
    """Histogram equalization of each channel of each image (torchvision's, which is PIL's), in uint8 levels."""
    _check(images, channels=None)
    if images.numel() == 0:
        return images
    fp = images.is_floating_point()
    x = images.mul(255.0 + 1.0 - 1e-3).to(torch.uint8) if fp else images
    batch_shape = x.shape[:-2]
    flat = x.flatten(start_dim=-2).to(torch.long)
    hist = flat.new_zeros(batch_shape + (256,), dtype=torch.int32)
    one = _constant(("one",), lambda: np.ones(1, dtype=np.int32), x.device)
    hist.scatter_add_(dim=-1, index=flat, src=one.expand_as(flat))
    cum_hist = hist.cumsum(dim=-1)
    index = cum_hist.argmax(dim=-1, keepdim=True)   # the last level in the image
    step = (flat.shape[-1] - hist.gather(dim=-1, index=index)).div_(255, rounding_mode="floor")
    valid = step.ne(0)
    lut = torch.zeros_like(cum_hist)
    torch.add(cum_hist[..., :-1], step // 2, out=lut[..., 1:])
    lut[..., 1:].div_(step.clamp_(min=1), rounding_mode="floor").clamp_(0, 255)
    # an image of one level (step 0) is kept: the identity table, chosen on the small tables, not the pixels
    identity = _constant(("levels",), lambda: np.arange(256, dtype=np.int64), x.device)
    lut = torch.where(valid, lut, identity).to(torch.uint8)
    out = lut.gather(dim=-1, index=flat).view_as(x)
    return out.to(images.dtype).div_(255.0) if fp else out


# --------------------------------------------------------------------------------------------------
# Filters and erasing

def _gaussian_kernels(kernel_size: int, sigma: torch.Tensor | float, dtype: torch.dtype,
                      device: torch.device) -> torch.Tensor:
    """torchvision's 1-D kernel, one row per sigma: ``[S, k]``."""
    lim = (kernel_size - 1) / (2.0 * math.sqrt(2.0))
    x = torch.linspace(-lim, lim, steps=kernel_size, dtype=dtype, device=device)
    s = sigma.reshape(-1, 1) if isinstance(sigma, torch.Tensor) else float(sigma)
    return torch.softmax(x.div(s).pow(2).neg(), dim=-1).reshape(-1, kernel_size)


def gaussian_blur(images: torch.Tensor, kernel_size: int | Sequence[int], sigma: Value | None = None) -> torch.Tensor:
    """Gaussian blur with an odd ``kernel_size`` (one int or (x, y)) and ``sigma`` > 0 (a number, N values, or
    a pair of either for (x, y); default torchvision's ``0.15 * k + 0.35``), reflect-padded. Separable: one
    horizontal and one vertical grouped convolution over the batch, so uint8 results may differ from
    torchvision's 2-D kernel by one level."""
    _check(images, channels=None)
    ks = [kernel_size, kernel_size] if isinstance(kernel_size, int) else list(kernel_size)
    if len(ks) != 2 or any(not isinstance(k, int) or k <= 0 or k % 2 == 0 for k in ks):
        raise ValueError(f"`kernel_size` must be an odd positive int or a pair of them, got {kernel_size!r}")
    if sigma is None:
        sigmas = [k * 0.15 + 0.35 for k in ks]
    elif isinstance(sigma, (tuple, list)) and len(sigma) == 2:
        sigmas = list(sigma)
    else:
        sigmas = [sigma, sigma]
    n, c, h, w = images.shape
    if images.numel() == 0:
        return images
    fp = images.is_floating_point()
    dtype = images.dtype if fp else torch.float32
    x = images if fp else images.to(torch.float32)
    x = F.pad(x, [ks[0] // 2, ks[0] // 2, ks[1] // 2, ks[1] // 2], mode="reflect")
    for axis, (k, s) in enumerate(zip(ks, sigmas)):
        sv = _per_sample(s, images, "sigma", low=1e-30)
        kern = _gaussian_kernels(k, sv if isinstance(sv, float) else sv.reshape(-1), dtype, images.device)
        if kern.shape[0] == 1:   # one kernel: grouped over the channels
            weight, x2, groups = kern.expand(c, k), x, c
        else:                    # one kernel per sample: grouped over samples x channels
            weight, x2, groups = kern.repeat_interleave(c, dim=0), x.reshape(1, n * c, *x.shape[-2:]), n * c
        weight = weight.view(groups, 1, 1, k) if axis == 0 else weight.view(groups, 1, k, 1)
        x = F.conv2d(x2, weight.to(dtype), groups=groups)
        x = x.reshape(n, c, *x.shape[-2:])
    return x if fp else x.round_().to(images.dtype)


def erase(images: torch.Tensor, i: Value, j: Value, h: Value, w: Value, v: torch.Tensor | float,
          inplace: bool = False) -> torch.Tensor:
    """Set each image's rectangle rows ``i..i+h``, columns ``j..j+w`` to ``v``: a number, a tensor that
    broadcasts against ``[N, C, H, W]`` (per channel ``[C, 1, 1]``, per sample ``[N, C, 1, 1]``, or per
    pixel). A sample with ``h`` or ``w`` 0 is left as it is."""
    _check(images, channels=None)
    dev = images.device
    host: list[np.ndarray] = []
    box = None
    if any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in (i, j, h, w)):
        i, j, h, w = (a.to(dev, torch.int64).reshape(-1) if isinstance(a, torch.Tensor) else
                      upload([np.asarray(a, dtype=np.int64).reshape(-1)], dev)[0] for a in (i, j, h, w))
        box = torch.stack(torch.broadcast_tensors(i, j, i + h, j + w), dim=1)
    else:
        i, j, h, w = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (i, j, h, w))
        host.append(np.stack(np.broadcast_arrays(i, j, i + h, j + w), axis=1))
    moved = isinstance(v, torch.Tensor) and v.device != dev
    if moved:
        host.append((v.detach() if v.requires_grad else v).numpy())
    sent = iter(upload(host, dev))
    box = next(sent) if box is None else box
    value = (next(sent) if moved else v).to(images.dtype) if isinstance(v, torch.Tensor) else float(v)
    return erase_boxes(images, box, value, inplace)


def erase_mask(images: torch.Tensor, box: torch.Tensor) -> torch.Tensor:
    """``[N or 1, 1, H, W]`` bool: inside each sample's rectangle (``box`` as :func:`erase_boxes` takes it), for
    images ``[N, C, H, W]``."""
    height, width = images.shape[-2:]
    rows = _constant(("arange", height), lambda: np.arange(height, dtype=np.int64), images.device).view(1, -1)
    cols = _constant(("arange", width), lambda: np.arange(width, dtype=np.int64), images.device).view(1, -1)
    in_rows = (rows >= box[:, 0:1]) & (rows < box[:, 2:3])      # [N or 1, H]
    in_cols = (cols >= box[:, 1:2]) & (cols < box[:, 3:4])      # [N or 1, W]
    return in_rows[:, None, :, None] & in_cols[:, None, None, :]


def erase_boxes(images: torch.Tensor, box: torch.Tensor, value: torch.Tensor | float,
                inplace: bool = False) -> torch.Tensor:
    """:func:`erase` with the rectangles as ``[N or 1, 4]`` int64 rows (top, left, bottom, right; ends
    exclusive) on the images' device and ``value`` a number or a tensor of the images' dtype and device: one
    mask from the per-sample rectangles, one masked fill."""
    mask = erase_mask(images, box)
    if isinstance(value, torch.Tensor):
        out = torch.where(mask, value, images)
        return images.copy_(out) if inplace else out
    return images.masked_fill_(mask, value) if inplace else images.masked_fill(mask, value)


# --------------------------------------------------------------------------------------------------
# Geometry

def inverse_affine_matrices(angle: Value, translate: Value, scale: Value, shear: Value,
                            center: Value) -> np.ndarray:
    """torchvision's ``_get_inverse_affine_matrix`` for N samples at once: ``[N, 2, 3]`` float64, mapping an
    output point (relative to the output centre) to the input point it samples (relative to the input
    centre). ``angle`` (degrees, clockwise), ``scale`` (> 0): numbers or ``[N]``; ``translate``, ``shear``
    (degrees), ``center`` (relative to the image centre): pairs or ``[N, 2]``."""
    angle = np.asarray(angle, dtype=np.float64)
    scale = np.asarray(scale, dtype=np.float64)
    translate, shear, center = (np.asarray(v, dtype=np.float64).reshape(-1, 2) for v in (translate, shear, center))
    n = max(angle.size, scale.size, len(translate), len(shear), len(center))
    angle, scale = np.broadcast_to(angle.reshape(-1), (n,)), np.broadcast_to(scale.reshape(-1), (n,))
    translate, shear, center = (np.broadcast_to(v, (n, 2)) for v in (translate, shear, center))
    if (scale <= 0).any():
        raise ValueError(f"`scale` must be positive, got {scale}")
    rot = np.radians(angle)
    sx, sy = np.radians(shear[:, 0]), np.radians(shear[:, 1])
    cx, cy = center[:, 0], center[:, 1]
    tx, ty = translate[:, 0], translate[:, 1]
    cos_sy, tan_sx = np.cos(sy), np.tan(sx)
    a = np.cos(rot - sy) / cos_sy
    b = -(a * tan_sx + np.sin(rot))
    c = np.sin(rot - sy) / cos_sy
    d = np.cos(rot) - c * tan_sx
    m = np.empty((n, 2, 3))
    m[:, 0, 0], m[:, 0, 1], m[:, 0, 2] = d / scale, -b / scale, 0.0
    m[:, 1, 0], m[:, 1, 1], m[:, 1, 2] = -c / scale, a / scale, 0.0
    m[:, 0, 2] += cx - m[:, 0, 0] * (cx + tx) - m[:, 0, 1] * (cy + ty)
    m[:, 1, 2] += cy - m[:, 1, 0] * (cx + tx) - m[:, 1, 1] * (cy + ty)
    return m


def _fill_values(fill: Value | None, channels: int) -> list[float] | None:
    if fill is None:
        return None
    values = [float(v) for v in (fill if isinstance(fill, (tuple, list)) else [fill])]
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise ValueError(f"`fill` has {len(values)} values for images of {channels} channels")
    return values


def warp_batch(images: torch.Tensor, theta: np.ndarray, interpolation: str = "nearest",
               fill: Value | None = None) -> torch.Tensor:
    """Resample each image through its inverse map ``theta[n]`` (``[N, 2, 3]``, relative to the centres, as
    :func:`inverse_affine_matrices` gives) on torchvision's grid, keeping the size: ``grid_sample``, then
    torchvision's fill blend where ``fill`` is given (None: zeros from outside, no blend)."""
    _check(images, channels=None)
    if interpolation not in ("nearest", "bilinear"):
        raise ValueError(f"Unknown interpolation {interpolation!r}. Available: bilinear, nearest")
    if images.numel() == 0:
        return images
    host = warp_arguments(theta, images.shape[-2:], _fill_values(fill, images.shape[1]), _work_dtype(images))
    return warp_sent(images, upload(host, images.device), interpolation)


def _work_dtype(images: torch.Tensor) -> torch.dtype:
    return images.dtype if images.is_floating_point() else torch.float32


def warp_arguments(theta: np.ndarray, size: Sequence[int], fill: list[float] | None,
                   dtype: torch.dtype) -> list[np.ndarray]:
    """What :func:`warp_sent` takes, on the host: for float32 work, torchvision's grid matrices
    ``theta^T / (w / 2, h / 2)`` (``[N, 3, 2]``, the same float32 operations as its), else ``theta`` in float64
    (divided on the device in ``dtype``); then the fill values when there are any."""
    h, w = size
    if dtype == torch.float32:
        half = np.array([0.5 * w, 0.5 * h], dtype=np.float32)
        host = [np.ascontiguousarray(np.asarray(theta, dtype=np.float64).astype(np.float32).transpose(0, 2, 1) / half)]
    else:
        host = [np.ascontiguousarray(theta, dtype=np.float64)]
    if fill is not None:
        host.append(np.asarray(fill, dtype=np.float32 if dtype == torch.float32 else np.float64))
    return host


def _base_grid(h: int, w: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torchvision's affine base grid ``[1, h * w, 3]``: pixel centres relative to the image centre, and 1."""
    def build() -> torch.Tensor:
        base = torch.empty(1, h, w, 3, dtype=dtype, device=device)
        base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=device))
        base[..., 1].copy_(torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=device)[:, None])
        base[..., 2].fill_(1)
        return base.view(1, h * w, 3)
    return _cached(("grid", h, w, dtype, str(device), _stream_key(device)), build)


def warp_sent(images: torch.Tensor, sent: Sequence[torch.Tensor], interpolation: str) -> torch.Tensor:
    """:func:`warp_batch` with :func:`warp_arguments`' arrays already on the images' device."""
    n, c, h, w = images.shape
    fp = images.is_floating_point()
    dtype = _work_dtype(images)
    dev = images.device
    if dtype == torch.float32:
        rescaled = sent[0]
    else:
        half = _constant(("half", w, h), lambda: np.array([0.5 * w, 0.5 * h]), dev, dtype)
        rescaled = sent[0].to(dtype).transpose(1, 2).div(half)
    grid = _base_grid(h, w, dtype, dev).expand(n, h * w, 3).bmm(rescaled.expand(n, 3, 2)).view(n, h, w, 2)
    fill = sent[1].to(dtype).view(1, -1, 1, 1) if len(sent) > 1 else None
    if fill is None:
        x = images if fp else images.to(dtype)
    else:   # torchvision's: a channel of ones resampled with the image marks what came from inside
        x = torch.empty((n, c + 1, h, w), dtype=dtype, device=dev)
        x[:, :c].copy_(images)
        x[:, c].fill_(1)
    x = F.grid_sample(x, grid, mode=interpolation, padding_mode="zeros", align_corners=False)
    if fill is not None:
        x, mask = torch.tensor_split(x, indices=(-1,), dim=-3)
        mask = mask.expand_as(x)
        if interpolation == "nearest":
            x = torch.where(mask < 0.5, fill.expand_as(x), x)
        else:
            x = x.sub_(fill).mul_(mask).add_(fill)
    if fp:
        return x
    # nearest sampling without a fill blend gives the input's whole levels (or 0): nothing to round
    return (x if interpolation == "nearest" and fill is None else x.round_()).to(images.dtype)


def affine(images: torch.Tensor, angle: Value, translate: Value, scale: Value, shear: Value,
           interpolation: str = "nearest", fill: Value | None = None, center: Value | None = None) -> torch.Tensor:
    """torchvision's ``affine``: rotate by ``angle`` degrees (clockwise), scale, shear (``shear`` one number
    for x or an (x, y) pair of degrees, or ``[N]`` / ``[N, 2]``) about ``center`` (pixels; default the image
    centre), then translate (pixels, an (x, y) pair or ``[N, 2]``), keeping the size. Each parameter is for
    the whole batch or per sample."""
    _check(images, channels=None)
    n, _, h, w = images.shape
    shear = np.asarray(shear, dtype=np.float64)
    if shear.ndim == 0 or (shear.ndim == 1 and shear.size == n and n != 2):
        shear = np.stack([shear.reshape(-1), np.zeros(shear.size)], axis=-1)
    centre = (0.0, 0.0) if center is None else np.asarray(center, dtype=np.float64).reshape(-1, 2) - [w * 0.5, h * 0.5]
    return warp_batch(images, inverse_affine_matrices(angle, translate, scale, shear, centre), interpolation, fill)


def rotate(images: torch.Tensor, angle: Value, interpolation: str = "nearest", expand: bool = False,
           center: Value | None = None, fill: Value | None = None) -> torch.Tensor:
    """torchvision's ``rotate``: counter-clockwise by ``angle`` degrees (a number or per sample) about
    ``center`` (default the image centre), keeping the size (a batch has one size, so ``expand`` must be
    False: use the Rotate op for expanded rotations)."""
    if expand:
        raise ValueError("a batch keeps one size: rotate(..., expand=True) is the Rotate op's, not the batch's")
    return affine(images, -np.asarray(angle, dtype=np.float64), (0.0, 0.0), 1.0, (0.0, 0.0), interpolation, fill,
                  center)
