"""``bio-megatron report RUN_DIR``: a run folder's curves as PNGs and one HTML page (docs/REPORTS.md)."""
