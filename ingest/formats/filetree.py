"""File trees: one file per sample. `FileTree` reads the ImageFolder layout (``root/<class>/**/<file>``,
labels = sorted class directory names); `FileList` takes an explicit list of paths with optional labels."""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import numpy as np

from ..errors import ConfigError, SourceError
from ._images import image_extension
from ._native_table import NativeTable
from .base import Location, Record, check_index, check_indices

#: Extensions recognised as images by default (lower case, with the dot).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".gif", ".jp2", ".j2k",
                    ".j2c", ".pam", ".pnm")


def _normalize_extensions(extensions: Iterable[str]) -> tuple[str, ...]:
    exts = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)
    if not exts:
        raise SourceError("`extensions` must name at least one extension")
    return exts


class FileList:
    """Samples given as a list of file paths, with optional integer labels and class names."""

    def __init__(self, paths: Sequence[str | os.PathLike], labels: Sequence[int] | None = None,
                 classes: Sequence[str] = (), *, sizes: Sequence[int] | None = None):
        self._paths = [os.fspath(p) for p in paths]
        # File sizes known up front let the reader place a whole batch in one buffer in one pass; a file
        # that changed size since the listing fails its read with a short-read error naming it.
        self._sizes = None if sizes is None else np.asarray(sizes, dtype=np.int64)
        if labels is None:
            self._labels = np.full(len(self._paths), -1, dtype=np.int64)
        else:
            self._labels = np.asarray(labels, dtype=np.int64)
            if self._labels.shape != (len(self._paths),):
                raise SourceError(f"got {len(self._paths)} paths but {len(self._labels)} labels")
        self.classes = list(classes)
        if self.classes and len(self._labels) and self._labels.max() >= len(self.classes):
            raise SourceError(f"label {int(self._labels.max())} has no class name "
                              f"({len(self.classes)} classes given)")

    def __len__(self) -> int:
        return len(self._paths)

    def locate(self, i: int) -> Location:
        i = check_index(i, len(self._paths))
        return Location(self._paths[i], 0, None if self._sizes is None else int(self._sizes[i]))

    def locate_batch(self, indices: Sequence[int]) -> list[Location]:
        """`locate` of each sample in one call (the read stage's per-sample Python is GIL time the training
        loop waits for); an index out of range raises as `locate` does."""
        ids, paths = check_indices(indices, len(self._paths)).tolist(), self._paths
        if self._sizes is None:
            return [Location(paths[i], 0, None) for i in ids]
        return [Location(paths[i], 0, size) for i, size in zip(ids, self._sizes[ids].tolist())]

    def parse(self, i: int, raw) -> Record:
        return Record(raw, int(self._labels[i]))

    def parse_batch(self, indices: Sequence[int], raws: Sequence) -> list[Record]:
        """`parse` of each sample: its bytes and its label, the labels taken in one call."""
        labels = self._labels[np.asarray(indices, np.int64)].tolist()
        return [Record(raw, label, {}) for raw, label in zip(raws, labels)]

    def labels(self) -> np.ndarray:
        return self._labels

    def native_table(self) -> NativeTable:
        """Every sample for the native engine: its whole file (the listed size, else -1: to its end) and label."""
        n = len(self._paths)
        sizes = self._sizes if self._sizes is not None else np.full(n, -1, np.int64)
        return NativeTable(self._paths, np.arange(n, dtype=np.int64), np.zeros(n, np.int64), sizes, self._labels,
                           "whole")

    def name(self, i: int) -> str:
        return self._paths[check_index(i, len(self._paths))]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} files, {len(self.classes)} classes)"


