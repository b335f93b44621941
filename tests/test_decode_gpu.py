"""GpuDecoder against CpuDecoder on the same bytes.

The helpers that need no GPU (region clipping, orientation in torch, which JPEGs go to the GPU, option
checks) run everywhere. The rest is marked ``gpu`` and skipped without CUDA and nvImageCodec.

Tolerance: nvJPEG's IDCT and chroma upsampling are not libjpeg's; a decoded image must be within a mean
absolute difference of 2 levels of the CPU decode. A region must match the same region of the full GPU
decode within a mean of 1 level (the decoder may use neighbouring blocks for upsampling at the edges).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ingest.errors import ConfigError, DecodeError
from ingest.decode import _nvimgcodec as native
from ingest.decode import gpu as decode_gpu
from ingest.decode.cpu import CpuDecoder, jpeg_headers
from ingest.decode.gpu import Arenas, GpuDecoder, clip_regions, clip_roi, gpu_decodable, orient
from conftest import REALWORLD, encode, jpeg_bytes, textured

GPU_MEAN_DIFF = 2.0
ROI_MEAN_DIFF = 1.0
#: Damaged inside the entropy data with the file's end intact: libjpeg warns (the CPU decoder refuses it),
#: nvJPEG may not notice. Either outcome is accepted on the GPU path, see ingest.decode.gpu.
GPU_MAY_DECODE = {"jpeg/jpeg-decoder/40bb78b1ac031125a6d8466b374962a8.jpg"}

requires_gpu = pytest.mark.skipif(not decode_gpu.available(),
                                  reason="needs CUDA and nvImageCodec (pip install ingest[gpu])")




def samples() -> dict[str, bytes]:
    """Generated images, named by what they exercise."""
    rgb = Image.fromarray(textured(120, 176))
    exif = Image.Exif()
    exif[0x0112] = 6
    return {
        "baseline420.jpg": encode(rgb, "JPEG", quality=90),
        "baseline444.jpg": encode(rgb, "JPEG", quality=90, subsampling=0),
        "baseline422.jpg": encode(rgb, "JPEG", quality=90, subsampling=1),
        "gray.jpg": encode(rgb.convert("L"), "JPEG", quality=90),
        "restarts.jpg": encode(rgb, "JPEG", quality=90, restart_marker_blocks=2),
        "progressive.jpg": encode(rgb, "JPEG", quality=90, progressive=True),
        "orientation6.jpg": encode(rgb, "JPEG", quality=90, exif=exif),
        "cmyk.jpg": encode(rgb.convert("CMYK"), "JPEG", quality=90),
        "rgba.png": encode(rgb.convert("RGBA"), "PNG"),
    }


def mean_diff(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    a = a.cpu().numpy() if isinstance(a, torch.Tensor) else a
    b = b.cpu().numpy() if isinstance(b, torch.Tensor) else b
    assert a.shape == b.shape
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


# -- no GPU needed -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("roi, expected", [
    (None, None),
    ((10, 20, 50, 60), (10, 20, 50, 60)),
    ((-5, -5, 50, 60), (0, 0, 50, 60)),
    ((10, 20, 500, 600), (10, 20, 100, 80)),
    ((0, 0, 100, 80), None),        # the whole image
    ((0, 0, 1000, 1000), None),     # covers it
    ((50, 20, 50, 60), None),       # empty
    ((120, 20, 130, 60), None),     # outside
])
def test_clip_roi(roi, expected):
    assert clip_roi(roi, 80, 100) == expected
    row = np.array([[1, 80, 100, 3, 8, 0xC0, 1, 0, 1]])       # a header row: 100x80, orientation 1
    got = clip_regions(np.array([roi or (0, 0, 0, 0)]), row)[0]
    assert (tuple(got.tolist()) if got[2] > got[0] else None) == expected, "batched form agrees"
    turned = row.copy()
    turned[0, 6] = 6
    assert not clip_regions(np.array([roi or (0, 0, 0, 0)]), turned).any(), "turned images decode whole"


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_matches_pillow(orientation):
    pixels = textured(5, 7)
    methods = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
               4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270,
               7: Image.Transpose.TRANSVERSE, 8: Image.Transpose.ROTATE_90}
    want = pixels if orientation == 1 else np.asarray(Image.fromarray(pixels).transpose(methods[orientation]))
    source = torch.from_numpy(pixels)
    out = orient(source, orientation)
    assert torch.equal(out, torch.from_numpy(np.array(want)))
    assert out.is_contiguous() and out.data_ptr() != source.data_ptr(), "always new memory"


@pytest.mark.parametrize("name, eligible", [
    ("baseline420.jpg", True), ("baseline444.jpg", True), ("baseline422.jpg", True), ("gray.jpg", True),
    ("restarts.jpg", True),
    ("progressive.jpg", False), ("orientation6.jpg", True), ("cmyk.jpg", False), ("rgba.png", False),
])
def test_which_images_go_to_the_gpu(name, eligible):
    data = samples()[name]
    assert (bool(gpu_decodable(jpeg_headers([data]), 2**28)[0])) == eligible


def test_truncated_and_oversized_jpegs_stay_on_the_cpu():
    data = samples()["baseline420.jpg"]
    assert not gpu_decodable(jpeg_headers([data[:-100]]), 2**28)[0], "no EOI: truncated"
    assert not gpu_decodable(jpeg_headers([data]), 120 * 176 - 1)[0], "over max_pixels"


def test_rgb_coded_jpegs_stay_on_the_cpu():
    # Pillow writes RGB-coded JPEGs (no YCbCr transform: Adobe APP14 transform 0) when asked to keep RGB.
    rgb = encode(Image.fromarray(textured(40, 60)), "JPEG", keep_rgb=True)
    ycc = encode(Image.fromarray(textured(40, 60)), "JPEG")
    assert not gpu_decodable(jpeg_headers([rgb]), 2**28)[0]
    assert gpu_decodable(jpeg_headers([ycc]), 2**28)[0]


def test_image_arena_is_a_sequence_of_views_and_the_warp_reads_it_in_place():
    """The native engine's batch: each image contiguous at its own offset of one buffer; the warp's kernel
    arguments (pointers, sizes, strides) come from the arrays and equal those of the per-image views."""
    from ingest.ops import _warp_kernel, resample
    from ingest.ops.base import ImageArena, as_list, size_array_of, sizes_of
    from ingest.ops.geometry import Resize
    from ingest.ops.planner import plan
    hw = np.array([(5, 7), (3, 2), (4, 9), (1, 1)])
    offsets = np.array([0, 768, 1536, 2304])  # `_ALIGN` apart, as the engine places them
    storage = (torch.arange(3072) % 251).to(torch.uint8)
    arena = ImageArena(storage, offsets, hw)
    assert len(arena) == 4 and sizes_of(arena) == [tuple(x) for x in hw.tolist()]
    for images in (arena, as_list(arena)):   # the array form: the arena's own, or made from the views
        assert size_array_of(images).dtype == np.int64 and size_array_of(images).tolist() == hw.tolist()
    assert size_array_of(torch.zeros(3, 4, 5, 3, dtype=torch.uint8)).tolist() == [[4, 5]] * 3
    for image, (h, w), start in zip(arena, hw.tolist(), offsets.tolist()):
        assert image.shape == (h, w, 3) and image.is_contiguous()
        assert image.data_ptr() == storage.data_ptr() + start
        assert torch.equal(image.reshape(-1), storage[start:start + h * w * 3])
    assert [im.shape for im in arena[1:3]] == [im.shape for im in as_list(arena)[1:3]]
    warp = plan([Resize((2, 3))], sizes_of(arena), 0).warp
    setup = resample._setup(warp, sizes_of(arena))
    packed, by_views = (_warp_kernel.pack(x, warp.out_sizes, setup, (0, 0, 0), None) for x in (arena, as_list(arena)))
    assert np.array_equal(packed.buf, by_views.buf)
    assert torch.equal(resample.warp(arena, warp), resample.warp(as_list(arena), warp))


def test_arena_size_stays_put_until_a_batch_outgrows_it():
    mb = 1 << 20
    arenas = Arenas()
    sizes = [arenas.size_for(need) for need in
             (70 * mb, 80 * mb, 60 * mb, 87 * mb, 88 * mb + 1, 60 * mb, 10 * mb, 1000, 112 * mb)]
    assert sizes[0] == 88 * mb and sizes[0] % (2 * mb) == 0   # 70 MB and a quarter, in 2 MiB steps
    assert sizes[:4] == [88 * mb] * 4                         # the same block for every batch that fits
    assert sizes[4] == 112 * mb                               # outgrown: a quarter above the new need
    assert sizes[5:] == [112 * mb] * 4                        # smaller batches (an epoch's last) fit in it


def test_arenas_handed_back_go_to_the_next_taker_and_a_new_size_drops_them():
    """`Arenas` (CPU tensors stand in; no stream): the arenas handed back are taken oldest first, by any decoder
    sharing them; one of another size is refused, at most ``keep`` wait, and a new size drops the spares."""
    arenas, cpu, mb = Arenas(keep=2), torch.device("cpu"), 1 << 20
    size = arenas.size_for(3 * mb)
    a, b, c = (arenas.take(size, None, cpu) for _ in range(3))
    assert size == 4 * mb and len({t.data_ptr() for t in (a, b, c)}) == 3
    for t in (a, b, c, torch.empty(2 * mb, dtype=torch.uint8)):
        arenas.give(t)
    assert [e[0] for e in arenas._spare] == [a, b]   # two kept; the third and the odd size dropped
    assert arenas.size_for(3 * mb + 5) == size and arenas.take(size, None, cpu) is a
    assert arenas.size_for(9 * mb) == 12 * mb and not arenas._spare
    assert arenas.made == 3   # the spare taken was not allocated again


def test_decoders_share_this_process_share_of_the_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(32)), raising=False)
    monkeypatch.setattr("ingest.defaults.job_cpus", lambda: 32)   # not bound: the ranks share the job's CPUs
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert decode_gpu.cpu_threads_each(1) == 32 and decode_gpu.cpu_threads_each(2) == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")            # two torchrun ranks on this host
    assert decode_gpu.cpu_threads_each(2) == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert decode_gpu.cpu_threads_each(2) == 1             # never none
    monkeypatch.setenv("INGEST_GPU_DECODE_THREADS", "6")   # the gpu_decode_threads setting: per decoder
    assert decode_gpu.cpu_threads_each(2) == 6 and decode_gpu.cpu_threads_each(1) == 6
    monkeypatch.setenv("INGEST_GPU_DECODE_THREADS", "0")
    with pytest.raises(ConfigError, match="gpu_decode_threads"):
        decode_gpu.cpu_threads_each(2)


def test_huffman_threshold_setting_reaches_the_cuda_decoder():
    from ingest import defaults
    assert defaults.get("hybrid_huffman_threshold") == 1_000_000   # DALI's default
    assert decode_gpu.decoder_options().split()[:2] == [":fancy_upsampling=1",
                                                        "nvjpeg_cuda_decoder:hybrid_huffman_threshold=1000000"]
    with defaults.set(hybrid_huffman_threshold="0"):   # every CUDA-decoder image's Huffman stage on the GPU
        assert "nvjpeg_cuda_decoder:hybrid_huffman_threshold=0" in decode_gpu.decoder_options()
    with pytest.raises(ConfigError, match="`hybrid_huffman_threshold` must be an integer >= 0, got -1"):
        defaults.set(hybrid_huffman_threshold=-1)


def test_nvjpeg_paddings_reach_every_decoder_and_zero_leaves_them_out(monkeypatch):
    from ingest import defaults
    assert decode_gpu.decoder_options().split()[2:] == [":host_memory_padding=8388608"]   # DALI's; no device padding
    with defaults.set(nvjpeg_host_padding=0, nvjpeg_device_padding=16 << 20):   # DALI's device padding
        assert decode_gpu.decoder_options().split()[2:] == [":device_memory_padding=16777216"]
    monkeypatch.setenv("INGEST_NVJPEG_HOST_PADDING", "0")
    monkeypatch.setenv("INGEST_NVJPEG_DEVICE_PADDING", "0")
    assert decode_gpu.decoder_options().split() == [":fancy_upsampling=1",
                                                    "nvjpeg_cuda_decoder:hybrid_huffman_threshold=1000000"]
    with pytest.raises(ConfigError, match="`nvjpeg_device_padding` must be an integer >= 0, got -1"):
        defaults.set(nvjpeg_device_padding=-1)


def test_option_errors():
    with pytest.raises(ConfigError, match="Unknown backend 'nvjpeg'. Available: auto, hw, hybrid"):
        GpuDecoder("cuda", CpuDecoder(threads=1), backend="nvjpeg")
    with pytest.raises(ConfigError, match="`threads` must be >= 1"):
        GpuDecoder("cuda", CpuDecoder(threads=1), threads=0)


def test_missing_nvimgcodec_names_the_extra():
    try:
        native.load()
    except native.Unavailable:
        pass
    else:
        pytest.skip("nvImageCodec's C library loads")
    try:
        decode_gpu._nvimgcodec()
    except ImportError as err:
        assert "pip install ingest[gpu]" in str(err)
        with pytest.raises(ImportError, match=r"pip install ingest\[gpu\]"):
            GpuDecoder("cuda", CpuDecoder(threads=1))
    else:
        pytest.skip("nvImageCodec is installed")


# -- on the GPU --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu():
    with CpuDecoder(threads=4) as dec:
        yield dec


@pytest.fixture(scope="module", params=[("native", "auto", 1), ("native", "hw", 1), ("native", "hybrid", 1),
                                        ("native", "auto", 2), ("python", "auto", 1), ("python", "auto", 2)],
                ids=lambda p: f"{p[0]}-{p[1]}-threads{p[2]}")
def gpu(request, cpu):
    engine, backend, threads = request.param
    try:
        dec = GpuDecoder(torch.device("cuda"), cpu, backend=backend, threads=threads, engine=engine)
    except ConfigError as err:  # e.g. no hardware JPEG engine on this GPU
        pytest.skip(str(err))
    except ImportError as err:  # this engine cannot load here
        pytest.skip(str(err))
    with dec:
        yield dec


def decode(gpu: GpuDecoder, datas, names, rois=None):
    """decode_batch on a side stream, then wait for it: what a consumer of that stream would see."""
    stream = torch.cuda.Stream()
    out = gpu.decode_batch(datas, names, rois=rois, stream=stream)
    stream.synchronize()
    return out


@pytest.mark.gpu
@requires_gpu
def test_generated_images_match_the_cpu_decoder(gpu, cpu):
    named = samples()
    names = list(named)
    images, origins, paths = decode(gpu, list(named.values()), names)
    for name, image, origin, path in zip(names, images, origins, paths):
        want = cpu.decode(named[name], name)
        assert isinstance(image, torch.Tensor), f"{name}: {image}"
        assert image.device.type == "cuda" and image.dtype == torch.uint8 and image.is_contiguous()
        assert tuple(image.shape) == want.shape, name
        assert mean_diff(image, want) < GPU_MEAN_DIFF, name
        assert origin == (0, 0)
    by_name = dict(zip(names, paths))
    assert by_name["baseline420.jpg"] == by_name["gray.jpg"] == by_name["orientation6.jpg"] == "gpu"
    assert by_name["baseline444.jpg"] == by_name["baseline422.jpg"] == "gpu"
    assert by_name["cmyk.jpg"] == by_name["rgba.png"] == "cpu-fallback"
    assert by_name["progressive.jpg"] == "cpu-fallback"


@pytest.mark.gpu
@requires_gpu
def test_region_decode_equals_the_crop_of_the_full_decode(gpu):
    named = samples()
    names = list(named)
    datas = list(named.values())
    full, _, _ = decode(gpu, datas, names)
    rois = [(13, 21, 150, 97)] * len(datas)  # in displayed coordinates
    parts, origins, paths = decode(gpu, datas, names, rois)
    for name, whole, part, origin, path in zip(names, full, parts, origins, paths):
        if gpu.backend == "hw" and name.startswith("baseline"):
            assert path == "gpu-roi", name
        if name == "orientation6.jpg":
            assert (path, origin) == ("gpu", (0, 0)), "an oriented image is decoded whole"
        else:
            assert origin == (13, 21), f"{name} ({path}): only the region is decoded or uploaded"
        x0, y0 = origin
        h, w = part.shape[:2]
        assert mean_diff(part, whole[y0:y0 + h, x0:x0 + w]) < ROI_MEAN_DIFF, name


@pytest.mark.gpu
@requires_gpu
def test_regions_are_decoded_unless_the_check_at_creation_failed(gpu, cpu):
    """A decoder checks at creation that nvImageCodec decodes a region (`GpuDecoder.regions`). Where it does, a
    baseline JPEG's region comes back as the region ("gpu-roi"); a decoder that cannot (forced here) decodes the
    whole image on the GPU instead ("gpu", origin (0, 0)), which the ops then crop."""
    named = samples()
    data = named["baseline420.jpg"]
    assert gpu.regions and not gpu.fallbacks
    images, origins, paths = decode(gpu, [data] * 2, ["a.jpg", "b.jpg"], [(13, 21, 150, 97)] * 2)
    assert paths == ["gpu-roi"] * 2 and origins == [(13, 21)] * 2, gpu
    gpu.regions = False
    try:
        images, origins, paths = decode(gpu, [data] * 2, ["a.jpg", "b.jpg"], [(13, 21, 150, 97)] * 2)
    finally:
        gpu.regions = True
    want = cpu.decode(data, "a.jpg")
    assert paths == ["gpu"] * 2 and origins == [(0, 0)] * 2
    assert all(tuple(im.shape) == want.shape and mean_diff(im, want) < GPU_MEAN_DIFF for im in images)


def run_script(script: Path, arg: Path) -> subprocess.CompletedProcess:
    """``python script arg`` in a fresh process that imports this checkout's ingest; it must succeed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), *sys.path])}
    done = subprocess.run([sys.executable, str(script), str(arg)], capture_output=True, text=True, env=env,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("first", ["ingest", "torchvision"])
def test_regions_decode_whichever_of_ingest_and_torchvision_is_imported_first(first, tmp_path):
    """torchvision bundles an nvJPEG under nvJPEG's soname; imported first, nvImageCodec gets it and (0.9 on
    torchvision 0.26's 13.0.1) fails every region. `import ingest` loads the nvidia-nvjpeg wheel's copy first;
    after torchvision, the decoder's check finds regions failing, warns once and decodes whole images on the GPU:
    no image of a randomly cropped batch goes to the CPU decoder either way. torchvision's GPU decode works in both."""
    pytest.importorskip("torchvision")
    data = samples()["baseline420.jpg"]
    (tmp_path / "a.jpg").write_bytes(data)
    other = "ingest" if first == "torchvision" else "torchvision"
    script = tmp_path / "run.py"
    script.write_text(
        f"import sys, warnings\nwarnings.simplefilter('always')\nimport {first}\nimport {other}\n"
        "import torch\n"
        "from ingest.decode.cpu import CpuDecoder\n"
        "from ingest.decode.gpu import GpuDecoder\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "with CpuDecoder(threads=1) as cpu, GpuDecoder('cuda', cpu) as gpu:\n"
        "    _, origins, paths = gpu.decode_batch([data] * 4, ['a.jpg'] * 4, rois=[(13, 21, 150, 97)] * 4)\n"
        "    torch.cuda.synchronize()\n"
        "import torchvision.io as tio\n"   # torchvision's own GPU decode keeps working beside ingest's nvJPEG
        "assert tuple(tio.decode_jpeg(tio.read_file(sys.argv[1]), device='cuda').shape) == (3, 120, 176)\n"
        "print(gpu.regions, sorted(set(paths)), dict(gpu.fallbacks))\n")
    done = run_script(script, tmp_path / "a.jpg")
    regions, paths = done.stdout.split(" ", 1)
    if regions == "True":
        assert paths.strip() == "['gpu-roi'] {}" and "cannot decode JPEG regions" not in done.stderr, done
    else:
        assert first == "torchvision", "loaded first, the wheel's nvJPEG decodes regions"
        assert paths.strip() == "['gpu'] {}" and "import ingest before torchvision" in done.stderr, done


@pytest.mark.gpu
@requires_gpu
def test_worker_processes_decode_regions_when_the_script_imports_torchvision_first(tmp_path):
    """A spawned worker imports the user's script, torchvision first here, before any ingest code runs in it;
    it starts with the nvidia-nvjpeg wheel's copy preloaded (`ingest.decode._nvjpeg.in_children`), so its decoder
    decodes regions: every randomly cropped image is a GPU region decode, and no warning."""
    pytest.importorskip("torchvision")
    for k in range(8):
        (tmp_path / "data" / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / f"c{k % 2}" / f"{k}.jpg").write_bytes(jpeg_bytes(160 + 8 * k, 200, seed=k))
    script = tmp_path / "train.py"
    script.write_text(
        "import json, sys, warnings\nwarnings.simplefilter('always')\nimport torchvision\nimport ingest\n"
        "from ingest.ops import RandomResizedCrop\n"
        "if __name__ == '__main__':\n"
        "    loader = ingest.Loader(sys.argv[1], batch_size=4, device='cuda', decode='mixed',\n"
        "                           ops=[RandomResizedCrop(64)], num_workers=1, worker_stages='all')\n"
        "    for _ in range(2):\n"
        "        for x, y in loader:\n"
        "            assert x.is_cuda\n"
        "    stats = loader.stats()\n"
        "    loader.close()\n"
        "    print(json.dumps([stats['decode_paths'], stats['gpu_fallbacks']]))\n")
    done = run_script(script, tmp_path / "data")
    import json
    paths, fallbacks = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(paths) == {"gpu-roi"} and paths["gpu-roi"] >= 16 and fallbacks == {}, done.stdout
    assert "cannot decode JPEG regions" not in done.stderr, done.stderr


@pytest.mark.gpu
@requires_gpu
def test_held_results_survive_later_batches(gpu):
    """Results are zero-copy views of the decoder's output that keep it alive: while held, decoding more
    batches of the same size (which would reuse freed memory) leaves them unchanged."""
    import gc
    first, _, _ = decode(gpu, [encode(Image.fromarray(textured(120, 176, seed=1)), "JPEG", quality=90)] * 4,
                         ["a"] * 4)
    kept = [t.clone() for t in first]
    other = encode(Image.fromarray(textured(120, 176, seed=2)), "JPEG", quality=90)  # same size, other pixels
    for _ in range(3):
        gc.collect()
        later, _, _ = decode(gpu, [other] * 4, ["b"] * 4)
        assert not torch.equal(later[0], kept[0])
        del later
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(first, kept))


