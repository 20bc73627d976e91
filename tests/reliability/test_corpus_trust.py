"""Issue 21, the corpus side: ``data tokenize`` never touches what it did not write, records the vocabulary that
pretraining then checks, verifies reused shards, stops on a vocabulary that turns the text into [UNK]; odd inputs
(FIFO, symlink loop, full disk, odd PubMed ids, a 5 MB line, inconsistent BPE files, bad blend weights) are one
line and exit 2. Each case runs the real CLI (in-process, or forked for pretraining) on real files.

Found on main (bb6a95b): a user's ``<prefix>.shards/`` folder was deleted with ``shutil.rmtree`` and a user's
``<prefix>.bin/.idx`` silently replaced; a permuted vocabulary of the same size pretrained on data tokenized with
another; a truncated reused shard went into the output; an all-[UNK] tokenization exited 0; a FIFO or a symlink
loop was "not found"; a full disk, a 40-digit PMID, a bad merges.txt and a 5 MB line were tracebacks; negative
blend weights were accepted.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from reliability.cli_log import run_cli
from reliability.files import tree_digest
from bio_megatron.corpus.pubmed import extract_pubmed
from bio_megatron.corpus.samples import sample_files
from bio_megatron.corpus.tokenize import tokenize_corpus
from bio_megatron.vocab.builtin import resolve_vocab

VOCAB = "bert-base-cased"
pytestmark = pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning")


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory) -> Path:
    """Our schema, from the bundled real PubMed sample."""
    out = tmp_path_factory.mktemp("trust") / "pubmed.jsonl"
    extract_pubmed(sample_files()["pubmed"], out)
    return out


def _tokenize(inp: Path, prefix: Path, *extra: str, level: int = logging.ERROR) -> tuple[int, str]:
    return run_cli(["data", "tokenize", "--input", str(inp), "--vocab", VOCAB, "--output-prefix", str(prefix),
                    "--workers", "1", *extra], level=level)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- 1. never touch what we did not write ----------------------------------------------------------------------

def test_users_shards_folder_survives(tmp_path, jsonl):
    prefix = tmp_path / "corpus"
    shards = Path(f"{prefix}.shards")
    shards.mkdir()
    (shards / "my_notes.txt").write_text("a week of hand-made annotations\n")
    (shards / "data.bin").write_bytes(os.urandom(4096))
    before = tree_digest(tmp_path)
    rc, msg = _tokenize(jsonl, prefix)
    assert rc == 2 and str(shards) in msg and "not written by" in msg and "--overwrite" in msg, msg
    assert tree_digest(tmp_path) == before
    assert not Path(f"{prefix}.bin").exists()

    user = tree_digest(shards)
    rc, msg = _tokenize(jsonl, prefix, "--overwrite", "--shard-lines", "20")
    assert rc == 0, msg
    assert tree_digest(shards) == user  # the user's files, byte for byte, and none of our shards left beside them
    assert Path(f"{prefix}.bin").stat().st_size > 0


def test_our_shard_names_in_a_users_folder_are_never_replaced(tmp_path, jsonl):
    prefix = tmp_path / "corpus"
    shards = Path(f"{prefix}.shards")
    shards.mkdir()
    (shards / "shard-000000.bin").write_bytes(b"the user's own file with our name")
    before = tree_digest(tmp_path)
    rc, msg = _tokenize(jsonl, prefix, "--overwrite")
    assert rc == 2 and "shard-000000.bin" in msg, msg
    assert tree_digest(tmp_path) == before


def test_users_bin_idx_survive_unless_overwrite(tmp_path, jsonl):
    prefix = tmp_path / "corpus"
    for ext in (".bin", ".idx"):
        Path(f"{prefix}{ext}").write_bytes(os.urandom(1000))
    before = tree_digest(tmp_path)
    rc, msg = _tokenize(jsonl, prefix)
    assert rc == 2 and f"{prefix}.bin" in msg and "not written by" in msg and "--overwrite" in msg, msg
    assert tree_digest(tmp_path) == before

    rc, msg = _tokenize(jsonl, prefix, "--overwrite")
    assert rc == 0, msg
    rec = json.loads(Path(f"{prefix}.bio_megatron.json").read_text())
    assert rec["bin"]["bytes"] == Path(f"{prefix}.bin").stat().st_size
    assert rec["vocab"]["sha256"] == _sha(resolve_vocab(VOCAB)) and rec["vocab"]["lowercase"] is False
    assert rec["vocab"]["kind"] == "wordpiece"

    first = _sha(Path(f"{prefix}.bin"))
    rc, msg = _tokenize(jsonl, prefix)  # our own earlier output: replaced without --overwrite
    assert rc == 0, msg
    assert _sha(Path(f"{prefix}.bin")) == first

    Path(f"{prefix}.idx").write_bytes(Path(f"{prefix}.idx").read_bytes()[:-8])  # no longer what we wrote
    before = tree_digest(tmp_path)
    rc, msg = _tokenize(jsonl, prefix)
    assert rc == 2 and "not written by" in msg, msg
    assert tree_digest(tmp_path) == before


# --- 2. nothing unverified is used -----------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_reused_shard_is_redone(tmp_path, jsonl, damage):
    whole = tmp_path / "whole"
    tokenize_corpus([jsonl], resolve_vocab(VOCAB), whole, workers=1, shard_lines=20)
    prefix = tmp_path / "resumed"
    s = tokenize_corpus([jsonl], resolve_vocab(VOCAB), prefix, workers=1, shard_lines=20, keep_shards=True)
    assert s["shards"] >= 3
    # As if interrupted before the final write: the shards are there, the output is not.
    for ext in (".bin", ".idx", ".bio_megatron.json"):
        Path(f"{prefix}{ext}").unlink()
    shard = Path(f"{prefix}.shards") / "shard-000001.bin"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2] if damage == "truncate" else data[:10] + bytes([data[10] ^ 1]) + data[11:])
    rc, msg = _tokenize(jsonl, prefix, "--shard-lines", "20", level=logging.WARNING)
    assert rc == 0, msg
    assert "redoing shard 1" in msg, msg
    assert "redoing shard 0" not in msg and "redoing shard 2" not in msg  # the intact ones were reused
    for ext in (".bin", ".idx"):
        assert _sha(Path(f"{prefix}{ext}")) == _sha(Path(f"{whole}{ext}"))


def test_all_unk_vocabulary_stops_with_the_rate(tmp_path, jsonl):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "of", "."]) + "\n")
    prefix = tmp_path / "corpus"
    argv = ["data", "tokenize", "--input", str(jsonl), "--vocab", str(vocab), "--output-prefix", str(prefix),
            "--workers", "1"]
    rc, msg = run_cli(argv)
    assert rc == 2 and "of the tokens are [UNK]" in msg and "--max-unk-rate 0.05" in msg, msg
    rate = float(msg.split("% of the tokens")[0].rsplit(" ", 1)[-1].split(":")[-1])
    assert rate > 50 and "e.g. '" in msg and str(vocab) in msg, msg
    assert not Path(f"{prefix}.bin").exists() and not Path(f"{prefix}.idx").exists()
    rc, msg = run_cli([*argv, "--max-unk-rate", "1"])  # the user's explicit choice: accepted, rate reported
    assert rc == 0, msg
    assert json.loads(Path(f"{prefix}.bio_megatron.json").read_text())["unknown_rate"] > 0.5


def test_fine_tuning_text_with_unknown_tokens_warns_or_stops(tmp_path, jsonl):
    """Above 5% unknown tokens the encoding warns; when most of the text is unknown it stops with the rate."""
    from bio_megatron.utils.errors import DataError
    from bio_megatron.vocab.bpe import load_tokenizer
    from reliability.cli_log import project_records

    sentences = [s for line in jsonl.read_text().splitlines() for s in json.loads(line)["sentences"]][:200]
    # ~20% of the words are a character no BERT vocabulary has: enough to warn, not to stop
    partly = [s + " " + " ".join(["\U0001F9EC"] * max(1, len(s.split()) // 4)) for s in sentences]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "of", "."]) + "\n")
    for path, texts, outcome in ((vocab, sentences, "stop"), (resolve_vocab(VOCAB), partly, "warn"),
                                 (resolve_vocab(VOCAB), sentences, "quiet")):
        tok = load_tokenizer(path)
        for encode, arg in ((tok.encode_words, [s.split() for s in texts]), (tok.encode_texts, texts),
                            (tok.tokenize_batch, texts)):
            if outcome == "stop":
                with pytest.raises(DataError, match=r"% of the \d+ tokens .* are the unknown token") as err:
                    encode(arg)
                assert str(vocab) in str(err.value)
                continue
            with project_records(logging.WARNING) as records:
                encode(arg)
            hits = [r.getMessage() for r in records if "are the unknown token" in r.getMessage()]
            assert bool(hits) is (outcome == "warn"), (path, encode.__name__, hits)


# --- 3. one line and exit 2 ------------------------------------------------------------------------------------

def _odd_input(kind: str, where: Path) -> Path:
    if kind == "fifo":
        os.mkfifo(where / "pipe")
        return where / "pipe"
    os.symlink("loop", where / "loop")  # a link to itself
    return where / "loop"


def _argv(command: str, inp: Path, out: Path, jsonl: Path) -> list[str]:
    if command == "tokenize":
        return ["data", "tokenize", "--input", str(inp), "--vocab", VOCAB, "--output-prefix", str(out), "--workers", "1"]
    if command == "vocab":
        return ["data", "tokenize", "--input", str(jsonl), "--vocab", str(inp), "--output-prefix", str(out)]
    if command == "vocab-train":
        return ["vocab", "train", "--input", str(inp), "--output", str(out), "--size", "200"]
    return ["data", command, "--input", str(inp), "--output", str(out), "--workers", "1"]


@pytest.mark.parametrize("kind,what", [("fifo", "FIFO (named pipe)"), ("loop", "symbolic link loop")])
@pytest.mark.parametrize("command", ["tokenize", "vocab", "pubmed", "pmc", "vocab-train"])
def test_fifo_and_symlink_loop_are_named(tmp_path, jsonl, kind, what, command):
    inp = _odd_input(kind, tmp_path)
    before = set(os.listdir(tmp_path))
    t0 = time.perf_counter()
    rc, msg = run_cli(_argv(command, inp, tmp_path / "out", jsonl))
    assert time.perf_counter() - t0 < 30
    assert rc == 2 and str(inp) in msg and what in msg, msg
    assert set(os.listdir(tmp_path)) == before


def _as_nobody(argv: list[str]) -> tuple[int, str]:
    """Forked child: drop to user 'nobody' (root reads any file), then run the CLI in-process."""
    os.setgid(65534)
    os.setuid(65534)
    return run_cli(argv)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the command as another user")
@pytest.mark.parametrize("command", ["tokenize", "vocab", "pubmed", "pmc", "vocab-train"])
def test_unreadable_input_is_permission_denied(jsonl, command, tmp_path):
    from harness import run_world

    d = Path(__import__("tempfile").mkdtemp(prefix="bm_unreadable_"))  # a folder 'nobody' may write into
    try:
        os.chmod(d, 0o777)
        src = {"tokenize": jsonl, "vocab": resolve_vocab(VOCAB), "pubmed": sample_files()["pubmed"][0],
               "pmc": sample_files()["pmc"][0], "vocab-train": jsonl}[command]
        inp, readable = d / f"unreadable_{src.name}", d / "readable.jsonl"
        shutil.copyfile(src, inp)
        shutil.copyfile(jsonl, readable)
        os.chmod(inp, 0o000)
        os.chmod(readable, 0o644)
        ((rc, msg),) = run_world(1, _as_nobody, _argv(command, inp, d / "out", readable))
        assert rc == 2 and "permission denied" in msg and str(inp) in msg, msg
        if command in ("tokenize", "vocab"):  # a folder on the way that 'nobody' may not enter: one line too
            os.chmod(d, 0o700)
            ((rc, msg),) = run_world(1, _as_nobody, _argv(command, inp, tmp_path / "out", readable))
            assert rc == 2 and "permission denied" in msg, msg
            os.chmod(d, 0o777)
        assert sorted(os.listdir(d)) == sorted([inp.name, readable.name])
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture()
def small_disk(tmp_path):
    """A 2 MiB tmpfs, mostly filled, for disk-full runs; skipped where this machine cannot mount one."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _fill(disk: Path, leave: int) -> None:
    st = os.statvfs(disk)
    (disk / "filler").write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))