class FileTree(FileList):
    """The ImageFolder layout: every directory under ``root`` is a class (sorted by name -> label 0, 1, ...);
    files with an image extension anywhere below it are its samples, in sorted order. Other files are ignored.

    A class directory with no images raises `SourceError` naming it, unless ``allow_empty=True``; so does a
    root without class directories.
    """

    def __init__(self, root: str | os.PathLike, *, extensions: Iterable[str] = IMAGE_EXTENSIONS,
                 allow_empty: bool = False):
        root = os.fspath(root)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"dataset root {root!r} is not a directory")
        self.root = root
        exts = _normalize_extensions(extensions)
        try:
            classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
        except OSError as err:
            raise SourceError(f"cannot list dataset root {root!r}: {err}", path=root) from err
        if not classes:
            raise SourceError(f"{root!r} has no class directories (expected root/<class>/<image files>)",
                              path=root)
        paths: list[str] = []
        sizes: list[int] = []
        labels: list[int] = []
        empty = []
        for label, cls in enumerate(classes):
            files = _walk_images(os.path.join(root, cls), exts)
            if not files:
                empty.append(cls)
            paths += [f for f, _ in files]
            sizes += [n for _, n in files]
            labels += [label] * len(files)
        if empty and not allow_empty:
            raise SourceError(f"{len(empty)} class director{'y has' if len(empty) == 1 else 'ies have'} no "
                              f"files with extensions {', '.join(exts)} under {root!r}: "
                              f"{', '.join(empty[:10])}{' ...' if len(empty) > 10 else ''} "
                              "(pass allow_empty=True to keep them as classes without samples)", path=root)
        super().__init__(paths, labels, classes, sizes=sizes)


def _walk_images(directory: str, exts: tuple[str, ...]) -> list[tuple[str, int]]:
    """(path, size) of the image files below ``directory``, depth first in name order."""
    found: list[tuple[str, int]] = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                found += _walk_images(entry.path, exts)
            elif entry.name.lower().endswith(exts) and entry.is_file():
                found.append((entry.path, entry.stat().st_size))
    except OSError as err:
        raise SourceError(f"cannot list {err.filename or directory!r}: {err.strerror}",
                          path=err.filename or directory) from err
    return found


class FileTreeWriter:
    """Writes samples as ``<class>/<stem>-<n>.<ext>`` image files below ``directory`` (the writer contract of
    `ingest.formats.base`), so that `FileTree` reads them back with the same labels.

    Class directories are the names in ``classes`` when those are in sorted order and usable as directory
    names (what `FileTree` itself produces), else the zero-padded label (``00007``), so that sorting the
    directories gives back label order. A file tree holds only an encoded ``image`` and an int ``label``:
    other fields, decoded pixels and samples without a label are refused (`ConfigError`), not dropped.
    """

    def __init__(self, directory: str | os.PathLike, stem: str, fields: dict, *, classes: Sequence[str] = ()):
        extra = sorted(set(fields) - {"image", "label"})
        if extra:
            raise ConfigError(f"a file tree holds only 'image' and 'label'; the source also has {', '.join(extra)} "
                              f"(leave them out on purpose with --drop {','.join(extra)}, or drop_fields=)")
        if "label" not in fields:
            raise ConfigError("a file tree needs a 'label' field: the label names each sample's class directory")
        if "image" not in fields or fields["image"].kind != "image":
            raise ConfigError("a file tree holds encoded images; the source's 'image' field is "
                              f"{fields['image'].kind if 'image' in fields else 'missing'}")
        self.directory = os.fspath(directory)
        self.stem = stem
        self.classes = list(classes)
        usable = all(c and "/" not in c and "\\" not in c and not c.startswith(".") for c in self.classes)
        self._named = bool(self.classes) and usable and self.classes == sorted(set(self.classes))
        self._width = max(5, len(str(max(len(self.classes) - 1, 0))))
        self._written: list[str] = []

    def _class_dir(self, label: int) -> str:
        if label < 0:
            raise ConfigError("a file tree needs a class for every sample; got a sample without a label (-1)")
        if self._named:
            if label >= len(self.classes):
                raise ConfigError(f"label {label} has no class name ({len(self.classes)} classes)")
            return self.classes[label]
        return f"{label:0{self._width}d}"

    def add(self, record: Record) -> None:
        ext = image_extension(record.image)
        if ext is None:
            raise ConfigError(f"cannot tell the image type of a sample (first bytes "
                              f"{bytes(memoryview(record.image).cast('B')[:8])!r}); a file tree names files by it")
        name = os.path.join(self._class_dir(int(record.label)), f"{self.stem}-{len(self._written):06d}{ext}")
        os.makedirs(os.path.join(self.directory, os.path.dirname(name)), exist_ok=True)
        with open(os.path.join(self.directory, name), "wb") as f:
            f.write(memoryview(record.image).cast("B"))
        self._written.append(name)

    def close(self) -> list[str]:
        return list(self._written)
