"""Extractive QA fine-tuning (SQuAD v1.1/v2.0, BioASQ factoid in SQuAD format): start/end token classifier
with the spanning loss; dev scored with the official SQuAD logic, or the BioASQ factoid measures when a
golden file is given."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bio_megatron.evaluation.bioasq import build_submission, factoid_scores, submission_answers
from bio_megatron.evaluation.squad import evaluate as squad_evaluate
from bio_megatron.models.heads import build_head, spanning_loss
from bio_megatron.tasks.qa_data import (QAExample, QAFeature, build_features, load_json, postprocess,
                                        read_bioasq_golden, read_squad)
from bio_megatron.tasks.qa_holdout import golden_from_answers, held_out_ids
from bio_megatron.tasks.subset import take
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


@dataclass
class QaSplit:
    examples: list[QAExample]
    features: list[QAFeature]
    dataset: dict            # the SQuAD JSON, restricted to the examples used
    golden: dict | None = None  # BioASQ golden of a dev split carved from train (else bioasq_golden, read late)


def _restrict(dataset: dict, qids: set[str]) -> dict:
    data = []
    for art in dataset["data"]:
        paras = [{**p, "qas": [q for q in p["qas"] if str(q["id"]) in qids]} for p in art["paragraphs"]]
        data.append({**art, "paragraphs": [p for p in paras if p["qas"]]})
    return {**dataset, "data": data}


class QaTask:
    """Extractive QA for the shared fine-tuning loop (:class:`~bio_megatron.tasks.protocol.Task`)."""

    name = "qa"
    labels = None
    num_classes = 2

    def __init__(self, cfg, tokenizer, labels: list[str] | None = None):
        # ``labels``: the registry's common signature; a span head has none (a restored QA model's are None)
        self.d = cfg.model.dataset
        self.tokenizer = tokenizer
        self.metric = "mrr" if self.d.bioasq_golden else "f1"
        held_out: set[str] = set()
        if self.d.dev_holdout_fraction:  # dev carved from train by question: selection never sees test
            path = Path(self.d.data_dir) / self.d.train_file
            examples = read_squad(path, self.d.bad_answer_start)
            held_out = held_out_ids(examples, self.d.dev_holdout_fraction, str(path))
            log.info("%s: %d of %d examples held out as the dev split (model.dataset.dev_holdout_fraction=%s)",
                     path, len(held_out), len(examples), self.d.dev_holdout_fraction)
        self.train = self._split(self.d.train_file, self.d.max_train_examples, training=True,
                                 keep=lambda qid: qid not in held_out)
        self.splits = {"train": self.train}
        if held_out:
            dev = self._split(self.d.train_file, self.d.max_eval_examples, training=False, keep=held_out.__contains__)
            dev.golden = golden_from_answers(dev.examples) if self.d.bioasq_golden else None
            self.splits["dev"] = dev

    def _split(self, name: str, limit: int | None, training: bool, keep=None) -> QaSplit:
        path = Path(self.d.data_dir) / name
        examples = read_squad(path, self.d.bad_answer_start)
        examples = [e for e in examples if keep(e.qid)] if keep is not None else examples
        examples = take(examples, limit, self.d.max_examples_seed, lambda e: e.is_impossible)  # answerable or not
        if not self.d.version_2_with_negative:
            # SQuAD v1.1 semantics: every question has an answer (its official scorer cannot score others)
            kept = [e for e in examples if e.answers and not e.is_impossible]
            if len(kept) < len(examples):
                log.warning("%s: %d unanswerable question(s) skipped (version_2_with_negative is false)", path,
                            len(examples) - len(kept))
            examples = kept
        elif training:  # v2: a question is either answered or marked is_impossible (target [CLS])
            examples = [e for e in examples if e.answers or e.is_impossible]
        feats = build_features(examples, self.tokenizer, self.d.max_seq_length, self.d.doc_stride,
                               self.d.max_query_length, training=training)
        return QaSplit(examples, feats, _restrict(load_json(path), {e.qid for e in examples}))

    def split(self, name: str) -> QaSplit | None:
        if name not in self.splits:
            file = {"dev": self.d.dev_file, "test": self.d.test_file}[name]
            if not file:
                return None
            self.splits[name] = self._split(file, self.d.max_eval_examples, training=False)
        return self.splits[name]

    def build_head(self, model_cfg) -> nn.Module:
        return build_head(self.name, model_cfg, model_cfg.shape().hidden_size, self.num_classes)

    def length(self, split: QaSplit, i: int) -> int:
        return len(split.features[i].input_ids)

    def collate(self, split: QaSplit, indices: list[int], seq_len: int) -> dict[str, torch.Tensor]:
        ids = torch.full((len(indices), seq_len), self.tokenizer.pad, dtype=torch.long)  # RoBERTa's <pad> is 1
        types, mask = torch.zeros_like(ids), torch.zeros_like(ids)
        for r, i in enumerate(indices):
            f = split.features[max(i, 0)]
            ids[r, :len(f.input_ids)] = torch.tensor(f.input_ids)
            types[r, :len(f.input_ids)] = torch.tensor(f.token_type_ids)
            mask[r, :len(f.input_ids)] = 1
        feats = [split.features[max(i, 0)] for i in indices]
        return {"input_ids": ids, "attention_mask": mask, "tokentype_ids": types, "index": torch.tensor(indices),
                "start": torch.tensor([f.start_position for f in feats]),
                "end": torch.tensor([f.end_position for f in feats])}

    def loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        return spanning_loss(logits, batch["start"], batch["end"])

    def outputs(self, logits: torch.Tensor, batch: dict) -> list:
        return self.decode(self.d, logits, batch["attention_mask"])

    @staticmethod
    def decode(dataset_cfg, logits: torch.Tensor, attention_mask: torch.Tensor) -> list[tuple[list, list]]:
        """Per-feature (start logits, end logits) over the real (unpadded) positions."""
        lens = attention_mask.sum(-1).tolist()
        return [(logits[r, :L, 0].tolist(), logits[r, :L, 1].tolist()) for r, L in enumerate(lens)]

    def answers(self, split: QaSplit, outputs: list) -> tuple[dict, dict, dict]:
        """(predictions, nbest, null_odds) by question id, BERT's post-processing."""
        return postprocess(split.examples, split.features, [o[0] for o in outputs], [o[1] for o in outputs],
                           self.d.n_best_size, self.d.max_answer_length, self.d.version_2_with_negative,
                           self.d.null_score_diff_threshold)

    def score(self, split: QaSplit, outputs: list) -> dict:
        predictions, nbest, _ = self.answers(split, outputs)
        if self.d.bioasq_golden:
            golden = split.golden if split.golden is not None else read_bioasq_golden(self.d.bioasq_golden)
            return factoid_scores(golden, submission_answers(build_submission(nbest)))
        version = "2.0" if self.d.version_2_with_negative else "1.1"
        scores = squad_evaluate(split.dataset, predictions, version)
        return scores

    def write_predictions(self, split: QaSplit, outputs: list, path: Path) -> Path | None:
        """None: QA writes no prediction file here (``predict qa`` writes answers and n-best lists)."""
        return None
