"""`ingest demo`'s formats and detection parts: every format reads back every sample with its label, and the
detection batch is drawn to a PNG of the expected size."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image
from pycocotools.coco import COCO

from ingest.tools import demo
from ingest.tools.cli import main


def test_formats_part_reads_back_every_sample_with_its_label(tmp_path):
    root = demo.make_dataset(tmp_path / "train", per_class=2)
    rows = demo.run_formats(root, tmp_path / "formats", raw_size=(16, 24), batch_size=3, min_seconds=0.0)
    assert [r["format"] for r in rows] == list(demo.FORMATS)
    for r in rows:
        assert r["read back"] == "8/8" and r["labels agree"] == "yes" and r["img/s"] > 0, r
        assert r["on disk"].startswith(tuple(f"{n} files" for n in range(2, 9))), r
    raw = rows[demo.FORMATS.index("raw")]
    assert raw["decode path"].startswith("none") and "cpu" in rows[0]["decode path"]


def test_coco_set_has_boxes_and_polygons_on_unoccluded_objects(tmp_path):
    path = demo.make_coco(tmp_path, n=6)
    coco = COCO(str(path))
    assert len(coco.imgs) == 6 and coco.anns
    for ann in coco.anns.values():
        x, y, w, h = ann["bbox"]
        mask = coco.annToMask(ann)
        ys, xs = np.nonzero(mask)
        # the polygon fills its box: a rectangle exactly, an ellipse touching all four sides
        assert abs(xs.min() - x) <= 1 and abs(xs.max() + 1 - (x + w)) <= 1
        assert abs(ys.min() - y) <= 1 and abs(ys.max() + 1 - (y + h)) <= 1
        others = [a["bbox"] for a in coco.imgToAnns[ann["image_id"]] if a["id"] != ann["id"]]
        assert all(x + w <= ox or ox + ow <= x or y + h <= oy or oy + oh <= y for ox, oy, ow, oh in others)


def test_detection_part_draws_the_batch_to_a_png(tmp_path):
    rows = demo.run_detection(tmp_path / "coco", tmp_path / "out", n=6, size=64)
    png = tmp_path / "out" / "ingest-demo-detection.png"
    assert rows[0]["png"] == str(png) and rows[0]["batch"] == "(6, 3, 64, 64) uint8"
    n_objects = len(json.loads((tmp_path / "coco" / "instances.json").read_text())["annotations"])
    assert 0 < rows[0]["objects"] <= n_objects
    with Image.open(png) as im:
        assert im.size == (4 * 66, 2 * 66)


def test_cli_runs_the_chosen_parts(capsys, tmp_path):
    assert main(["demo", "--parts", "formats,detection", "--per-class", "1", "--raw-size", "16x16",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for fmt in demo.FORMATS:
        line = next(l for l in out.splitlines() if l.startswith(fmt + " "))
        assert " 4/4 " in line and " yes " in line, line
    assert all(f"  {col}" in out for col in (*demo.FORMAT_COLUMNS, *demo.DETECTION_COLUMNS))
    assert (tmp_path / "ingest-demo-detection.png").is_file() and not (tmp_path / "ingest-demo-cpu.png").exists()
    assert main(["demo", "--parts", "files,nope", "--out", str(tmp_path)]) == 2
    assert "--parts" in capsys.readouterr().err
