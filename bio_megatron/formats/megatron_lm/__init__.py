"""Megatron-LM checkpoints: legacy ``model_optim_rng.pt`` shards (``convert``: import and export; ``state``: the
legacy names, QKV layouts, TP/PP merging and the args check) and ``torch_dist`` (``dist``). docs/INTERCHANGE.md."""
