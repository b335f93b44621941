"""The benchmark scripts still run against the library (no timing is asserted: speed targets live in the
benchmarks' own JSON). bench_cpu once broke silently when bench_gpu's loader builder grew an argument."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_bench_cpu_runs_both_loaders(tmp_path):
    out = tmp_path / "cpu.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_cpu.py"), "--data", str(tmp_path / "data"),
                    "--n", "48", "--batch", "8", "--seconds", "1", "--warmup-seconds", "0.3", "--warmup-batches",
                    "1", "--min-batches", "2", "--rounds", "1", "--out", str(out)], check=True, timeout=300,
                   capture_output=True)
    results = json.loads(out.read_text())["results"]
    for variant in ("ingest", "dataloader"):
        assert results[variant].get("error") is None, results[variant]
        assert results[variant]["img_s"] > 0


def test_bench_checks_runs_a_format_both_ways(tmp_path, image_folder):
    out = tmp_path / "checks.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_checks.py"), "--data", str(image_folder),
                    "--formats", "recordio", "--batch", "4", "--seconds", "0.5", "--rounds", "1", "--out", str(out)],
                   check=True, timeout=300, capture_output=True)
    result = json.loads(out.read_text())["results"]["recordio"]
    assert result["check_us"] > 0 and result["loader_img_s"]["none"] > 0 and result["loader_img_s"]["crc"] > 0
    assert 0 < result["cost"] < 1


def test_bench_ddp_ratios_over_one_gpu():
    import bench_ddp

    def run(gpus, loader, train, synthetic, peak, reserved):
        return {"total": {"gpus": gpus, "loader_img_s": loader, "train_img_s": train,
                          "synthetic_train_img_s": synthetic, "max_gpu_peak_mb": peak},
                "ranks": [{"memory": {"torch_max_reserved_mb": r}} for r in reserved]}
    derived = bench_ddp.derive({"1": run(1, 100, 50, 60, 1000, [800]),
                                "2": run(2, 190, 80, 120, 1100, [800, 820])})
    assert derived == {"loader_2_over_1": 1.9, "train_2_over_1": 1.6, "synthetic_train_2_over_1": 2.0,
                       "max_gpu_memory_2_over_1": 1.1, "max_torch_reserved_2_over_1": 1.025}
    assert bench_ddp.derive({"2": run(2, 1, 1, 1, 1, [1])}) == {}   # no one-GPU run: nothing to compare with


@pytest.mark.parametrize("script", ["bench_gpu.py", "bench_ddp.py", "bench_raw.py", "bench_formats.py",
                                    "bench_detection.py", "bench_segmentation.py", "bench_detection_targets.py",
                                    "bench_read_gil.py", "bench_settings.py", "bench_gil.py", "bench_ramp.py",
                                    "bench_augment.py", "bench_checks.py", "bench_codecs.py", "bench_serve.py"])
def test_benchmark_scripts_parse_their_options(script):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage" in done.stdout.lower()


def test_bench_settings_pairs_each_setting_with_the_first_in_its_round():
    import bench_settings
    assert bench_settings.parse_setting("split=INGEST_HW_DECODER_LOAD=0.65,INGEST_DECODE_BATCHES=3") == \
        ("split", {"INGEST_HW_DECODER_LOAD": "0.65", "INGEST_DECODE_BATCHES": "3"})
    assert bench_settings.parse_setting("default=") == ("default", {})
    with pytest.raises(SystemExit):
        bench_settings.parse_setting("x=PATH=/tmp")   # only ingest's variables
    run = lambda img_s: {"train": {"img_s": img_s}}  # noqa: E731
    rounds = [{"a": run(100), "b": run(110), "dali": run(200)}, {"a": run(100), "b": run(90), "dali": run(50)},
              {"a": run(None), "b": run(120)}]
    got = bench_settings.compare(rounds, ["a", "b"])
    assert got["b"] == {"train_over_a": [1.1, 0.9, None], "mean": 1.0, "faster_rounds": 1,
                        "train_over_dali": [0.55, 1.8, None]}
    assert got["a"]["train_over_a"] == [1.0, 1.0, None] and "mean" not in got["a"]
    assert "steady_rounds" not in got


def test_bench_settings_leaves_rounds_on_a_slowed_host_out_of_the_steady_mean():
    import bench_settings
    run = lambda img_s, step=None: {"train": {"img_s": img_s, **({"gpu_step_ms": step} if step else {})}}  # noqa: E731
    rounds = [{"a": run(100), "b": run(110), "synthetic": run(500, 20.0)},
              {"a": run(100), "b": run(80), "synthetic": run(400, 24.0)},      # 20% slower GPU: not steady
              {"a": run(100), "b": run(104), "synthetic": run(490, 20.9)},     # within 5% of the fastest
              {"a": run(100), "b": run(100), "synthetic": {"error": "failed", "train": {}}}]
    assert bench_settings.steady_rounds(rounds) == [0, 2]
    got = bench_settings.compare(rounds, ["a", "b"])
    assert got["steady_rounds"] == [0, 2]
    assert got["b"]["mean"] == 0.985 and got["b"]["mean_steady"] == 1.07
    assert "mean_steady" not in got["a"]
    with pytest.raises(SystemExit):
        bench_settings.parse_args(["--out", "x.json", "--setting", "dali=INGEST_DECODE_THREADS=1"])


def test_bench_settings_runs_each_setting_with_its_environment(tmp_path):
    out = tmp_path / "settings.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_settings.py"), "--dry-run",
                           "--out", str(out), "--rounds", "1", "--seconds", "0.5", "--train-seconds", "0.5",
                           "--warmup-seconds", "0.2", "--setting", "plain=",
                           "--setting", "one=INGEST_DECODE_THREADS=1", "--synthetic"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    (only,) = report["rounds"]
    assert only["plain"]["ingest_env"] == {} and only["one"]["ingest_env"] == {"INGEST_DECODE_THREADS": "1"}
    for name in ("plain", "one"):
        assert only[name]["error"] is None and only[name]["train"]["img_s"] > 0, only[name]
    assert report["compared"]["one"]["train_over_plain"][0] > 0
    assert only["synthetic"]["error"] is None and only["synthetic"]["train"]["img_s"] > 0, only["synthetic"]


def test_bench_gil_names_devices_alternates_feeds_and_averages_rounds():
    import argparse
    import bench_gil
    assert bench_gil.device_slug("NVIDIA H100 80GB HBM3", 16) == "h100-16cores"
    assert bench_gil.device_slug("NVIDIA H200", 32) == "h200-32cores"
    assert bench_gil.device_slug("cpu", 2) == "cpu-2cores"
    args = argparse.Namespace(inputs=["filetree", "lmdb", "raw"])
    sources = {"filetree": "/t", "lmdb": "/l", "raw": "/r", "raw_npy": "/n"}
    cases = bench_gil.plan_cases(args, sources, {"python": True, "native": "not built"}, True)
    assert [bench_gil.case_key(c) for c in cases] == [
        "filetree:ingest_python", "filetree:dali", "filetree:ingest_native", "lmdb:ingest_python", "lmdb:dali",
        "lmdb:ingest_native", "raw:ingest_python", "raw:dali", "raw:ingest_native"]
    assert [c.get("skipped") for c in cases][1:6] == [None, "not built", None, bench_gil.DALI_SKIPS["lmdb"],
                                                      "not built"]
    assert cases[7]["path"] == "/n"   # DALI reads the .npy copy of the raw shards
    no_dali = bench_gil.plan_cases(args, sources, {"python": True}, "unavailable: no module")
    assert [c.get("skipped") for c in no_dali if c["feed"] == "dali"] == ["unavailable: no module"] * 3
    run = lambda share, img_s: {"gil_share_left": share, "img_s_alone": img_s}  # noqa: E731
    summary = bench_gil.summarize([{"a": run(0.5, 100), "b": {"skipped": "why"}},
                                   {"a": run(0.7, 300), "b": {"skipped": "why"}, "c": {"error": "boom"}}])
    assert summary["a"]["gil_share_left"] == 0.6 and summary["a"]["gil_share_left_rounds"] == [0.5, 0.7]
    assert summary["a"]["img_s_alone"] == 200
    assert summary["b"] == {"skipped": "why"} and summary["c"] == {"error": "boom"}


def test_bench_gil_skips_an_engine_the_loader_did_not_run():
    import bench_gil
    from types import SimpleNamespace
    feed = lambda stats: SimpleNamespace(stats=lambda: stats)  # noqa: E731
    native = {"feed": "ingest", "engine": "native"}
    res = {}
    bench_gil.check_engine(native, feed({"engine": "native"}), res)   # ran as asked: no skip
    assert res == {"engine_reported": "native"}
    with pytest.raises(bench_gil.Skip, match="ran 'python': no compiler"):
        bench_gil.check_engine(native, feed({"engine": "python", "engine_reason": "no compiler"}), {})
    with pytest.raises(bench_gil.Skip, match="ran 'python': raw only"):
        bench_gil.check_engine(native, feed({"engine": {"name": "python", "reason": "raw only"}}), {})
    with pytest.raises(bench_gil.Skip, match="reports no engine"):
        bench_gil.check_engine(native, feed({}), {})
    bench_gil.check_engine({"feed": "ingest", "engine": "python"}, feed({}), {})   # an ingest before engines


def test_bench_ramp_step_times_and_waits():
    import bench_ramp
    ends = [0.010, 0.030, 0.035, 0.045, 0.050]   # step ends, s
    waits = [0.0, 0.012, 0.0, 0.004, 0.002]
    got = bench_ramp.step_figures(ends, waits, window=2, steady_from=4)
    assert got == {"first_steps_ms": [10.0, 20.0, 5.0, 10.0], "first_waits_ms": [0.0, 12.0, 0.0, 4.0],
                   "steady_wait_ms": 3.0}
    assert bench_ramp.step_figures(ends[:2], waits[:2], window=2, steady_from=4)["steady_wait_ms"] is None


def test_bench_ramp_rates_by_window_first_and_steady():
    import bench_ramp
    # 8 steps of 10 images: the first two take 2 s each, the rest 1 s (step ends at 2, 4, 5, 6, ...)
    ends = [2.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    got = bench_ramp.ramp(ends, batch=10, window=2, steady_from=5)
    assert got["windows_img_s"] == [5.0, 10.0, 10.0, 10.0]
    assert got["first_img_s"] == 5.0 and got["steady_img_s"] == 10.0 and got["first_over_steady"] == 0.5
    assert got["all_img_s"] == 8.0 and got["all_over_steady"] == 0.8
    summary = {"dali": {"first_img_s": 10.0, "steady_img_s": 20.0, "device_peak_mb": 100.0},
               "ingest_python": {"first_img_s": 5.0, "steady_img_s": 22.0, "device_peak_mb": 90.0}}
    assert bench_ramp.derive(summary) == {"ingest_python_first_over_dali_first": 0.5,
                                          "ingest_python_steady_over_dali_steady": 1.1,
                                          "ingest_python_memory_over_dali": 0.9}
    with pytest.raises(SystemExit):
        bench_ramp.parse_args(["--out", "x.json", "--steps", "10", "--steady-from", "10"])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux schedstat")
def test_bench_gil_tells_gil_waits_from_cpu_time():
    """The busy thread sleeps only while another thread holds the GIL: alone its sleep share is about 0; while
    this thread holds the GIL through one long C call (``sum`` over a range never gives it up) it is large,
    whatever the host's load adds to its run-queue share."""
    import time
    import bench_gil
    import bench_gpu

    def sleep_share(hold_gil: bool) -> float:
        with bench_gpu.Busy() as busy:
            time.sleep(0.05)
            t0, before = time.perf_counter(), bench_gil.schedstat(busy)
            if before is None:
                pytest.skip("this kernel reports no schedstat")
            if hold_gil:
                sum(range(20_000_000))
            else:
                time.sleep(0.5)
            got = bench_gil.where_time_went(busy, before, time.perf_counter() - t0, "x")
        assert got["x_cpu_frac"] + got["x_runqueue_frac"] <= 1.05
        return got["x_sleep_frac"]

    assert sleep_share(hold_gil=False) < 0.1
    assert sleep_share(hold_gil=True) > 0.25


