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


# --- Units of work under pytest-xdist (tests/xdist_units.py) ---------------------------------------------------
from xdist_units import check_cluster_files, cluster_first, make_scheduler  # noqa: E402


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, called in its controller
def pytest_xdist_make_scheduler(config, log):
    return make_scheduler(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    check_cluster_files(items)
    if hasattr(config, "workerinput"):  # an xdist worker; a plain run keeps pytest's order
        cluster_first(items)
