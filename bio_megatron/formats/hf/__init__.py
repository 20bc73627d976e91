"""Hugging Face folders in and out: ``read.py`` reads a folder's heads and weights back (below ``loading/``, which
fills models from it). docs/ARCHITECTURE.md, Formats."""
