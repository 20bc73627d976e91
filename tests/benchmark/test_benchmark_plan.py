"""The suites without training: the cells ``--dry-run`` lists for both protocols (with their commands, the
missing ones and why, the SLURM arrays), the folder's refusals (other options, a second suite, a foreign
folder), recipe-map errors, and the numbers of the tables on synthetic cells against numpy and by hand."""

from __future__ import annotations

import json
import os
import statistics

import numpy as np
import pytest

from suite_files import ROOT, write_map

from bio_megatron.cli import main


def _dry(capsys, *argv: str) -> list[str]:
    assert main(["benchmark", *argv, "--dry-run"]) == 0
    return capsys.readouterr().out.splitlines()


def _err(caplog) -> str:
    text = caplog.text  # errors go through the project's one logger
    caplog.clear()
    return text


def _model(tmp_path):
    m = tmp_path / "model"
    m.mkdir()
    (m / "config.json").write_text("{}")  # an HF folder as far as the plan looks; nothing here loads it
    return m


def test_dry_run_lists_the_blurb_cells(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = _dry(capsys, "blurb", "--model", str(_model(tmp_path)), "--out", str(tmp_path / "s"), "--seeds", "1,2",
               "--max-examples", "8", "--epochs", "1", "trainer.precision=32")
    cells = [ln for ln in out if ln.startswith("[")]
    assert len(cells) == 26  # 13 datasets x 2 seeds, no grid by default
    keys = [ln.split("]")[1].split()[0] for ln in cells[::2]]
    assert keys == ["bc5cdr_chem", "bc5cdr_disease", "ncbi_disease", "bc2gm", "jnlpba", "ebm_pico", "chemprot", "ddi",
                    "gad", "biosses", "hoc", "pubmedqa", "bioasq_yesno"]
    gad = next(ln for ln in cells if "] gad seed 2:" in ln)
    for piece in ("bio-megatron finetune classify --config", "nemo_configs/classify/gad.yaml", "trainer.seed=2",
                  "model.dataset.max_train_examples=8", "model.dataset.max_eval_examples=8", "trainer.max_epochs=1",
                  "trainer.precision=32", f"exp_manager.exp_dir={tmp_path / 's' / 'cells' / 'gad' / 'seed2'}",
                  f"model.restore_from_path={tmp_path / 'model'}"):
        assert piece in gad, (piece, gad)
    # BioASQ's data needs registration: its recipe has ??? for the files, so it is missing, with the why
    yesno = [ln for ln in cells if "bioasq_yesno" in ln]
    assert all("missing: the recipe does not load: model.dataset.data_dir is mandatory" in ln and "registration" in ln
               for ln in yesno)
    summary = next(ln for ln in out if ln.startswith("SLURM:"))
    n_run = sum("missing:" not in ln for ln in cells)
    assert f"SLURM: {n_run} array task(s)" in summary
    assert any("sbatch --parsable --array=" in ln and "slurm/benchmark.sbatch blurb" in ln for ln in out)


def _qa_map(tmp_path, extra: dict | None = None):
    """SQuAD and BioASQ pointed at files that exist (nothing reads them before training)."""
    qa = tmp_path / "qa"
    qa.mkdir()
    for f in ("t.json", "s.json", "g.json", "sq.json"):
        (qa / f).write_text("{}")
    return write_map(tmp_path / "map.yaml", {
        "squad_v1": {"overrides": [f"model.dataset.data_dir={qa}", "model.dataset.train_file=sq.json",
                                   "model.dataset.dev_file=sq.json"]},
        "bioasq_factoid": {"overrides": [f"model.dataset.data_dir={qa}", "model.dataset.train_file=t.json",
                                         "model.dataset.test_file=s.json", f"model.dataset.bioasq_golden={qa}/g.json"]},
        **(extra or {})})


def test_dry_run_lists_the_paper_cells_grid_and_chain(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rmap = _qa_map(tmp_path, {"ncbi_disease": {"overrides": [f"model.dataset.data_dir={tmp_path / 'absent'}"]}})
    out = _dry(capsys, "paper", "--model", str(_model(tmp_path)), "--out", str(tmp_path / "p"), "--seeds", "3,4",
               "--recipe-map", str(rmap))
    cells = [ln for ln in out if ln.startswith("[")]
    # 4 datasets of Table 1 and SQuAD: 2 x 2 head grid x 2 seeds each; BioASQ: one per SQuAD cell, listed last
    assert len(cells) == 5 * 8 + 8
    chem = [ln for ln in cells if "] bc5cdr_chem " in ln]
    assert {ln.split(":")[0].split(" ", 1)[1] for ln in chem} == {
        f"bc5cdr_chem seed {s} layers{n}_width{w}" for s in (3, 4) for n in (1, 2) for w in (512, 1024)}
    assert "model.head.num_fc_layers=2 model.fc_hidden_size=1024" in next(ln for ln in chem if "layers2_width1024" in ln)
    re_cell = next(ln for ln in cells if "] chemprot seed 3 layers1_width512" in ln)
    assert "model.classifier_head.num_output_layers=1 model.fc_hidden_size=512" in re_cell
    assert all("missing:" in ln and str(tmp_path / "absent") in ln for ln in cells if "ncbi_disease" in ln)
    bio = [ln for ln in cells if "bioasq_factoid" in ln]
    assert cells[-8:] == bio  # after every SQuAD cell
    squad_dir = tmp_path / "p" / "cells" / "squad_v1" / "layers2_width2048" / "seed4"
    assert f"model.restore_from_path={squad_dir}/run/seed4/checkpoints" in next(
        ln for ln in bio if "seed 4 layers2_width2048" in ln)
    summary = next(ln for ln in out if ln.startswith("SLURM:"))
    assert "SLURM: 32 + 8 array task(s)" in summary and "(0-15,24-39; 40-47)" in summary  # NCBI (16-23) missing
    deps = [ln for ln in out if "--dependency=afterany:" in ln]
    assert len(deps) == 2 and "--array=40-47" in deps[0] and "benchmark report" in deps[1]


def test_prerequisites_are_added_and_bad_options_are_one_line(tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.chdir(ROOT)
    m = str(_model(tmp_path))
    out = _dry(capsys, "paper", "--model", m, "--out", str(tmp_path / "p"), "--datasets", "bioasq_factoid",
               "--no-grid", "--seeds", "1")
    assert [ln.split(":")[0] for ln in out if ln.startswith("[")] == ["[0] squad_v1 seed 1", "[1] bioasq_factoid seed 1"]
    cases = [(["--datasets", "nope"], "--datasets: nope not in suite paper"),
             (["--seeds", "1,x"], "--seeds '1,x': expected comma-separated integers"),
             (["--max-examples", "0"], "--max-examples (0) must be >= 1"),
             (["exp_manager.exp_dir=/x"], "exp_manager.exp_dir: set by the suite"),
             (["--cell", "999"], "--cell 999: the suite has cells 0-")]
    for extra, message in cases:
        assert main(["benchmark", "paper", "--model", m, "--out", str(tmp_path / "p"), *extra]) == 2
        assert message in _err(caplog), extra
    assert main(["benchmark", "paper", "--model", str(tmp_path / "none")]) == 2
    assert "--model" in _err(caplog)
    bad = tmp_path / "bad.yaml"
    bad.write_text("gad: {recipe: tiny_classify, overrides: not-a-list}\n")
    assert main(["benchmark", "blurb", "--model", m, "--recipe-map", str(bad), "--dry-run"]) == 2
    assert "gad.overrides: expected a list of key=value strings" in _err(caplog)


def test_the_folder_refuses_other_options_a_second_suite_and_foreign_files(tmp_path, capsys, caplog, monkeypatch):
    """Everything here fails or finishes before any cell runs: --strict with a missing cell, a lock held."""
    from bio_megatron.utils.lock import exclusive_lock

    monkeypatch.chdir(ROOT)
    m, out = str(_model(tmp_path)), tmp_path / "s"
    base = ["benchmark", "blurb", "--model", m, "--out", str(out), "--datasets", "bioasq_yesno", "--seeds", "1"]
    assert main(base + ["--strict"]) == 2  # missing + --strict: nothing written
    assert "--strict: cell 0 bioasq_yesno seed 1: missing" in _err(caplog) and not out.exists()
    assert main(base) == 0  # only a missing cell: the suite "runs", reports it, and succeeds
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["seeds"] == [1] and manifest["model_kind"] == "hf"
    assert "missing: the recipe does not load" in (out / "results.md").read_text()
    capsys.readouterr()
    assert main(base[:-1] + ["1,2", "--dry-run"]) == 0
    assert "running needs --overwrite" in capsys.readouterr().out
    assert main(base[:-1] + ["1,2"]) == 2
    err = _err(caplog)
    assert "holds a suite run with other settings" in err and "seeds: [1] (this run: [1, 2])" in err
    assert main(base[:-1] + ["1,2", "--overwrite"]) == 0
    assert json.loads((out / "manifest.json").read_text())["options"]["seeds"] == [1, 2]
    with exclusive_lock(out / "suite.lock", "test"):
        assert main(base[:-1] + ["1,2"]) == 2
    assert "is in use by PID" in _err(caplog)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("x")
    assert main(base[:4] + ["--out", str(foreign)] + base[6:]) == 2
    assert "not a benchmark suite folder" in _err(caplog) and (foreign / "thesis.tex").exists()


def test_launcher_slurm_submits_the_arrays_then_the_report(tmp_path, capsys, monkeypatch):
    """With a stand-in for sbatch on PATH (it records its arguments and answers job ids 101, 102, ...)."""
    monkeypatch.chdir(ROOT)
    fake, calls = tmp_path / "bin", tmp_path / "sbatch.calls"
    fake.mkdir()
    (fake / "sbatch").write_text(f'#!/bin/sh\necho "$*" >> {calls}\necho "$((100 + $(wc -l < {calls})));cluster"\n')
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    out, rmap = tmp_path / "s", _qa_map(tmp_path)
    assert main(["benchmark", "paper", "--model", str(_model(tmp_path)), "--out", str(out), "--recipe-map", str(rmap),
                 "--datasets", "bioasq_factoid", "--seeds", "1,2", "--no-grid", "--launcher", "slurm",
                 "--sbatch-args", "--account=A --time=1:00:00"]) == 0
    assert capsys.readouterr().out.startswith("submitted: 101 102 103")
    first, second, report = calls.read_text().splitlines()
    suite_args = (f"slurm/benchmark.sbatch paper --model {tmp_path / 'model'} --out {out} --datasets "
                  f"squad_v1,bioasq_factoid --seeds 1,2 --no-grid --recipe-map {rmap}")
    assert first == f"--parsable --array=0-1 --account=A --time=1:00:00 {suite_args}"
    assert second == f"--parsable --array=2-3 --dependency=afterany:101 --account=A --time=1:00:00 {suite_args}"
    assert "--dependency=afterany:101:102" in report and report.endswith(f"-m bio_megatron benchmark report {out}")
    assert json.loads((out / "manifest.json").read_text())["options"]["seeds"] == [1, 2]
    assert len(json.loads((out / "plan.json").read_text())["cells"]) == 4


def _synthetic(suite, seeds, scores) -> tuple[dict, list[dict]]:
    """A manifest and finished cells with the given per-(dataset, seed) headline scores."""
    manifest = {"model": "/m/x", "options": {"datasets": [d.key for d in suite.datasets], "seeds": list(seeds),
                                             "grid": False, "max_examples": None, "epochs": None}}
    cells = []
    for d in suite.datasets:
        for seed in seeds:
            value = scores[d.key][seed]
            rec = {"scores": {**{k: value for k, _ in d.columns}, d.metric: value}, "dev_value": value,
                   "wall_seconds": 1.0, "run_dir": "r"}
            cells.append({"index": len(cells), "dataset": d.key, "seed": seed, "point": None, "dir": "d",
                          "status": "finished", "record": rec, "missing": None})
    return manifest, cells


def test_blurb_score_is_the_macro_average_of_task_type_averages():
    from bio_megatron.benchmark.report import blurb_markdown, build_results
    from bio_megatron.benchmark.suites import BLURB

    rng = np.random.default_rng(0)
    seeds = (1, 2, 3)
    scores = {d.key: {s: float(rng.uniform(50, 95)) for s in seeds} for d in BLURB.datasets}
    res = build_results(BLURB, *_synthetic(BLURB, seeds, scores))
    # by hand: BLURB's six task types and the mean over seeds of each dataset
    mean = {k: sum(v.values()) / len(v) for k, v in scores.items()}
    types = {"ner": ["bc5cdr_chem", "bc5cdr_disease", "ncbi_disease", "bc2gm", "jnlpba"], "pico": ["ebm_pico"],
             "re": ["chemprot", "ddi", "gad"], "ss": ["biosses"], "doc": ["hoc"], "qa": ["pubmedqa", "bioasq_yesno"]}
    by_type = [sum(mean[k] for k in ks) / len(ks) for ks in types.values()]
    assert res["blurb_score"] == pytest.approx(sum(by_type) / 6, abs=1e-12)
    assert [t["average"] for t in res["task_types"]] == pytest.approx(by_type, abs=1e-12)
    # the micro average over datasets is a different number: the score is not that
    assert abs(res["blurb_score"] - sum(mean.values()) / 13) > 1e-6
    md = blurb_markdown(res)
    assert f"| **BLURB score** | | macro average of the task-type averages | **{res['blurb_score']:.2f}** |" in md
    assert "| PICO Extraction | EBM PICO | Macro F1 word-level |" in md and "| Sentence Similarity | BIOSSES | Pearson |" in md
    # one dataset without results: no BLURB score, a partial one over what is there
    manifest, cells = _synthetic(BLURB, seeds, scores)
    cells = [dict(c, status="missing", missing="no data") if c["dataset"] == "hoc" else c for c in cells]
    part = build_results(BLURB, manifest, cells)
    assert part["blurb_score"] is None
    assert part["blurb_score_partial"] == pytest.approx(sum(by_type[:4] + by_type[5:]) / 5, abs=1e-12)


def test_spread_equals_numpy_and_the_grid_point_is_chosen_on_dev():
    from bio_megatron.benchmark.report import build_results
    from bio_megatron.benchmark.suites import PAPER

    rng = np.random.default_rng(1)
    seeds = (10, 42, 7)
    manifest = {"model": "/m/x", "options": {"datasets": ["bc5cdr_chem"], "seeds": list(seeds), "grid": True}}
    cells, dev = [], {(1, 512): 80.0, (2, 1024): 85.0}  # mean dev: the second point wins
    for point, base in dev.items():
        for s in seeds:
            p, r, f = (float(x) for x in rng.uniform(70, 90, 3))
            cells.append({"index": len(cells), "dataset": "bc5cdr_chem", "seed": s, "point": list(point), "dir": "d",
                          "status": "finished", "missing": None, "record": {
                              "scores": {"precision": p, "recall": r, "f1": f}, "dev_value": base + s / 100,
                              "wall_seconds": 1.0, "run_dir": "r"}})
    row = build_results(PAPER, manifest, cells)["datasets"][0]
    assert row["selected"]["num_fc_layers"] == 2 and row["selected"]["fc_hidden_size"] == 1024
    chosen = [c["record"]["scores"] for c in cells if c["point"] == [2, 1024]]
    for k in ("precision", "recall", "f1"):
        x = np.array([c[k] for c in chosen])
        st = row["stats"][k]
        assert st["mean"] == pytest.approx(np.mean(x), abs=1e-12)
        assert st["median"] == pytest.approx(np.median(x), abs=1e-12)
        assert st["std"] == pytest.approx(np.std(x, ddof=1), abs=1e-12)  # sample s.d., as statistics.stdev
        assert (st["min"], st["max"], st["n"]) == (x.min(), x.max(), 3)
    assert row["selected"]["dev_mean"] == pytest.approx(statistics.fmean(c["record"]["dev_value"] for c in cells[3:]))


def test_paper_tables_give_the_models_parameters_and_vocabulary(tmp_path):
    """The tiny suite model (a random MegatronBert saved by transformers): its parameter count is transformers'
    own count plus the rows Megatron pads the vocabulary with (word embedding and MLM output bias, h + 1 each)."""
    from suite_files import make_model
    from transformers import MegatronBertForMaskedLM

    from bio_megatron.benchmark.report import build_results, model_facts, paper_markdown
    from bio_megatron.benchmark.suites import PAPER

    model = make_model(tmp_path / "tiny")
    hf = MegatronBertForMaskedLM.from_pretrained(model)
    vocab, h = hf.config.vocab_size, hf.config.hidden_size
    padded = -(-vocab // 128) * 128  # Megatron's make_vocab_size_divisible_by 128
    facts = model_facts(model)
    assert facts["parameters"] == hf.num_parameters() + (padded - vocab) * (h + 1)
    assert (facts["vocab_size"], facts["padded_vocab_size"]) == (28_996, padded)
    assert facts["vocabulary"] == "BERT-cased (28,996)" and facts["parameters_text"] == "1.0m"
    scores = {d.key: {1: 80.0, 2: 82.0} for d in PAPER.datasets}
    manifest, cells = _synthetic(PAPER, (1, 2), scores)
    md = paper_markdown(build_results(PAPER, manifest, cells, facts))
    assert "| Benchmark | Model | #Parameters | Vocabulary | Prec | Rec | F1 | Seeds |" in md
    assert "| ChemProt | x | 1.0m | BERT-cased (28,996) | 81.00 ± 1.41 (median 81.00) |" in md
    assert f"({facts['parameters']:,} parameters, vocabulary BERT-cased (28,996))" in md
    assert model_facts(_model(tmp_path)) is None  # an unreadable model leaves the columns empty
    assert "| ChemProt | x |  |  | 81.00" in paper_markdown(build_results(PAPER, manifest, cells, None))


def test_default_seeds_are_the_publications_runs_per_dataset(tmp_path, capsys, monkeypatch):
    """Without --seeds, BLURB runs ten seeds for BIOSSES, PubMedQA and BioASQ and five for the others (Gu et al.
    2021, sec. 2.5); the paper suite five everywhere (its paper states none)."""
    from bio_megatron.benchmark.suites import BLURB, DEFAULT_SEEDS

    monkeypatch.chdir(ROOT)
    out = _dry(capsys, "blurb", "--model", str(_model(tmp_path)), "--out", str(tmp_path / "s"))
    cells = [ln.split("]")[1].split(":")[0].split() for ln in out if ln.startswith("[")]  # key, "seed", seed
    per: dict = {}
    for key, _, seed in cells:
        per.setdefault(key, []).append(int(seed))
    ten = {"biosses", "pubmedqa", "bioasq_yesno"}
    assert set(per) == {d.key for d in BLURB.datasets}
    assert all(per[k] == list(DEFAULT_SEEDS[:10 if k in ten else 5]) for k in per), per
    paper = _dry(capsys, "paper", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "p"),
                 "--datasets", "chemprot", "--no-grid")
    assert [ln.split(":")[0].split("seed ")[1] for ln in paper if ln.startswith("[")] == [
        str(s) for s in DEFAULT_SEEDS[:5]]
