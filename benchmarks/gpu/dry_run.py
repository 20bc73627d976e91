"""``check.sh --dry-run``'s one Python process, in the clean environment (torch, transformers, tokenizers,
safetensors and their dependencies) plus the installed pack, with the path the real check uses: this tree first
(the code under test), then the pack's folder (everything else).

It proves on a CPU that the pack carries everything the GPU check runs:

1. every module of ``bio_megatron`` imports (from the tree), and every third-party module any of them imports
   inside a function (the lazy imports a command reaches only when it runs), except those imported under a
   ``try:`` (optional: apex, Transformer Engine, ...), those of the distributions the pack leaves out, and
   optional integrations whose distribution is no run-time dependency (mlflow, wandb: by ``pack.json`` and the
   development environment's module -> distribution map, the third and fourth arguments): those are listed;
2. the gpu-marked tests are collected and run (they skip without CUDA);
3. the check's other steps run at tiny CPU sizes through the same entry points: ``bench pretrain`` (sequential
   schedule, as on a GPU: HF in this process) and ``memory.py``; ``bench finetune`` is looked up.

One JSON object goes to ``OUT/dry_run.json``; exit 1 naming what failed.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import pkgutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from pack import EXCLUDED, norm  # noqa: E402  (same folder: what the pack leaves out on purpose)

OPTIONAL_EXCLUDED = tuple(EXCLUDED)


def _lazy_imports(path: Path) -> set[str]:
    """Third-party modules imported inside functions of ``path``, outside ``try:`` blocks."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()

    def visit(node: ast.AST, in_function: bool, in_try: bool) -> None:
        for child in ast.iter_child_nodes(node):
            fn = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            tr = in_try or isinstance(child, ast.Try)
            if fn and not tr and isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif fn and not tr and isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.add(child.module)
            visit(child, fn, tr)

    visit(tree, False, False)
    stdlib = set(sys.stdlib_module_names)
    return {m for m in found if m.split(".")[0] not in stdlib and m.split(".")[0] != "bio_megatron"
            and m.split(".")[0] not in OPTIONAL_EXCLUDED}


def declared_modules(pack_json: str, dev_modules_json: str) -> set[str] | None:
    """Top-level modules of the distributions the project depends on at run time (the pack's and the bare
    machine's, as ``pack.json`` names them), by the development environment's module -> distribution map."""
    if not (pack_json and dev_modules_json):
        return None
    manifest = json.loads(Path(pack_json).read_text())
    declared = {norm(n) for n in (*manifest["pinned"], *manifest["base"]["with_dependencies"])}
    owners = json.loads(Path(dev_modules_json).read_text())
    return {top for top, dists in owners.items() if declared & {norm(d) for d in dists}}


def import_everything(declared: set[str] | None) -> dict[str, Any]:
    import bio_megatron

    pkg = Path(bio_megatron.__file__).parent
    if pkg != REPO / "bio_megatron":
        raise AssertionError(f"bio_megatron was imported from {pkg}, not from the tree {REPO}")
    failed: dict[str, str] = {}
    modules, lazy = [], set()
    for info in pkgutil.walk_packages([str(pkg)], "bio_megatron."):
        if info.name.endswith("__main__"):
            continue  # runs the CLI
        modules.append(info.name)
        source = pkg.joinpath(*info.name.split(".")[1:])
        source = source / "__init__.py" if info.ispkg else source.with_suffix(".py")
        lazy |= _lazy_imports(source)
    # optional integrations (mlflow, wandb, ...): imported lazily from distributions that are no run-time
    # dependency of the project; listed, not required
    optional = {m for m in lazy if declared is not None and m.split(".")[0] not in declared}
    lazy -= optional
    for name in modules + sorted(lazy):
        try:
            importlib.import_module(name)
        except Exception as e:
            # matplotlib's users are left out on purpose: a module that imports it at the top is reported apart
            if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] in OPTIONAL_EXCLUDED:
                continue
            failed[name] = f"{type(e).__name__}: {e}"
    return {"bio_megatron_from": str(pkg), "modules": len(modules), "lazy_third_party": sorted(lazy),
            "optional_not_runtime_dependencies": sorted(optional), "failed": failed}


