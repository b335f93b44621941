"""The ctypes binding to nvImageCodec's C API (ingest.decode._nvimgcodec), without a GPU.

- Struct layouts and enum values are compared with the C header, compiled by gcc (skipped without gcc or
  the header). A wrong offset would be read by the library as garbage, so every field of every mirrored struct
  is checked.
- With the library present, batches are decoded by nvImageCodec's CPU backend into host memory and compared
  with Pillow (both run libjpeg-turbo: a mean difference under 1 level), which exercises the same calls the
  GPU path makes (code streams, region views, images over caller memory, one decode per batch, statuses).
- The fallbacks: a missing library or an unsupported version raises Unavailable, and GpuDecoder then takes
  the Python binding with a warning (or raises ImportError naming the extra when that is missing too).

The library and header come from the installed ``nvidia-nvimgcodec-cu13`` wheel, or from the unpacked wheel
folder ``nvidia/nvimgcodec`` named by INGEST_TEST_NVIMGCODEC_DIR.
"""

from __future__ import annotations

import ctypes
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ingest.decode import _nvimgcodec as native
from ingest.decode import gpu as decode_gpu
from conftest import encode, textured


def _package_dir() -> Path | None:
    folder = os.environ.get("INGEST_TEST_NVIMGCODEC_DIR")
    if folder:
        return Path(folder)
    try:
        spec = importlib.util.find_spec("nvidia.nvimgcodec")
    except ImportError:
        return None
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


PACKAGE = _package_dir()
LIBRARY = PACKAGE / native.SONAME if PACKAGE else None
HEADER = PACKAGE / "include" / "nvimgcodec.h" if PACKAGE else None
needs_library = pytest.mark.skipif(not (LIBRARY and LIBRARY.exists()), reason="nvImageCodec's library not found")

#: Python constant -> the header's name for it.
CONSTANTS = {
    **{f"ST_{name}": f"NVIMGCODEC_STRUCTURE_TYPE_{name}" for name in (
        "PROPERTIES", "INSTANCE_CREATE_INFO", "DECODE_PARAMS", "ORIENTATION", "REGION", "CODE_STREAM_VIEW",
        "CODE_STREAM_INFO", "IMAGE_INFO", "IMAGE_PLANE_INFO", "BACKEND", "BACKEND_PARAMS", "EXECUTION_PARAMS")},
    "SAMPLE_UINT8": "NVIMGCODEC_SAMPLE_DATA_TYPE_UINT8", "SAMPLING_NONE": "NVIMGCODEC_SAMPLING_NONE",
    "SAMPLEFORMAT_I_RGB": "NVIMGCODEC_SAMPLEFORMAT_I_RGB", "COLORSPEC_SRGB": "NVIMGCODEC_COLORSPEC_SRGB",
    "BUFFER_STRIDED_DEVICE": "NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_DEVICE",
    "BUFFER_STRIDED_HOST": "NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_HOST",
    "DEVICE_CPU_ONLY": "NVIMGCODEC_DEVICE_CPU_ONLY", "LOAD_HINT_FIXED": "NVIMGCODEC_LOAD_HINT_POLICY_FIXED",
    "PROCESSING_SUCCESS": "NVIMGCODEC_PROCESSING_STATUS_SUCCESS", "MAX_NUM_DIM": "NVIMGCODEC_MAX_NUM_DIM",
    "MAX_ROI_FILL_CHANNELS": "NVIMGCODEC_MAX_ROI_FILL_CHANNELS", "MAX_NUM_PLANES": "NVIMGCODEC_MAX_NUM_PLANES",
    "MAX_CODEC_NAME_SIZE": "NVIMGCODEC_MAX_CODEC_NAME_SIZE",
}


def _expected_values() -> dict[str, int]:
    """Every (C name -> value) this module relies on."""
    values = {c: getattr(native, py) for py, c in CONSTANTS.items()}
    values.update({f"NVIMGCODEC_BACKEND_KIND_{k}": v for k, v in native.BACKEND_KINDS.items()})
    values.update({f"NVIMGCODEC_STATUS_{v}": k for k, v in native.CALL_STATUS.items()})
    values.update({f"NVIMGCODEC_PROCESSING_STATUS_{v}": k for k, v in native.STATUS_NAMES.items()})
    return values


