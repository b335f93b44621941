"""ingest.decode._nvjpeg: which nvJPEG nvImageCodec gets (no GPU needed; the GPU side is in test_decode_gpu.py)."""

from __future__ import annotations

import ctypes
import sys

from ingest.decode import _nvjpeg

MAPS = """\
7f2a1f000000-7f2a1f200000 r-xp 00000000 08:01 1 /venv/torchvision.libs/libnvjpeg.36e11081.so.13
7f2a1f200000-7f2a1f300000 r--p 00200000 08:01 1 /venv/torchvision.libs/libnvjpeg.36e11081.so.13
7f2a20000000-7f2a20100000 r-xp 00000000 08:01 2 /site/nvidia/cu13/lib/libnvjpeg.so.13
7f2a21000000-7f2a21100000 r-xp 00000000 08:01 3 /site/nvidia/nvjpeg2k/lib/libnvjpeg2k.so.0
7f2a22000000-7f2a22100000 r-xp 00000000 08:01 4 /site/nvidia/nvimgcodec/extensions/libnvjpeg_ext.so.0.9.0
7f2a23000000-7f2a23100000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00100000 rw-p 00000000 00:00 0 [stack]
"""


def test_loaded_lists_each_nvjpeg_once_and_nothing_else():
    assert _nvjpeg.loaded(MAPS) == ["/site/nvidia/cu13/lib/libnvjpeg.so.13",
                                    "/venv/torchvision.libs/libnvjpeg.36e11081.so.13"]
    assert _nvjpeg.loaded("") == []


def _fake_wheels(root, with_nvjpeg: bool):
    (root / "nvidia" / "nvimgcodec").mkdir(parents=True)
    (root / "nvidia" / "__init__.py").write_text("")   # (the nvImageCodec wheel ships one: a regular package)
    (root / "nvidia" / "nvimgcodec" / "__init__.py").write_text("")
    lib = root / "nvidia" / "cu13" / "lib" / _nvjpeg.SONAME
    if with_nvjpeg:
        lib.parent.mkdir(parents=True)
        lib.write_bytes(b"not a library")
    return lib


def _first_on_path(monkeypatch, root) -> None:
    """``root``'s wheels found first, also where real ones are installed and imported (their modules set aside)."""
    monkeypatch.syspath_prepend(str(root))
    for name in [n for n in sys.modules if n == "nvidia" or n.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, name)


def test_the_wheel_copy_is_the_one_beside_nvimgcodec(tmp_path, monkeypatch):
    lib = _fake_wheels(tmp_path, with_nvjpeg=True)
    _first_on_path(monkeypatch, tmp_path)
    assert _nvjpeg.wheel_copy() == lib


def test_no_wheel_copy_without_the_nvjpeg_wheel(tmp_path, monkeypatch):
    _fake_wheels(tmp_path, with_nvjpeg=False)
    _first_on_path(monkeypatch, tmp_path)
    assert _nvjpeg.wheel_copy() is None


def test_preload_loads_the_wheel_copy_only_while_no_nvjpeg_is_loaded(tmp_path, monkeypatch):
    opened = []
    monkeypatch.setattr(ctypes, "CDLL", lambda path: opened.append(path))
    monkeypatch.setattr(_nvjpeg, "wheel_copy", lambda: tmp_path / _nvjpeg.SONAME)
    monkeypatch.setattr(_nvjpeg, "loaded", lambda maps=None: ["/venv/torchvision.libs/libnvjpeg.36e11081.so.13"])
    assert _nvjpeg.preload() is None and opened == []   # too late: the loader would answer with that one
    monkeypatch.setattr(_nvjpeg, "loaded", lambda maps=None: [])
    assert _nvjpeg.preload() == tmp_path / _nvjpeg.SONAME
    assert opened == [str(tmp_path / _nvjpeg.SONAME)]


def test_preload_never_raises(tmp_path, monkeypatch):
    bad = tmp_path / _nvjpeg.SONAME
    bad.write_bytes(b"not a library")
    monkeypatch.setattr(_nvjpeg, "loaded", lambda maps=None: [])
    monkeypatch.setattr(_nvjpeg, "wheel_copy", lambda: bad)
    assert _nvjpeg.preload() is None
    monkeypatch.setattr(_nvjpeg, "wheel_copy", lambda: None)
    assert _nvjpeg.preload() is None


def test_describe_names_the_copies_for_a_message(monkeypatch):
    monkeypatch.setattr(_nvjpeg, "loaded", lambda maps=None: ["/a/libnvjpeg.so.13", "/b/libnvjpeg.36e11081.so.13"])
    assert _nvjpeg.describe() == "/a/libnvjpeg.so.13, /b/libnvjpeg.36e11081.so.13"
    monkeypatch.setattr(_nvjpeg, "loaded", lambda maps=None: [])
    assert _nvjpeg.describe() == "none found"


def test_children_started_inside_in_children_get_the_wheel_copy_in_ld_preload(tmp_path, monkeypatch):
    """Spawned workers import the user's script (torchvision first, maybe) before any ingest code: the wheel's
    nvJPEG goes first through LD_PRELOAD while they start, and the parent's environment is left as it was."""
    import os
    import subprocess
    import sys
    lib = _fake_wheels(tmp_path, with_nvjpeg=True)
    _first_on_path(monkeypatch, tmp_path)
    read = [sys.executable, "-c", "import os; print(os.environ.get('LD_PRELOAD', '-'))"]
    for before in (None, "/opt/other.so"):
        if before is None:
            monkeypatch.delenv("LD_PRELOAD", raising=False)
        else:
            monkeypatch.setenv("LD_PRELOAD", before)
        with _nvjpeg.in_children():
            # the fake library is not loadable: ld.so says so on stderr and goes on, which is all this needs
            seen = subprocess.run(read, capture_output=True, text=True, check=True).stdout.strip()
            with _nvjpeg.in_children():   # nested: named once
                assert os.environ["LD_PRELOAD"].split(":").count(str(lib)) == 1
        assert seen == (f"{lib}:{before}" if before else str(lib))
        assert os.environ.get("LD_PRELOAD") == before
    _fake_wheels(tmp_path / "none", with_nvjpeg=False)
    _first_on_path(monkeypatch, tmp_path / "none")   # found first: no nvJPEG wheel beside it
    with _nvjpeg.in_children():
        assert os.environ.get("LD_PRELOAD") == "/opt/other.so"
