"""Folder outputs never delete the user's files; file outputs refuse a folder; a closed stdout is quiet.

Found on main before issue 11: ``export hf --out DIR`` and ``import hf --out DIR`` replaced a non-empty
existing DIR with ``shutil.rmtree``, exited 0 and said nothing: the user's unrelated files were gone.
Now a folder output may only land on an absent path, an empty folder, or -- with ``--overwrite`` -- an
earlier output of the same command (recognised by the marker file it wrote); anything else exits 2 naming
the folder, before any work, and leaves every pre-existing byte as it was. ``predict --out DIR`` and
``vocab train --output DIR`` exit 2 instead of a traceback after the work; ``evaluate ... | head -c 1``
ends without a BrokenPipeError traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reliability.readonly import read_only_dir

from reliability.cli_log import run_cli as _run  # the CLI in-process: exit code and its ERROR line
from reliability.files import tree_digest
from bio_megatron.cli import main
from bio_megatron.utils.io import OUTPUT_MARKER

REPO = Path(__file__).resolve().parents[2]
WORDS = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "of", "and", "cell", "gene"]
         + list("abcdefghijklmnopqrstuvwxyz") + ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"])


def _siblings(target: Path) -> list[str]:
    """Temporary or set-aside folders we might have left beside ``target``."""
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}."))


def _cli(*argv: str):
    """The CLI as a process of its own (what writes a checkpoint starts torch.distributed), forked from this one:
    exit code, stdout and stderr as ``subprocess.CompletedProcess`` names them."""
    from harness import cli_forked

    with contextlib.chdir(REPO):  # where the subprocess ran
        return cli_forked(list(argv), env={"OMP_NUM_THREADS": "1"}, timeout=300)


def _main_child(argv: list[str]) -> dict:
    try:
        return {"rc": main(argv)}
    except BaseException as exc:  # a traceback the real CLI would show
        return {"rc": None, "error": f"{type(exc).__name__}: {exc}"}


def _forked(*argv: str) -> dict:
    """The CLI's ``main`` in a forked process (torch/megatron already imported: no 6 s start-up)."""
    from harness import run_world

    (res,) = run_world(1, _main_child, list(argv))
    return res


