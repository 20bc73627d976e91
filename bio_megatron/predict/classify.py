"""``predict classify``: a fine-tuned BLURB classification checkpoint on new examples.

Input: the dataset's own file (the reader of the checkpoint's ``model.dataset.task_name``: a GAD/DDI/HoC/BIOSSES
tsv, a PubMedQA or BioASQ JSON; its gold labels are not used), or JSON lines ``{"id", "text"}`` with
``"text_b"`` for the pair datasets (PubMedQA, BioASQ yes/no: question and context; BIOSSES: the two sentences).
Output: one JSON line per example in the format ``bio-megatron evaluate <task_name> --pred`` reads:
``{"id", "label"}``, ``{"id", "score"}`` or ``{"id", "labels": [hallmark indices]}``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bio_megatron.predict.common import Loaded, task_config_of
from bio_megatron.tasks.classify import build_classify_head
from bio_megatron.tasks.classify_data import ClassifyExample, dataset, encode
from bio_megatron.tasks.model import build_task_model, load_into, resolve_source
from bio_megatron.utils.errors import CheckpointError, DataError
from bio_megatron.utils.io import iter_json_lines
from bio_megatron.vocab.bpe import load_tokenizer


def _classify_source(path: str | Path):
    src = resolve_source(path)
    if src.task != "classify":
        raise CheckpointError(f"{path}: a {src.task or 'pretraining'} model, not classify")
    if src.kind != "checkpoint":
        raise CheckpointError(f"{path}: a Hugging Face folder; predict classify reads fine-tuned checkpoints")
    return src, task_config_of(src)


def task_name_of(path: str | Path) -> str:
    """The BLURB dataset a classify checkpoint was trained on (its saved config; no weights are read)."""
    return _classify_source(path)[1].model.dataset.task_name


def load_classifier(path: str | Path) -> Loaded:
    """Encoder + classify head of a fine-tuned checkpoint (any saved layout), in eval mode, at TP1 in this
    process (``predict.common.load_finetuned`` for the other tasks; this task builds its own head)."""
    src, cfg = _classify_source(path)
    m = cfg.model
    for k, v in src.shape.items():
        setattr(m, k, v)
    m.tensor_model_parallel_size = m.pipeline_model_parallel_size = 1
    labels = src.labels or list(dataset(m.dataset.task_name).labels)
    tokenizer = load_tokenizer(src.vocab_file, m.tokenizer.do_lower_case)
    head = build_classify_head(m, m.shape().hidden_size, len(labels))
    model = build_task_model(m, src.padded_vocab or tokenizer.vocab_size, head, torch.float32, seed=0,
                             pre_process=True, post_process=True)
    load_into(model, src, encoder_only=False)
    return Loaded(model.eval(), cfg, tokenizer, labels, src)


def read_examples(path: str | Path, task_name: str) -> list[ClassifyExample]:
    """Examples of ``path``: JSON lines (``.jsonl``) or the dataset's own format (labels read, then unused)."""
    data = dataset(task_name)
    path = Path(path)
    if path.suffix != ".jsonl":
        return data.examples(path)
    want = '{"id", "text", "text_b"}' if data.pair else '{"id", "text"}'
    out, seen = [], set()
    for lineno, rec in iter_json_lines(path, f"input file not found (expected JSON lines {want})"):
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
    from bio_megatron.tasks.classify import ClassifyTask

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
        outputs = ClassifyTask.outputs_of(data.mode, logits)
        out.extend(data.prediction(e.id, o) for e, o in zip(examples[b:b + batch_size], outputs))
    return out
