"""The README's usage example runs (on a generated dataset; on the CPU where there is no GPU), and its
generated tables are what their commands print from the committed benchmark JSON."""

import re
import shlex
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


def test_readme_tables_are_generated_from_the_committed_results():
    """Each ``<!-- generated: python tools/X.py ARGS -->`` comment is followed by exactly what X prints."""
    text = README.read_text()
    blocks = re.findall(r"<!-- generated: python (tools/\w+\.py) (.*?) -->\n((?:\|.*\n)+)", text)
    assert blocks, "the README's speed table names the command that makes it"
    sys.path.insert(0, str(ROOT / "tools"))
    for script, args, table in blocks:
        module = __import__(Path(script).stem)
        assert module.from_args(shlex.split(args)) == table.rstrip("\n")
