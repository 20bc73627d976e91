"""The suites take a ModernBERT as they take any model: ``benchmark blurb --model`` a random Hugging Face
``ModernBertForMaskedLM`` folder fine-tunes each cell from it through the real CLI (NER and relation extraction,
ModernBERT's own task head) and scores it with the task's evaluator; the cells' checkpoints record the family."""

from __future__ import annotations

import json
import os

from families.test_modernbert_heads import _make_mlm
from harness import run_world
from benchmark.suite_files import ROOT, blurb_map, write_map

SMOKE = ["--no-grid", "--epochs", "1", "--max-examples", "16"]


def _suite(argv: list[str]) -> int:
    from bio_megatron.cli import main

    os.chdir(ROOT)
    return main(argv)


def test_blurb_suite_runs_a_modernbert(tmp_path):
    import yaml

    hf, out = tmp_path / "hf", tmp_path / "suite"
    run_world(1, _make_mlm, str(hf))
    argv = ["benchmark", "blurb", "--model", str(hf), "--out", str(out), "--seeds", "1",
            "--recipe-map", str(write_map(tmp_path / "map.yaml", blurb_map())), "--datasets", "bc5cdr_chem,gad",
            *SMOKE]
    assert run_world(1, _suite, argv) == [0]
    rows = {r["key"]: r for r in json.loads((out / "results.json").read_text())["datasets"]}
    for key in ("bc5cdr_chem", "gad"):
        assert rows[key]["status"] == "complete", rows[key]
        cell = json.loads((out / "cells" / key / "seed1" / "cell.json").read_text())
        assert cell["status"] == "finished" and isinstance(cell["scores"][cell["metric"]], float)
        if key == "gad":  # `evaluate gad` on the cell's test predictions gives the cell's score
            assert cell["evaluation"]["score"] == cell["raw"]["test"]["score"]
        config = out / cell["checkpoint"] / "config.yaml"
        assert yaml.safe_load(config.read_text())["model"]["family"] == "modernbert", config
