"""Shared fixtures. torch and megatron-core are imported once here, so that every forked gloo world
starts in well under a second instead of paying the ~6 s import per process."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
warnings.filterwarnings("ignore", module=r"megatron(\..*)?")
# megatron-core's import looks for CUDA through torch.utils.cpp_extension, which logs a warning where there is none;
# uncaptured in pytest-xdist's controller, it would be the last line of `make test` (the CLI mutes it the same way)
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

import torch  # noqa: E402,F401
import megatron.core  # noqa: E402,F401  (import cost paid once, before any fork)
from megatron.core.models.bert import bert_model  # noqa: E402,F401


@pytest.fixture(scope="session")
def pubmed_prefix(tmp_path_factory) -> Path:
    """Indexed pretraining data built by the real corpus pipeline from the bundled PubMed/PMC sample."""
    from bio_megatron.demo import build_demo_corpus

    return build_demo_corpus(tmp_path_factory.mktemp("corpus"))


# --- The pytest process must never join a process group -------------------------------------------------------
# Every test forks its gloo worlds from this process (tests/harness.py). A process group set up here (e.g. by
# calling a converter or the CLI in-process) leaves gloo/megatron state that forked children inherit: their own
# initialize_model_parallel then segfaults or hangs, failing tests far from the cause. Such code belongs in
# run_world(1, ...) or a subprocess; this guard names the test that broke the rule.
import os  # noqa: E402

_PYTEST_PID = os.getpid()
_joined: list[str] = []
_real_init_process_group = torch.distributed.init_process_group


def _recording_init_process_group(*args, **kwargs):
    if os.getpid() == _PYTEST_PID:
        _joined.append(os.environ.get("PYTEST_CURRENT_TEST", "?"))
    return _real_init_process_group(*args, **kwargs)


torch.distributed.init_process_group = _recording_init_process_group


@pytest.fixture(autouse=True)
def _pytest_process_joins_no_process_group():
    before = len(_joined)
    yield
    if len(_joined) > before:
        from bio_megatron.parallel.distributed import teardown

        teardown()
        pytest.fail("this test set up torch.distributed in the pytest process itself; forked worlds started later "
                    "would inherit that state (run such code in harness.run_world(1, ...) or a subprocess)")


# --- Units of work under pytest-xdist ---------------------------------------------------------------------------
# `make test` runs two workers; a unit of work goes whole to the next free worker, in collection order. A test file
# is one unit, so its module fixtures are built once. The files whose tests use the local SLURM cluster (directly
# or through the reference run it hosts) are one unit, so it starts once; that unit goes first: it is the longest
# (minutes), and started late it would leave the other worker idle at the end. The scheduler is ours because
# xdist 3.8's own grouping (`--dist loadgroup`) renames node ids through an attribute pytest 9.2 no longer reads,
# so it silently groups nothing.
SLURM_FIXTURE = "slurm_cluster"
CLUSTER_FILES = ("tests/launch/test_benchmark_slurm.py", "tests/launch/test_launch_slurm.py",
                 "tests/launch/test_image.py")


def _unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return SLURM_FIXTURE if path in CLUSTER_FILES else path


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, called in its controller
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FileUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return FileUnits(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    users = {i.nodeid.split("::", 1)[0] for i in items if SLURM_FIXTURE in getattr(i, "fixturenames", ())}
    strays = sorted(users - set(CLUSTER_FILES))
    if strays:  # in another unit, a second cluster would start beside the first
        raise pytest.UsageError(f"{', '.join(strays)} use(s) the SLURM cluster: add to CLUSTER_FILES in {__file__}")
    if hasattr(config, "workerinput"):  # an xdist worker; a plain run keeps pytest's order
        items.sort(key=lambda item: _unit(item.nodeid) != SLURM_FIXTURE)  # stable: the rest keep their order
