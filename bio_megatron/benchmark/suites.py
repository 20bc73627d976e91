"""The two protocols a suite can run: BLURB (13 datasets in 6 task types, BLURB score) and the BioMegatron
paper's Tables 1-2 (NER and ChemProt P/R/F1; SQuAD v1.1 -> BioASQ-7b factoid SAcc/LAcc/MRR).

Every dataset names the recipe it fine-tunes with (``nemo_configs/<task>/<recipe>.yaml``), the key of its
headline metric in the run's scores and the factor that puts that metric on the publications' 0-100 scale
(conlleval and SQuAD already report percent; the other scorers fractions, Pearson's r included). Metric and
task-type names are BLURB's own (microsoft.github.io/BLURB); column names are the paper's.
"""

from __future__ import annotations

from dataclasses import dataclass

PERCENT, FRACTION = 1.0, 100.0  # factor to the tables' 0-100 scale
PRF = (("precision", "Prec"), ("recall", "Rec"), ("f1", "F1"))
# How many runs a dataset averages is the publications' (docs/BENCHMARK_SUITES.md, "Seeds", quotes them): BLURB
# (Gu et al. 2021, sec. 2.5) ten for BIOSSES, BioASQ and PubMedQA, five for the others; the BioMegatron paper states
# none, so its suite keeps five (ASSUMED). The first five seed values are BioM-Transformers' (paper 000 footnote 2
# in ../shared/papers: 10, 42, 1234, 12345, 666, its five runs); the five more of the ten-run datasets are ASSUMED
# (no publication lists ten). A dataset runs the first ones (docs/RECIPES.md, "Suite seeds").
DEFAULT_SEEDS = (10, 42, 1234, 12345, 666, 1, 2, 3, 4, 5)


@dataclass(frozen=True)
class Dataset:
    """One dataset of a suite and how its cells are fine-tuned and scored."""

    key: str
    """Folder name under ``cells/`` and the name ``--datasets`` takes."""
    title: str
    """As the publication writes it (BLURB: "BC5-chem"; the paper: "BC5CDR-chem")."""
    group: str
    """BLURB's task type, or the paper's table."""
    task: str
    """``bio-megatron finetune <task>``: ner, re, qa or classify."""
    recipe: str
    """Recipe name under ``nemo_configs/<task>/`` (or a path)."""
    metric: str
    """Key of the headline metric in the run's scores (what BLURB averages; what the grid selects on)."""
    metric_name: str
    """The headline as the publication names it."""
    scale: float
    """Factor from the scorer's values to the tables' 0-100 scale."""
    columns: tuple[tuple[str, str], ...] = ()
    """(score key, column header) of the paper's tables; empty = the headline alone."""
    split: str = "test"
    """Which split is reported: "dev" for SQuAD (it has no public test set), else "test"."""
    evaluator: str | None = None
    """``bio-megatron evaluate <evaluator>``: re-scores the run's test predictions against the gold file."""
    needs_predictions: bool = False
    """The headline exists only through ``evaluator`` on the run's test predictions (EBM PICO's word-level F1
    is not the entity F1 the NER run computes)."""
    after: str | None = None
    """Prerequisite dataset of the same suite: each cell continues from that dataset's checkpoint of the same
    seed and head-grid point (BioASQ after SQuAD)."""
    fallback: tuple[str, tuple[str, ...]] | None = None
    """(recipe, overrides) used while ``recipe`` does not exist in ``nemo_configs/<task>/``."""
    needs: str = ""
    """What the data needs, appended to a "missing" reason."""
    runs: int | None = None
    """Runs (seeds) the publication averages for this dataset when it differs from the suite's ``runs``."""


@dataclass(frozen=True)
class Suite:
    name: str
    title: str
    version: int
    """Bumped when cells or scoring change meaning: a suite folder of another version is refused."""
    groups: tuple[str, ...]
    """Task types (BLURB) or tables (paper), in the order the tables show them."""
    datasets: tuple[Dataset, ...]
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    runs: int = 5
    """Runs per dataset without ``--seeds``: the first ``runs`` of ``seeds`` (a dataset's own ``runs`` wins)."""
    grid: bool = False
    """Sweep the recipes' head grid (``grid.num_fc_layers`` x ``grid.fc_hidden_size``) and select on dev."""
    blurb_score: bool = False
    """Report task-type averages and their macro average (the BLURB score)."""

    def dataset(self, key: str) -> Dataset:
        return next(d for d in self.datasets if d.key == key)

    def default_runs(self, keys: tuple[str, ...]) -> dict[str, int]:
        """dataset -> how many of the default seeds it runs (the publications' number of runs)."""
        return {k: self.dataset(k).runs or self.runs for k in keys}


NER, PICO, RE, SS, DOC, QA = ("Named Entity Recognition", "PICO Extraction", "Relation Extraction",
                              "Sentence Similarity", "Document Classification", "Question Answering")
_SHARED = "../shared/data"


def _blurb_ner(key: str, title: str, recipe: str, needs: str, **kw) -> Dataset:
    return Dataset(key, title, NER, "ner", recipe, "f1", "F1 entity-level", PERCENT, PRF, needs=needs, **kw)


