"""Checkpoint formats: our own checkpoints read in one place.

``saved.py`` is the one reader of our checkpoints' ``config.yaml``; ``ours.py`` the one loader of our own
pretraining checkpoints at TP1, which the Hugging Face, Megatron-LM and NeMo writers (``export/``,
``interchange/``) and every ``--verify`` share. docs/ARCHITECTURE.md, Formats.
"""
