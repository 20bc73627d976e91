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


def _mirror(root: Path, corrupt: str | None = None) -> Path:
    """A folder ``<owner>/<repo>/<commit>/<path>`` holding the two sets' files (one byte of ``corrupt`` flipped)."""
    for name, local in LOCAL.items():
        d = DATASETS[name]
        for f in d.files:
            dest = root / d.repo / d.commit / f.path
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
            local = SHARED / d.group / d.name / f.name
            assert local.stat().st_size == f.size, local
            assert hashlib.sha256(local.read_bytes()).hexdigest() == f.sha256, local