def _blurb_cls(key: str, title: str, group: str, metric_name: str, evaluator: str, needs: str,
               runs: int | None = None) -> Dataset:
    return Dataset(key, title, group, "classify", key, "score", metric_name, FRACTION, evaluator=evaluator,
                   needs=needs, runs=runs)


BLURB = Suite(
    name="blurb", title="BLURB", version=1, groups=(NER, PICO, RE, SS, DOC, QA), blurb_score=True,
    datasets=(
        _blurb_ner("bc5cdr_chem", "BC5-chem", "bc5cdr_chem", f"{_SHARED}/ner/BC5CDR-chem (train/devel/test.tsv)"),
        _blurb_ner("bc5cdr_disease", "BC5-disease", "bc5cdr_disease",
                   f"{_SHARED}/ner/BC5CDR-disease (train/devel/test.tsv)"),
        _blurb_ner("ncbi_disease", "NCBI-disease", "ncbi_disease",
                   f"{_SHARED}/ner/NCBI-disease (train/devel/test.tsv)"),
        # ASSUMED: no BC2GM recipe yet; the NER base recipe (the paper's settings) on ../shared's BC2GM files.
        _blurb_ner("bc2gm", "BC2GM", "bc2gm", f"{_SHARED}/ner/BC2GM (train/devel/test.tsv)",
                   fallback=("_base", ("name=bc2gm", f"model.dataset.data_dir={_SHARED}/ner/BC2GM"))),
        _blurb_ner("jnlpba", "JNLPBA", "jnlpba", f"BLURB's untyped JNLPBA, {_SHARED}/blurb/JNLPBA"),
        Dataset("ebm_pico", "EBM PICO", PICO, "ner", "ebm_pico", "score", "Macro F1 word-level", FRACTION,
                evaluator="ebm_pico", needs_predictions=True,
                needs="BLURB lists EBM PICO's training split by PMID only (train_pmid.tsv): give a train file "
                      "(model.dataset.train_file in a --recipe-map)"),
        Dataset("chemprot", "ChemProt", RE, "re", "chemprot", "f1", "Micro F1", FRACTION, PRF,
                needs=f"the BioCreative VI ChemProt files, {_SHARED}/re/chemprot-original"),
        _blurb_cls("ddi", "DDI", RE, "Micro F1", "ddi", f"{_SHARED}/blurb/DDI"),
        _blurb_cls("gad", "GAD", RE, "Micro F1", "gad", f"{_SHARED}/blurb/GAD"),
        _blurb_cls("biosses", "BIOSSES", SS, "Pearson", "biosses", f"{_SHARED}/blurb/BIOSSES", runs=10),
        _blurb_cls("hoc", "HoC", DOC, "Micro F1", "hoc", f"{_SHARED}/blurb/HoC"),
        _blurb_cls("pubmedqa", "PubMedQA", QA, "Accuracy", "pubmedqa", f"{_SHARED}/blurb/PubMedQA", runs=10),
        _blurb_cls("bioasq_yesno", "BioASQ", QA, "Accuracy", "bioasq_yesno",
                   "BioASQ data needs registration (bioasq.org): give model.dataset.data_dir/train_file/dev_file/"
                   "test_file in a --recipe-map", runs=10),
    ))

TABLE1, TABLE2 = ("Table 1: NER and relation extraction", "Table 2: question answering")
PAPER = Suite(
    name="paper", title="BioMegatron (Shin et al., EMNLP 2020)", version=1, groups=(TABLE1, TABLE2), grid=True,
    datasets=(
        Dataset("bc5cdr_chem", "BC5CDR-chem", TABLE1, "ner", "bc5cdr_chem", "f1", "F1", PERCENT, PRF,
                needs=f"{_SHARED}/ner/BC5CDR-chem"),
        Dataset("bc5cdr_disease", "BC5CDR-disease", TABLE1, "ner", "bc5cdr_disease", "f1", "F1", PERCENT, PRF,
                needs=f"{_SHARED}/ner/BC5CDR-disease"),
        Dataset("ncbi_disease", "NCBI-disease", TABLE1, "ner", "ncbi_disease", "f1", "F1", PERCENT, PRF,
                needs=f"{_SHARED}/ner/NCBI-disease"),
        Dataset("chemprot", "ChemProt", TABLE1, "re", "chemprot", "f1", "F1", FRACTION, PRF,
                needs=f"{_SHARED}/re/chemprot-original"),
        Dataset("squad_v1", "SQuAD v1.1", TABLE2, "qa", "squad_v1", "f1", "F1", PERCENT,
                (("exact_match", "EM"), ("f1", "F1")), split="dev",
                needs="SQuAD v1.1 train-v1.1.json and dev-v1.1.json (not in ../shared)"),
        Dataset("bioasq_factoid", "BioASQ-7b factoid", TABLE2, "qa", "bioasq_factoid", "mrr", "MRR", FRACTION,
                (("strict_accuracy", "SAcc"), ("lenient_accuracy", "LAcc"), ("mrr", "MRR")), after="squad_v1",
                needs="BioASQ-7b needs registration (bioasq.org): the factoid data in SQuAD format and "
                      "7B_golden.json"),
    ))

SUITES = {s.name: s for s in (BLURB, PAPER)}
