"""The clinical NER releases read as they ship (issue 23 item 1): i2b2 2010 concepts (``txt/`` + ``concept/*.con``),
i2b2 2012 events and 2014 PHI (XML with character offsets), on synthetic files in the official layouts
(tests/fixtures/clinical/i2b2_*: multi-line mentions, overlapping and duplicate spans, a line that starts with a
space, mentions inside a word, non-ASCII). Words and tags are checked against hand-written expectations; bad
input through the CLI is one line naming file and line, exit 2, no checkpoint or result written."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
from harness import run_world

from reliability.cli_log import run_cli
from bio_megatron.tasks.clinical_spans import SpanStats
from bio_megatron.tasks.i2b2 import RELEASE_2010, read_2010_documents, read_i2b2_2010
from bio_megatron.tasks.i2b2_xml import RELEASES, read_i2b2_xml, read_xml_document
from bio_megatron.tasks.share_clefe import TEST_REPORTS, mask_report, read_share_clefe

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "clinical"
I2B2_2010, I2B2_2012, I2B2_2014 = FIX / "i2b2_2010", FIX / "i2b2_2012", FIX / "i2b2_2014"
SHARE = FIX / "share_clefe"
NER_RECIPE = ROOT / "nemo_configs" / "ner" / "tiny_ner.yaml"
BETH = I2B2_2010 / RELEASE_2010["train"][1]
TEST = {"i2b2_2010": RELEASE_2010["test"], **{f: RELEASES[f]["test"] for f in RELEASES}, "share_clefe": TEST_REPORTS}


def _pairs(sentences) -> list[list[tuple[str, str]]]:
    return [list(zip(s.words, s.tags)) for s in sentences]


# --- i2b2 2010 -----------------------------------------------------------------------------------------------
def test_i2b2_2010_concepts_become_iob_by_hand():
    stats = SpanStats()
    docs = read_2010_documents(BETH / "txt", BETH / "concept", None, stats)
    assert sorted(docs) == ["record-13", "record-14", "record-15"]
    P, T, R = "problem", "test", "treatment"
    assert _pairs(docs["record-13"]) == [
        [("Admission", "O"), ("Date", "O"), (":", "O")],
        [("2012-01-03", "O")],
        # "aspirin" (3:4) and "aspirin 81 mg" (3:4-3:6) overlap: the longer one is kept; "chest pain" is listed twice
        [("The", "O"), ("patient", "O"), ("was", "O"), ("given", "O"), ("aspirin", f"B-{R}"), ("81", f"I-{R}"),
         ("mg", f"I-{R}"), ("for", "O"), ("chest", f"B-{P}"), ("pain", f"I-{P}"), (".", "O")],
        [("She", "O"), ("denies", "O"), ("fever", f"B-{P}"), (",", "O"), ("chills", "O"), ("or", "O"),
         ("Sjögren", f"B-{P}"), ("'s", f"I-{P}"), ("syndrome", f"I-{P}"), (".", "O")],
        # the line starts with a space: "ct of the head" is 5:1-5:4 (the empty token before the space is 5:0)
        [("CT", f"B-{T}"), ("of", f"I-{T}"), ("the", f"I-{T}"), ("head", f"I-{T}"), ("showed", "O"), ("no", "O"),
         ("acute", f"B-{P}")],
        [("hemorrhage", f"I-{P}"), (".", "O")],  # "acute hemorrhage" 5:7-6:0 goes on over the line end
    ]
    assert (stats.documents, stats.mentions, stats.overlapping_dropped, stats.duplicates) == (3, 9, 1, 1)


def test_i2b2_2010_release_splits_by_patient():
    train, dev, test = (read_i2b2_2010(I2B2_2010, name) for name in ("train", "dev", RELEASE_2010["test"]))
    # beth: 3 records -> int(3 * 0.9) = 2 train, 1 dev; partners: 2 -> 1 train, 1 dev; a record is one patient
    firsts = {"record-13": "Admission", "record-14": "Discharge", "record-15": "Chest", "018636330_DH": "Blood",
              "026350287_DH": "No"}
    starts = lambda ss: {s.words[0] for s in ss}
    in_train = {d for d, w in firsts.items() if w in starts(train)}
    in_dev = {d for d, w in firsts.items() if w in starts(dev)}
    assert not in_train & in_dev and in_train | in_dev == set(firsts)
    assert sum(d.startswith("record") for d in in_train) == 2 and sum(d.startswith("0") for d in in_train) == 1
    assert len(train) + len(dev) == 6 + 3 + 1 + 2 + 1  # every line with words, once
    assert [_pairs(read_i2b2_2010(I2B2_2010, n)) for n in ("train", "dev")] == [_pairs(train), _pairs(dev)]
    assert _pairs(test) == [[("Hemoglobin", "B-test"), ("A1c", "I-test"), ("7.2", "O"), (".", "O")],
                            [("Continue", "O"), ("metformin", "B-treatment"), ("for", "O"), ("diabetes", "B-problem"),
                             (".", "O")]]


# --- i2b2 2012 and 2014 (XML) ---------------------------------------------------------------------------------
def test_i2b2_2012_events_become_iob_by_hand():
    stats = SpanStats()
    doc = I2B2_2012 / RELEASES["i2b2_2012"]["train"][0] / "1.xml"
    got = _pairs(read_xml_document(doc, "i2b2_2012", None, stats))
    assert got[0] == [("Admission", "B-OCCURRENCE"), ("Date", "O"), (":", "O")]
    assert got[1] == [("09/29/1993", "O")]  # a TIMEX3, not an event: not an NER target (bio-lm)
    # "CT" and "MRI" are events inside the word "CT/MRI": it is cut at their edges
    assert got[3] == [("The", "O"), ("patient", "O"), ("had", "O"), ("a", "O"), ("CT", "B-TEST"), ("/", "O"),
                      ("MRI", "B-TEST"), ("showing", "O"), ("a", "B-PROBLEM"), ("2", "I-PROBLEM"), ("cm", "I-PROBLEM"),
                      ("mass", "I-PROBLEM"), ("in", "I-PROBLEM"), ("the", "I-PROBLEM")]
    # the problem runs over the line end; "38.5°C" before "Tylenol": offsets count characters, not bytes
    assert got[4] == [("left", "I-PROBLEM"), ("lobe", "I-PROBLEM"), (";", "O"), ("temperature", "B-TEST"),
                      ("38.5°C", "O"), (".", "O"), ("Tylenol", "B-TREATMENT"), ("given", "O"), (".", "O")]
    # "2 cm mass" overlaps the longer problem; "temperture" (the text attribute's slip) is counted, not refused
    assert (len(got), stats.mentions, stats.overlapping_dropped, stats.text_mismatches) == (5, 6, 1, 1)


def test_i2b2_2014_phi_becomes_iob_by_hand_and_splits_records_by_patient():
    doc = I2B2_2014 / "training-PHI-Gold-Set1" / "100-01.xml"
    assert _pairs(read_xml_document(doc, "i2b2_2014", None, SpanStats())) == [
        [("Record", "O"), ("date:", "O"), ("2067-05-03", "B-DATE")],
        [("Dr.", "O"), ("Oliver", "B-DOCTOR"), ("Quinn", "I-DOCTOR"), ("saw", "O"), ("Mr.", "O"),
         ("José", "B-PATIENT"),
         ("Núñez", "I-PATIENT"), (",", "O"), ("age", "O"), ("67", "B-AGE"), ("yo", "O"), (",", "O"), ("at", "O"),
         ("Brookside", "B-HOSPITAL")],
        [("Hospital", "I-HOSPITAL"), (".", "O")],
        [("Phone", "O"), ("555-0134", "B-PHONE")],
    ]
    train, dev = (read_i2b2_xml("i2b2_2014", I2B2_2014, n) for n in ("train", "dev"))
    # patients 100 (two records), 101, 102 (Set2): int(3 * 0.9) = 2 train, 1 dev; 100's records stay together
    dates = lambda ss: {s.words[2] for s in ss if s.words[:2] == ["Record", "date:"]}
    assert not dates(train) & dates(dev) and len(dates(train) | dates(dev)) == 4
    assert {"2067-05-03", "2068-01-10"} <= dates(train) or {"2067-05-03", "2068-01-10"} <= dates(dev)
    test = read_i2b2_xml("i2b2_2014", I2B2_2014, RELEASES["i2b2_2014"]["test"])
    assert _pairs(test)[1] == [("Dr.", "O"), ("Ann", "B-DOCTOR"), ("Ray", "I-DOCTOR"), (",", "O"), ("phone", "O"),
                               ("555-0199", "B-PHONE"), (".", "O")]


def test_i2b2_2012_release_splits():
    train, dev, test = (read_i2b2_xml("i2b2_2012", I2B2_2012, n)
                        for n in ("train", "dev", RELEASES["i2b2_2012"]["test"]))
    assert len(train) + len(dev) == 5 + 2 + 1 and {len(train), len(dev)} in ({6, 2}, {7, 1}, {5, 3})
    assert _pairs(test) == [[("An", "O"), ("echocardiogram", "B-TEST"), ("showed", "O"), ("effusion", "B-PROBLEM"),
                             (".", "O")]]


# --- ShARe/CLEFE --------------------------------------------------------------------------------------------------
def test_share_clefe_discontiguous_mentions_are_tagged_as_blue_tags_them():
    train, dev, test = (read_share_clefe(SHARE, n) for n in ("train", "dev", TEST_REPORTS))
    assert _pairs(train)[:3] == [
        # [**...**] marks become PATTERN in the same width, so the offsets after them still hold
        [("Admission", "O"), ("Date:", "O"), ("PATTERN", "O"), ("Discharge", "O"), ("Date:", "O"), ("PATTERN", "O")],
        # "left atrium ... dilated" is one mention in two fragments: B on the first word, I on the rest, O between
        [("The", "O"), ("left", "B"), ("atrium", "I"), ("is", "O"), ("moderately", "O"), ("dilated", "I"), (".", "O")],
        # "chest pain" annotated twice (two CUIs) is one mention; "____" is BLUE's "___" + "_"
        [("History", "O"), ("of", "O"), ("Ménière", "B"), ("disease", "I"), ("and", "O"), ("chest", "B"),
         ("pain", "I"), (";", "O"), ("no", "O"), ("edema", "B"), ("_", "O"), ("noted", "O"), (".", "O")],
    ]
    # the radiology report has no pipe file: its Knowtator XML (the training gold as released) is read
    assert _pairs(train)[6:] == [
        [("Mild", "O"), ("cardiomegaly", "B"), (";", "O"), ("right", "O"), ("lower", "O"), ("lobe", "O"), ("is", "O"),
         ("clear", "O"), ("but", "O"), ("the", "O")],
        [("left", "B"), ("lower", "I"), ("lobe", "I"), ("shows", "O"), ("atelectasis", "I"), (".", "O")],
    ]
    assert len(train) == 8 and _pairs(dev) == [[("Mild", "O"), ("mitral", "B"), ("regurgitation", "I"), (".", "O")]]
    assert _pairs(test)[0] == [("Aortic", "B"), ("valve", "I"), ("is", "O"), ("mildly", "O"), ("thickened", "I"),
                               (".", "O")]
    mark = "[**Known lastname 123**]"  # 24 characters: PATTERN after 17 spaces; "[****]" (6) is too short for it
    assert mask_report(f"x {mark} y ||||~~ [****]") == "x " + " " * 17 + "PATTERN y " + " " * 6 + " " + " " * 6


# --- bad input through the CLI --------------------------------------------------------------------------------
def _copy(src: Path, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(src, data)
    return data


def _finetune_cli(fmt: str, data: Path, tmp_path: Path) -> tuple[int, str]:
    return run_cli(["finetune", "ner", "--config", str(NER_RECIPE), f"model.dataset.format={fmt}",
                    f"model.dataset.data_dir={data}", "model.dataset.train_file=train", "model.dataset.dev_file=dev",
                    f"model.dataset.test_file={TEST[fmt]}", "trainer.max_steps=1",
                    f"exp_manager.exp_dir={tmp_path / 'runs'}",
                    "exp_manager.name=bad"], logging.ERROR, " | ")


def _edit(path: Path, old: str, new: str) -> int:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return text[:text.index(old)].count("\n") + 1


CON = "concept_assertion_relation_training_data/{}/concept/{}.con"


@pytest.mark.parametrize("fmt,file,old,new,needle", [
    ("i2b2_2010", CON.format("beth", "record-14"), 'c="levofloxacin" 3:1 3:1||t="treatment"',
     'c="levofloxacin" 3:1||t="treatment"', "does not parse as a concept line"),
    ("i2b2_2010", CON.format("beth", "record-14"), '3:1 3:1||t="treatment"', '3:7 3:7||t="treatment"',
     "token 7 of 3:7 is outside the line (3 tokens)"),
    ("i2b2_2010", CON.format("beth", "record-14"), '3:1 3:1||t="treatment"', '9:1 9:1||t="treatment"',
     "line 9 of 9:1 is outside the text"),
    ("i2b2_2010", CON.format("beth", "record-14"), 'c="levofloxacin" 3:1', 'c="aspirin" 3:1',
     "does not belong to its .txt"),
    ("i2b2_2012", "2012-07-15.original-annotation.release/2.xml", 'start="22" end="31"', 'start="22" end="999"',
     "offsets 22-999 are outside the text"),
    ("i2b2_2012", "2012-07-15.original-annotation.release/2.xml", '<EVENT id="E1"', '<EVENT id=E1',
     "does not parse as a tag"),
    ("i2b2_2014", "training-PHI-Gold-Set1/100-02.xml", 'start="14"', 'start="x14"',
     "needs integer start and end"),
    ("share_clefe", "Task1TrainSetGOLD199knowtatorehost/Task1Gold/00174-002042-DISCHARGE_SUMMARY.txt",
     "C0015967||15||20", "C0015967||15", "does not parse as a pipe line"),
    ("share_clefe", "Task1TrainSetGOLD199knowtatorehost/Task1Gold/00174-002042-DISCHARGE_SUMMARY.txt",
     "C0015967||15||20", "C0015967||15||2000", "fragment 15-2000 is outside the report"),
    ("share_clefe", "Task1TrainSetGOLD199knowtatorehost/ALLSAVED/00312-004417-RADIOLOGY_REPORT.knowtator.xml",
     '<span start="112" end="123" />', '<span start="112" end="1230" />', "span '112'-'1230' is not inside the report"),
])
def test_bad_release_line_is_refused_with_file_and_line(tmp_path, fmt, file, old, new, needle):
    data = _copy(FIX / fmt, tmp_path)
    lineno = _edit(data / file, old, new)
    rc, msg = _finetune_cli(fmt, data, tmp_path)
    assert rc == 2 and f"{data / file}:{lineno}: " in msg and needle in msg and "Traceback" not in msg, msg
    assert "\n" not in msg and not (tmp_path / "runs").exists()  # one line; nothing written, not even the run folder


@pytest.mark.parametrize("fmt,file,old,new", [
    ("i2b2_2010", "reference_standard_for_test_data/concepts/0001.con", 't="problem"', 't="drug"'),
    ("i2b2_2014", "testing-PHI-Gold-fixed/110-01.xml", 'TYPE="PHONE"', 'TYPE="FAX"'),
])
def test_a_type_not_in_the_training_labels_is_refused(tmp_path, fmt, file, old, new):
    data = _copy(FIX / fmt, tmp_path)
    lineno = _edit(data / file, old, new)
    # the test split read as dev, so that it is read before training (a test split is read only after training:
    # nothing about it reaches training or selection, docs/FINETUNE.md "Training loop")
    rc, msg = run_cli(["finetune", "ner", "--config", str(NER_RECIPE), f"model.dataset.format={fmt}",
                       f"model.dataset.data_dir={data}", "model.dataset.train_file=train",
                       f"model.dataset.dev_file={TEST[fmt]}",
                       "trainer.max_steps=1", f"exp_manager.exp_dir={tmp_path / 'runs'}", "exp_manager.name=bad"],
                      logging.ERROR, " | ")
    assert rc == 2 and f"{data / file}:{lineno}: " in msg and "not in the label set" in msg, msg
    assert "\n" not in msg and not (tmp_path / "runs").exists()  # one line; nothing written


@pytest.mark.parametrize("fmt,file,old,new,needle", [
    ("i2b2_2014", "testing-PHI-Gold-fixed/110-01.xml", 'TYPE="PHONE"', 'TYPE="FAX"', "not in the label set"),
    ("i2b2_2010", "reference_standard_for_test_data/concepts/0001.con", 'c="metformin" 2:1 2:1', 'c="metformin" 2:1',
     "does not parse as a concept line"),
    ("i2b2_2012", "2012-08-08.test-data.event-timex-groundtruth/xml/101.xml", 'start="26" end="34"',
     'start="26" end="340"', "offsets 26-340 are outside the text"),
])
def test_dry_run_refuses_a_bad_test_release(tmp_path, capsys, fmt, file, old, new, needle):
    """A run reads its test split only after training (nothing about it may reach training or selection), so a bad
    test release surfaces only after the schedule has run; ``--dry-run`` reads it first: one line, exit 2."""
    data = _copy(FIX / fmt, tmp_path)
    lineno = _edit(data / file, old, new)
    rc, msg = run_cli(["finetune", "ner", "--config", str(NER_RECIPE), "--dry-run", f"model.dataset.format={fmt}",
                       f"model.dataset.data_dir={data}", "model.dataset.train_file=train", "model.dataset.dev_file=dev",
                       f"model.dataset.test_file={TEST[fmt]}", f"exp_manager.exp_dir={tmp_path / 'runs'}"],
                      logging.ERROR, " | ")
    assert rc == 2 and f"{data / file}:{lineno}: " in msg and needle in msg and "\n" not in msg, msg
    assert capsys.readouterr().out == "" and not (tmp_path / "runs").exists()


# --- end to end and recipes -----------------------------------------------------------------------------------
def _finetune(over: list[str]) -> dict:
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)
    return run_finetuning(load_finetune_config("ner", NER_RECIPE, over, int(os.environ["WORLD_SIZE"])))


def test_finetune_ner_on_the_i2b2_2010_release_trains_and_scores(tmp_path):
    over = ["model.dataset.format=i2b2_2010", f"model.dataset.data_dir={I2B2_2010}", "model.dataset.train_file=train",
            "model.dataset.dev_file=dev", f"model.dataset.test_file={RELEASE_2010['test']}", "trainer.max_steps=4",
            "trainer.val_check_interval=4", f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=i2b2"]
    (res,) = run_world(1, _finetune, over)
    assert res["test"] is not None and "f1" in res["test"]
    (conll,) = (tmp_path / "i2b2").rglob("*.conll")  # the test release's sentences, with their gold tags
    gold = [[line.split(" ")[:2] for line in block.split("\n")] for block in conll.read_text().strip().split("\n\n")]
    assert gold[1] == [["Continue", "O"], ["metformin", "B-treatment"], ["for", "O"], ["diabetes", "B-problem"],
                       [".", "O"]] and len(gold) == 2
    labels = next((tmp_path / "i2b2").rglob("label_ids.csv")).read_text().split()
    assert labels == ["O", "B-problem", "B-test", "B-treatment", "I-problem", "I-test", "I-treatment"]


@pytest.mark.parametrize("year", ["2010", "2012", "2014"])
def test_i2b2_recipes_resolve_with_bio_lm_protocol(capsys, year):
    rc, msg = run_cli(["finetune", "ner", "--config", str(ROOT / "nemo_configs" / "ner" / f"i2b2_{year}.yaml"),
                       "--dry-run", f"model.dataset.data_dir={FIX / f'i2b2_{year}'}"], logging.ERROR, " | ")
    assert rc == 0, msg
    cfg = json.loads(capsys.readouterr().out)["config"]
    d = cfg["model"]["dataset"]
    assert (d["format"], d["train_file"], d["dev_file"], d["test_file"]) == (f"i2b2_{year}", "train", "dev",
                                                                             TEST[f"i2b2_{year}"])
    assert (cfg["model"]["optim"]["lr"], cfg["trainer"]["max_epochs"], cfg["model"]["global_batch_size"]) == \
        (1e-5, 20, 32)


def test_share_clefe_recipe_dry_run_reads_the_release(capsys):
    rc, msg = run_cli(["finetune", "ner", "--config", str(ROOT / "nemo_configs" / "ner" / "share_clefe.yaml"),
                       "--dry-run", f"model.dataset.data_dir={SHARE}"], logging.ERROR, " | ")
    assert rc == 0, msg  # the split keywords and the test release's folder pass the pre-flight path checks
    cfg = json.loads(capsys.readouterr().out)["config"]
    assert (cfg["model"]["dataset"]["format"], cfg["model"]["optim"]["lr"]) == ("share_clefe", 2e-4)
