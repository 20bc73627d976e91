"""Checkpoints of other programs in and out: Megatron-LM legacy (``megatron_lm``), read without unpickling
arbitrary objects (``safe_load``). See docs/INTERCHANGE.md."""
