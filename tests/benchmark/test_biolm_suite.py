"""bio-lm's and BLUE's clinical suites (issue 23 item 2): ``benchmark biolm --dry-run`` lists bio-lm's 18 tasks in
its Table 1 order with the missing ones named and where to get them; ``benchmark blue-clinical --dry-run`` its four;
a run on the data ../shared holds goes end to end on CPU; the rows report the MEDIAN over seeds and bio-lm's group
means over those medians; a pretraining run with two saved checkpoints is scored at each step, with the plot."""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
from pathlib import Path

import pytest

from harness import run_world
from suite_files import ROOT, make_model

from bio_megatron.cli import main

# paper 004 Table 1, read column by column (the order of its Table 2)
TABLE1 = ["bc5cdr_chem", "bc5cdr_disease", "jnlpba", "ncbi_disease", "bc4chemd", "bc2gm", "linnaeus", "species_800",
          "i2b2_2010", "i2b2_2012", "i2b2_2014", "hoc", "chemprot", "gad", "euadr", "ddi", "i2b2_2010_re", "mednli"]
# where each credentialed / unbundled dataset is obtained, as the missing line must say
WHERE = {"i2b2_2010": "portal.dbmi.hms.harvard.edu", "i2b2_2012": "portal.dbmi.hms.harvard.edu",
         "i2b2_2014": "portal.dbmi.hms.harvard.edu", "i2b2_2010_re": "portal.dbmi.hms.harvard.edu",
         "mednli": "physionet.org/content/mednli", "bc4chemd": "dmis-lab/biobert", "linnaeus": "dmis-lab/biobert",
         "species_800": "dmis-lab/biobert", "gad": "dmis-lab/biobert", "euadr": "dmis-lab/biobert"}
SMOKE = ["--epochs", "1", "--max-examples", "8", "model.dataset.max_seq_length=64"]
_LINE = re.compile(r"^\[(\d+)\] (\S+) seed (\d+): (.*)$")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("hf") / "tiny-megatron-bert")


def _cells(capsys, *argv: str) -> list[tuple[str, int, str]]:
    os.chdir(ROOT)  # the recipes' data_dir (../shared/data/...) is relative to the checkout
    assert main(["benchmark", *argv, "--dry-run"]) == 0
    return [(m.group(2), int(m.group(3)), m.group(4)) for m in map(_LINE.match, capsys.readouterr().out.splitlines())
            if m]


def test_biolm_dry_run_lists_table_1_in_order_with_the_missing_named(model, tmp_path, capsys):
    cells = _cells(capsys, "biolm", "--model", str(model), "--out", str(tmp_path / "s"))
    assert list(dict.fromkeys(k for k, _, _ in cells)) == TABLE1
    assert len(cells) == 18 * 5  # 5 seeds each (paper 004 §5.2), the suite's default seeds
    assert {s for k, s, _ in cells if k == "hoc"} == {10, 42, 1234, 12345, 666}
    for key, where in WHERE.items():
        whats = {w for k, _, w in cells if k == key}
        assert all(w.startswith("missing: ") and where in w for w in whats), (key, whats)
    runnable = {k for k, _, w in cells if not w.startswith("missing: ")}
    assert {"ncbi_disease", "hoc", "chemprot", "ddi"} <= runnable  # in ../shared
    by_key = {k: w for k, _, w in cells}
    # bio-lm's protocol: its recipe where one exists, else the dataset recipe with §5.2's values; GAD by folds
    assert "/ner/biolm/ncbi_disease.yaml" in by_key["ncbi_disease"]
    assert "model.optim.lr=1e-5" in by_key["bc2gm"] and "model.global_batch_size=32" in by_key["bc2gm"]
    assert "model.optim.lr=2e-5" in by_key["ddi"] and "exp_manager.create_early_stopping_callback=true" in by_key["ddi"]


def test_blue_clinical_dry_run_names_the_four_tasks_and_where_to_get_them(model, tmp_path, capsys):
    cells = _cells(capsys, "blue-clinical", "--model", str(model), "--out", str(tmp_path / "c"))
    assert list(dict.fromkeys(k for k, _, _ in cells)) == ["mednli", "i2b2_2010_re", "share_clefe", "clinicalsts"]
    assert len(cells) == 4 * 5
    where = {"mednli": "physionet.org/content/mednli", "i2b2_2010_re": "portal.dbmi.hms.harvard.edu",
             "share_clefe": "physionet.org/content/shareclefehealth2013", "clinicalsts": "portal.dbmi.hms.harvard.edu"}
    for key, w in where.items():
        assert all(what.startswith("missing: ") and w in what for k, _, what in cells if k == key), key


