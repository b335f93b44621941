"""The README's usage example runs (on a generated dataset; on the CPU where there is no GPU)."""

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


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
