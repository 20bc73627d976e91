"""Commands the launch tests run, verbatim; docs/LAUNCH.md shows exactly these (a test checks it).

$DATA holds the tokenized tiny corpus (pubmed.bin/.idx), $RUNS the run directories.
"""

import json
import subprocess
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


# The image for real, on a machine without nvcr.io: a local stand-in for the NGC base (Debian + this
# venv's Python 3.12, torch and megatron-core), then the real Dockerfile built without network, its
# default command (`bio-megatron --help`), and the tiny TP2 x DP2 run inside the container.
IMAGE_BASE = "localhost/bio-megatron-test-base:py3.12"
IMAGE = "localhost/bio-megatron:test"
IMAGE_BASE_COMMAND = f"bash tests/launch/container_base.sh .venv/bin/python {IMAGE_BASE}"
IMAGE_BUILD_COMMAND = (
    f"podman build --network=none --build-arg BASE_IMAGE={IMAGE_BASE} "
    f"--build-arg \"PIP_EXTRA_ARGS=--no-index --no-build-isolation\" -t {IMAGE} ."
)
IMAGE_HELP_COMMAND = f"podman run --rm --network=none {IMAGE}"
IMAGE_RUN_COMMAND = (
    f"podman run --rm --network=none -e OMP_NUM_THREADS=1 -v $DATA:$DATA:ro -v $RUNS:$RUNS {IMAGE} "
    "torchrun --standalone --nproc-per-node=4 -m bio_megatron pretrain --config nemo_configs/pretrain/tiny.yaml "
    f"{TINY_OVERRIDES} exp_manager.exp_dir=$RUNS exp_manager.name=container"
)


def run_command(command: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run one of the commands above as a user would (bash, repo root); fail with its output."""
    res = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, f"{command!r} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    return res
