"""Shared fixtures: generated datasets and the path of the real-world files."""

from __future__ import annotations

import io
from pathlib import Path

import ingest  # noqa: F401 - before any test module imports torchvision: ingest's nvJPEG first (ingest.decode._nvjpeg)
import numpy as np
import pytest
import torch
from PIL import Image

import os

#: Files other tools wrote (../shared/data/realworld beside the checkout; INGEST_REALWORLD overrides, e.g. on
#: the device machine, where only the working tree is copied).
REALWORLD = Path(os.environ.get("INGEST_REALWORLD")
                 or Path(__file__).resolve().parents[1].parent / "shared" / "data" / "realworld")

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(params=["native", "python"])
def read_engine(request, monkeypatch) -> str:
    """Each engine of `ingest.io`'s batched reads in turn: the compiled ``ingest._readv`` and, as where it was
    not built, the same tasks on Python threads."""
    from ingest import io as ingest_io
    if request.param == "native" and ingest_io.NATIVE is None:
        pytest.skip("ingest._readv was not built (no C compiler when installed)")
    if request.param == "python":
        monkeypatch.setattr(ingest_io, "NATIVE", None)
    return request.param


def realworld(sub: str = "") -> Path:
    """The real-world data directory (``sub`` inside it), or skip the test when it is absent."""
    path = REALWORLD / sub
    if not path.exists():
        pytest.skip(f"real-world data not found at {path}")
    return path


def textured(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus a pattern: codecs and resizes have work to do, and every orientation differs."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    phase = rng.uniform(0, 6, 3)
    img = [128 + 90 * np.sin(x / (9 + 4 * c) + y / (13 + 2 * c) + phase[c]) + 30 * (x / w) - 30 * (y / h)
           for c in range(3)]
    return np.clip(np.stack(img, -1), 0, 255).astype(np.uint8)


def encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def jpeg_bytes(h: int, w: int, seed: int = 0, quality: int = 90, **kw) -> bytes:
    return encode(Image.fromarray(textured(h, w, seed)), "JPEG", quality=quality, **kw)


def make_image_folder(root: Path, classes: dict[str, int], *, size=(48, 64), seed: int = 0) -> Path:
    """root/<class>/<i>.jpg with varied sizes; returns root."""
    k = 0
    for cls, count in classes.items():
        d = root / cls
        d.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            h, w = size[0] + (k * 7) % 23, size[1] + (k * 5) % 31
            (d / f"{i:04d}.jpg").write_bytes(jpeg_bytes(h, w, seed + k))
            k += 1
    return root


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "train", {"cat": 7, "dog": 5, "emu": 9})


def isolated(fn, *args, timeout: float = 60.0) -> str:
    """``fn(*args)`` in a forked child, so that a crash (SIGBUS, SIGABRT, a segfault) fails the calling test
    instead of killing pytest: its return value as text, or ``"<ExceptionType>: message"`` for an exception.
    AssertionError names the signal or exit status of a child that died."""
    import signal
    import tempfile
    import time
    with tempfile.NamedTemporaryFile(prefix="isolated-") as result:
        pid = os.fork()
        if pid == 0:   # the child: report, then leave without running pytest's exit handlers
            try:
                try:
                    out = str(fn(*args))
                except BaseException as err:   # noqa: BLE001 - every outcome goes back to the parent
                    out = f"<{type(err).__name__}>: {err}"
                with open(result.name, "w", errors="backslashreplace") as f:
                    f.write(out)
            finally:
                os._exit(0)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"{fn.__name__}{args!r} ran past {timeout} s")
            time.sleep(0.002)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            what = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            raise AssertionError(f"{fn.__name__}{args!r} died: {what}")
        with open(result.name, errors="backslashreplace") as f:
            return f.read()


def cpp_library(directory: Path, source: str, *flags: str) -> Path:
    """``source`` compiled as C++ into a shared library in ``directory`` with the system compiler and ``flags``
    (after -O2 -shared -fPIC): the CUDA kernels' sources built for the CPU. Skips the test without a compiler."""
    import shutil
    import subprocess
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the kernel source for the CPU")
    (directory / "k.cpp").write_text(source)
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", *flags, str(directory / "k.cpp"), "-o",
                    str(directory / "k.so")], check=True, capture_output=True)
    return directory / "k.so"