def test_make_data_png_fraction_keeps_the_jpegs_of_the_plain_set(tmp_path):
    import make_data
    from PIL import Image
    make_data.make_dataset(str(tmp_path / "plain"), n=24, classes=2, seed=3, workers=1)
    meta = make_data.make_dataset(str(tmp_path / "mixed"), n=24, classes=2, seed=3, workers=1, png_frac=0.5)
    pngs = sorted(p.relative_to(tmp_path / "mixed") for p in (tmp_path / "mixed").rglob("*.png"))
    jpgs = sorted(p.relative_to(tmp_path / "mixed") for p in (tmp_path / "mixed").rglob("*.jpg"))
    assert 0 < len(pngs) < 24 and len(pngs) + len(jpgs) == 24 and meta["png_frac"] == 0.5
    for rel in jpgs:
        assert (tmp_path / "mixed" / rel).read_bytes() == (tmp_path / "plain" / rel).read_bytes()
    for rel in pngs:
        with Image.open(tmp_path / "mixed" / rel) as im:
            assert im.format == "PNG" and im.mode == "RGB"
        assert not (tmp_path / "mixed" / rel.with_suffix(".jpg")).exists()


def test_bench_detection_runs_the_tfrecord_sides_on_the_same_samples(tmp_path):
    """The TFRecord copy (`ingest convert` of the COCO set) gives the COCO side's first batch, on the engine each
    side asks for; DALI's side runs where DALI is importable, else says it is unavailable."""
    out = tmp_path / "det.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_detection.py"), "--dry-run",
                           "--data", str(tmp_path / "coco"), "--out", str(out), "--seconds", "0.3",
                           "--warmup-seconds", "0.1", "--only", "ingest,ingest_tfrecord,ingest_tfrecord_python,"
                           "dali_tfrecord"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["dataset"]["tfrecord"]["shards"] == 2 and (tmp_path / "coco" / "tfrecord" / "manifest.json").is_file()
    res = report["results"]
    for name in ("ingest", "ingest_tfrecord", "ingest_tfrecord_python"):
        assert res[name].get("error") is None, res[name]
        assert res[name]["img_s"] > 0 and res[name]["check"]["boxes_inside"]
        assert res[name]["native_chain_why_not"] == "eligible apart from the device"
    assert res["ingest_tfrecord"]["source"] == "TFRecordSource" and res["ingest"]["source"] == "CocoSource"
    assert res["ingest_tfrecord"]["check"] == res["ingest"]["check"]   # the same boxes, draws and pixels
    assert res["ingest_tfrecord"]["engine_setting"] == "auto"
    assert res["ingest_tfrecord_python"]["engine_setting"] == "python"
    assert res["ingest_tfrecord_python"]["loader_stats"]["engine"] == "python"
    dali = res["dali_tfrecord"]
    if dali.get("error"):
        assert "unavailable" in dali["error"], dali["error"]
    else:
        assert dali["img_s"] > 0 and dali["check"]["boxes_inside"] and dali["check"]["boxes_relative"]


