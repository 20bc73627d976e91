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
                if "git_blob" in f:  # all upstream gives for a file we never had: its blob id, no size
                    assert re.fullmatch(r"[0-9a-f]{40}", f["git_blob"]) and f["bytes"] is None and "sha256" not in f
                else:
                    assert re.fullmatch(r"[0-9a-f]{64}", f["sha256"]) and f["bytes"] > 0
    rc, _, errors = _cli(["data", "download", "ner", "--name", "GAD", "--out", "unused"])
    assert rc == 2 and "unknown ner dataset 'GAD'" in errors and "BC5CDR-chem" in errors


def test_every_pinned_size_and_sha256_matches_the_real_copy_in_shared() -> None:
    """The table's digests are those of the upstream files (../shared holds the same bytes for every set, except
    EBM-PICO's train.tsv, pinned by blob id only: test_git_blob_ids_are_gits)."""
    import hashlib

    for d in DATASETS.values():
        for f in d.files:
            local = COPIES.get(d.name, SHARED / d.group / d.name) / f.name
            if f.pin[0] == "git_blob":
                continue
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


# --- EBM-PICO: BLURB's files, train.tsv pinned by its git blob id, every split checked against its index ----------
PICO = SHARED / "blurb" / "EBM_PICO"
# upstream's tree at the pinned commit, as `git ls-tree -r bc7c366` of hieunguyen7337/KeBioLM lists it (outside truth)
KEBIOLM_BLOBS = {"dev.tsv": "91b4bc55913f7cd344ebdb0319844d79ab41fa76",
                 "test.tsv": "f1f3e476005d4cbc065edde551408276e80c2e72",
                 "train_pmid.tsv": "700d336d32e74e40620810a65160c5aa52a52df2",
                 "dev_pmid.tsv": "31daee1cfb77173e32f8a6634394e8f40de53ace",
                 "test_pmid.tsv": "fe7b3857d6a26a8853cb562fc9f11e2d8fb4e1f4",
                 "train.tsv": "34eeec3b62cd83bd075b77e2ca4b949ba345339d"}


def test_git_blob_ids_are_gits(tmp_path: Path) -> None:
    """Our blob id of the real dev/test/index files equals upstream's tree listing and `git hash-object`; the table
    pins train.tsv by the listing's id and everything else by sha256."""
    import subprocess

    from bio_megatron.corpus.download import git_blob_id

    for name, blob in KEBIOLM_BLOBS.items():
        if name != "train.tsv":
            assert git_blob_id(PICO / name) == blob, name
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert git_blob_id(empty) == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git's empty blob
    if shutil.which("git"):
        names = [str(PICO / "dev.tsv"), str(PICO / "test.tsv"), str(empty)]
        got = subprocess.run(["git", "hash-object", *names], capture_output=True, text=True, check=True).stdout.split()
        assert got == [git_blob_id(n) for n in names]
    pins = {f.name: f.pin for f in DATASETS["EBM_PICO"].files}
    assert pins.pop("train.tsv") == ("git_blob", KEBIOLM_BLOBS["train.tsv"])
    assert {kind for kind, _ in pins.values()} == {"sha256"}


def _pico_train(path: Path, tag: str = "I-OUT", drop: int = 0, add: str | None = None) -> Path:
    """A train.tsv of BLURB's form holding one short sentence per PMID of the real train_pmid.tsv (in its order)
    with all four tags; ``drop`` PMIDs left out, ``add`` a PMID added, ``tag`` the last word's tag."""
    pmids = (PICO / "train_pmid.tsv").read_text().strip().split(",")[drop:] + ([add] if add else [])
    path.write_text("".join(f"-DOCSTART- ({p})\n\nAspirin\tI-INT\nin\tO\nadults\tI-PAR\n:\tO\npain\t{tag}\n\n"
                            for p in pmids))
    return path


