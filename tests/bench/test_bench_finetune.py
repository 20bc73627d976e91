"""``bio-megatron bench finetune`` and ``bench predict`` through the CLI at tiny shapes (a seeded tiny BERT, real
BC5CDR-chem and GAD fixture sentences): both sides run, the ratio lines and the summary are printed, the JSON agrees
with them. Benchmarks, not timed tests: no figure is asserted beyond being measured. Bad options exit 2 in one line
before any process starts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bio_megatron.cli import main

ROOT = Path(__file__).resolve().parents[2]
NER_TRAIN = ROOT / "tests" / "fixtures" / "finetune" / "bc5cdr_chem_train_head.tsv"
NER_DEV = ROOT / "tests" / "fixtures" / "finetune" / "bc5cdr_chem_devel_head.tsv"
GAD = ROOT / "tests" / "fixtures" / "blurb" / "GAD" / "test.tsv"
RATIO = re.compile(r"ratio (\d+\.\d+)x")


def _ratios(line: str) -> float:
    (value,) = RATIO.findall(line)
    return float(value)


@pytest.mark.parametrize("part", ["step", pytest.param("epoch", marks=pytest.mark.extended)])
def test_bench_finetune_ner(part, tmp_path, capsys):
    """One part per run (``--skip-epoch`` / ``--skip-step``): each side of each part is a process of its own, and
    the default suite keeps the step's two (the epoch's whole-process runs are in the extended suite). Both parts run
    with ``--group-by-length``, whose batches both sides take (in the epoch, through the baseline's spec)."""
    out = tmp_path / "bench.json"
    skip = "--skip-epoch" if part == "step" else "--skip-step"
    rc = main(["bench", "finetune", "--ner-train", str(NER_TRAIN), "--ner-dev", str(NER_DEV), "--limit", "8",
               "--dev-limit", "4", "--batch", "4", "--steps", "2", "--warmup", "1", "--group-by-length", skip, "--json", str(out)])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    res = json.loads(out.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # nothing else left behind
    assert list(res["tasks"]["ner"]) == ["train", "dev", part]
    assert lines[-1].startswith("finetune model: tiny BERT (seeded")
    if part == "step":
        step = res["tasks"]["ner"]["step"]
        for side in ("ours", "transformers"):
            assert len(step[side]["step_s"]) == 2 and step[side]["examples_per_s"] > 0
        assert abs(step["ratio_examples_per_s"] - step["ours"]["examples_per_s"] / step["transformers"]["examples_per_s"]) < 1e-9
        assert step["ratio_median_step"] > 0
        (step_line,) = [x for x in lines if x.startswith("finetune ner step")]
        assert abs(_ratios(step_line) - step["ratio_examples_per_s"]) < 0.006
        assert step["group_by_length"] is True and ", grouped by length," in step_line
        return
    epoch = res["tasks"]["ner"]["epoch"]
    for side in ("ours", "transformers"):
        assert epoch[side]["wall_s"] > 0 and epoch[side]["peak_rss_mib"] > 100  # a real process with torch in it
    assert epoch["train_examples"] == 8 and epoch["dev_examples"] == 4 and epoch["steps"] == 2  # the same data
    assert epoch["ours"]["train_seconds"] > 0  # our run finished and wrote results.json
    assert set(epoch["transformers"]["phases_s"]) == {"imports", "load", "data", "train", "dev", "save"}
    (epoch_line,) = [x for x in lines if x.startswith("finetune ner epoch")]
    assert abs(_ratios(epoch_line) - epoch["ratio_whole_process"]) < 0.006


@pytest.mark.extended  # ~16 s (two more processes); the default suite keeps the unpacked NER case
def test_bench_finetune_packed_step_runs_fewer_positions_on_the_same_examples(tmp_path, capsys):
    """``--packing``: our side packs (model.dataset.packing) while transformers trains on the same examples padded;
    both sides see the same real tokens, ours runs fewer positions, and the line says it was packed."""
    out = tmp_path / "bench.json"
    rc = main(["bench", "finetune", "--ner-train", str(NER_TRAIN), "--limit", "16", "--batch", "8", "--steps", "1",
               "--warmup", "0", "--max-seq-length", "128", "--packing", "--skip-epoch", "--json", str(out)])
    assert rc == 0
    step = json.loads(out.read_text())["tasks"]["ner"]["step"]
    pos = step["positions_per_step"]
    assert step["packing"] is True and pos["real_tokens"] <= pos["ours"] < pos["transformers"]
    assert all(step[side]["examples_per_s"] > 0 for side in ("ours", "transformers"))
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("finetune ner step")]
    assert ", ours packed," in line and f"ours {pos['ours']:.0f}, transformers {pos['transformers']:.0f}" in line


@pytest.mark.extended  # the same machinery as the NER case, another head and reader: 4 more processes
def test_bench_finetune_classify_step_and_epoch(tmp_path, capsys):
    rc = main(["bench", "finetune", "--classify-train", str(GAD), "--limit", "6", "--dev-limit", "6", "--batch", "2",
               "--steps", "2", "--warmup", "1"])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(x.startswith("finetune classify step") and _ratios(x) > 0 for x in lines)
    assert any(x.startswith("finetune classify epoch (6 examples + 6 dev") and _ratios(x) > 0 for x in lines)


def test_bench_predict_tiny(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", "predict", "--iob", str(NER_DEV), "--limit", "40", "--no-startup", "--json", str(out)])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    res = json.loads(out.read_text())
    assert res["sentences"] == 40 and res["batch"] == 32
    for side in ("ours", "transformers"):
        assert res[side]["sentences_per_s"] > 0 and res[side]["peak_rss_mib"] > 100
    assert set(res["transformers"]["phases_s"]) == {"imports", "load", "predict", "write"}
    # the same weights on both sides: the same entities on every line our sentence splitter leaves whole
    assert res["same_entities"] * 40 >= 40 - res["lines_split_in_sentences"] - 1e-9
    assert res["lines_split_in_sentences"] < 10
    assert _ratios(lines[0]) == pytest.approx(res["ratio_sentences_per_s"], abs=0.006)
    assert lines[0].startswith("predict ner (40 sentences, batch 32, 1 thread(s), whole process): ours ")
    assert lines[1].startswith("predict ner peak RSS: ours ")
    assert lines[-1].startswith("predict ner same entities as the pipeline: ")


@pytest.mark.parametrize("argv, message", [
    (["finetune", "--ner-train", "/nonexistent/train.tsv"], "/nonexistent/train.tsv"),
    (["finetune", "--limit", "8"], "give --ner-train FILE and/or --classify-train FILE"),
    (["finetune", "--ner-train", str(NER_TRAIN), "--batch", "0", "--threads", "0"], "--batch must be >= 1, got 0"),
    (["finetune", "--ner-train", str(NER_TRAIN), "--epoch-rounds", "0"], "--epoch-rounds must be >= 1, got 0"),
    (["finetune", "--ner-train", str(NER_TRAIN), "--limit", "4", "--batch", "8"], "--batch (8) exceeds --limit (4)"),
    (["predict", "--text", "/nonexistent/s.txt"], "/nonexistent/s.txt"),
    (["predict", "--iob", str(NER_DEV), "--limit", "0"], "--limit must be >= 1, got 0"),
])
def test_bench_bad_input_exits_2_in_one_message(argv, message, tmp_path):
    from reliability.cli_log import run_cli

    rc, messages = run_cli(["bench"] + argv + ["--json", str(tmp_path / "out.json")])
    assert rc == 2 and message in messages, messages
    assert not list(tmp_path.iterdir())  # nothing written


def test_bench_predict_empty_text_file_exits_2(tmp_path):
    from reliability.cli_log import run_cli

    text = tmp_path / "blank.txt"
    text.write_text("\n  \n", encoding="utf-8")
    rc, messages = run_cli(["bench", "predict", "--text", str(text)])
    assert rc == 2 and f"{text}: no sentences" in messages, messages
