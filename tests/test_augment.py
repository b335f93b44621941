"""ingest.ops.functional against torchvision.transforms.v2.functional, and the policy ops (RandAugment,
TrivialAugmentWide, AutoAugment), RandomErasing, GaussianBlur, RandomGrayscale and RandomAffine: results
against torchvision run per sample with the same drawn parameters, the draws' distributions against
torchvision's (100k draws, vectorized), and the draws' independence of batch, position and shards.

Tolerance: uint8 results within 1 level of torchvision's (equal where the arithmetic is the same: the tests
say which); float results within 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from ingest.errors import ConfigError
from ingest.ops import functional as F
from ingest.ops import plan
from ingest.ops.augment import (IMAGENET_POLICY, NAMES, OP, AutoAugment, GaussianBlur, RandAugment, RandomAffine,
                                RandomErasing, RandomGrayscale, TrivialAugmentWide)
from ingest.random import SampleRandom

N = 6


def batch(n: int = N, h: int = 29, w: int = 37, c: int = 3, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=g)
    if n > 2:
        x[1] = x[1] // 3 + 60     # a low-contrast image: autocontrast and equalize have work to do
        x[2, :, :5] = 255         # flat parts
    return x


def levels(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.int() - b.int()).abs().max()) if a.numel() else 0


def per_sample_ref(fn, x: torch.Tensor, values) -> torch.Tensor:
    return torch.stack([fn(x[k], v) for k, v in enumerate(values)])


FACTORS = [0.0, 0.3, 1.0, 1.6, 2.5, 0.9]
CASES = [   # (ours, torchvision's, per-sample values, max levels apart)
    (F.adjust_brightness, TF.adjust_brightness, FACTORS, 0),
    (F.adjust_contrast, TF.adjust_contrast, FACTORS, 0),
    (F.adjust_saturation, TF.adjust_saturation, FACTORS, 0),
    (F.adjust_sharpness, TF.adjust_sharpness, FACTORS, 0),
    (F.adjust_hue, TF.adjust_hue, [-0.5, -0.2, 0.0, 0.1, 0.33, 0.5], 0),
    (F.posterize, TF.posterize, [0, 1, 3, 5, 7, 8], 0),
    (F.solarize, TF.solarize, [0.0, 1.0, 64.0, 128.0, 200.0, 255.0], 0),
    (lambda x, s: F.gaussian_blur(x, [5, 3], s), lambda x, s: TF.gaussian_blur(x, [5, 3], [s, s]),
     [0.1, 0.5, 1.0, 1.5, 2.0, 3.0], 1),   # separable: one float32 rounding apart
    (lambda x, a: F.rotate(x, a), lambda x, a: TF.rotate(x, a), [0.0, 9.0, -30.0, 45.0, 135.0, 90.0], 0),
    (lambda x, a: F.rotate(x, a, "bilinear", fill=(10, 20, 30)),
     lambda x, a: TF.rotate(x, a, v2.InterpolationMode.BILINEAR, fill=[10, 20, 30]),
     [0.0, 9.0, -30.0, 45.0, 135.0, 3.5], 0),
]


@pytest.mark.parametrize("ours, ref, values, tol", CASES, ids=lambda v: getattr(v, "__name__", None))
def test_primitive_matches_torchvision_per_sample_and_scalar(ours, ref, values, tol):
    x = batch()
    assert levels(ours(x, values), per_sample_ref(ref, x, values)) <= tol
    assert levels(ours(x, np.asarray(values)), per_sample_ref(ref, x, values)) <= tol     # numpy
    assert levels(ours(x, torch.tensor(values)), per_sample_ref(ref, x, values)) <= 1   # float32 factors
    assert levels(ours(x, values[3]), ref(x, values[3])) <= max(tol, 0)


@pytest.mark.parametrize("name", ["equalize", "autocontrast", "invert"])
def test_parameterless_primitives_equal_torchvision(name):
    x = batch()
    assert torch.equal(getattr(F, name)(x), getattr(TF, name)(x))
    xf = x.float() / 255
    assert torch.allclose(getattr(F, name)(xf), getattr(TF, name)(xf), atol=1e-5)


@pytest.mark.parametrize("channels", [1, 3])
def test_rgb_to_grayscale(channels):
    x = batch()
    assert torch.equal(F.rgb_to_grayscale(x, channels), TF.rgb_to_grayscale(x, channels))
    one = batch(c=1)
    assert torch.equal(F.rgb_to_grayscale(one, channels), TF.rgb_to_grayscale(one, channels))


def test_affine_per_sample_matches_torchvision():
    x = batch()
    angle = [0.0, 10.0, -25.0, 45.0, 180.0, 7.0]
    translate = [(0, 0), (3, -2), (-5, 4), (0, 7), (1, 1), (-3, 0)]
    scale = [1.0, 1.1, 0.8, 1.3, 1.0, 0.95]
    shear = [(0.0, 0.0), (5.0, 0.0), (0.0, -8.0), (12.0, 3.0), (0.0, 0.0), (-20.0, 0.0)]
    ours = F.affine(x, angle, translate, scale, shear, "bilinear", fill=0)
    ref = torch.stack([TF.affine(x[k], angle[k], list(translate[k]), scale[k], list(shear[k]),
                                 v2.InterpolationMode.BILINEAR, fill=0) for k in range(N)])
    assert levels(ours, ref) == 0
    corner = F.affine(x, 0.0, (0, 0), 1.0, 17.0, center=(0, 0))   # a shear about the top-left corner
    assert levels(corner, TF.affine(x, 0.0, [0, 0], 1.0, [17.0, 0.0], center=[0, 0])) == 0


def test_float_batches_match_torchvision():
    xf = batch().float() / 255
    for ours, ref, values, _ in CASES:
        if ours is F.solarize:
            values = [v / 255 for v in values]
        got, want = ours(xf, values), per_sample_ref(ref, xf, values)
        assert torch.allclose(got, want, atol=1e-5), ours


def test_erase_per_sample_rectangles():
    x = batch()
    i, j, h, w = [1, 0, 5, 3, 0, 28], [2, 0, 7, 1, 0, 36], [5, 0, 10, 29, 29, 1], [6, 3, 2, 37, 1, 1]
    got = F.erase(x, i, j, h, w, 7)
    want = torch.stack([TF.erase(x[k], i[k], j[k], h[k], w[k], torch.tensor(7, dtype=torch.uint8))
                        for k in range(N)])
    assert torch.equal(got, want)
    assert torch.equal(x, batch())   # not in place unless asked


def test_primitive_errors():
    x = batch()
    with pytest.raises(ValueError, match="brightness_factor"):
        F.adjust_brightness(x, [1.0, -0.1, 1, 1, 1, 1])
    with pytest.raises(ValueError, match="hue_factor"):
        F.adjust_hue(x, 0.7)
    with pytest.raises(ValueError, match="bits"):
        F.posterize(x, 9)
    with pytest.raises(ValueError, match="3 values for a batch of 6"):
        F.adjust_contrast(x, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"\[N, C, H, W\]"):
        F.invert(x[0])
    with pytest.raises(ValueError, match="expand"):
        F.rotate(x, 10.0, expand=True)


# --------------------------------------------------------------------------------------------------
# Policies

def hwc(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 2, 3, 1).contiguous()


def policy_reference(tv, x: torch.Tensor, params) -> torch.Tensor:
    """torchvision's own op code run per sample on our drawn ops and magnitudes."""
    out = []
    for n in range(len(x)):
        im = x[n]
        for k, m in zip(params.ops[n], params.magnitudes[n]):
            im = tv._apply_image_or_video_transform(im, NAMES[k], float(m), interpolation=tv.interpolation,
                                                    fill=tv._fill)
        out.append(im)
    return torch.stack(out)