@pytest.mark.gpu
@requires_gpu
def test_a_recycled_arena_takes_the_next_batch_and_only_when_handed_back(gpu):
    """`recycle` hands an arena back (an `ImageArena` or a list of its views): the next batch of that size
    decodes into the same memory, with the pixels it would have had in new memory; an arena not handed back
    is never written again."""
    if gpu.engine != "native":
        pytest.skip("arenas are the native engine's")
    a = [encode(Image.fromarray(textured(96, 128, seed=s)), "JPEG", quality=90) for s in range(4)]
    b = [encode(Image.fromarray(textured(96, 128, seed=s)), "JPEG", quality=90) for s in range(4, 8)]
    first, _, _ = decode(gpu, a, ["a"] * 4)
    want_b = [t.clone() for t in decode(gpu, b, ["b"] * 4)[0]]
    held = first.storage.clone()
    second, _, _ = decode(gpu, b, ["b"] * 4)   # `first` not handed back: new memory
    assert second.storage.data_ptr() != first.storage.data_ptr()
    assert torch.equal(first.storage, held)
    gpu.recycle(first)
    third, _, _ = decode(gpu, b, ["b"] * 4)
    assert third.storage.data_ptr() == first.storage.data_ptr()   # decoded into the arena handed back
    assert all(torch.equal(x, y) for x, y in zip(third, want_b))
    gpu.recycle([t.clone() for t in third])   # copies: no arena under them, ignored
    assert not gpu.arenas._spare
    gpu.recycle([t for t in third])   # views of it (a batch with a turned image comes back so): handed back
    assert gpu.arenas._spare[-1][0] is third.storage