def test_bench_gpu_compares_the_engines_and_dali_on_a_png_tree(tmp_path):
    """An all-PNG file tree (make_data --png-frac 1.0) runs through ingest on both engine settings and DALI's
    side (where DALI is importable, else recorded unavailable); the tree's files are counted by extension."""
    import make_data
    make_data.make_dataset(str(tmp_path / "png"), n=24, classes=2, seed=0, workers=2, png_frac=1.0)
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--dry-run", "--data",
                           str(tmp_path / "png"), "--out", str(out), "--only", "a,p,d", "--batch", "8", "--seconds",
                           "0.3", "--warmup-seconds", "0.1", "--train-seconds", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["dataset"]["extensions"] == {".png": 24}
    res = report["results"]
    for name, setting in (("ingest_mixed", "auto"), ("ingest_mixed_python", "python")):
        assert res[name].get("error") is None, res[name]
        assert res[name]["img_s"] > 0 and res[name]["check"]["batch_ok"]
        assert res[name]["engine_setting"] == setting and res[name]["loader_stats"]["engine"] == "python"
        assert res[name]["native_chain_why_not"] == "eligible apart from the device"
    assert res["ingest_mixed"]["check"] == res["ingest_mixed_python"]["check"]   # the same samples either way
    dali = res["dali_mixed"]
    if dali.get("error"):
        assert "unavailable" in dali["error"], dali["error"]
    else:
        assert dali["img_s"] > 0 and dali["check"]["batch_ok"]
    assert report["derived"]["a_over_p"] > 0


