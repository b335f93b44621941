import os

import numpy as np
import pytest

from ingest.errors import SourceError
from ingest.formats import FileList, FileTree, MemorySource, check_format
from conftest import jpeg_bytes


def test_filetree_layout(image_folder):
    (image_folder / "dog" / "notes.txt").write_text("not an image")
    (image_folder / "dog" / ".hidden.jpg").write_bytes(b"x")
    nested = image_folder / "emu" / "more"
    nested.mkdir()
    (nested / "x.JPEG").write_bytes(jpeg_bytes(20, 30))
    src = FileTree(image_folder)
    check_format(src)
    assert src.classes == ["cat", "dog", "emu"]
    assert len(src) == 7 + 5 + 10
    labels = src.labels()
    assert labels.tolist() == [0] * 7 + [1] * 5 + [2] * 10
    assert all(not src.name(i).endswith((".txt", ".hidden.jpg")) for i in range(len(src)))
    assert src.name(len(src) - 1).endswith(os.path.join("more", "x.JPEG"))


def test_filetree_extension_filter(image_folder):
    with pytest.raises(SourceError, match="no files with extensions .png"):
        FileTree(image_folder, extensions=["png"])


def test_filetree_empty_class_reported(image_folder):
    (image_folder / "zebra").mkdir()
    with pytest.raises(SourceError) as e:
        FileTree(image_folder)
    assert "zebra" in str(e.value) and "allow_empty=True" in str(e.value)
    src = FileTree(image_folder, allow_empty=True)
    assert src.classes[-1] == "zebra" and 3 not in src.labels()


def test_filetree_missing_root(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        FileTree(tmp_path / "nope")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(b"")
    with pytest.raises(SourceError, match="no class directories"):
        FileTree(tmp_path / "flat")


def test_filelist_and_memory(tmp_path):
    p = tmp_path / "a.jpg"
    p.write_bytes(jpeg_bytes(10, 10))
    src = FileList([p, p], labels=[1, 0], classes=["x", "y"])
    check_format(src)
    with pytest.raises(SourceError, match="2 paths but 1 labels"):
        FileList([p, p], labels=[1])
    mem = MemorySource([jpeg_bytes(8, 8), np.frombuffer(jpeg_bytes(9, 9), np.uint8)], labels=[3, 4])
    check_format(mem)
    assert mem.locate(1).data is not None and mem.name(0) == "<memory item 0>"
    with pytest.raises(SourceError, match="item 0 is a str"):
        MemorySource(["not bytes"])
    with pytest.raises(IndexError):
        mem.locate(2)


def test_filelist_locates_and_parses_a_batch_in_one_call(tmp_path):
    """`locate_batch` / `parse_batch` (the read stage's path) give what `locate` / `parse` give, negative
    indices included; an index out of range raises IndexError as `locate` does."""
    paths = []
    for k in range(3):
        paths.append(tmp_path / f"{k}.jpg")
        paths[-1].write_bytes(jpeg_bytes(8 + k, 8))
    for sizes in (None, [os.path.getsize(p) for p in paths]):
        src = FileList(paths, labels=[5, 6, 7], sizes=sizes)
        picks = [2, 0, -1, 1, 2]
        assert src.locate_batch(picks) == [src.locate(i) for i in picks]
        assert src.locate_batch(np.array(picks)) == [src.locate(i) for i in picks]
        assert src.locate_batch([]) == []
        for bad in ([0, 3], [-4]):
            with pytest.raises(IndexError, match=f"sample index {bad[-1]} out of range"):
                src.locate_batch(bad)
        with pytest.raises(TypeError):
            src.locate_batch([0.5])
        raws = [b"a", b"b", b"c"]
        assert [(r.image, r.label) for r in src.parse_batch([2, 0, 1], raws)] == [(b"a", 7), (b"b", 5), (b"c", 6)]


def test_check_format_catches_a_broken_source(image_folder):
    class Broken(FileTree):
        def labels(self):
            return super().labels()[:-1]
    with pytest.raises(AssertionError, match="labels\\(\\) must have shape"):
        check_format(Broken(image_folder))