@pytest.mark.gpu
@requires_gpu
def test_decoders_sharing_arenas_write_one_only_after_the_event_of_its_last_read(cpu):
    """Two decoders on two streams share `Arenas` (a pipeline's decode lanes): an arena the first decoded into
    and handed back with the event after a slow read (queued behind a GPU sleep on a third stream) takes the
    second's next batch, and that batch's decode waits for the read: the read sees the first batch's pixels."""
    try:
        arenas = Arenas()
        lanes = [GpuDecoder(torch.device("cuda"), cpu, engine="native", arenas=arenas) for _ in range(2)]
    except (ConfigError, ImportError) as err:
        pytest.skip(str(err))
    a = [encode(Image.fromarray(textured(96, 128, seed=s)), "JPEG", quality=90) for s in range(4)]
    b = [encode(Image.fromarray(textured(96, 128, seed=s)), "JPEG", quality=90) for s in range(4, 8)]
    streams = [torch.cuda.Stream() for _ in lanes]
    with lanes[0], lanes[1]:
        want_b = [t.clone() for t in decode(lanes[1], b, ["b"] * 4)[0]]
        first, _, _ = decode(lanes[0], a, ["a"] * 4)
        want_a = first.storage.clone()
        reader = torch.cuda.Stream()
        with torch.cuda.stream(reader):
            torch.cuda._sleep(200_000_000)   # ~0.1-0.2 s of GPU time before the read
            seen = first.storage.clone()
            after = torch.cuda.Event()
            after.record(reader)
        lanes[0].recycle(first, after)
        second, _, _ = lanes[1].decode_batch(b, ["b"] * 4, stream=streams[1])
        assert second.storage.data_ptr() == first.storage.data_ptr()   # the other lane's arena
        torch.cuda.synchronize()
        assert torch.equal(seen, want_a)   # the decode into it waited for the read
        assert all(torch.equal(x, y) for x, y in zip(second, want_b))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_driver_events_order_streams_like_torch_events():
    """`ingest._driver.Event` (the GIL kept) orders a stream after another's work, as torch's event does."""
    from ingest._driver import Event, _driver, new_event
    assert _driver() is not None and isinstance(new_event(), Event)
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    out = torch.zeros(1 << 20, device="cuda")
    with torch.cuda.stream(first):
        torch.cuda._sleep(50_000_000)   # ~tens of ms of GPU time before the fill
        out.fill_(7)
        done = new_event()
        done.record(first)
    second.wait_event(done)            # torch's Stream.wait_event calls Event.wait
    with torch.cuda.stream(second):
        copy = out.clone()
    torch.cuda.synchronize()
    assert float(copy.min()) == 7.0


