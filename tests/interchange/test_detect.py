"""``formats/detect.detect``: the one decision of which format a path holds, on every kind of folder and file
(the real exports of each format are detected in ``test_model_state.py``), and the one-line refusal of anything
else through the real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from bio_megatron.formats.detect import FORMATS, detect
from bio_megatron.utils.errors import CheckpointError


def _layouts(root: Path) -> dict[str, tuple[Path, str]]:
    """Each layout a user may pass, as the writers of each format lay it out, and the format it is."""
    def put(rel: str, text: str = "x") -> Path:
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
        return f

    put("run/checkpoints/iter_0000002/bio_megatron.json", "{}")
    put("run/checkpoints/latest", "2")
    put("hf/config.json", "{}")
    put("mlm/latest_checkpointed_iteration.txt", "release")
    put("mlm/release/mp_rank_00/model_optim_rng.pt")
    put("ours_with_hf_files/bio_megatron.json", "{}")  # an import hf output keeps config.json beside its weights
    put("ours_with_hf_files/config.json", "{}")
    return {"checkpoint": (root / "run/checkpoints/iter_0000002", "ours"),
            "checkpoints folder": (root / "run/checkpoints", "ours"),
            "run dir": (root / "run", "ours"),
            "ours beside config.json": (root / "ours_with_hf_files", "ours"),
            "hf folder": (root / "hf", "hf"),
            "megatron-lm folder": (root / "mlm", "megatron-lm"),
            "megatron-lm .pt": (put("MegatronBERT.pt"), "megatron-lm"),
            "NGC .zip": (put("megatron_bert_345m.zip"), "megatron-lm"),
            ".nemo": (put("model.nemo"), "nemo")}


def test_every_layout_is_detected_as_its_format(tmp_path):
    layouts = _layouts(tmp_path)
    assert {kind: detect(path) for kind, (path, _) in layouts.items()} == \
        {kind: fmt for kind, (_, fmt) in layouts.items()}
    assert {fmt for _, fmt in layouts.values()} == set(FORMATS)


@pytest.mark.parametrize("what", ["empty folder", "other file", "missing"])
def test_anything_else_is_one_clear_error(tmp_path, what):
    path = {"empty folder": tmp_path / "empty", "other file": tmp_path / "notes.txt",
            "missing": tmp_path / "nowhere"}[what]
    if what == "empty folder":
        path.mkdir()
    elif what == "other file":
        path.write_text("x")
    with pytest.raises(CheckpointError) as err:
        detect(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg
    assert "not a BioMegatron checkpoint" in msg and "Hugging Face folder" in msg and ".nemo" in msg


def test_the_cli_refuses_an_unknown_source_in_one_line_exit_2(tmp_path):
    from reliability.cli_log import run_cli

    (tmp_path / "notes").mkdir()
    rc, msg = run_cli(["export", "hf", "--checkpoint", str(tmp_path / "notes"), "--out", str(tmp_path / "out")])
    assert rc == 2 and f"{tmp_path / 'notes'}: not a BioMegatron checkpoint" in msg, msg
    assert not (tmp_path / "out").exists()
