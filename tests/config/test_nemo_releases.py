"""NeMo's example configs of every release run as they are (issue 27, item 1).

Every distinct version of NeMo's Megatron BERT, token classification, text classification and QA example configs
from release 1.0 to 2.4 (tests/fixtures/nemo_configs/v1/ and the 2.4 set above it) passes ``--dry-run`` through
the real CLI with only what a NeMo user gives on the command line, pointed at small real data files. The PyTorch
Lightning 1.x trainer keys of the 1.x files are mapped where they mean something here (``gpus`` -> devices,
``max_steps: null`` -> -1 with max_epochs, ``resume_from_checkpoint``) or reported once, with the reason, in the
one warning of keys without effect: never fatal."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness import cli_forked
from omegaconf import OmegaConf

from config.test_nemo_configs import _run  # the CLI in-process: exit code, printed JSON, project records

ROOT = Path(__file__).resolve().parents[2]
NEMO = ROOT / "tests" / "fixtures" / "nemo_configs"
FIX = ROOT / "tests" / "fixtures"
FILES = [p for p in sorted((NEMO / "v1").glob("*.yaml")) + sorted(NEMO.glob("*.yaml"))
         if not p.name.startswith("bert_pretraining_")]
# NeMo 1.x's Hugging Face-based BERTLMModel pretraining: another model and data format, refused in one line.
BERTLM = sorted((NEMO / "v1").glob("bert_pretraining_*.yaml"))
TASK = {"megatron_bert_config": "pretrain", "token_classification_config": "ner",
        "text_classification_config": "re", "qa_conf": "qa", "question_answering_squad_config": "qa"}

# Lightning 1.x / NeMo trainer keys found in these files that have no effect here -> a word of the reason.
NO_EFFECT_REASON = {
    "trainer.replace_sampler_ddp": "data-parallel sampling is megatron-core's",
    "trainer.checkpoint_callback": "exp_manager",
    "trainer.enable_checkpointing": "exp_manager",
    "trainer.amp_level": "trainer.precision",
    "trainer.resume_from_checkpoint": "nothing to resume",
    "trainer.logger": "exp_manager",
    "trainer.strategy": "megatron-core",
    "trainer.num_sanity_val_steps": "sanity",
    "trainer.use_distributed_sampler": "megatron-core",
    "trainer.benchmark": "convolutions",
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """NeMo-format fine-tuning files made from the bundled fixtures: NER text_/labels_ pairs, a text
    classification tsv, SQuAD JSON."""
    root = tmp_path_factory.mktemp("nemo_data")
    ner = root / "ner"
    ner.mkdir()
    sentences, words, tags = [], [], []
    for line in (FIX / "ner" / "bc5cdr_chem_devel_head.tsv").read_text().splitlines() + [""]:
        if line.strip():
            w, t = line.split("\t")
            words.append(w), tags.append(t)
        elif words:
            sentences.append((words, tags))
            words, tags = [], []
    for split in ("train", "dev"):
        (ner / f"text_{split}.txt").write_text("".join(" ".join(w) + "\n" for w, _ in sentences))
        (ner / f"labels_{split}.txt").write_text("".join(" ".join(t) + "\n" for _, t in sentences))
    tsv = root / "text.tsv"
    tsv.write_text("sentence\tlabel\n" + "".join(f"{' '.join(w)}\t{i % 2}\n" for i, (w, _) in enumerate(sentences)))
    squad = root / "squad.json"
    shutil.copy(FIX / "qa" / "squad_v2_dev_slice.json", squad)
    return {"ner": ner, "re": tsv, "qa": squad}


def _user_overrides(task: str, flat: dict, data: dict[str, Path], prefix: Path) -> list[str]:
    """What a NeMo user gives: the data paths its config leaves open, one GPU in that release's key."""
    out = ["trainer.gpus=1" if "trainer.gpus" in flat else "trainer.devices=1"]
    if task == "pretrain":
        return out + [f"model.data.data_prefix=[1.0,{prefix}]"]
    if task == "ner":
        return out + [f"model.dataset.data_dir={data['ner']}"]
    if task == "re":
        return out + ["model.dataset.num_classes=2", f"model.train_ds.file_path={data['re']}",
                      f"model.validation_ds.file_path={data['re']}"]
    return out + [f"model.train_ds.file={data['qa']}", f"model.validation_ds.file={data['qa']}"]