CLINICAL = ROOT / "tests" / "fixtures" / "clinical"


def _data_map(tmp_path: Path, folders: dict[str, Path]) -> str:
    """A --recipe-map giving each dataset its data folder only: the recipe itself runs unchanged."""
    path = tmp_path / "map.json"
    path.write_text(json.dumps({k: {"overrides": [f"model.dataset.data_dir={v}"]} for k, v in folders.items()}))
    return str(path)


def test_clinical_releases_given_as_they_ship_are_cells_to_run(model, tmp_path, capsys):
    """The i2b2 and ShARe/CLEFE recipes name bio-lm's patient-level splits `train` / `dev` of the training release,
    not files: a release unpacked where the recipe map points is runnable; an empty folder is missing, naming the
    release's training folders."""
    releases = {k: CLINICAL / k for k in ("i2b2_2010", "i2b2_2012", "i2b2_2014")}
    cells = _cells(capsys, "biolm", "--model", str(model), "--out", str(tmp_path / "b"), "--seeds", "42",
                   "--datasets", ",".join(releases), "--recipe-map", _data_map(tmp_path, releases))
    assert [(k, w.startswith("missing")) for k, _, w in cells] == [(k, False) for k in releases], cells
    four = {k: CLINICAL / k for k in ("mednli", "i2b2_2010_re", "share_clefe", "clinicalsts")}
    cells = _cells(capsys, "blue-clinical", "--model", str(model), "--out", str(tmp_path / "c"), "--seeds", "42",
                   "--recipe-map", _data_map(tmp_path, four))
    assert [(k, w.startswith("missing")) for k, _, w in cells] == [(k, False) for k in four], cells
    # each with BioELECTRA's protocol: its Table 7 values on its Table 6 ones (layer-wise decay 0.8)
    assert all(f"/bioelectra/{k}.yaml" in w for k, _, w in cells), cells
    empty = tmp_path / "empty"
    empty.mkdir()
    cells = _cells(capsys, "blue-clinical", "--model", str(model), "--out", str(tmp_path / "e"), "--seeds", "42",
                   "--datasets", "share_clefe", "--recipe-map", _data_map(tmp_path, {"share_clefe": empty}))
    ((_, _, what),) = cells
    assert what.startswith(f"missing: {empty / 'Task1TrainSetCorpus199' / 'ALLREPORTS'}, ") and "physionet" in what


@pytest.mark.extended
def test_blue_clinical_runs_the_four_tasks_on_the_synthetic_releases(model, tmp_path):
    """BioELECTRA's four clinical tasks end to end through the suite, each recipe unchanged but for its data folder
    (the synthetic releases of tests/fixtures/clinical)."""
    out = tmp_path / "s"
    four = {k: CLINICAL / k for k in ("mednli", "i2b2_2010_re", "share_clefe", "clinicalsts")}
    argv = ["benchmark", "blue-clinical", "--model", str(model), "--out", str(out), "--seeds", "42",
            "--recipe-map", _data_map(tmp_path, four), *SMOKE]
    assert run_world(1, _suite, argv) == [0]
    res = json.loads((out / "results.json").read_text())
    assert {r["key"]: r["status"] for r in res["datasets"]} == dict.fromkeys(four, "complete")


