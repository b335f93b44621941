"""Developer script: recompute the `derived` ratios of a bench_gpu.py JSON with the current `derive`.
Usage: python dev/rederive.py benchmarks/results/bench_gpu/h200/bench_gpu.json"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_gpu import derive  # noqa: E402



def main() -> None:
    for name in sys.argv[1:]:
        report = json.loads(Path(name).read_text())
        report["derived"] = derive(report["results"])
        Path(name).write_text(json.dumps(report, indent=1) + "\n")
        print(name, report["derived"])


if __name__ == "__main__":
    main()
