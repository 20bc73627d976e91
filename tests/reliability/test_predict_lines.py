"""``predict`` keeps one line = one document (issue 21, items 3 and 4). On main (bb6a95b) ``predict ner`` split a
document at a lone ``\\r`` (Python's universal newlines) and skipped blank lines, so the output had another
number of records than the input had lines, and invalid UTF-8 was a ``UnicodeDecodeError`` traceback. Now lines
end at ``\\n`` (or ``\\r\\n``) only, a blank line is a record without entities, a BOM is no part of the first
document, and a bad byte is one line naming the file and line, exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reliability.cli_log import run_cli
from reliability.test_hf_inputs import good_ner_hf  # noqa: F401  (the tiny HF NER model, a module fixture)

ROOT = Path(__file__).resolve().parents[2]
SQUAD = ROOT / "tests" / "fixtures" / "qa" / "squad_v2_dev_slice.json"


def _predict(argv: list[str]) -> dict:
    from harness import run_world

    (res,) = run_world(1, _predict_child, argv)
    return res


def _predict_child(argv: list[str]) -> dict:
    rc, msg = run_cli(argv)
    return {"rc": rc, "msg": msg}


def test_predict_keeps_one_record_per_input_line(good_ner_hf, tmp_path):  # noqa: F811
    lines = ["the cell\u2028and the gene", "the\x0cgene\x0bof\x1c\x1d\x1ethe cell", "", "cell\x85gene\u2029the",
             "the gene\rof the cell", "the cell"]
    docs, out = tmp_path / "docs.txt", tmp_path / "ents.jsonl"
    docs.write_bytes(("\ufeff" + "\r\n".join(lines[:2]) + "\n" + "\n".join(lines[2:]) + "\n").encode("utf-8"))
    res = _predict(["predict", "ner", "--checkpoint", str(good_ner_hf), "--input", str(docs), "--out", str(out)])
    assert res["rc"] == 0, res
    records = [json.loads(x) for x in out.read_text(encoding="utf-8").split("\n") if x]
    assert [r["id"] for r in records] == [str(i) for i in range(1, len(lines) + 1)]
    for rec, text in zip(records, lines):
        for ent in rec["entities"]:  # offsets into the line as written, the BOM not counted
            assert text[ent["start"]:ent["end"]] == ent["text"]


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_predict_refuses_invalid_utf8_naming_the_line(tmp_path, suffix):
    docs = tmp_path / f"docs{suffix}"
    good = b'{"id": "a", "text": "the cell"}\n' if suffix == ".jsonl" else b"the cell\n"
    docs.write_bytes(good + good.replace(b"cell", b"c\xe9ll"))  # Latin-1, not UTF-8
    rc, msg = run_cli(["predict", "ner", "--checkpoint", str(tmp_path / "none"), "--input", str(docs)])
    assert rc == 2 and f"{docs}:2: not UTF-8 text (byte 0xe9" in msg, msg


def test_predict_qa_refuses_invalid_utf8_naming_the_line(tmp_path):
    data = tmp_path / "dev.json"
    data.write_bytes(SQUAD.read_bytes().replace(b'"context": "', b'"context": "\xff', 1))
    line = SQUAD.read_bytes().split(b'"context": "', 1)[0].count(b"\n") + 1
    rc, msg = run_cli(["predict", "qa", "--checkpoint", str(tmp_path / "none"), "--input", str(data)])
    assert rc == 2 and f"{data}:{line}: not UTF-8 text" in msg, msg


def test_predict_qa_refuses_a_repeated_question_id(tmp_path):
    """The output maps id -> answer: a second question with the same id silently replaced the first's answer."""
    qs = tmp_path / "qs.jsonl"
    qs.write_text('{"id": "a", "question": "Which?", "context": "the cell"}\n'
                  '{"id": "b", "question": "Which?", "context": "the gene"}\n'
                  '{"id": "a", "question": "What?", "context": "the gene"}\n')
    rc, msg = run_cli(["predict", "qa", "--checkpoint", str(tmp_path / "none"), "--input", str(qs)])
    assert rc == 2 and f"{qs}:3: question id 'a' is used twice (also on line 1" in msg, msg
    data = json.loads(SQUAD.read_text())
    qas = data["data"][0]["paragraphs"][0]["qas"]
    qas[1]["id"] = qas[0]["id"]
    dev = tmp_path / "dev.json"
    dev.write_text(json.dumps(data))
    rc, msg = run_cli(["predict", "qa", "--checkpoint", str(tmp_path / "none"), "--input", str(dev)])
    assert rc == 2 and f"question id {qas[0]['id']!r} is used twice" in msg, msg


@pytest.mark.parametrize("task,name,text", [("ner", "docs.txt", "\n \n\n"), ("ner", "docs.jsonl", "\n"),
                                             ("ner", "docs.jsonl", '{"id": "a", "text": " "}\n'),
                                             ("qa", "qs.jsonl", "\n\n"),
                                             ("qa", "dev.json", '{"version": "v2.0", "data": []}')])
def test_predict_input_without_any_text_is_refused(tmp_path, task, name, text):
    """An empty output looked like a model that found nothing (exit 0 on bb6a95b, after loading the model)."""
    inp = tmp_path / name
    inp.write_text(text)
    rc, msg = run_cli(["predict", task, "--checkpoint", str(tmp_path / "none"), "--input", str(inp)])
    assert rc == 2 and msg.startswith(f"{inp}: no ") and "checkpoint" not in msg, msg
