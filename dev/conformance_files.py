"""Developer script: copy the codec projects' own test files, with their reference outputs, into a directory that
``tests/test_conformance.py`` reads (``INGEST_CONFORMANCE_DIR``).

Each source is a git clone (bare or not) of the project's test data; files are read from its HEAD with ``git show``,
so nothing needs checking out. The files keep their projects' licences (the ISO 15444-4 files' COPYRIGHT is copied
beside them) and stay outside the ingest repository.

- ``--openjpeg-data``: a clone of https://github.com/uclouvain/openjpeg-data. Copies ``input/conformance`` (the
  ISO/IEC 15444-4 codestreams and JP2 files) and ``baseline/conformance`` (their reference decodes: one PGX per
  component, PPM/PGM, TIFF) to ``OUT/openjpeg-data/``.
- ``--libtiff``: a clone of libtiff (https://gitlab.com/libtiff/libtiff or a mirror). Copies ``test/images`` to
  ``OUT/libtiff/``.
- ``--libwebp-test-data``: a clone of https://github.com/webmproject/libwebp-test-data. Copies every file to
  ``OUT/libwebp-test-data/`` (its ``libwebp_tests.md5`` holds the MD5 of dwebp's PPM and PAM output per file).

Files git cannot give (a snapshot whose largest blobs were left out) are listed and skipped; the tests skip them.

Usage: python dev/conformance_files.py OUT [--openjpeg-data CLONE] [--libtiff CLONE] [--libwebp-test-data CLONE]
"""

import argparse
import subprocess
import sys
from pathlib import Path

#: (option's destination, the folders of the clone to copy, the subdirectory of OUT they go to)
SOURCES = (("openjpeg_data", ("input/conformance", "baseline/conformance"), "openjpeg-data"),
           ("libtiff", ("test/images",), "libtiff"),
           ("libwebp_test_data", ("",), "libwebp-test-data"))


def blobs(clone: Path, folder: str) -> list[str]:
    """Paths of the files under ``folder`` (the whole tree for "") at the clone's HEAD."""
    args = ["git", "-C", str(clone), "ls-tree", "-r", "--name-only", "HEAD"] + ([folder] if folder else [])
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.split()


def copy(clone: Path, folders: tuple[str, ...], out: Path) -> tuple[int, list[str]]:
    """Copy the files of ``folders`` to ``out`` (their paths kept); the count copied and the paths git lacks."""
    copied, missing = 0, []
    for folder in folders:
        for path in blobs(clone, folder):
            if path.startswith(".git"):
                continue
            got = subprocess.run(["git", "-C", str(clone), "show", f"HEAD:{path}"], capture_output=True)
            if got.returncode:
                missing.append(path)
                continue
            target = out / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(got.stdout)
            copied += 1
    return copied, missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--openjpeg-data", type=Path)
    parser.add_argument("--libtiff", type=Path)
    parser.add_argument("--libwebp-test-data", type=Path)
    args = parser.parse_args()
    chosen = [(getattr(args, key), folders, sub) for key, folders, sub in SOURCES if getattr(args, key)]
    if not chosen:
        parser.error("name at least one clone (--openjpeg-data, --libtiff, --libwebp-test-data)")
    for clone, folders, sub in chosen:
        copied, missing = copy(clone, folders, args.out / sub)
        print(f"{sub}: {copied} files to {args.out / sub}" + (f"; not in the clone: {', '.join(missing)}"
                                                              if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