@pytest.mark.gpu
@requires_gpu
def test_corrupt_data_gives_decode_errors_in_the_batch(gpu):
    good = samples()["baseline420.jpg"]
    sos = good.index(b"\xff\xda")
    datas = [good, b"", good[:sos], good[: len(good) // 2], b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, good]
    names = [f"{i}.jpg" for i in range(len(datas))]
    images, _, paths = decode(gpu, datas, names)
    assert isinstance(images[0], torch.Tensor) and isinstance(images[-1], torch.Tensor)
    for i in range(1, len(datas) - 1):
        assert isinstance(images[i], DecodeError) and names[i] in str(images[i]), (i, images[i])
        assert paths[i] == "cpu-fallback"


def _real_files() -> list[Path]:
    return sorted(p for sub in ("jpeg", "png") for p in (REALWORLD / sub).rglob("*")
                  if p.suffix in (".jpg", ".png"))


@pytest.mark.gpu
@pytest.mark.realworld
@requires_gpu
def test_real_files_in_one_batch(gpu, cpu):
    files = _real_files()
    if not files:
        pytest.skip(f"real-world data not found at {REALWORLD}")
    names = [str(p.relative_to(REALWORLD)) for p in files]
    datas = [p.read_bytes() for p in files]
    images, _, paths = decode(gpu, datas, names)
    for name, data, image, path in zip(names, datas, images, paths):
        try:
            want = cpu.decode(data, name)
        except DecodeError:
            if name in GPU_MAY_DECODE and isinstance(image, torch.Tensor):
                continue
            assert isinstance(image, DecodeError) and name in str(image), f"{name}: {path}"
            continue
        assert isinstance(image, torch.Tensor), f"{name}: {image}"
        assert mean_diff(image, want) < GPU_MEAN_DIFF, f"{name} ({path})"


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("engine", ["native", "python"])
def test_huffman_on_the_gpu_or_the_cpu_gives_the_same_pixels(cpu, engine):
    """``hybrid_huffman_threshold`` moves the CUDA decoder's Huffman stage between the GPU and its CPU threads:
    the same images decode on the GPU either way, to the same pixels (sizes past the threshold and below it)."""
    from ingest import defaults
    named = {**samples(), "large.jpg": encode(Image.fromarray(textured(720, 1280)), "JPEG", quality=85)}
    names, datas = list(named), list(named.values())
    out = {}
    for threshold in (0, 500_000, 10**9):   # all on the GPU; the large one only; none
        with defaults.set(hybrid_huffman_threshold=threshold):
            try:
                dec = GpuDecoder("cuda", cpu, backend="hybrid", engine=engine)
            except ImportError as err:
                pytest.skip(str(err))
            with dec:
                images, _, paths = decode(dec, datas, names)
                out[threshold] = [im.cpu() if isinstance(im, torch.Tensor) else im for im in images], paths
    (base, base_paths) = out[10**9]
    assert base_paths.count("gpu") == 7 and base_paths[names.index("large.jpg")] == "gpu"
    for threshold in (0, 500_000):
        images, paths = out[threshold]
        assert paths == base_paths, threshold
        for name, a, b, path in zip(names, images, base, paths):
            if path == "gpu":
                assert torch.equal(a, b), (threshold, name)


@pytest.mark.gpu
@requires_gpu
def test_native_engine_is_the_default_and_agrees_with_the_binding(cpu):
    named = samples()
    names, datas = list(named), list(named.values())
    rois = [(13, 21, 150, 97) if i % 2 else None for i in range(len(datas))]
    with GpuDecoder("cuda", cpu) as dec:
        assert dec.engine == "native", "the C library of the installed nvImageCodec loads"
        ours, our_origins, our_paths = decode(dec, datas, names, rois)
    try:
        binding = GpuDecoder("cuda", cpu, engine="python")
    except ImportError as err:
        pytest.skip(str(err))
    with binding:
        theirs, their_origins, their_paths = decode(binding, datas, names, rois)
    assert (our_origins, our_paths) == (their_origins, their_paths)
    for name, a, b in zip(names, ours, theirs):
        assert mean_diff(a, b) < 0.5, name


@pytest.mark.gpu
@requires_gpu
def test_refused_images_are_counted_and_decoded_on_the_cpu(cpu):
    """A JPEG whose entropy data is cut short (EOI kept, so it is GPU-eligible): nvJPEG either decodes it or
    refuses it; a refusal is counted by reason and the CPU decoder takes the sample (and raises, here)."""
    good = samples()["baseline420.jpg"]
    sos = good.index(b"\xff\xda")
    cut = good[:sos + 40] + b"\xff\xd9"
    with GpuDecoder("cuda", cpu) as dec:
        images, _, paths = decode(dec, [good, cut, good], ["a.jpg", "cut.jpg", "c.jpg"])
        assert paths[0] == paths[2] == "gpu"
        if paths[1] == "cpu-fallback":
            assert isinstance(images[1], DecodeError) and "cut.jpg" in str(images[1])
            assert sum(dec.fallbacks.values()) == 1, dec.fallbacks
        else:
            assert tuple(images[1].shape) == tuple(images[0].shape) and not dec.fallbacks


@pytest.mark.gpu
@requires_gpu
def test_nvimgcodec_prints_nothing(tmp_path):
    """Loading nvImageCodec (missing nvjpeg2k/nvtiff) and decoding bad data must not write to the console."""
    good = samples()["baseline420.jpg"]
    sos = good.index(b"\xff\xda")
    (tmp_path / "good.jpg").write_bytes(good)
    (tmp_path / "cut.jpg").write_bytes(good[:sos + 40] + b"\xff\xd9")
    script = tmp_path / "run.py"
    script.write_text(
        "import sys, torch\n"
        "from ingest.decode.cpu import CpuDecoder\n"
        "from ingest.decode.gpu import GpuDecoder\n"
        "datas = [open(p, 'rb').read() for p in sys.argv[1:]]\n"
        "with CpuDecoder(threads=1) as cpu, GpuDecoder('cuda', cpu) as gpu:\n"
        "    images, _, paths = gpu.decode_batch(datas, sys.argv[1:])\n"
        "    torch.cuda.synchronize()\n"
        "print(gpu.engine, paths)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), *sys.path])}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "good.jpg"), str(tmp_path / "cut.jpg")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and done.stdout.startswith("native ['gpu', "), (done.stdout, done.stderr)


def test_hw_decoder_load_splits_between_the_hardware_and_cuda_decoders_or_takes_all():
    """``backend="auto"``: every backend nvImageCodec has; with ``hw_decoder_load`` set, the hardware engine
    takes that share and the CUDA decoder the rest, or where nvImageCodec refuses that (no engine), every
    backend. No GPU needed: the decoder factory is a stand-in that refuses what a GPU without the engine does."""
    from ingest import defaults

    class Refused(Exception):
        pass

    def make(backends):
        if backends is not None and any(kind == "HW_GPU_ONLY" for kind, _ in backends):
            raise Refused("no hardware decoder")
        return ("decoder", backends)

    gpu = object.__new__(GpuDecoder)
    gpu.backend, gpu.device, gpu.messages = "auto", torch.device("cuda", 0), []
    with defaults.set(hw_decoder_load="auto"):
        assert gpu._backend_choices() == [None]
    assert gpu._backend_choices() == [[("HW_GPU_ONLY", 1.0), ("HYBRID_CPU_GPU", 1.0), ("GPU_ONLY", 1.0)], None]
    with defaults.set(hw_decoder_load=0.65):
        assert gpu._backend_choices() == [[("HW_GPU_ONLY", 0.65), ("HYBRID_CPU_GPU", 1.0), ("GPU_ONLY", 1.0)], None]
        assert gpu._first_decoder(make, Refused) == ("decoder", None) and gpu.backends is None
    with defaults.set(hw_decoder_load=0):
        assert gpu._first_decoder(make, Refused) == ("decoder", [("HYBRID_CPU_GPU", 1.0), ("GPU_ONLY", 1.0)])
    gpu.backend = "hw"
    with pytest.raises(ConfigError, match="backend='hw' on cuda:0: no hardware decoder"):
        gpu._first_decoder(make, Refused)


def test_batch_planning_helpers_match_their_row_by_row_forms():
    """`clip_regions` and `decoded_sizes` work column by column (numpy gives the GIL up on more than 500 items):
    the same answers as `clip_roi` per row and the [n, 2] form they replace, on random regions and headers."""
    from ingest.decode.gpu import decoded_sizes
    rng = np.random.default_rng(3)
    n = 700   # past numpy's threshold
    table = np.zeros((n, 9), np.int64)
    table[:, 1], table[:, 2] = rng.integers(1, 600, n), rng.integers(1, 600, n)
    table[:, 6] = rng.choice([1, 1, 1, 6], n)
    regions = rng.integers(-50, 650, (n, 4))
    regions[rng.random(n) < 0.2] = 0
    got = clip_regions(regions, table)
    for k in range(n):
        roi = None if regions[k, 2] <= regions[k, 0] else tuple(regions[k])
        want = clip_roi(roi, int(table[k, 1]), int(table[k, 2])) if table[k, 6] == 1 else None
        assert tuple(got[k]) == (want or (0, 0, 0, 0)), k
    cropped = got[:, 2] > got[:, 0]
    old = np.where(cropped[:, None], got[:, [3, 2]] - got[:, [1, 0]], table[:, 1:3])
    assert np.array_equal(decoded_sizes(got, table), old)


def test_zeros_keeps_the_gil_and_gives_writable_zeroed_arrays():
    from ingest._numpy import zeros
    a = zeros((300, 9), np.int64)
    assert a.shape == (300, 9) and a.dtype == np.int64 and not a.any() and a.flags.writeable
    a[5, 3] = 7
    assert a.sum() == 7 and zeros(0, np.uint32).shape == (0,) and zeros(4, np.float32).tolist() == [0.0] * 4


def test_column_helpers_equal_numpys_whole_array_forms():
    from ingest._numpy import assign, columns, copy
    rng = np.random.default_rng(0)
    a = rng.random((600, 2, 3))
    assert np.array_equal(copy(a), a) and copy(a, np.float32).dtype == np.float32
    dst = np.zeros((600, 16))
    assign(dst[:, 7:11], a.reshape(600, 6)[:, :4])   # into a view: the parent changes
    assert np.array_equal(dst[:, 7:11], a.reshape(600, 6)[:, :4]) and not dst[:, :7].any()
    assert np.array_equal(columns(3, 4, n=5, dtype=np.int64), np.tile([3, 4], (5, 1)))
    assert np.array_equal(columns(0.0, a[:, 0, 0]), np.stack([np.zeros(600), a[:, 0, 0]], 1))


@pytest.mark.parametrize("n", [0, 1, 499, 500, 501, 1234])
def test_take_and_extremes_equal_numpys_whole_array_forms(n):
    from ingest._numpy import extremes, take
    rng = np.random.default_rng(n)
    table = rng.integers(-2**31, 2**31, 5000).astype(np.int32)
    idx = rng.integers(0, len(table), n)
    got = take(table, idx, np.int64)
    assert got.dtype == np.int64 and np.array_equal(got, table[idx].astype(np.int64))
    assert take(table, idx).dtype == np.int32
    if n:
        assert extremes(idx) == (idx.min(), idx.max()) and extremes(table[idx]) == (table[idx].min(), table[idx].max())
