"""ChemProt relation-extraction data: SciBERT JSON lines, the original BioCreative VI files, NeMo tsv.

* SciBERT JSONL (``{"text": "... << e1 >> ... [[ e2 ]] ...", "label": "INHIBITOR", ...}``): positives
  only, fine-grained labels; :data:`FINE_TO_CPR` maps them to the evaluated CPR groups.
* Original BioCreative VI (``*_abstracts.tsv``, ``*_entities.tsv``, ``*_gold_standard.tsv``): every
  chemical-gene pair inside one sentence becomes an example, labelled with its gold CPR class or
  ``false`` (the negatives), the chemical replaced by ``@CHEMICAL$`` and the gene by ``@GENE$`` as in
  BLUE (``ncbi-nlp/BLUE_Benchmark`` ``blue/bert/create_chemprot_bert.py``); overlapping mentions become
  one ``@CHEM-GENE$`` and a pair with several gold classes one example per class, as there. Sentences
  come from :func:`chemprot_sentences`, a rule-based splitter that ends a sentence where BLUE's can
  (spaCy, then merged unless a sentence ends in . ! ? and the next starts upper-case) and never inside an
  entity. Counts against BLUE's script: docs/FINETUNE.md.
* NeMo text classification tsv: ``sentence<TAB>int_label`` with ids from ``CHEMPROT_LABELS``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bio_megatron.evaluation.chemprot import CHEMPROT_LABELS, NEGATIVE_LABEL, POSITIVE_LABELS
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.io import atomic_open, iter_json_lines
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

FINE_TO_CPR = {
    "UPREGULATOR": "CPR:3", "ACTIVATOR": "CPR:3", "INDIRECT-UPREGULATOR": "CPR:3",
    "DOWNREGULATOR": "CPR:4", "INHIBITOR": "CPR:4", "INDIRECT-DOWNREGULATOR": "CPR:4",
    "AGONIST": "CPR:5", "AGONIST-ACTIVATOR": "CPR:5", "AGONIST-INHIBITOR": "CPR:5",
    "ANTAGONIST": "CPR:6",
    "SUBSTRATE": "CPR:9", "PRODUCT-OF": "CPR:9", "SUBSTRATE_PRODUCT-OF": "CPR:9",
}
CHEMICAL_MASK, GENE_MASK = "@CHEMICAL$", "@GENE$"
OVERLAP_MASK = "@CHEM-GENE$"  # BLUE's single mask for a chemical and a gene whose mentions overlap


@dataclass
class RelationExample:
    """One classification example: the (marked or anonymised) sentence and its CPR label."""

    sentence: str
    label: str
    source: str = ""  # pmid/argument ids or file:line, for tracing back


def read_scibert_jsonl(path: str | Path) -> list[RelationExample]:
    """Read SciBERT's ChemProt JSON lines; labels are mapped to CPR groups, entity markers kept."""
    path = Path(path)
    out = []
    for lineno, rec in iter_json_lines(path, "file not found (expected SciBERT ChemProt JSON lines)"):
        if not isinstance(rec, dict) or "text" not in rec or "label" not in rec:
            raise DataError('expected an object with "text" and "label"', str(path), lineno)
        if rec["label"] not in FINE_TO_CPR:
            raise DataError(f"unknown ChemProt label {rec['label']!r}; known: {sorted(FINE_TO_CPR)}",
                            str(path), lineno)
        out.append(RelationExample(rec["text"], FINE_TO_CPR[rec["label"]], f"{path.name}:{lineno}"))
    return out


def _read_tsv(path: Path, n_fields: int) -> list[tuple[int, list[str]]]:
    if not path.is_file():
        raise DataError("ChemProt file not found", str(path))
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            fields = [f.strip() for f in line.rstrip("\r\n").split("\t")]
            if len(fields) < n_fields:
                raise DataError(f"expected {n_fields} tab-separated fields, got {len(fields)}", str(path), lineno)
            rows.append((lineno, fields))
    return rows


_ABBREV = re.compile(r"(?:\b(?:e\.g|i\.e|vs|al|Fig|Figs|approx|ca|cf|Dr|No|Eq|resp)\.|\b[A-Z]\.)$")
_BOUNDARY = re.compile(r"[.!?]\s+(?=[A-Z0-9(\[])")


