"""``evaluate`` and ``analyse`` never print a score computed from bad input.

Found on main before issue 11: every ``evaluate`` sub-command printed zeros (exit 0) for an empty file and
a ``UnicodeDecodeError`` traceback for a binary one; ``evaluate ner`` on a 2-column ``token<TAB>tag``
file scored F1 0.0 with a per-type entry for ``""``; a ChemProt gold line with a different column count
was read from its last field; BioASQ predictions for another golden file scored 0 with exit 0; SQuAD data
without ``answers`` or ``id``, ``--version 1.1`` on v2 data and non-string predictions raised tracebacks;
``analyse mention-overlap`` on files without mentions printed 0% overlaps. Each case runs the real CLI
on real fixture files (or small crafted bad ones) and checks the exit code, the one-line message (the
file, its line or key, and what was expected) and that nothing was printed on stdout.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from reliability.cli_log import run_cli

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SQUAD = FIX / "qa" / "squad_v2_dev_slice.json"
CONLL = FIX / "ner" / "bc5cdr_two_types_perturbed.conll"
BLURB_GOLD = {"pubmedqa": "PubMedQA/test_ground_truth.json", "bioasq_yesno": "BioASQ/yesno_golden.json",
              "ddi": "DDI/test.tsv", "gad": "GAD/test.tsv", "biosses": "BIOSSES/test.tsv", "hoc": "HoC/test.tsv",
              "ebm_pico": "EBM_PICO/test.tsv", "jnlpba": "JNLPBA/test.tsv"}
IOB = FIX / "ner" / "bc5cdr_chem_devel_head.tsv"  # token<TAB>tag: the training format, no prediction column
BIOASQ = FIX / "bioasq"


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    """Exit code, stdout and the messages logged at WARNING and above (where the CLI reports errors)."""
    rc, msg = run_cli(argv, logging.WARNING, " | ")
    return rc, capsys.readouterr().out, msg


def _refused(capsys, argv: list[str], *needles: str) -> str:
    rc, out, msg = _run(capsys, argv)
    assert rc == 2, (rc, out, msg)
    assert out == "", "a score was printed for bad input"
    for needle in needles:
        assert needle in msg, (needle, msg)
    assert "Traceback" not in msg
    return msg


@pytest.fixture
def bad_files(tmp_path) -> dict[str, Path]:
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 8)  # NUL bytes and invalid UTF-8, as a checkpoint shard has
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("a O O\nb\xe9 B-X B-X\n".encode("latin-1"))
    return {"empty": empty, "binary": binary, "latin1": latin1}


def _commands(bad: Path) -> dict[str, list[str]]:
    """Every scoring command, with ``bad`` as the file it reads; the other inputs are valid."""
    gold = FIX / "bioasq" / "normalisation.golden.json"
    return {
        "ner": ["evaluate", "ner", "--input", str(bad)],
        "re-gold": ["evaluate", "re", "--gold", str(bad), "--pred", str(bad)],
        "squad-data": ["evaluate", "squad", "--data", str(bad), "--predictions", str(bad)],
        "squad-predictions": ["evaluate", "squad", "--data", str(SQUAD), "--predictions", str(bad)],
        "bioasq-golden": ["evaluate", "bioasq", "--golden", str(bad), "--predictions", str(bad)],
        "bioasq-predictions": ["evaluate", "bioasq", "--golden", str(gold), "--predictions", str(bad)],
        "bioasq-submission": ["evaluate", "bioasq-submission", "--nbest", str(bad)],
        "label-bias-ner": ["analyse", "label-bias", "ner", str(bad)],
        "label-bias-re": ["analyse", "label-bias", "re", str(bad)],
        "label-bias-qa": ["analyse", "label-bias", "qa", str(bad)],
        "mention-overlap": ["analyse", "mention-overlap", "--train", str(IOB), "--eval", str(bad)],
        # BLURB's tasks: a bad gold file, and a bad prediction file against valid gold
        **{f"{task}-{side}": ["evaluate", task, "--gold", str(bad if side == "gold" else FIX / "blurb" / gold_file),
                              "--pred", str(bad)]
           for task, gold_file in BLURB_GOLD.items() for side in ("gold", "pred")},
    }


@pytest.mark.parametrize("command", list(_commands(Path("x"))))
@pytest.mark.parametrize("kind", ["empty", "binary"])
def test_empty_or_binary_file_is_refused(capsys, bad_files, command, kind):
    bad = bad_files[kind]
    what = {"empty": ("empty file", "no tokens", "no labels", "no records", "no document", "no words"),
            "binary": ("binary file, not text",)}[kind]
    msg = _refused(capsys, _commands(bad)[command], str(bad))
    assert any(w in msg for w in what), msg
    assert "expected" in msg  # says what the file should have held


def test_non_utf8_text_names_the_line(capsys, bad_files):
    _refused(capsys, ["evaluate", "ner", "--input", str(bad_files["latin1"])],
             f"{bad_files['latin1']}:2: not UTF-8 text")


def test_ner_on_a_token_tag_file_names_the_expected_columns(capsys):
    # the real BC5CDR slice in the training format: no prediction column
    _refused(capsys, ["evaluate", "ner", "--input", str(IOB)],
             f"{IOB}:1: 2 field(s)", "'token ... gold pred'", "no prediction column")


def test_ner_column_without_tags_is_refused(capsys, tmp_path):
    # a CoNLL-2003-style 'token POS tag' file: the gold column would be POS tags
    rows = [ln.split() for ln in CONLL.read_text().splitlines()[:40]]
    f = tmp_path / "pos.conll"
    f.write_text("".join(f"{r[0]} NN {r[1]}\n" if r else "\n" for r in rows))
    _refused(capsys, ["evaluate", "ner", "--input", str(f)], f"{f}: column 2 (the gold tags) holds no IOB tag")


def test_chemprot_gold_with_another_column_count_names_the_line(capsys, tmp_path):
    gold, pred = tmp_path / "gold.tsv", tmp_path / "pred.txt"
    gold.write_text("a @CHEMICAL$ b @GENE$\tCPR:3\nc @GENE$ d\textra @CHEMICAL$\tfalse\n")
    pred.write_text("CPR:3\nfalse\n")
    _refused(capsys, ["evaluate", "re", "--gold", str(gold), "--pred", str(pred)],
             f"{gold}:2: 3 tab-separated field(s) but line 1 has 2")


def test_chemprot_label_that_is_not_a_label_names_the_line(capsys, tmp_path):
    gold, pred = tmp_path / "gold.txt", tmp_path / "pred.txt"
    gold.write_text("CPR:4\naspirin inhibits COX-1\n")  # a sentence where a label belongs
    pred.write_text("2\n0\n")
    _refused(capsys, ["evaluate", "re", "--gold", str(gold), "--pred", str(pred)],
             f"{gold}:2: unknown label 'aspirin inhibits COX-1'", "CPR:<n>")


def _squad(tmp_path, edit) -> Path:
    data = json.loads(SQUAD.read_text())
    edit(data["data"][0]["paragraphs"][0]["qas"])
    out = tmp_path / "dev.json"
    out.write_text(json.dumps(data, indent=1))
    return out


@pytest.fixture
def squad_preds(tmp_path) -> Path:
    data = json.loads(SQUAD.read_text())
    out = tmp_path / "preds.json"
    out.write_text(json.dumps({q["id"]: "" for a in data["data"] for p in a["paragraphs"] for q in p["qas"]},
                              indent=1))
    return out


def test_squad_question_without_answers_or_id(capsys, tmp_path, squad_preds):
    qid = json.loads(SQUAD.read_text())["data"][0]["paragraphs"][0]["qas"][1]["id"]
    no_answers = _squad(tmp_path, lambda qas: qas[1].pop("answers"))
    line = next(i for i, ln in enumerate(no_answers.read_text().splitlines(), 1) if qid in ln)
    _refused(capsys, ["evaluate", "squad", "--data", str(no_answers), "--predictions", str(squad_preds)],
             f"{no_answers}:{line}: data[0].paragraphs[0].qas[1] (id {qid!r}) needs \"answers\"")
    no_id = _squad(tmp_path, lambda qas: qas[0].pop("id"))
    _refused(capsys, ["evaluate", "squad", "--data", str(no_id), "--predictions", str(squad_preds)],
             str(no_id), 'data[0].paragraphs[0].qas[0] needs a string "id"')


def test_squad_v11_on_v2_data_is_refused(capsys, squad_preds):
    _refused(capsys, ["evaluate", "squad", "--data", str(SQUAD), "--predictions", str(squad_preds),
                      "--version", "1.1"], str(SQUAD), "question(s) have no gold answer", "use version 2.0")


@pytest.mark.parametrize("value", [3, ["an", "answer"], None])
def test_squad_non_string_prediction_names_the_question(capsys, tmp_path, squad_preds, value):
    preds = json.loads(squad_preds.read_text())
    qid = list(preds)[5]
    preds[qid] = value
    f = tmp_path / "bad_preds.json"
    f.write_text(json.dumps(preds, indent=1))
    _refused(capsys, ["evaluate", "squad", "--data", str(SQUAD), "--predictions", str(f)],
             f"{f}:7: prediction for {qid!r} is {type(value).__name__}", "expected a string")


def test_squad_predictions_for_another_file_are_refused(capsys, tmp_path):
    f = tmp_path / "other.json"
    f.write_text(json.dumps({"56be4db0acb8001400a502ec": "Denver Broncos"}))
    for version in ("1.1", "2.0"):
        data = json.loads(SQUAD.read_text())
        if version == "1.1":  # keep only answered questions so that v1.1 scoring applies
            for a in data["data"]:
                for p in a["paragraphs"]:
                    p["qas"] = [q for q in p["qas"] if q["answers"]]
        d = tmp_path / f"dev{version}.json"
        d.write_text(json.dumps(data))
        _refused(capsys, ["evaluate", "squad", "--data", str(d), "--predictions", str(f), "--version", version],
                 str(f), "no prediction is for a question of the data", "'56be4db0acb8001400a502ec'")


def test_bioasq_submission_for_another_golden_file_is_refused(capsys):
    # the ranking submission answers only ranking's golden questions, none of normalisation's
    other = BIOASQ / "ranking.submission.json"
    _refused(capsys, ["evaluate", "bioasq", "--golden", str(BIOASQ / "normalisation.golden.json"),
                      "--predictions", str(other)],
             str(other), "submitted question id(s) are not in the golden file", "no golden factoid question")


def test_bioasq_empty_submission_and_golden_without_factoids(capsys, tmp_path):
    empty = tmp_path / "sub.json"
    empty.write_text('{"questions": []}')
    gold = BIOASQ / "normalisation.golden.json"
    _refused(capsys, ["evaluate", "bioasq", "--golden", str(gold), "--predictions", str(empty)],
             str(empty), "the submission has no questions")
    golden = json.loads(gold.read_text())
    golden["questions"] = [q for q in golden["questions"] if q["type"] != "factoid"]
    no_factoid = tmp_path / "golden.json"
    no_factoid.write_text(json.dumps(golden))
    _refused(capsys, ["evaluate", "bioasq", "--golden", str(no_factoid),
                      "--predictions", str(BIOASQ / "normalisation.submission.json")],
             str(no_factoid), "no factoid question")


def test_bioasq_stray_id_is_ignored_as_the_official_evaluator_does_but_logged(capsys):
    # submission_quirks has one id its golden file lacks; the official evaluator's output is the reference
    numbers = (BIOASQ / "submission_quirks.official.out").read_text().split()
    rc, out, msg = _run(capsys, ["evaluate", "bioasq", "--golden", str(BIOASQ / "submission_quirks.golden.json"),
                                 "--predictions", str(BIOASQ / "submission_quirks.submission.json")])
    assert rc == 0 and json.loads(out)["mrr"] == float(numbers[3])
    assert "'5e2900368b3851296d000099'" in msg and "not in the golden file" in msg


def test_bioasq_submission_step_names_the_file(capsys, tmp_path):
    nbest = tmp_path / "nbest.json"
    nbest.write_text(json.dumps({"q1_001": [{"text": 7, "probability": 0.5}]}))
    _refused(capsys, ["evaluate", "bioasq-submission", "--nbest", str(nbest)],
             f"{nbest}: n-best entry of 'q1_001'")


def test_mention_overlap_without_mentions_is_refused(capsys, tmp_path):
    all_o = tmp_path / "all_o.tsv"
    all_o.write_text("".join(f"{ln.split(chr(9))[0]}\tO\n" if ln else "\n"
                             for ln in IOB.read_text().splitlines()))
    _refused(capsys, ["analyse", "mention-overlap", "--train", str(IOB), "--eval", str(all_o)],
             str(all_o), "no entity mention", "evaluation file")
    _refused(capsys, ["analyse", "mention-overlap", "--train", str(all_o), "--eval", str(IOB)],
             str(all_o), "no entity mention", "training file")


def test_good_input_still_scores(capsys):
    rc, out, _ = _run(capsys, ["evaluate", "ner", "--input", str(CONLL)])
    assert rc == 0 and 0 < json.loads(out)["f1"] < 100


def test_fifo_gold_is_named_not_missing(tmp_path):
    """evaluate's readers go through the one input check: a FIFO was reported as 'file not found'."""
    import os

    fifo = tmp_path / "gold.txt"
    os.mkfifo(fifo)
    pred = tmp_path / "pred.txt"
    pred.write_text("yes\n")
    rc, msg = run_cli(["evaluate", "pubmedqa", "--gold", str(fifo), "--pred", str(pred)])
    assert rc == 2 and "FIFO" in msg and str(fifo) in msg, msg
