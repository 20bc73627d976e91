"""The megatron-core seam (``bio_megatron/parallel/seam.py``) against what is really replaced.

* After each scope's ``install`` (in a forked 1-rank gloo world: the process, a tiny BERT's DDP, a
  sequence-parallel build, a save, a load), every row that applies here is in place: the value at its target is
  the row's replacement (identity, or an instance of our class), and on the CPU every row applies. Undoing one
  replacement is reported.
* An AST scan of the package finds every assignment to an attribute of a torch or megatron module or class
  (aliases, ``for mod in (...)`` loops and ``setattr`` included): none is missing from the table.
* The pinned version is pyproject's; a megatron-core other than it is refused through the CLI in one line, exit 2,
  before the run directory exists; ``BIO_MEGATRON_ALLOW_MCORE=<version>`` turns the refusal into a warning.
* docs/ARCHITECTURE.md renders the table as it is.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from harness import run_world

from engine.pretrain_runs import TINY, overrides

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "bio_megatron"
ROOTS = ("torch", "megatron")


def _in_place() -> dict:
    import torch
    from megatron.core.transformer import transformer_block

    from bio_megatron.config.pretrain import ModelConfig, PretrainConfig
    from bio_megatron.models.sequence_parallel import fallback_norms
    from bio_megatron.parallel import seam
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training import checkpoint, integrity
    from bio_megatron.training.pretrain import build_stage

    init_distributed()
    init_model_parallel(1, 1, 7)
    out: dict = {"problems": {}, "checked": [], "cuda": torch.cuda.is_available()}

    def record(scope: str, **ctx) -> None:
        out["problems"][scope] = seam.check(scope, **ctx)
        out["checked"] += [r.target for r in seam.REPLACEMENTS if r.scope == scope and r.applies(ctx)]

    with seam.install("import"):
        record("import")
    out["import_undone"] = seam.check("import") != []
    record("process")
    cfg = PretrainConfig()
    cfg.model = ModelConfig(size="tiny", encoder_seq_length=16, max_position_embeddings=64, micro_batch_size=2,
                            global_batch_size=2)
    _, ddp = build_stage(cfg, 1000, torch.float32)  # model.gradient_accumulation_fusion: null (on, on the CPU)
    record("model", ddp=ddp, setting=cfg.model.gradient_accumulation_fusion)
    checkpoint._in_process_write_queue()
    record("save")
    with integrity.restricted_loading():
        record("load")
    out["load_undone"] = seam.check("load") != []
    sp = type("SequenceParallel", (), {"sequence_parallel": True})()
    megatrons_norm = transformer_block.LayerNormImpl
    with fallback_norms(sp):
        record("build")
    out["build_undone"] = transformer_block.LayerNormImpl is megatrons_norm

    # a replacement taken away is named
    import megatron.core.optimizer.clip_grads as clip_grads

    torch.cuda.synchronize, clip_grads.torch = (lambda: None), torch
    out["after_undo"] = seam.check("process")
    return out


def test_every_row_is_in_place_after_install():
    from bio_megatron.parallel import seam

    out = run_world(1, _in_place, timeout=240)[0]
    assert out["problems"] == {"import": [], "process": [], "model": [], "save": [], "load": [], "build": []}
    assert out["load_undone"] and out["build_undone"] and out["import_undone"]  # the scoped ones end with their block
    if out["cuda"]:  # on a GPU only the rows for megatron without apex/TE apply
        return
    assert sorted(out["checked"]) == sorted(r.target for r in seam.REPLACEMENTS)  # on the CPU every row applies
    undone = out["after_undo"]
    assert any(p.startswith("torch.cuda.synchronize: ") for p in undone), undone
    assert any(p.startswith("megatron.core.*.torch: <module 'torch'") for p in undone), undone


def test_guards_name_existing_tests():
    from bio_megatron.parallel import seam

    for row in seam.REPLACEMENTS:
        path, name = row.guard.split("::")
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), row.guard


# --- the scan ---------------------------------------------------------------------------------------------------

def _dotted(node: ast.AST, aliases: dict[str, set[str]]) -> set[str]:
    if isinstance(node, ast.Name):
        return aliases.get(node.id, set())
    if isinstance(node, ast.Attribute):
        return {f"{d}.{node.attr}" for d in _dotted(node.value, aliases)}
    return set()


def _aliases(tree: ast.AST) -> dict[str, set[str]]:
    """Names bound (anywhere in the file) to a torch/megatron module, class or attribute."""
    aliases: dict[str, set[str]] = {}

    def bind(name: str, dotted: set[str]) -> None:
        if dotted:
            aliases.setdefault(name, set()).update(dotted)

    nodes = list(ast.walk(tree))
    for _ in range(3):  # aliases of aliases
        for node in nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in ROOTS:
                        bind(a.asname or a.name.split(".")[0], {a.name if a.asname else a.name.split(".")[0]})
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ROOTS:
                for a in node.names:
                    bind(a.asname or a.name, {f"{node.module}.{a.name}"})
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    pairs = (zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple)
                             and isinstance(node.value, ast.Tuple) else [(target, node.value)])
                    for t, v in pairs:
                        if isinstance(t, ast.Name):
                            bind(t.id, _dotted(v, aliases))
            elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple):
                for element in node.iter.elts:
                    bind(node.target.id, _dotted(element, aliases))
    return aliases


def scan(source: str) -> list[tuple[str, int]]:
    """(dotted target, line) of every assignment to an attribute of a torch/megatron module or class."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = [e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute):
                found += [(d, node.lineno) for d in _dotted(t, aliases)]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and len(node.args) >= 2):
            name = node.args[1].value if isinstance(node.args[1], ast.Constant) else "<computed>"
            found += [(f"{d}.{name}", node.lineno) for d in _dotted(node.args[0], aliases)]
    return found


