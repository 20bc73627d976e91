# Two commands on a fresh machine:  make demo   and   make test
# .venv gets the exact set CI tests (requirements/lock.txt, as constraints); pyproject.toml's ranges are for
# `pip install .` into an environment of one's own.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# pytest-xdist workers for `make test`: two, the cores CI has (in one process the suite keeps 2 cores 57 % busy:
# it waits on forked gloo worlds, subprocesses and the SLURM daemons); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

.PHONY: demo test test-extended venv clean-venv gpu-pack

# Find a Python >= 3.12 that actually runs: plain names first, then pyenv's installs (whose
# python3.12 shim refuses to run unless PYENV_VERSION names it).
define FIND_PY
for c in python3.13 python3.12 python3; do \
  if command -v $$c >/dev/null 2>&1 && $$c -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then command -v $$c; exit 0; fi; \
done; \
for c in $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[2-9]*/bin/python3 /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9]; do \
  if [ -x "$$c" ] && "$$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then echo "$$c"; exit 0; fi; \
done; exit 1
endef

LOCK  := requirements/lock.txt

$(STAMP): pyproject.toml $(LOCK)
	@set -e; \
	if [ ! -x $(PY) ] || ! $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then \
	  base=$$( $(FIND_PY) ) || { echo "error: no working Python >= 3.12 found (tried python3.13, python3.12, python3, pyenv versions). Install Python 3.12 (megatron-core needs it)." >&2; exit 1; }; \
	  echo "creating $(VENV) with $$base ($$($$base --version))"; \
	  rm -rf $(VENV); $$base -m venv $(VENV); \
	fi; \
	$(PY) -m pip install --quiet --upgrade pip; \
	$(PY) -m pip install --quiet -c $(LOCK) -e '.[dev]'; \
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/bio-megatron demo
	@echo "The bio-megatron command is in $(VENV)/bin: run 'source $(VENV)/bin/activate' to put it on your PATH."

test: $(STAMP)
	@if [ "$${CI:-}" = "true" ] && [ "$$(id -u)" = 0 ]; then bash tests/system_deps.sh; fi
	$(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "not extended" tests

# Real-data runs of minutes each (BLURB learning checks, every ../shared text through the fast tokenizer).
test-extended: $(STAMP)
	$(PY) -m pytest -q --durations=10 -m extended tests

# The wheels a bare GPU machine (PyTorch, transformers, tokenizers, safetensors; no network) lacks, for
# benchmarks/gpu/check.sh; under 64 MiB (docs/BENCHMARKS.md, "Running the GPU check").
gpu-pack: $(STAMP)
	$(PY) benchmarks/gpu/pack.py --out benchmarks/gpu/wheels

clean-venv:
	rm -rf $(VENV)
