"""Public fine-tuning datasets in one table: where each official copy lives, its checksums and licence.

Every file is pinned to a commit of the repository that published it (a raw GitHub URL), with its size and
full sha256, so a download is the same bytes whenever it runs. Most pinned files are already in the formats
our readers take (IOB ``token<TAB>tag`` for NER, BLURB's TSVs for the classification sets, SciBERT's ChemProt
JSON lines for ``finetune re``); a set whose official release needs one names its ``converter`` (PubMedQA: BLURB's
split made from the release, ``corpus/pubmedqa_split.py``), run on the verified files before the folder is renamed.

DDI is made the same way from the DDI-2013 XML release and BLURB's split index (``corpus/ddi_convert.py``), whose
files live in two repositories (a file may name its own ``source``). EBM-PICO is BLURB's own files from the
repository that publishes them; its train.tsv is too large for any copy we hold, and upstream's git tree gives
only its blob id, so that file is pinned by the blob id (:meth:`DatasetFile.pin`) and, once verified, every split
is checked against BLURB's split index (``corpus/ebm_pico.py``).

Downloads reuse :mod:`bio_megatron.corpus.download` (resume from ``.part``, retries, verification). A set is
fetched into ``<out>/<name>.partial/`` and renamed to ``<out>/<name>/`` only once every file verified, so a
failed run leaves nothing at ``--out``; a rerun checks the files already there and fetches only bad ones.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bio_megatron.corpus.download import RemoteFile, download_file
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

RAW_GITHUB = "https://raw.githubusercontent.com"
MIRROR_ENV = "BIO_MEGATRON_DATASETS_URL"

_MTL = ("cambridgeltl/MTL-Bioinformatics-2016", "df0df02fae6dbb87d88ffcf323b9096528f06f84")
_KEBIOLM = ("hieunguyen7337/KeBioLM", "bc7c3667c786236252ba5b26b3b921197465b7a3")
_EDANER = ("issifuabdulmajeed/EDANER_4_BioBERT", "832b988e2ab8a88be7247283a4d82bfbf449cb9a")
_MTL_LICENCE = ("CC BY 4.0 (the MTL-Bioinformatics-2016 repository; the corpus keeps its own terms)",
                "https://github.com/cambridgeltl/MTL-Bioinformatics-2016/blob/master/LICENSE.md")
_BLURB_SCRIPTS = "MIT (Microsoft BLURB data_generation; covers the scripts, not the corpus)"
_PUBMEDQA = ("pubmedqa/pubmedqa", "1cbae8e92f72f20c8d3747cbb3bf5bc53554d997")
_SCIBERT = ("allenai/scibert", "06793f77d7278898159ed50da30d173cdc8fdea9")
_DDI_XML = ("zhangyijia1979/hierarchical-RNNs-model-for-DDI-extraction", "bedb83d01805a90db9a3ef73ac135e408f1af8f9")


@dataclass(frozen=True)
class DatasetFile:
    name: str     # the file's name in the downloaded folder (what our readers and recipes expect)
    path: str     # its path in the upstream repository
    size: int | None = None
    sha256: str | None = None
    source: tuple[str, str] | None = None  # (repo, commit) where not the dataset's own
    # git's blob id (SHA-1 of "blob <size>\0" + bytes): the pin of a file whose size and sha256 we never saw, taken
    # from upstream's tree at the pinned commit (``git ls-tree -l``); it addresses the content as a sha256 would
    git_blob: str | None = None

    def __post_init__(self) -> None:
        if (self.size is None) != (self.sha256 is None) or (self.sha256 is None) == (self.git_blob is None):
            raise ValueError(f"{self.name}: pin a file by size and sha256, or by git_blob alone")

    @property
    def pin(self) -> tuple[str, str]:
        """``("sha256", hex)`` or ``("git_blob", hex)``: how a download of this file is verified."""
        return ("sha256", self.sha256) if self.sha256 is not None else ("git_blob", self.git_blob)  # type: ignore


@dataclass(frozen=True)
class Dataset:
    name: str
    group: str                # "ner" or "blurb": the `data download` source that lists it
    repo: str                 # owner/name on GitHub
    commit: str
    files: tuple[DatasetFile, ...]
    licence: str
    licence_url: str
    converter: str | None = None  # the converter to our format, where upstream's is not ours already

    def origin(self, f: DatasetFile) -> tuple[str, str]:
        """The (repo, commit) that publishes ``f``."""
        return f.source or (self.repo, self.commit)

    def url(self, f: DatasetFile, base: str = RAW_GITHUB) -> str:
        repo, commit = self.origin(f)
        return f"{base.rstrip('/')}/{repo}/{commit}/{f.path}"


def _mtl(name: str, folder: str, sizes_sums: dict[str, tuple[int, str]]) -> Dataset:
    files = tuple(DatasetFile(n, f"data/{folder}/{n}", *sizes_sums[n]) for n in ("train.tsv", "devel.tsv", "test.tsv"))
    return Dataset(name, "ner", *_MTL, files, *_MTL_LICENCE)


def _blurb(name: str, folder: str, licence: str, licence_url: str,
           sizes_sums: dict[str, tuple[int, str]]) -> Dataset:
    files = tuple(DatasetFile(n, f"data/{folder}/{n}", *sizes_sums[n]) for n in ("train.tsv", "dev.tsv", "test.tsv"))
    return Dataset(name, "blurb", *_KEBIOLM, files, f"{licence}; {_BLURB_SCRIPTS}", licence_url)


# Sizes and digests were computed from copies whose bytes and sha256 prefixes match the upstream files.
DATASETS: dict[str, Dataset] = {d.name: d for d in (
    _mtl("BC5CDR-chem", "BC5CDR-chem-IOB", {
        "train.tsv": (983140, "165c4cd2efadd0caf1bb8f3c6bcd3acca199446bb3d55eb06d9137114c9a0b2d"),
        "devel.tsv": (976029, "3f1df5cfcff95735663ffc37121fd3687e82b1e9a019bec0480491502652721b"),
        "test.tsv": (1023429, "6fce42139a9d819151eff3ab8cb0eda6fbf861fd17d4cfe6be2123f010a3b6c5")}),
    _mtl("BC5CDR-disease", "BC5CDR-disease-IOB", {
        "train.tsv": (976013, "d630dafe7dd67e21350cc3278dbdcfadcccbb2b63d0fda83b2427853988e5ad9"),
        "devel.tsv": (967926, "8c3af95475029c2100c2b7c0108b2715bc700ac198c7a21d587f11f1d06b17bd"),
        "test.tsv": (1017600, "a530bf9e17a4122b101b09cedd5f3cf8e6307d6a0093146c33b8de2e69ec0fa3")}),
    _mtl("NCBI-disease", "NCBI-disease-IOB", {
        "train.tsv": (1137445, "58379baf4614b8d757d93dd7a21b202849ca99f9b9d71b49185523ff5443300c"),
        "devel.tsv": (200352, "b4e1e7efcc2a35047bf2f3d281648357470e674f555d4a26a0049ac37d59cc61"),
        "test.tsv": (205664, "8f088ce45dc4746592188f9e69de3d89d87f3bb8f0ed8c4a287d018123fa148d")}),
    _mtl("BC2GM", "BC2GM-IOB", {
        "train.tsv": (2894167, "46e17f4e1509483b82c03f27d6f0214020f738fb71704356fb3445eb824ab38d"),
        "devel.tsv": (577660, "33a94577aa22f1e70ec9e02781a05baa4e1390e866d28bf2b344888e4e3d4103"),
        "test.tsv": (1165057, "30d7a4f571ca8ed22a044528063ba5d0388d666d8b8b329733d6927e5fb30764")}),
    # BioBERT's preprocessed JNLPBA (entity types collapsed to B/I/O), as the BioBERT NER data ships it
    Dataset("JNLPBA", "ner", *_EDANER, tuple(DatasetFile(n, f"datasets/NER/JNLPBA/{n}", s, h) for n, s, h in (
        ("train.tsv", 3372571, "b54193c955d91fb7079f53961e72871c9d4522eb28a141f717f14d2e4eb76a42"),
        ("devel.tsv", 889286, "b770901337d10d844c2fd849266f99afb83850035c8f20db8c053b5874912520"),
        ("test.tsv", 876432, "ab07e2323e99f8be522cfe6287191244d94988b0455c08922d1b8dfb6c785d98"),
        ("labels.txt", 7, "f01002908b9d83e154193abc5e0d3013b089662001e8278c2b87991eb14d5a6e"))),
        "GENIA Project licence: annotations CC BY 3.0",
        "https://github.com/cambridgeltl/MTL-Bioinformatics-2016/blob/master/data/JNLPBA/original-data/test/LICENSE"),
    _blurb("GAD", "GAD", "GAD: CC BY 4.0", "https://creativecommons.org/licenses/by/4.0/", {
        "train.tsv": (773149, "8c57f5f28a843cd64bcd939c62842cf685552315e7a78069be7d1ceff47bb663"),
        "dev.tsv": (94613, "ede2bebdf5fa6094a493801f447bb7827ab0e5511fa0c399234e9e77a96d7159"),
        "test.tsv": (102294, "68fe2b2bddefac2cd5d35b4bc8a13bceee95ee9a582a623632981e893cdb512e")}),
    _blurb("BIOSSES", "BIOSSES", "BIOSSES: GPL-3.0", "https://www.gnu.org/licenses/gpl-3.0.html", {
        "train.tsv": (20669, "19dfcb8d4f07636422cb4b945992131383bf0dfa87847012673abcfc026aa9e7"),
        "dev.tsv": (5237, "15902014e1cf828aaf39ab83051063af3b4aec0f6e38edc3ea609299221d4735"),
        "test.tsv": (6639, "dd68d01d5cc0f73d6790a94b054fdb14b0cd443979f7fc42d1d98aba2cb6791b")}),
    _blurb("HoC", "HoC", "Hallmarks of Cancer: GPL-3.0",
           "https://github.com/sb895/Hallmarks-of-Cancer/blob/master/LICENSE", {
        "train.tsv": (2603679, "48352fe9828a63254c9302d5c9a13abe0167a5016dd1143e7f7e47c0348c9a81"),
        "dev.tsv": (391373, "c0bae75eab5940db8afd3ac620d391661c826fa1428e38d258c9e730f4358b99"),
        "test.tsv": (761669, "2e9ffe24c756b126efa2d351a9572ebb671a3473658bc0766d02ec80b9129d48")}),
    # the official PQA-L release; BLURB's 450/50/500 split is made from it (converter)
    Dataset("PubMedQA", "blurb", *_PUBMEDQA, (
        DatasetFile("ori_pqal.json", "data/ori_pqal.json", 2584787,
                    "8b3276be8942ebbd77f3ddcda12c1749bf0e490045a736fd8438ee40cf37a41d"),
        DatasetFile("test_ground_truth.json", "data/test_ground_truth.json", 11414,
                    "939fe566f09017d13b1ca64d2ddfee0bc2374b366048152997669cccedc44d51")),
        "PubMedQA: MIT", f"https://github.com/{_PUBMEDQA[0]}/blob/{_PUBMEDQA[1]}/LICENSE", converter="pubmedqa_split"),
    # SciBERT's ChemProt (BioCreative VI), the form `finetune re` reads (model.dataset.format: scibert)
    Dataset("ChemProt", "blurb", *_SCIBERT, tuple(
        DatasetFile(n, f"data/text_classification/chemprot/{n}", s, h) for n, s, h in (
            ("train.txt", 1121208, "ab17b85c4fb869b2338d7c9617414e63f3c7225e5005920b18d9cd996f1049d8"),
            ("dev.txt", 678657, "bfe8f39e5146ad4bb16b23707dade850546a305047bc666f6f6824c6a7e3df2f"),
            ("test.txt", 960369, "372249c85ffea6d9a18dc5168cf45841b3d79b03412d6c620381cfc0dd3d6d49"))),
        "ChemProt corpus (BioCreative VI): the organisers' terms at the URL; SciBERT's preprocessing: Apache-2.0",
        "https://biocreative.bioinformatics.udel.edu/resources/corpora/chemprot-corpus-biocreative-vi/"),
    # the DDI-2013 XML release (as vendored at a pinned commit) + BLURB's split index; BLURB's TSVs made from them
    Dataset("DDI", "blurb", *_KEBIOLM, (
        DatasetFile("original_DDIextraction_2013.tar.gz", "DDIextraction2013/DDIextraction_2013.tar.gz", 1075921,
                    "ee760ba7575eaa7292b0f8159b4063afae81f6f78d3f7ac5b0d3217e980bee67", _DDI_XML),
        *(DatasetFile(f"{split}_files.tsv", f"indexing/DDI/{split}_files.tsv", n, h) for split, n, h in (
            ("train", 26004, "6eb73ff441e66149a2e958a48e09808d269dfbac9b84cd4e57a482cf85ba8817"),
            ("dev", 3739, "5eb7a1d1e947b7836f5c6137dadf4590da29b47441aada7106eb5cef6115f029"),
            ("test", 7163, "3aef968656fac32e6dab9416a6d4afe0368f797ce705bb9b501e37fad9d7fe84")))),
        f"DDI corpus: CC BY-NC 4.0 (non-commercial use only); {_BLURB_SCRIPTS}",
        "https://creativecommons.org/licenses/by-nc/4.0/", converter="ddi_blurb"),
    # BLURB's EBM-PICO files and split index; train.tsv by its blob id in the commit's tree (all we have of it), the
    # rest by size and sha256; the converter checks every split's documents against its index
    Dataset("EBM_PICO", "blurb", *_KEBIOLM, (
        DatasetFile("train.tsv", "data/ebmnlp/train.tsv", git_blob="34eeec3b62cd83bd075b77e2ca4b949ba345339d"),
        DatasetFile("dev.tsv", "data/ebmnlp/dev.tsv", 2474109,
                    "700c7bf7642fcfde8cfe52605e1ead8f8ffa5d4f6b09b5e96ef62744e604a8d4"),
        DatasetFile("test.tsv", "data/ebmnlp/test.tsv", 486918,
                    "60f676f1664ad491a6378b1029c7dd1371c461912322fc6382cec8d6784dd508"),
        *(DatasetFile(f"{split}_pmid.tsv", f"indexing/ebmnlp/{split}_pmid.tsv", n, h) for split, n, h in (
            ("train", 33384, "a07d8fe034d832ea2d3e6a0cbcc7c72ac313a09b5d99416af6a534f68a96bfd7"),
            ("dev", 8351, "fa31017d91027058a7c1edd1a0f5919a3385a63adc56de7b442ac1f88b70f579"),
            ("test", 1662, "c09ef450e66c13ebb40f65b97bc7b1c2499c2962f27ee7e34113e7b8a66cef45")))),
        f"EBM-NLP (Nye et al. 2018): licence unstated by its authors (BigBIO: unknown); {_BLURB_SCRIPTS}",
        "https://github.com/bepnye/EBM-NLP", converter="ebm_pico_check"),
)}


def _pubmedqa_split(folder: Path) -> list[Path]:
    from bio_megatron.corpus.pubmedqa_split import write_pqal_splits

    return write_pqal_splits(folder)


def _ddi_blurb(folder: Path) -> list[Path]:
    from bio_megatron.corpus.ddi_convert import write_ddi_splits

    return write_ddi_splits(folder)


def _ebm_pico_check(folder: Path) -> list[Path]:
    from bio_megatron.corpus.ebm_pico import check_ebm_pico

    log.info("EBM_PICO: documents match BLURB's split index: %s", check_ebm_pico(folder))
    return []  # BLURB's files are already ours: checked, nothing written


# name -> writes our files beside upstream's (or only checks them); returns what it wrote
CONVERTERS = {"pubmedqa_split": _pubmedqa_split, "ddi_blurb": _ddi_blurb, "ebm_pico_check": _ebm_pico_check}


def list_datasets(group: str | None = None) -> list[dict[str, Any]]:
    """One row per dataset (of ``group``, or all): files with URL, size and pin (``sha256``, or ``git_blob`` with
    size null where that is all upstream gives); licence; converter."""
    return [{"name": d.name, "group": d.group, "licence": d.licence, "licence_url": d.licence_url,
             "converter": d.converter,
             "files": [{"name": f.name, "url": d.url(f), "bytes": f.size, f.pin[0]: f.pin[1]} for f in d.files]}
            for d in DATASETS.values() if group in (None, d.group)]


def get_dataset(name: str, group: str | None = None) -> Dataset:
    d = DATASETS.get(name)
    if d is None or (group is not None and d.group != group):
        known = ", ".join(x.name for x in DATASETS.values() if group in (None, x.group))
        raise DataError(f"unknown {group or 'public'} dataset {name!r}; choose from {known}")
    return d


def _mirror_base(mirror: str | None) -> str:
    """``mirror`` as a base URL: a local folder laid out like raw.githubusercontent.com becomes file://."""
    if not mirror:
        return RAW_GITHUB
    if "://" in mirror:
        return mirror
    folder = Path(mirror).resolve()
    if not folder.is_dir():
        raise DataError("mirror folder does not exist (expected <repo owner>/<name>/<commit>/<path>)", mirror)
    return folder.as_uri()


