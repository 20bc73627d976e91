"""Untrusted archives are read with limits: a bomb is refused in seconds with bounded memory and disk (issue 21).

Found on main before issue 21: ``import megatron-lm`` of a ``.zip`` read each member whole into memory
(``zf.read``), so a member that inflates to gigabytes took that much RAM before anything was checked;
``torch.load`` of a zip-format ``.pt``/``.bin`` allocates every record at the size its zip entry declares; and a
``.nemo`` tar was unpacked whole into a temporary folder whatever sizes its headers declared.

Each case writes a real crafted file (deflate streams are built from one compressed block repeated, so a
2 GiB member costs a few MB and a second to make), runs the real CLI in a forked process that reports its own
peak RSS (``resource.getrusage``, before and after ``main``) and the time ``main`` took, and checks the exit
code, the one-line message (the archive, the member, what it declares and the bound), the RSS, the time, and
that nothing was written: no output and nothing left in the process's temporary folder.
"""

from __future__ import annotations

import json
import os
import struct
import tarfile
import zlib
from io import BytesIO
from pathlib import Path

import pytest

from reliability.files import tree_digest

BOMB = 2 << 30          # what the crafted member inflates to
MAX_GROWTH = 256 << 20  # peak RSS over what the forked CLI process had before main()
MAX_SECONDS = 10.0


def _cli_child(argv: list[str], tmpdir: str) -> dict:
    """``main(argv)`` in a forked child with its own temporary folder: exit code, its ERROR lines, seconds in
    ``main`` and peak RSS (``getrusage``) before and after it."""
    import resource
    import tempfile
    import time

    import bio_megatron.formats.hf.convert  # noqa: F401  (imports are not what is measured)
    import bio_megatron.formats.megatron_lm.convert  # noqa: F401
    import bio_megatron.formats.nemo.convert  # noqa: F401
    from bio_megatron.cli import main
    from reliability.cli_log import project_records

    os.environ["TMPDIR"], tempfile.tempdir = tmpdir, None
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.monotonic()
    try:
        with project_records() as records:
            rc = main(argv)
    except BaseException as exc:  # a traceback the real CLI would show
        return {"rc": None, "error": f"{type(exc).__name__}: {exc}"}
    return {"rc": rc, "seconds": time.monotonic() - start, "base": base,
            "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "msg": " ".join(r.getMessage() for r in records if r.levelname == "ERROR")}


def _cli(tmp: Path, *argv: str) -> dict:
    """The CLI forked from this process (torch already imported) with TMPDIR of its own; what it left there."""
    from harness import run_world

    tmpdir = tmp / "process_tmp"
    tmpdir.mkdir(exist_ok=True)
    (res,) = run_world(1, _cli_child, list(argv), str(tmpdir))
    return {**res, "left": sorted(p.name for p in tmpdir.iterdir())}


def _deflate(prefix: bytes, zeros: int, suffix: bytes = b"") -> tuple[bytes, int, int]:
    """A raw deflate stream of ``prefix``, ``zeros`` zero bytes (a multiple of 16 MiB) and ``suffix``: (stream,
    CRC-32 of what it inflates to, that length). Never holds more than 16 MiB of the inflated data."""
    block = 16 << 20
    assert zeros % block == 0
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    # a full flush resets the compressor: each block of zeros compresses to the same bytes, and the repeated
    # bytes are one valid stream
    head = comp.compress(prefix) + comp.flush(zlib.Z_FULL_FLUSH)
    zero_block = bytes(block)
    chunk = comp.compress(zero_block) + comp.flush(zlib.Z_FULL_FLUSH)
    tail = comp.compress(suffix) + comp.flush(zlib.Z_FINISH)
    crc = zlib.crc32(prefix)
    for _ in range(zeros // block):
        crc = zlib.crc32(zero_block, crc)
    return head + chunk * (zeros // block) + tail, zlib.crc32(suffix, crc), len(prefix) + zeros + len(suffix)


def _zip_with_bomb(path: Path, member: str, others: dict[str, bytes] | None = None) -> Path:
    """A zip (written byte by byte, as a crafted file would be) whose ``member`` is a deflate bomb of BOMB bytes
    declaring its true size, after ``others`` stored as they are."""
    entries = [(name, data, zlib.crc32(data), len(data), 0) for name, data in (others or {}).items()]
    data, crc, size = _deflate(b"", BOMB)
    entries.append((member, data, crc, size, 8))
    body, central = bytearray(), bytearray()
    for name, payload, crc, size, method in entries:
        raw = name.encode()
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc, len(payload), size,
                               len(raw), 0, 0, 0, 0, 0, len(body)) + raw
        body += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(payload), size, len(raw), 0)
        body += raw + payload
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central), len(body), 0)
    path.write_bytes(bytes(body + central + eocd))
    return path