def _no_effect(records: list[logging.LogRecord]) -> dict[str, str]:
    """The one no-effect warning as {key: reason}; a key listed twice fails here."""
    warned = [m for r in records if r.levelno == logging.WARNING and "have no effect here" in (m := r.getMessage())]
    assert len(warned) == 1, warned
    keys: dict[str, str] = {}
    for line in warned[0].splitlines()[1:]:
        names, _, reason = line.strip().removeprefix("- ").partition(": ")
        for key in names.split(", "):
            assert key not in keys, f"{key} reported twice"
            keys[key] = reason
    return keys


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name if p.parent.name == "v1" else f"2.4/{p.name}")
def test_every_release_config_dry_runs_as_it_is(path, data, pubmed_prefix, capsys):
    task = TASK[path.name.split(".")[0]]
    flat = _flat(path)
    cli = _user_overrides(task, flat, data, pubmed_prefix)
    argv = ["pretrain"] if task == "pretrain" else ["finetune", task]
    rc, out, records = _run([*argv, "--config", str(path), "--dry-run", *cli], capsys)
    assert rc == 0, [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    ignored = _no_effect(records)
    for key, why in NO_EFFECT_REASON.items():
        if key in flat:
            assert why in ignored.get(key, ""), (key, ignored.get(key))
    if flat.get("trainer.accelerator") == "ddp":  # Lightning 1.x put the strategy there
        assert "strategy" in ignored["trainer.accelerator"]
    cfg = out["config"]
    t = cfg["trainer"]
    assert t["devices"] == 1  # trainer.gpus=1 or trainer.devices=1
    assert t["accelerator"] == (flat["trainer.accelerator"] if flat.get("trainer.accelerator") != "ddp" else "auto")
    if task == "pretrain":
        assert t["max_steps"] == flat["trainer.max_steps"] == 100000
        assert "step-based" in ignored["trainer.max_epochs"]
        assert cfg["model"]["data"]["data_prefix"] == [1.0, str(pubmed_prefix)]
    else:
        # Lightning 1.x: max_steps null = no step limit, the run ends after max_epochs
        assert t["max_steps"] == (-1 if flat["trainer.max_steps"] is None else flat["trainer.max_steps"])
        assert t["max_epochs"] == flat["trainer.max_epochs"]
        d = cfg["model"]["dataset"]
        if task == "ner":
            assert (d["data_dir"], d["format"]) == (str(data["ner"]), "nemo")
        else:
            assert d["train_file"] == str(data[task])


def _flat(path: Path) -> dict:
    from bio_megatron.config.nemo_compat import flatten

    return flatten(OmegaConf.to_container(OmegaConf.load(path), resolve=False))


def test_every_release_is_covered():
    """At least one file per era in which each config changed, for 1.x and 2.x (SOURCES.md lists them)."""
    names = {p.name for p in FILES}
    assert len(names) >= 30
    for era in ("v1.0.0", "v1.5.0", "v1.6.0", "v1.8.0", "v1.12.0"):
        assert f"token_classification_config.{era}.yaml" in names and f"text_classification_config.{era}.yaml" in names
    sources = (NEMO / "v1" / "SOURCES.md").read_text()
    assert all(p.name in sources for p in (NEMO / "v1").glob("*.yaml"))


def test_lightning1_keys_mapped_or_listed_never_fatal(data, capsys):
    """The Lightning 1.x keys of the issue, given on the command line of a 1.x config: each is mapped or listed
    once with its reason; the run is not refused."""
    path = NEMO / "v1" / "token_classification_config.v1.5.0.yaml"
    extra = ["trainer.gpus=[0,1]", "trainer.max_steps=null", "+trainer.progress_bar_refresh_rate=1",
             "+trainer.weights_summary=top", "+trainer.flush_logs_every_n_steps=100", "+trainer.terminate_on_nan=true",
             "+trainer.amp_backend=native", "trainer.amp_level=O1", "trainer.accelerator=ddp",
             "+trainer.distributed_backend=ddp", "+trainer.sync_batchnorm=false"]
    rc, out, records = _run(["finetune", "ner", "--config", str(path), "--dry-run",
                             f"model.dataset.data_dir={data['ner']}", *extra], capsys)
    assert rc == 0, [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    t = out["config"]["trainer"]
    assert (t["devices"], t["max_steps"], t["max_epochs"], t["accelerator"]) == (2, -1, 5, "auto")
    ignored = _no_effect(records)
    for key, why in (("trainer.progress_bar_refresh_rate", "progress bar"), ("trainer.weights_summary", "parameter"),
                     ("trainer.flush_logs_every_n_steps", "as they come"),
                     ("trainer.terminate_on_nan", "max_nonfinite_steps"), ("trainer.amp_backend", "precision"),
                     ("trainer.amp_level", "precision"), ("trainer.accelerator", "strategy"),
                     ("trainer.distributed_backend", "megatron-core"), ("trainer.sync_batchnorm", "batch norm")):
        assert why in ignored.get(key, ""), (key, ignored.get(key))
    assert "trainer.gpus" not in ignored and "trainer.max_steps" not in ignored


def test_gpus_zero_means_the_cpu(data, capsys):
    path = NEMO / "v1" / "token_classification_config.v1.0.0.yaml"
    rc, out, _ = _run(["finetune", "ner", "--config", str(path), "--dry-run", f"model.dataset.data_dir={data['ner']}",
                       "trainer.gpus=0"], capsys)
    assert rc == 0 and out["config"]["trainer"]["accelerator"] == "cpu"


def test_resume_from_checkpoint_maps_or_refuses_with_the_reason(tmp_path, data, pubmed_prefix, capsys):
    bert = NEMO / "v1" / "megatron_bert_config.v1.6.0.yaml"
    base = ["pretrain", "--config", str(bert), "--dry-run", f"model.data.data_prefix=[1.0,{pubmed_prefix}]"]
    rc, out, _ = _run([*base, f"+trainer.resume_from_checkpoint={tmp_path}/ckpt/iter_0000100"], capsys)
    assert rc == 0 and out["config"]["exp_manager"]["resume_from_checkpoint"] == f"{tmp_path}/ckpt/iter_0000100"
    rc, out, records = _run([*base, "+trainer.resume_from_checkpoint=/r/megatron_bert--step=100.ckpt"], capsys)
    msg = " ".join(r.getMessage() for r in records if r.levelno >= logging.ERROR)
    assert rc == 2 and out is None and "trainer.resume_from_checkpoint (/r/megatron_bert--step=100.ckpt)" in msg
    assert "bio-megatron import nemo" in msg
    ner = NEMO / "v1" / "token_classification_config.v1.8.0.yaml"
    cli = [f"model.dataset.data_dir={data['ner']}", f"trainer.resume_from_checkpoint={tmp_path}"]
    rc, _, records = _run(["finetune", "ner", "--config", str(ner), "--dry-run", *cli], capsys)
    msg = " ".join(r.getMessage() for r in records if r.levelno >= logging.ERROR)
    assert rc == 2 and "not supported for fine-tuning" in msg and "model.restore_from_path" in msg


def test_pretraining_max_steps_null_is_one_line(pubmed_prefix, capsys):
    rc, _, records = _run(["pretrain", "--config", str(NEMO / "v1" / "megatron_bert_config.v1.9.0.yaml"), "--dry-run",
                           f"model.data.data_prefix=[1.0,{pubmed_prefix}]", "trainer.max_steps=null"], capsys)
    msg = " ".join(r.getMessage() for r in records if r.levelno >= logging.ERROR)
    assert rc == 2 and "trainer.max_steps is null" in msg and "trainer.max_steps=N" in msg


def test_unused_recompute_layer_count_of_nemo_1x(pubmed_prefix, capsys):
    """NeMo 1.6-1.13 wrote activations_checkpoint_num_layers: 1 beside method null (no recompute): listed as no
    effect; the same count given on the command line without a method is still the error it is."""
    bert = NEMO / "v1" / "megatron_bert_config.v1.12.0.yaml"
    base = ["pretrain", "--config", str(bert), "--dry-run", f"model.data.data_prefix=[1.0,{pubmed_prefix}]"]
    rc, out, records = _run(base, capsys)
    assert rc == 0 and out["config"]["model"]["activations_checkpoint_num_layers"] is None
    assert "recompute is off" in _no_effect(records)["model.activations_checkpoint_num_layers"]
    rc, _, records = _run([*base, "model.activations_checkpoint_num_layers=2"], capsys)
    msg = " ".join(r.getMessage() for r in records if r.levelno >= logging.ERROR)
    assert rc == 2 and "activations_checkpoint_num_layers (2)" in msg


@pytest.mark.parametrize("path", [p for p in FILES if p.name.startswith("text_classification_config")],
                         ids=lambda p: p.name)
def test_classify_reads_text_classification_config(path, capsys):
    """``finetune classify`` with NeMo's text_classification_config.yaml: no key the user never wrote
    (``model.dataset.format``) is added and then refused."""
    gad = FIX / "blurb" / "GAD" / "test.tsv"
    rc, out, records = _run(["finetune", "classify", "--config", str(path), "--dry-run", "model.dataset.task_name=gad",
                             "model.dataset.num_classes=2", f"model.train_ds.file_path={gad}",
                             f"model.validation_ds.file_path={gad}"], capsys)
    assert rc == 0, [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    d = out["config"]["model"]["dataset"]
    assert "format" not in d and (d["task_name"], d["train_file"], d["dev_file"]) == ("gad", str(gad), str(gad))
    assert "task_name's label set" in _no_effect(records)["model.dataset.num_classes"]


def test_gpus_of_the_file_and_devices_of_the_command_line(pubmed_prefix, capsys):
    """megatron_bert_config v1.6.0 says ``gpus: 2``: that is trainer.devices 2, and a user's trainer.devices=1
    (today's key) wins over the file's older one."""
    base = ["pretrain", "--config", str(NEMO / "v1" / "megatron_bert_config.v1.6.0.yaml"), "--dry-run",
            f"model.data.data_prefix=[1.0,{pubmed_prefix}]"]
    rc, out, _ = _run(base, capsys)
    assert rc == 0 and out["config"]["trainer"]["devices"] == 2
    rc, out, _ = _run([*base, "trainer.devices=1"], capsys)
    assert rc == 0 and out["config"]["trainer"]["devices"] == 1


def test_cli_process_warns_once_per_key(data):
    """The CLI as a process of its own (its own stdout and stderr) on a NeMo 1.0 config: exit 0, each Lightning 1.x
    key named once on stderr."""
    path = NEMO / "v1" / "text_classification_config.v1.0.0.yaml"
    with contextlib.chdir(ROOT):  # where the subprocess ran
        proc = cli_forked(["finetune", "re", "--config", str(path), "--dry-run", "trainer.gpus=1",
                           "model.dataset.num_classes=2", f"model.train_ds.file_path={data['re']}",
                           f"model.validation_ds.file_path={data['re']}", "--skip-path-checks"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["config"]["trainer"]["max_steps"] == -1
    for key in ("trainer.amp_level", "trainer.checkpoint_callback", "trainer.resume_from_checkpoint",
                "trainer.accelerator"):
        assert proc.stderr.count(key) == 1, (key, proc.stderr)


@pytest.mark.parametrize("path", BERTLM, ids=lambda p: p.name)
def test_bertlm_pretraining_config_is_refused_in_one_line(path, capsys):
    """NeMo 1.x's bert_pretraining_from_text/_preprocessed configs: one line that says what they are and where to
    start instead (not a dozen unknown keys, not a traceback from their ``tokenizer: null``)."""
    rc, out, records = _run(["pretrain", "--config", str(path), "--dry-run", "model.train_ds.data_file=/d/train.txt",
                             "trainer.max_steps=10"], capsys)
    errors = [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    assert rc == 2 and out is None and len(errors) == 1
    problems = errors[0].splitlines()[1:]
    assert len(problems) == 1 and "BERTLMModel" in problems[0] and "megatron_bert_config.yaml" in problems[0]
    assert "bio-megatron data tokenize" in problems[0]


@pytest.fixture(scope="module")
def restore(pubmed_prefix, tmp_path_factory) -> Path:
    """A NeMo user's own pretraining run to fine-tune from: the tiny shape with 512 positions (NeMo's fine-tuning
    configs use 128-384), recording only ``size: tiny`` as our recipes' runs do."""
    from harness import run_world

    from engine.pretrain_runs import overrides, pretrain_rank

    root = tmp_path_factory.mktemp("nemo_restore")
    run_world(1, pretrain_rank, overrides(pubmed_prefix, root, "own", steps=1, save_last=True,
                                          extra=("model.max_position_embeddings=512",)))
    return root / "own" / "checkpoints"


@pytest.mark.extended  # ~5 s per file, 24 files: the dry runs above are the default suite's check of every file
@pytest.mark.parametrize("path", [p for p in FILES if TASK[p.name.split(".")[0]] != "pretrain"],
                         ids=lambda p: p.name if p.parent.name == "v1" else f"2.4/{p.name}")
def test_every_release_finetuning_config_trains_as_it_is(path, data, restore, tmp_path):
    """Each fine-tuning config of every release trains, not only dry-runs: the overrides a NeMo user gives (data,
    one device), their own pretrained checkpoint (``model.restore_from_path``) and a 2-step length. With
    ``pretrained_model_name: bert-base-uncased`` the run built 12 x 768 over the tiny checkpoint and died loading it."""
    task = TASK[path.name.split(".")[0]]
    cli = _user_overrides(task, _flat(path), data, Path("/unused"))
    ran = cli_forked(["finetune", task, "--config", str(path), *cli, f"model.restore_from_path={restore}",
                      "trainer.max_steps=2", f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=run"], timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "Traceback" not in ran.stderr
    results = list(tmp_path.glob("run/**/results.json"))
    assert results, sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))[:40]


@pytest.mark.extended  # ~28 s per file, 12 files: the dry runs above are the default suite's check of every file
@pytest.mark.parametrize("path", [p for p in FILES if TASK[p.name.split(".")[0]] == "pretrain"],
                         ids=lambda p: p.name if p.parent.name == "v1" else f"2.4/{p.name}")
def test_every_release_pretraining_config_trains_as_it_is(path, pubmed_prefix, tmp_path):
    """Each pretraining config of every release trains, launched as the file asks (torchrun, one process per device
    of its ``trainer.gpus``/``devices``, its own TP) with what a NeMo user gives to try it on a CPU: the data, the
    accelerator, precision 32 (its fp16 ran at 1.6 GFLOP/s here), micro-batch 1, two steps, one validation batch.
    The file's 12 x 768 shape under its default ``model.size`` is named ``base``, not 345m."""
    flat = _flat(path)
    devices = flat.get("trainer.gpus", flat.get("trainer.devices"))
    tp, pp = flat["model.tensor_model_parallel_size"], flat.get("model.pipeline_model_parallel_size", 1)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={devices}",
            "-m", "bio_megatron", "pretrain", "--config", str(path), f"model.data.data_prefix=[1.0,{pubmed_prefix}]",
            "trainer.accelerator=cpu", "trainer.precision=32", "model.micro_batch_size=1",
            f"model.global_batch_size={devices // (tp * pp)}", "trainer.max_steps=2", "trainer.val_check_interval=2",
            "trainer.limit_val_batches=1", f"exp_manager.exp_dir={tmp_path}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    try:
        ran = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert "Traceback" not in ran.stderr
        (run,) = [p.parent for p in tmp_path.glob("*/metrics.jsonl")]
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if "loss" in r] == [1, 2]
        assert all(math.isfinite(r["loss"]) for r in records if "loss" in r)
        assert [r for r in records if "val_loss" in r and math.isfinite(r["val_loss"])]
        meta = json.loads((run / "checkpoints" / "iter_0000002" / "bio_megatron.json").read_text())
        assert (meta["layout"]["tp"], meta["layout"]["pp"], meta["model_size"]) == (tp, pp, "base")
        assert "pretraining base shape (model.size 345m with overrides): 12 layers, hidden 768" in ran.stderr
    finally:  # each checkpoint is 1.3 GB (weights and Adam moments at 12 x 768): 12 of them filled this disk
        for ckpt in tmp_path.glob("*/checkpoints"):
            shutil.rmtree(ckpt)
