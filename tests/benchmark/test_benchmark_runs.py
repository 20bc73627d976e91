"""``benchmark paper`` and ``benchmark blurb`` end to end on CPU (tiny recipes, real data slices, a random
MegatronBert in an HF folder as the model): every cell fine-tunes through the real CLI and is scored, both
tables come out with the right rows; a suite killed (SIGKILL) after its first cell resumes without redoing it;
``report`` rebuilds byte-identical files; the tables' statistics equal numpy's on the cells' numbers; the
SLURM array script runs a cell and the report.

The suite runs in a forked process of this one (tests/harness.py), exactly ``bio-megatron benchmark ...``
minus the interpreter start, so the cells fork from a process that has torch and megatron-core imported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from harness import run_world, start_world
from suite_files import ROOT, blurb_map, make_model, paper_map, write_map

SMOKE = ["--no-grid", "--epochs", "1", "--max-examples", "16"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("hf") / "tiny-megatron-bert")


def _suite(argv: list[str]) -> int:
    from bio_megatron.cli import main

    os.chdir(ROOT)
    return main(argv)


def _suite_seeing_a_gpu(argv: list[str]) -> int:
    """The suite as on a GPU machine, where its local cells are processes of their own (a fork after megatron-core's
    import has initialised CUDA could not use the GPU): torch.cuda.is_available() is True here, in the suite only;
    each cell's fresh interpreter sees this machine as it is and trains on the CPU."""
    import torch

    torch.cuda.is_available = lambda: True
    return _suite(argv)


def _launches(cell: Path) -> int:
    """How many times the cell's fine-tuning was started (each start writes its command line first)."""
    log = cell / "finetune.log"
    return sum(ln.startswith("$ bio-megatron finetune") for ln in log.read_text().splitlines()) if log.exists() else 0


