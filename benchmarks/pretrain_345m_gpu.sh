#!/usr/bin/env bash
# The GPU measurement docs/BENCHMARKS.md asks for: 345m, seq 512, bf16, one GPU, ours vs Hugging Face.
# Writes benchmarks/results/<date>-<host>-345m.json and prints the summary line; paste both into the doc.
set -euo pipefail

# --- configuration -----------------------------------------------------------------------------
SIZE="${SIZE:-345m}"
SEQ="${SEQ:-512}"
MICRO_BATCH="${MICRO_BATCH:-32}"   # at 8 a step waits on the host (docs/BENCHMARKS.md, 2026-11-27)
PRECISION="${PRECISION:-bf16}"
BIO_MEGATRON="${BIO_MEGATRON:-bio-megatron}"   # or: .venv/bin/bio-megatron
# -------------------------------------------------------------------------------------------------

: "${CUDA_VISIBLE_DEVICES:=0}"   # one GPU: the benchmark is single-process TP1
export CUDA_VISIBLE_DEVICES
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this script is for a GPU node" >&2; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv

out="$(dirname "$0")/results/$(date +%F)-$(hostname -s)-${SIZE}.json"
mkdir -p "$(dirname "$out")"
"$BIO_MEGATRON" bench pretrain --size "$SIZE" --seq "$SEQ" --precision "$PRECISION" \
    --micro-batch "$MICRO_BATCH" --json "$out"
echo "results: $out"
