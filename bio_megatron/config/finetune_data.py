"""Each fine-tuning task's ``model.dataset`` keys (NeMo's names; NER, RE, QA, BLURB and clinical classification) and
the two heads' keys: ``model.head`` (NeMo's TokenClassifier: NER and QA) and ``model.classifier_head`` (its
SequenceClassifier: RE and classification). ``config/finetune.py`` puts them into each task's model config and
checks them with the rest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class HeadConfig:
    """NeMo's TokenClassifier: dropout on every token's hidden state, then an MLP."""

    num_fc_layers: int = 2
    """Linear layers in the MLP, counting the output layer (1 = a single linear classifier)."""
    fc_dropout: float = 0.5
    activation: Literal["relu", "gelu", "tanh"] = "relu"
    use_transformer_init: bool = True
    """True: N(0, init_method_std) weights, zero biases; False: PyTorch's default Linear init."""


@dataclass
class ClassifierHeadConfig:
    """NeMo's SequenceClassifier over the [CLS] position."""

    num_output_layers: int = 2
    fc_dropout: float = 0.1
    activation: Literal["relu", "gelu", "tanh"] = "relu"
    use_transformer_init: bool = True
    pooling: Literal["cls", "mean"] = "cls"
    """What the classifier reads: the [CLS] position (NeMo's), or ``mean``, the average over the example's real
    tokens (HF ModernBERT's ``classifier_pooling: mean``; model.family modernbert only)."""


@dataclass
class _DatasetBase:
    """What every task's ``model.dataset`` has."""

    group_by_length: bool = False
    """true: each training step's examples are of similar length, so a step pads little (transformers'
    ``group_by_length``; tasks/batch_order.py). The epoch's examples are the same; which share a step changes."""


@dataclass
class NerDatasetConfig(_DatasetBase):
    data_dir: str = "../shared/data/ner/BC5CDR-chem"
    format: Literal["iob", "nemo", "blue", "i2b2_2010", "i2b2_2012", "i2b2_2014", "share_clefe"] = "iob"
    """iob: ``token<TAB>tag`` files; nemo: ``text_<split>.txt`` with ``labels_<split>.txt`` beside it; blue: BLUE's
    ``token<TAB>document<TAB>offset<TAB>label`` files (as bio-lm reads BC5CDR; tasks/blue_ner.py); i2b2_2010,
    i2b2_2012, i2b2_2014: the i2b2 releases as unpacked, each split file a folder under data_dir, or ``train`` /
    ``dev`` for bio-lm's patient-level split of the training release (tasks/i2b2.py, tasks/i2b2_xml.py);
    share_clefe: ShARe/CLEF 2013's reports and pipe files (tasks/share_clefe.py)."""
    train_file: str = "train.tsv"
    dev_file: str = "devel.tsv"
    test_file: str | None = "test.tsv"
    max_seq_length: int = 128
    packing: bool = False
    """true: the sentences of a micro-batch share rows, each attending only to itself (tasks/packing.py); the same
    losses and predictions as unpacked, with less padding."""
    pad_label: str = "O"
    ignore_extra_tokens: bool = False
    """False: every sub-token is labelled; True: only the first sub-token is labelled."""
    continuation_label: Literal["inside", "word"] = "inside"
    """The label of a ``B-X`` word's later sub-tokens (words are predicted from their first sub-token either way):
    inside: ``I-X`` (transformers' run_ner ``b_to_i_label``), so an exported model's sub-tokens read as IOB and
    ``pipeline(aggregation_strategy="simple")`` groups whole entities; word: ``B-X`` (NeMo: every sub-token
    carries its word's label; "simple" then splits entities at every sub-token)."""
    ignore_start_end: bool = True
    class_balancing: Literal["weighted_loss"] | None = None
    max_train_examples: int | None = None
    """Use only the first N training sentences (tests, quick checks)."""
    max_eval_examples: int | None = None
    max_examples_seed: int | None = None
    """null: max_train/eval_examples keep the first N examples of a split; a seed: N drawn at random with it,
    stratified by label for classification (tasks/subset.py; `benchmark --max-examples` sets it)."""


