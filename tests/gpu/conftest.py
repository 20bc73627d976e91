"""tests/gpu: the checks that need a CUDA GPU (``pytest -m gpu``; ``benchmarks/gpu/check.sh`` runs them).

Every test module here sets ``pytestmark = pytest.mark.gpu``; every test skips without CUDA, so the default suite collects them on CPU (and
``check.sh --dry-run`` proves they import in a bare environment plus the pack) without running them.
"""

from __future__ import annotations

import os

import pytest

# NVML's device count, not the CUDA runtime's: the pytest process must not initialise CUDA, which would poison
# the children that tests and fixtures fork (tests/harness.py, the corpus pipeline).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")


def pytest_collection_modifyitems(config, items) -> None:
    import torch

    here = os.path.dirname(__file__)
    cuda = torch.cuda.is_available()
    for item in items:
        if str(item.fspath).startswith(here):
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (benchmarks/gpu/check.sh runs these)"))
