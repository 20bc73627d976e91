"""``--dry-run`` is a real pre-flight (issue 27, item 2): every path the run will read is checked for existence and
kind, all problems reported in one message (one line each: the key, the path, what was expected; exit 2; nothing
printed or written), and a clean dry run shows the effective shape of a restored model (not the recipe's
``size``), the data it reads, the parameter count, the memory per rank and the steps/epochs of the run.

Through the real CLI in this process (a dry run joins no process group), on the real demo corpus and the real
BC5CDR fixture files."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from bio_megatron.cli import main
from reliability.cli_log import project_records

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "nemo_configs" / "pretrain" / "tiny.yaml"
NER_DATA = ROOT / "tests" / "fixtures" / "finetune"
VOCAB = ROOT / "bio_megatron" / "resources" / "vocab" / "bert_base_cased_vocab.txt"


def _dry(argv: list[str], capsys) -> tuple[int, dict | None, list[str]]:
    """Exit code, the printed JSON (None when nothing was printed), the error lines of the one message."""
    capsys.readouterr()
    with project_records(logging.ERROR) as records:
        rc = main([*argv, "--dry-run"])
    out = capsys.readouterr().out
    errors = [r.getMessage() for r in records]
    assert len(errors) <= 1, errors  # every problem in one message
    return rc, (json.loads(out) if out.strip() else None), errors[0].splitlines()[1:] if errors else []


def _line(lines: list[str], key: str, path: object) -> str:
    found = [ln for ln in lines if f"- {key}: {path}:" in ln]
    assert len(found) == 1, (key, path, lines)
    return found[0]


def test_pretrain_dry_run_reports_every_bad_path_at_once(tmp_path, capsys):
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "half.bin").write_bytes(b"\0" * 16)  # .idx missing
    (tmp_path / "ckpt.pt").write_bytes(b"x")
    runs = tmp_path / "runs"
    rc, out, lines = _dry(["pretrain", "--config", str(TINY), f"exp_manager.exp_dir={runs}",
                           f"model.data.data_prefix=[0.5,{tmp_path}/missing,0.3,{tmp_path}/a_folder,0.2,{tmp_path}/half]",
                           f"model.tokenizer.vocab_file={tmp_path}/vocab.txt",
                           f"model.restore_from_path={tmp_path}/ckpt.pt",
                           f"exp_manager.resume_from_checkpoint={tmp_path}/gone"], capsys)
    assert rc == 2 and out is None and len(lines) == 6, lines
    assert "no " in _line(lines, "model.data.data_prefix[1]", f"{tmp_path}/missing")
    assert "is a folder" in _line(lines, "model.data.data_prefix[3]", f"{tmp_path}/a_folder")
    assert "not found" in _line(lines, "model.data.data_prefix[5]", f"{tmp_path}/half.idx")
    assert "expected a WordPiece vocab.txt" in _line(lines, "model.tokenizer.vocab_file", f"{tmp_path}/vocab.txt")
    assert "a file (.pt); expected a BioMegatron checkpoint folder" in \
        _line(lines, "model.restore_from_path", f"{tmp_path}/ckpt.pt")
    assert "not found" in _line(lines, "exp_manager.resume_from_checkpoint", f"{tmp_path}/gone")
    assert not runs.exists()  # a dry run writes nothing


def test_pretrain_dry_run_shows_data_shape_memory_and_length(pubmed_prefix, tmp_path, capsys):
    rc, out, lines = _dry(["pretrain", "--config", str(TINY), f"model.data.data_prefix=[1.0,{pubmed_prefix}]",
                           "trainer.max_steps=50", "trainer.devices=4", "model.tensor_model_parallel_size=2",
                           "model.use_distributed_optimizer=true", f"exp_manager.exp_dir={tmp_path}"], capsys)
    assert rc == 0, lines
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(pubmed_prefix))
    (prefix,) = out["data"]["prefixes"]
    assert prefix == {"prefix": str(pubmed_prefix), "weight": 1.0, "documents": len(ds.document_indices) - 1,
                      "tokens": int(ds.sequence_lengths.sum())}
    m = out["config"]["model"]
    assert out["model_shape"]["size"] == "tiny" and out["model_shape"]["num_layers"] == 4
    sched = out["schedule"]
    assert sched["max_steps"] == 50 and sched["tokens"] == 50 * m["global_batch_size"] * m["encoder_seq_length"]
    split = [float(x) for x in m["data"]["splits_string"].split(",")]
    train_share = split[0] / sum(split)  # samples are packed to the sequence length: tokens / training tokens
    assert sched["epochs_approx"] == pytest.approx(sched["tokens"] / (prefix["tokens"] * train_share), abs=1e-3)
    mem = out["memory"]  # the planned world (trainer.devices 4 at TP2: DP 2), not the one dry-run process
    assert mem["data_parallel_size"] == 2 and 0 < mem["parameters_per_rank"] < out["parameters"]


def test_pretrain_dry_run_refuses_data_of_another_vocabulary(pubmed_prefix, tmp_path, capsys):
    """The corpus's record names the vocabulary it was tokenized with: a dry run with another one finds it."""
    rc, out, lines = _dry(["pretrain", "--config", str(TINY), f"model.data.data_prefix=[1.0,{pubmed_prefix}]",
                           f"model.tokenizer.vocab_file={VOCAB}", f"exp_manager.exp_dir={tmp_path}"], capsys)
    assert rc == 2 and out is None and len(lines) == 1 and lines[0].startswith("  - model.data.data_prefix: ")


