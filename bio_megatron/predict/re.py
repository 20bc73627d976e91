"""``predict re``: a fine-tuned relation-extraction checkpoint (``finetune re``) on new examples.

Input: the dataset's own file, read by the reader ``finetune re`` used for the checkpoint's ``model.dataset.format``
(SciBERT's ChemProt JSON lines, the original BioCreative VI folder, NeMo's ``sentence<TAB>label`` tsv, BLUE's
i2b2-2010 relation TSV; gold labels read, then unused), or JSON lines ``{"id", "text"}`` whose text carries the entity
markers the format's training data carries (:data:`MARKERS`; a line without them is refused, naming file and line:
the model never saw an unmarked sentence, so its answer there would mean nothing). An HF folder exported from an RE
model keeps no dataset format: its input format is recognised from the file (:func:`detect_format`).

Output: one JSON object per example, in input order: ``{"id", "label", "probability", "probabilities"}`` (softmax
of the head's logits over the checkpoint's labels). ``bio-megatron evaluate re --pred`` reads its ``label`` in
order against ``--gold`` (the same file), as the run scored its test split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from bio_megatron.formats.finetuned import Loaded, finetuned_source, load_finetuned
from bio_megatron.predict.inputs import json_lines
from bio_megatron.tasks.re import label_set
from bio_megatron.tasks.re_data import RelationExample, read_relations
from bio_megatron.utils.errors import CheckpointError, DataError

_BLUE_CHEMPROT = (re.compile(r"@CHEMICAL\$.*@GENE\$|@GENE\$.*@CHEMICAL\$|@CHEM-GENE\$"),
                  "BLUE's @CHEMICAL$ and @GENE$ (or @CHEM-GENE$)")
_SCIBERT = (re.compile(r"<<.+?>>.*\[\[.+?\]\]|\[\[.+?\]\].*<<.+?>>"), "SciBERT's << entity >> and [[ entity ]]")
_CONCEPT = r"(?:problem|test|treatment)"
_I2B2 = (re.compile(rf"@{_CONCEPT}\$.*@{_CONCEPT}\$|@{_CONCEPT}-{_CONCEPT}\$"),
         "BLUE's two @problem$/@test$/@treatment$ (or one @<type>-<type>$)")
# The markers each format's training sentences carry. NeMo's tsv is whatever was converted into it: BLUE's (as
# re_data.write_nemo_tsv writes the original release) or SciBERT's.
MARKERS: dict[str, tuple[tuple[re.Pattern, str], ...]] = {
    "scibert": (_SCIBERT,), "chemprot_original": (_BLUE_CHEMPROT,), "nemo": (_BLUE_CHEMPROT, _SCIBERT),
    "i2b2_2010": (_I2B2,),
}
ANY_MARKERS = (_BLUE_CHEMPROT, _SCIBERT, _I2B2)  # an HF folder: the training format is not known
_INDEX = re.compile(r" \((.*)\)$")  # the i2b2 reader's source: "<path>:<line> (<BLUE index>)"


@dataclass
class RelationInput:
    """One example to classify: its id (in the output) and the marked sentence."""

    id: str
    sentence: str


def dataset_config_of(path: str | Path):
    """The ``model.dataset`` of an RE checkpoint (its saved config; no weights read); ``format`` is None for an HF
    folder, which records none."""
    src, cfg = finetuned_source(path, "re")
    d = cfg.model.dataset
    if src.kind == "hf":
        d.format = None
    return d


def load_relation_model(path: str | Path) -> Loaded:
    """Encoder + RE head in eval mode at TP1 in this process; labels the checkpoint's ``label_ids.csv`` (an HF
    folder's ``id2label``), else the format's label set."""
    d = dataset_config_of(path)
    return load_finetuned(path, "re", default_labels=label_set(d.format or "scibert")[0])


def detect_format(path: str | Path) -> str:
    """The relation format of a file when the model does not say (an HF folder): a folder is the original
    ChemProt release, BLUE's header ``index<TAB>sentence<TAB>label`` is i2b2 2010, JSON lines are SciBERT's,
    anything else NeMo's tsv (whose reader then names what it expected)."""
    path = Path(path)
    if path.is_dir():
        return "chemprot_original"
    with open(path, encoding="utf-8", errors="replace") as fh:
        head = fh.read(4096).lstrip("\ufeff")
    if head.split("\n", 1)[0].rstrip("\r") == "index\tsentence\tlabel":
        return "i2b2_2010"
    return "scibert" if head.lstrip().startswith("{") else "nemo"


