"""Where the files of NVIDIA's library wheels lie, found without importing them (importing ``nvidia.nvimgcodec``
would load the library it wraps)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_folders(package: str) -> list[Path]:
    """The folders of the installed package ``package`` (e.g. "nvidia.nvjpeg2k"); empty where it is not
    installed."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    return [Path(folder) for folder in (spec.submodule_search_locations or [])] if spec is not None else []


def first_file(candidates) -> Path | None:
    """The first of ``candidates`` (paths) that exists, or None."""
    return next((path for path in candidates if path.exists()), None)
