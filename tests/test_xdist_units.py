"""The units `make test` hands to its pytest-xdist workers (tests/conftest.py): one per file, and one for every
file on the local SLURM cluster, which must be listed so that the cluster never starts twice."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import conftest

ROOT = Path(__file__).resolve().parents[1]


def test_cluster_files_are_one_unit_and_every_other_file_its_own():
    assert {conftest._unit(f"{path}::test_x") for path in conftest.CLUSTER_FILES} == {conftest.SLURM_FIXTURE}
    assert conftest._unit("tests/vocab/test_sentencepiece.py::test_a[cased]") == "tests/vocab/test_sentencepiece.py"
    for path in conftest.CLUSTER_FILES:  # a renamed file would silently leave the unit
        assert (ROOT / path).is_file(), path


def test_a_file_on_the_cluster_that_is_not_listed_stops_collection():
    item = SimpleNamespace(nodeid="tests/launch/test_new_slurm.py::test_job", fixturenames=["slurm_cluster"])
    listed = SimpleNamespace(nodeid=f"{conftest.CLUSTER_FILES[0]}::test_job", fixturenames=["slurm_cluster"])
    with pytest.raises(pytest.UsageError, match="tests/launch/test_new_slurm.py use.*CLUSTER_FILES"):
        conftest.pytest_collection_modifyitems(SimpleNamespace(), [listed, item])
    conftest.pytest_collection_modifyitems(SimpleNamespace(), [listed])  # listed: accepted
