"""NeMo 2.4's own example configs run unmodified (issue 12, item 4): each passes ``--dry-run`` through the real
CLI with only what NeMo leaves to the command line, the resolved config shows NeMo's values under our names,
and the keys with no effect here are warned about once, each with its reason."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bio_megatron.cli import main
from reliability.cli_log import project_records

ROOT = Path(__file__).resolve().parents[2]
NEMO = ROOT / "tests" / "fixtures" / "nemo_configs"


def _run(argv: list[str], capsys) -> tuple[int, dict | None, list[logging.LogRecord]]:
    """The CLI in this process: exit code, the printed JSON (or None), every record the project logged. A dry run
    here checks how NeMo's keys are read, not the paths NeMo's examples name (``/path/to/data``): it skips the
    pre-flight of paths (tests/config/test_preflight.py tests that)."""
    if "--dry-run" in argv:
        argv = [*argv, "--skip-path-checks"]
    capsys.readouterr()
    with project_records() as records:
        rc = main(argv)
    out = capsys.readouterr().out
    return rc, (json.loads(out) if out.strip() else None), records


def _warnings(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno == logging.WARNING]


def test_megatron_bert_config_pretrain_dry_run(capsys):
    rc, out, records = _run(["pretrain", "--config", str(NEMO / "megatron_bert_config.yaml"), "--dry-run"], capsys)
    assert rc == 0, [r.getMessage() for r in records]
    cfg = out["config"]
    m = cfg["model"]
    assert (m["num_layers"], m["hidden_size"], m["num_attention_heads"], m["ffn_hidden_size"]) == (12, 768, 12, 3072)
    assert m["max_position_embeddings"] == 512  # ${.encoder_seq_length}, resolved
    assert m["layernorm_epsilon"] == 1e-5 and m["bert_binary_head"] is True
    assert cfg["trainer"]["seed"] == 1234  # model.seed
    assert m["tokenizer"] == {"vocab_file": "bert_base_uncased", "do_lower_case": True}  # BertWordPieceLowerCase
    assert m["optim"]["sched"] == {"name": "CosineAnnealing", "warmup_steps": 500, "warmup_ratio": None,
                                   "min_lr": 2e-5, "decay_steps": None, "constant_steps": 50000,
                                   "override_opt_param_scheduler": False}
    assert m["optim"]["betas"] == [0.9, 0.98] and m["data"]["data_prefix"] == [1.0, "/path/to/data"]
    assert out["vocab_size"] == 30522 and out["shape_status"] == "custom"
    warned = _warnings(records)
    assert len(warned) == 1  # once, all keys together
    for key, why in (("model.megatron_amp_O2", "O2-style"), ("trainer.max_epochs", "step-based"),
                     ("exp_manager.checkpoint_callback_params.model_parallel_size", "every_n_train_steps")):
        line = next(ln for ln in warned[0].splitlines() if key in ln)
        assert why in line, line
    # NeMo's W&B keys are read (training/trackers.py): off here, its kwargs unread, as in NeMo
    assert "wandb" not in warned[0] and cfg["exp_manager"]["create_wandb_logger"] is False
    assert cfg["exp_manager"]["wandb_logger_kwargs"] is None


@pytest.mark.parametrize("task, name, cli", [
    ("ner", "token_classification_config.yaml", ["model.dataset.data_dir=/data/ncbi"]),
    ("re", "text_classification_config.yaml", ["model.dataset.num_classes=6", "model.train_ds.file_path=/d/train.tsv",
                                               "model.validation_ds.file_path=/d/dev.tsv"]),
    ("qa", "qa_conf.yaml", ["model.train_ds.file=/d/train-v2.0.json", "model.validation_ds.file=/d/dev-v2.0.json"]),
])
def test_finetune_configs_dry_run(task, name, cli, capsys):
    rc, out, records = _run(["finetune", task, "--config", str(NEMO / name), "--dry-run", *cli], capsys)
    assert rc == 0, [r.getMessage() for r in records]
    m, t = out["config"]["model"], out["config"]["trainer"]
    assert len(_warnings(records)) == 1
    # bert-base-uncased: BERT-base shape, post-LN, the uncased WordPiece vocabulary
    assert (m["num_layers"], m["hidden_size"], m["transformer_block_type"]) == (12, 768, "post_ln")
    assert m["tokenizer"] == {"vocab_file": "bert_base_uncased", "do_lower_case": True}
    assert t["val_check_interval"] == 1.0 and t["max_steps"] == -1
    assert m["optim"]["sched"]["warmup_ratio"] == {"ner": 0.1, "re": 0.1, "qa": 0.0}[task]
    if task == "ner":
        d = m["dataset"]
        assert (d["data_dir"], d["format"], d["train_file"], d["dev_file"], d["test_file"]) == \
            ("/data/ncbi", "nemo", "text_train.txt", "text_dev.txt", "text_dev.txt")
        assert (d["max_seq_length"], d["ignore_start_end"], m["encoder_seq_length"]) == (128, False, 128)
        assert m["head"] == {"num_fc_layers": 2, "fc_dropout": 0.5, "activation": "relu", "use_transformer_init": True}
        assert (m["micro_batch_size"], m["global_batch_size"], t["max_epochs"]) == (64, 64, 5)
        assert m["optim"]["sched"]["name"] == "WarmupAnnealing"
    elif task == "re":
        d = m["dataset"]
        assert (d["format"], d["train_file"], d["dev_file"], d["test_file"], d["max_seq_length"]) == \
            ("nemo", "/d/train.tsv", "/d/dev.tsv", None, 256)
        assert m["classifier_head"]["num_output_layers"] == 2 and m["optim"]["lr"] == 2e-5
    else:
        d = m["dataset"]
        assert (d["train_file"], d["max_seq_length"], d["doc_stride"], d["version_2_with_negative"]) == \
            ("/d/train-v2.0.json", 512, 128, True)
        assert (m["head"]["num_fc_layers"], m["head"]["fc_dropout"]) == (1, 0.0)  # token_classifier.*
        assert m["optim"]["sched"]["name"] == "SquareRootAnnealing" and t["devices"] == 1  # devices: [0]


def test_mandatory_value_left_out_is_named(capsys):
    rc, out, records = _run(["finetune", "ner", "--config", str(NEMO / "token_classification_config.yaml"),
                             "--dry-run"], capsys)
    msg = "\n".join(r.getMessage() for r in records if r.levelno >= logging.ERROR)
    assert rc == 2 and out is None
    assert "model.dataset.data_dir is mandatory (??? in the config)" in msg and "model.dataset.data_dir=VALUE" in msg


def test_bad_nemo_values_list_the_allowed_ones(capsys):
    rc, _, records = _run(["pretrain", "--config", str(NEMO / "megatron_bert_config.yaml"), "--dry-run",
                           "model.position_embedding_type=rope", "model.tokenizer.type=GPT2BPETokenizer",
                           "model.optim.sched.name=NoamAnnealing"], capsys)
    msg = "\n".join(r.getMessage() for r in records if r.levelno >= logging.ERROR)
    assert rc == 2
    assert "model.position_embedding_type ('rope') must be 'learned_absolute'" in msg
    assert "model.tokenizer.type ('GPT2BPETokenizer') must be one of BertWordPieceLowerCase, BertWordPieceCase" in msg


def test_sched_name_error_lists_allowed(capsys):
    rc, _, records = _run(["pretrain", "--config", str(NEMO / "megatron_bert_config.yaml"), "--dry-run",
                           "model.optim.sched.name=NoamAnnealing"], capsys)
    msg = "\n".join(r.getMessage() for r in records if r.levelno >= logging.ERROR)
    assert rc == 2 and "'NoamAnnealing'" in msg and "SquareRootAnnealing" in msg and "WarmupAnnealing" in msg


def test_interpolation_sees_command_line_values(capsys):
    """``max_position_embeddings: ${.encoder_seq_length}`` follows an overridden encoder_seq_length."""
    rc, out, _ = _run(["pretrain", "--config", str(NEMO / "megatron_bert_config.yaml"), "--dry-run",
                       "model.encoder_seq_length=128", "model.seed=7"], capsys)
    assert rc == 0
    assert out["config"]["model"]["max_position_embeddings"] == 128 and out["config"]["trainer"]["seed"] == 7
