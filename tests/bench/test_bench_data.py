"""``bio-megatron bench data`` runs on a tiny input and reports the whole-process time and its stages.

A benchmark, not a timed test: only the command and the report's fields are checked (no Megatron-LM here).
"""

from __future__ import annotations

import json

from bio_megatron.cli import main


def test_bench_data_whole_process_reports_stages(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", "data", "--whole-process-only", "--repeat", "1", "--tokenize-repeat", "1",
               "--workers", "1", "--rounds", "1", "--output", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == res  # the CLI prints the same JSON it writes
    whole = res["tokenize_whole_process"]
    ours = whole["ours"]
    assert whole["workers"] == 1 and whole["input_bytes"] > 0 and ours["tokens"] > 0
    assert ours["wall_seconds"] > 0 and ours["tokens_per_s_whole_process"] > 0
    stages = ours["stages"]
    assert set(stages) == {"startup", "read", "parse", "encode", "write", "in_process_seconds"}
    assert all(v >= 0 for v in stages.values()) and stages["encode"] > 0
    # the stages happen inside the run: their wall time cannot exceed it (workers=1: no overlap)
    assert stages["startup"] + stages["in_process_seconds"] <= ours["wall_seconds"] + 1e-3
    assert "megatron_lm" not in whole and "ratio_megatron_lm_over_ours" not in whole
    # the reference encoder (tokenizers alone) ran beside it and wrote the same bytes
    assert whole["ours_tokenizers_encoder"]["same_bytes"] is True and whole["ratio_tokenizers_encoder_over_ours"] > 0
