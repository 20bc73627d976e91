"""Checkpoint interchange with Hugging Face ``transformers`` (``MegatronBert*``)."""