# BLUE keeps a boundary only where the next sentence starts with an upper-case letter (a digit or a bracket
# continues the sentence), and its spaCy tokenizer leaves a full stop attached to a token that ends in one
# capital after a lower-case letter or digit (nAChR., SCN5A., CYP2D., PI3K.): no sentence can end there.
_CHEMPROT_BOUNDARY = re.compile(r"[.!?]\s+(?=[A-Z])")
_SYMBOL_STOP = re.compile(r"[a-z0-9][A-Z]\.$")


def _split(text: str, protected: Sequence[tuple[int, int]], boundary: re.Pattern,
           symbol_stop: bool) -> list[tuple[int, int]]:
    spans, start = [], 0
    for m in boundary.finditer(text):
        cut = m.start() + 1
        if _ABBREV.search(text[max(start, cut - 8):cut]):
            continue
        if symbol_stop and _SYMBOL_STOP.search(text[max(start, cut - 3):cut]):
            continue
        if any(s < cut < e for s, e in protected):
            continue
        spans.append((start, cut))
        start = m.end()
    spans.append((start, len(text)))
    return spans


def split_sentences(text: str, protected: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """Character spans of sentences: break after . ! ? followed by space and a capital/digit/bracket,
    except after common abbreviations or inside a ``protected`` span (an entity mention)."""
    return _split(text, protected, _BOUNDARY, symbol_stop=False)


def chemprot_sentences(text: str, protected: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """Sentence spans for ChemProt pairs, ending sentences only where BLUE's splitter can: after . ! ?
    followed by space and an upper-case letter, not after an abbreviation or a symbol such as ``SCN5A.``,
    never inside a ``protected`` span (an entity mention; BLUE loses such an entity, we keep it whole)."""
    return _split(text, protected, _CHEMPROT_BOUNDARY, symbol_stop=True)


def _read_split_dir(directory: Path) -> tuple[Path, Path, Path]:
    found = {}
    for kind in ("abstracts", "entities", "gold_standard"):
        hits = sorted(directory.glob(f"*_{kind}*.tsv"))
        if not hits:
            raise DataError(f"no *_{kind}*.tsv in this ChemProt directory", str(directory))
        found[kind] = hits[0]
    return found["abstracts"], found["entities"], found["gold_standard"]


def read_chemprot_original(directory: str | Path) -> list[RelationExample]:
    """BLUE-style examples from one split of the original BioCreative VI ChemProt release.

    Every CHEMICAL x GENE(-Y/-N) pair within one sentence (:func:`chemprot_sentences`) becomes an example
    per gold CPR class of the pair (CPR:3/4/5/6/9 from ``*_gold_standard.tsv``; BLUE writes a pair with two
    classes twice), or one ``false`` example. Overlapping mentions are masked together as ``@CHEM-GENE$``.
    Gold relations whose arguments fall in different sentences cannot be expressed and are counted in
    the log.
    """
    directory = Path(directory)
    abstracts_path, entities_path, gold_path = _read_split_dir(directory)
    texts = {f[0]: f[1] + " " + f[2] for _, f in _read_tsv(abstracts_path, 3)}  # offsets count title + " "
    entities: dict[str, dict[str, tuple[str, int, int]]] = {}
    for lineno, f in _read_tsv(entities_path, 6):
        pmid, tid, etype, s, e, name = f[:6]
        if pmid not in texts:
            raise DataError(f"entity of unknown abstract {pmid}", str(entities_path), lineno)
        s, e = int(s), int(e)
        if texts[pmid][s:e] != name:
            raise DataError(f"entity {tid} offsets {s}-{e} do not match its text {name!r}", str(entities_path), lineno)
        entities.setdefault(pmid, {})[tid] = (etype, s, e)
    gold: dict[tuple[str, str, str], list[str]] = {}
    for lineno, f in _read_tsv(gold_path, 4):
        pmid, label, a1, a2 = f[:4]
        if label not in POSITIVE_LABELS:
            raise DataError(f"gold-standard label {label!r} is not one of {POSITIVE_LABELS}", str(gold_path), lineno)
        gold.setdefault((pmid, a1.removeprefix("Arg1:"), a2.removeprefix("Arg2:")), []).append(label)
    examples, used = [], set()
    for pmid, text in texts.items():
        ents = entities.get(pmid, {})
        for s0, e0 in chemprot_sentences(text, [(s, e) for _, s, e in ents.values()]):
            inside = {t: v for t, v in ents.items() if s0 <= v[1] and v[2] <= e0}
            chems = sorted((t for t, v in inside.items() if v[0] == "CHEMICAL"), key=lambda t: inside[t][1:])
            genes = sorted((t for t, v in inside.items() if v[0].startswith("GENE")), key=lambda t: inside[t][1:])
            for c in chems:
                for g in genes:
                    (_, cs, ce), (_, gs, ge) = inside[c], inside[g]
                    if cs < ge and gs < ce:  # overlapping mentions: one mask over both, as BLUE
                        sent = _mask(text, s0, e0, (min(cs, gs), max(ce, ge), OVERLAP_MASK))
                    else:
                        sent = _mask(text, s0, e0, (cs, ce, CHEMICAL_MASK), (gs, ge, GENE_MASK))
                    labels = gold.get((pmid, c, g), [NEGATIVE_LABEL])
                    if labels[0] != NEGATIVE_LABEL:
                        used.add((pmid, c, g))
                    examples.extend(RelationExample(sent, label, f"{pmid}:{c}:{g}") for label in labels)
    positives = sum(e.label != NEGATIVE_LABEL for e in examples)
    lost = sum(len(v) for k, v in gold.items() if k not in used)
    log.info("%s: %d examples (%d positive, %d false); %d gold relations span sentences",
             directory.name, len(examples), positives, len(examples) - positives, lost)
    return examples


def _mask(text: str, s0: int, e0: int, *spans: tuple[int, int, str]) -> str:
    out, pos = [], s0
    for s, e, mask in sorted(spans):
        out.append(text[pos:s])
        out.append(mask)
        pos = e
    out.append(text[pos:e0])
    return "".join(out).strip()


def write_nemo_tsv(path: str | Path, examples: Sequence[RelationExample],
                   labels: Sequence[str] = CHEMPROT_LABELS) -> None:
    """Write NeMo's text-classification tsv: ``sentence<TAB>int_label`` (ids = positions in ``labels``)."""
    ids = {label: i for i, label in enumerate(labels)}
    with atomic_open(path, "w", encoding="utf-8") as fh:
        for ex in examples:
            if ex.label not in ids:
                raise DataError(f"label {ex.label!r} of {ex.source} is not in {list(labels)}", str(path))
            sentence = " ".join(ex.sentence.split())  # a tab or newline inside would break the format
            fh.write(f"{sentence}\t{ids[ex.label]}\n")


def read_nemo_tsv(path: str | Path, labels: Sequence[str] = CHEMPROT_LABELS) -> list[RelationExample]:
    """Read ``sentence<TAB>int_label`` lines back into examples with label names."""
    path = Path(path)
    if not path.is_file():
        raise DataError("file not found (expected 'sentence<TAB>int_label' lines)", str(path))
    out = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            fields = line.rstrip("\r\n").split("\t")
            if lineno == 1 and [f.strip().lower() for f in fields] == ["sentence", "label"]:
                continue  # NeMo's header: its TextClassificationDataset drops line 1, its import scripts write this
            if len(fields) != 2 or not fields[1].strip().isdigit():
                raise DataError("expected 'sentence<TAB>int_label'", str(path), lineno)
            idx = int(fields[1])
            if idx >= len(labels):
                raise DataError(f"label id {idx} out of range for {len(labels)} labels {list(labels)}",
                                str(path), lineno)
            out.append(RelationExample(fields[0], labels[idx], f"{path.name}:{lineno}"))
    return out


RELATION_FORMATS = ("scibert", "chemprot_original", "nemo")


def read_relations(path: str | Path, fmt: str = "auto") -> list[RelationExample]:
    """Examples of ``path`` in one of :data:`RELATION_FORMATS`; ``auto``: a directory is the original
    release, a file whose first non-blank character is ``{`` is SciBERT JSON lines, else NeMo tsv."""
    path = Path(path)
    if fmt == "auto":
        if path.is_dir():
            fmt = "chemprot_original"
        elif not path.is_file():
            raise DataError("no such file or directory (expected ChemProt data)", str(path))
        else:
            with open(path, encoding="utf-8", errors="replace") as fh:
                head = fh.read(4096).lstrip()
            fmt = "scibert" if head.startswith("{") else "nemo"
    if fmt == "scibert":
        return read_scibert_jsonl(path)
    if fmt == "chemprot_original":
        return read_chemprot_original(path)
    if fmt == "nemo":
        return read_nemo_tsv(path)
    raise DataError(f"unknown relation data format {fmt!r}; expected auto or one of {RELATION_FORMATS}", str(path))
