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
                                    "bench_detection.py", "bench_read_gil.py", "bench_settings.py",
                                    "bench_checks.py"])
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
