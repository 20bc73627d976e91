"""The two protocols a suite can run: BLURB (13 datasets in 6 task types, BLURB score) and the BioMegatron
paper's Tables 1-2 (NER and ChemProt P/R/F1; SQuAD v1.1 -> BioASQ-7b factoid SAcc/LAcc/MRR).

Every dataset names the recipe it fine-tunes with (``nemo_configs/<task>/<recipe>.yaml``), the key of its
headline metric in the run's scores and the factor that puts that metric on the publications' 0-100 scale
(conlleval and SQuAD already report percent; the other scorers fractions, Pearson's r included). Metric and
task-type names are BLURB's own (microsoft.github.io/BLURB); column names are the paper's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    evaluator_metric: str | None = None
    """``evaluate <evaluator> --metric <this>``: another publication's formula (bio-lm's HoC: BLUE's ``blue``)."""
    needs_predictions: bool = False
    """The headline exists only through ``evaluator`` on the run's test predictions (EBM PICO's word-level F1
    is not the entity F1 the NER run computes)."""
    folds: str | None = None
    """``finetune --folds`` (k-fold cross-validation, benchmark/kfold.py): the cell's score is the median test score
    over the folds after the first (bio-lm's GAD and EU-ADR: ``1-10``)."""
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
    statistic: str = "mean"
    """What a dataset's row reports over its seeds: "mean" (BLURB, the BioMegatron paper) or "median" (bio-lm)."""
    means: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(name, dataset keys) of the group means a publication reports over the datasets' headline scores (bio-lm's
    Tables 3-4: sequence labelling, classification, PubMed, clinical, all); groups may overlap."""

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
                needs="../shared has no EBM PICO training split: `bio-megatron data download blurb --name EBM_PICO "
                      "--out DIR`, then model.dataset.data_dir=DIR/EBM_PICO in a --recipe-map"),
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

# bio-lm (Lewis et al. 2020, ../shared/papers/004): 18 tasks in its Table 1 order (read column by column), 5 seeds, the
# MEDIAN test score (§5.2), the group means of its Tables 3-4. A task runs its nemo_configs/<task>/biolm/ recipe where
# one exists, else its dataset recipe with the §5.2 protocol as overrides (the classification lr is printed 0.002;
# 2e-5 as paper 000's reproduction of bio-lm, docs/RECIPES.md).
SEQ, CLS = "Sequence labelling", "Classification"
_BIOLM_SEQ = ("model.optim.lr=1e-5", "model.micro_batch_size=32", "model.global_batch_size=32", "trainer.max_epochs=20",
              "trainer.val_check_interval=500")  # paper 004 §5.2
_BIOLM_CLS = ("model.optim.lr=2e-5", "model.micro_batch_size=16", "model.global_batch_size=16", "trainer.max_epochs=10",
              "trainer.val_check_interval=200", "exp_manager.create_early_stopping_callback=true")  # paper 004 §5.2
_N2C2 = ("an n2c2 (i2b2) data use agreement through the DBMI Data Portal, portal.dbmi.hms.harvard.edu: unpack the "
         "release and point model.dataset.data_dir at it (--recipe-map)")
_BIOBERT = "BioBERT's datasets (github.com/dmis-lab/biobert, download.sh)"
_PHYSIONET = "PhysioNet credentialed access (MIMIC-III training and data use agreement)"


def _biolm(key: str, title: str, group: str, task: str, plain: str, needs: str, metric: str = "f1",
           metric_name: str = "F1", scale: float = PERCENT, folds: str | None = None, extra: tuple = ()) -> Dataset:
    proto = _BIOLM_SEQ if group == SEQ else _BIOLM_CLS + (
        "exp_manager.early_stopping_callback_params.monitor=" + ("val_f1" if task == "re" else "val_score"),)
    return Dataset(key, title, group, task, f"biolm/{key}", metric, metric_name, scale, folds=folds, needs=needs,
                   fallback=(plain, (*extra, *proto)))


BIOLM_CLINICAL = ("i2b2_2010", "i2b2_2012", "i2b2_2014", "i2b2_2010_re", "mednli")  # paper 004 Table 4
BIOLM = Suite(
    name="biolm", title="bio-lm (Lewis et al., 2020)", version=1, groups=(SEQ, CLS), runs=5, statistic="median",
    datasets=(
        _biolm("bc5cdr_chem", "BC5CDR-C.", SEQ, "ner", "bc5cdr_chem", f"{_SHARED}/ner/BC5CDR-chem"),
        _biolm("bc5cdr_disease", "BC5CDR-D.", SEQ, "ner", "bc5cdr_disease", f"{_SHARED}/ner/BC5CDR-disease"),
        _biolm("jnlpba", "JNLPBA", SEQ, "ner", "jnlpba", f"{_SHARED}/blurb/JNLPBA"),
        _biolm("ncbi_disease", "NCBI-disease", SEQ, "ner", "ncbi_disease", f"{_SHARED}/ner/NCBI-disease"),
        _biolm("bc4chemd", "BC4CHEMD", SEQ, "ner", "bc4chemd", f"{_BIOBERT}: datasets/NER/BC4CHEMD"),
        _biolm("bc2gm", "BC2GM", SEQ, "ner", "_base", f"{_SHARED}/ner/BC2GM",
               extra=("name=bc2gm", f"model.dataset.data_dir={_SHARED}/ner/BC2GM")),
        _biolm("linnaeus", "LINNAEUS", SEQ, "ner", "linnaeus", f"{_BIOBERT}: datasets/NER/linnaeus"),
        _biolm("species_800", "Species-800", SEQ, "ner", "species_800", f"{_BIOBERT}: datasets/NER/s800"),
        _biolm("i2b2_2010", "I2B2-2010", SEQ, "ner", "i2b2_2010", f"i2b2 2010 concepts: {_N2C2}"),
        _biolm("i2b2_2012", "I2B2-2012", SEQ, "ner", "i2b2_2012", f"i2b2 2012 temporal relations: {_N2C2}"),
        _biolm("i2b2_2014", "I2B2-2014", SEQ, "ner", "i2b2_2014", f"i2b2 2014 de-identification: {_N2C2}"),
        # bio-lm reports HoC as BLUE does (paper 004 §3, "abstract-level F1", Peng et al. 2019): `evaluate hoc
        # --metric blue` on the run's test predictions; the run's own score is BLURB's micro F1
        replace(_biolm("hoc", "HOC", CLS, "classify", "hoc", f"{_SHARED}/blurb/HoC", "score", "F1 (abstract, BLUE)",
                       FRACTION), evaluator="hoc", evaluator_metric="blue"),
        # Table 1 names Macro-F1, the numbers it compares with (BioBERT's) are micro: micro is the headline, the
        # macro F1 over the same five classes is kept beside it in each cell's scores
        replace(_biolm("chemprot", "ChemProt", CLS, "re", "chemprot", f"{_SHARED}/re/chemprot-original",
                       metric_name="Micro F1", scale=FRACTION), columns=(("f1", "Micro F1"), ("macro_f1", "Macro F1"))),
        _biolm("gad", "GAD", CLS, "classify", "gad_folds", f"{_BIOBERT}: datasets/RE/GAD/1..10", "score", "F1",
               FRACTION, folds="1-10"),
        _biolm("euadr", "EU-ADR", CLS, "classify", "euadr", f"{_BIOBERT}: datasets/RE/euadr/1..10", "score", "F1",
               FRACTION, folds="1-10"),
        _biolm("ddi", "DDI-2013", CLS, "classify", "ddi", f"{_SHARED}/blurb/DDI", "score", "Micro F1", FRACTION),
        _biolm("i2b2_2010_re", "I2B2-2010-RE", CLS, "re", "i2b2_2010_re",
               f"BLUE's i2b2-2010 relation files (github.com/ncbi-nlp/BLUE_Benchmark) made from the release: {_N2C2}",
               scale=FRACTION),
        _biolm("mednli", "MedNLI", CLS, "classify", "mednli",
               f"MedNLI: {_PHYSIONET}, physionet.org/content/mednli (mli_{{train,dev,test}}_v1.jsonl)", "score",
               "Accuracy", FRACTION),
    ))
_seq = tuple(d.key for d in BIOLM.datasets if d.group == SEQ)
BIOLM = replace(BIOLM, means=(
    ("Mean (Seq. Lab.)", _seq), ("Mean (Classif.)", tuple(d.key for d in BIOLM.datasets if d.group == CLS)),
    ("Mean (PubMed)", tuple(d.key for d in BIOLM.datasets if d.key not in BIOLM_CLINICAL)),
    ("Mean (Clinical)", BIOLM_CLINICAL), ("Mean (all)", tuple(d.key for d in BIOLM.datasets))))

# BioELECTRA's clinical tasks (Kanakarajan et al. 2021, ../shared/papers/002 Table 4): 5 runs each, the average
# reported; the per-task values of its Table 7 are the bioelectra/ recipes (a dataset recipe where none exists yet).
CLINICAL = "Clinical (BLUE)"
BLUE_CLINICAL = Suite(
    name="blue-clinical", title="BLUE clinical tasks (BioELECTRA, Kanakarajan et al., 2021)", version=1,
    groups=(CLINICAL,), runs=5,
    datasets=(
        Dataset("mednli", "MedNLI", CLINICAL, "classify", "bioelectra/mednli", "score", "Accuracy", FRACTION,
                fallback=("mednli", ()),
                needs=f"MedNLI: {_PHYSIONET}, physionet.org/content/mednli (mli_{{train,dev,test}}_v1.jsonl)"),
        Dataset("i2b2_2010_re", "i2b2-2010 (relations)", CLINICAL, "re", "bioelectra/i2b2_2010_re", "f1", "Micro F1",
                FRACTION, PRF, fallback=("i2b2_2010_re", ()),
                needs=f"BLUE's i2b2-2010 relation files (github.com/ncbi-nlp/BLUE_Benchmark) made from the release: "
                      f"{_N2C2}"),
        Dataset("share_clefe", "ShARe/CLEFE", CLINICAL, "ner", "bioelectra/share_clefe", "f1", "F1", PERCENT, PRF,
                fallback=("share_clefe", ()),
                needs=f"ShARe/CLEF eHealth 2013 task 1: {_PHYSIONET}, physionet.org/content/shareclefehealth2013"),
        Dataset("clinicalsts", "ClinicalSTS", CLINICAL, "classify", "bioelectra/clinicalsts", "score", "Pearson",
                FRACTION, fallback=("clinicalsts", ()),
                needs=f"ClinicalSTS (n2c2 2019 track 1): {_N2C2}"),
    ))

SUITES = {s.name: s for s in (BLURB, PAPER, BIOLM, BLUE_CLINICAL)}
