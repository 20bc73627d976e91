"""``predict qa``: answer questions over given contexts with a fine-tuned QA checkpoint.

Input: a SQuAD-format JSON file, or JSON lines ``{"id", "question", "context"}``. Output: question id ->
answer text (``""`` = no answer, SQuAD v2), plus the n-best lists (the input of the BioASQ submission step).
"""

from __future__ import annotations

from pathlib import Path

import torch

from bio_megatron.formats.finetuned import Loaded
from bio_megatron.predict.inputs import json_lines
from bio_megatron.tasks.qa import QaTask
from bio_megatron.tasks.qa_data import QAExample, build_features, postprocess, read_squad
from bio_megatron.utils.errors import DataError


def read_questions(path: str | Path) -> list[QAExample]:
    """Questions of a SQuAD JSON or JSON lines ``{"id", "question", "context"}``, each id once: the output maps
    id -> answer, so a repeated id would silently keep only one of the answers."""
    path = Path(path)
    if path.suffix != ".jsonl":
        examples = read_squad(path, None)  # its answers are not used: an answer_start is not checked
        seen: set[str] = set()
        for e in examples:
            if e.qid in seen:
                raise DataError(f"question id {e.qid!r} is used twice (the output maps id -> answer)", str(path))
            seen.add(e.qid)
        if not examples:
            raise DataError("no questions (expected SQuAD JSON: data[].paragraphs[].qas[])", str(path))
        return examples
    out, lines = [], {}
    for lineno, rec in json_lines(path, 'JSON lines {"id", "question", "context"}'):
        if not isinstance(rec, dict) or not isinstance(rec.get("question"), str) or not rec["question"].strip():
            raise DataError('expected an object with a "question" string', str(path), lineno)
        if not isinstance(rec.get("context"), str) or not rec["context"].strip():
            raise DataError(f'question {rec.get("id", lineno)!r} has no "context" text', str(path), lineno)
        qid = str(rec.get("id", lineno))
        if qid in lines:
            raise DataError(f"question id {qid!r} is used twice (also on line {lines[qid]}; the output maps id -> "
                            f"answer)", str(path), lineno)
        lines[qid] = lineno
        out.append(QAExample(qid, rec["question"], rec["context"]))
    if not out:
        raise DataError('no questions (expected JSON lines {"id", "question", "context"})', str(path))
    return out


@torch.no_grad()
def answer(loaded: Loaded, examples: list[QAExample], batch_size: int = 16) -> tuple[dict, dict]:
    """(predictions, nbest) keyed by question id, with the checkpoint's own QA settings."""
    d = loaded.cfg.model.dataset
    feats = build_features(examples, loaded.tokenizer, d.max_seq_length, d.doc_stride, d.max_query_length)
    starts, ends = [], []
    for b in range(0, len(feats), batch_size):
        group = feats[b:b + batch_size]
        seq = max(len(f.input_ids) for f in group)
        ids = torch.full((len(group), seq), loaded.tokenizer.pad, dtype=torch.long)  # RoBERTa's <pad> is 1
        types, mask = torch.zeros_like(ids), torch.zeros_like(ids)
        for r, f in enumerate(group):
            n = len(f.input_ids)
            ids[r, :n], types[r, :n], mask[r, :n] = torch.tensor(f.input_ids), torch.tensor(f.token_type_ids), 1
        logits = loaded.model(ids.to(loaded.device), mask.to(loaded.device), types.to(loaded.device)).float().cpu()
        for start, end in QaTask.decode(d, logits, mask):  # the task's own decoding, as in fine-tuning
            starts.append(start)
            ends.append(end)
    predictions, nbest, _ = postprocess(examples, feats, starts, ends, d.n_best_size, d.max_answer_length,
                                        d.version_2_with_negative, d.null_score_diff_threshold)
    return predictions, nbest
