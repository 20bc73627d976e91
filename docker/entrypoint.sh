#!/usr/bin/env bash
# docker/entrypoint.sh - entrypoint of the BioMegatron image.
#
#   docker run IMAGE                          -> bio-megatron --help   (the image's CMD)
#   docker run IMAGE pretrain --config ...    -> bio-megatron pretrain --config ...
#   docker run IMAGE torchrun ... / bash      -> run as given
#
# pyxis/enroot ignore the entrypoint by default, so nothing here may be required for training.
set -euo pipefail

# Sub-commands of the CLI, so `docker run IMAGE pretrain ...` does not need the program name.
case "${1:-}" in
  -*|pretrain|finetune|evaluate|predict|convert|data|vocab|analyse|bench|demo) set -- bio-megatron "$@" ;;
esac

# NGC's own entrypoint prints the container banner and warns about a missing driver or a too-small
# shared memory segment (the usual cause of DataLoader crashes without --ipc=host); keep it in
# the chain when the base image has it.
if [ -x /opt/nvidia/nvidia_entrypoint.sh ]; then
  exec /opt/nvidia/nvidia_entrypoint.sh "$@"
fi
exec "$@"
