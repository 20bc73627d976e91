"""The SLURM commands ``benchmark --dry-run`` prints copy-paste into bash: they parse (``bash -n``) and, run
against a stand-in ``sbatch`` that answers ``<id>;cluster`` like ``--parsable`` on a federated cluster, each
array's job id reaches the next command's ``--dependency`` (the shell expands ``$JOB0``; it was single-quoted)."""

from __future__ import annotations

import os
import subprocess

from suite_files import ROOT, write_map

from bio_megatron.cli import main


def _printed_commands(tmp_path, capsys) -> list[str]:
    qa = tmp_path / "qa"
    qa.mkdir()
    for f in ("t.json", "s.json", "g.json", "sq.json"):
        (qa / f).write_text("{}")
    rmap = write_map(tmp_path / "map.yaml", {
        "squad_v1": {"overrides": [f"model.dataset.data_dir={qa}", "model.dataset.train_file=sq.json",
                                   "model.dataset.dev_file=sq.json"]},
        "bioasq_factoid": {"overrides": [f"model.dataset.data_dir={qa}", "model.dataset.train_file=t.json",
                                         "model.dataset.test_file=s.json", f"model.dataset.bioasq_golden={qa}/g.json"]}})
    model = tmp_path / "my model"  # a space: the printed paths must be quoted where $JOB0 must not be
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert main(["benchmark", "paper", "--model", str(model), "--out", str(tmp_path / "s"), "--recipe-map",
                 str(rmap), "--datasets", "bioasq_factoid", "--seeds", "1,2", "--no-grid", "--dry-run",
                 "--sbatch-args", "--account=A --time=1:00:00"]) == 0
    out = capsys.readouterr().out.splitlines()
    start = next(i for i, ln in enumerate(out) if ln.startswith("SLURM:"))
    return [ln.strip() for ln in out[start + 1:] if ln.startswith("  ")]


def test_printed_slurm_commands_parse_and_chain_the_job_ids(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    lines = _printed_commands(tmp_path, capsys)
    assert len(lines) == 3  # SQuAD's array, BioASQ's array after it, the report after both
    script = tmp_path / "submit.sh"
    script.write_text("set -euo pipefail\n" + "\n".join(lines) + "\n")
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    fake, calls = tmp_path / "bin", tmp_path / "sbatch.calls"
    fake.mkdir()
    # one argument per line, then a blank line; answers 101;cluster, 102;cluster, ...
    (fake / "sbatch").write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" "" >> "{calls}"\n'
                                 f'echo "$((100 + $(grep -c "^$" "{calls}")));cluster"\n')
    (fake / "sbatch").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    first, second, report = [c.splitlines() for c in calls.read_text().split("\n\n")[:3]]
    assert not any(a.startswith("--dependency") for a in first)
    assert "--dependency=afterany:101" in second
    assert "--dependency=afterany:101:102" in report
    assert str(tmp_path / "my model") in first and "--account=A" in first and "--time=1:00:00" in first
    assert report[-1].startswith("--wrap=") and report[-1].endswith(f"benchmark report {tmp_path / 's'}")