def _at_source(d: Dataset, base: str, work: Path, exc: DataError) -> DataError:
    """``exc`` naming the staged file (removed by now) restated to name the file's URL, line kept."""
    f = next((f for f in d.files if exc.path is not None and Path(exc.path) == work / f.name), None)
    if f is None:
        return exc
    why = str(exc).removeprefix(f"{exc.path}:{exc.line}: " if exc.line is not None else f"{exc.path}: ")
    return DataError(f"{d.name}/{f.name}: {why}", d.url(f, base), exc.line)


def download_dataset(name: str, out_dir: str | Path, group: str | None = None, mirror: str | None = None,
                     **kwargs: Any) -> dict[str, Any]:
    """Fetch one public dataset into ``<out_dir>/<name>/``, each file verified against its pin; return what happened.

    ``kwargs`` go to :func:`download_file` (``retries``, ``timeout``, ``backoff_s``)."""
    d = get_dataset(name, group)
    base = _mirror_base(mirror)
    out = Path(out_dir)
    final = out / d.name
    # A finished folder is checked in place (download_file skips verified files); a new one is staged.
    work = final if final.is_dir() else out / f"{d.name}.partial"
    created_out = not out.exists()
    work.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for i, f in enumerate(d.files, 1):
            remote = RemoteFile(d.url(f, base), f.name, sha256=f.sha256, git_blob=f.git_blob)
            res = download_file(remote, work, **kwargs)
            results.append(res)
            log.info("%s %d/%d %s [%s] %s bytes", d.name, i, len(d.files), f.name, res["status"], f"{res['bytes']:,}")
    except DataError as exc:
        if work != final:
            shutil.rmtree(work, ignore_errors=True)
            if created_out:
                shutil.rmtree(out, ignore_errors=True)
        # name the URL, not the staging path that no longer exists
        why = str(exc).removeprefix(f"{exc.path}: ") if exc.path else str(exc)
        raise DataError(f"{d.name}/{f.name}: {why}", d.url(f, base)) from None
    derived = []
    if d.converter is not None:
        try:
            derived = CONVERTERS[d.converter](work)
        except BaseException as exc:
            if work != final:  # nothing half-converted is left at --out
                shutil.rmtree(work, ignore_errors=True)
                if created_out:
                    shutil.rmtree(out, ignore_errors=True)
                if isinstance(exc, DataError):
                    raise _at_source(d, base, work, exc) from None
            raise
        if derived:
            log.info("%s: %s wrote %s", d.name, d.converter, ", ".join(str(p.relative_to(work)) for p in derived))
    if work != final:
        work.replace(final)
    return {"name": d.name, "out": str(final), "licence": d.licence, "licence_url": d.licence_url,
            "converted": [str(final / p.relative_to(work)) for p in derived],
            "files": len(results), "downloaded": sum(r["status"] == "downloaded" for r in results),
            "present": sum(r["status"] == "present" for r in results),
            "bytes": sum(r["bytes"] for r in results)}
