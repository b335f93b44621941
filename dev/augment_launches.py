"""(any machine) What the augmentation costs per batch in torch calls: per op (each policy op kind, RandomErasing,
MixUp/CutMix) the aten calls that launch a kernel on the device, the host-to-device uploads, and every
device-to-host synchronization, counted without a GPU: the ops run on "cuda" tensors of torch's
``FakeTensorMode`` (shapes only, no data), under a dispatch mode that counts each call and flags a sync (a
copy between host and device without ``non_blocking``, ``.item()``, ``nonzero``, a boolean-mask index,
``unique``; a value the host needs from the device raises inside the fake mode, and is reported as a sync).
The policies (RandAugment, ...) run their own CUDA kernels where CuPy is there: those launches are counted by
kernel name (``policy_stats``, ``policy_apply``); ``--torch-path`` counts their torch calls instead. Then the
same ops on CPU tensors with real data, timed (CPU milliseconds per batch: the torch path).

    python dev/augment_launches.py                  # batch 256 counts, CPU time on batch 32, a table
    python dev/augment_launches.py --json out.json  # the same as JSON
    python dev/augment_launches.py --torch-path     # the policies as torch calls

``tests/test_augment_cost.py`` holds the counts to their bounds with :func:`count`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

aten = torch.ops.aten
#: Calls that launch no kernel: allocation, metadata.
_FREE = {"empty", "empty_strided", "empty_like", "detach", "lift_fresh", "lift_fresh_copy", "_pin_memory",
         "is_pinned", "set_", "resize_", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "dim",
         "is_contiguous", "_has_compatible_shallow_copy_type", "unsqueeze_", "squeeze_", "transpose_", "t_",
         "as_strided_"}
#: Calls whose result the host reads from the device: each is a synchronization.
_READS = {"_local_scalar_dense", "item", "nonzero", "nonzero_static", "masked_select", "unique", "_unique",
          "_unique2", "unique_dim", "unique_consecutive", "is_nonzero", "equal", "allclose", "tolist"}


class Counted(TorchDispatchMode):
    """Counts the aten calls on device tensors (``launches``, by name), the host-device copies (``uploads``
    non-blocking, ``syncs`` otherwise, and every read of a device value), with the stack of each sync."""

    def __init__(self, device: str = "cuda"):
        super().__init__()
        self.device = device
        self.launches: Counter = Counter()
        self.uploads = 0
        self.syncs: list[str] = []

    def _sync(self, what: str) -> None:
        stack = [f for f in traceback.extract_stack() if "/ingest/" in f.filename]
        where = f"{Path(stack[-1].filename).name}:{stack[-1].lineno} {stack[-1].line}" if stack else "?"
        self.syncs.append(f"{what} at {where}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        on_device = any(t.device.type == self.device for t in tensors) or (
            str(kwargs.get("device", "")).startswith(self.device))
        if name in _READS and on_device:
            self._sync(name)
        elif name == "_to_copy" and "device" in kwargs and tensors:
            src, dst = tensors[0].device.type, torch.device(kwargs["device"]).type
            if src != dst:
                if kwargs.get("non_blocking", False) and src == "cpu":
                    self.uploads += 1
                else:
                    self._sync(f"copy {src}->{dst} (blocking)")
        elif name == "copy_" and len(tensors) >= 2 and tensors[0].device.type != tensors[1].device.type:
            blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            if blocking or tensors[1].device.type != "cpu":
                self._sync(f"copy {tensors[1].device.type}->{tensors[0].device.type}")
            else:
                self.uploads += 1
        elif on_device and not func.is_view and name not in _FREE and func.namespace != "prim":
            self.launches[name] += 1
        return func(*args, **kwargs)

    def summary(self) -> dict[str, Any]:
        return {"launches": sum(self.launches.values()), "uploads": self.uploads, "syncs": len(self.syncs),
                "sync_sites": sorted(set(self.syncs)), "by_call": dict(self.launches.most_common())}


@contextlib.contextmanager
def _fake_uploads():
    """Host-to-device uploads as plain non-blocking copies (the staging ring needs a driver and real device
    memory), and ``pin_memory`` a no-op (it needs a driver)."""
    from ingest.ops import functional
    saved = {name: getattr(functional, name) for name in ("_to_device_bytes", "_stream_key")
             if hasattr(functional, name)}
    if "_to_device_bytes" in saved:
        functional._to_device_bytes = lambda host, device: torch.from_numpy(host).to(device, non_blocking=True)
    if "_stream_key" in saved:
        functional._stream_key = lambda device: 0
    saved_pin = torch.Tensor.pin_memory
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.pin_memory = saved_pin
        for name, value in saved.items():
            setattr(functional, name, value)


@contextlib.contextmanager
def _policy_kernel(fused: bool, launched: Counter):
    """The policies' own kernels (``ingest.ops._policy_kernel``) taken as available (``fused``) or not, their
    launches counted by kernel name into ``launched`` instead of run."""
    from ingest.ops import _policy_kernel as kernel
    saved = kernel.available, kernel._launch
    kernel.available = lambda: fused
    kernel._launch = lambda name, grid, block, args: launched.update(["policy_" + name])
    try:
        yield
    finally:
        kernel.available, kernel._launch = saved


def count(fn: Callable[[torch.Tensor], Any], shape: tuple[int, ...], dtype: torch.dtype = torch.uint8,
          device: str = "cuda", fused: bool = True) -> dict[str, Any]:
    """Run ``fn`` on a batch of ``shape`` on a fake ``device`` and count what it launches (see the module
    docstring): the second call, so constants the ops make once (a base grid, a kernel) are not counted. A
    value the host reads from the device ends the run: it is reported as a sync. ``fused``: the policies run
    their own kernels (as on CUDA with CuPy; each launch counted by name), else their torch calls."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ingest.ops import functional
    counted = Counted(device)
    launched: Counter = Counter()
    with _fake_uploads(), _policy_kernel(fused, launched), FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(shape, dtype=dtype, device=device)
        try:
            with Counted(device):
                fn(x)
            launched.clear()
            with counted:
                fn(x)
            counted.launches.update(launched)
        except Exception as err:  # noqa: BLE001 - a data-dependent call on a fake tensor: the host waits there
            if "DataDependent" not in type(err).__name__ and "DynamicOutputShape" not in type(err).__name__:
                raise
            counted._sync(type(err).__name__)
        finally:
            getattr(functional, "_CONSTANTS", {}).clear()   # fake tensors must not outlive their mode
    return counted.summary()


