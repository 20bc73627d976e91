"""The units of work `make test` hands to its two pytest-xdist workers (hooked in by tests/conftest.py).

A unit goes whole to the next free worker, in collection order. A test file is one unit, so its module fixtures are
built once. The files whose tests use the local SLURM cluster (directly or through the reference run it hosts) are
one unit, so it starts once; that unit goes first: it is the longest (minutes), and started late it would leave
the other worker idle at the end. The scheduler is ours because xdist 3.8's own grouping (`--dist loadgroup`)
renames node ids through an attribute pytest 9.2 no longer reads, so it silently groups nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

SLURM_FIXTURE = "slurm_cluster"
CLUSTER_FILES = ("tests/launch/test_benchmark_slurm.py", "tests/launch/test_launch_slurm.py",
                 "tests/launch/test_image.py")


def unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return SLURM_FIXTURE if path in CLUSTER_FILES else path


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling  # only under xdist: a plain run never calls this

    class FileUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    return FileUnits(config, log)


def check_cluster_files(items: list[Any]) -> None:
    """Stop collection when a file outside CLUSTER_FILES uses the cluster: in its own unit, a second cluster would
    start beside the first."""
    users = {i.nodeid.split("::", 1)[0] for i in items if SLURM_FIXTURE in getattr(i, "fixturenames", ())}
    strays = sorted(users - set(CLUSTER_FILES))
    if strays:
        raise pytest.UsageError(f"{', '.join(strays)} use(s) the SLURM cluster: add to CLUSTER_FILES in {__file__}")


def cluster_first(items: list[Any]) -> None:
    items.sort(key=lambda item: unit(item.nodeid) != SLURM_FIXTURE)  # stable: the rest keep their order