def _check_refused(res: dict, where: Path, *expected: str) -> None:
    assert res["rc"] == 2, res
    assert str(where) in res["msg"] and all(e in res["msg"] for e in expected), res["msg"]
    assert res["rss"] - res["base"] < MAX_GROWTH, f"peak RSS {res['rss'] / 2**20:.0f} MiB after imports " \
                                                  f"{res['base'] / 2**20:.0f} MiB"
    assert res["seconds"] < MAX_SECONDS, res
    assert res["left"] == [], res["left"]


def test_megatron_lm_zip_with_a_bomb_member(tmp_path):
    bomb = _zip_with_bomb(tmp_path / "ckpt.zip", "release/mp_rank_00/model_optim_rng.pt",
                          {"latest_checkpointed_iteration.txt": b"release\n"})
    out = tmp_path / "out"
    res = _cli(tmp_path, "import", "megatron-lm", "--checkpoint", str(bomb), "--out", str(out))
    _check_refused(res, bomb, "release/mp_rank_00/model_optim_rng.pt", "zip bomb")
    assert not out.exists()
    print(f"zip bomb refused in {res['seconds']:.2f} s, peak RSS {res['rss'] / 2**20:.0f} MiB")


def test_torch_zip_file_with_a_bomb_record(tmp_path):
    """A zip-format torch file (what torch.save writes) whose tensor record inflates to 2 GiB, as a Megatron-LM
    single-file checkpoint."""
    pt = _zip_with_bomb(tmp_path / "model_optim_rng.pt", "archive/data/0", {"archive/data.pkl": b"\x80\x02}q\x00."})
    res = _cli(tmp_path, "import", "megatron-lm", "--checkpoint", str(pt), "--out", str(tmp_path / "out"))
    _check_refused(res, pt, "archive/data/0")
    assert not (tmp_path / "out").exists()


def test_hf_pytorch_model_bin_with_a_bomb_record(tmp_path):
    """``pytorch_model.bin`` is a torch zip file too; the bound comes from config.json's shape."""
    from reliability.test_outputs import make_hf_folder

    hf = make_hf_folder(tmp_path / "hf")
    (hf / "model.safetensors").unlink()
    _zip_with_bomb(hf / "pytorch_model.bin", "archive/data/0", {"archive/data.pkl": b"\x80\x02}q\x00."})
    before = tree_digest(hf)
    res = _cli(tmp_path, "import", "hf", "--model", str(hf), "--out", str(tmp_path / "out"))
    _check_refused(res, hf / "pytorch_model.bin", "archive/data/0")
    assert not (tmp_path / "out").exists() and tree_digest(hf) == before


def test_hf_pytorch_model_bin_within_its_bound_imports(tmp_path):
    """The control: a real ``pytorch_model.bin`` (torch.save of the folder's weights) is within the bound its
    config.json gives, and imports and verifies."""
    import torch
    from safetensors.torch import load_file

    from reliability.test_outputs import make_hf_folder

    hf = make_hf_folder(tmp_path / "hf")
    torch.save(load_file(str(hf / "model.safetensors")), hf / "pytorch_model.bin")
    (hf / "model.safetensors").unlink()
    res = _cli(tmp_path, "import", "hf", "--model", str(hf), "--out", str(tmp_path / "out"), "--verify")
    assert res["rc"] == 0 and (tmp_path / "out" / "checksums.json").is_file(), res


NEMO_CONFIG = b"hidden_size: 64\nnum_layers: 2\nffn_hidden_size: 256\nnum_attention_heads: 4\n" \
              b"max_position_embeddings: 128\n"


def _nemo(path: Path, mode: str, weights: tarfile.TarInfo, data: bytes | None) -> Path:
    """A ``.nemo`` holding model_config.yaml and ``weights``: its data is ``data`` when given (already compressed
    into the stream by the caller's mode), else the header alone."""
    with tarfile.open(path, mode) as tar:
        cfg = tarfile.TarInfo("./model_config.yaml")
        cfg.size = len(NEMO_CONFIG)
        tar.addfile(cfg, BytesIO(NEMO_CONFIG))
        if data is None:
            tar.fileobj.write(weights.tobuf(tarfile.GNU_FORMAT))  # a header that declares more than follows
        else:
            tar.addfile(weights, BytesIO(data))
    return path