def test_paper_suite_killed_after_a_cell_resumes_without_redoing_it(model, tmp_path):
    rmap = write_map(tmp_path / "map.yaml", {**paper_map(tmp_path),
                                             "ncbi_disease": {"overrides": [f"model.dataset.data_dir={tmp_path / 'absent'}"]}})
    out = tmp_path / "suite"
    argv = ["benchmark", "paper", "--model", str(model), "--out", str(out), "--recipe-map", str(rmap), "--seeds", "42",
            "--datasets", "bc5cdr_chem,ncbi_disease,chemprot,bioasq_factoid", *SMOKE]
    first = out / "cells" / "bc5cdr_chem" / "seed42"
    world = start_world(1, _suite, argv)
    suite = psutil.Process(world.procs[0].pid)
    deadline = time.time() + 240
    second = out / "cells" / "chemprot" / "seed42"
    while not ((first / "cell.json").exists() and (second / "finetune.log").exists()) and time.time() < deadline:
        time.sleep(0.02)
    running = suite.children(recursive=True)  # the next cell's fine-tuning, just started
    suite.kill()  # SIGKILL to the suite process alone, as `kill -9 <pid>`
    world.procs[0].join(30)
    try:  # its running cell does not run on unseen (parent-death signal): it stops, its run does not finish
        gone, alive = psutil.wait_procs(running, timeout=60)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], [p.cmdline() for p in alive]
    finally:
        world.kill()
    assert running and not (second / "run" / "seed42" / "results.json").exists()
    assert (first / "cell.json").exists(), "the first cell did not finish in time"
    assert not (out / "results.md").exists()  # killed before the end
    before = {f: f.stat().st_mtime_ns for f in (first / "cell.json", first / "run" / "seed42" / "results.json")}
    plan = {(c["dataset"], c["seed"]): c["index"] for c in json.loads((out / "plan.json").read_text())["cells"]}

    # a cell that continues from an unfinished one does not start; --cell runs exactly one cell, no report
    assert run_world(1, _suite, argv + ["--cell", str(plan["bioasq_factoid", 42])]) == [1]
    assert not (out / "cells" / "bioasq_factoid" / "seed42" / "finetune.log").exists()
    assert run_world(1, _suite, argv + ["--cell", str(plan["squad_v1", 42])]) == [0]
    assert (out / "cells" / "squad_v1" / "seed42" / "cell.json").exists() and not (out / "results.md").exists()

    assert run_world(1, _suite, argv) == [0]  # the rerun finishes the suite
    assert {f: f.stat().st_mtime_ns for f in before} == before and _launches(first) == 1
    assert _launches(out / "cells" / "squad_v1" / "seed42") == 1
    assert _launches(out / "cells" / "chemprot" / "seed42") >= 1

    md = (out / "results.md").read_text()
    res = json.loads((out / "results.json").read_text())
    rows = {r["key"]: r for r in res["datasets"]}
    assert [r["key"] for r in res["datasets"]] == ["bc5cdr_chem", "bc5cdr_disease", "ncbi_disease", "chemprot",
                                                  "squad_v1", "bioasq_factoid"]
    assert (rows["bc5cdr_disease"]["status"], rows["ncbi_disease"]["status"]) == ("not selected", "missing")
    assert str(tmp_path / "absent") in rows["ncbi_disease"]["reason"]
    for key, cols in (("bc5cdr_chem", ("precision", "recall", "f1")), ("chemprot", ("precision", "recall", "f1")),
                      ("bioasq_factoid", ("strict_accuracy", "lenient_accuracy", "mrr")), ("squad_v1", ("exact_match", "f1"))):
        assert rows[key]["status"] == "complete" and set(rows[key]["stats"]) >= set(cols), key
        cell = json.loads((out / "cells" / key / "seed42" / "cell.json").read_text())
        raw = cell["raw"][rows[key]["split"]]
        factor = 100.0 if key in ("chemprot", "bioasq_factoid") else 1.0  # ChemProt and BioASQ score fractions
        for k in cols:  # one seed: the table's mean is the run's own score on the 0-100 scale
            assert rows[key]["stats"][k]["mean"] == pytest.approx(raw[k] * factor, abs=1e-9)
    head = "| Benchmark | Model | #Parameters | Vocabulary |"
    assert f"{head} Prec | Rec | F1 | Seeds |" in md and f"{head} SAcc | LAcc | MRR | Seeds |" in md
    assert f"{head} EM | F1 | Seeds |" in md
    for title in ("BC5CDR-chem", "ChemProt", "BioASQ-7b factoid", "SQuAD v1.1"):
        line = next(ln for ln in md.splitlines() if ln.startswith(f"| {title} | {model.name} |"))
        assert "±" not in line and "median" not in line and line.endswith(" | 1 |"), line  # one seed: no spread
    # the tiny model's parameters and vocabulary (test_benchmark_plan.py checks the count against transformers')
    assert "| NCBI-disease | tiny-megatron-bert | 1.0m | BERT-cased (28,996) | missing: " in md
    assert "| BC5CDR-disease |" in md

    saved = {n: (out / n).read_bytes() for n in ("results.json", "results.md")}
    for n in saved:
        (out / n).unlink()
    from bio_megatron.cli import main  # report: pure reading and writing, fine in this process

    assert main(["benchmark", "report", str(out)]) == 0
    assert {n: (out / n).read_bytes() for n in saved} == saved