@pytest.mark.parametrize("ours, tv", [
    (RandAugment(2, 9), v2.RandAugment(2, 9)),
    (RandAugment(3, 17, interpolation="bilinear", fill=(10, 20, 30)),
     v2.RandAugment(3, 17, interpolation=v2.InterpolationMode.BILINEAR, fill=[10, 20, 30])),
    (TrivialAugmentWide(), v2.TrivialAugmentWide()),
    (AutoAugment("imagenet"), v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET)),
], ids=["rand", "rand-bilinear-fill", "trivial", "auto"])
def test_policy_equals_torchvision_op_code(ours, tv):
    x = batch(48, 40, 52, seed=3)
    params = ours.draw([(40, 52)] * len(x), 11)
    got = ours.apply(hwc(x), params).permute(0, 3, 1, 2)
    assert levels(got, policy_reference(tv, x, params)) == 0


def test_policy_ragged_batch_runs_per_size():
    op = RandAugment(2, 9)
    ims = [hwc(batch(1, 30, 40, seed=s))[0] for s in range(3)] + [hwc(batch(1, 20, 24, seed=9))[0]]
    params = op.draw([tuple(im.shape[:2]) for im in ims], 5)
    out = op.apply(ims, params)
    for k, im in enumerate(ims):
        one = op.apply(im[None], type(params)(params.ops[k:k + 1], params.magnitudes[k:k + 1]))
        assert torch.equal(out[k], one[0])


def frequencies(values: np.ndarray, k: int) -> np.ndarray:
    return np.bincount(values.reshape(-1), minlength=k) / values.size


def close(freq: np.ndarray, p: np.ndarray, n: int) -> bool:
    """Within 5 standard errors of a binomial proportion (plus a hair for p = 0 or 1)."""
    return bool((np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-9).all())