def _pico_mirror(root: Path, train: Path, monkeypatch: pytest.MonkeyPatch, pin: Path | None = None) -> Path:
    """A mirror of EBM_PICO with the real dev/test/index files and ``train``; for the test only, the table's
    train.tsv pin is replaced by the blob id of ``pin`` (default ``train``): upstream's train.tsv is not here."""
    import dataclasses

    from bio_megatron.corpus.download import git_blob_id

    d = DATASETS["EBM_PICO"]
    files = tuple(dataclasses.replace(f, git_blob=git_blob_id(pin or train)) if f.name == "train.tsv" else f
                  for f in d.files)
    monkeypatch.setitem(DATASETS, "EBM_PICO", dataclasses.replace(d, files=files))
    for f in files:
        dest = root.joinpath(*d.origin(f), f.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(train if f.name == "train.tsv" else PICO / f.name, dest)
    return root


def _pico_download(tmp: Path, out: Path, mirror: Path):
    from tests.harness import cli_forked

    return cli_forked(["data", "download", "blurb", "--name", "EBM_PICO", "--out", str(out), "--mirror", str(mirror),
                       "--retries", "1"])


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " ERROR " in line]


def test_ebm_pico_downloads_and_is_the_folder_the_recipe_reads(tmp_path: Path, monkeypatch) -> None:
    """EBM_PICO from a local mirror (dev/test/index: ../shared's real files; train.tsv written here and pinned by its
    blob id for the test): the licence first, the six files, and `ner/ebm_pico` with only data_dir set finds its
    train/dev/test there, each the documents of its index with PICO tags."""
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.config.recipes import RECIPES
    from bio_megatron.tasks.blurb_tagging import read_ebm_pico
    from bio_megatron.tasks.ner import read_split

    train = _pico_train(tmp_path / "train.tsv")
    out = tmp_path / "out"
    ran = _pico_download(tmp_path, out, _pico_mirror(tmp_path / "mirror", train, monkeypatch))
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("EBM_PICO: licence EBM-NLP (Nye et al. 2018): licence unstated")
    summary = json.loads(ran.stdout.split("\n", 1)[1])["datasets"][0]
    assert summary["downloaded"] == 6 and summary["converted"] == []
    got = out / "EBM_PICO"
    assert sorted(p.name for p in got.iterdir()) == sorted(f.name for f in DATASETS["EBM_PICO"].files)
    ds = load_finetune_config("ner", str(RECIPES / "ner" / "ebm_pico.yaml"), [f"model.dataset.data_dir={got}"]
                              ).model.dataset
    files = {split: Path(ds.data_dir) / getattr(ds, f"{split}_file") for split in ("train", "dev", "test")}
    assert files["train"].read_bytes() == train.read_bytes()
    # dev/test: the bytes of ../shared's copies, which the recipe's default data_dir reads (test_classify_recipes)
    for split in ("dev", "test"):
        assert files[split].read_bytes() == (PICO / f"{split}.tsv").read_bytes()
    assert len(read_ebm_pico(files["train"], got / "train_pmid.tsv")) == 3842  # BLURB's train abstracts
    # the NER task's own reader takes it, and its label map gets BLURB's four tags
    assert {t for sentence in read_split(ds, ds.train_file) for t in sentence.tags} == {"O", "I-PAR", "I-INT", "I-OUT"}


@pytest.mark.parametrize("case", ["blob", "pmids", "tag"])
def test_a_bad_ebm_pico_train_is_one_line_exit_2_and_nothing_at_out(tmp_path: Path, monkeypatch, case: str) -> None:
    """A train.tsv whose bytes are not the pinned blob, one whose PMIDs differ from train_pmid.tsv (one left out,
    one added; both verify against their pin), and one with a tag not of BLURB's four: one line naming the file
    (and line), exit 2, --out never created."""
    good = _pico_train(tmp_path / "good.tsv")
    bad = tmp_path / "train.tsv"
    if case == "blob":
        bad.write_bytes(good.read_bytes().replace(b"Aspirin", b"Aspirim", 1))  # one byte of the first word
    else:
        _pico_train(bad, drop=1, add="1") if case == "pmids" else _pico_train(bad, tag="B-OUT")
    mirror = _pico_mirror(tmp_path / "mirror", bad, monkeypatch, pin=good if case == "blob" else None)
    out = tmp_path / "out"
    ran = _pico_download(tmp_path, out, mirror)
    assert ran.returncode == 2, ran.stderr
    (line,) = _error_lines(ran.stderr)
    url = DATASETS["EBM_PICO"].url(DATASETS["EBM_PICO"].files[0], mirror.resolve().as_uri())
    assert "EBM_PICO/train.tsv" in line and url in line, line
    if case == "blob":
        from bio_megatron.corpus.download import git_blob_id

        assert f"git blob id mismatch (expected {git_blob_id(good)}, got {git_blob_id(bad)})" in line
    elif case == "pmids":
        # 8 lines a document: its marker, a blank, five words, a blank; the added PMID comes after the 3,841 kept
        assert f"{url}:{8 * 3841 + 1}: EBM_PICO/train.tsv: document 1 is not in train_pmid.tsv (1 such)" in line
    else:
        assert f"{url}:7: EBM_PICO/train.tsv: 'pain\\tB-OUT' is not token<TAB>tag" in line
    assert not out.exists()


