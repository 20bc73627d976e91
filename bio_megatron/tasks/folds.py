"""BioBERT's ten cross-validation folds of GAD and EU-ADR (Lee et al. 2019, ``datasets/RE/{GAD,euadr}/<1..10>/``),
the splits bio-lm reports those two tasks on (paper 004 §2.2: "We use the cross-validation splits from Lee et al.
(2019)"; §5.2: early stopping chosen on one fold, the median test result of the other nine reported).

``model.dataset.fold: N`` (1..10) of ``finetune classify`` with ``task_name: gad | euadr`` reads every split file
from ``<data_dir>/<N>/`` (config/finetune.py prefixes the split files with ``<N>/`` when the config is loaded, so
the resolved config names the files read). A fold folder holds, as BioBERT ships it::

    train.tsv   sentence<TAB>label                    (no header; the gene and disease masked @GENE$, @DISEASE$)
    test.tsv    index<TAB>sentence<TAB>label          (after the header line "index<TAB>sentence<TAB>label")

labels ``0``/``1``; the metric is the F1 of class 1 (BLURB's GAD metric, what BioBERT and bio-lm report). The
k-fold protocol itself (a run per fold, the median over folds 2-10) is the suite's; this is the reader.
"""

from __future__ import annotations

from pathlib import Path

from bio_megatron.evaluation.blurb import GAD_LABELS
from bio_megatron.evaluation.inputs import iter_lines
from bio_megatron.tasks.blurb_data import TextExample
from bio_megatron.utils.errors import DataError

FOLDS = range(1, 11)
FOLD_TASKS = ("gad", "euadr")
HEADER = ("index", "sentence", "label")
EXPECTED = ("BioBERT's fold files: 'sentence<TAB>label' lines (train.tsv), or the header 'index<TAB>sentence<TAB>"
            "label' then such lines (test.tsv); label 0 or 1")


def read_biobert_fold(path: str | Path) -> list[TextExample]:
    """The examples of one fold file, either form; ids: the ``index`` column (what ``evaluate gad --gold`` reads from
    the same file, so a fold's test predictions score there), or the line number in ``train.tsv``."""
    path = Path(path)
    if not path.parent.is_dir():
        raise DataError(f"fold folder not found (BioBERT's layout: <data_dir>/<1..10>/train.tsv, test.tsv)",
                        str(path.parent))
    out: list[TextExample] = []
    header: bool | None = None
    seen: dict[str, int] = {}
    for lineno, line in iter_lines(path, EXPECTED):
        if not line.strip():
            continue
        fields = line.split("\t")
        if header is None:  # the first line decides the form
            header = tuple(f.strip() for f in fields) == HEADER
            if header:
                continue
        if len(fields) != (3 if header else 2):
            raise DataError(f"{len(fields)} tab-separated field(s); expected {EXPECTED}", str(path), lineno)
        label = fields[-1].strip()
        if label not in GAD_LABELS:
            raise DataError(f"label {label[:40]!r} is not one of {list(GAD_LABELS)}", str(path), lineno)
        if not fields[-2].strip():
            raise DataError(f"empty sentence; expected {EXPECTED}", str(path), lineno)
        key = fields[0].strip() if header else str(lineno)
        if key in seen:
            raise DataError(f"index {key!r} already used on line {seen[key]}", str(path), lineno)
        seen[key] = lineno
        out.append(TextExample(key, fields[-2], label))
    if not out:
        raise DataError(f"no examples; expected {EXPECTED}", str(path))
    return out


def read_gad(path: str | Path, fold: bool = False) -> list[TextExample]:
    """GAD: a BioBERT fold file when ``model.dataset.fold`` is set, else BLURB's file."""
    from bio_megatron.tasks.blurb_data import read_gad as read_blurb_gad

    return read_biobert_fold(path) if fold else read_blurb_gad(path)


def read_euadr(path: str | Path, fold: bool = True) -> list[TextExample]:
    """EU-ADR exists only as BioBERT's folds."""
    return read_biobert_fold(path)