DRAWS = 100_000


def test_randaugment_draws_follow_torchvision():
    op = RandAugment(2, 9)
    p = op.draw(np.tile([[224, 224]], (DRAWS, 1)), 1)
    space = [OP[n] for n in NAMES if n != "Invert"]
    freq = frequencies(p.ops, len(NAMES))
    assert close(freq[space], np.full(14, 1 / 14), p.ops.size) and freq[OP["Invert"]] == 0
    rot = p.magnitudes[p.ops == OP["Rotate"]]
    assert np.allclose(np.abs(rot), 9.0)
    assert close(np.array([(rot < 0).mean()]), np.array([0.5]), rot.size)
    tx = p.magnitudes[p.ops == OP["TranslateX"]]
    assert np.allclose(np.abs(tx), float(torch.linspace(0, 150 / 331 * 224, 31)[9]))
    post = p.magnitudes[p.ops == OP["Posterize"]]
    assert (post == 7).all()   # unsigned, 8 - round(9 / 7.5)


def test_trivialaugment_draws_follow_torchvision():
    op = TrivialAugmentWide()
    p = op.draw(np.tile([[64, 80]], (DRAWS, 1)), 2)
    assert p.ops.shape == (DRAWS, 1)
    freq = frequencies(p.ops, len(NAMES))
    space = [OP[n] for n in NAMES if n != "Invert"]
    assert close(freq[space], np.full(14, 1 / 14), DRAWS)
    rot = p.magnitudes[p.ops == OP["Rotate"]]
    bins = np.rint(np.abs(rot) / 4.5).astype(np.int64)   # linspace(0, 135, 31): 4.5 degrees a bin
    assert close(frequencies(bins, 31), np.full(31, 1 / 31), bins.size)
    assert close(np.array([(rot < 0).mean()]), np.array([0.5 * (1 - 1 / 31)]), rot.size)   # bin 0 has no sign


def test_autoaugment_draws_follow_torchvision():
    op = AutoAugment()
    p = op.draw(np.tile([[64, 80]], (DRAWS, 1)), 3)
    for j in range(2):
        want = np.zeros(len(NAMES))
        for sub in IMAGENET_POLICY:
            name, prob, _ = sub[j]
            want[OP[name]] += prob / len(IMAGENET_POLICY)
            want[OP["Identity"]] += (1 - prob) / len(IMAGENET_POLICY)
        assert close(frequencies(p.ops[:, j], len(NAMES)), want, DRAWS)


def test_draws_do_not_depend_on_batch_position_or_shard():
    ops = [RandAugment(2, 9), TrivialAugmentWide(), AutoAugment(), RandomErasing(0.5), GaussianBlur(5),
           RandomGrayscale(0.5), RandomAffine(20, (0.1, 0.1), (0.8, 1.2), 10)]
    idx = np.arange(100, 164)
    sizes = np.tile([[48, 64]], (len(idx), 1))
    whole = [op.draw(sizes, SampleRandom.keyed(7, 2, idx)) for op in ops]
    part = idx[[5, 40, 41, 63]]   # another rank's samples, or a resumed batch of 4
    some = [op.draw(sizes[:4], SampleRandom.keyed(7, 2, part)) for op in ops]
    for w, s in zip(whole, some):
        for a, b in zip(w if isinstance(w, tuple) else (w,), s if isinstance(s, tuple) else (s,)):
            np.testing.assert_array_equal(np.asarray(a)[[5, 40, 41, 63]], b)


def test_policy_config_errors():
    with pytest.raises(ConfigError, match="magnitude"):
        RandAugment(2, 31)
    with pytest.raises(ConfigError, match="num_ops"):
        RandAugment(-1)
    with pytest.raises(ConfigError, match="Unknown AutoAugment policy 'cifar'. Available: imagenet"):
        AutoAugment("cifar")
    with pytest.raises(ConfigError, match="interpolation"):
        TrivialAugmentWide(interpolation="bicubic")


# --------------------------------------------------------------------------------------------------
# RandomErasing, GaussianBlur, RandomGrayscale, RandomAffine

def test_random_erasing_matches_torchvision_draw_rule_and_erase():
    op = RandomErasing(p=1.0, value=(1, 2, 3))
    x = batch(32, 40, 52)
    p = op.draw([(40, 52)] * 32, 4)
    out = op.apply(hwc(x), p).permute(0, 3, 1, 2)
    for k, (i, j, h, w) in enumerate(p.boxes.tolist()):
        assert 0 < h < 40 and 0 < w < 52 and i + h <= 40 and j + w <= 52
        want = TF.erase(x[k], i, j, h, w, torch.tensor([1, 2, 3], dtype=torch.uint8)[:, None, None])
        assert torch.equal(out[k], want)
    areas = p.boxes[:, 2] * p.boxes[:, 3] / (40 * 52)
    assert (areas > 0.01).all() and (areas < 0.4).all()