def test_sigusr1_stops_the_cell_which_the_rerun_continues(model, tmp_path):
    """SLURM's time-limit warning: the suite passes USR1 to the fine-tuning, which saves <run>/resume and exits;
    the suite stops with 75 and the rerun continues that fine-tuning instead of starting it again. Both ways a
    local cell starts: the stopped run as a process of its own (as on a GPU machine: ``_suite_seeing_a_gpu``),
    the rerun forked (no GPU)."""
    out = tmp_path / "suite"
    argv = ["benchmark", "paper", "--model", str(model), "--out", str(out), "--datasets", "bc5cdr_chem", "--seeds", "42",
            "--recipe-map", str(write_map(tmp_path / "map.yaml", paper_map(tmp_path))), "--no-grid",
            "--epochs", "20", "--max-examples", "32", "trainer.val_check_interval=1000"]  # 80 steps, dev at the end
    cell = out / "cells" / "bc5cdr_chem" / "seed42"
    world = start_world(1, _suite_seeing_a_gpu, argv)
    deadline = time.time() + 240
    while "step 1/80" not in ((cell / "finetune.log").read_text() if (cell / "finetune.log").exists() else "") \
            and time.time() < deadline:
        time.sleep(0.05)
    kids = [" ".join(c.cmdline()) for c in psutil.Process(world.procs[0].pid).children()]
    assert any("-m bio_megatron finetune" in k for k in kids), kids  # not a fork of the suite
    os.kill(world.procs[0].pid, signal.SIGUSR1)  # the suite process only, as the batch shell signals it
    assert world.join(120) == [75]
    assert (cell / "run" / "seed42" / "resume").is_dir() and not (cell / "cell.json").exists()
    assert run_world(1, _suite, argv) == [0]  # no GPU seen: the continuing cell is forked
    log = (cell / "finetune.log").read_text()
    assert _launches(cell) == 2 and "resumed fine-tuning from" in log
    assert json.loads((cell / "cell.json").read_text())["raw"]["test"]["f1"] >= 0


