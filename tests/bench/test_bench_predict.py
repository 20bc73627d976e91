"""``predict ner`` batches sentences across documents, shortest first (the speed-up ``bench predict`` measures):
every document gets the entities it gets alone (same spans and types, scores to float rounding), in input order,
across several windows, with blank documents kept in place."""

from __future__ import annotations

from pathlib import Path

from harness import run_world

ROOT = Path(__file__).resolve().parents[2]
NER_DEV = ROOT / "tests" / "fixtures" / "finetune" / "bc5cdr_chem_devel_head.tsv"


def _compare(tmp: str) -> dict:
    from bio_megatron.bench.hf_models import task_folder
    from bio_megatron.corpus.iob import read_iob
    from bio_megatron.formats.finetuned import load_finetuned
    from bio_megatron.parallel.distributed import single_process
    from bio_megatron.predict.ner import predict_documents, predict_entities

    folder, _ = task_folder(None, "token", ["O", "B-Chemical", "I-Chemical"], Path(tmp))
    single_process()
    loaded = load_finetuned(folder, "ner")
    sents = [" ".join(s.words) for s in read_iob(NER_DEV)[:45]]
    # documents of 1, 2 and 3 sentences, two of them blank: lengths mixed across documents and windows
    docs, k = [], 0
    while k < len(sents):
        n = 1 + len(docs) % 3
        docs.append((f"d{len(docs)}", " ".join(sents[k:k + n])))
        k += n
    docs[3:3] = [("blank", ""), ("spaces", "   ")]
    alone = [(i, predict_entities(loaded, text)) for i, text in docs]
    batched = list(predict_documents(loaded, iter(docs), batch_size=8, window=10))
    return {"alone": alone, "batched": batched}


def test_predict_batches_across_documents_without_changing_entities(tmp_path):
    (res,) = run_world(1, _compare, str(tmp_path), timeout=300)
    alone, batched = res["alone"], res["batched"]
    assert [i for i, _ in batched] == [i for i, _ in alone]  # one record per document, in input order
    assert dict(batched)["blank"] == [] and dict(batched)["spaces"] == []
    assert sum(len(e) for _, e in alone) >= 30  # the seeded head tags a real mixture: the comparison bites
    for (doc, mine), (_, ref) in zip(batched, alone):
        assert [(e["type"], e["start"], e["end"], e["text"]) for e in mine] == \
            [(e["type"], e["start"], e["end"], e["text"]) for e in ref], doc
        assert all(abs(a["score"] - b["score"]) < 1e-5 for a, b in zip(mine, ref)), doc