def test_an_index_pmid_without_its_document_names_the_index_and_real_dev_test_pass(tmp_path: Path) -> None:
    """The check the other way round (a listed PMID with no document: the index file and line), and BLURB's real
    dev/test against their real indexes: 960 and 191 abstracts (SOURCES.md)."""
    from bio_megatron.corpus.ebm_pico import check_split
    from bio_megatron.utils.errors import DataError

    assert [check_split(PICO / f"{s}.tsv", PICO / f"{s}_pmid.tsv") for s in ("dev", "test")] == [960, 191]
    train = _pico_train(tmp_path / "train.tsv", drop=2)
    first = (PICO / "train_pmid.tsv").read_text().split(",")[0]
    with pytest.raises(DataError, match=rf"train_pmid.tsv:1: PMID {first} \(and 1 more\) of train_pmid.tsv has no "
                                        r"document in train.tsv$"):
        check_split(train, PICO / "train_pmid.tsv")


@pytest.mark.extended
def test_the_downloaded_folder_gives_benchmark_blurbs_ebm_pico_cell(tmp_path: Path, monkeypatch) -> None:
    """The BLURB suite's ebm_pico cell, missing while ../shared has no train split, runs on a downloaded folder given by
    a --recipe-map (the recipe unchanged but data_dir; a tiny random model, 32 training sentences, 1 epoch) and is
    scored on the full test split exactly as `bio-megatron evaluate ebm_pico` scores the run's predictions.
    Extended: ~15 s, and the download itself is proven by the tests above."""
    import yaml

    from tests.benchmark.suite_files import SMALL, make_model
    from tests.harness import cli_forked

    out = tmp_path / "out"
    ran = _pico_download(tmp_path, out, _pico_mirror(tmp_path / "mirror", _pico_train(tmp_path / "t.tsv"), monkeypatch))
    assert ran.returncode == 0, ran.stderr
    folder = out / "EBM_PICO"
    recipe_map = tmp_path / "map.yaml"
    recipe_map.write_text(yaml.safe_dump({"ebm_pico": {"overrides": [
        f"model.dataset.data_dir={folder}", "model.dataset.max_train_examples=32", *SMALL]}}))
    suite = tmp_path / "suite"
    ran = cli_forked(["benchmark", "blurb", "--model", str(make_model(tmp_path / "model")), "--out", str(suite),
                      "--datasets", "ebm_pico", "--seeds", "1", "--no-grid", "--epochs", "1",
                      "--recipe-map", str(recipe_map)])
    assert ran.returncode == 0, ran.stderr[-3000:]
    cell = json.loads((suite / "cells" / "ebm_pico" / "seed1" / "cell.json").read_text())
    assert cell["status"] == "finished", cell
    pred = suite / cell["run_dir"] / "test_predictions.conll"  # run_dir: relative to the suite folder
    scored = cli_forked(["evaluate", "ebm_pico", "--gold", str(folder / "test.tsv"), "--pred", str(pred)])
    assert scored.returncode == 0, scored.stderr
    truth = json.loads(scored.stdout)
    assert truth["words"] == 51784  # BLURB's test split, whole (SOURCES.md)
    assert cell["evaluation"]["score"] == truth["score"]
    assert cell["scores"]["score"] == pytest.approx(100 * truth["score"])
