"""The README's usage example runs (on a generated dataset; on the CPU where there is no GPU), its headline
table is what `benchmarks/headline.py` makes from the committed benchmark JSON, and its links resolve."""

import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_example_runs(image_folder):
    (code,) = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    code = code.replace('"data/train"', repr(str(image_folder))).replace("batch_size=256", "batch_size=8")
    if not torch.cuda.is_available():
        code = code.replace('device="cuda"', 'device="cpu"')
    code = code.replace("    ...", "    seen.append((images.shape, images.dtype, labels.shape))")
    scope = {"seen": []}
    exec(compile(code, str(README), "exec"), scope)
    assert len(scope["seen"]) == 3
    shape, dtype, labels = scope["seen"][0]
    assert shape == (8, 3, 224, 224) and dtype == torch.float16 and labels == (8,)


def test_headline_table_is_generated_from_the_committed_results():
    """The table between the headline markers of the README and docs/benchmarks.md is what
    ``benchmarks/headline.py`` makes from the committed JSON, and every file it names exists."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import headline
    for document in headline.DOCUMENTS:
        assert headline.shown_table(document.read_text()) == headline.table(), document
    for *_, names in headline.rows():
        for name in names.split(", "):
            assert (headline.RESULTS / name).is_file(), name


def test_readme_is_a_short_guide_whose_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), target
