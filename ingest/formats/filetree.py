"""File trees: one file per sample. `FileTree` reads the ImageFolder layout (``root/<class>/**/<file>``,
labels = sorted class directory names); `FileList` takes an explicit list of paths with optional labels, and
optionally a segmentation mask file per image (`FileList.pairs` pairs a directory of images with one of masks by
file stem: PASCAL VOC's ``JPEGImages`` and ``SegmentationClass``, ADE20K's ``images`` and ``annotations``)."""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import numpy as np

from ..errors import ConfigError, SourceError
from ._images import image_extension
from ._native_table import NativeTable, NotNative
from .base import DEFAULT_FIELDS, Field, Location, Record, check_index, check_indices

#: Extensions recognised as images by default (lower case, with the dot).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".gif", ".jp2", ".j2k",
                    ".j2c", ".pam", ".pnm")


def _normalize_extensions(extensions: Iterable[str]) -> tuple[str, ...]:
    exts = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)
    if not exts:
        raise SourceError("`extensions` must name at least one extension")
    return exts


class FileList:
    """Samples given as a list of file paths, with optional integer labels and class names.

    ``masks`` (one path per image) adds the field ``mask``: each image's segmentation label map in a file of its
    own (a palette or gray PNG: `ingest.decode.masks` decodes it to its stored values), read beside the image and
    moved by every geometry op with it; ``mask_fill`` is what those ops pad it with (default
    `ingest.formats.base.MASK_FILL`, VOC's "ignore"). Such a list runs on the Python stages (the native engine's
    tables hold one file per sample)."""

    def __init__(self, paths: Sequence[str | os.PathLike], labels: Sequence[int] | None = None,
                 classes: Sequence[str] = (), *, sizes: Sequence[int] | None = None,
                 masks: Sequence[str | os.PathLike] | None = None, mask_fill: int | None = None):
        self._paths = [os.fspath(p) for p in paths]
        # File sizes known up front let the reader place a whole batch in one buffer in one pass; a file
        # that changed size since the listing fails its read with a short-read error naming it.
        self._sizes = None if sizes is None else np.asarray(sizes, dtype=np.int64)
        self._masks = None if masks is None else [os.fspath(p) for p in masks]
        if self._masks is not None:
            if len(self._masks) != len(self._paths):
                raise SourceError(f"got {len(self._paths)} paths but {len(self._masks)} masks")
            self.fields = {**DEFAULT_FIELDS, "mask": Field("mask", fill=mask_fill)}
        elif mask_fill is not None:
            raise ConfigError("`mask_fill` is the padding of `masks`: pass the masks too")
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

    def locate(self, i: int) -> Location | tuple[Location, Location]:
        """The image file (with its mask file, where the list has masks)."""
        i = check_index(i, len(self._paths))
        image = Location(self._paths[i], 0, None if self._sizes is None else int(self._sizes[i]))
        return image if self._masks is None else (image, Location(self._masks[i], 0, None))

    def locate_batch(self, indices: Sequence[int]) -> list:
        """`locate` of each sample in one call (the read stage's per-sample Python is GIL time the training
        loop waits for); an index out of range raises as `locate` does."""
        ids, paths = check_indices(indices, len(self._paths)).tolist(), self._paths
        if self._sizes is None:
            images = [Location(paths[i], 0, None) for i in ids]
        else:
            images = [Location(paths[i], 0, size) for i, size in zip(ids, self._sizes[ids].tolist())]
        if self._masks is None:
            return images
        return [(image, Location(self._masks[i], 0, None)) for image, i in zip(images, ids)]

    def parse(self, i: int, raw) -> Record:
        if self._masks is not None:
            image, mask = raw
            return Record(image, int(self._labels[i]), {"mask": mask})
        return Record(raw, int(self._labels[i]))

    def parse_batch(self, indices: Sequence[int], raws: Sequence) -> list[Record]:
        """`parse` of each sample: its bytes and its label, the labels taken in one call."""
        labels = self._labels[np.asarray(indices, np.int64)].tolist()
        if self._masks is not None:
            return [Record(image, label, {"mask": mask}) for (image, mask), label in zip(raws, labels)]
        return [Record(raw, label, {}) for raw, label in zip(raws, labels)]

    @classmethod
    def pairs(cls, images: str | os.PathLike, masks: str | os.PathLike, *,
              names: str | os.PathLike | Sequence[str] | None = None, mask_fill: int | None = None,
              extensions: Iterable[str] = IMAGE_EXTENSIONS, mask_extensions: Iterable[str] = (".png",)) -> "FileList":
        """Segmentation samples from a directory of images and one of masks, paired by file stem (``2007_000032.jpg``
        with ``2007_000032.png``): the stems of ``names`` (a sequence, or a text file of one per line such as VOC's
        ``ImageSets/Segmentation/train.txt``), in its order, else every mask's, sorted. A stem without its image or
        its mask, or with two images of other extensions, is a `SourceError` naming it."""
        found = {}
        for kind, directory, exts in (("image", images, _normalize_extensions(extensions)),
                                      ("mask", masks, _normalize_extensions(mask_extensions))):
            directory = os.fspath(directory)
            by_stem: dict[str, str] = {}
            for path, _ in _walk_images(directory, exts, recursive=False):
                stem = os.path.splitext(os.path.basename(path))[0]
                if stem in by_stem:
                    raise SourceError(f"two {kind} files of stem {stem!r} in {directory!r}: "
                                      f"{os.path.basename(by_stem[stem])} and {os.path.basename(path)}", path=path)
                by_stem[stem] = path
            found[kind] = (directory, by_stem)
        if names is None:
            stems = sorted(found["mask"][1])
        elif isinstance(names, (str, os.PathLike)):
            try:
                with open(names, encoding="utf-8") as f:
                    stems = [line.split()[0] for line in f if line.strip()]
            except OSError as err:
                raise SourceError(f"cannot read the list of names {os.fspath(names)!r}: {err.strerror}",
                                  path=os.fspath(names)) from err
        else:
            stems = [str(n) for n in names]
        if not stems:
            raise SourceError(f"no samples: no mask files with extensions {', '.join(mask_extensions)} in "
                              f"{found['mask'][0]!r}" if names is None else "no samples: `names` lists none",
                              path=found["mask"][0])
        for kind in ("image", "mask"):
            directory, by_stem = found[kind]
            missing = [stem for stem in stems if stem not in by_stem]
            if missing:
                raise SourceError(f"{len(missing)} sample{'s have' if len(missing) > 1 else ' has'} no {kind} file "
                                  f"in {directory!r}: {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}",
                                  path=directory)
        return cls([found["image"][1][s] for s in stems], masks=[found["mask"][1][s] for s in stems],
                   mask_fill=mask_fill)

    def labels(self) -> np.ndarray:
        return self._labels

    def native_table(self) -> NativeTable:
        """Every sample for the native engine: its whole file (the listed size, else -1: to its end) and label.
        `NotNative` for a list with masks (the table holds one file per sample)."""
        if self._masks is not None:
            raise NotNative("its masks are files of their own; the engine's tables hold one file per sample")
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


def _walk_images(directory: str, exts: tuple[str, ...], *, recursive: bool = True) -> list[tuple[str, int]]:
    """(path, size) of the image files below ``directory`` (in it alone unless ``recursive``), depth first in
    name order."""
    found: list[tuple[str, int]] = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                if recursive:
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