def test_scan_finds_every_kind_of_replacement():
    source = ("import torch\nimport megatron.core.utils as mu\nfrom megatron.core import parallel_state\n"
              "from megatron.core.optimizer import clip_grads, optimizer\n"
              "def f(x):\n    c = torch.cuda\n    c.synchronize = x\n    mu.helper, y = x, 1\n"
              "    setattr(parallel_state, 'get_rank', x)\n    for mod in (clip_grads, optimizer):\n"
              "        mod.impl = x\n    torch.Tensor.to = x\n    x.attr = 1\n")
    assert sorted(t for t, _ in scan(source)) == [
        "megatron.core.optimizer.clip_grads.impl", "megatron.core.optimizer.optimizer.impl",
        "megatron.core.parallel_state.get_rank", "megatron.core.utils.helper", "torch.Tensor.to",
        "torch.cuda.synchronize"]


def test_no_replacement_is_missing_from_the_table():
    from bio_megatron.parallel import seam

    listed = {r.target for r in seam.REPLACEMENTS} | {a for r in seam.REPLACEMENTS for a in r.also_sets}
    sources = {p: p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
    found = {(t, f"{p.relative_to(ROOT)}:{line}") for p, text in sources.items()
             if "torch" in text or "megatron" in text for t, line in scan(text)}  # no alias without an import
    missing = sorted(f"{where}: {t}" for t, where in found if t not in listed)
    assert missing == [], "replacements not in bio_megatron/parallel/seam.py's table:\n" + "\n".join(missing)
    targets = {t for t, _ in found}  # the scan sees each mechanism (so that it can fail)
    assert {"torch.cuda.current_device", "torch.Tensor.to", "megatron.core.tensor_parallel.random.CudaRNGStatesTracker",
            "megatron.core.optimizer.distrib_optimizer.DistributedOptimizer.load_state_dict",
            "megatron.core.optimizer.optimizer.multi_tensor_scale_impl", "megatron.core.tensor_parallel.layers.F",
            "megatron.core.dist_checkpointing.strategies.filesystem_async._results_queue",
            "torch.distributed.checkpoint.filesystem.pickle",
            "megatron.core.transformer.transformer_block.LayerNormImpl"} <= targets


# --- the version ------------------------------------------------------------------------------------------------

def test_pin_is_pyprojects():
    import importlib.metadata

    from bio_megatron.parallel import seam

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"megatron-core=={seam.MCORE_PIN}" in deps
    assert importlib.metadata.version("megatron-core") == seam.MCORE_PIN


def _pretrain_with(version: str, allow: str | None, argv: list[str]) -> tuple[int, list[tuple[str, str]]]:
    import importlib.metadata
    import logging
    import os

    from reliability.cli_log import project_records

    from bio_megatron.cli import main

    real = importlib.metadata.version
    importlib.metadata.version = lambda name: version if name == "megatron-core" else real(name)
    if allow is not None:
        os.environ["BIO_MEGATRON_ALLOW_MCORE"] = allow
    with project_records(logging.WARNING) as records:
        rc = main(argv)
    return rc, [(r.levelname, r.getMessage()) for r in records]


@pytest.fixture
def argv(tmp_path) -> list[str]:
    # data that does not exist: a run that passed the version check stops there, quickly
    return ["pretrain", "--config", str(TINY), *overrides(tmp_path / "missing", tmp_path / "runs", "seam")]


def test_other_megatron_core_is_refused_in_one_line(argv, tmp_path):
    rc, records = run_world(1, _pretrain_with, "0.20.0", None, argv)[0]
    assert rc == 2
    assert [level for level, _ in records] == ["ERROR"] and "\n" not in records[0][1]
    message = records[0][1]
    assert "megatron-core 0.20.0 is installed" in message and "0.19.2" in message
    assert "BIO_MEGATRON_ALLOW_MCORE=0.20.0" in message
    assert not (tmp_path / "runs").exists()
    # the variable names the installed version, not any other
    rc, records = run_world(1, _pretrain_with, "0.20.0", "0.21.0", argv)[0]
    assert rc == 2 and "BIO_MEGATRON_ALLOW_MCORE=0.20.0" in records[-1][1]


def test_allow_variable_turns_the_refusal_into_a_warning(argv):
    rc, records = run_world(1, _pretrain_with, "0.20.0", "0.20.0", argv)[0]
    warnings = [m for level, m in records if level == "WARNING" and "megatron-core 0.20.0" in m]
    assert len(warnings) == 1 and "0.19.2" in warnings[0] and "BIO_MEGATRON_ALLOW_MCORE=0.20.0" in warnings[0]
    errors = [m for level, m in records if level == "ERROR"]
    assert rc == 2 and len(errors) == 1 and "data prefix has no .bin" in errors[0], errors  # past the check


# --- the docs ---------------------------------------------------------------------------------------------------

def test_architecture_doc_renders_the_table():
    from bio_megatron.parallel import seam

    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert "## The megatron-core seam" in doc
    section = doc.split("## The megatron-core seam", 1)[1]
    assert seam.markdown() in section, "docs/ARCHITECTURE.md: render the table again with seam.markdown()"
