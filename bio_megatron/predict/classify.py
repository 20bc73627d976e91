"""``predict classify``: a fine-tuned BLURB classification checkpoint on new examples.

Input: the dataset's own file (the reader of the checkpoint's ``model.dataset.task_name``: a GAD/DDI/HoC/BIOSSES
tsv, a PubMedQA or BioASQ JSON; its gold labels are not used), or JSON lines ``{"id", "text"}`` with
``"text_b"`` for the pair datasets (PubMedQA, BioASQ yes/no: question and context; BIOSSES: the two sentences).
Output: one JSON line per example in the format ``bio-megatron evaluate <task_name> --pred`` reads:
``{"id", "label"}``, ``{"id", "score"}`` or ``{"id", "labels": [hallmark indices]}``, with the model's confidence
beside it (:func:`_confidence`: ``probability``/``probabilities``; ``evaluate`` ignores keys it does not read).
"""

from __future__ import annotations

from pathlib import Path

import torch

from bio_megatron.formats.finetuned import Loaded, finetuned_source, load_finetuned
from bio_megatron.predict.inputs import json_lines
from bio_megatron.tasks.classify import ClassifyTask
from bio_megatron.tasks.classify_data import ClassifyExample, dataset, encode
from bio_megatron.tasks.clinical_data import is_mednli_release
from bio_megatron.utils.errors import DataError


def dataset_config_of(path: str | Path):
    """The ``model.dataset`` a classify checkpoint was trained with (its saved config; no weights are read):
    ``task_name`` and the reader's options (PubMedQA's ``pubmedqa_long_answer``)."""
    return finetuned_source(path, "classify")[1].model.dataset


def task_name_of(path: str | Path) -> str:
    """The BLURB dataset a classify checkpoint was trained on."""
    return dataset_config_of(path).task_name


def load_classifier(path: str | Path) -> Loaded:
    """Encoder + classify head of a fine-tuned checkpoint (any saved layout), in eval mode, at TP1 in this
    process; the labels default to the dataset's when the checkpoint has no ``label_ids.csv``. (An HF folder is
    never a classify model: ``export hf`` writes transformers' sequence class, read back as ``re``.)"""
    return load_finetuned(path, "classify", default_labels=dataset(task_name_of(path)).labels)


def read_examples(path: str | Path, dataset_cfg) -> list[ClassifyExample]:
    """Examples of ``path``: JSON lines (``.jsonl``) or the dataset's own format (labels read, then unused), read
    as in training (``dataset_cfg``: the checkpoint's ``model.dataset``; a reasoning-free PubMedQA model gets
    the conclusions)."""
    task_name = dataset_cfg.task_name
    data = dataset(task_name)
    path = Path(path)
    if path.suffix != ".jsonl" or (task_name == "mednli" and is_mednli_release(path)):  # MedNLI ships .jsonl
        return data.examples(path, **data.reader_options(dataset_cfg))
    want = '{"id", "text", "text_b"}' if data.pair else '{"id", "text"}'
    out, seen = [], set()
    for lineno, rec in json_lines(path, f"JSON lines {want}"):
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
            raise DataError(f"expected an object {want} with a string \"text\"", str(path), lineno)
        second = rec.get("text_b")
        if data.pair != isinstance(second, str):
            raise DataError(f"{task_name} reads {'sentence pairs: a string' if data.pair else 'one text: no'} "
                            f"\"text_b\" (expected {want})", str(path), lineno)
        example_id = str(rec.get("id", lineno))
        if example_id in seen:
            raise DataError(f"id {example_id!r} is used twice", str(path), lineno)
        seen.add(example_id)
        out.append(ClassifyExample(example_id, rec["text"], second, None))
    if not out:
        raise DataError(f"no examples (expected JSON lines {want})", str(path))
    return out


@torch.no_grad()
def predict(loaded: Loaded, examples: list[ClassifyExample], batch_size: int = 32) -> list[dict]:
    """One evaluator-format JSON object per example, in input order."""
    d = loaded.cfg.model.dataset
    data = dataset(d.task_name)
    feats = encode(examples, loaded.tokenizer, d.max_seq_length)
    out: list[dict] = []
    for b in range(0, len(feats), batch_size):
        group = feats[b:b + batch_size]
        seq = max(len(ids) for ids, _ in group)
        ids = torch.full((len(group), seq), loaded.tokenizer.pad, dtype=torch.long)  # RoBERTa's <pad> is 1
        types, mask = torch.zeros_like(ids), torch.zeros_like(ids)
        for r, (f_ids, f_types) in enumerate(group):
            ids[r, :len(f_ids)], types[r, :len(f_ids)], mask[r, :len(f_ids)] = \
                torch.tensor(f_ids), torch.tensor(f_types), 1
        dev = loaded.device
        logits = loaded.model(ids.to(dev), mask.to(dev), types.to(dev)).float().cpu()
        outputs = ClassifyTask.decode(d, logits, mask)  # the task's own decoding, as in fine-tuning
        for e, o, row in zip(examples[b:b + batch_size], outputs, logits):
            out.append({**data.prediction(e.id, o), **_confidence(data, o, row)})
    return out


def _confidence(data, output, logits: torch.Tensor) -> dict:
    """The model's probabilities beside the prediction (``evaluate`` reads only its own key): single-label, the
    softmax ``probability`` of the predicted label and ``probabilities`` of every label; multi-label (HoC), the
    sigmoid of every label (those above 0.5 are ``labels``); regression (BIOSSES) has none (its ``score`` is the
    prediction itself)."""
    if data.mode == "single":
        p = logits.softmax(-1).tolist()
        return {"probability": round(p[output], 6), "probabilities": {t: round(v, 6) for t, v in zip(data.labels, p)}}
    if data.mode == "multi":
        return {"probabilities": {t: round(v, 6) for t, v in zip(data.labels, logits.sigmoid().tolist())}}
    return {}
