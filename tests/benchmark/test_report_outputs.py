"""``benchmark report`` beside results.md: results.csv, results.tex (LaTeX tabular), plots/<dataset>.png across
seeds, all under ``--name``; one seed shows its score with no spread ("75.31", never "± 0.00"). On a real suite
folder: BLURB's GAD fine-tuned for two seeds through the real CLI (tiny recipe, the fixture slice)."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from harness import run_world
from matplotlib.image import imread

from reliability.cli_log import run_cli
from suite_files import ROOT, blurb_map, make_model, write_map

NAME = "BioMegatron tiny_v2 (ours)"  # a space, an underscore and parentheses: quoted/escaped in every output


def _suite(argv: list[str]) -> int:
    from bio_megatron.cli import main

    os.chdir(ROOT)
    return main(argv)


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("suite")
    model = make_model(tmp / "tiny-megatron-bert")
    out = tmp / "s"
    argv = ["benchmark", "blurb", "--model", str(model), "--out", str(out), "--seeds", "1,2", "--recipe-map",
            str(write_map(tmp / "map.yaml", blurb_map())), "--datasets", "gad", "--no-grid", "--epochs", "1",
            "--max-examples", "16"]
    assert run_world(1, _suite, argv) == [0]
    return out


def _rows(folder: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO((folder / "results.csv").read_text(encoding="utf-8"))))


def test_csv_latex_and_plots_under_the_display_name(suite):
    rc, err = run_cli(["benchmark", "report", str(suite), "--name", NAME])
    assert rc == 0, err
    cells = [json.loads((suite / "cells" / "gad" / f"seed{s}" / "cell.json").read_text()) for s in (1, 2)]
    x = np.array([c["scores"]["score"] for c in cells])
    gad = next(r for r in _rows(suite) if r["dataset"] == "gad" and r["metric"] == "score")
    assert gad["model"] == NAME and gad["n"] == "2" and gad["seeds"] == "1 2"
    assert float(gad["mean"]) == pytest.approx(np.mean(x), abs=1e-4)
    assert float(gad["std"]) == pytest.approx(np.std(x, ddof=1), abs=1e-4)
    assert float(gad["median"]) == pytest.approx(np.median(x), abs=1e-4)
    kinds = [r["kind"] for r in _rows(suite)]
    assert kinds.count("task_type_average") == 6 and kinds[-1] == "blurb_score_partial"
    tex = (suite / "results.tex").read_text()
    assert r"BioMegatron tiny\_v2 (ours)" in tex and "_v2" not in tex.replace(r"\_v2", "")
    assert f"{np.mean(x):.2f} $\\pm$ {np.std(x, ddof=1):.2f}" in tex
    assert tex.count(r"\begin{tabular}") == tex.count(r"\end{tabular}") >= 1
    md = (suite / "results.md").read_text()
    assert md.startswith(f"# BLURB: {NAME}")
    res = json.loads((suite / "results.json").read_text())
    assert res["model_name"] == NAME and res["plots"] == ["plots/gad.png"]
    img = imread(suite / "plots" / "gad.png")
    assert img.ndim == 3 and img.shape[0] > 100
    # rebuilt from the same cells: the same bytes (plots aside: PNG metadata may carry the writer's version)
    before = {f: (suite / f).read_bytes() for f in ("results.csv", "results.tex", "results.md", "results.json")}
    assert run_cli(["benchmark", "report", str(suite), "--name", NAME])[0] == 0
    assert before == {f: (suite / f).read_bytes() for f in before}


def test_one_seed_shows_no_spread(suite, tmp_path):
    one = tmp_path / "one"
    shutil.copytree(suite, one, symlinks=True)
    (one / "cells" / "gad" / "seed2" / "cell.json").unlink()  # seed 2 not finished: GAD has one seed
    assert run_cli(["benchmark", "report", str(one)])[0] == 0
    score = json.loads((one / "cells" / "gad" / "seed1" / "cell.json").read_text())["scores"]["score"]
    md = (one / "results.md").read_text()
    gad_line = next(ln for ln in md.splitlines() if "| GAD |" in ln)
    assert f"| {score:.2f} |" in gad_line and "±" not in gad_line and gad_line.endswith("| 1 |")
    gad = next(r for r in _rows(one) if r["dataset"] == "gad" and r["metric"] == "score")
    assert gad["n"] == "1" and gad["std"] == ""
    tex_line = next(ln for ln in (one / "results.tex").read_text().splitlines() if ln.startswith("GAD &"))
    assert f"{score:.2f}" in tex_line and r"\pm" not in tex_line
    assert md.startswith("# BLURB: tiny-megatron-bert")  # without --name: the model folder's name


def test_plots_folder_of_the_user_is_not_replaced(suite, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(suite, other, symlinks=True)
    shutil.rmtree(other / "plots")
    (other / "plots").mkdir()
    (other / "plots" / "figure1.pdf").write_text("mine")
    rc, err = run_cli(["benchmark", "report", str(other)])
    assert rc == 2 and "plots" in err and "refusing to replace it" in err
    assert [p.name for p in (other / "plots").iterdir()] == ["figure1.pdf"]
