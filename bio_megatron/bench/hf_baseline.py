"""The Hugging Face side of ``bench finetune`` (one epoch) and ``bench predict``, run as a script in a fresh
interpreter: ``python hf_baseline.py {epoch,predict} ARGS.json``.

It imports nothing from ``bio_megatron`` (whose import would add our start-up to theirs): it is what a user of
transformers alone would write. ``predict``: ``pipeline("token-classification", aggregation_strategy="first")``
over every line of a text file, batched, entities written as JSON lines (the grouping ``predict ner`` matches,
docs/INTERCHANGE.md). ``epoch``: read the prepared examples (JSON lines: ``{"words", "tags"}`` or ``{"text",
"label"}``), tokenize with the folder's fast tokenizer (NER: the label on each word's first sub-token, -100
elsewhere), take them in the order given (``bench finetune`` gives our run's: the same batches on both sides; else
a seeded shuffle), pad each batch to its longest example, train one epoch with ``torch.optim.AdamW(fused=True)``
(the Trainer's default ``adamw_torch_fused``), gradient clipping 1.0 and a linear schedule with 10% warmup, under
``torch.autocast`` for bf16, then predict the dev examples and ``save_pretrained`` the model. Timings of its phases
go to stdout as one JSON object.
"""

from __future__ import annotations

import json
import sys
import time

T0 = time.perf_counter()


def _read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _encode(tok, examples: list[dict], label2id: dict, max_len: int, ner: bool) -> list[dict]:
    if ner:
        enc = tok([e["words"] for e in examples], is_split_into_words=True, truncation=True, max_length=max_len)
    elif any(e.get("text_b") for e in examples):  # sentence pairs (PubMedQA, BioASQ yes/no)
        enc = tok([e["text"] for e in examples], [e["text_b"] or "" for e in examples], truncation=True,
                  max_length=max_len)
    else:
        enc = tok([e["text"] for e in examples], truncation=True, max_length=max_len)
    out = []
    for i, e in enumerate(examples):
        item = {k: enc[k][i] for k in ("input_ids", "attention_mask", "token_type_ids")}
        if ner:
            labels, prev = [], None
            for w in enc.word_ids(i):
                labels.append(-100 if w is None or w == prev else label2id[e["tags"][w]])
                prev = w
            item["labels"] = labels
        else:
            item["labels"] = label2id[e["label"]]
        out.append(item)
    return out


def _collate(items: list[dict], pad_id: int, ner: bool):
    import torch

    n, seq = len(items), max(len(x["input_ids"]) for x in items)
    batch = {"input_ids": torch.full((n, seq), pad_id, dtype=torch.long),
             "attention_mask": torch.zeros(n, seq, dtype=torch.long),
             "token_type_ids": torch.zeros(n, seq, dtype=torch.long)}
    if ner:
        batch["labels"] = torch.full((n, seq), -100, dtype=torch.long)
    for r, x in enumerate(items):
        L = len(x["input_ids"])
        for k in ("input_ids", "attention_mask", "token_type_ids"):
            batch[k][r, :L] = torch.tensor(x[k])
        if ner:
            batch["labels"][r, :L] = torch.tensor(x["labels"])
    if not ner:
        batch["labels"] = torch.tensor([x["labels"] for x in items])
    return batch


def epoch(a: dict) -> dict:
    import torch
    from transformers import (AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer,
                              get_linear_schedule_with_warmup)

    torch.set_num_threads(a["threads"])
    torch.manual_seed(a["seed"])
    ner = a["task"] == "ner"
    cls = AutoModelForTokenClassification if ner else AutoModelForSequenceClassification
    model, tok = cls.from_pretrained(a["model"]), AutoTokenizer.from_pretrained(a["model"])
    t_load = time.perf_counter()
    label2id = model.config.label2id
    train = _encode(tok, _read_jsonl(a["train"]), label2id, a["max_seq_length"], ner)
    dev = _encode(tok, _read_jsonl(a["dev"]), label2id, a["max_seq_length"], ner)
    t_data = time.perf_counter()
    bs = a["batch"]
    steps = len(train) // bs  # as ours: the last partial batch is dropped
    opt = torch.optim.AdamW(model.parameters(), lr=a["lr"], weight_decay=0.0, fused=True)
    sched = get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)
    autocast = torch.autocast("cpu" if not torch.cuda.is_available() else "cuda", dtype=torch.bfloat16,
                              enabled=a["precision"] == "bf16")
    dev_ = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(dev_).train()
    # the order our run takes the examples in (bench finetune passes it: the same batches on both sides), else a
    # seeded shuffle
    perm = a.get("order") or torch.randperm(len(train), generator=torch.Generator().manual_seed(a["seed"])).tolist()
    for s in range(steps):
        b = {k: v.to(dev_) for k, v in _collate([train[i] for i in perm[s * bs:(s + 1) * bs]], tok.pad_token_id,
                                                ner).items()}
        with autocast:
            loss = model(**b).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    t_train = time.perf_counter()
    model.eval()
    with torch.no_grad(), autocast:
        for s in range(0, len(dev), bs):
            b = _collate(dev[s:s + bs], tok.pad_token_id, ner)
            b.pop("labels")
            model(**{k: v.to(dev_) for k, v in b.items()}).logits.argmax(-1).tolist()
    t_dev = time.perf_counter()
    model.save_pretrained(a["out"])
    tok.save_pretrained(a["out"])
    t_end = time.perf_counter()
    return {"steps": steps, "train_examples": len(train), "dev_examples": len(dev),
            "seconds": {"imports": T_IMPORTS - T0, "load": t_load - T_IMPORTS, "data": t_data - t_load,
                        "train": t_train - t_data, "dev": t_dev - t_train, "save": t_end - t_dev}}


def predict(a: dict) -> dict:
    import torch
    from transformers import pipeline

    torch.set_num_threads(a["threads"])
    pipe = pipeline("token-classification", model=a["model"], aggregation_strategy="first",
                    device=0 if torch.cuda.is_available() else "cpu")
    t_load = time.perf_counter()
    with open(a["input"], encoding="utf-8") as fh:
        texts = fh.read().split("\n")[:-1]
    results = pipe(texts, batch_size=a["batch"])
    t_pred = time.perf_counter()
    with open(a["out"], "w", encoding="utf-8") as fh:
        for i, ents in enumerate(results, 1):
            fh.write(json.dumps({"id": str(i), "entities": [
                {"type": e["entity_group"], "start": int(e["start"]), "end": int(e["end"]),
                 "score": float(e["score"])} for e in ents]}) + "\n")
    return {"sentences": len(texts), "seconds": {"imports": T_IMPORTS - T0, "load": t_load - T_IMPORTS,
                                                 "predict": t_pred - t_load, "write": time.perf_counter() - t_pred}}


if __name__ == "__main__":
    import torch  # noqa: F401  (counted as the baseline's imports, as ours counts megatron-core's)
    import transformers  # noqa: F401

    T_IMPORTS = time.perf_counter()
    command, args_path = sys.argv[1], sys.argv[2]
    with open(args_path, encoding="utf-8") as fh:
        args = json.load(fh)
    print(json.dumps({"epoch": epoch, "predict": predict}[command](args)))