def test_blurb_suite_end_to_end_with_the_evaluators(model, tmp_path):
    out = tmp_path / "suite"
    argv = ["benchmark", "blurb", "--model", str(model), "--out", str(out), "--seeds", "1,2",
            "--recipe-map", str(write_map(tmp_path / "map.yaml", blurb_map())),
            "--datasets", "gad,biosses,bioasq_yesno", *SMOKE]
    assert run_world(1, _suite, argv) == [0]
    res = json.loads((out / "results.json").read_text())
    rows = {r["key"]: r for r in res["datasets"]}
    for key in ("gad", "biosses"):
        cells = [json.loads((out / "cells" / key / f"seed{s}" / "cell.json").read_text()) for s in (1, 2)]
        for c in cells:  # `evaluate <task>` on the run's test predictions against the gold file = the run's score
            assert c["evaluation"]["command"].startswith(f"bio-megatron evaluate {key} --gold ")
            assert c["evaluation"]["score"] == pytest.approx(c["raw"]["test"]["score"], abs=1e-12)
        x = np.array([c["scores"]["score"] for c in cells])
        st = rows[key]["stats"]["score"]
        assert (st["mean"], st["median"], st["std"]) == pytest.approx((np.mean(x), np.median(x), np.std(x, ddof=1)))
    assert rows["bioasq_yesno"]["status"] == "missing" and "registration" in rows["bioasq_yesno"]["reason"]
    types = {t["task_type"]: t["average"] for t in res["task_types"]}
    assert types["Relation Extraction"] == pytest.approx(rows["gad"]["stats"]["score"]["mean"])
    assert types["Question Answering"] is None and res["blurb_score"] is None
    assert res["blurb_score_partial"] == pytest.approx((types["Relation Extraction"] + types["Sentence Similarity"]) / 2)
    md = (out / "results.md").read_text()
    assert "| Task type | Dataset | Metric | Score (mean ± s.d.) | Median | Seeds |" in md
    assert "|  | GAD | Micro F1 |" in md and "| Sentence Similarity | BIOSSES | Pearson |" in md
    assert "|  | BioASQ | Accuracy | missing: the recipe does not load" in md
    assert "| **BLURB score (partial: not every dataset complete)** |" in md

    # the SLURM array script: a task runs its cell (done here: nothing to redo), a job without --array the report
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text("#!/bin/sh\necho localhost\n")  # `scontrol show hostnames` of a 1-node job
    (fake / "scontrol").chmod(0o755)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, "PATH": f"{fake}:{os.environ['PATH']}",
           "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "localhost", "SLURM_NNODES": "1", "LAUNCHER": "local",
           "GPUS_PER_NODE": "1", "VENV": str(ROOT / ".venv")}
    script = ["bash", str(ROOT / "slurm" / "benchmark.sbatch")]
    res = subprocess.run(script + argv[1:], env={**env, "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "7"},
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "--cell 0 --launcher local --nproc-per-node 1" in res.stdout and "cell 0 complete: 1/1 cells done" in res.stderr
    before = (out / "results.md").read_bytes()
    (out / "results.md").unlink()
    res = subprocess.run(script + ["report", str(out)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "results.md").read_bytes() == before


@pytest.mark.parametrize("env, message", [
    ({}, "not inside a SLURM job"),
    ({"SLURM_JOB_ID": "7", "LAUNCHER": "mpirun"}, "LAUNCHER must be srun, torchrun or local, got 'mpirun'"),
    ({"SLURM_JOB_ID": "7", "VENV": "/nonexistent"}, "VENV '/nonexistent' is not a virtual environment"),
])
def test_benchmark_sbatch_fails_fast(env, message):
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    script = ROOT / "slurm" / "benchmark.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    res = subprocess.run(["bash", str(script), "paper", "--model", "x"], cwd=ROOT, env={**base, **env},
                         capture_output=True, text=True, timeout=30)
    assert res.returncode != 0 and message in res.stderr, (res.returncode, res.stderr)


@pytest.mark.slow
@pytest.mark.extended  # the fuller variant of test_blurb_suite_end_to_end_with_the_evaluators and the
# paper-suite runs above (every fixture dataset, 2 seeds, the head grid): 15 s of the default suite's budget
def test_fuller_blurb_and_paper_runs(model, tmp_path):
    """BLURB over every dataset with a fixture (2 seeds), and the paper's protocol with its head grid (2 points
    x 2 seeds): the chosen point is the best mean dev one."""
    from suite_files import blurb_full_map

    blurb = tmp_path / "blurb"
    chosen = ",".join([*blurb_full_map(), "ebm_pico", "bioasq_yesno"])  # not ../shared's sets: same on any machine
    assert run_world(1, _suite, ["benchmark", "blurb", "--model", str(model), "--out", str(blurb), "--seeds", "1,2",
                                 "--recipe-map", str(write_map(tmp_path / "b.yaml", blurb_full_map())),
                                 "--datasets", chosen, *SMOKE]) == [0]
    res = json.loads((blurb / "results.json").read_text())
    status = {r["key"]: r["status"] for r in res["datasets"]}
    assert {k for k, v in status.items() if v == "complete"} == set(blurb_full_map())
    assert {k for k, v in status.items() if v == "missing"} == {"ebm_pico", "bioasq_yesno"}
    have = [t["average"] for t in res["task_types"] if t["average"] is not None]
    assert len(have) >= 5 and res["blurb_score_partial"] == pytest.approx(sum(have) / len(have))

    paper = tmp_path / "paper"
    argv = ["benchmark", "paper", "--model", str(model), "--out", str(paper), "--seeds", "1,2",
            "--recipe-map", str(write_map(tmp_path / "p.yaml", paper_map(tmp_path))),
            "--datasets", "bc5cdr_chem", "--grid", "--epochs", "1", "--max-examples", "16",
            "grid.num_fc_layers=[1,2]", "grid.fc_hidden_size=[16]"]
    assert run_world(1, _suite, argv) == [0]
    res = json.loads((paper / "results.json").read_text())
    assert res["cells_finished"] == res["cells_total"] == 2 * 2
    row = res["datasets"][0]
    best = max(row["grid"], key=lambda g: g["dev_mean"])  # the first of equals, as the grid's order
    assert row["status"] == "complete" and len(row["grid"]) == 2 and row["seeds"] == [1, 2]
    assert (row["selected"]["num_fc_layers"], row["selected"]["fc_hidden_size"]) == (
        best["num_fc_layers"], best["fc_hidden_size"])
    assert "Head (chosen on dev)" in (paper / "results.md").read_text()
