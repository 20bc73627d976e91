"""Commands the launch tests run, verbatim; docs/LAUNCH.md shows exactly these (a test checks it).

$DATA holds the tokenized tiny corpus (pubmed.bin/.idx), $RUNS the run directories.
"""

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The tiny TP2 x DP2 run every launcher must reproduce (20 steps so a preemption signal lands mid-run).
TINY_OVERRIDES = (
    "trainer.max_steps=20 model.tensor_model_parallel_size=2 \"model.data.data_prefix=[1.0,$DATA/pubmed]\" "
    "trainer.log_every_n_steps=1 trainer.val_check_interval=10 "
    "exp_manager.checkpoint_callback_params.every_n_train_steps=5"
)

# The tiny corpus: the bundled real PubMed sample, extracted and tokenized with the CLI.
DATA_COMMANDS = (
    "bio-megatron data pubmed --input bio_megatron/resources/corpus/pubmed --output $DATA/pubmed.jsonl",
    "bio-megatron data tokenize --input $DATA/pubmed.jsonl "
    "--vocab bio_megatron/resources/vocab/bert_base_uncased_vocab.txt --output-prefix $DATA/pubmed",
)

# Single-host reference: the same tiny run under torchrun --standalone on this host.
REFERENCE_COMMAND = (
    "torchrun --standalone --nproc-per-node=4 -m bio_megatron pretrain --config nemo_configs/pretrain/tiny.yaml "
    f"{TINY_OVERRIDES} exp_manager.exp_dir=$RUNS exp_manager.name=reference"
)


def read_metrics(run_dir: Path) -> dict[int, float]:
    """Training loss per step from metrics.jsonl (validation lines carry val_loss, not loss).

    The file may be read while a trainer appends to it: an incomplete last line is ignored."""
    out: dict[int, float] = {}
    lines = (run_dir / "metrics.jsonl").read_text().split("\n")
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line) if line.strip() else {}
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise
        if "loss" in rec and "step" in rec:
            out[int(rec["step"])] = float(rec["loss"])
    return out
