"""What a forked rank runs in the fine-tuning tests: the real CLI path minus argument parsing."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPES = {"ner": ROOT / "nemo_configs" / "ner" / "tiny_ner.yaml", "re": ROOT / "nemo_configs" / "re" / "tiny_re.yaml",
           "qa": ROOT / "nemo_configs" / "qa" / "tiny_qa.yaml"}


def finetune_rank(task: str, over: list[str]) -> dict:
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)  # recipes name their data relative to the checkout
    cfg = load_finetune_config(task, RECIPES[task], over, int(os.environ["WORLD_SIZE"]))
    result = run_finetuning(cfg)
    result["losses"] = [h["loss"] for h in result["history"] if "loss" in h]
    return result
