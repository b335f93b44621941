"""Run test files against ingest's C extensions built with AddressSanitizer and UndefinedBehaviorSanitizer.

The tracked tree (with uncommitted edits) is copied to a scratch directory, its extensions built there with
``-fsanitize=address,undefined -fno-sanitize-recover=undefined``, and pytest run on the given test files in a
child whose ``LD_PRELOAD`` puts libasan first (Python itself is not built with it) and libstdc++ beside it (so
ASan's ``__cxa_throw`` interceptor finds the real one when a C++ extension such as torch's throws at import).
Leak checks are off (the interpreter keeps much alive at exit). Each report goes to ``<scratch>/sanitizer.*``;
the script prints them and exits 1 where there is one, else pytest's exit status.

    python dev/sanitized_tests.py tests/test_native_emulated.py tests/test_native_records.py
    python dev/sanitized_tests.py --keep /tmp/asan tests/test_png_images.py -- -x -q
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAGS = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"


def runtime(compiler: str, name: str) -> str:
    """The shared library ``name`` the compiler links (its full path), or an error."""
    path = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(path):
        raise SystemExit(f"{compiler} has no {name}: is its sanitizer runtime installed?")
    return path


def copy_tree(scratch: Path) -> None:
    """The files git knows (tracked, or untracked and not ignored), as they are in the working tree."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, scratch / name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", nargs="+", help="test files (relative to the repository root)")
    parser.add_argument("--keep", help="scratch directory to use and keep (default: a temporary one, removed)")
    parser.add_argument("--cc", default=os.environ.get("CC", "gcc"))
    args, pytest_args = parser.parse_known_args()
    pytest_args = [a for a in pytest_args if a != "--"]
    asan, stdcxx = runtime(args.cc, "libasan.so"), runtime(args.cc.replace("gcc", "g++"), "libstdc++.so")
    scratch = Path(args.keep or tempfile.mkdtemp(prefix="ingest-asan-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        copy_tree(scratch)
        env = dict(os.environ, CC=args.cc, CFLAGS=FLAGS, LDFLAGS="-fsanitize=address,undefined")
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--force"], cwd=scratch, env=env,
                       check=True)
        for old in scratch.glob("sanitizer.*"):
            old.unlink()
        log = scratch / "sanitizer"
        env = dict(os.environ, LD_PRELOAD=f"{asan} {stdcxx}", PYTHONPATH=str(scratch),
                   ASAN_OPTIONS=f"detect_leaks=0:log_path={log}",
                   UBSAN_OPTIONS=f"print_stacktrace=1:log_path={log}")
        rc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args, *args.tests],
                            cwd=scratch, env=env).returncode
        reports = sorted(scratch.glob("sanitizer.*"))
        for report in reports:
            print(f"== {report.name}\n{report.read_text(errors='replace')}")
        print(f"{len(reports)} sanitizer report(s); pytest exited {rc}")
        return 1 if reports else rc
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
