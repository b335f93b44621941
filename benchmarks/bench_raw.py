"""Raw tensor shards on the GPU: KvikIO's own read bandwidth against ingest's batched reads, and reads + GPU ops.

Makes (or reuses) a raw dataset of N SIZE x SIZE x 3 uint8 samples in /dev/shm: random crops of real photos
(the sources of make_data.py: skimage / sklearn / matplotlib samples, else procedural scenes), or with
``--jpegs DIR`` every image of a JPEG tree resized to SIZE x SIZE. Then measures, for the same shard files:

  l  first, in a process that has done nothing else yet (as a user's): ``ingest.Loader(data_dir, ...)``
     (RandomResizedCrop 224 + Flip + Normalize fp16, shuffled) with each ``--loader-workers`` value on each of
     ``--engines`` (the `engine` setting: "native" reads, uploads and warps raw shards on the native engine's
     threads, "python" on the Python stages; a Loader that refuses an engine is recorded with its reason, and
     each case records the engine it ran, ``stats()["engine"]``): the best is the headline figure
  a  KvikIO alone: ``CuFile.pread`` of large chunks (one batch's bytes each) into a CuPy buffer, at each of
     ``--threads`` KvikIO thread counts; its best GB/s is the reference
  b  ingest ``RawSource.read_batch`` into a preallocated CUDA ``[B, H, W, 3]`` tensor with the loader's default
     reader, batches of consecutive samples ("sequential", coalesced into one read) and of a shuffled order
     ("random"), at each thread count: img/s, GB/s and the ratio to (a)'s best; then each way through
     ``ByteReader.read_rows`` (``READ_WAYS``: KvikIO for every read, preadv natively or on Python threads)
  c  reads + GPU ops (RandomResizedCrop 224 + Flip + Normalize fp16 by ``ingest.ops.run_ops``, random
     order): "serial" (read, then ops, one thread) and "overlapped" (a reader thread on its own stream and a
     ring of buffers, the ops on the main stream): probes of what the loader could reach
  d  with ``--dali`` and where ``nvidia.dali`` imports: DALI's ``fn.readers.numpy`` over one .npy per sample
     (CPU reader, and the GDS reader, device="gpu") + the same augmentation; and with ``--dali-jpegs DIR``
     DALI's mixed JPEG pipeline of benchmarks/bench_gpu.py (variant d) over that ImageFolder tree
  ratios: the loader's img/s over KvikIO's best (in samples), DALI's numpy reader and DALI's JPEG pipeline

Throughput = images (bytes) / wall time of a timed window of at least ``--seconds`` after a warm-up, ending with
a device synchronise. The JSON holds every figure, the device name and the library versions.

    python benchmarks/bench_raw.py --out benchmarks/results/bench_raw/h200/bench_raw.json            # device machine
    python benchmarks/bench_raw.py --device cpu --n 64 --size 64 --batch 16 --out /tmp/r.json  # CPU smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import torch  # noqa: E402

from ingest.formats import Field, Record  # noqa: E402
from ingest.formats.raw import RawSource, RawWriter, write_dataset_index  # noqa: E402
from ingest import io as ingest_io  # noqa: E402
from ingest.io import ByteReader  # noqa: E402

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]
CLASSES = 100


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--n", type=int, default=20000, help="samples in the raw dataset")
    p.add_argument("--size", type=int, default=256, help="side of the square samples")
    p.add_argument("--data", default=None, help="raw dataset directory (default /dev/shm/ingest_raw_<n>_<size>)")
    p.add_argument("--jpegs", default=None, help="convert this JPEG tree instead of cropping sample photos")
    p.add_argument("--shard-size", type=int, default=5000, help="samples per shard")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--threads", default="1,2,4,8,16", help="KvikIO / reader thread counts to measure")
    p.add_argument("--seconds", type=float, default=3.0, help="timed window per measurement")
    p.add_argument("--loader-workers", default="0", help="num_workers values for the ingest.Loader case, e.g. 0,4")
    p.add_argument("--engines", default="native,python", help="the Loader cases' `engine` settings, e.g. native")
    p.add_argument("--dali", action="store_true", help="also run DALI's numpy reader (d) if DALI imports")
    p.add_argument("--dali-jpegs", default=None, help="with --dali: an ImageFolder of JPEGs for DALI's JPEG pipeline")
    p.add_argument("--only", default=None, help="run only these steps, e.g. loader or loader,kvikio (default: all)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.threads = [int(t) for t in args.threads.split(",")]
    args.loader_workers = [int(w) for w in args.loader_workers.split(",")]
    args.engines = [e for e in args.engines.split(",") if e]
    args.data = args.data or f"/dev/shm/ingest_raw_{args.n}_{args.size}"
    args.batch = min(args.batch, args.n)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu for a smoke run", file=sys.stderr)
        return 2
    from bench_gpu import host_info, versions
    report: dict = {"args": vars(args), "versions": versions(), "host": host_info(),
                    "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    report["dataset"] = make_dataset(args)
    src = RawSource(args.data)
    steps = [("loader", loader_cases), ("kvikio", kvikio_bandwidth), ("read_batch", read_batch_rates),
             ("read_ops", read_ops_rates)]
    if args.dali:
        steps += [("dali_numpy", dali_numpy), ("dali_jpeg", dali_jpeg)]
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {key for key, _ in steps}
        if unknown:
            print(f"unknown --only steps {sorted(unknown)}; these run: {[key for key, _ in steps]}", file=sys.stderr)
            return 2
        steps = [(key, step) for key, step in steps if key in wanted]
    for key, step in steps:
        try:
            report[key] = step(src, args, report)
        except Exception as err:  # one failing case must not lose the others' figures
            traceback.print_exc()
            report[key] = {"error": f"{type(err).__name__}: {err}"}
        report["ratios"] = ratios(report)
        write(args.out, report)
        print(f"{key}: {json.dumps(headline(report[key]))}", flush=True)
    print(f"ratios: {json.dumps(report['ratios'])}")
    return 0


def ratios(report: dict) -> dict:
    def get(*path):
        d = report
        for p in path:
            d = d.get(p) if isinstance(d, dict) else None
        return d
    loader = get("loader", "images_per_s")
    refs = {"kvikio_best": get("kvikio", "by_threads", str(get("kvikio", "best_threads")), "images_per_s"),
            "dali_numpy_cpu": get("dali_numpy", "reader_cpu", "images_per_s"),
            "dali_jpeg": get("dali_jpeg", "images_per_s")}
    return {f"loader_over_{k}": round(loader / v, 3) for k, v in refs.items() if loader and v}


def write(path: str, report: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1) + "\n")


def headline(res: dict) -> dict:
    return {k: v for k, v in res.items() if not isinstance(v, dict)}


# -- the dataset -------------------------------------------------------------------------------------


def make_dataset(args) -> dict:
    """Write the raw dataset (unless a complete one of the same size is there); describe it."""
    meta_path = Path(args.data) / "bench_raw.meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("samples") == args.n and meta.get("shape") == [args.size, args.size, 3]:
            return {**meta, "reused": True}
    tmp = Path(args.data + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    samples, source = (jpeg_samples(args) if args.jpegs else photo_crops(args))
    fields = {"image": Field("pixels", (args.size, args.size, 3), "uint8"), "label": Field("int")}
    shard, writer = -1, None
    for i, (image, label) in enumerate(samples):
        if i % args.shard_size == 0:
            if writer is not None:
                writer.close()
            shard += 1
            writer = RawWriter(tmp, f"train-{shard:05d}", fields, classes=[f"c{k:03d}" for k in range(CLASSES)])
        writer.add(Record(image, label))
    writer.close()
    write_dataset_index(tmp)
    meta = {"path": args.data, "samples": args.n, "shape": [args.size, args.size, 3], "shards": shard + 1,
            "bytes": sum(f.stat().st_size for f in tmp.glob("*.raw")), "source": source,
            "write_s": round(time.perf_counter() - t0, 2)}
    (tmp / "bench_raw.meta.json").write_text(json.dumps(meta))
    shutil.rmtree(args.data, ignore_errors=True)
    os.replace(tmp, args.data)
    return {**meta, "reused": False}


def photo_crops(args):
    """N random SIZE x SIZE crops (with random flips) of the benchmark photos, labels i % CLASSES."""
    from make_data import load_sources
    sources = load_sources([], False, args.seed)
    photos = [a for _, a in sources]
    names = [os.path.basename(n) for n, _ in sources]
    rng = np.random.default_rng(args.seed)

    def gen():
        for i in range(args.n):
            photo = photos[int(rng.integers(len(photos)))]
            h, w = photo.shape[:2]
            if min(h, w) < args.size:
                scale = args.size / min(h, w)
                photo = np.asarray(torch.nn.functional.interpolate(
                    torch.from_numpy(photo).permute(2, 0, 1)[None].float(), scale_factor=scale * 1.01,
                    mode="bilinear")[0].permute(1, 2, 0).clamp(0, 255).byte())
                h, w = photo.shape[:2]
            y, x = int(rng.integers(h - args.size + 1)), int(rng.integers(w - args.size + 1))
            crop = photo[y:y + args.size, x:x + args.size]
            yield np.ascontiguousarray(crop[:, ::-1] if rng.random() < 0.5 else crop), i % CLASSES
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return gen(), f"random {args.size}x{args.size} crops of {len(names)} photos: {', '.join(names[:4])}{more}"


def jpeg_samples(args):
    """The first N images of a JPEG tree (sorted), resized to SIZE x SIZE; labels = class directory index."""
    from multiprocessing import get_context
    from ingest.formats import FileTree
    tree = FileTree(args.jpegs)
    if len(tree) < args.n:
        raise SystemExit(f"{args.jpegs} has {len(tree)} images, fewer than --n {args.n}")
    jobs = [(tree.name(i), args.size) for i in range(args.n)]
    labels = tree.labels()[:args.n].tolist()

    def gen():
        with get_context("fork").Pool(os.cpu_count()) as pool:
            for (image, label) in zip(pool.imap(_resized, jobs, chunksize=64), labels):
                yield image, label % CLASSES
    return gen(), f"{args.jpegs} resized to {args.size}x{args.size}"


def _resized(job) -> np.ndarray:
    from PIL import Image
    path, size = job
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB").resize((size, size), Image.BILINEAR))


# -- timing ------------------------------------------------------------------------------------------


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(step, args, *, warmup: int = 2, min_iters: int = 3) -> tuple[int, float]:
    """Run ``step(k)`` for at least ``--seconds`` (and ``min_iters`` calls) after a warm-up; (calls, seconds)."""
    for k in range(warmup):
        step(k)
    sync(args.device)
    t0, k = time.perf_counter(), 0
    while k < min_iters or time.perf_counter() - t0 < args.seconds:
        step(warmup + k)
        k += 1
    sync(args.device)
    return k, time.perf_counter() - t0


def rates(images: int, nbytes: int, seconds: float) -> dict:
    return {"images_per_s": round(images / seconds, 1), "GBps": round(nbytes / seconds / 1e9, 3),
            "seconds": round(seconds, 3)}


def batches(src: RawSource, args, order: str):
    """Index batches of ``--batch`` samples: consecutive, or slices of one shuffled order."""
    n = len(src)
    perm = np.arange(n) if order == "sequential" else np.random.default_rng(args.seed).permutation(n)
    starts = list(range(0, n - args.batch + 1, args.batch)) or [0]
    return [perm[s:s + args.batch] for s in starts]


# -- (a) KvikIO alone --------------------------------------------------------------------------------


def set_kvikio_threads(kvikio, threads: int) -> None:
    import kvikio.defaults
    if hasattr(kvikio.defaults, "set"):
        kvikio.defaults.set("num_threads", threads)
    else:
        kvikio.defaults.num_threads_reset(threads)


def kvikio_bandwidth(src: RawSource, args, report) -> dict:
    if args.device != "cuda":
        return {"skipped": "needs CUDA"}
    import cupy
    import kvikio
    chunk = args.batch * int(np.prod(src.fixed_shape))
    buf = cupy.empty(chunk, dtype=cupy.uint8)
    files = [(p, os.path.getsize(p)) for p in src.paths]
    spans = [(p, off) for p, size in files for off in range(0, size - chunk + 1, chunk)]
    out = {"chunk_bytes": chunk, "by_threads": {}}
    handles = {p: kvikio.CuFile(p, "r") for p, _ in files}
    try:
        for t in args.threads:
            set_kvikio_threads(kvikio, t)

            def step(k):
                path, off = spans[k % len(spans)]
                got = handles[path].pread(buf, chunk, off).get()
                assert got == chunk
            calls, secs = timed(step, args)
            out["by_threads"][str(t)] = rates(calls * args.batch, calls * chunk, secs)
    finally:
        for f in handles.values():
            f.close()
    best = max(out["by_threads"], key=lambda t: out["by_threads"][t]["GBps"])
    out.update(best_threads=int(best), best_GBps=out["by_threads"][best]["GBps"],
               compat_mode=_kvikio_compat(kvikio))
    return out


def _kvikio_compat(kvikio):
    try:
        import kvikio.defaults
        return str(kvikio.defaults.get("compat_mode")) if hasattr(kvikio.defaults, "get") \
            else bool(kvikio.defaults.compat_mode())
    except Exception as err:  # the name of the setting moved between KvikIO versions
        return f"unknown ({err})"


# -- (b) ingest's batched reads ----------------------------------------------------------------------


def read_batch_rates(src: RawSource, args, report) -> dict:
    """``read_batch`` with the loader's default reader ("auto") at each thread count, both orders; then, at the
    most threads, the other ways through `ByteReader.read_rows` (see ``READ_WAYS``)."""
    row = int(np.prod(src.fixed_shape))
    out_t = src.batch_buffer(args.batch, args.device)
    threads = args.threads if args.device == "cuda" else args.threads[-1:]
    res: dict = {}
    best_kvikio = (report.get("kvikio") or {}).get("best_GBps")

    def measure(idx, make_reader) -> dict:
        with make_reader() as reader:
            calls, secs = timed(lambda k: src.read_batch(idx[k % len(idx)], out_t, reader), args)
        entry = rates(calls * args.batch, calls * args.batch * row, secs)
        if best_kvikio:
            entry["ratio_to_kvikio_best"] = round(entry["GBps"] / best_kvikio, 3)
        return entry

    for order in ("sequential", "random"):
        idx = batches(src, args, order)
        entry: dict = {"by_threads": {str(t): measure(idx, lambda: ByteReader("auto", threads=t)) for t in threads}}
        best = max(entry["by_threads"], key=lambda t: entry["by_threads"][t]["GBps"])
        entry.update(entry["by_threads"][best], threads=int(best))
        res[order] = entry
    if args.device == "cuda":
        res["ways"] = {}
        for way, make_reader in READ_WAYS.items():
            res["ways"][way] = {}
            for order in ("sequential", "random"):
                try:
                    res["ways"][way][order] = measure(batches(src, args, order), lambda: make_reader(max(args.threads)))
                except Exception as err:  # noqa: BLE001 - e.g. no KvikIO: recorded, the rest goes on
                    res["ways"][way][order] = {"error": f"{type(err).__name__}: {err}"[:300]}
    with ByteReader("auto") as reader:
        res["read_path"] = reader.device_path if args.device == "cuda" else reader.path
    res["native_reads"] = ingest_io.NATIVE is not None
    res["plan_ms_random"] = plan_ms(src, args)
    return res


def _kvikio_every_read(threads: int) -> ByteReader:
    reader = ByteReader("kvikio", threads=threads)
    reader._kvikio_min_read = 0
    return reader


@contextlib.contextmanager
def _python_threads(threads: int):
    """A posix reader whose batched reads run on Python threads (as where ``ingest._readv`` was not built)."""
    native, ingest_io.NATIVE = ingest_io.NATIVE, None
    try:
        with ByteReader("posix", threads=threads) as reader:
            yield reader
    finally:
        ingest_io.NATIVE = native


#: The ways `ByteReader.read_rows` can fill a CUDA batch: the default split (reads of KvikIO's gds_threshold
#: and more through KvikIO, smaller ones as one native preadv batch into pinned memory + one copy), KvikIO for
#: every read (before the split), preadv natively for every read, and preadv on Python threads (no compiler).
READ_WAYS = {
    "kvikio_large_preadv_small": lambda t: ByteReader("kvikio", threads=t),
    "kvikio_every_read": _kvikio_every_read,
    "preadv_native": lambda t: ByteReader("posix", threads=t),
    "preadv_python_threads": _python_threads,
}


def plan_ms(src: RawSource, args) -> float:
    """Mean host time (ms) to group one shuffled batch into reads (`ingest.io.plan_rows`): per-batch overhead."""
    from ingest.io import plan_rows
    idx = batches(src, args, "random")[:50]
    t0 = time.perf_counter()
    for b in idx:
        plan_rows(*src.ranges(b), int(np.prod(src.fixed_shape)))
    return round((time.perf_counter() - t0) / len(idx) * 1e3, 3)


# -- (c) reads + GPU ops -----------------------------------------------------------------------------


def make_ops():
    from ingest.ops import Flip, Normalize, RandomResizedCrop
    return [RandomResizedCrop(224), Flip(), Normalize(MEAN, STD, dtype=torch.float16)]


def read_ops_rates(src: RawSource, args, report) -> dict:
    from ingest.ops import run_ops
    ops = make_ops()
    idx = batches(src, args, "random")
    threads = (report.get("read_batch") or {}).get("random", {}).get("threads") or max(args.threads)
    res: dict = {"ops": [repr(o) for o in ops], "threads": threads}
    row = int(np.prod(src.fixed_shape))  # GB/s below: raw bytes read per second
    rng = np.random.default_rng(args.seed)
    with ByteReader("auto", threads=threads) as reader:
        buf = src.batch_buffer(args.batch, args.device)

        def serial(k):
            src.read_batch(idx[k % len(idx)], buf, reader)
            return run_ops(ops, buf, rng, device_kind=args.device)
        calls, secs = timed(serial, args)
        res["serial"] = rates(calls * args.batch, calls * args.batch * row, secs)

        def op_by_op(k):  # each op's own __call__ (draw + apply), no fused warp
            x = src.read_batch(idx[k % len(idx)], buf, reader)
            for op in ops:
                x = op(x, rng)
            return x
        calls, secs = timed(op_by_op, args)
        res["serial_op_by_op"] = rates(calls * args.batch, calls * args.batch * row, secs)
        res["overlapped"] = overlapped(src, args, idx, ops, reader)
    return res


def loader_cases(src: RawSource, args, report) -> dict:
    res = {f"{engine}_workers{w}": loader_rate(args, make_ops(), w, engine)
           for engine in args.engines for w in args.loader_workers}
    res["images_per_s"] = max(c.get("images_per_s", 0) for c in res.values())
    return res


def overlapped(src: RawSource, args, idx, ops, reader, ring: int = 4) -> dict:
    """A reader thread (its own CUDA stream) fills a ring of buffers; this thread runs the ops on each and
    records an event that the reader waits for before refilling that buffer. The queue holds at most
    ``ring - 2`` filled buffers, so the reader never refills one whose ops are not yet queued."""
    from ingest.ops import run_ops
    cuda = args.device == "cuda"
    bufs = [src.batch_buffer(args.batch, args.device) for _ in range(ring)]
    done = [None] * ring
    ready: queue.Queue = queue.Queue(maxsize=ring - 2)
    stop = threading.Event()

    def read_loop():
        stream = torch.cuda.Stream() if cuda else None
        k = 0
        with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
            while not stop.is_set():
                slot = k % ring
                if done[slot] is not None:
                    done[slot].synchronize()
                src.read_batch(idx[k % len(idx)], bufs[slot], reader)
                ready.put(slot)
                k += 1

    thread = threading.Thread(target=read_loop, daemon=True)
    thread.start()
    rng = np.random.default_rng(args.seed)

    def step(k):
        slot = ready.get()
        out = run_ops(ops, bufs[slot], rng, device_kind=args.device)
        if cuda:
            done[slot] = torch.cuda.Event()
            done[slot].record()
        return out
    try:
        calls, secs = timed(step, args)
    finally:
        stop.set()
        while thread.is_alive():
            try:
                ready.get(timeout=0.1)
            except queue.Empty:
                pass
    return rates(calls * args.batch, calls * args.batch * args.size ** 2 * 3, secs)


def loader_rate(args, ops, workers: int, engine: str = "auto") -> dict:
    """``ingest.Loader`` over the raw dataset (``num_workers=workers``, the `engine` setting ``engine``), where it
    takes one (else the error: a Loader that cannot run on the engine asked for says why)."""
    try:
        import ingest
        from ingest import defaults
        with defaults.set(engine=engine):   # (read when the Loader is made)
            loader = ingest.Loader(args.data, batch_size=args.batch, device=args.device, ops=ops, shuffle=True,
                                   num_workers=workers, last_batch="drop")   # every batch full: counted as such
        it = iter(loader)

        def step(k):
            nonlocal it
            try:
                return next(it)
            except StopIteration:
                it = iter(loader)
                return next(it)
        calls, secs = timed(step, args, warmup=3)
        stats = loader.stats()
        loader.close()
        return {**rates(calls * args.batch, calls * args.batch * args.size ** 2 * 3, secs),
                "engine": stats.get("engine"), "native_why_not": loader.native_why_not,
                "native": stats.get("native"),   # the native engine's counts (its GIL per batch among them)
                "decode_paths": stats.get("decode_paths"), "read_path": stats.get("read_path"),
                "stages": stats.get("stages")}   # busy and CPU seconds per stage: which one is the limit
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"[:500]}


# -- (d) DALI's numpy reader -------------------------------------------------------------------------


def dali_numpy(src: RawSource, args, report) -> dict:
    if args.device != "cuda":
        return {"skipped": "needs CUDA"}
    try:
        from nvidia.dali import fn, pipeline_def, types
    except ImportError as err:
        return {"skipped": f"nvidia.dali does not import: {err}"}
    root = Path(args.data + "_npy")
    npy_files(src, root)
    res = {"files": len(src)}
    for device in ("cpu", "gpu"):
        @pipeline_def(batch_size=args.batch, num_threads=max(args.threads), device_id=0, prefetch_queue_depth=2)
        def pipe():
            images = fn.readers.numpy(device=device, file_root=str(root), file_filter="*.npy",
                                      random_shuffle=True, seed=args.seed, name="reader")
            images = images.gpu() if device == "cpu" else images
            images = fn.random_resized_crop(images, size=[224, 224])
            return fn.crop_mirror_normalize(images, dtype=types.FLOAT16, output_layout="CHW", mean=MEAN, std=STD,
                                            mirror=fn.random.coin_flip())
        try:
            p = pipe()
            p.build()
            calls, secs = timed(lambda k: p.run(), args, warmup=3)
            res[f"reader_{device}"] = rates(calls * args.batch, calls * args.batch * args.size ** 2 * 3, secs)
        except Exception as err:
            res[f"reader_{device}"] = {"error": f"{type(err).__name__}: {err}"[:500]}
    return res


def npy_files(src: RawSource, root: Path) -> bool:
    """One .npy per sample of ``src`` in ``root`` (DALI's numpy reader reads files, not shards), written under a
    temporary name and renamed; kept when ``root`` already holds one per sample. True when written."""
    if root.exists() and len(list(root.glob("*.npy"))) == len(src):
        return False
    tmp = Path(str(root) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for i in range(len(src)):
        np.save(tmp / f"{i:08d}.npy", src.parse(i, _read(src, i)).image)
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    return True


def dali_jpeg(src: RawSource, args, report) -> dict:
    """DALI's mixed JPEG pipeline of bench_gpu.py (variant d) over ``--dali-jpegs``: img/s of the loader alone."""
    if not args.dali_jpegs:
        return {"skipped": "no --dali-jpegs"}
    import bench_gpu
    opts = argparse.Namespace(data=args.dali_jpegs, batch=256, threads=max(args.threads))
    try:
        gen = bench_gpu.build_dali(opts, torch.device("cuda", 0)).endless()
    except RuntimeError as err:
        return {"skipped": str(err)}
    calls, secs = timed(lambda k: next(gen), args, warmup=10)
    return {"batch": opts.batch, "pipeline": "bench_gpu.py variant d", **rates(calls * opts.batch, 0, secs)}


def _read(src: RawSource, i: int) -> bytes:
    loc = src.locate(i)
    with open(loc.path, "rb") as f:
        f.seek(loc.offset)
        return f.read(loc.length)


if __name__ == "__main__":
    sys.exit(main())
