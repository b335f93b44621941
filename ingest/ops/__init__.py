"""Batched augmentation on CPU or CUDA tensors, for images and for the boxes and masks that go with them.

The flow, one module per step::

    base       the op contract: draw(sizes, rngs[, boxes]) per sample, apply(images, params), declare()
    geometry   Resize, CenterCrop, RandomResizedCrop, Flip, Rotate     } each a per-sample affine map
    detection  RandomIoUCrop, ZoomOut, PadTo                           } (affine.Steps)
    color      ColorJitter;  normalize  Normalize (an epilogue: x * a + b, dtype, layout)
    augment    RandAugment, TrivialAugmentWide, AutoAugment, RandomErasing, GaussianBlur, RandomGrayscale,
               RandomAffine (a geometry op);  functional  the batched primitives they run (torchvision's names)
    mix        MixUp, CutMix, MixUpCutMix: batch ops, last, mixing samples and their labels
    user       BatchFunction (the user's function over the batch), Torchvision (a v2 transform as an op)
    planner    plan(): draw every op's params once, per sample; each run of geometry ops -> one Warp
    affine     the map algebra shared by images, boxes and masks: compose, map_boxes, Warp
    resample   execute a Warp (one CUDA kernel per batch, _warp_kernel; torch reference elsewhere)
    spec       dumps(ops) / loads(text): a list of ops as versioned JSON (what `ingest serve` loads)

Images::

    p = plan(ops, sizes, rngs)          # sizes: probed (h, w); rngs: the batch's SampleRandom (or a seed)
    p.warp.roi()                        # before decoding: the source region each image needs (or p.warp None)
    out = p.execute(images, origins=)   # decoded [H, W, C] uint8 batch (ragged list or [N, H, W, C])
    p.out_sizes, p.output               # declared before running: sizes, dtype and layout (None: [H, W, C])

Detection (boxes ltrb in absolute source pixels, ``[K, 4]`` per sample; masks ``[K, H, W]`` uint8)::

    p = plan(ops, sizes, rngs, boxes=boxes)     # boxes are needed when a draw depends on them (IoU crop)
    targets = p.targets(targets)                # per sample dict: boxes mapped, clipped, empty ones dropped,
                                                # masks warped (nearest), labels/iscrowd/area pruned with them
    boxes, keep = p.map_boxes(boxes)            # or piecewise: boxes and, per sample, which input boxes survive
    masks = p.warp_masks(masks)

    b = BoxBatch.of(boxes)                      # the batch's boxes as one [M, 4] array + offsets (ops/boxes.py):
    p = plan(ops, sizes, rngs, boxes=b)         # drawn, mapped and pruned as whole-batch arrays; the pipeline's
    targets = p.batch_targets(fields, b)        # form, whose boxes the plan mapped already

A geometry op maps a box through its per-sample map (the four corners, their bounding box, clipped to its
output), op by op, so results equal torchvision's ``transforms.v2`` on ``BoundingBoxes`` op for op; masks go
through each stage's own warp with nearest sampling, so they stay aligned with the image. Colour ops between
geometry ops split the warps but move nothing.

``op(images, rng=seed)`` runs one op eagerly; :func:`run_ops` plans and runs a list.
"""

from .affine import Steps, Warp, compose
from .augment import (AutoAugment, GaussianBlur, RandAugment, RandomAffine, RandomErasing, RandomGrayscale,
                      TrivialAugmentWide)
from .base import ImageSpec, Op, per_sample
from .boxes import BoxBatch
from .color import ColorJitter
from .detection import PadTo, RandomIoUCrop, ZoomOut
from .geometry import CenterCrop, Flip, GeometryOp, HorizontalFlip, RandomResizedCrop, Resize, Rotate, VerticalFlip
from .normalize import Normalize
from .mix import BatchOp, CutMix, MixUp, MixUpCutMix
from .planner import Plan, plan, run_ops
from .spec import dumps, loads
from .user import BatchFunction, Torchvision

__all__ = [
    "AutoAugment", "BatchFunction", "BatchOp", "BoxBatch", "CenterCrop", "ColorJitter", "CutMix", "Flip", "GaussianBlur",
    "GeometryOp", "HorizontalFlip", "ImageSpec", "MixUp", "MixUpCutMix", "Normalize", "Op", "PadTo", "Plan",
    "RandAugment", "RandomAffine", "RandomErasing", "RandomGrayscale", "RandomIoUCrop", "RandomResizedCrop",
    "Resize", "Rotate", "Steps", "Torchvision", "TrivialAugmentWide", "VerticalFlip", "Warp", "ZoomOut", "compose",
    "dumps", "loads", "per_sample", "plan", "run_ops",
]
