"""What the benchmark tests give a suite: a tiny pretrained-shaped model (a random MegatronBert saved by
transformers itself, with BERT's cased vocabulary) and a recipe map pointing every dataset at the CPU test
recipes and the real data slices in tests/fixtures (BioASQ files are built from the real SQuAD slice)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
SQUAD = FIX / "qa" / "squad_v2_dev_slice.json"
VOCAB = ROOT / "bio_megatron" / "resources" / "vocab" / "bert_base_cased_vocab.txt"
# CPU-sized cells: one epoch, a few steps, dev checked once
SMALL = ["trainer.log_every_n_steps=1", "model.micro_batch_size=4", "model.global_batch_size=8"]


def make_model(out: Path) -> Path:
    """A random ``MegatronBertForMaskedLM`` (2 layers, hidden 32) in an HF folder, like a downloaded model."""
    import torch
    from transformers import MegatronBertConfig, MegatronBertForMaskedLM

    torch.manual_seed(0)
    words = VOCAB.read_text(encoding="utf-8").splitlines()
    cfg = MegatronBertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=128, type_vocab_size=2)
    MegatronBertForMaskedLM(cfg).save_pretrained(out)
    (out / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return out


def bioasq_files(tmp: Path) -> Path:
    """The real SQuAD slice as BioASQ-7b factoid data (SQuAD format, ids ``<qid>_<NNN>``, a golden JSON):
    the last six answerable questions are the test batch, the others train (dev is carved from them)."""
    data = json.loads(SQUAD.read_text())
    qas = [(p["context"], q) for a in data["data"] for p in a["paragraphs"] for q in p["qas"] if q.get("answers")]
    train, test = qas[:-6], qas[-6:]

    def doc(items: list, suffix: str) -> dict:
        paragraphs = [{"context": c, "qas": [{"id": f"{q['id']}_{suffix}", "question": q["question"],
                                              "answers": q["answers"]}]} for c, q in items]
        return {"version": "BioASQ7b", "data": [{"title": "t", "paragraphs": paragraphs}]}

    out = tmp / "bioasq"
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.json").write_text(json.dumps(doc(train, "001")))
    (out / "test.json").write_text(json.dumps(doc(test, "001")))
    golden = [{"id": q["id"], "type": "factoid", "exact_answer": [[a["text"] for a in q["answers"]]]}
              for _, q in test]
    (out / "golden.json").write_text(json.dumps({"questions": golden}))
    return out


def _ner(dev: str) -> dict:
    return {"recipe": "tiny_ner", "overrides": SMALL + [
        f"model.dataset.data_dir={FIX / 'ner'}", f"model.dataset.train_file={dev}", f"model.dataset.dev_file={dev}",
        f"model.dataset.test_file={dev}"]}


def paper_map(tmp: Path) -> dict:
    bioasq = bioasq_files(tmp)
    qa = ["model.dataset.max_seq_length=128", "model.dataset.doc_stride=64", "model.dataset.max_query_length=32",
          "model.fc_hidden_size=null", "model.head.num_fc_layers=1"]
    return {
        "bc5cdr_chem": _ner("bc5cdr_chem_devel_head.tsv"),
        "bc5cdr_disease": _ner("bc5cdr_disease_devel_head.tsv"),
        "chemprot": {"recipe": "tiny_re",
                     "overrides": SMALL + ["model.dataset.test_file=chemprot_scibert_dev_head.jsonl"]},
        "squad_v1": {"recipe": "tiny_qa", "overrides": SMALL + qa + ["model.dataset.version_2_with_negative=false"]},
        "bioasq_factoid": {"recipe": "bioasq_factoid", "overrides": SMALL + qa + [
            f"model.dataset.data_dir={bioasq}", "model.dataset.train_file=train.json",
            "model.dataset.test_file=test.json", f"model.dataset.bioasq_golden={bioasq / 'golden.json'}",
            "trainer.precision=32"]},
    }


def blurb_map() -> dict:
    def cls(task: str, folder: str) -> dict:
        return {"recipe": "tiny_classify", "overrides": SMALL + [
            f"model.dataset.task_name={task}", f"model.dataset.data_dir={FIX / 'blurb' / folder}",
            "model.dataset.train_file=test.tsv", "model.dataset.dev_file=test.tsv", "model.dataset.test_file=test.tsv"]}

    return {"bc5cdr_chem": _ner("bc5cdr_chem_devel_head.tsv"), "gad": cls("gad", "GAD"),
            "biosses": cls("biosses", "BIOSSES")}


def write_map(path: Path, mapping: dict) -> Path:
    path.write_text(yaml.safe_dump(mapping))
    return path


def blurb_full_map() -> dict:
    """Every BLURB dataset that has a fixture (all but EBM PICO's training split and BioASQ's data)."""
    def cls(task: str, folder: str, gold: str = "test.tsv") -> dict:
        return {"recipe": "tiny_classify", "overrides": SMALL + [
            f"model.dataset.task_name={task}", f"model.dataset.data_dir={FIX / 'blurb' / folder}",
            f"model.dataset.train_file={gold}", f"model.dataset.dev_file={gold}", f"model.dataset.test_file={gold}"]}

    jnlpba = {"recipe": "tiny_ner", "overrides": SMALL + [
        f"model.dataset.data_dir={FIX / 'blurb' / 'JNLPBA'}", "model.dataset.train_file=test.tsv",
        "model.dataset.dev_file=test.tsv", "model.dataset.test_file=test.tsv"]}
    return {"bc5cdr_chem": _ner("bc5cdr_chem_devel_head.tsv"), "bc5cdr_disease": _ner("bc5cdr_disease_devel_head.tsv"),
            "jnlpba": jnlpba, "ddi": cls("ddi", "DDI"), "gad": cls("gad", "GAD"), "biosses": cls("biosses", "BIOSSES"),
            "hoc": cls("hoc", "HoC"), "pubmedqa": cls("pubmedqa", "PubMedQA", "test_set.json")}
