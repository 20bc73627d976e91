"""``predict ner``: documents (plain text, one per line, or JSON lines ``{"id", "text"}``) -> entities with
character offsets, one JSON object per document.

Words are cut with BERT's pre-tokenizer (white space and punctuation, as in the IOB training files) whatever
the vocabulary (a RoBERTa model then encodes each word as in fine-tuning), sentences with the ChemProt
splitter; a sentence longer than the model's ``max_seq_length`` is cut into pieces that fit. Tags are read
per word at the first sub-token, chunks follow conlleval's rules. Each entity's ``score`` is the mean, over its
words, of the softmax probability of the word's predicted tag at that first sub-token.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterable, Iterator

import torch

from bio_megatron.evaluation.conlleval import chunks
from bio_megatron.formats.finetuned import Loaded
from bio_megatron.predict.inputs import json_lines, text_lines
from bio_megatron.tasks.ner import NerTask
from bio_megatron.tasks.ner_data import Sentence, encode_sentences, word_predictions
from bio_megatron.tasks.re_data import split_sentences
from bio_megatron.utils.errors import DataError


def read_documents(path: str | Path) -> Iterator[tuple[str, str]]:
    """(id, text) of every document: ``.jsonl`` lines ``{"id": ..., "text": ...}``, else one document per line
    (a blank line is a document without entities: the output keeps one record per input line)."""
    path = Path(path)
    expected = ('docs.jsonl, one {"id", "text"} object per line' if path.suffix == ".jsonl" else
                "text.txt (one document per line) or docs.jsonl")
    any_text = False
    if path.suffix == ".jsonl":
        for lineno, rec in json_lines(path, expected):
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                raise DataError('expected an object with a "text" string', str(path), lineno)
            any_text = any_text or bool(rec["text"].strip())
            yield str(rec.get("id", lineno)), rec["text"]
    else:
        for lineno, line in text_lines(path, expected):
            any_text = any_text or bool(line.strip())
            yield str(lineno), line
    if not any_text:  # an empty output would look like a model that found nothing
        raise DataError(f"no text in any document (expected {expected})", str(path))


def _word_spans(loaded: Loaded, text: str) -> list[list[tuple[str, tuple[int, int]]]]:
    """Sentences as lists of (word, (start, end)), each short enough for the model."""
    from tokenizers.pre_tokenizers import BertPreTokenizer

    pre = BertPreTokenizer()  # the words of the IOB files, not the byte-level pieces a BPE backend would cut
    limit = loaded.cfg.model.dataset.max_seq_length - 2
    out = []
    for s0, e0 in split_sentences(text):
        words = [(w, (s0 + a, s0 + b)) for w, (a, b) in pre.pre_tokenize_str(text[s0:e0])]
        lens = [len(e.ids) or 1 for e in loaded.tokenizer.encode_words([[w] for w, _ in words])]
        piece, used = [], 0
        for wd, n in zip(words, lens):
            if piece and used + n > limit:
                out.append(piece)
                piece, used = [], 0
            piece.append(wd)
            used += n
        if piece:
            out.append(piece)
    return out


def predict_entities(loaded: Loaded, text: str, batch_size: int = 32) -> list[dict]:
    """Entities of one document: ``{"text", "type", "start", "end", "score"}`` with end-exclusive character
    offsets (``score``: :func:`_word_confidence`, averaged over the entity's words)."""
    ((_, entities),) = predict_documents(loaded, [("", text)], batch_size)
    return entities


def predict_documents(loaded: Loaded, docs: Iterable[tuple[str, str]], batch_size: int = 32,
                      window: int = 4096) -> Iterator[tuple[str, list[dict]]]:
    """``(id, entities)`` of every ``(id, text)`` document, in input order (entities as :func:`predict_entities`).

    The sentences of up to ``window`` sentences' worth of documents are batched together, shortest first: with one
    sentence per line, batching within a document ran every sentence alone (batch 1, all overhead), and a batch
    of sentences of similar length carries little padding. Padding is masked out of attention, so a sentence's tags
    do not depend on its batch (its scores only to the last float bits of the matmuls). Only the window's
    sentences are held at once, whatever the length of ``docs``."""
    pending: list[tuple[str, str, list]] = []
    count = 0
    for doc_id, text in docs:
        sents = _word_spans(loaded, text) if text.strip() else []
        pending.append((doc_id, text, sents))
        count += len(sents)
        if count >= window:
            yield from _predict_window(loaded, pending, batch_size)
            pending, count = [], 0
    if pending:
        yield from _predict_window(loaded, pending, batch_size)


def predict_window(loaded: Loaded, docs: list[tuple[str, str]], batch_size: int = 32) -> list[tuple[str, list[dict]]]:
    """``(id, entities)`` of every document of one window, all its sentences batched together (``predict --workers``
    and the streaming path cut the windows themselves)."""
    return list(predict_documents(loaded, docs, batch_size, window=sys.maxsize))


def sentence_count(text: str) -> int:
    """The sentences a document is split into before the model's length cuts: what a window is measured in."""
    return len(split_sentences(text)) if text.strip() else 0


@torch.no_grad()
def _predict_window(loaded: Loaded, pending: list[tuple[str, str, list]],
                    batch_size: int) -> Iterator[tuple[str, list[dict]]]:
    """Tag every sentence of ``pending`` in length-sorted batches, then chunk each document's words into entities."""
    sents = [s for _, _, doc_sents in pending for s in doc_sents]
    labels = loaded.labels
    label_map = {t: i for i, t in enumerate(labels)}
    pad = loaded.cfg.model.dataset.pad_label
    feats = encode_sentences([Sentence([w for w, _ in s], [pad] * len(s)) for s in sents], loaded.tokenizer,
                             label_map, loaded.cfg.model.dataset.max_seq_length) if sents else []
    order = sorted(range(len(feats)), key=lambda k: len(feats[k].input_ids))  # stable: ties keep input order
    tagged: list[tuple[list[str], list[float]]] = [([], [])] * len(feats)  # per sentence: word tags, confidences
    dev = loaded.device
    for b in range(0, len(order), batch_size):
        rows = order[b:b + batch_size]
        seq = max(len(feats[k].input_ids) for k in rows)
        ids = torch.full((len(rows), seq), loaded.tokenizer.pad, dtype=torch.long)  # RoBERTa's <pad> is 1
        mask = torch.zeros_like(ids)
        for r, k in enumerate(rows):
            ids[r, :len(feats[k].input_ids)] = torch.tensor(feats[k].input_ids)
            mask[r, :len(feats[k].input_ids)] = 1
        logits = loaded.model(ids.to(dev), mask.to(dev), torch.zeros_like(ids).to(dev))
        pred = NerTask.decode(loaded.cfg.model.dataset, logits, mask)  # the task's own decoding, as in fine-tuning
        probs = logits.float().softmax(-1).cpu()
        for r, k in enumerate(rows):
            tagged[k] = ([labels[t] for t in word_predictions(pred[r], feats[k])],
                         _word_confidence(probs[r], pred[r], feats[k]))
    k = 0
    for doc_id, text, doc_sents in pending:
        entities = []
        for spans in doc_sents:
            tags, conf = tagged[k]
            k += 1
            for ty, s, e in chunks([w for w, _ in spans], tags):
                start, end = spans[s][1][0], spans[e - 1][1][1]
                entities.append({"text": text[start:end], "type": ty, "start": start, "end": end,
                                 "score": round(sum(conf[s:e]) / (e - s), 6)})
        yield doc_id, entities


def _word_confidence(probs: torch.Tensor, pred: list[int], feature) -> list[float]:
    """Per word, the softmax probability of its predicted tag at the sub-token the tag is read from (its first);
    an entity's ``score`` is the mean over its words. Words without a position (cut) get 0."""
    out = [0.0] * feature.num_words
    seen = set()
    for pos, w in enumerate(feature.word_ids):
        if w is not None and w not in seen and pos < len(pred):
            out[w] = float(probs[pos, pred[pos]])
            seen.add(w)
    return out