def run_gpu_tests(out: Path) -> dict[str, Any]:
    import pytest

    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # as check.sh runs them: our plugins only
    rc = pytest.main(["-q", "-m", "gpu", "-p", "pytest_timeout", "-p", "no:cacheprovider", "--rootdir", str(REPO), "-c",
                      str(REPO / "pyproject.toml"), "--junitxml", str(out / "gpu_tests.xml"), str(REPO / "tests" / "gpu")])
    return {"rc": int(rc)}


def run_tiny_steps(out: Path) -> dict[str, Any]:
    import memory

    from bio_megatron.cli import main as cli

    res: dict[str, Any] = {}
    res["bench_pretrain_rc"] = cli(["bench", "pretrain", "--size", "tiny", "--seq", "64", "--micro-batch", "2",
                                    "--steps", "1", "--warmup", "1", "--precision", "bf16", "--schedule", "sequential",
                                    "--profile", "1", "--also-our-adam", "fused",
                                    "--json", str(out / "bench_pretrain_tiny.json")])
    res["memory_rc"] = memory.main(["--size", "tiny", "--seq", "64", "--micro-batches", "1,2",
                                    "--json", str(out / "memory_tiny.json")])
    try:
        cli(["bench", "finetune", "--help"])
        res["bench_finetune"] = "available"
    except SystemExit as e:
        res["bench_finetune"] = "available" if e.code == 0 else "not available in this tree"
    return res


def stale_wheel_files(site: str) -> list[str]:
    """Files of the tree's ``bio_megatron`` that differ from the pack's wheel (which only the ``bio-megatron``
    script on the path uses): informational, the check runs the tree."""
    import base64
    import hashlib

    record = next(Path(site).glob("bio_megatron-*.dist-info"), None)
    if record is None:
        return ["(no bio_megatron wheel in the pack)"]
    recorded = {}
    for line in (record / "RECORD").read_text().splitlines():
        path, digest, _ = line.rsplit(",", 2)
        if path.startswith("bio_megatron/") and digest.startswith("sha256="):
            recorded[path] = digest.removeprefix("sha256=")
    tree = {str(p.relative_to(REPO)): p for p in (REPO / "bio_megatron").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}
    stale = sorted(set(recorded) ^ set(tree))
    for path in set(recorded) & set(tree):
        digest = base64.urlsafe_b64encode(hashlib.sha256(tree[path].read_bytes()).digest()).rstrip(b"=").decode()
        if digest != recorded[path]:
            stale.append(path)
    return sorted(stale)


def main(out: str, site: str, pack_json: str = "", dev_modules_json: str = "") -> int:
    dest = Path(out)
    res: dict[str, Any] = {}
    for name, fn in (("imports", lambda: import_everything(declared_modules(pack_json, dev_modules_json))), ("gpu_tests", lambda: run_gpu_tests(dest)),
                     ("tiny_steps", lambda: run_tiny_steps(dest))):
        t = time.perf_counter()
        try:
            res[name] = fn()
        except BaseException as e:  # noqa: BLE001  (SystemExit of a CLI too: recorded, the next part still runs)
            res[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        res[name]["seconds"] = round(time.perf_counter() - t, 1)
    ok = (not res["imports"].get("failed", True) and res["gpu_tests"].get("rc") == 0
          and res["tiny_steps"].get("bench_pretrain_rc") == 0 and res["tiny_steps"].get("memory_rc") == 0)
    res["ok"] = ok
    res["wheel_differs_from_tree"] = stale_wheel_files(site)
    (dest / "dry_run.json").write_text(json.dumps(res, indent=2) + "\n")
    if not ok:
        sys.stderr.write("dry run failed: " + json.dumps({k: v for k, v in res.items() if k != "ok"})[:3000] + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