def cpu_ms(fn: Callable[[torch.Tensor], Any], shape: tuple[int, ...], rounds: int = 5) -> float:
    """CPU milliseconds per call of ``fn`` on a real random uint8 batch of ``shape``: the process's CPU time
    on one torch thread, best of ``rounds`` (other processes on the machine lengthen the wall time, less so
    this)."""
    x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fn(x)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.process_time()
            fn(x)
            best = min(best, time.process_time() - t0)
    finally:
        torch.set_num_threads(threads)
    return round(1000 * best, 3)


# --------------------------------------------------------------------------------------------------
# What is measured: [N, H, W, C] uint8 batches as the Loader's ops get them after the crop


def cases(n: int, size: int = 224) -> dict[str, Callable[[torch.Tensor], Any]]:
    """Per case, a function of the ``[n, size, size, 3]`` batch: each policy op kind alone (every sample draws
    it, both rounds), RandAugment(2, 9) as drawn, RandomErasing(0.25), MixUpCutMix, and the three together."""
    from ingest.ops import MixUpCutMix, RandAugment, RandomErasing
    from ingest.ops.augment import NAMES, OP, PolicyParams
    sizes = [(size, size)] * n
    ra = RandAugment(2, 9)
    drawn = ra.draw(sizes, 0)
    mags = {name: float(np.abs(drawn.magnitudes[drawn.ops == OP[name]]).max(initial=0.0)) for name in NAMES}
    out: dict[str, Callable[[torch.Tensor], Any]] = {}
    for name in NAMES[1:-1]:
        k = OP[name]
        params = PolicyParams(np.full((n, 2), k), np.full((n, 2), mags[name] or 0.0))
        out[name] = (lambda p: lambda x: ra.apply(x, p))(params)
    erasing = RandomErasing(0.25, scale=(0.02, 1 / 3), ratio=(0.3, 3.3), value=0)
    erase_params = erasing.draw(sizes, 1)
    mix = MixUpCutMix(0.8, 1.0, num_classes=1000, label_smoothing=0.1)
    mix_params = mix.draw(sizes, 2)
    labels = np.arange(n) % 1000

    def mixing(x):
        y = x.permute(0, 3, 1, 2).float()
        mix.mix_labels(labels, mix_params)
        return mix.mix_images(y, mix_params)

    out["RandAugment(2, 9)"] = lambda x: ra.apply(x, drawn)
    out["RandomErasing(0.25)"] = lambda x: erasing.apply(x, erase_params)
    out["MixUpCutMix (float NCHW)"] = mixing
    out["recipe: RandAugment + RandomErasing + MixUpCutMix"] = lambda x: mixing(
        erasing.apply(ra.apply(x, drawn), erase_params))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--torch-path", action="store_true",
                   help="count the policies' torch calls (CUDA without CuPy) instead of their own kernels")
    p.add_argument("--batch", type=int, default=256, help="batch size of the counts (default 256)")
    p.add_argument("--cpu-batch", type=int, default=32, help="batch size of the CPU timing (default 32)")
    p.add_argument("--json", default=None, help="write the results here too")
    a = p.parse_args(argv)
    report = {}
    timed = cases(a.cpu_batch)
    for name, fn in cases(a.batch).items():
        counts = count(fn, (a.batch, 224, 224, 3), fused=not a.torch_path)
        counts["cpu_ms_batch_%d" % a.cpu_batch] = cpu_ms(timed[name], (a.cpu_batch, 224, 224, 3))
        report[name] = counts
        print(f"{name:52s} launches {counts['launches']:4d}  uploads {counts['uploads']:3d}  "
              f"syncs {counts['syncs']:2d}  cpu {counts['cpu_ms_batch_%d' % a.cpu_batch]:8.2f} ms", flush=True)
        for site in counts["sync_sites"]:
            print(f"    sync: {site}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