def _expected_layout() -> dict[str, int]:
    """sizeof, and offset and size of every field, of every mirrored struct as ctypes lays them out."""
    layout = {}
    for cname, (struct, _) in native.STRUCTS.items():
        layout[f"sizeof({cname})"] = ctypes.sizeof(struct)
        for field, ftype in struct._fields_:
            layout[f"offsetof({cname}, {field})"] = getattr(struct, field).offset
            layout[f"sizeof((({cname}*)0)->{field})"] = ctypes.sizeof(ftype)
    return layout


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.skipif(not (HEADER and HEADER.exists()), reason="nvImageCodec's header not found")
def test_structs_and_constants_match_the_header(tmp_path):
    (tmp_path / "cuda_runtime_api.h").write_text("typedef struct CUstream_st* cudaStream_t;\n")  # all it needs
    exprs = {**_expected_layout(), **{name: None for name in _expected_values()}}
    lines = "\n".join(f'    printf("%s %lld\\n", "{e}", (long long)({e}));' for e in exprs)
    source = tmp_path / "layout.c"
    source.write_text(textwrap.dedent("""\
        #include <stddef.h>
        #include <stdio.h>
        #include "nvimgcodec.h"
        int main(void) {
            printf("NVIMGCODEC_VER %lld\\n", (long long)NVIMGCODEC_VER);
        """) + lines + "\n    return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run(["gcc", "-std=c11", f"-I{tmp_path}", f"-I{HEADER.parent}", str(source), "-o", str(exe)],
                   check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    got = dict(line.rsplit(" ", 1) for line in out.splitlines())
    assert int(got.pop("NVIMGCODEC_VER")) in native.SUPPORTED, "the header's version is one the structs mirror"
    want = {**_expected_layout(), **_expected_values()}
    assert {k: int(v) for k, v in got.items()} == want


def test_missing_library_is_unavailable():
    with pytest.raises(native.Unavailable, match="cannot load nvImageCodec's C library /nonexistent"):
        native.Library("/nonexistent/libnvimgcodec.so.0")


@needs_library
def test_unsupported_version_is_refused(monkeypatch):
    monkeypatch.setattr(native, "SUPPORTED", range(100, 200))
    with pytest.raises(native.Unavailable, match=r"nvImageCodec 0\.9\.\d+ .* is not supported .* 0\.1\.0"):
        native.Library(str(LIBRARY))


# -- the engine choice in GpuDecoder -----------------------------------------------------------------------------


def _no_native(path=None):
    raise native.Unavailable("nvImageCodec 0.99.0 is not supported")


def test_engine_falls_back_to_the_python_binding_with_a_warning(monkeypatch):
    monkeypatch.setattr(native, "load", _no_native)
    monkeypatch.setattr(decode_gpu, "_nvimgcodec", lambda: object())
    with pytest.warns(RuntimeWarning, match="native decoder is unavailable .*0.99.0.*Python binding"):
        assert decode_gpu._pick_engine("auto") == ("python", None)
    with pytest.raises(native.Unavailable, match="0.99.0"):
        decode_gpu._pick_engine("native")


def test_without_either_engine_the_error_names_the_extra(monkeypatch):
    monkeypatch.setattr(native, "load", _no_native)

    def missing():
        raise ImportError("GPU decoding needs NVIDIA nvImageCodec: pip install ingest[gpu]")
    monkeypatch.setattr(decode_gpu, "_nvimgcodec", missing)
    with pytest.raises(ImportError, match=r"pip install ingest\[gpu\]"):
        decode_gpu._pick_engine("auto")


def test_unknown_engine_is_rejected():
    from ingest.errors import ConfigError
    from ingest.decode.cpu import CpuDecoder
    with pytest.raises(ConfigError, match="Unknown engine 'fast'. Available: auto, native, python"):
        decode_gpu.GpuDecoder("cuda", CpuDecoder(threads=1), engine="fast")


# -- decoding with the CPU backend -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def module_decoder():
    lib = native.load(str(LIBRARY))
    decoder = native.BatchDecoder(lib, native.DEVICE_CPU_ONLY, backends=["CPU_ONLY"])
    yield decoder
    decoder.close()


@pytest.fixture(params=["compiled", "ctypes"])
def host_decoder(request, module_decoder, monkeypatch):
    """The module's decoder, driven by the compiled loop and by the ctypes one (its fallback)."""
    if request.param == "compiled" and native.LOOP is None:
        pytest.skip("ingest.decode._nvloop is not built here")
    if request.param == "ctypes":
        monkeypatch.setattr(native, "LOOP", None)
    return module_decoder


def _decode(decoder, datas, shapes, regions=None):
    outs = [np.zeros((h, w, 3), np.uint8) for h, w in shapes]
    addresses = np.array([o.ctypes.data for o in outs], np.uint64)
    boxes = np.array([r or (0, 0, 0, 0) for r in regions or [None] * len(datas)], np.int32).reshape(-1, 4)
    heights, widths = np.array(shapes, np.int64).reshape(-1, 2).T
    reasons = decoder.submit(datas, boxes, heights, widths, addresses, 0).wait()
    return outs, reasons


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: the compiled loop is optional")
def test_the_compiled_loop_is_built_where_a_compiler_is():
    assert native.LOOP is not None, "setup.py should have built ingest.decode._nvloop"
    assert (native.LOOP.OUT_PARSE, native.LOOP.OUT_NOT_JPEG, native.LOOP.OUT_DECODE) == \
        (native.OUT_PARSE, native.OUT_NOT_JPEG, native.OUT_DECODE)


@pytest.mark.skipif(native.LOOP is None, reason="ingest.decode._nvloop is not built here")
def test_the_compiled_loop_checks_its_arguments():
    fns = (1,) * 8
    slots, infos, views, probe = (1, 1, 1), (1, 0), (1, 0, 0, 0), (1, 0)
    with pytest.raises(ValueError, match="regions holds 16 bytes, expected 32"):
        native.LOOP.decode(fns, 1, 1, 1, [b"a", b"b"], np.zeros(4, np.int32), slots, infos, views, probe,
                           np.zeros(2, np.uint32))
    with pytest.raises(TypeError, match="tuple of 8 function addresses"):
        native.LOOP.decode((1,) * 3, 1, 1, 1, [], np.zeros(0, np.int32), slots, infos, views, probe,
                           np.zeros(0, np.uint32))
    with pytest.raises(TypeError):  # not a buffer: refused before any native call
        native.LOOP.decode(fns, 1, 1, 1, [object()], np.zeros(4, np.int32), slots, infos, views, probe,
                           np.zeros(1, np.uint32))


def _pillow(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _jpegs() -> dict[str, bytes]:
    rgb = Image.fromarray(textured(57, 83))
    return {"444": encode(rgb, "JPEG", quality=92, subsampling=0),
            "422": encode(rgb, "JPEG", quality=92, subsampling=1),
            "420": encode(rgb, "JPEG", quality=92, subsampling=2),
            "gray": encode(rgb.convert("L"), "JPEG", quality=92),
            "restarts": encode(rgb, "JPEG", quality=92, restart_marker_blocks=3)}


@needs_library
def test_batch_decode_matches_pillow(host_decoder):
    jpegs = _jpegs()
    outs, reasons = _decode(host_decoder, list(jpegs.values()), [(57, 83)] * len(jpegs))
    assert reasons == [None] * len(jpegs)
    for name, out in zip(jpegs, outs):
        assert np.abs(out.astype(int) - _pillow(jpegs[name])).mean() < 1.0, name


@needs_library
def test_region_decode_matches_the_crop(host_decoder):
    data = _jpegs()["420"]
    regions = [(5, 7, 40, 30), (0, 0, 83, 16), (64, 41, 83, 57)]
    shapes = [(y1 - y0, x1 - x0) for x0, y0, x1, y1 in regions]
    outs, reasons = _decode(host_decoder, [data] * 3, shapes, regions)
    assert reasons == [None] * 3
    full = _pillow(data)
    for (x0, y0, x1, y1), out in zip(regions, outs):
        assert np.abs(out.astype(int) - full[y0:y1, x0:x1]).mean() < 1.0


@needs_library
def test_bad_streams_fail_alone_and_handles_are_reused(host_decoder):
    good = _jpegs()["420"]
    datas = [good, b"not an image at all", good[:400] + b"\xff\xd9", encode(Image.new("RGB", (8, 8)), "PNG"),
             memoryview(good), np.frombuffer(good, np.uint8)]
    for _ in range(2):  # the second batch reuses the first one's handles
        outs, reasons = _decode(host_decoder, datas, [(57, 83)] * len(datas))
        assert reasons[0] is None and reasons[4] is None and reasons[5] is None
        assert reasons[1].startswith("PARSE_") and reasons[3] == "NOT_JPEG"
        assert reasons[2] in native.STATUS_NAMES.values(), reasons[2]
        assert np.abs(outs[0].astype(int) - _pillow(good)).mean() < 1.0
    many = [good] * 150  # beyond the initial capacity
    outs, reasons = _decode(host_decoder, many, [(57, 83)] * len(many))
    assert reasons == [None] * len(many) and np.array_equal(outs[0], outs[-1])


@needs_library
def test_nothing_reaches_the_console(tmp_path):
    """nvImageCodec prints missing optional libraries and decode errors: none of it may reach stderr/stdout."""
    script = tmp_path / "quiet.py"
    script.write_text(textwrap.dedent(f"""\
        import numpy as np
        from ingest.decode import _nvimgcodec as native
        lib = native.load({str(LIBRARY)!r})
        dec = native.BatchDecoder(lib, native.DEVICE_CPU_ONLY, backends=["CPU_ONLY"])
        good = open({str(tmp_path / 'a.jpg')!r}, "rb").read()
        out = np.zeros((4, 57, 83, 3), np.uint8)
        addresses = out.ctypes.data + np.arange(4, dtype=np.uint64) * out[0].nbytes
        reasons = dec.submit([good, good[:300] + b"\\xff\\xd9", b"junk", good], np.zeros((4, 4), np.int32),
                             np.full(4, 57), np.full(4, 83), addresses, 0).wait()
        dec.close()
        print("RESULT", reasons, len(lib.messages))
        """))
    (tmp_path / "a.jpg").write_bytes(_jpegs()["420"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), *sys.path])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith("RESULT [None, ") and done.stdout.count("\n") == 1, done.stdout