@dataclass
class ReDatasetConfig(_DatasetBase):
    data_dir: str = "../shared/data/re/chemprot-scibert"
    format: Literal["scibert", "chemprot_original", "nemo", "i2b2_2010"] = "scibert"
    """ChemProt as SciBERT's JSON lines, the BioCreative VI release or NeMo tsv; i2b2_2010: BLUE's i2b2 2010 relation
    TSV (labels PIP ... TrWP and false; tasks/i2b2_relations.py)."""
    train_file: str = "train.txt"
    """A file (scibert JSONL, NeMo tsv) or, for chemprot_original, a split directory."""
    dev_file: str = "dev.txt"
    test_file: str | None = "test.txt"
    max_seq_length: int = 128
    class_balancing: Literal["weighted_loss"] | None = None
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    max_examples_seed: int | None = None


@dataclass
class QaDatasetConfig(_DatasetBase):
    data_dir: str = "../shared/data/qa/squad-v2"
    train_file: str = "train-v2.0.json"
    dev_file: str | None = "dev-v2.0.json"
    """null with ``dev_holdout_fraction``: dev carved from train_file."""
    test_file: str | None = None
    version_2_with_negative: bool = True
    doc_stride: int = 128
    max_query_length: int = 64
    max_seq_length: int = 384
    max_answer_length: int = 30
    n_best_size: int = 20
    null_score_diff_threshold: float = 0.0
    bioasq_golden: str | None = None
    """Official BioASQ golden JSON: test (and a dev file) are then scored as BioASQ factoid (SAcc, LAcc, MRR).
    It is read when a split is scored, so with a dev split carved from train it is read only after training."""
    dev_holdout_fraction: float | None = None
    """Carve the dev split from ``train_file`` instead of reading ``dev_file`` (which must then be null): this
    fraction of the training questions, all snippets of a question together (ids ``<qid>_<NNN>``, and equal
    question texts), chosen by a hash of the question, the same for every seed. Scored against the held-out
    answers (BioASQ measures when ``bioasq_golden`` is set); the checkpoint is chosen on it, never on test."""
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    max_examples_seed: int | None = None
    bad_answer_start: Literal["error", "drop"] = "error"
    """An answer whose ``answer_start`` does not point at its text: ``error`` (the file, line and question id),
    or ``drop`` its question (counted in the log). Never trained as a wrong span or as "no answer"."""


@dataclass
class ClassifyDatasetConfig(_DatasetBase):
    """A BLURB classification dataset in its own format (:mod:`bio_megatron.tasks.classify_data`)."""

    task_name: Literal["pubmedqa", "bioasq_yesno", "ddi", "gad", "biosses", "hoc", "mednli", "clinicalsts",
                       "euadr"] = "gad"
    """Which BLURB (or clinical: ``mednli``, ``clinicalsts``) reader, label set, head mode (single / regression /
    multi-label) and metric."""
    data_dir: str = "../shared/data/blurb/GAD"
    train_file: str = "train.tsv"
    dev_file: str = "dev.tsv"
    test_file: str | None = "test.tsv"
    max_seq_length: int = 128
    packing: bool = False
    """true: the examples of a micro-batch share rows, each attending only to itself, pooled at its own [CLS]
    (tasks/packing.py); the same losses and predictions as unpacked, with less padding."""
    class_balancing: Literal["weighted_loss"] | None = None
    """Single-label datasets: NeMo's class-weighted cross entropy; HoC (multi-label): BCE ``pos_weight`` =
    negatives / positives per label in the training split. Not for BIOSSES (regression)."""
    pubmedqa_long_answer: bool = False
    """PubMedQA only: pair the question with the abstract's conclusion (``LONG_ANSWER``, the reasoning-free
    setting of Jin et al. 2019) instead of its contexts (false: BLURB's reasoning-required setting)."""
    fold: int | None = None
    """GAD / EU-ADR as BioBERT's ten folds (1..10): every split file is read from ``<data_dir>/<fold>/`` in BioBERT's
    layout (tasks/folds.py); null: GAD in BLURB's files."""
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    max_examples_seed: int | None = None
