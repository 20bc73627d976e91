"""transformers is the ``[hf]`` extra: the core path runs without it, and the commands that need it say so in one line.

A child forked from the test process is made into one that never had transformers (tests/without_hf.py: this
venv's site-packages without transformers' files; every loaded module that is or holds transformers forgotten, and
our own package with them, imported afresh); every command is the real CLI forked from that child, as
harness.cli_forked runs it. The core commands (pretrain's pre-flight, a 2-step pretraining run, fine-tuning from
that run, predict ner) must work; ``export hf``, ``import ... --verify`` and the ``bench`` comparisons must stop
with exit 2 and one line naming the command and ``pip install 'bio-megatron[hf]'``, having written nothing.
pyproject.toml's [hf] extra states the range utils/extras.py checks. tests/test_install.py installs the project
into a virtualenv that lacks transformers for real."""

from __future__ import annotations

import importlib
import importlib.util
import json
import multiprocessing
import os
import sys
import tomllib
import traceback
from pathlib import Path
from types import ModuleType

import pytest
from engine.pretrain_runs import TINY, overrides
from without_hf import SITE, site_without_transformers

from bio_megatron.utils.extras import (HF_INSTALL, TRANSFORMERS_SPEC, MissingExtraError, in_spec,
                                       require_transformers)

ROOT = Path(__file__).resolve().parents[1]
TINY_NER = ROOT / "nemo_configs" / "ner" / "tiny_ner.yaml"

_FORK = multiprocessing.get_context("fork")


def _is_hf(name: object) -> bool:
    return isinstance(name, str) and (name == "transformers" or name.startswith("transformers."))


def _holds_hf(module: object) -> bool:
    """Whether a loaded module holds transformers' modules or objects at its top level."""
    try:
        values = list(vars(module).values())
    except TypeError:
        return False
    return any(_is_hf(v.__name__ if isinstance(v, ModuleType) else getattr(v, "__module__", None)) for v in values)


def _without_transformers(site: str, without: str, commands: list[list[str]], out: str) -> None:
    """A forked child of the test process turned into one that never had transformers: site-packages swapped for
    the folder without it, and every loaded module that is or holds transformers (and all of ours, so that they
    are imported afresh) forgotten; then each command forked from it as harness.cli_forked does in the suite."""
    code = 1
    try:
        os.chdir(ROOT)  # the tiny recipes name their data relative to the checkout
        sys.path[:] = [without if p == site else p for p in sys.path]
        sys.path_importer_cache.clear()
        importlib.invalidate_caches()
        for name, module in list(sys.modules.items()):
            if name in ("__main__", "__mp_main__"):
                continue
            if _is_hf(name) or name == "bio_megatron" or name.startswith("bio_megatron.") or _holds_hf(module):
                del sys.modules[name]
        assert importlib.util.find_spec("transformers") is None, "transformers is still importable"
        # imported afresh here, once, without transformers (the forks share them, as the suite's share its imports)
        for name in ("bio_megatron.cli", "bio_megatron.training.pretrain", "bio_megatron.tasks.finetune",
                     "bio_megatron.predict.ner"):
            importlib.import_module(name)
        from harness import cli_forked

        Path(out).write_text(json.dumps([vars(cli_forked(argv, timeout=240)) for argv in commands]))
        code = 0
    except BaseException:
        traceback.print_exc()  # the parent shows it: os._exit would drop it
    finally:
        sys.stderr.flush()
        os._exit(code)