def _hf_folder(path: Path, layers: int = 2, hidden: int = 32) -> Path:
    """A Hugging Face MegatronBert folder as far as a dry run reads one: config.json and vocab.txt."""
    path.mkdir()
    shutil.copy(VOCAB, path / "vocab.txt")
    (path / "config.json").write_text(json.dumps({
        "model_type": "megatron-bert", "architectures": ["MegatronBertForMaskedLM"], "num_hidden_layers": layers,
        "hidden_size": hidden, "num_attention_heads": 2, "intermediate_size": 4 * hidden,
        "max_position_embeddings": 128, "type_vocab_size": 2, "vocab_size": 28996, "layer_norm_eps": 1e-12}))
    return path


def test_finetune_dry_run_shows_the_restored_shape_and_the_length_of_the_run(tmp_path, capsys, monkeypatch):
    """bc5cdr_chem says size 345m; restoring a 2-layer, 32-wide model, the dry run shows that shape, its
    parameters and memory, and the steps: 600 training sentences / batch 16 = 37 steps per epoch."""
    monkeypatch.chdir(ROOT)
    hf = _hf_folder(tmp_path / "hf")
    rc, out, lines = _dry(["finetune", "ner", "--config", "bc5cdr_chem", f"model.restore_from_path={hf}",
                           f"model.dataset.data_dir={NER_DATA}", "model.dataset.train_file=bc5cdr_chem_train_head.tsv",
                           "model.dataset.dev_file=bc5cdr_chem_devel_head.tsv", "model.dataset.test_file=null",
                           "model.global_batch_size=16", "model.micro_batch_size=8", "trainer.max_epochs=3",
                           "trainer.precision=32", f"exp_manager.exp_dir={tmp_path / 'runs'}"], capsys)
    assert rc == 0, lines
    shape = out["model_shape"]
    assert (shape["size"], shape["num_layers"], shape["hidden_size"]) == ("custom", 2, 32)
    assert str(hf) in shape["from"] and out["restored"]["kind"] == "hf"
    assert (out["config"]["model"]["num_layers"], out["config"]["model"]["hidden_size"]) == (2, 32)
    assert out["data"]["train_examples"] == 600 and out["labels"] == ["O", "B-Chemical", "I-Chemical"]
    assert out["schedule"] == {"max_steps": 3 * 37, "steps_per_epoch": 37, "epochs": 3.0, "global_batch_size": 16,
                               "val_every_steps": 37}
    h, vocab = 32, out["padded_vocab_size"]
    embeddings = (vocab + 128 + 2) * h
    layer = 2 * h + 3 * h * h + 3 * h + h * h + h + 2 * h + h * 4 * h + 4 * h + 4 * h * h + h
    assert out["parameters_encoder"] == embeddings + 2 * layer + 2 * h  # + the final LayerNorm
    assert out["parameters"] == out["parameters_encoder"] + out["parameters_head"] > out["parameters_encoder"]
    assert out["memory"]["static_state_gib_per_rank"] > 0
    assert not (tmp_path / "runs").exists()


def test_finetune_dry_run_reports_every_bad_path_at_once(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").mkdir()  # a folder where the split's file should be
    (data / "devel.tsv").write_text("Aspirin\tB-Chemical\n")
    rc, out, lines = _dry(["finetune", "ner", "--config", "tiny_ner", f"model.dataset.data_dir={data}",
                           "model.dataset.train_file=train.tsv", "model.dataset.dev_file=devel.tsv",
                           "model.dataset.test_file=test.tsv", f"model.restore_from_path={tmp_path}/nothing",
                           f"exp_manager.exp_dir={tmp_path / 'runs'}"], capsys)
    assert rc == 2 and out is None and len(lines) == 3, lines
    assert "a file is expected" in _line(lines, "model.dataset.train_file", data / "train.tsv")
    assert "not found" in _line(lines, "model.dataset.test_file", data / "test.tsv")
    assert "not found; expected a BioMegatron checkpoint folder" in \
        _line(lines, "model.restore_from_path", f"{tmp_path}/nothing")


def test_finetune_dry_run_names_a_missing_data_folder_and_vocabulary(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc, out, lines = _dry(["finetune", "re", "--config", "tiny_re", f"model.dataset.data_dir={tmp_path}/re",
                           f"model.tokenizer.vocab_file={tmp_path}/v.txt"], capsys)
    assert rc == 2 and len(lines) == 2, lines
    assert "not found; expected the folder of the task's data files" in \
        _line(lines, "model.dataset.data_dir", f"{tmp_path}/re")
    assert "not found" in _line(lines, "model.tokenizer.vocab_file", f"{tmp_path}/v.txt")


def test_skip_path_checks_validates_the_config_only(tmp_path, capsys):
    """For a login node without the data mounted: the config is still validated, the paths are not looked at."""
    argv = ["pretrain", "--config", str(TINY), f"model.data.data_prefix=[1.0,{tmp_path}/elsewhere]"]
    rc, out, lines = _dry([*argv, "--skip-path-checks"], capsys)
    assert rc == 0 and out["parameters"] > 0 and "data" not in out, lines
    rc, _, lines = _dry([*argv, "model.optim.lr=-1", "--skip-path-checks"], capsys)
    assert rc == 2 and any("model.optim.lr" in ln for ln in lines)
