"""The documents stay true to the tree: every result file is indexed and every one they quote exists, the
tuning page lists every setting, and the docs site's navigation names every page (``mkdocs build --strict``
in CI checks the rest: links, anchors and the API reference)."""

import re
from pathlib import Path

from ingest import defaults

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: Where results are quoted: relative to ``benchmarks/results/`` whatever prefix the text gives them.
QUOTING = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "dev" / "README.md",
           *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "ingest").rglob("*.py"))]
QUOTE = re.compile(r"(?<![\w/.-])(?:benchmarks/)?(?:results/)?([\w-]+/[\w-]+/[\w.*{},-]+\.json)")


def _matches(pattern: str) -> list[Path]:
    alternatives = re.fullmatch(r"(.*)\{(.*)\}(.*)", pattern)
    patterns = [alternatives[1] + a + alternatives[3] for a in alternatives[2].split(",")] if alternatives \
        else [pattern]
    return [p for pat in patterns for p in RESULTS.glob(pat)]


def test_every_result_file_is_indexed_and_every_indexed_file_exists():
    index = (RESULTS / "INDEX.md").read_text()
    listed = set(re.findall(r"^\| `([^`]+\.json)` \|", index, re.M))
    files = {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*.json")}
    assert files - listed == set(), "results not in benchmarks/results/INDEX.md"
    assert listed - files == set(), "INDEX.md names files that are gone"


def test_every_quoted_result_file_exists():
    missing = []
    for document in QUOTING:
        for pattern in QUOTE.findall(document.read_text()):
            if "<" in pattern:   # a template (`<device>`), not a file
                continue
            if not _matches(pattern):
                missing.append(f"{document.relative_to(ROOT)}: {pattern}")
    assert missing == []


def test_tuning_page_lists_every_setting():
    page = (ROOT / "docs" / "tuning.md").read_text()
    for name in defaults.names():
        assert re.search(rf"^\| {name} +\|", page, re.M), name


def test_docs_navigation_names_every_page_and_every_page_exists():
    nav = re.findall(r"^\s*- (?:[^:\n]+: )?([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert set(nav) == pages