def test_nemo_tar_member_declaring_a_terabyte(tmp_path):
    info = tarfile.TarInfo("./model_weights.ckpt")
    info.size = 1 << 40
    nemo = _nemo(tmp_path / "huge.nemo", "w:", info, None)
    res = _cli(tmp_path, "import", "nemo", "--model", str(nemo), "--out", str(tmp_path / "out"))
    _check_refused(res, nemo, "model_weights.ckpt", f"declares {1 << 40} bytes", "what this model's shape can take")
    assert not (tmp_path / "out").exists()


def test_nemo_gz_member_inflating_to_gigabytes(tmp_path):
    """NeMo 1.x wrote ``w:gz``: a member of 2 GiB zeros is a few MB on disk. The bound comes from the archive's
    own config (hidden 64, 2 layers: a few hundred MB even with the largest vocabulary), so it is refused after the
    headers are read, before anything is unpacked."""
    import gzip

    info = tarfile.TarInfo("./model_weights.ckpt")
    info.size = BOMB
    header = tarfile.TarInfo("./model_config.yaml")
    header.size = len(NEMO_CONFIG)
    raw = header.tobuf(tarfile.GNU_FORMAT) + NEMO_CONFIG + bytes(-len(NEMO_CONFIG) % 512) \
        + info.tobuf(tarfile.GNU_FORMAT)
    stream, crc, size = _deflate(raw, BOMB, bytes(1024))  # 1024 zero bytes: the two blocks that end a tar
    nemo = tmp_path / "bomb.nemo"
    nemo.write_bytes(gzip.compress(b"")[:10] + stream + struct.pack("<II", crc, size & 0xFFFFFFFF))
    with tarfile.open(nemo, "r:gz") as tar:  # a valid archive: the first headers read as they should
        assert tar.next().name == "./model_config.yaml"
    res = _cli(tmp_path, "import", "nemo", "--model", str(nemo), "--out", str(tmp_path / "out"))
    _check_refused(res, nemo, "model_weights.ckpt", f"declares {BOMB} bytes", "what this model's shape can take")
    assert not (tmp_path / "out").exists()
    print(f".nemo gz bomb refused in {res['seconds']:.2f} s, peak RSS {res['rss'] / 2**20:.0f} MiB")


def test_archive_limit_is_configurable(tmp_path, monkeypatch):
    """BIO_MEGATRON_ARCHIVE_LIMIT bounds every archive (here below a real member's size: refused naming it); a
    value that is not a size is one line naming the variable."""
    from bio_megatron.formats.archives import archive_limit, check_zip
    from bio_megatron.utils.errors import CheckpointError

    zpath = tmp_path / "small.zip"
    import zipfile

    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("a.bin", os.urandom(4096))
    monkeypatch.setenv("BIO_MEGATRON_ARCHIVE_LIMIT", "1K")
    assert archive_limit() == 1024
    with pytest.raises(CheckpointError, match="member 'a.bin' declares 4.0 KiB unpacked, more than the cap"):
        check_zip(zpath, str(zpath))
    monkeypatch.setenv("BIO_MEGATRON_ARCHIVE_LIMIT", "lots")
    with pytest.raises(CheckpointError, match="BIO_MEGATRON_ARCHIVE_LIMIT='lots'"):
        archive_limit()


def test_too_many_members(tmp_path):
    """A zip whose end record declares 65,535 members (none of them there: nothing is parsed before the count is
    checked) and a w:gz .nemo of 20,001 empty files are refused on their count."""
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFE, 0xFFFE, 0, 0, 0)
    zpath = tmp_path / "ckpt.zip"
    zpath.write_bytes(b"PK\x03\x04" + bytes(26) + eocd)
    res = _cli(tmp_path, "import", "megatron-lm", "--checkpoint", str(zpath), "--out", str(tmp_path / "out"))
    _check_refused(res, zpath, "declares 65534 members, more than 20000")

    nemo = tmp_path / "many.nemo"
    with tarfile.open(nemo, "w:gz") as tar:
        for i in range(20_001):
            tar.addfile(tarfile.TarInfo(f"./f{i}"))
    res = _cli(tmp_path, "import", "nemo", "--model", str(nemo), "--out", str(tmp_path / "out"))
    _check_refused(res, nemo, "more than 20000 members")
    assert not (tmp_path / "out").exists()
