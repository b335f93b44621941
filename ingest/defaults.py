"""Process-wide knobs, KvikIO-style: each has an environment variable, `defaults.get(name)`, and
`defaults.set(name=value, ...)`, which also works as a context manager that restores the old values.

| name            | env var                 | default | meaning                                              |
|-----------------|-------------------------|---------|------------------------------------------------------|
| io              | INGEST_IO               | auto    | byte-range reads: auto (KvikIO with CUDA, else posix), kvikio, posix |
| io_threads      | INGEST_IO_THREADS       | cores, 8-32 | threads issuing a batch's reads (and KvikIO's own thread pool) |
| decode_threads  | INGEST_DECODE_THREADS   | cores   | CPU decode / CPU op threads                           |
| gpu_decoders    | INGEST_GPU_DECODERS     | 1       | nvImageCodec decoders sharing each batch, one thread each |
| gpu_decode_threads | INGEST_GPU_DECODE_THREADS | auto | nvImageCodec CPU threads of each GPU decoder a loader makes: auto (this process's share of the cores over its decoders, `ingest.decode.gpu.cpu_threads_each`) or a count |
| decode_batches  | INGEST_DECODE_BATCHES   | auto    | batches a loader decodes at once, each on its own thread (and GPU decoders and stream): auto is 2 for GPU decode, else 1 |
| hw_decoder_load | INGEST_HW_DECODER_LOAD  | 1.0     | the share of a batch's JPEGs the hardware decoder takes, the rest going to the CUDA decoder (DALI's name; its default is 0.65), or auto (nvImageCodec picks the backend per image: the hardware decoder takes all it can) |
| hybrid_huffman_threshold | INGEST_HYBRID_HUFFMAN_THRESHOLD | 1000000 | images the CUDA decoder takes with more pixels than this decode their Huffman stage on the GPU, the others on its CPU threads (DALI's name and default) |
| nvjpeg_host_padding | INGEST_NVJPEG_HOST_PADDING | 8388608 | bytes nvJPEG adds to each pinned host buffer it allocates, so a thread's buffers rarely grow again (DALI's ``host_memory_padding`` and default); 0: none |
| nvjpeg_device_padding | INGEST_NVJPEG_DEVICE_PADDING | 0 | bytes nvJPEG adds to each device buffer it allocates (DALI's ``device_memory_padding``, whose default is 16 MiB); 0: none |
| jpeg2k_device_padding | INGEST_JPEG2K_DEVICE_PADDING | 0 | bytes nvJPEG2000 adds to each device buffer it allocates (nvImageCodec's ``nvjpeg2k_cuda_decoder:device_memory_padding``); 0: none |
| jpeg2k_decoder  | INGEST_JPEG2K_DECODER   | auto    | what decodes JPEG 2000 on the GPU: nvimgcodec (at full resolution, a region where the ops crop), nvjpeg2k (nvJPEG2000 called directly, `ingest.decode.nvjpeg2k`: only the tiles a crop touches, at the lowest resolution level that still has the output's size, for every crop downscaled 2x or more) or auto (nvjpeg2k for crops downscaled 8x or more, `nvjpeg2k.AUTO_LEVEL`; nvimgcodec for the others); images nvjpeg2k declines go the nvimgcodec way |
| num_workers     | INGEST_NUM_WORKERS      | auto    | Loader worker processes when `num_workers=None`: auto (`ingest.torch.auto_workers`: 4 for CPU decode feeding CUDA, else 0) or a count |
| ops_threads     | INGEST_OPS_THREADS      | auto    | torch intra-op threads of the CPU ops stage: auto (half the cores) or a count |
| max_pixels      | INGEST_MAX_PIXELS       | 89478485 | images with more pixels are refused before decoding (decompression bombs) |
| check           | INGEST_CHECK            | auto    | per-record CRC32C checks of RecordIO, LMDB, WebDataset and raw readers: auto (where the converter wrote CRCs and the check costs under 3% of the format's loader rate), crc (every record that has one; a dataset without them is refused), none (`ingest.formats.checks`) |
| keep_freed_memory | INGEST_KEEP_FREED_MEMORY | auto  | auto: glibc keeps freed memory for reuse in the training process once a Loader runs its pipeline there (`ingest._malloc.keep_freed_memory`); off: leave its malloc alone |
| engine          | INGEST_ENGINE           | auto    | what runs a Loader's batches in the training process: auto (the native engine, `ingest.native`, where the loader is eligible, else the Python stages), python, or native (a ConfigError naming why where it is not eligible) |
| engine_nice     | INGEST_ENGINE_NICE      | 10      | the nice value (0-19) of the native engine's threads, so that the training thread, which launches the model's kernels, takes a core first when they are short; 0: as the process |
| host_jpeg_share | INGEST_HOST_JPEG_SHARE  | 0       | the share of the JPEGs the native engine's GPU path would decode that it decodes on the host instead (nvImageCodec's CPU decoder on its threads, uploaded with the batch's other host-decoded images in one copy); 0: none |
| host_jpeg2k_share | INGEST_HOST_JPEG2K_SHARE | auto  | the share of a batch's GPU-eligible JPEG 2000 images the CPU decoder (OpenJPEG) takes beside nvJPEG2000: auto (moved after each batch so that the CPU side ends at 0.7 of the GPU side's time, `ingest.decode.share`) or a fraction; 0: none |

"cores" is this process's share of the host (`cores`): the CPUs it may run on (its affinity, which a container's
or a batch job's cpuset narrows where `os.cpu_count` still counts the whole machine) over the torchrun ranks
that share them. Each rank of two on a 32-core host therefore starts the threads one process starts on a 16-core
host, and a job given 8 cores of a 128-core node starts 8 decode threads, not 128. How many ranks share this
process's CPUs: torchrun's ``LOCAL_WORLD_SIZE`` times the part of the job's CPUs (its cgroup's cpuset) that the
affinity covers, so a rank bound to its own cores (``torchrun --numa-binding=exclusive``) keeps them all, and
eight ranks bound to their GPU's NUMA node of a two-node host (``--numa-binding=node``) count four to a node.
Where the cpuset cannot be read, every local rank is taken to share the affinity. A CPU quota (a container's
``--cpus``) is not a cpuset and is not seen: set the counts there.

Each default below is a rule; the measurements behind it are in ``docs/measurements.md`` (section
"Settings"), and ``docs/tuning.md`` says when to change one.

``ops_threads``: torch runs a thread's CPU ops on every core by default, but beside the decode pool that
oversubscribes the cores, and OpenMP threads spin while they wait. Decoding and these ops cost about the same
CPU time per image, so "auto" gives the ops half the cores. Only the loader's ops thread is changed, never the
caller's threads.

``io_threads``: copying page-cached data is bound by how many cores copy at once, so the default follows the
cores (at least 8, for reads that wait on a disk; at most 32).

``decode_batches``: "auto" decodes two batches at once where the GPU decodes (`ingest.engine.decode.DecodeStage.lanes`):
one batch's Python work then overlaps the other's native decode, for one more batch's decode memory. CPU decode
keeps one: its pool already decodes a batch on every core.

``hw_decoder_load``: the share of each batch's JPEGs handed to the hardware JPEG engine (NVJPG: A100, H100, ...),
the rest going to nvImageCodec's CUDA (hybrid) decoder, both at once, as DALI's ``hw_decoder_load`` does (where the
engine is missing, nvImageCodec's other backends take them all; what the engine refuses, progressive JPEGs for
one, goes to the CUDA decoder whatever the share). The default, 1.0, gives the engine every JPEG: the engine runs
beside the training step without taking its SMs, where the CUDA decoder's kernels share them with the model, so a
model trains faster (DALI's default is 0.65). A smaller share helps only where the engine, not the GPU, limits
the loader: the loader alone, or a model far faster than the engine's rate. Under a split the two decoders'
pixels differ slightly (within a level or two) and nvImageCodec gives the engine the first share of each batch,
so an image's pixels depend on its place in the batch, as with DALI. "auto" lets nvImageCodec pick per image.

``host_jpeg_share``: the native engine decodes this share of the JPEGs its GPU path takes on the host, with
nvImageCodec's CPU decoder on the engine's threads, as it decodes the JPEGs the GPU path leaves (progressive, CMYK,
rotated); the pixels are libjpeg-turbo's, within a level or two of the hardware decoder's. Which JPEGs go is fixed by
their dataset index, the same every epoch. Each JPEG the hardware decoder takes costs about four CUDA calls
(a kernel, a copy, an event record and a wait, inside nvJPEG), each host-decoded one none (the batch's are uploaded
in one copy), so a share trades CPU cores for fewer CUDA calls beside the training loop's own. Where the engine
has no CPU decoder, or the Python stages run, it does nothing. It pays only where each GPU has cores to spare
(about 32 a rank): with 16 a rank the CPU decode falls behind the training, so the default is 0.

``host_jpeg2k_share``: the share of a batch's GPU-eligible JPEG 2000 images that the CPU decoder (OpenJPEG) decodes
on its threads while nvJPEG2000 decodes the rest: a batch of JPEG 2000 keeps the GPU decoder busy far longer than
a training step, and the cores would otherwise wait. "auto" finds the share from each batch's two wall times
(`ingest.decode.share`); a fraction fixes it; 0 leaves them all to the GPU. The CPU decodes whole images, the GPU
only the region a crop needs; lossless JPEG 2000 is exact either way, and a lossy one differs by a level or two.
TIFFs are not shared: nvTIFF decodes a batch in a fraction of a training step, and sending some to the CPU made
the loader slower (docs/measurements.md). Without imagecodecs (the CPU decoder of JPEG 2000) it does nothing.

``hybrid_huffman_threshold``: the CUDA decoder's share of the JPEGs (``hw_decoder_load``) decodes its Huffman stage
on nvImageCodec's CPU threads unless an image has more pixels than this; past it nvJPEG's GPU_HYBRID backend runs
it on the GPU. The pixels are the same either way. 0 puts every one on the GPU, which halves the decode's CPU
time but takes GPU time from the training step; so the default is DALI's, and a lower threshold pays where the
CPU, not the GPU, is short (few cores per GPU).

``nvjpeg_host_padding``, ``nvjpeg_device_padding``: nvJPEG (under nvImageCodec's CUDA decoder) keeps two pinned
buffers and a device buffer per decoding thread and grows one whenever an image needs more than it holds; freeing
the old one (``cudaFreeHost`` / ``cudaFree``) waits for every kernel queued on the GPU, the training step's
included. Each thread meets ever bigger images at its own times, so without padding the waits go on for epochs
and fall on the first training steps most. Padding every allocation stops the regrowth once a buffer holds an
image plus the padding. The pinned padding is DALI's 8 MiB (host memory only: two buffers per nvImageCodec
thread). The device padding stays 0: nvImageCodec's CUDA decoder applies it only when the caller gives it a device
allocator of its own (its ``nvjpeg_cuda_decoder`` sets it to 0 otherwise; ingest gives none), and where it applied
it cost device memory for no steady-state speed. What the padding is for is the start: `benchmarks/bench_ramp.py`.

``jpeg2k_device_padding``: the same for nvJPEG2000 (nvImageCodec's JPEG 2000 decoder), whose device buffers (one
decode state per nvImageCodec thread) grow the same way and free with ``cudaFree``. Unlike nvJPEG's, nvImageCodec's
JPEG 2000 decoder applies its padding without a device allocator of the caller's. DALI gives it 16 MiB; here it
stays 0 (none): it has not been measured alone (`benchmarks/bench_codecs.py --setting` does that, docs/codecs.md).

``jpeg2k_decoder``: which JPEG 2000 crops go to `ingest.decode.nvjpeg2k`, which asks nvJPEG2000 for a reduced
resolution level (each side halved per level; nvImageCodec 0.9 cannot ask for one) and decodes only the tiles
the crop touches. "auto": crops that allow `nvjpeg2k.AUTO_LEVEL` levels (downscaled 8x or more); "nvjpeg2k":
every crop a level applies to (2x or more); "nvimgcodec": none. nvJPEG2000 spends about its full-resolution time
on a tile 1 or 2 levels down, where nvImageCodec decodes only the crop's code blocks, so the shallow levels do not
pay (docs/codecs.md). ``jpeg2k_device_padding`` applies to it too.

``keep_freed_memory``: by default glibc hands freed memory back to the kernel (past 128 KB free at the top of
the heap) and gives every block of 128 KB or more its own mapping, so each record copied out of its file (a
TFRecord image out of its protobuf, an LMDB value) lands on fresh pages, and each page fault runs with the GIL
held. "auto" makes glibc keep up to 64 MB freed and serve blocks up to 32 MB from the heap in the training
process once a Loader runs its pipeline (or its decode and ops) there; ingest's worker processes always do.
The cost is that memory a program frees stays in its heap for reuse (up to 64 MB at the top) instead of going
back to the kernel at once.

``max_pixels`` defaults to Pillow's ``Image.MAX_IMAGE_PIXELS`` (89,478,485 = 2**30 / 4 / 3, where Pillow starts
warning; it refuses twice that): a file of a few hundred bytes can claim 16000 x 16000 pixels, whose decode
buffer alone is 768 MB. Raise it for larger real images (a 100 MP photo has ~1e8 pixels). Pillow's own refusal
at twice its limit still applies to what Pillow decodes (non-JPEG files and JPEGs libjpeg-turbo refuses).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import ConfigError


def _integer(name: str, minimum: int, *, words: tuple[str, ...] = ()) -> Callable[[Any], int | str]:
    """A parser of integers >= ``minimum`` (from env strings too), also accepting the given ``words``."""
    expected = "".join(f"{w!r} or " for w in words) + f"an integer >= {minimum}"

    def parse(value: Any) -> int | str:
        if value in words:
            return value
        try:
            v = int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"`{name}` must be {expected}, got {value!r}") from None
        if v < minimum:
            raise ConfigError(f"`{name}` must be {expected}, got {v}")
        return v
    return parse


def _fraction(name: str, *, words: tuple[str, ...] = ("auto",)) -> Callable[[Any], float | str]:
    """A parser of numbers from 0 to 1 (from env strings too), also accepting the given ``words``."""
    expected = "".join(f"{w!r} or " for w in words) + "a number from 0 to 1"

    def parse(value: Any) -> float | str:
        if value in words:
            return value
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"`{name}` must be {expected}, got {value!r}") from None
        if not 0.0 <= v <= 1.0:
            raise ConfigError(f"`{name}` must be {expected}, got {v}")
        return v
    return parse


def _choice(name: str, choices: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in choices:
            raise ConfigError(f"`{name}` must be one of {', '.join(choices)}; got {value!r}")
        return value
    return parse


# name -> (env var, default or a function making it, parser)
_SPEC: dict[str, tuple[str, Any, Callable[[Any], Any]]] = {
    "io": ("INGEST_IO", "auto", _choice("io", ("auto", "kvikio", "posix"))),
    "io_threads": ("INGEST_IO_THREADS", lambda: min(32, max(8, cores())), _integer("io_threads", 1)),
    "decode_threads": ("INGEST_DECODE_THREADS", lambda: cores(), _integer("decode_threads", 1)),
    "gpu_decoders": ("INGEST_GPU_DECODERS", 1, _integer("gpu_decoders", 1)),
    "gpu_decode_threads": ("INGEST_GPU_DECODE_THREADS", "auto", _integer("gpu_decode_threads", 1, words=("auto",))),
    "decode_batches": ("INGEST_DECODE_BATCHES", "auto", _integer("decode_batches", 1, words=("auto",))),
    "hw_decoder_load": ("INGEST_HW_DECODER_LOAD", 1.0, _fraction("hw_decoder_load")),
    "hybrid_huffman_threshold": ("INGEST_HYBRID_HUFFMAN_THRESHOLD", 1_000_000, _integer("hybrid_huffman_threshold", 0)),
    "nvjpeg_host_padding": ("INGEST_NVJPEG_HOST_PADDING", 8 << 20, _integer("nvjpeg_host_padding", 0)),
    "nvjpeg_device_padding": ("INGEST_NVJPEG_DEVICE_PADDING", 0, _integer("nvjpeg_device_padding", 0)),
    "jpeg2k_device_padding": ("INGEST_JPEG2K_DEVICE_PADDING", 0, _integer("jpeg2k_device_padding", 0)),
    "jpeg2k_decoder": ("INGEST_JPEG2K_DECODER", "auto",
                       _choice("jpeg2k_decoder", ("auto", "nvimgcodec", "nvjpeg2k"))),
    "num_workers": ("INGEST_NUM_WORKERS", "auto", _integer("num_workers", 0, words=("auto",))),
    "ops_threads": ("INGEST_OPS_THREADS", "auto", _integer("ops_threads", 1, words=("auto",))),
    "max_pixels": ("INGEST_MAX_PIXELS", 89_478_485, _integer("max_pixels", 1)),
    "keep_freed_memory": ("INGEST_KEEP_FREED_MEMORY", "auto", _choice("keep_freed_memory", ("auto", "off"))),
    "engine": ("INGEST_ENGINE", "auto", _choice("engine", ("auto", "python", "native"))),
    "engine_nice": ("INGEST_ENGINE_NICE", 10, _integer("engine_nice", 0)),
    "host_jpeg_share": ("INGEST_HOST_JPEG_SHARE", 0.0, _fraction("host_jpeg_share", words=())),
    "host_jpeg2k_share": ("INGEST_HOST_JPEG2K_SHARE", "auto", _fraction("host_jpeg2k_share")),
    "check": ("INGEST_CHECK", "auto", _choice("check", ("auto", "crc", "none"))),
}
_values: dict[str, Any] = {}


def _check_name(name: str) -> None:
    if name not in _SPEC:
        raise ConfigError(f"Unknown setting {name!r}. Available: {', '.join(sorted(_SPEC))}")


def get(name: str) -> Any:
    """The current value of a setting: set() value, else its environment variable, else the default."""
    _check_name(name)
    if name in _values:
        return _values[name]
    env, default, parse = _SPEC[name]
    raw = os.environ.get(env)
    if raw is None or raw == "":
        return default() if callable(default) else default
    return parse(raw)


@contextlib.contextmanager
def _restore(old: dict[str, Any]) -> Iterator[None]:
    try:
        yield
    finally:
        for k, v in old.items():
            if v is _UNSET:
                _values.pop(k, None)
            else:
                _values[k] = v


_UNSET = object()


def set(**settings: Any) -> contextlib.AbstractContextManager[None]:  # noqa: A001 - KvikIO's name
    """Set settings for the process. Use as `with defaults.set(io="posix"): ...` to scope them."""
    parsed = {}
    for name, value in settings.items():
        _check_name(name)
        parsed[name] = _SPEC[name][2](value)
    old = {k: _values.get(k, _UNSET) for k in parsed}
    _values.update(parsed)
    return _restore(old)


def ops_threads() -> int:
    """The ``ops_threads`` setting as a count (``auto``: half the cores, at least one)."""
    value = get("ops_threads")
    return max(1, cores() // 2) if value == "auto" else value


def cores() -> int:
    """This process's share of the host's cores, which the thread defaults follow: the CPUs it may run on over
    the torchrun ranks on this host that share them (`sharing`; at least one)."""
    mine = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1))
    except ValueError:
        raise ConfigError(f"LOCAL_WORLD_SIZE must be a process count, got {os.environ['LOCAL_WORLD_SIZE']!r}") from None
    return max(1, mine // sharing(mine, ranks, job_cpus() if ranks > 1 else None))


def sharing(mine: int, ranks: int, job: int | None) -> int:
    """How many of a host's ``ranks`` processes share the ``mine`` CPUs of one's affinity, the job having ``job``
    CPUs (None: unknown, then all of them): the ranks spread evenly over the job's CPUs, so those an affinity of a
    quarter of them holds are a quarter of the ranks (1 to ``ranks``). Not bound, every rank's affinity is the
    whole cpuset; bound to its own cores, one; bound to its GPU's NUMA node, that node's share."""
    if job is None or job < mine:
        return ranks
    return min(ranks, max(1, int(ranks * mine / job + 0.5)))   # halves round up: fewer threads each


CGROUPS, CGROUP_FS = Path("/proc/self/cgroup"), Path("/sys/fs/cgroup")   # module values, so tests can move them


def job_cpus() -> int | None:
    """How many CPUs this process's cgroup lets its job use (the cpuset of the container or batch job; an
    affinity set inside it, as torchrun's NUMA binding sets, does not change it), or None where no cpuset is
    found. cgroup v2: ``cpuset.cpus.effective`` of the process's group or the nearest parent that has one; v1:
    the cpuset hierarchy's ``cpuset.effective_cpus``."""
    try:
        lines = CGROUPS.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        controllers, _, group = line.partition(":")[2].partition(":")   # "id:controllers:path"
        if controllers == "":
            root, name = CGROUP_FS, "cpuset.cpus.effective"
        elif "cpuset" in controllers.split(","):
            root, name = CGROUP_FS / "cpuset", "cpuset.effective_cpus"
        else:
            continue
        here = root / group.strip().lstrip("/")
        for folder in (here, *[p for p in here.parents if p.is_relative_to(root)]):
            try:
                count = cpu_list_size((folder / name).read_text())
            except (OSError, ValueError):
                continue
            if count:
                return count
    return None


def cpu_list_size(text: str) -> int:
    """How many CPUs a kernel CPU list names (``0-3,8-11`` is 8; empty is 0). ValueError if it is not one."""
    count = 0
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count


def names() -> list[str]:
    return sorted(_SPEC)


def variable(name: str) -> str:
    """The environment variable of setting ``name`` (ConfigError naming the settings for an unknown one)."""
    _check_name(name)
    return _SPEC[name][0]