def test_rows_report_the_median_over_seeds_and_the_group_means_of_the_medians():
    from bio_megatron.benchmark.report import build_results, median_markdown
    from bio_megatron.benchmark.suites import BIOLM

    seeds = (10, 42, 1234, 12345, 666)
    # skewed values: the median differs from the mean for every dataset
    scores = {d.key: dict(zip(seeds, (50.0 + i, 51.0 + i, 52.5 + i, 60.0 + i, 90.0 + i))) for i, d in
              enumerate(BIOLM.datasets)}
    manifest = {"model": "/m/x", "options": {"datasets": TABLE1, "seeds": list(seeds), "grid": False,
                                             "max_examples": None, "epochs": None}}
    cells = [{"index": i, "dataset": d.key, "seed": s, "point": None, "dir": "d", "missing": None,
              "status": "missing" if d.key == "mednli" else "finished",
              "record": {"scores": {d.metric: scores[d.key][s]}, "dev_value": 0.0, "wall_seconds": 1.0, "run_dir": "r"}}
             for i, (d, s) in enumerate((d, s) for d in BIOLM.datasets for s in seeds)]
    res = build_results(BIOLM, manifest, cells)
    median = {k: statistics.median(v.values()) for k, v in scores.items()}
    rows = {r["key"]: r for r in res["datasets"]}
    assert rows["hoc"]["stats"]["score"]["median"] == median["hoc"] == 63.5
    means = {g["name"]: g for g in res["group_means"]}
    clinical = ["i2b2_2010", "i2b2_2012", "i2b2_2014", "i2b2_2010_re"]  # MedNLI missing: said, not averaged
    assert means["Mean (Clinical)"]["mean"] == pytest.approx(sum(median[k] for k in clinical) / 4, abs=1e-12)
    assert means["Mean (Clinical)"]["missing"] == ["mednli"]
    assert means["Mean (Seq. Lab.)"]["mean"] == pytest.approx(statistics.fmean(median[k] for k in TABLE1[:11]))
    assert means["Mean (all)"]["mean"] == pytest.approx(statistics.fmean(median[k] for k in TABLE1 if k != "mednli"))
    md = median_markdown(res)
    assert f"| HOC | Classification | F1 (abstract, BLUE) | **{median['hoc']:.2f}** |" in md
    assert f"| *Mean (Clinical)* (without MedNLI) | | mean of the medians | **{means['Mean (Clinical)']['mean']:.2f}** |" in md


def _suite(argv: list[str]) -> int:
    os.chdir(ROOT)
    return main(argv)


def test_biolm_runs_the_shared_data_end_to_end(model, tmp_path):
    """One NER and one classification task whose data ../shared holds, through the real CLI (forked)."""
    out = tmp_path / "s"
    argv = ["benchmark", "biolm", "--model", str(model), "--out", str(out), "--seeds", "42",
            "--datasets", "ncbi_disease,hoc", *SMOKE]
    assert run_world(1, _suite, argv) == [0]
    res = json.loads((out / "results.json").read_text())
    rows = {r["key"]: r for r in res["datasets"]}
    assert rows["ncbi_disease"]["status"] == rows["hoc"]["status"] == "complete"
    assert rows["mednli"]["status"] == "not selected" and res["statistic"] == "median"
    assert "| NCBI-disease | Sequence labelling | F1 | **" in (out / "results.md").read_text()


@pytest.mark.extended
def test_biolm_runs_every_dataset_in_shared(model, tmp_path, capsys):
    cells = _cells(capsys, "biolm", "--model", str(model), "--out", str(tmp_path / "dry"), "--seeds", "42")
    runnable = [k for k, _, w in cells if not w.startswith("missing: ")]
    out = tmp_path / "s"
    argv = ["benchmark", "biolm", "--model", str(model), "--out", str(out), "--seeds", "42",
            "--datasets", ",".join(runnable), "--epochs", "1", "--max-examples", "64", "model.dataset.max_seq_length=64"]
    assert run_world(1, _suite, argv) == [0]
    res = json.loads((out / "results.json").read_text())
    assert {r["key"] for r in res["datasets"] if r["status"] == "complete"} == set(runnable)


