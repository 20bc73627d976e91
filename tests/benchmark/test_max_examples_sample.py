"""``--max-examples N`` draws N examples at random with a seed, stratified by label for classification, instead
of the first N rows: on the real GAD split (its first 64 test rows are all one class, which scored "F1 100.00")
the sample holds both classes in the split's proportions (within one), is the same for the same seed and differs
for another; the suite passes the seed to every cell and records it. Runs the real ClassifyTask reader."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bio_megatron.cli import main
from bio_megatron.config.finetune import load_finetune_config
from bio_megatron.tasks.classify import ClassifyTask
from bio_megatron.tasks.subset import take
from bio_megatron.vocab.bpe import load_tokenizer
from bio_megatron.vocab.builtin import resolve_vocab
from suite_files import ROOT

GAD = ROOT.parent / "shared" / "data" / "blurb" / "GAD"
RECIPE = ROOT / "nemo_configs" / "classify" / "tiny_classify.yaml"
N = 64


def _test_split(over: list[str]):
    cfg = load_finetune_config("classify", RECIPE, [f"model.dataset.data_dir={GAD}", "model.dataset.task_name=gad",
                                                    f"model.dataset.max_eval_examples={N}", *over], 1)
    tok = cfg.model.tokenizer
    return ClassifyTask(cfg, load_tokenizer(resolve_vocab(tok.vocab_file), tok.do_lower_case)).split("test").examples


@pytest.mark.skipif(not (GAD / "test.tsv").is_file(), reason=f"the real GAD split is not at {GAD}")
def test_gad_sample_is_stratified_and_seeded():
    first = _test_split([])  # no seed: the first N rows, as before
    assert len(first) == N and len({e.target for e in first}) == 1  # why: one class, a meaningless F1
    full = _test_split([f"model.dataset.max_eval_examples={10 ** 6}"])
    share = Counter(e.target for e in full)
    a = _test_split(["model.dataset.max_examples_seed=1234"])
    counts = Counter(e.target for e in a)
    assert len(a) == N and set(counts) == set(share) == {0, 1}
    for label, n in share.items():
        assert abs(counts[label] - N * n / len(full)) <= 1, (counts, share)
    ids = [e.id for e in a]
    assert ids == [e.id for e in _test_split(["model.dataset.max_examples_seed=1234"])]  # same seed, same sample
    assert ids != [e.id for e in _test_split(["model.dataset.max_examples_seed=7"])]
    order = [e.id for e in full]
    assert ids == sorted(ids, key=order.index)  # in the file's order


def test_take_against_an_independent_count():
    items = [(i, "a" if i % 10 < 7 else "b" if i % 10 < 9 else "c") for i in range(200)]  # 70% / 20% / 10%
    for n in (1, 10, 33, 199):
        got = take(items, n, 5, lambda x: x[1])
        assert len(got) == n == len(set(got))
        counts = Counter(x[1] for x in got)
        assert all(abs(counts[k] - n * p) <= 1 for k, p in (("a", .7), ("b", .2), ("c", .1))), (n, counts)
    assert take(items, 10, None) == items[:10] and take(items, 500, 5) == items
    assert take(items, 10, 5) == take(items, 10, 5) != take(items, 10, 6)


def test_suite_passes_and_records_the_sample_seed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    argv = ["benchmark", "blurb", "--model", str(model), "--out", str(tmp_path / "s"), "--datasets", "gad",
            "--seeds", "1", "--max-examples", "8"]
    assert main(argv + ["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "model.dataset.max_examples_seed=1234" in out and "--max-examples 8 --sample-seed 1234" in out
    assert main(argv + ["--sample-seed", "9", "--dry-run"]) == 0
    assert "model.dataset.max_examples_seed=9" in capsys.readouterr().out
    assert main(["benchmark", "blurb", "--model", str(model), "--out", str(tmp_path / "r"), "--datasets", "bioasq_yesno",
                 "--seeds", "1", "--max-examples", "8"]) == 0  # a missing dataset: the folder is written, nothing runs
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["options"]["sample_seed"] == 1234
    assert json.loads((tmp_path / "r" / "results.json").read_text())["options"]["sample_seed"] == 1234
    assert "seed 1234" in (tmp_path / "r" / "results.md").read_text()
