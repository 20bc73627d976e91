"""conlleval port vs. the official perl script's own output, seqeval, and hand-derived cases."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from bio_megatron.evaluation.conlleval import evaluate_file, evaluate_lines, evaluate_sequences
from bio_megatron.utils.errors import DataError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ner"


def _parse_perl_output(path: Path) -> dict:
    """Numbers printed by conlleval.pl (see tests/fixtures/ner/SOURCES.md for how the files were made)."""
    lines = path.read_text().splitlines()
    m = re.match(r"processed (\d+) tokens with (\d+) phrases; found: (\d+) phrases; correct: (\d+)\.", lines[0])
    out = dict(zip(("tokens", "found_correct", "found_guessed", "correct"), map(int, m.groups())))
    vals = re.findall(r"\d+\.\d+", lines[1])
    out.update(zip(("accuracy", "precision", "recall", "f1"), map(float, vals)))
    out["per_type"] = {}
    for line in lines[2:]:
        name, rest = line.split(":", 1)
        p, r, f = re.findall(r"\d+\.\d+", rest)
        n = rest.split()[-1]
        out["per_type"][name.strip()] = {"precision": float(p), "recall": float(r), "f1": float(f),
                                         "found_guessed": int(n)}
    return out


@pytest.mark.parametrize("name", ["bc5cdr_two_types_perturbed", "ill_formed"])
def test_equals_official_perl_output(name):
    perl = _parse_perl_output(FIX / f"{name}.conlleval.out")
    ours = evaluate_file(FIX / f"{name}.conll")
    for key in ("tokens", "found_correct", "found_guessed", "correct"):
        assert ours[key] == perl[key], key
    for key in ("accuracy", "precision", "recall", "f1"):
        assert f"{ours[key]:.2f}" == f"{perl[key]:.2f}", key
    assert set(ours["per_type"]) == set(perl["per_type"])
    for t, row in perl["per_type"].items():
        for key in ("precision", "recall", "f1"):
            assert f"{ours['per_type'][t][key]:.2f}" == f"{row[key]:.2f}", (t, key)
        assert ours["per_type"][t]["found_guessed"] == row["found_guessed"]


def test_ill_formed_iob_hand_derived():
    # gold chunks: Chemical[Al be], Disease[d] (I- after O), Disease[e], Chemical[f] (I- opens a
    # sentence), Disease[g] (type change)  -> 5.  Predicted: Chemical[Al be], Disease[c d],
    # Chemical[e], Chemical[f g] -> 4.  Only Chemical[Al be] matches in start, end and type.
    r = evaluate_file(FIX / "ill_formed.conll")
    assert (r["found_correct"], r["found_guessed"], r["correct"]) == (5, 4, 1)
    assert r["precision"] == pytest.approx(100 / 4) and r["recall"] == pytest.approx(100 / 5)
    assert r["per_type"]["Chemical"]["correct"] == 1 and r["per_type"]["Disease"]["correct"] == 0


def test_type_with_hyphen_and_untyped_tags():
    # the 2004 script keeps everything after the first hyphen as the type
    r = evaluate_lines(["a B-Amino-acid B-Amino-acid", "b I-Amino-acid I-Amino-acid", "c B B", "d I O"])
    assert r["per_type"]["Amino-acid"]["correct"] == 1
    assert r["per_type"][""]["found_correct"] == 1 and r["per_type"][""]["correct"] == 0


def _read_iob(path: Path) -> list[list[tuple[str, str]]]:
    out, cur = [], []
    for line in path.read_text().splitlines():
        if not line:
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(tuple(line.split("\t")))
    return out + ([cur] if cur else [])


def test_matches_seqeval_on_real_data_with_ill_formed_perturbations():
    seqeval = pytest.importorskip("seqeval.metrics")
    chem = _read_iob(FIX / "bc5cdr_chem_devel_head.tsv")
    dis = _read_iob(FIX / "bc5cdr_disease_devel_head.tsv")
    gold = [[tc if tc != "O" else td for (_, tc), (_, td) in zip(sc, sd)] for sc, sd in zip(chem, dis)]
    tags = ["O", "B-Chemical", "I-Chemical", "B-Disease", "I-Disease"]
    for seed in range(5):
        rng = random.Random(seed)
        # perturbing gold as well makes I- after O and type changes appear on both sides
        g = [[t if rng.random() > 0.05 else rng.choice(tags) for t in s] for s in gold]
        p = [[t if rng.random() > 0.2 else rng.choice(tags) for t in s] for s in g]
        ours = evaluate_sequences(g, p)
        assert ours["f1"] / 100 == pytest.approx(seqeval.f1_score(g, p), abs=1e-12)
        assert ours["precision"] / 100 == pytest.approx(seqeval.precision_score(g, p), abs=1e-12)
        assert ours["recall"] / 100 == pytest.approx(seqeval.recall_score(g, p), abs=1e-12)
        report = seqeval.classification_report(g, p, output_dict=True, digits=10)
        for t in ("Chemical", "Disease"):
            assert ours["per_type"][t]["f1"] / 100 == pytest.approx(report[t]["f1-score"], abs=1e-12)
            assert ours["per_type"][t]["found_correct"] == report[t]["support"]


def test_sequences_equal_file_format(tmp_path):
    lines = (FIX / "bc5cdr_two_types_perturbed.conll").read_text().split("\n\n")
    gold = [[ln.split()[1] for ln in block.splitlines()] for block in lines if block.strip()]
    pred = [[ln.split()[2] for ln in block.splitlines()] for block in lines if block.strip()]
    assert evaluate_sequences(gold, pred) == evaluate_file(FIX / "bc5cdr_two_types_perturbed.conll")


def test_bad_inputs_name_the_line(tmp_path):
    bad = tmp_path / "bad.conll"
    bad.write_text("a O O\nb B-X\n")
    with pytest.raises(DataError, match=r"bad\.conll:2:"):
        evaluate_file(bad)
    with pytest.raises(DataError):
        evaluate_sequences([["O"]], [["O", "O"]])
