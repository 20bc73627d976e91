"""``bio-megatron data convert <format> --input <release> --out <dir>``: an unpacked clinical NER release -> our IOB
files (``train.tsv``, ``dev.tsv``, ``test.tsv``: ``token<TAB>tag``, what ``finetune ner`` reads with
``model.dataset.format: iob``), with counts beside the sizes the papers give for the release.

The splits are the readers' (:mod:`i2b2`, :mod:`i2b2_xml`, :mod:`share_clefe`): train/dev the patient-level split
(ShARe/CLEFE: BLUE's dev list when ``devel_docids.txt`` is there), test the test release. What is written equals
what ``finetune ner`` reads from the release directly with that format. The folder is written whole or not at all
(a temporary sibling renamed into place; an earlier convert output is replaced only with ``--overwrite``), with
``counts.json`` holding what is printed.

``i2b2_2010_re`` writes the i2b2 2010 relations as BLUE's TSV instead (:func:`convert_relations`), what
``finetune re`` reads with ``model.dataset.format: i2b2_2010``.

Released sizes (:data:`RELEASED`) are checked where the papers give a figure our counts can equal: a difference is
a warning and ``"matches": false`` (another version of the release, or files missing), not an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from bio_megatron.corpus.iob import Sentence, write_iob
from bio_megatron.tasks.clinical_spans import SpanStats
from bio_megatron.tasks.i2b2 import RELEASE_2010, read_i2b2_2010
from bio_megatron.tasks.i2b2_xml import RELEASES, read_i2b2_xml
from bio_megatron.tasks.share_clefe import TEST_REPORTS, TRAIN_REPORTS, read_share_clefe
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.io import atomic_path, write_json_atomic
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

Reader = Callable[[Path, str, SpanStats], list[Sentence]]
READERS: dict[str, tuple[Reader, str]] = {  # format -> (reader, the test release's folder)
    "i2b2_2010": (lambda d, n, st: read_i2b2_2010(d, n, None, st), RELEASE_2010["test"]),
    "i2b2_2012": (lambda d, n, st: read_i2b2_xml("i2b2_2012", d, n, None, st), RELEASES["i2b2_2012"]["test"]),
    "i2b2_2014": (lambda d, n, st: read_i2b2_xml("i2b2_2014", d, n, None, st), RELEASES["i2b2_2014"]["test"]),
    "share_clefe": (lambda d, n, st: read_share_clefe(d, n, None, st), TEST_REPORTS),
}
# What the papers say the release holds; "check": the counts of ours that must equal it (None: printed only).
RELEASED: dict[str, dict] = {
    "i2b2_2010": {"documents": 871, "source": "paper 004 §2.1 (the challenge's corpus; the public n2c2 release "
                  "holds part of it, so the document count is printed, not checked)", "check": None},
    "i2b2_2012": {"documents": 310, "source": "paper 004 §2.1 (discharge summaries, training + test)",
                  "check": "documents"},
    "i2b2_2014": {"documents": 1304, "source": "paper 004 §2.1 (longitudinal records, training + test)",
                  "check": "documents"},
    "share_clefe": {"mentions": {"train": 4628, "dev": 1075, "test": 5195},
                    "source": "paper 002 Table 1 (disorder mentions; dev = BLUE's devel_docids.txt)",
                    "check": "mentions"},
}
RELEASED["i2b2_2010_re"] = {"relations": {"train+dev": 3121, "test": 6293},
                             "source": "paper 002 Table 1 (BLUE's files: 3,110 + 11 = 3121 training and dev relations, "
                                       "6,293 test)", "check": "relations"}
FORMATS = tuple(READERS) + ("i2b2_2010_re",)
# format -> the training release's folders, which the readers' ``train`` / ``dev`` keywords (the patient-level split
# of the training release) read
TRAINING_FOLDERS: dict[str, list[str]] = {"i2b2_2010": list(RELEASE_2010["train"]),
                                          **{f: list(RELEASES[f]["train"]) for f in RELEASES},
                                          "share_clefe": [TRAIN_REPORTS]}
DEV_DOCIDS_2010 = "dev-docids.txt"  # BLUE's development reports (create_i2b2_bert.py's dev_docids)


def split_sources(fmt: str, data_dir: str | Path, name: str) -> list[Path]:
    """The folders split ``name`` of a release in ``fmt`` is read from: the training release's for ``train`` and
    ``dev``, else the folder ``name`` itself. What must exist before a run (the benchmark suites' availability)."""
    if name in ("train", "dev"):
        return [Path(data_dir) / f for f in TRAINING_FOLDERS[fmt]]
    return [Path(data_dir) / name]


def _counts(sentences: list[Sentence], stats: SpanStats) -> dict:
    return {"documents": stats.split_documents, "sentences": len(sentences),
            "tokens": sum(len(s.words) for s in sentences),
            "mentions": sum(t == "B" or t.startswith("B-") for s in sentences for t in s.tags)}


def convert_release(fmt: str, release: str | Path, out: str | Path, overwrite: bool = False) -> dict:
    """Read every split of ``release``, write ``out/{train,dev,test}.tsv`` and ``counts.json``; return the counts."""
    if fmt == "i2b2_2010_re":
        return convert_relations(Path(release), Path(out), overwrite)
    reader, test_folder = READERS[fmt]
    splits, counts, problems = {}, {}, {}
    for name, folder in (("train", "train"), ("dev", "dev"), ("test", test_folder)):
        stats = SpanStats()
        splits[name] = reader(Path(release), folder, stats)
        counts[name] = _counts(splits[name], stats)
        # train and dev both read the whole training release: its problems are reported once
        if name != "dev":
            problems["training release" if name == "train" else "test release"] = {
                "overlapping_dropped": stats.overlapping_dropped, "duplicates": stats.duplicates,
                "text_mismatches": stats.text_mismatches}
    released = {k: v for k, v in RELEASED[fmt].items() if k != "check"}
    check = RELEASED[fmt]["check"]
    if check == "documents":
        ours = sum(c["documents"] for c in counts.values())
        released["matches"] = ours == released["documents"]
    elif check == "mentions":
        ours = {name: c["mentions"] for name, c in counts.items()}
        released["matches"] = ours == released["mentions"]
    if released.get("matches") is False:
        log.warning("%s: our %s (%s) differ from the released %s (%s): another version of the release, or files "
                    "missing?", release, check, ours, released[check], released["source"])
    result = {"format": fmt, "input": str(release), "out": str(out), "splits": counts, "dropped": problems,
              "released": released}
    with atomic_path(out, command="data convert", overwrite=overwrite) as tmp:
        tmp.mkdir()
        for name, sentences in splits.items():
            write_iob(tmp / f"{name}.tsv", sentences)
        write_json_atomic(tmp / "counts.json", result)
    return result


def convert_relations(release: Path, out: Path, overwrite: bool = False) -> dict:
    """The i2b2 2010 release -> BLUE's relation TSVs (tasks/i2b2_relations.py): every concept pair on one line, train
    and dev split by report as the NER splits are (or by BLUE's ``dev-docids.txt`` when the release folder holds
    it; BLUE's own script compares the ids with their newlines kept, so its dev set is the last listed report
    alone, the 11 relations of paper 002 Table 1)."""
    from bio_megatron.evaluation.inputs import iter_lines
    from bio_megatron.tasks.clinical_spans import patient_split
    from bio_megatron.tasks.i2b2 import TEST_TEXTS_2010
    from bio_megatron.tasks.i2b2_relations import ReleaseCounts, document_pairs, write_relations
    import numpy as np

    def folder(txt: Path, con: Path, rel: Path, counts: ReleaseCounts) -> dict[str, list]:
        for d in (txt, con, rel):
            if not d.is_dir():
                raise DataError("folder not found (an i2b2 2010 split holds txt/, concept/ and rel/)", str(d))
        docs = sorted(p.stem for p in txt.glob("*.txt"))
        if not docs:
            raise DataError("no .txt documents in this folder", str(txt))
        return {d: document_pairs(d, txt / f"{d}.txt", con / f"{d}.con", rel / f"{d}.rel", counts) for d in docs}

    train_counts, test_counts = ReleaseCounts(), ReleaseCounts()
    listed = None
    if (release / DEV_DOCIDS_2010).is_file():
        listed = {line.strip() for _, line in iter_lines(release / DEV_DOCIDS_2010, "report ids") if line.strip()}
    rng, splits = np.random.RandomState(1), {"train": [], "dev": []}
    for source in RELEASE_2010["train"]:
        root = release / source
        docs = folder(root / "txt", root / "concept", root / "rel", train_counts)
        train, dev = ([d for d in docs if d not in listed], [d for d in docs if d in listed]) if listed is not None \
            else patient_split(docs, rng)
        splits["train"] += [r for d in train for r in docs[d]]
        splits["dev"] += [r for d in dev for r in docs[d]]
    test_root = release / RELEASE_2010["test"]
    test_docs = folder(release / TEST_TEXTS_2010, test_root / "concepts", test_root / "rel", test_counts)
    splits["test"] = [r for d in sorted(test_docs) for r in test_docs[d]]
    counts = {name: {"examples": len(rows), "relations": sum(r[2] != "false" for r in rows)}
              for name, rows in splits.items()}
    ours = {"train+dev": counts["train"]["relations"] + counts["dev"]["relations"], "test": counts["test"]["relations"]}
    released = {k: v for k, v in RELEASED["i2b2_2010_re"].items() if k != "check"}
    released["matches"] = ours == released["relations"]
    if not released["matches"]:
        log.warning("%s: our relations (%s) differ from the released %s (%s): another version of the release, or "
                    "files missing?", release, ours, released["relations"], released["source"])
    result = {"format": "i2b2_2010_re", "input": str(release), "out": str(out), "splits": counts,
              "dev": DEV_DOCIDS_2010 if listed is not None else "patient-level 90/10 split",
              "dropped": {"relations_not_on_one_line": train_counts.relations_not_on_one_line
                          + test_counts.relations_not_on_one_line},
              "released": released}
    with atomic_path(out, command="data convert", overwrite=overwrite) as tmp:
        tmp.mkdir()
        for name, rows in splits.items():
            write_relations(tmp / f"{name}.tsv", rows)
        write_json_atomic(tmp / "counts.json", result)
    return result
