"""``make gpu-pack`` and ``benchmarks/gpu/check.sh --dry-run``: the GPU check's wheels are complete and fit.

The pack is built here by the real script (``benchmarks/gpu/pack.py``, what ``make gpu-pack`` runs; about 5 s with
pip's cache); where pip cannot reach an index the test uses ``benchmarks/gpu/wheels`` if ``make gpu-pack`` made
it, else skips. The dry run then installs it into a virtualenv that sees only torch, transformers, tokenizers and
safetensors (and their dependencies) and imports and runs there what the check runs on a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "benchmarks" / "gpu"
PY = sys.executable


def _summary_module():
    spec = importlib.util.spec_from_file_location("gpu_check_summary", GPU / "summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pack(out: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PY, str(GPU / "pack.py"), "--out", str(out), *extra], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu") / "wheels"
    proc = _pack(out)
    if proc.returncode == 2 and "no network" in proc.stderr:
        if (GPU / "wheels" / "pack.json").is_file():
            return GPU / "wheels"
        pytest.skip(f"no package index reachable and no make gpu-pack output: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    assert "MiB (limit 64 MiB)" in proc.stdout
    return out


def test_pack_holds_what_a_bare_gpu_machine_lacks_and_fits(pack):
    manifest = json.loads((pack / "pack.json").read_text())
    files = {w["file"].split("-")[0].lower() for w in manifest["wheels"]}
    assert {"megatron_core", "omegaconf", "bio_megatron", "pytest", "psutil", "nltk", "tensorboard"} <= files
    assert not files & {"torch", "tokenizers", "safetensors", "numpy", "matplotlib"}
    # carried although the machine has them: its transformers (5.17.0) is below our [hf] range, which needs this regex
    from bio_megatron.utils.extras import in_spec

    (hf,) = [w["file"] for w in manifest["wheels"] if w["file"].startswith("transformers-")]
    assert in_spec(hf.split("-")[1]) and "regex" in files and set(manifest["carried_from_base"]) == {"transformers",
                                                                                                     "regex"}
    total = sum((pack / w["file"]).stat().st_size for w in manifest["wheels"])
    assert total == manifest["total_bytes"] <= 64 * 2**20


def test_dry_run_imports_and_runs_the_check_on_the_pack_alone(pack, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(GPU / "check.sh"), "--dry-run", str(out)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PACK": str(pack), "BASE_PYTHON": PY})
    assert proc.returncode == 0, (proc.stdout, (out / "check.log").read_text()[-4000:] if out.exists() else "")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and [s["step"] for s in summary["steps"]] == ["clean_env", "install", "dry_run"]
    dry = json.loads((out / "dry_run.json").read_text())
    assert dry["imports"]["failed"] == {} and dry["imports"]["modules"] > 100
    assert {"megatron.core.optimizer", "omegaconf", "psutil", "torch.utils.tensorboard"} <= set(
        dry["imports"]["lazy_third_party"])
    counts = _summary_module().junit(out / "gpu_tests.xml")["counts"]  # collected, imported, skipped without CUDA
    assert counts["skipped"] >= 5 and counts["passed"] == counts["failed"] == counts["error"] == 0
    bench = json.loads((out / "bench_pretrain_tiny.json").read_text())
    assert bench["ours"]["tokens_per_s"] > 0 and bench["hf"]["tokens_per_s"] > 0
    memory = json.loads((out / "memory_tiny.json").read_text())
    assert [r["micro_batch"] for r in memory["per_micro_batch"]] == [1, 2]


def test_clean_env_sees_only_the_four_and_their_dependencies(tmp_path):
    proc = subprocess.run([PY, str(GPU / "clean_env.py"), str(tmp_path / "env")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    probe = ("import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None for m in "
             "['torch', 'transformers', 'tokenizers', 'safetensors', 'numpy', 'yaml', 'megatron', 'omegaconf', "
             "'psutil', 'pytest', 'nltk', 'bio_megatron']}))")
    seen = json.loads(subprocess.run([proc.stdout.strip(), "-c", probe], capture_output=True, text=True,
                                     cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                                     timeout=60).stdout)
    assert seen == {"torch": True, "transformers": True, "tokenizers": True, "safetensors": True, "numpy": True,
                    "yaml": True, "megatron": False, "omegaconf": False, "psutil": False, "pytest": False,
                    "nltk": False, "bio_megatron": False}


def test_pack_over_the_limit_is_refused_and_writes_nothing(pack, tmp_path):
    out = tmp_path / "wheels"
    # pip takes the same pinned wheels from the module's pack instead of the index: the same download, the same
    # size check, without a second round of index look-ups (seconds)
    proc = _pack(out, "--limit-mib", "1", env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(pack)})
    if proc.returncode == 2 and "pip download failed" in proc.stderr:  # a make gpu-pack of other pins: the index
        proc = _pack(out, "--limit-mib", "1")
    if "no network" in proc.stderr:
        pytest.skip("no package index reachable")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "over the 1 MiB" in proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_pack_refuses_a_folder_it_did_not_write(tmp_path):
    out = tmp_path / "wheels"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = _pack(out)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not a pack" in proc.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"


def test_check_without_a_pack_is_one_line(tmp_path):
    proc = subprocess.run(["bash", str(GPU / "check.sh"), "--dry-run", str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PACK": str(tmp_path / "none")})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "make gpu-pack" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--steps", "smoke,bench", "OUT"], "--steps: unknown step 'bench' (one of gpu_tests bench_345m memory_1p2b "
                                        "bench_finetune smoke)"),
    (["--steps", "smoke,", "OUT"], "--steps: unknown step ''"),
    (["--dry-run", "--steps", "smoke", "OUT"], "--steps chooses among the GPU check's steps"),
    (["OUT", "--steps"], "usage: check.sh [--dry-run] [--steps NAME,...] [OUT]"),
    (["--stepz", "smoke", "OUT"], "usage: check.sh"),
])
def test_check_refuses_bad_options_in_one_line_before_writing(args, message, tmp_path):
    """``--steps`` (rerun only the named steps in a second, shorter call) is checked before anything is written."""
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(GPU / "check.sh"), *(str(out) if a == "OUT" else a for a in args)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PACK": str(tmp_path / "none")})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not out.exists()


def test_check_on_a_machine_without_cuda_stops_after_saying_so(pack, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the check would run")
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(GPU / "check.sh"), str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PACK": str(pack), "PYTHON": PY})
    assert proc.returncode == 1, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["ok"] and [s["step"] for s in summary["steps"]] == ["cuda"]
    log = (out / "check.log").read_text()
    assert "NO CUDA DEVICE" in log and "machine: transformers==" in log  # what the machine brought, on record


@pytest.mark.extended  # ~40 s on 2 cores: three CLI processes, six epochs; the GPU check's last step, run on the CPU
def test_smoke_step_runs_a_users_path_and_records_it(tmp_path):
    """``benchmarks/gpu/smoke.py``: finetune ner (bf16) learns the real sentences, predict ner with two workers
    returns every document, export hf writes the token-classification class; its JSON says so."""
    out = tmp_path / "smoke.json"
    proc = subprocess.run([PY, str(GPU / "smoke.py"), str(out), str(tmp_path / "work"), "--precision", "bf16"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    res = json.loads(out.read_text())
    assert proc.returncode == 0 and res["ok"], res
    assert [s["rc"] for s in res["steps"].values()] == [0, 0, 0]
    assert res["test_f1"] > 10  # percent; 31 measured: the model learned, not only ran
    assert res["predicted"]["documents"] == res["predicted"]["given"] and res["predicted"]["entities"] > 0
    assert res["exported_class"] == "MegatronBertForTokenClassification"