@pytest.mark.parametrize("command", ["tokenize", "pubmed", "pmc"])
def test_disk_full_is_one_line_and_leaves_no_temporaries(small_disk, tmp_path, jsonl, command):
    big = tmp_path / "big.jsonl"
    big.write_bytes(jsonl.read_bytes() * 3)
    inputs = {"tokenize": big, "pubmed": sample_files()["pubmed"][0], "pmc": sample_files()["pmc"][0]}
    _fill(small_disk, 8 * 1024)
    out = small_disk / ("corpus" if command == "tokenize" else "out.jsonl")
    rc, msg = run_cli(_argv(command, inputs[command], out, jsonl))
    assert rc == 2 and f"no space left on {small_disk}" in msg, msg
    left = [p.name for p in small_disk.rglob("*") if p.name != "filler"]
    assert not [n for n in left if "tmp" in n or n.endswith((".bin", ".idx", ".jsonl", ".lock"))], left


def test_odd_pubmed_ids_are_skipped_and_counted(tmp_path):
    def art(pmid: str, version: str = "1") -> str:
        return (f'<PubmedArticle><MedlineCitation><PMID Version="{version}">{pmid}</PMID><Article><ArticleTitle>'
                "Title.</ArticleTitle><Abstract><AbstractText>Aspirin lowers fever.</AbstractText></Abstract>"
                "</Article></MedlineCitation></PubmedArticle>")
    odd = ["abc", "", "123456789012345678901234567890", "\u00b2", "-5", "0", "\u0661\u0662"]
    xml = tmp_path / "odd.xml"
    body = "".join(art(p) for p in odd) + art("42", version="x") + art("7")
    xml.write_text(f"<PubmedArticleSet>{body}<DeleteCitation><PMID>99999999999999999999999</PMID></DeleteCitation>"
                   "</PubmedArticleSet>", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    from bio_megatron.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(_argv("pubmed", xml, out, xml))
    assert rc == 0
    stats = json.loads(buf.getvalue())
    assert stats["documents"] == 1 and stats["skipped_records"] == len(odd) + 2, stats
    assert any("not a positive decimal number" in p for p in stats["problems"]), stats
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["PMID:7"]


def test_five_megabyte_line_and_pathological_texts_split_fast(tmp_path):
    from bio_megatron.corpus.sentences import split_sentences

    for bad in ("a. " * 30_000, "a." * 100_000, "1" * 1_000_000, "x" + " " * 1_000_000 + "y.", "." * 500_000,
                "E. coli " * 20_000):
        t0 = time.perf_counter()
        assert "".join(split_sentences(bad)).replace(" ", "") == bad.replace(" ", "")  # nothing lost or added
        assert time.perf_counter() - t0 < 30, bad[:20]
    # One 5 MB line of Megatron-LM JSONL through the CLI: split (linear time, windows) and tokenized, not a
    # TimeoutError from NLTK's regular-expression guard.
    sentence = "Protein binds DNA. "
    text = sentence * (5_000_000 // len(sentence))
    inp = tmp_path / "long.jsonl"
    inp.write_text(json.dumps({"text": text}) + "\n")
    buf = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        rc, msg = run_cli(["data", "tokenize", "--input", str(inp), "--vocab", VOCAB, "--output-prefix",
                           str(tmp_path / "long"), "--workers", "1", "--json-keys", "text"])
    assert rc == 0, msg
    assert json.loads(buf.getvalue())["sentences"] == text.count(". ") and time.perf_counter() - t0 < 120


def _bpe_folder(tmp_path: Path, jsonl: Path) -> Path:
    from bio_megatron.vocab.bpe import train_bpe

    text = tmp_path / "text.txt"
    text.write_text("\n".join(s for line in jsonl.read_text().splitlines() for s in json.loads(line)["sentences"]))
    folder = tmp_path / "bpe"
    folder.mkdir()
    train_bpe([text], folder, size=600)
    (folder / "tokenizer.json").unlink()
    return folder


@pytest.mark.parametrize("damage,expect", [
    ("unknown_merge", "not in vocab.json"), ("three_parts", "expected two tokens"),
    ("dropped_token", "not in vocab.json")])
def test_inconsistent_bpe_files_are_one_line(tmp_path, jsonl, damage, expect):
    folder = _bpe_folder(tmp_path, jsonl)
    merges = folder / "merges.txt"
    lines = merges.read_text(encoding="utf-8").split("\n")
    if damage == "unknown_merge":
        lines.insert(3, "Ġzqx qzx")
    elif damage == "three_parts":
        lines.insert(3, "a b c")
    else:  # the result of a merge removed from vocab.json (ids re-packed so that the ids stay 0..N-1)
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        a, b = lines[5].split(" ")
        del vocab[a + b]
        vocab = {t: i for i, t in enumerate(sorted(vocab, key=vocab.get))}
        (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    merges.write_text("\n".join(lines), encoding="utf-8")
    before = tree_digest(tmp_path)
    rc, msg = run_cli(["data", "tokenize", "--input", str(jsonl), "--vocab", str(folder), "--output-prefix",
                       str(tmp_path / "out"), "--workers", "1"])
    assert rc == 2 and expect in msg and "merges.txt:" in msg, msg
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("prefix,value", [("[-1,A,2,B]", "-1"), ("[0,A,0,B]", "sum to 0"), ("[abc,A,1,B]", "'abc'"),
                                          ("[.nan,A,1,B]", "nan")])
def test_bad_blend_weights_are_a_config_error(tmp_path, prefix, value):
    from engine.pretrain_runs import TINY

    dp = prefix.replace("A", str(tmp_path / "a")).replace("B", str(tmp_path / "b"))
    rc, msg = run_cli(["pretrain", "--config", str(TINY), f"model.data.data_prefix={dp}",
                       f"exp_manager.exp_dir={tmp_path}", "--dry-run"])
    assert rc == 2 and "model.data.data_prefix" in msg and value in msg, msg


# --- the vocabulary recorded by data tokenize, checked by pretraining ------------------------------------------

def _pretrain_cli(argv: list[str]) -> tuple[int, str]:
    """Forked rank: the real CLI, its project log kept."""
    return run_cli(argv, level=logging.ERROR, sep="\n")


def _permuted_vocab(tmp_path: Path) -> Path:
    vocab = tmp_path / "vocab.txt"
    tokens = resolve_vocab("bert_base_uncased").read_text(encoding="utf-8").split("\n")
    i, j = tokens.index("the"), tokens.index("of")
    tokens[i], tokens[j] = tokens[j], tokens[i]
    vocab.write_text("\n".join(tokens), encoding="utf-8")
    assert vocab.stat().st_size == resolve_vocab("bert_base_uncased").stat().st_size
    return vocab


def test_pretraining_refuses_data_tokenized_with_another_vocabulary(tmp_path, pubmed_prefix):
    from harness import run_world
    from engine.pretrain_runs import TINY, overrides

    vocab = _permuted_vocab(tmp_path)  # same size, same ids in range: only the content differs
    argv = ["pretrain", "--config", str(TINY),
            *overrides(pubmed_prefix, tmp_path, "x", extra=(f"model.tokenizer.vocab_file={vocab}",))]
    ((rc, msg),) = run_world(1, _pretrain_cli, argv)
    assert rc == 2 and msg and "\n" not in msg, msg  # one line: the refusal, naming both vocabularies and the fix
    ours = hashlib.sha256(vocab.read_bytes()).hexdigest()[:16]
    theirs = _sha(resolve_vocab("bert_base_uncased"))[:16]
    assert f"{pubmed_prefix}.bio_megatron.json" in msg and ours in msg and theirs in msg, msg
    assert str(vocab) in msg and "model.data.skip_vocab_check=true" in msg and "re-tokenize" in msg, msg
    assert not (tmp_path / "x" / "checkpoints").exists()


def test_vocab_check_override_and_data_without_record(tmp_path, pubmed_prefix):
    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.data.pretrain import check_prefixes, load_tokenizer
    from bio_megatron.utils.errors import DataError
    from reliability.cli_log import project_records
    from engine.pretrain_runs import TINY, overrides

    vocab = _permuted_vocab(tmp_path)
    cfg = load_pretrain_config(TINY, overrides(pubmed_prefix, tmp_path, "x",
                                               extra=(f"model.tokenizer.vocab_file={vocab}",)))
    tok = load_tokenizer(cfg)
    with pytest.raises(DataError, match="skip_vocab_check"):
        check_prefixes(cfg, tok.vocab_size, tok)
    cfg.model.data.skip_vocab_check = True
    with project_records(logging.WARNING) as records:
        check_prefixes(cfg, tok.vocab_size, tok)  # the user's explicit override: a warning, no error
    assert any("skip_vocab_check=true" in r.getMessage() for r in records)
    # Megatron-LM's own preprocess_data.py output (no record): loads, with a warning that nothing was checked.
    bare = tmp_path / "bare"
    for ext in (".bin", ".idx"):
        shutil.copyfile(f"{pubmed_prefix}{ext}", f"{bare}{ext}")
    cfg = load_pretrain_config(TINY, overrides(bare, tmp_path, "x", extra=(f"model.tokenizer.vocab_file={vocab}",)))
    with project_records(logging.WARNING) as records:
        check_prefixes(cfg, tok.vocab_size, tok)
    assert any("no record of the vocabulary" in r.getMessage() for r in records)
    with pytest.raises(Exception, match="skip_vocab_check"):
        load_pretrain_config(TINY, overrides(bare, tmp_path, "x", extra=("model.data.skip_vocab_check=maybe",)))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the command as another user")
@pytest.mark.parametrize("command", ["vocab-train", "pubmed"])
def test_output_behind_a_closed_folder_is_one_line(jsonl, command):
    """An output whose folder on the way cannot be entered: pathlib raised PermissionError (a traceback)."""
    from harness import run_world

    d = Path(__import__("tempfile").mkdtemp(prefix="bm_closed_"))
    try:
        os.chmod(d, 0o755)
        readable = d / "readable.jsonl"
        shutil.copyfile({"vocab-train": jsonl, "pubmed": sample_files()["pubmed"][0]}[command], readable)
        os.chmod(readable, 0o644)
        closed = d / "closed"
        closed.mkdir(mode=0o700)
        ((rc, msg),) = run_world(1, _as_nobody, _argv(command, readable, closed / "sub" / "out.txt", readable))
        assert rc == 2 and "Permission denied" in msg and str(closed) in msg, msg
        assert os.listdir(closed) == []
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_shard_folder_holding_only_our_manifest_temporary_is_reused(tmp_path):
    """A tokenize run SIGKILLed between making ``<prefix>.shards/`` and renaming its manifest into place left the
    folder with only ``manifest.json.tmp-<pid>``: the rerun takes the folder as ours (it refused it as foreign, so a
    killed run blocked its own rerun: tests/reliability/test_locks.py::test_a_killed_holder_does_not_block_a_rerun
    failed that way in CI). A folder that also holds a file we did not write is still refused, and that file kept."""
    from bio_megatron.corpus import shards
    from bio_megatron.utils.errors import OutputError

    manifest = {"vocab_sha256": "0" * 64, "shard_lines": 1000}
    work = tmp_path / "p.shards"
    work.mkdir()
    (work / "manifest.json.tmp-4242").write_text("{\"vocab_sha", encoding="utf-8")
    shards.prepare(work, manifest, resume=True, overwrite=False)
    assert sorted(p.name for p in work.iterdir()) == ["manifest.json"]
    other = tmp_path / "q.shards"
    other.mkdir()
    (other / "manifest.json.tmp-4242").write_text("{", encoding="utf-8")
    (other / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(OutputError, match="not written by `bio-megatron data tokenize`"):
        shards.prepare(other, manifest, resume=True, overwrite=False)
    assert (other / "notes.txt").read_text(encoding="utf-8") == "mine"
