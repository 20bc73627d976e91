"""Loading a checkpoint never runs code stored in it.

torch's distributed-checkpoint reader unpickles ``.metadata`` with plain ``pickle`` and the objects inside
the shards (megatron's ShardedObjects: RNG state, common state) with ``torch.load(weights_only=False)``;
megatron-core still reads a legacy ``common.pt`` when one is present. Each crafted file below would run
``touch <marker>``; the attacker is assumed to control the whole directory, ``checksums.json`` included.
Through the real CLI (``export hf``): exit 2, one line naming the checkpoint and the file, no marker, no
output. The last test shows the payload is live (plain torch runs it) and that the guard around the load
itself stops it too, should a file change after the check.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
from pathlib import Path

import pytest
from harness import run_world

from engine.pretrain_runs import overrides, pretrain_rank


class _Payload:
    """Pickled (protocol 2, as torch.save writes) into a call of ``os.system``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _cli_rank(argv: list[str], log: str) -> int:
    import sys

    from bio_megatron.cli import main
    from bio_megatron.utils.log import setup_logging

    sys.stderr = open(log, "w", buffering=1)  # pytest swapped sys.stderr in the parent
    os.dup2(sys.stderr.fileno(), 2)
    setup_logging(force=True)
    try:
        return main(argv)
    finally:
        sys.stderr.flush()


@pytest.fixture(scope="module")
def checkpoint(pubmed_prefix, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("untrusted")
    run_world(1, pretrain_rank, overrides(pubmed_prefix, root, "src", steps=1, save_last=True))
    return root / "src" / "checkpoints" / "iter_0000001"


def _reseal(ckpt: Path) -> None:
    """Rewrite checksums.json to match: checksums detect damage, they are no defence against an attacker."""
    from bio_megatron.training import integrity

    integrity.write_manifest(ckpt, integrity.digest_files(ckpt, sorted(
        p.name for p in ckpt.iterdir() if p.name != integrity.MANIFEST), collective=False))


def _metadata(ckpt: Path):
    with (ckpt / ".metadata").open("rb") as fh:
        return pickle.load(fh)  # our own file, written by the fixture


def _evil_metadata(ckpt: Path, marker: Path) -> None:
    (ckpt / ".metadata").write_bytes(pickle.dumps(_Payload(marker), protocol=2))


def _evil_object(ckpt: Path, marker: Path) -> None:
    """The common-state object re-pointed at a pickle appended to the shard (.metadata otherwise genuine)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    meta = _metadata(ckpt)
    index = next(i for i in meta.storage_data if i.fqn.startswith("common_state"))
    shard = ckpt / meta.storage_data[index].relative_path
    payload = pickle.dumps(_Payload(marker), protocol=2)
    offset = shard.stat().st_size
    with shard.open("ab") as fh:
        fh.write(payload)
    meta.storage_data[index] = _StorageInfo(shard.name, offset, len(payload))
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))


def _evil_common_pt(ckpt: Path, marker: Path) -> None:
    (ckpt / "common.pt").write_bytes(pickle.dumps(_Payload(marker), protocol=2))


CASES = {
    "metadata": (_evil_metadata, ".metadata names posix.system"),
    "metadata_no_checksums": (_evil_metadata, ".metadata names posix.system"),
    "sharded_object": (_evil_object, "__0_0.distcp holds an object (common_state/shard_0_1) that names posix.system"),
    "legacy_common_pt": (_evil_common_pt, "common.pt holds the common state that names posix.system"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_crafted_checkpoint_runs_nothing(case, checkpoint, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint, ckpt)
    marker = tmp_path / "PWNED"
    craft, expected = CASES[case]
    craft(ckpt, marker)
    if case.endswith("no_checksums"):
        (ckpt / "checksums.json").unlink()
    else:
        _reseal(ckpt)
    out = tmp_path / "hf"
    (rc,) = run_world(1, _cli_rank, ["export", "hf", "--checkpoint", str(ckpt), "--out", str(out)],
                      str(tmp_path / "log"))
    log = (tmp_path / "log").read_text()
    assert not marker.exists(), "the crafted pickle ran"
    assert rc == 2, log
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and str(ckpt) in errors[0] and expected in errors[0], log
    assert "Traceback" not in log
    assert not out.exists() and not list(tmp_path.glob(".hf*"))


def _dcp_read(ckpt: str, key: str) -> None:
    from torch.distributed.checkpoint import FileSystemReader, load

    load({key: io.BytesIO()}, storage_reader=FileSystemReader(ckpt), no_dist=True)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # a one-process read, on purpose
def test_guard_around_the_load_stops_what_plain_torch_runs(checkpoint, tmp_path):
    from bio_megatron.training import integrity

    for craft in (_evil_object, _evil_metadata):
        ckpt = tmp_path / craft.__name__
        shutil.copytree(checkpoint, ckpt)
        marker = tmp_path / f"{craft.__name__}.PWNED"
        key = next(i.fqn for i in _metadata(ckpt).storage_data if i.fqn.startswith("common_state"))
        craft(ckpt, marker)
        try:  # control: torch's own reader runs the payload
            _dcp_read(str(ckpt), key)
        except BaseException:  # noqa: BLE001  (CheckpointException is not an Exception)
            pass
        assert marker.exists(), craft.__name__
        marker.unlink()
        with integrity.restricted_loading(), pytest.raises(BaseException) as info:
            _dcp_read(str(ckpt), key)
        assert not marker.exists(), craft.__name__
        assert "posix.system" in str(info.value), str(info.value)[:2000]
        assert os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD") is None  # restored after the load
