"""The units `make test` hands to its pytest-xdist workers (tests/xdist_units.py): one per file, and one for every
file on the local SLURM cluster, which must be listed so that the cluster never starts twice."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import xdist_units as units

ROOT = Path(__file__).resolve().parents[1]


def test_cluster_files_are_one_unit_and_every_other_file_its_own():
    assert {units.unit(f"{path}::test_x") for path in units.CLUSTER_FILES} == {units.SLURM_FIXTURE}
    assert units.unit("tests/vocab/test_sentencepiece.py::test_a[cased]") == "tests/vocab/test_sentencepiece.py"
    for path in units.CLUSTER_FILES:  # a renamed file would silently leave the unit
        assert (ROOT / path).is_file(), path


def test_a_file_on_the_cluster_that_is_not_listed_stops_collection():
    item = SimpleNamespace(nodeid="tests/launch/test_new_slurm.py::test_job", fixturenames=["slurm_cluster"])
    listed = SimpleNamespace(nodeid=f"{units.CLUSTER_FILES[0]}::test_job", fixturenames=["slurm_cluster"])
    with pytest.raises(pytest.UsageError, match="tests/launch/test_new_slurm.py use.*CLUSTER_FILES"):
        units.check_cluster_files([listed, item])
    units.check_cluster_files([listed])  # listed: accepted
