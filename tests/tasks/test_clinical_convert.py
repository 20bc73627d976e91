"""``bio-megatron data convert <format>`` (issue 23 item 1; tasks/clinical_convert.py): an unpacked release (the
synthetic ones of tests/fixtures/clinical) -> train/dev/test IOB files equal to what the format's reader gives, the
counts printed beside the sizes the papers give (checked where comparable); a bad release line is one line naming
file and line, exit 2, and nothing at --out."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from reliability.cli_log import run_cli
from bio_megatron.corpus.iob import read_iob
from bio_megatron.tasks.i2b2 import RELEASE_2010, read_i2b2_2010

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "clinical"


def _convert(capsys, fmt: str, release: Path, out: Path, *extra: str) -> tuple[int, str, dict | None]:
    rc, msg = run_cli(["data", "convert", fmt, "--input", str(release), "--out", str(out), *extra],
                      logging.WARNING, " | ")
    stdout = capsys.readouterr().out
    return rc, msg, json.loads(stdout) if rc == 0 else None


def test_i2b2_2010_release_converts_to_the_readers_sentences(capsys, tmp_path):
    out = tmp_path / "i2b2_2010"
    rc, msg, res = _convert(capsys, "i2b2_2010", FIX / "i2b2_2010", out)
    assert rc == 0, msg
    # by hand: beth 3 records -> 2 train + 1 dev, partners 2 -> 1 + 1; the test release 1 report
    docs = {name: c["documents"] for name, c in res["splits"].items()}
    assert sum(docs.values()) == 6 and docs["test"] == 1 and {docs["train"], docs["dev"]} == {3, 2}
    assert res["splits"]["test"] == {"documents": 1, "sentences": 2, "tokens": 9, "mentions": 3}
    assert res["dropped"]["training release"] == {"overlapping_dropped": 1, "duplicates": 1, "text_mismatches": 0}
    assert res["released"]["documents"] == 871 and "matches" not in res["released"]  # printed, not checked
    for name, folder in (("train", "train"), ("dev", "dev"), ("test", RELEASE_2010["test"])):
        got = [(s.words, s.tags) for s in read_iob(out / f"{name}.tsv")]
        assert got == [(s.words, s.tags) for s in read_i2b2_2010(FIX / "i2b2_2010", folder)]
    assert json.loads((out / "counts.json").read_text()) == res


@pytest.mark.parametrize("fmt,check,ours,released", [
    ("i2b2_2014", "documents", None, 1304),
    ("share_clefe", "mentions", {"train": 8, "dev": 1, "test": 2}, {"train": 4628, "dev": 1075, "test": 5195}),
])
def test_counts_are_checked_against_the_released_sizes(capsys, tmp_path, fmt, check, ours, released):
    rc, msg, res = _convert(capsys, fmt, FIX / fmt, tmp_path / fmt)
    assert rc == 0, msg
    assert res["released"][check] == released and res["released"]["matches"] is False
    if ours is not None:
        assert {name: c["mentions"] for name, c in res["splits"].items()} == ours
    assert "differ from the released" in msg  # a warning, the files are still written
    assert (tmp_path / fmt / "train.tsv").is_file()


def test_a_bad_release_line_writes_nothing(capsys, tmp_path):
    data = tmp_path / "release"
    shutil.copytree(FIX / "i2b2_2012", data)
    xml = data / "2012-07-15.original-annotation.release" / "3.xml"
    xml.write_text(xml.read_text(encoding="utf-8").replace('start="1" end="11"', 'start="1" end="4000"'),
                   encoding="utf-8")
    out = tmp_path / "out"
    rc, msg, _ = _convert(capsys, "i2b2_2012", data, out)
    assert rc == 2 and f"{xml}:" in msg and "outside the text" in msg and "Traceback" not in msg, msg
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["release"]  # no temporary sibling either


def test_an_earlier_output_is_replaced_only_with_overwrite(capsys, tmp_path):
    out = tmp_path / "out"
    assert _convert(capsys, "i2b2_2014", FIX / "i2b2_2014", out)[0] == 0
    rc, msg, _ = _convert(capsys, "i2b2_2014", FIX / "i2b2_2014", out)
    assert rc == 2 and "--overwrite" in msg, msg
    assert _convert(capsys, "i2b2_2014", FIX / "i2b2_2014", out, "--overwrite")[0] == 0


def test_i2b2_2010_relations_convert_to_blue_tsv_by_hand(capsys, tmp_path):
    from bio_megatron.tasks.i2b2_relations import read_i2b2_relations

    out = tmp_path / "re"
    rc, msg, res = _convert(capsys, "i2b2_2010_re", FIX / "i2b2_2010", out)
    assert rc == 0, msg
    # record-13 (dev by the split): 6 pairs on line 3 (aspirin / aspirin 81 mg / chest pain twice), 1 on line 4, 1 on
    # line 5 (a concept going on over the line end counts on its first line); fever-chest pain spans lines: dropped
    dev = read_i2b2_relations(out / "dev.tsv")
    assert [(e.sentence, e.label) for e in dev] == [
        ("The patient was given @treatment-treatment$ for chest pain .", "false"),  # overlapping concepts: one marker
        ("The patient was given @treatment$ 81 mg for @problem$ .", "false"),
        ("The patient was given @treatment$ 81 mg for @problem$ .", "false"),
        ("The patient was given @treatment$ for @problem$ .", "TrAP"),
        ("The patient was given @treatment$ for @problem$ .", "false"),  # the duplicate concept: no relation (BLUE)
        ("The patient was given aspirin 81 mg for @problem-problem$ .", "false"),
        ("She denies @problem$ , chills or @problem$ .", "false"),
        (" @test$ showed no @problem$", "TeRP"),
    ]
    assert dev[3].source.endswith("(record-13.record-13.con.l1.record-13.con.l2)")  # BLUE's index
    assert res["splits"] == {"train": {"examples": 1, "relations": 1}, "dev": {"examples": 8, "relations": 2},
                             "test": {"examples": 1, "relations": 1}}
    assert res["dropped"] == {"relations_not_on_one_line": 1} and res["released"]["matches"] is False
    assert [(e.sentence, e.label) for e in read_i2b2_relations(out / "test.tsv")] == [
        ("Continue @treatment$ for @problem$ .", "TrAP")]


def test_a_relation_line_that_does_not_parse_writes_nothing(capsys, tmp_path):
    data = tmp_path / "release"
    shutil.copytree(FIX / "i2b2_2010", data)
    rel = data / "reference_standard_for_test_data" / "rel" / "0001.rel"
    rel.write_text('c="metformin" 2:1 2:1||r="TrAP"\n', encoding="utf-8")
    rc, msg, _ = _convert(capsys, "i2b2_2010_re", data, tmp_path / "out")
    assert rc == 2 and f"{rel}:1: does not parse as a relation line" in msg, msg
    assert not (tmp_path / "out").exists()
