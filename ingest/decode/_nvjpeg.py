"""Which nvJPEG nvImageCodec gets.

nvImageCodec opens nvJPEG by its soname (``libnvjpeg.so.13``), and the dynamic loader answers with any library
already loaded under that soname. torchvision's wheel bundles an nvJPEG of its own (13.0.1 with torchvision
0.26, in a renamed file that keeps the soname) and loads it when torchvision is imported. nvImageCodec 0.9 on
that nvJPEG decodes no region of any JPEG (each one fails with ENCODING_UNSUPPORTED), so a training script
that imported torchvision first would send every randomly cropped image to the CPU decoder (docs/measurements.md,
Which nvJPEG).

So `import ingest` loads the nvidia-nvjpeg wheel's copy (the one nvImageCodec's RUNPATH names) first, where it is
installed and no nvJPEG is loaded yet. Where one already is, `ingest.decode.gpu.GpuDecoder` finds out with a
region decode of its own and decodes whole images instead, with a warning that names the copies loaded.

Worker processes are spawned, and a spawned child imports the user's main script before any code of ours runs
in it, torchvision first if the script does. So the workers start with the wheel's copy in ``LD_PRELOAD``
(:func:`in_children`): the dynamic loader maps it before the interpreter starts. It needs only the C library.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
from pathlib import Path
from typing import Iterator

from ._wheels import first_file, package_folders

SONAME = "libnvjpeg.so.13"
_NVJPEG = re.compile(r"/libnvjpeg(\.[0-9a-f]{8})?\.so[.0-9]*$")   # nvJPEG itself, not nvJPEG2000


def wheel_copy() -> Path | None:
    """The nvidia-nvjpeg wheel's library beside nvImageCodec's (``nvidia/cu13/lib``), if both are installed."""
    return first_file(folder.parent / "cu13" / "lib" / SONAME for folder in package_folders("nvidia.nvimgcodec"))


def loaded(maps: str | None = None) -> list[str]:
    """The files of every nvJPEG mapped into this process (from ``/proc/self/maps``; empty where unreadable)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    return sorted({line.split()[-1] for line in maps.splitlines() if _NVJPEG.search(line)})


def describe() -> str:
    """`loaded` for a message: the files, comma-separated, or "none found"."""
    return ", ".join(loaded()) or "none found"


def preload() -> Path | None:
    """Load the wheel's nvJPEG unless an nvJPEG is loaded already; the path loaded, or None. Never raises."""
    if loaded():
        return None
    path = wheel_copy()
    if path is None:
        return None
    try:
        ctypes.CDLL(str(path))
    except OSError:
        return None
    return path


@contextlib.contextmanager
def in_children() -> Iterator[None]:
    """Processes started inside this block (spawned: they inherit the environment) load the wheel's nvJPEG
    first, through ``LD_PRELOAD``; the variable is as it was after the block. Nothing where the wheel is not
    installed or the variable names it already."""
    path = wheel_copy()
    before = os.environ.get("LD_PRELOAD")
    if path is None or str(path) in (before or "").replace(":", " ").split():
        yield
        return
    os.environ["LD_PRELOAD"] = f"{path}:{before}" if before else str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = before