def test_random_erasing_frequency_and_random_value():
    op = RandomErasing(p=0.25, value="random")
    p = op.draw(np.tile([[224, 224]], (DRAWS, 1)), 5)
    erased = p.boxes[:, 2] > 0
    assert close(np.array([erased.mean()]), np.array([0.25]), DRAWS)
    x = hwc(batch(8, 40, 52))
    p = op.draw([(40, 52)] * 8, 6)
    out = op.apply(x, p)
    assert torch.equal(out, op.apply(x, p))   # the same batch, the same noise
    untouched = ~torch.from_numpy(p.boxes[:, 2] > 0)
    assert torch.equal(out[untouched], x[untouched])


def test_gaussian_blur_op_matches_torchvision_per_sample():
    op = GaussianBlur(5, (0.1, 2.0))
    x = batch()
    sig = op.draw([(29, 37)] * N, 8)
    assert ((sig >= 0.1) & (sig < 2.0)).all()
    got = op.apply(hwc(x), sig).permute(0, 3, 1, 2)
    assert levels(got, per_sample_ref(lambda im, s: TF.gaussian_blur(im, [5, 5], [s, s]), x, sig)) <= 1


def test_random_grayscale():
    op = RandomGrayscale(0.5)
    x = batch()
    chosen = op.draw([(29, 37)] * N, 9)
    got = op.apply(hwc(x), chosen).permute(0, 3, 1, 2)
    for k in range(N):
        assert torch.equal(got[k], TF.rgb_to_grayscale(x[k], 3) if chosen[k] else x[k])


def test_random_affine_cpu_matches_torchvision_and_warp_is_close():
    op = RandomAffine(25, (0.1, 0.2), (0.8, 1.2), (-10, 10, -5, 5), interpolation="bilinear")
    x = batch(8, 48, 64)
    params = op.draw([(48, 64)] * 8, 10)
    got = op.apply(hwc(x), params).permute(0, 3, 1, 2)
    for k, (a, tx, ty, s, shx, shy) in enumerate(params.tolist()):
        assert tx == int(tx) and ty == int(ty)
        want = TF.affine(x[k], a, [int(tx), int(ty)], s, [shx, shy], v2.InterpolationMode.BILINEAR, fill=0)
        assert levels(got[k], want) == 0
    # The op's map (what the fused warp executes) samples the same points: the warp's result is torchvision's
    # away from the edges, where torchvision blends with the fill and the warp does not.
    from ingest.ops import resample
    from ingest.ops.affine import compose
    warped = resample.warp(hwc(x), compose([op.steps([(48, 64)] * 8, params)], [(48, 64)] * 8)).permute(0, 3, 1, 2)
    inner = (slice(None), slice(None), slice(12, 36), slice(16, 48))
    assert (warped[inner].int() - got[inner].int()).abs().float().mean() < 1.0


def test_random_affine_folds_into_the_warp_and_moves_boxes():
    from ingest.ops import Normalize, RandomResizedCrop
    ops = [RandomResizedCrop(32), RandomAffine(30, scale=(0.9, 1.1)), Normalize(127.0, 64.0)]
    p = plan(ops, [(60, 80)] * 4, 1, boxes=[np.array([[10.0, 10.0, 40.0, 30.0]])] * 4)
    assert len(p.stages) == 1 and p.stages[0].warp is not None and p.stages[0].epilogue is ops[2]
    boxes, keep = p.map_boxes([np.array([[10.0, 10.0, 40.0, 30.0]])] * 4)
    assert all(len(b) <= 1 for b in boxes)


def test_policies_run_inside_a_plan():
    from ingest.ops import Flip, Normalize, RandomResizedCrop
    ops = [RandomResizedCrop(32), Flip(), RandAugment(2, 9), RandomErasing(0.25), Normalize(127.0, 64.0)]
    images = [hwc(batch(1, 50 + 3 * k, 60, seed=k))[0] for k in range(5)]
    p = plan(ops, [tuple(im.shape[:2]) for im in images], 3)
    out = p.execute(images)
    assert out.shape == (5, 3, 32, 32) and out.dtype == torch.float32


def test_new_ops_send_a_chain_to_the_python_engine():
    from ingest.native_plan import describe
    from ingest.ops import Flip, MixUp, Normalize, RandomResizedCrop
    base = [RandomResizedCrop(32), Flip()]
    assert describe(base + [Normalize(127.0, 64.0)]) is not None
    for extra in ([RandAugment(2, 9)], [RandomAffine(10)], [RandomErasing(0.25)], [GaussianBlur(3)]):
        assert describe(base + extra + [Normalize(127.0, 64.0)]) is None
    assert describe(base + [Normalize(127.0, 64.0), MixUp(1.0, 10)]) is None
