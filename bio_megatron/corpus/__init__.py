"""Corpus pipeline: NCBI downloads -> JSON-lines documents -> megatron-core indexed data (.bin/.idx)."""