def _is_dataset_jsonl(path: Path, fmt: str | None) -> bool:
    """A ``.jsonl`` is our ``{"id", "text"}`` input unless it is SciBERT's ChemProt (its records have "label")."""
    if fmt not in ("scibert", None) or not path.is_file():
        return False
    for _, rec in json_lines(path, 'JSON lines {"id", "text"}'):
        return isinstance(rec, dict) and "label" in rec
    return False


def read_examples(path: str | Path, dataset_cfg) -> list[RelationInput]:
    """Examples of ``path`` in input order: JSON lines ``{"id", "text"}`` (``.jsonl``, not SciBERT's own), or the
    dataset's own file read as ``finetune re`` reads it (``dataset_cfg``: the checkpoint's ``model.dataset``)."""
    path = Path(path)
    fmt = dataset_cfg.format
    if path.suffix != ".jsonl" or _is_dataset_jsonl(path, fmt):
        fmt = fmt or detect_format(path)
        return [RelationInput(_example_id(e, fmt), e.sentence) for e in _read_dataset(path, fmt)]
    markers = MARKERS[fmt] if fmt else ANY_MARKERS
    want = '{"id", "text"}'
    out, seen = [], set()
    for lineno, rec in json_lines(path, f"JSON lines {want}"):
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
            raise DataError(f"expected an object {want} with a string \"text\"", str(path), lineno)
        if not any(p.search(rec["text"]) for p, _ in markers):
            raise DataError(f"no entity markers in \"text\": expected {' or '.join(w for _, w in markers)} "
                            f"marking the pair, as the {fmt or 'relation'} training data", str(path), lineno)
        example_id = str(rec.get("id", lineno))
        if example_id in seen:
            raise DataError(f"id {example_id!r} is used twice", str(path), lineno)
        seen.add(example_id)
        out.append(RelationInput(example_id, rec["text"]))
    if not out:
        raise DataError(f"no examples (expected JSON lines {want})", str(path))
    return out


def _read_dataset(path: Path, fmt: str) -> list[RelationExample]:
    if fmt == "i2b2_2010":  # as tasks/re.py::read_split
        from bio_megatron.tasks.i2b2_relations import read_i2b2_relations

        return read_i2b2_relations(path)
    examples = read_relations(path, fmt)
    if not examples:
        raise DataError(f"no examples (expected {fmt} relation data)", str(path))
    return examples


def _example_id(example: RelationExample, fmt: str) -> str:
    """The example's own id: BLUE's index (i2b2), ``pmid:chemical:gene`` (the original release), else its line."""
    if fmt == "i2b2_2010":
        m = _INDEX.search(example.source)
        return m.group(1) if m else example.source
    if fmt in ("scibert", "nemo"):  # their readers' source is "<file name>:<line>"
        return example.source.rsplit(":", 1)[-1]
    return example.source


def encode(examples: list[RelationInput], tokenizer, max_seq_length: int) -> list[list[int]]:
    """``[CLS] sentence [SEP]`` ids, truncated as fine-tuning encodes (tasks/re.py ``ReTask._encode``)."""
    ids = tokenizer.tokenize_batch([e.sentence for e in examples])
    n = max_seq_length - 2
    return [tokenizer.single(i[:n]) for i in ids]


@torch.no_grad()
def predict(loaded: Loaded, examples: list[RelationInput], batch_size: int = 32) -> list[dict]:
    """One ``{"id", "label", "probability", "probabilities"}`` per example, in input order."""
    labels = loaded.labels or list(label_set(loaded.cfg.model.dataset.format or "scibert")[0])
    feats = encode(examples, loaded.tokenizer, loaded.cfg.model.dataset.max_seq_length)
    out: list[dict] = []
    for b in range(0, len(feats), batch_size):
        group = feats[b:b + batch_size]
        ids = torch.full((len(group), max(len(f) for f in group)), loaded.tokenizer.pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, f in enumerate(group):
            ids[r, :len(f)], mask[r, :len(f)] = torch.tensor(f), 1
        dev = loaded.device
        logits = loaded.model(ids.to(dev), mask.to(dev), torch.zeros_like(ids).to(dev)).float().cpu()
        if logits.shape[-1] != len(labels):
            raise CheckpointError(f"{loaded.source.path}: the model has {logits.shape[-1]} outputs but "
                                  f"{len(labels)} labels {labels}")
        for e, row in zip(examples[b:b + batch_size], logits):
            p = row.softmax(-1).tolist()
            best = int(row.argmax())  # the argmax fine-tuning decodes (ReTask.decode)
            out.append({"id": e.id, "label": labels[best], "probability": round(p[best], 6),
                        "probabilities": {t: round(v, 6) for t, v in zip(labels, p)}})
    return out
