"""Label bias of a benchmark dataset, as Table 8 of the BioMegatron paper defines it.

Shin et al., EMNLP 2020, §5.5 "Size and Bias in Biomedical Datasets", Table 8 caption: label bias is
*[sum of the #samples of minority labels] / [#samples of majority label]* for NER and RE
(classification), and *[#minimum repeat of the same answer] / [#maximum repeat of the same answer]*
for QA. Table 8 also lists the number of samples of each dataset. Lower means more biased (BC5CDR
0.08 against CoNLL-2003 0.18; BioASQ-7b 0.02 against SQuAD 0.4).

What a "sample of a label" is, per task (the caption leaves the unit to the text around it):

* **NER**: a token tagged with the label; the majority label is ``O`` on any real corpus, so the
  figure is "the ratio of [B/I] to O tags" as the paper's text puts it. Counted per word by default;
  with a vocabulary, per sub-token under either labelling scheme of the paper's Figure 1 (every
  sub-token carries its word's label, or only the first one does: NeMo's ``ignore_extra_tokens``),
  because that is what the loss sees. Samples = sentences.
* **RE / classification**: one example per sample (for ChemProt the majority label is ``false``).
* **QA**: the repeat count of a question-answer combination is the number of samples (question-context
  pairs) with the same question text and the same answer text (the first gold answer, the one a model
  is trained on; whitespace runs collapsed, case kept). BioASQ in SQuAD format repeats a question once
  per snippet, "up to 88 times" in BioASQ-7b; SQuAD questions repeat "at most twice". Unanswerable
  SQuAD v2 questions have no answer: they are left out of the repeats and counted apart.

The paper's figures agree with this reading where its counts are public: MRPC's training split has
1,194 negative and 2,474 positive pairs, 1194 / 2474 = 0.48; ChemProt's 19,461 samples with the 4,157
gold relations of the BioCreative VI training set as minority give 4157 / 15304 = 0.27. For BC5CDR
(0.08) and CoNLL-2003 (0.18) the files and tokenisation behind the table are not known: word-level
counts of the BioBERT/MTL BC5CDR-chem training split give 0.064, BERT-cased sub-token counts 0.150.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Sequence

from bio_megatron.utils.errors import DataError

DEFINITION = {
    "ner": "sum of #tokens of the minority tags / #tokens of the majority tag (O)",
    "re": "sum of #examples of the minority labels / #examples of the majority label",
    "qa": "#minimum repeat / #maximum repeat of the same question-answer combination",
}


def bias_from_counts(counts: Mapping[str, int], what: str = "labels") -> dict:
    """Table 8's NER/RE ratio from per-label sample counts; ties for the majority go to the first name."""
    counts = {k: int(v) for k, v in counts.items() if v}
    if not counts:
        raise DataError(f"no {what} to count")
    majority = min(counts, key=lambda k: (-counts[k], k))
    minority = sum(v for k, v in counts.items() if k != majority)
    return {"label_bias": minority / counts[majority], "majority_label": majority,
            "majority_count": counts[majority], "minority_count": minority,
            "label_counts": dict(sorted(counts.items()))}


def ner_label_bias(sentences: Sequence, tokenizer=None, ignore_extra_tokens: bool = False) -> dict:
    """Label bias of NER sentences (objects with ``words`` and ``tags``), per word or per sub-token.

    With ``tokenizer`` (a :class:`~bio_megatron.vocab.wordpiece.WordPieceTokenizer`) every sub-token the
    loss sees is a sample: all of a word's sub-tokens, or only the first with ``ignore_extra_tokens``.
    """
    if tokenizer is None:
        counts = Counter(t for s in sentences for t in s.tags)
        unit = "word"
    else:
        counts = Counter()
        pieces = tokenizer.tokenize_batch([w for s in sentences for w in s.words])
        tags = (t for s in sentences for t in s.tags)
        for word_pieces, tag in zip(pieces, tags):
            # a word that normalises to nothing has no sub-token, hence no label in the loss
            counts[tag] += min(len(word_pieces), 1) if ignore_extra_tokens else len(word_pieces)
        unit = "first sub-token" if ignore_extra_tokens else "sub-token"
    return {"samples": len(sentences), "unit": unit, **bias_from_counts(counts, "tags")}


def classification_label_bias(labels: Iterable[str]) -> dict:
    """Label bias of a classification dataset (ChemProt, MRPC, ...) from its example labels."""
    labels = list(labels)
    return {"samples": len(labels), "unit": "example", **bias_from_counts(Counter(labels), "labels")}


def qa_label_bias(examples: Sequence) -> dict:
    """Label bias of extractive QA samples (objects with ``question``, ``answers``, ``is_impossible``)."""
    repeats: Counter = Counter()
    unanswerable = 0
    for ex in examples:
        if ex.is_impossible or not ex.answers:
            unanswerable += 1
            continue
        repeats[(" ".join(ex.question.split()), " ".join(ex.answers[0]["text"].split()))] += 1
    if not repeats:
        raise DataError("no answered questions to count")
    (question, answer), most = repeats.most_common(1)[0]
    least = min(repeats.values())
    return {"samples": len(examples), "unit": "question-answer combination", "label_bias": least / most,
            "min_repeat": least, "max_repeat": most, "combinations": len(repeats),
            "unanswerable": unanswerable,
            "most_repeated": {"question": question, "answer": answer, "repeats": most}}


def markdown_table(rows: Sequence[tuple[str, str, dict]]) -> str:
    """Table 8's layout: task, dataset, # samples, bias (two decimals, as printed in the paper)."""
    lines = ["| Task | Dataset | # Samples | Bias |", "|---|---|---:|---:|"]
    lines += [f"| {task} | {name} | {r['samples']} | {r['label_bias']:.2f} |" for task, name, r in rows]
    return "\n".join(lines) + "\n"