def make_hf_folder(out: Path, seed: int = 0) -> Path:
    """A tiny random ``MegatronBertForMaskedLM`` saved by transformers itself, with its vocab.txt."""
    import torch
    from transformers import MegatronBertConfig, MegatronBertForMaskedLM

    torch.manual_seed(seed)
    cfg = MegatronBertConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=64, type_vocab_size=2)
    MegatronBertForMaskedLM(cfg).save_pretrained(out)
    (out / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    """Two different checkpoints written by ``import hf`` (so an overwrite can be told from the old output)."""
    root = tmp_path_factory.mktemp("outputs")
    out = {}
    for seed in (0, 1):
        hf = make_hf_folder(root / f"hf{seed}", seed)
        assert _forked("import", "hf", "--model", str(hf), "--out", str(root / f"ckpt{seed}"))["rc"] == 0
        out[f"hf{seed}"], out[f"ckpt{seed}"] = hf, root / f"ckpt{seed}"
    return out


@pytest.fixture
def user_dir(tmp_path) -> Path:
    """A folder of the user's own files (nested, hidden, and an HF-looking name) that must survive."""
    d = tmp_path / "mine"
    (d / "notes").mkdir(parents=True)
    (d / "notes" / "thesis.tex").write_text("\\section{Results}\n")
    (d / ".hidden").write_bytes(os.urandom(64))
    (d / "config.json").write_text('{"mine": true}\n')
    return d


@pytest.mark.parametrize("overwrite", [False, True])
def test_export_refuses_a_folder_of_user_files(ckpts, user_dir, overwrite):
    before = tree_digest(user_dir)
    rc, msg = _run(["export", "hf", "--checkpoint", str(ckpts["ckpt0"]), "--out", str(user_dir)]
                   + (["--overwrite"] if overwrite else []))
    assert rc == 2
    assert str(user_dir) in msg and "not empty" in msg and "--overwrite replaces only" in msg, msg
    assert tree_digest(user_dir) == before
    assert not (user_dir / OUTPUT_MARKER).exists() and _siblings(user_dir) == []


@pytest.mark.parametrize("overwrite", [False, True])
def test_import_refuses_a_folder_of_user_files(ckpts, user_dir, overwrite):
    before = tree_digest(user_dir)
    rc, msg = _run(["import", "hf", "--model", str(ckpts["hf0"]), "--out", str(user_dir)]
                   + (["--overwrite"] if overwrite else []))
    assert rc == 2 and str(user_dir) in msg and "import hf" in msg, msg
    assert tree_digest(user_dir) == before and _siblings(user_dir) == []


def test_a_file_where_a_folder_goes_is_refused(ckpts, tmp_path):
    target = tmp_path / "out"
    target.write_text("keep me\n")
    rc, msg = _run(["export", "hf", "--checkpoint", str(ckpts["ckpt0"]), "--out", str(target), "--overwrite"])
    assert rc == 2 and str(target) in msg and "not a folder" in msg, msg
    assert target.read_text() == "keep me\n"


def test_export_into_empty_folder_then_overwrite_only_our_own(ckpts, tmp_path):
    out = tmp_path / "hf_out"
    out.mkdir()  # an existing empty folder is a valid target
    assert _forked("export", "hf", "--checkpoint", str(ckpts["ckpt0"]), "--out", str(out))["rc"] == 0
    assert json.loads((out / OUTPUT_MARKER).read_text())["command"] == "export hf"
    first = tree_digest(out)
    assert "model.safetensors" in first

    # Our own earlier output: refused without --overwrite, untouched.
    rc, msg = _run(["export", "hf", "--checkpoint", str(ckpts["ckpt1"]), "--out", str(out)])
    assert rc == 2 and str(out) in msg and "earlier `export hf` output" in msg and "--overwrite" in msg, msg
    assert tree_digest(out) == first

    # ... and a different command's output is not ours to replace, even with --overwrite.
    rc, msg = _run(["import", "hf", "--model", str(ckpts["hf1"]), "--out", str(out), "--overwrite"])
    assert rc == 2 and "`export hf` output" in msg, msg
    assert tree_digest(out) == first

    # With --overwrite: replaced by the other checkpoint's export, nothing left beside it.
    res = _cli("export", "hf", "--checkpoint", str(ckpts["ckpt1"]), "--out", str(out), "--overwrite")
    assert res.returncode == 0, res.stderr[-2000:]
    second = tree_digest(out)
    assert second.keys() == first.keys()
    assert second["model.safetensors"] != first["model.safetensors"]
    assert _siblings(out) == []
    from safetensors.torch import load_file

    theirs = load_file(str(ckpts["hf1"] / "model.safetensors"))
    ours = load_file(str(out / "model.safetensors"))
    assert ours["bert.encoder.layer.0.attention.self.query.weight"].equal(
        theirs["bert.encoder.layer.0.attention.self.query.weight"])  # really the second model


def test_import_overwrite_replaces_its_own_checkpoint(ckpts, tmp_path):
    import shutil

    out = tmp_path / "ckpt"
    shutil.copytree(ckpts["ckpt0"], out)  # what `import hf` wrote for the first model
    first = tree_digest(out)
    assert _forked("import", "hf", "--model", str(ckpts["hf1"]), "--out", str(out), "--overwrite")["rc"] == 0
    second = tree_digest(out)
    assert json.loads((out / OUTPUT_MARKER).read_text())["command"] == "import hf"
    assert second.keys() == first.keys() and second != first and _siblings(out) == []


def test_failed_export_leaves_nothing(ckpts, tmp_path):
    """A checkpoint whose shard is truncated: the export fails; no DIR, no temporary sibling."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(ckpts["ckpt0"], bad)
    shard = next(bad.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:1000])
    out = tmp_path / "hf_out"
    res = _forked("export", "hf", "--checkpoint", str(bad), "--out", str(out))
    assert res["rc"] != 0, res  # the message itself is checkpoint integrity's (another reliability test)
    assert not out.exists() and _siblings(out) == []


def _export_failing_midway(ckpt: str, out: str) -> dict:
    """export_hf in a forked process whose tokenizer step fails after the weights were written."""
    import bio_megatron.formats.hf.convert as hf_mod
    from bio_megatron.utils.errors import DataError

    def broken(tmp, *_):
        assert (tmp / "model.safetensors").is_file()  # the failure really is halfway through the folder
        raise DataError("disk full (simulated)", str(tmp))

    hf_mod.save_tokenizer = broken  # the name export_hf calls (formats/hf/convert.py)
    try:
        hf_mod.export_hf(ckpt, out, overwrite=True)
    except DataError as exc:
        return {"error": str(exc)}
    return {"error": None}


def test_export_failing_midway_keeps_the_previous_output(ckpts, tmp_path):
    from harness import run_world

    out = tmp_path / "hf_out"
    assert _forked("export", "hf", "--checkpoint", str(ckpts["ckpt0"]), "--out", str(out))["rc"] == 0
    before = tree_digest(out)
    (res,) = run_world(1, _export_failing_midway, str(ckpts["ckpt1"]), str(out))
    assert res["error"] and "simulated" in res["error"]
    assert tree_digest(out) == before and _siblings(out) == []
    (res,) = run_world(1, _export_failing_midway, str(ckpts["ckpt1"]), str(tmp_path / "fresh"))
    assert res["error"] and not (tmp_path / "fresh").exists() and _siblings(tmp_path / "fresh") == []


def test_swap_without_rename_exchange_never_loses_the_old_output(tmp_path, monkeypatch):
    """Where the kernel cannot exchange two folders, the old output is moved aside first: if we die between
    the two renames, it is still complete beside the target, never deleted."""
    from bio_megatron.utils import io

    out = tmp_path / "out"
    for text in ("old", "new"):
        with io.atomic_path(out, command="export hf", overwrite=True) as tmp:
            tmp.mkdir()
            (tmp / "w.txt").write_text(text)
        if text == "old":
            monkeypatch.setattr(io, "_exchange", lambda a, b: False)
    assert (out / "w.txt").read_text() == "new" and _siblings(out) == []

    real_replace, calls = os.replace, []

    def dying_replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the process "dies" after moving the old output aside
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(io.os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        with io.atomic_path(out, command="export hf", overwrite=True) as tmp:
            tmp.mkdir()
            (tmp / "w.txt").write_text("newest")
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(".out.old-")]
    assert len(aside) == 1 and (aside[0] / "w.txt").read_text() == "new"


@pytest.mark.parametrize("task", ["ner", "qa"])
def test_predict_out_a_folder_exits_2_before_loading(task, user_dir, tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("Naloxone reverses clonidine.\n")
    before = tree_digest(user_dir)
    # The checkpoint does not exist: the --out check must come first (no model loaded for nothing).
    rc, msg = _run(["predict", task, "--checkpoint", str(tmp_path / "nope"), "--input", str(inp),
                    "--out", str(user_dir)])
    assert rc == 2 and str(user_dir) in msg and "is a folder" in msg, msg
    assert tree_digest(user_dir) == before


def test_predict_out_under_a_file_exits_2(tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("Naloxone reverses clonidine.\n")
    blocker = tmp_path / "results"
    blocker.write_text("a file, not a folder\n")
    rc, msg = _run(["predict", "ner", "--checkpoint", str(tmp_path / "nope"), "--input", str(inp),
                    "--out", str(blocker / "pred.jsonl")])
    assert rc == 2 and str(blocker) in msg and "not a folder" in msg, msg
    assert blocker.read_text() == "a file, not a folder\n"


def test_predict_out_in_a_read_only_folder_exits_2(tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("Naloxone reverses clonidine.\n")
    with read_only_dir(tmp_path / "ro") as ro:
        rc, msg = _run(["predict", "ner", "--checkpoint", str(tmp_path / "nope"), "--input", str(inp),
                        "--out", str(ro / "pred.jsonl")])
        assert list(ro.iterdir()) == []
    assert rc == 2 and "not writable" in msg, msg


def test_vocab_train_output_a_folder_exits_2(user_dir, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"sentences": ["the cell"]}) + "\n")
    before = tree_digest(user_dir)
    rc, msg = _run(["vocab", "train", "--input", str(docs), "--output", str(user_dir), "--size", "100"])
    assert rc == 2 and str(user_dir) in msg and "is a folder" in msg, msg
    assert tree_digest(user_dir) == before


def _piped(argv: list[str], reader: str) -> subprocess.CompletedProcess:
    cmd = f"{sys.executable} -m bio_megatron {' '.join(argv)} | {reader}; exit ${{PIPESTATUS[0]}}"
    return subprocess.run(["bash", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_closed_stdout_is_quiet(tmp_path):
    """``bio-megatron ... | head -c 1``: no BrokenPipeError traceback, exit 0 (the convention in cli.main)."""
    tsv = tmp_path / "ner.tsv"
    tsv.write_text("Naloxone\tB-Chemical\nreverses\tO\nclonidine\tB-Chemical\n\n")
    stats = ["vocab", "stats", "--vocab", "bert-base-cased", "--ner-file", str(tsv)]
    # `true` never reads: the pipe is closed before the command writes, so the write always fails.
    res = _piped(stats, "true")
    assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr
    assert res.returncode == 0, (res.returncode, res.stderr)
    conll = tmp_path / "ner.txt"
    conll.write_text("".join(f"w{i} B-Chemical B-Chemical\nx{i} O O\n\n" for i in range(200)))
    res = _piped(["evaluate", "ner", "--input", str(conll)], "head -c 1")
    assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr
    assert res.returncode == 0, (res.returncode, res.stderr)
    whole = _piped(stats, "cat")  # a reader that stays gets the whole result, as before
    assert whole.returncode == 0 and "Naloxone" not in whole.stderr and json.loads(whole.stdout)


def test_overwrite_keeps_files_the_user_added_to_an_export(ckpts, tmp_path):
    """Issue 21: ``--overwrite`` used to delete the whole earlier output, files the user had added since
    included. The marker now lists what we wrote; anything else there is named and the overwrite refused."""
    out = tmp_path / "hf_out"
    assert _forked("export", "hf", "--checkpoint", str(ckpts["ckpt0"]), "--out", str(out))["rc"] == 0
    marker = json.loads((out / OUTPUT_MARKER).read_text())
    assert "model.safetensors" in marker["files"] and OUTPUT_MARKER not in marker["files"]
    (out / "NOTES.md").write_text("# my notes\n")  # (an edited README.md: test_export_pipeline.py)
    (out / "eval").mkdir()
    (out / "eval" / "scores.json").write_text('{"f1": 0.9}\n')
    before = tree_digest(out)
    rc, msg = _run(["export", "hf", "--checkpoint", str(ckpts["ckpt1"]), "--out", str(out), "--overwrite"])
    assert rc == 2 and str(out) in msg and "2 file(s)" in msg and "NOTES.md, eval/scores.json" in msg, msg
    assert tree_digest(out) == before and _siblings(out) == []
    # The same folder without the user's files is ours again: replaced.
    (out / "NOTES.md").unlink()
    (out / "eval" / "scores.json").unlink()
    (out / "eval").rmdir()
    res = _cli("export", "hf", "--checkpoint", str(ckpts["ckpt1"]), "--out", str(out), "--overwrite")
    assert res.returncode == 0, res.stderr[-2000:]
    assert tree_digest(out)["model.safetensors"] != before["model.safetensors"]


def test_overwrite_refuses_an_output_marked_before_manifests(ckpts, tmp_path):
    """A marker without a file list (written before manifests) cannot tell our files from added ones: refused."""
    out = tmp_path / "hf_out"
    assert _forked("export", "hf", "--checkpoint", str(ckpts["ckpt0"]), "--out", str(out))["rc"] == 0
    (out / OUTPUT_MARKER).write_text(json.dumps({"command": "export hf", "version": "0.1.0"}) + "\n")
    before = tree_digest(out)
    rc, msg = _run(["export", "hf", "--checkpoint", str(ckpts["ckpt1"]), "--out", str(out), "--overwrite"])
    assert rc == 2 and "before bio-megatron listed the files it writes" in msg, msg
    assert tree_digest(out) == before


@pytest.mark.parametrize("text, expected", [("model: [unclosed\n", "cannot be read (ParserError)"),
                                            ("- a list\n", "a mapping of config sections is expected, not list")])
def test_a_broken_saved_config_is_one_line_naming_it(ckpts, tmp_path, text, expected):
    """Every reader of a checkpoint's config.yaml goes through formats/saved.py: a file that is not a mapping of
    sections stops export with exit 2 and one line naming it, before anything is written."""
    import shutil

    bad = tmp_path / "ckpt"
    shutil.copytree(ckpts["ckpt0"], bad)
    config = next(bad.rglob("config.yaml"))
    config.write_text(text)
    out = tmp_path / "hf_out"
    res = _cli("export", "hf", "--checkpoint", str(bad), "--out", str(out))
    errors = [line for line in res.stderr.splitlines() if " ERROR " in line]  # beside the launch's INFO line
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert len(errors) == 1 and str(config) in errors[0] and expected in errors[0], res.stderr
    assert not out.exists() and _siblings(out) == []