@pytest.fixture(scope="module")
def without_hf(pubmed_prefix, tmp_path_factory) -> dict:
    """Every command's outcome in the environment without transformers, by name, and the paths they used."""
    tmp = tmp_path_factory.mktemp("without_hf")
    run_root, text = tmp / "runs", tmp / "text.txt"
    text.write_text("Cisplatin induced nephrotoxicity in rats.\nAspirin reduced the fever.\n", encoding="utf-8")
    run = run_root / "pre"
    ner = tmp / "ft"
    paths = {"run": run, "hf_out": tmp / "hf_out", "import_out": tmp / "import_out", "pred": tmp / "pred.jsonl",
             "ner": ner / "tiny_ner" / "seed42"}
    over = overrides(pubmed_prefix, run_root, "pre", steps=2, save_last=True)
    commands = {
        "dry_run": ["pretrain", "--config", str(TINY), *over, "--dry-run"],
        "pretrain": ["pretrain", "--config", str(TINY), *over],
        "finetune": ["finetune", "ner", "--config", str(TINY_NER), f"model.restore_from_path={run}",
                     f"exp_manager.exp_dir={ner}", "trainer.max_steps=2", "model.dataset.max_seq_length=64",
                     "exp_manager.create_tensorboard_logger=false"],
        "predict": ["predict", "ner", "--checkpoint", str(paths["ner"]), "--input", str(text),
                    "--out", str(paths["pred"])],
        "export_hf": ["export", "hf", "--checkpoint", str(run), "--out", str(paths["hf_out"])],
        "import_verify": ["import", "nemo", "--model", str(run), "--out", str(paths["import_out"]), "--verify"],
        "bench": ["bench", "predict", "--text", str(text), "--json", str(tmp / "bench.json")],
    }
    without, out = site_without_transformers(tmp / "site"), tmp / "ran.json"
    child = _FORK.Process(target=_without_transformers,
                          args=(str(SITE), str(without), list(commands.values()), str(out)))
    child.start()
    child.join(600)
    assert child.exitcode == 0 and out.is_file(), child.exitcode
    return {"ran": dict(zip(commands, json.loads(out.read_text()))), "paths": paths}


def _ok(ran: dict) -> None:
    assert ran["returncode"] == 0, ran["stderr"][-3000:]


def test_pretraining_fine_tuning_and_predict_run_without_transformers(without_hf):
    ran, paths = without_hf["ran"], without_hf["paths"]
    for name in ("dry_run", "pretrain", "finetune", "predict"):
        _ok(ran[name])
    report = json.loads(ran["dry_run"]["stdout"])
    assert report["schedule"]["max_steps"] == 2 and report["data"]["tokens"] > 0, report
    assert (paths["run"] / "checkpoints" / "latest").exists()
    status = json.loads((paths["run"] / "status.json").read_text())
    assert (status["state"], status["step"]) == ("finished", 2), status
    assert (paths["ner"] / "checkpoints" / "latest").exists()
    lines = paths["pred"].read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["1", "2"], lines


@pytest.mark.parametrize("name, command", [("export_hf", "export hf"), ("import_verify", "import nemo --verify"),
                                           ("bench", "bench predict")])
def test_a_command_that_needs_transformers_names_the_extra_and_writes_nothing(without_hf, name, command):
    ran, paths = without_hf["ran"][name], without_hf["paths"]
    assert ran["returncode"] == 2, ran
    assert ran["stdout"] == ""
    (line,) = ran["stderr"].strip().splitlines()  # one line, no traceback
    assert f"bio-megatron {command} needs transformers, which is not installed: {HF_INSTALL}" in line, line
    assert not paths["hf_out"].exists() and not paths["import_out"].exists()


def test_the_hf_extra_states_the_range_the_commands_check():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["hf"] == [f"transformers{TRANSFORMERS_SPEC}"]
    assert "bio-megatron[test,hf]" in extras["dev"]  # make installs [dev]: the suite's oracles need transformers
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if d.startswith("transformers")], deps


@pytest.mark.parametrize("version, ok", [("5.23.0", True), ("5.23", True), ("5.30.1", True), ("5.24.0.dev0", True),
                                         ("5.22.9", False), ("4.46.3", False), ("6.0.0", False), ("6.0.0rc1", False),
                                         ("", False)])
def test_the_version_check_follows_the_range(version, ok):
    assert in_spec(version) is ok


def test_a_transformers_outside_the_range_is_refused_with_the_installed_version(monkeypatch):
    """A user's environment with transformers 4.x: the command names the range and what is installed, not a
    traceback from a class transformers 4 lacks."""
    old = ModuleType("transformers")
    old.__version__ = "4.46.3"
    monkeypatch.setitem(sys.modules, "transformers", old)
    with pytest.raises(MissingExtraError) as err:
        require_transformers("export hf")
    assert str(err.value) == (f"bio-megatron export hf needs transformers{TRANSFORMERS_SPEC} (installed: 4.46.3): "
                              f"{HF_INSTALL}")
    assert err.value.exit_code == 2