def test_a_pretraining_run_is_scored_at_each_saved_step_with_the_plot(pubmed_prefix, tmp_path):
    from engine.pretrain_runs import overrides, pretrain_rank

    run_world(1, pretrain_rank, overrides(pubmed_prefix, tmp_path, "pt", steps=2, every=1, save_last=True))
    run = tmp_path / "pt"
    assert sorted(p.name for p in (run / "checkpoints").glob("iter_*")) == ["iter_0000001", "iter_0000002"]
    out = tmp_path / "steps_suite"
    argv = ["benchmark", "biolm", "--model", str(run), "--out", str(out), "--seeds", "42", "--datasets", "ncbi_disease",
            "--epochs", "1", "--max-examples", "8", "model.dataset.max_seq_length=32"]
    assert run_world(1, _suite, argv) == [0]
    steps = json.loads((out / "steps.json").read_text())
    assert [r["step"] for r in steps["steps"]] == [1, 2]
    assert all(isinstance(r["scores"]["ncbi_disease"], float) for r in steps["steps"])
    assert [r["checkpoint"] for r in steps["steps"]] == [str(run / "checkpoints" / f"iter_000000{s}") for s in (1, 2)]
    assert (out / "steps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 2 | " in (out / "steps.md").read_text()
    # the report rebuilds the same summary from the per-step suites
    before = (out / "steps.json").read_text()
    assert main(["benchmark", "report", str(out)]) == 0
    assert (out / "steps.json").read_text() == before


def test_gad_cell_is_the_median_over_folds_2_to_10(model, tmp_path):
    """bio-lm's GAD protocol through the suite: one cell runs `finetune --folds 1-10` (tuned on fold 1) and reports
    the median test score of folds 2-10, as benchmark/kfold.py computes it."""
    rows = (ROOT / "tests" / "fixtures" / "blurb" / "GAD" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]
    data = tmp_path / "GAD"
    for fold in range(1, 11):  # BioBERT's layout: <fold>/train.tsv (no header, no index), <fold>/test.tsv
        d = data / str(fold)
        d.mkdir(parents=True)
        test = rows[fold % 4::2][:8]  # different test rows per fold: different scores
        (d / "train.tsv").write_text("".join(r.split("\t", 1)[1] + "\n" for r in rows[:16]), encoding="utf-8")
        (d / "test.tsv").write_text("index\tsentence\tlabel\n" + "".join(r + "\n" for r in test), encoding="utf-8")
    rmap = tmp_path / "map.yaml"
    rmap.write_text(json.dumps({"gad": {"overrides": [f"model.dataset.data_dir={data}"]}}))
    out = tmp_path / "s"
    argv = ["benchmark", "biolm", "--model", str(model), "--out", str(out), "--seeds", "42", "--datasets", "gad",
            "--recipe-map", str(rmap), "--epochs", "1", "--max-examples", "8", "model.dataset.max_seq_length=32"]
    assert run_world(1, _suite, argv) == [0]
    folds = json.loads((out / "cells" / "gad" / "seed42" / "run" / "results.json").read_text())
    assert folds["protocol"] == "k-fold" and [r["fold"] for r in folds["folds"]] == list(range(1, 11))
    reported = [r["test"] for r in folds["folds"] if not r["tuning"]]
    cell = json.loads((out / "cells" / "gad" / "seed42" / "cell.json").read_text())
    assert cell["scores"]["score"] == pytest.approx(100 * statistics.median(reported), abs=1e-9)


def test_hoc_cell_reports_blues_abstract_level_f(model, tmp_path, capsys):
    """bio-lm reports HoC with BLUE's abstract-level F (paper 004 §3), not BLURB's micro F1: the HoC cell's score is
    `evaluate hoc --metric blue` on the run's test predictions, and the cell records that command."""
    fixture = ROOT / "tests" / "fixtures" / "blurb" / "HoC" / "test.tsv"
    data = tmp_path / "my data" / "HoC"  # a space: the recorded command must still paste into a shell
    data.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv", "test.tsv"):  # 7 sentences of 2 abstracts: --max-examples 8 keeps them all
        (data / name).write_text(fixture.read_text(encoding="utf-8"), encoding="utf-8")
    rmap = tmp_path / "map.yaml"
    rmap.write_text(json.dumps({"hoc": {"overrides": [f"model.dataset.data_dir={data}"]}}))
    out = tmp_path / "s"
    argv = ["benchmark", "biolm", "--model", str(model), "--out", str(out), "--seeds", "42", "--datasets", "hoc",
            "--recipe-map", str(rmap), *SMOKE]
    assert run_world(1, _suite, argv) == [0]
    cell = json.loads((out / "cells" / "hoc" / "seed42" / "cell.json").read_text())
    evaluation = cell["evaluation"]
    assert evaluation["command"].startswith("bio-megatron evaluate hoc --gold ")
    assert evaluation["command"].endswith(" --metric blue"), evaluation
    argv = shlex.split(evaluation["command"])  # as a shell reads the line
    assert argv[:5] == ["bio-megatron", "evaluate", "hoc", "--gold", str(data / "test.tsv")], argv
    capsys.readouterr()
    assert main(argv[1:]) == 0
    blue = json.loads(capsys.readouterr().out)
    assert cell["scores"]["score"] == pytest.approx(100 * blue["score"], abs=1e-9)
    assert "F1 (abstract, BLUE)" in (out / "results.md").read_text()