def test_gpu_profile_tells_launch_gaps_from_kernels_sharing_the_gpu():
    """The training stream is the busiest non-NCCL stream; its idle time inside the span is the launch gap, and the
    loader's kernel time is counted apart, with the part of it that ran beside a training kernel."""
    import gpu_profile

    def kernel(stream, ts, dur, name="k"):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream, "device": 0}}

    events = [kernel(7, 100 * i, 60, "conv") for i in range(10)]                           # 2 steps of 5 kernels
    events += [kernel(9, 100 * i + 60, 20, "ncclDevKernel_AllReduce") for i in range(10)]
    events += [kernel(30, 30, 50, "warp"), kernel(30, 562, 38, "warp")]                    # 30 us beside conv, 38 alone
    events += [kernel(5, 0, 2, "other"), {"ph": "X", "cat": "kernel", "name": "gpu1", "ts": 0, "dur": 999,
                                           "args": {"stream": 7, "device": 1}}]   # 2 us beside conv; GPU 1: left out
    events[0]["args"]["correlation"], events[20]["args"]["correlation"] = 1, 2       # a conv's launch, a warp's
    events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 8, "tid": 11,
                "args": {"correlation": 1}},
               {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 12, "tid": 12,
                "args": {"correlation": 2}},
               {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventSynchronize", "ts": 0, "dur": 400, "tid": 12}]
    got = gpu_profile.summarize(events, steps=2, main_tid=11, device=0)
    roles = {s: row["role"] for s, row in got["streams"].items()}
    assert roles == {"7": "train", "9": "nccl", "30": "loader", "5": "loader"}
    assert got["train_span_ms"] == pytest.approx(0.96 / 2) and got["train_busy_ms"] == pytest.approx(0.6 / 2)
    assert got["train_gap_ms"] == pytest.approx(0.36 / 2) and got["train_gaps_over_50us"] == 0
    assert got["loader_kernel_ms"] == pytest.approx(0.09 / 2) and got["overlap_ms"] == pytest.approx(0.032 / 2)
    assert got["api"][0] == {"name": "cudaEventSynchronize", "thread": "other", "queues_on": "-",
                             "calls_per_step": 0.5, "ms_per_step": 0.2, "us_per_call": 400.0, "max_ms": 0.4}
    assert [(a["thread"], a["queues_on"], a["us_per_call"]) for a in got["api"][1:]] == [("other", "loader", 12.0),
                                                                                          ("train", "train", 8.0)]
    assert gpu_profile.summarize([], 2, 11, 0) == {"error": "no kernel in the trace (CUPTI not available?)"}
    # a decoder's stream per thread: beyond the loader's four busiest, one row
    many = events + [kernel(100 + k, 700, 10 * (k + 1), "ycbcr") for k in range(8)]
    got = gpu_profile.summarize(many, steps=2, main_tid=11, device=0)
    assert set(got["streams"]) == {"7", "9", "30", "107", "106", "105", "6 more loader streams"}
    folded = got["streams"]["6 more loader streams"]
    assert folded["streams"] == 6 and folded["kernels_per_step"] == 3.0
    assert folded["top"] == [["ycbcr", 0.075], ["other", 0.001]]
    assert got["loader_kernel_ms"] == pytest.approx((0.09 + 0.36) / 2)   # every stream still counted


def test_the_memory_sampler_reads_the_device_through_nvml_not_cuda(monkeypatch):
    """With pynvml finding the device by its UUID, the sampler's device-wide readings (context level, peaks, the
    last one) come from NVML and never call cudaMemGetInfo; without pynvml they come from cudaMemGetInfo."""
    import types
    import torch
    import bench_gpu
    used = iter([900, 1000, 5000, 3000] + [4000] * 100)   # the handle probe's, the context's, then samples
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: ("handle", uuid),
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=next(used)),
        nvmlDeviceGetComputeRunningProcesses=lambda handle: [])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda dev: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: types.SimpleNamespace(uuid="abc-1"))

    def no_cuda_call(dev):
        raise AssertionError("cudaMemGetInfo called")

    monkeypatch.setattr(torch.cuda, "mem_get_info", no_cuda_call)
    sampler = bench_gpu.MemSampler(torch.device("cuda", 0))
    assert sampler._handle == ("handle", "GPU-abc-1") and sampler.ctx_used == 1000
    assert sampler.describe().startswith("NVML device-wide")
    sampler.peak = max(sampler.peak, sampler._device_used())
    sampler.stop()   # one last reading
    assert sampler.peak == 5000

    monkeypatch.setitem(sys.modules, "pynvml", None)   # not installed: cudaMemGetInfo
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (7, 10))
    plain = bench_gpu.MemSampler(torch.device("cuda", 0))
    assert plain._handle is None and plain.ctx_used == 3 and plain.describe().startswith("cudaMemGetInfo")


def test_loader_window_reports_the_cores_the_process_kept_busy():
    """``cpu_cores``: the process's CPU time over the timed window per second of it; a loader that spins on the
    calling thread keeps about one core busy, one that sleeps about none."""
    import argparse
    import time
    import bench_gpu
    import torch

    def feed(spin: bool):
        while True:
            end = time.perf_counter() + 0.01
            while spin and time.perf_counter() < end:
                pass
            if not spin:
                time.sleep(0.01)
            yield torch.zeros(4), None

    args = argparse.Namespace(warmup_batches=1, warmup_seconds=0.0, seconds=0.3, min_batches=5, max_batches=10**6)
    busy = bench_gpu.loader_window(feed(True), args, torch.device("cpu"))
    idle = bench_gpu.loader_window(feed(False), args, torch.device("cpu"))
    assert busy["images"] == 4 * busy["batches"] and busy["cores"] >= 1
    assert busy["cpu_cores"] > 0.3 > idle["cpu_cores"], (busy, idle)
