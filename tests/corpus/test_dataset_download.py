"""``bio-megatron data download {ner,blurb}`` against a local mirror laid out like raw.githubusercontent.com.

The mirror is built from the real files in ``../shared/data`` (skipped when absent), which are byte for byte the
upstream files the table pins; no test touches the network.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from bio_megatron.corpus.datasets import DATASETS, MIRROR_ENV
from bio_megatron.corpus.iob import read_iob
from bio_megatron.tasks.blurb_data import read_gad
from tests.reliability.cli_log import run_cli

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
LOCAL = {"BC5CDR-chem": SHARED / "ner" / "BC5CDR-chem", "GAD": SHARED / "blurb" / "GAD"}
pytestmark = pytest.mark.skipif(not all(p.is_dir() for p in LOCAL.values()), reason="../shared/data is absent")
COPIES = {"ChemProt": SHARED / "re" / "chemprot-scibert"}  # where ../shared keeps a set outside <group>/<name>


def _mirror(root: Path, corrupt: str | None = None) -> Path:
    """A folder ``<owner>/<repo>/<commit>/<path>`` holding the two sets' files (one byte of ``corrupt`` flipped)."""
    for name, local in LOCAL.items():
        d = DATASETS[name]
        for f in d.files:
            dest = root.joinpath(*d.origin(f), f.path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local / f.name, dest)
            if corrupt == f"{name}/{f.name}":
                data = bytearray(dest.read_bytes())
                data[100] ^= 0xFF
                dest.write_bytes(bytes(data))
    return root


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """Exit code, stdout and the logged errors of an in-process CLI run."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc, errors = run_cli(argv)
    return rc, out.getvalue(), errors


@pytest.fixture(scope="module")
def fetched(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """BC5CDR-chem and GAD downloaded once from a local mirror (a folder for one, a file:// URL for the other)."""
    tmp = tmp_path_factory.mktemp("datasets")
    mirror = _mirror(tmp / "mirror")
    out = tmp / "out"
    ner = _cli(["data", "download", "ner", "--name", "BC5CDR-chem", "--out", str(out), "--mirror", str(mirror)])
    blurb = _cli(["data", "download", "blurb", "--name", "GAD", "--out", str(out), "--mirror", mirror.as_uri()])
    return {"mirror": mirror, "out": out, "ner": ner, "blurb": blurb}


def test_two_datasets_from_a_mirror_equal_the_upstream_files_and_read(fetched: dict) -> None:
    for key, name in (("ner", "BC5CDR-chem"), ("blurb", "GAD")):
        rc, stdout, errors = fetched[key]
        assert rc == 0, errors
        # the licence is printed before the download's summary
        first, rest = stdout.split("\n", 1)
        assert first.startswith(f"{name}: licence ") and DATASETS[name].licence_url in first
        summary = json.loads(rest)["datasets"][0]
        assert summary["downloaded"] == len(DATASETS[name].files) and summary["present"] == 0
        got = fetched["out"] / name
        assert sorted(p.name for p in got.iterdir()) == sorted(f.name for f in DATASETS[name].files)
        for f in DATASETS[name].files:
            assert (got / f.name).read_bytes() == (LOCAL[name] / f.name).read_bytes()
    assert not list(fetched["out"].glob("*.partial"))
    # our readers take them as they are
    sentences = read_iob(fetched["out"] / "BC5CDR-chem" / "train.tsv")
    assert len(sentences) > 4000
    assert len(read_gad(fetched["out"] / "GAD" / "train.tsv")) == 4261  # BLURB's count


def test_a_rerun_checks_the_files_there_and_fetches_nothing(fetched: dict, monkeypatch) -> None:
    monkeypatch.setenv(MIRROR_ENV, str(fetched["mirror"]))  # the env var stands for --mirror
    before = {p: p.stat().st_mtime_ns for p in (fetched["out"] / "GAD").iterdir()}
    rc, stdout, errors = _cli(["data", "download", "blurb", "--name", "GAD", "--out", str(fetched["out"])])
    assert rc == 0, errors
    summary = json.loads(stdout.split("\n", 1)[1])["datasets"][0]
    assert summary["present"] == 3 and summary["downloaded"] == 0
    assert {p: p.stat().st_mtime_ns for p in (fetched["out"] / "GAD").iterdir()} == before


def test_a_checksum_mismatch_is_one_line_naming_the_file_and_both_sums_and_leaves_nothing(tmp_path: Path) -> None:
    mirror = _mirror(tmp_path / "mirror", corrupt="GAD/test.tsv")
    out = tmp_path / "out"
    rc, _, errors = _cli(["data", "download", "blurb", "--name", "GAD", "--out", str(out), "--mirror", str(mirror),
                          "--retries", "1"])
    assert rc == 2
    assert "\n" not in errors and "GAD/test.tsv" in errors and "SHA256 mismatch" in errors
    expected = next(f.sha256 for f in DATASETS["GAD"].files if f.name == "test.tsv")
    sums = re.findall(r"\b[0-9a-f]{64}\b", errors)
    assert sums[0] == expected and len(sums) == 2 and sums[1] != expected
    assert not out.exists()


def test_list_shows_every_set_with_pinned_urls_sizes_sums_and_licences() -> None:
    for group in ("ner", "blurb"):
        rc, stdout, errors = _cli(["data", "download", group, "--list"])
        assert rc == 0, errors
        rows = json.loads(stdout)
        assert {r["name"] for r in rows} == {d.name for d in DATASETS.values() if d.group == group}
        for r in rows:
            assert r["licence"] and r["licence_url"].startswith("https://")
            for f in r["files"]:
                assert re.search(r"/[0-9a-f]{40}/", f["url"]), f["url"]  # pinned to a commit
                assert re.fullmatch(r"[0-9a-f]{64}", f["sha256"]) and f["bytes"] > 0
    rc, _, errors = _cli(["data", "download", "ner", "--name", "GAD", "--out", "unused"])
    assert rc == 2 and "unknown ner dataset 'GAD'" in errors and "BC5CDR-chem" in errors


def test_every_pinned_size_and_sha256_matches_the_real_copy_in_shared() -> None:
    """The table's digests are those of the upstream files (../shared holds the same bytes for every set)."""
    import hashlib

    for d in DATASETS.values():
        for f in d.files:
            local = COPIES.get(d.name, SHARED / d.group / d.name) / f.name
            assert local.stat().st_size == f.size, local
            assert hashlib.sha256(local.read_bytes()).hexdigest() == f.sha256, local


def _mirror_of(root: Path, name: str) -> Path:
    d = DATASETS[name]
    for f in d.files:
        dest = root.joinpath(*d.origin(f), f.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(COPIES.get(name, SHARED / d.group / name) / f.name, dest)
    return root


def test_pubmedqa_downloads_the_release_and_makes_blurbs_split(tmp_path: Path) -> None:
    """The official PQA-L release, pinned, split as BLURB reads it (pqal_fold0 train/dev, test_set): the files equal
    BLURB's copies in ../shared byte for byte, the test set is exactly the release's test_ground_truth.json, and
    the readers take them (450/50/500)."""
    from bio_megatron.tasks.blurb_data import read_pubmedqa

    local = SHARED / "blurb" / "PubMedQA"
    out = tmp_path / "out"
    rc, stdout, errors = _cli(["data", "download", "blurb", "--name", "PubMedQA", "--out", str(out), "--mirror",
                               str(_mirror_of(tmp_path / "mirror", "PubMedQA"))])
    assert rc == 0, errors
    assert stdout.startswith("PubMedQA: licence PubMedQA: MIT <https://github.com/pubmedqa/pubmedqa/blob/")
    summary = json.loads(stdout.split("\n", 1)[1])["datasets"][0]
    got = out / "PubMedQA"
    derived = ["pqal_fold0/dev_set.json", "pqal_fold0/train_set.json", "test_set.json"]
    assert sorted(str(Path(p).relative_to(got)) for p in summary["converted"]) == derived
    for name in derived:
        assert (got / name).read_bytes() == (local / name).read_bytes(), name
    truth = json.loads((got / "test_ground_truth.json").read_text())
    test = read_pubmedqa(got / "test_set.json", got / "test_ground_truth.json")
    assert {e.id: e.label for e in test} == truth and len(test) == 500
    train, dev = (read_pubmedqa(got / "pqal_fold0" / f) for f in ("train_set.json", "dev_set.json"))
    assert (len(train), len(dev)) == (450, 50) and not {e.id for e in train} & {e.id for e in dev}
    assert not list(out.glob("*.partial"))


def test_pqal_split_is_stratified_and_seeded() -> None:
    """The split procedure on a synthetic release of 1,000 (the release's 552/338/110 labels): 500/450/50, each part's
    labels in the release's proportions, the same split on every run, another fold another dev set."""
    from bio_megatron.corpus.pubmedqa_split import pqal_splits

    labels = ["yes"] * 552 + ["no"] * 338 + ["maybe"] * 110
    release = {str(10_000 + i): {"final_decision": label} for i, label in enumerate(labels)}
    a, b = pqal_splits(release), pqal_splits(dict(release))
    assert a == b and [list(x) for x in a.values()] == [list(x) for x in b.values()]
    test, train, dev = a["test_set.json"], a["pqal_fold0/train_set.json"], a["pqal_fold0/dev_set.json"]
    assert (len(test), len(train), len(dev)) == (500, 450, 50)
    assert set(test) | set(train) | set(dev) == set(release) and not set(test) & (set(train) | set(dev))
    for part, n in ((test, 500), (train | dev, 500), (dev, 50)):
        share = sum(r["final_decision"] == "yes" for r in part.values()) / n
        assert abs(share - 0.552) < 0.03, share
    other = pqal_splits(release, fold=3)
    assert other["test_set.json"] == test and other["pqal_fold3/dev_set.json"].keys() != dev.keys()


def test_a_release_without_labels_is_one_line_naming_it_and_nothing_is_written(tmp_path: Path) -> None:
    from bio_megatron.corpus.pubmedqa_split import write_pqal_splits
    from bio_megatron.utils.errors import DataError

    (tmp_path / "ori_pqal.json").write_text(json.dumps({"1": {"final_decision": "yes"}, "2": {"QUESTION": "q"}}))
    with pytest.raises(DataError, match=r"ori_pqal.json.*final_decision.*\['2'\]"):
        write_pqal_splits(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ori_pqal.json"]


def test_chemprot_downloads_scibert_files_that_finetune_re_reads(tmp_path: Path) -> None:
    from bio_megatron.tasks.re_data import read_scibert_jsonl

    out = tmp_path / "out"
    rc, stdout, errors = _cli(["data", "download", "blurb", "--name", "ChemProt", "--out", str(out), "--mirror",
                               str(_mirror_of(tmp_path / "mirror", "ChemProt"))])
    assert rc == 0, errors
    assert stdout.startswith("ChemProt: licence ChemProt corpus (BioCreative VI)")
    assert sorted(p.name for p in (out / "ChemProt").iterdir()) == ["dev.txt", "test.txt", "train.txt"]
    assert len(read_scibert_jsonl(out / "ChemProt" / "train.txt")) == 4169  # SciBERT's count (its SOURCES.md)


def test_ddi_downloads_the_xml_release_and_makes_blurbs_tsvs(tmp_path: Path) -> None:
    """DDI-2013's XML release and BLURB's split index, from two repositories, pinned; the pair lines made from them
    equal BLURB's dev.tsv and test.tsv (and ../shared's train.tsv) byte for byte and read as BLURB's counts; the
    non-commercial licence is printed first."""
    from bio_megatron.tasks.blurb_data import read_ddi

    d = DATASETS["DDI"]
    assert len({d.origin(f) for f in d.files}) == 2
    out = tmp_path / "out"
    rc, stdout, errors = _cli(["data", "download", "blurb", "--name", "DDI", "--out", str(out), "--mirror",
                               str(_mirror_of(tmp_path / "mirror", "DDI"))])
    assert rc == 0, errors
    assert stdout.startswith("DDI: licence DDI corpus: CC BY-NC 4.0 (non-commercial use only)")
    local = SHARED / "blurb" / "DDI"
    for split, n in (("train", 25296), ("dev", 2496), ("test", 5716)):
        assert (out / "DDI" / f"{split}.tsv").read_bytes() == (local / f"{split}.tsv").read_bytes(), split
        assert len(read_ddi(out / "DDI" / f"{split}.tsv")) == n


def test_a_split_index_naming_a_file_the_archive_lacks_is_one_line(tmp_path: Path) -> None:
    from bio_megatron.corpus.ddi_convert import ARCHIVE, write_ddi_splits
    from bio_megatron.utils.errors import DataError

    local = SHARED / "blurb" / "DDI"
    for name in (ARCHIVE, "train_files.tsv", "dev_files.tsv", "test_files.tsv"):
        shutil.copyfile(local / name, tmp_path / name)
    index = tmp_path / "dev_files.tsv"
    names = index.read_text().splitlines() + ["train_dataset/MedLine/0.xml"]
    index.write_text("\n".join(names) + "\n")
    with pytest.raises(DataError, match=rf"dev_files.tsv:{len(names)}: 'train_dataset/MedLine/0.xml' is not a file of"):
        write_ddi_splits(tmp_path)
    assert not [p.name for p in tmp_path.glob("*.tsv") if not p.name.endswith("_files.tsv")]  # nothing written
