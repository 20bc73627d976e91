# BioMegatron training image: the same image serves `docker run` on a DGX (docker/run) and
# pyxis/enroot on SLURM (CONTAINER_IMAGE in slurm/*.sbatch).
#
#   docker build -t bio-megatron:latest .
#   docker run --rm bio-megatron:latest            # prints `bio-megatron --help`
#
# The NGC PyTorch image provides CUDA, PyTorch, NCCL and Transformer Engine, all built together;
# we add only megatron-core (pinned, as in pyproject.toml) and this project on top.
# Python >= 3.12 is required (pyproject.toml): NGC tags from 25.01 on ship Python 3.12.
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:25.04-py3
FROM ${BASE_IMAGE}

# Extra pip options for an air-gapped build, e.g. "--no-index --no-build-isolation" when the base
# already holds every dependency (the test build in tests/launch/test_image.py does this).
ARG PIP_EXTRA_ARGS=""

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    OMP_NUM_THREADS=1 \
    CUDA_DEVICE_MAX_CONNECTIONS=1 \
    TORCH_NCCL_AVOID_RECORD_STREAMS=1

WORKDIR /workspace/bio-megatron

# megatron-core first and on its own layer: it changes less often than our code. NGC images point
# PIP_CONSTRAINT at a file that pins their own builds; it is unset for this install only, and
# --no-deps keeps pip from replacing the image's torch (megatron-core's only heavy dependency).
# hadolint ignore=DL3013  # it is pinned; hadolint reads ${PIP_EXTRA_ARGS} as the package name
RUN PIP_CONSTRAINT='' python -m pip install --no-cache-dir --no-deps ${PIP_EXTRA_ARGS} "megatron-core==0.19.2"

COPY pyproject.toml README.md* ./
COPY bio_megatron ./bio_megatron
COPY nemo_configs ./nemo_configs
COPY slurm ./slurm

# The project with its dependencies, as pyproject.toml states them: torch and transformers are ranges, so the
# image's torch (and TE built on it) satisfies them and stays; the image's constraints (PIP_CONSTRAINT) are kept, so a
# base whose torch is outside the range fails here instead of being replaced. torch's files are checked unchanged.
# With the [hf] extra (transformers): the image is the whole user path, export hf and import --verify included.
# hadolint ignore=DL3013  # the project itself, not a package to pin
RUN torch_before=$(python -c "import torch; print(torch.__version__, torch.__file__)") \
    && python -m pip install --no-cache-dir ${PIP_EXTRA_ARGS} ".[hf]" \
    && test "$(python -c "import torch; print(torch.__version__, torch.__file__)")" = "$torch_before" \
    && bio-megatron --help > /dev/null

COPY docker/entrypoint.sh /usr/local/bin/bio-megatron-entrypoint

ENTRYPOINT ["/usr/local/bin/bio-megatron-entrypoint"]
CMD ["bio-megatron", "--help"]
