"""The OmegaConf loader: ``defaults`` merging, command-line precedence, override parsing kept compatible with
the overrides used in tests and README, interpolation, and NeMo's schedules as megatron-core schedulers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bio_megatron.config.finetune import FinetuneTrainerConfig
from bio_megatron.config.loader import load_document, parse_overrides
from bio_megatron.config.pretrain import OptimConfig, SchedConfig, load_pretrain_config
from bio_megatron.utils.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "nemo_configs" / "pretrain" / "tiny.yaml"


def test_recipe_overrides_keep_their_meaning():
    assert parse_overrides(["model.data.data_prefix=[1.0,/path]", "trainer.max_steps=20", "+x.y=true",
                            "model.optim.lr=1e-5", "a.b=null", "s=/a=b"]) == {
        "model": {"data": {"data_prefix": [1.0, "/path"]}, "optim": {"lr": 1e-5}}, "trainer": {"max_steps": 20},
        "x": {"y": True}, "a": {"b": None}, "s": "/a=b"}


def test_bad_and_conflicting_overrides_are_all_reported():
    with pytest.raises(ConfigError) as exc:
        parse_overrides(["noequals", "a.b=1", "a.b.c=2", "=3"])
    text = str(exc.value)
    assert "'noequals' is not of the form key=value" in text and "'=3' is not of the form" in text
    assert "conflicts with an earlier override of 'a.b'" in text


def test_precedence_defaults_then_file_then_command_line_in_order(tmp_path):
    (tmp_path / "_base.yaml").write_text("trainer: {max_steps: 10, seed: 1}\nmodel: {size: tiny}\n")
    (tmp_path / "r.yaml").write_text("defaults: [_base]\ntrainer: {max_steps: 20}\n"
                                     "exp_manager: {name: '${model.size}_run'}\n")
    doc = load_document(tmp_path / "r.yaml", ["trainer.seed=3", "trainer.seed=4", "model.size=345m"], "pretrain")
    assert doc["trainer"] == {"max_steps": 20, "seed": 4}
    assert doc["exp_manager"]["name"] == "345m_run"  # interpolation resolved after the command line


def test_delete_override_and_unknown_interpolation(tmp_path):
    (tmp_path / "r.yaml").write_text("trainer: {max_steps: 10, seed: 1}\nname: '${nowhere.x}'\n")
    with pytest.raises(ConfigError, match="name"):
        load_document(tmp_path / "r.yaml", [], "pretrain")
    doc = load_document(tmp_path / "r.yaml", ["~name"], "pretrain")
    assert "name" not in doc
    with pytest.raises(ConfigError, match="no such key to delete"):
        load_document(tmp_path / "r.yaml", ["~trainer.nope"], "pretrain")


def test_nemo_alias_and_our_key_disagreeing_is_an_error_unless_the_command_line_decides(tmp_path):
    (tmp_path / "r.yaml").write_text("trainer: {seed: 1}\nmodel: {seed: 2}\n")
    with pytest.raises(ConfigError, match=r"model.seed \(2\) and trainer.seed \(1\)|trainer.seed \(1\) and model.seed"):
        load_document(tmp_path / "r.yaml", [], "pretrain")
    assert load_document(tmp_path / "r.yaml", ["model.seed=9"], "pretrain")["trainer"]["seed"] == 9
    assert load_document(tmp_path / "r.yaml", ["trainer.seed=8"], "pretrain")["trainer"]["seed"] == 8


def test_own_recipes_are_unchanged_by_the_nemo_mapping():
    cfg = load_pretrain_config(TINY, ["trainer.max_steps=20", "model.data.data_prefix=[1.0,/p]"])
    assert cfg.trainer.max_steps == 20 and cfg.model.data.data_prefix == [1.0, "/p"]
    assert cfg.model.tokenizer.vocab_file == "bert_base_uncased" and cfg.model.tokenizer.do_lower_case is None


def test_val_check_interval_as_a_fraction_of_an_epoch():
    assert FinetuneTrainerConfig(val_check_interval=1.0).val_every(40) == 40
    assert FinetuneTrainerConfig(val_check_interval=0.25).val_every(40) == 10
    assert FinetuneTrainerConfig(val_check_interval=0).val_every(40) == 40
    assert FinetuneTrainerConfig(val_check_interval=7).val_every(40) == 7
    with pytest.raises(ConfigError, match=r"fraction of an epoch has no meaning"):
        load_pretrain_config(TINY, ["trainer.val_check_interval=0.5"])


def _lrs(sched: SchedConfig, max_steps: int, lr: float = 1.0) -> list[float]:
    from bio_megatron.training.optimizer import build_scheduler

    class _Opt:  # the scheduler only reads and writes param_groups
        param_groups = [{"lr": 0.0, "weight_decay": 0.0}]

    s = build_scheduler(_Opt(), OptimConfig(lr=lr, weight_decay=0.0, sched=sched), max_steps)
    out = []
    for _ in range(max_steps + 1):
        out.append(_Opt.param_groups[0]["lr"])
        s.step(1)
    return out


# megatron's scheduler is built here in the pytest process, outside any process group: its rank-0-only log then
# warns that it cannot tell the rank. That is this test's doing, not the library's.
@pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning")
def test_nemo_schedules_after_warmup():
    """NeMo's formulas (nemo/core/optim/lr_scheduler.py) after the warmup, as megatron-core schedulers."""
    sq = _lrs(SchedConfig(name="SquareRootAnnealing", warmup_steps=2, min_lr=0.1), 100)
    for step in (10, 50, 99):
        assert sq[step] == pytest.approx(max((1 - step / 100) ** 0.5, 0.1))
    wa = _lrs(SchedConfig(name="WarmupAnnealing", warmup_steps=10, min_lr=0.0), 100)
    for step in (10, 55, 100):  # min_lr + (1 - (s - w) / (T - w)) * (lr - min_lr)
        assert wa[step] == pytest.approx(1 - (step - 10) / 90)
    co = _lrs(SchedConfig(name="CosineAnnealing", warmup_steps=10, constant_steps=40, min_lr=0.1), 100)
    assert co[35] == pytest.approx(0.1 + 0.45 * (1 + torch.cos(torch.tensor(torch.pi * 25 / 50)).item()))
    assert co[60] == pytest.approx(0.1) and co[100] == pytest.approx(0.1)  # held at min_lr for constant_steps
