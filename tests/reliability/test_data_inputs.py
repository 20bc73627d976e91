"""Data commands never report success on input they could not use, and never trace back on a bad output path.

Found on main before issue 11: ``data tokenize`` on Megatron-LM ``{"text": ...}`` JSONL (or any JSONL
without ``sentences``) wrote a 0-byte ``.bin`` and exited 0; ``data pmc`` on an article without body
text wrote an empty JSONL and exited 0; an output prefix under a regular file raised a traceback.
Each case runs the real CLI on real files and checks the exit code, the message (file:line and what
was expected), that nothing that looks finished is left, and that pre-existing files are untouched.
The Megatron-LM convention itself (``--json-keys``) is checked against our own pipeline's bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reliability.readonly import REFUSED, read_only_dir

from reliability.cli_log import run_cli
from reliability.files import tree_digest
from bio_megatron.corpus.pubmed import extract_pubmed
from bio_megatron.corpus.samples import sample_files
from bio_megatron.corpus.sentences import split_sentences

VOCAB = "bert-base-cased"


def _refused(root: Path, argv: list[str]) -> str:
    """``bio-megatron argv`` must exit 2 and leave every file under ``root`` as it was; its ERROR message."""
    before = tree_digest(root)
    rc, msg = run_cli(argv)
    assert rc == 2, (rc, msg)
    assert tree_digest(root) == before
    return msg


@pytest.fixture(scope="module")
def pubmed_jsonl(tmp_path_factory) -> Path:
    """Our schema, from the bundled real PubMed sample."""
    out = tmp_path_factory.mktemp("pm") / "pubmed.jsonl"
    extract_pubmed(sample_files()["pubmed"], out)
    return out


def _tokenize_args(inp: Path | list[Path], prefix: Path, *extra: str) -> list[str]:
    inputs = [str(p) for p in (inp if isinstance(inp, list) else [inp])]
    return ["data", "tokenize", "--input", *inputs, "--vocab", VOCAB, "--output-prefix", str(prefix), "--workers", "1",
            *extra]


def _tokenize(inp: Path | list[Path], prefix: Path, *extra: str) -> tuple[int, str]:
    return run_cli(_tokenize_args(inp, prefix, *extra))


def _assert_nothing_finished(prefix: Path) -> None:
    for suffix in (".bin", ".idx", ".shards", ".lock"):
        assert not Path(f"{prefix}{suffix}").exists(), f"{prefix}{suffix} left behind"
    assert not list(prefix.parent.glob(f"{prefix.name}.tmp-*"))


@pytest.mark.parametrize("case", ["megatron_text", "no_sentences"])
def test_tokenize_without_a_usable_record_fails(tmp_path, pubmed_jsonl, case):
    docs = [json.loads(line) for line in pubmed_jsonl.read_text().splitlines()][:5]
    bad = tmp_path / "in.jsonl"
    if case == "megatron_text":  # what Megatron-LM's tools/preprocess_data.py reads
        bad.write_text("".join(json.dumps({"text": " ".join(d["sentences"])}) + "\n" for d in docs))
        expect = 'no \'sentences\' list; this looks like Megatron-LM {"text": ...} JSONL: read it with --json-keys text'
    else:
        bad.write_text("".join(json.dumps({"id": d["id"], "source": "pubmed"}) + "\n" for d in docs))
        expect = "field 'sentences' must be a list of strings"
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier.bin").write_bytes(b"an unrelated earlier output")
    msg = _refused(tmp_path, _tokenize_args(bad, out / "p"))
    assert f"{bad}:1: {expect}" in msg and "no usable document in 5 non-blank line(s)" in msg
    assert "expected JSON objects with 'id', 'source'" in msg
    _assert_nothing_finished(out / "p")


def test_tokenize_failure_keeps_an_earlier_good_output(tmp_path, pubmed_jsonl):
    prefix = tmp_path / "p"
    assert _tokenize(pubmed_jsonl, prefix)[0] == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "y", "sentences": \n\n{"id": "z", "source": "web", "sentences": []}\n')
    msg = _refused(tmp_path, _tokenize_args(bad, prefix))  # the earlier .bin/.idx are still the earlier ones
    assert f"{bad}:1: not valid JSON" in msg and f"{bad}:3: field 'source' must be one of" in msg
    assert not Path(f"{prefix}.shards").exists() and not Path(f"{prefix}.lock").exists()


def test_json_keys_equals_our_pipeline_on_the_same_sentences(tmp_path, pubmed_jsonl):
    ours, megatron = tmp_path / "ours.jsonl", tmp_path / "megatron.jsonl"
    with open(ours, "w") as fo, open(megatron, "w") as fm:
        for line in pubmed_jsonl.read_text().splitlines():
            d = json.loads(line)
            n_title = len(split_sentences(d["title"]))
            text = " ".join(d["sentences"][n_title:])
            # our schema holds exactly the sentences the splitter makes of title, then text
            sents = split_sentences(d["title"]) + split_sentences(text)
            fo.write(json.dumps({"id": d["id"], "source": "pubmed", "sentences": sents}) + "\n")
            fm.write(json.dumps({"title": d["title"], "text": text, "meta": 1}) + "\n")
    assert _tokenize(ours, tmp_path / "ours")[0] == 0
    assert _tokenize(megatron, tmp_path / "mtitle", "--json-keys", "title", "text")[0] == 0
    for ext in (".bin", ".idx"):
        assert Path(f"{tmp_path}/mtitle{ext}").read_bytes() == Path(f"{tmp_path}/ours{ext}").read_bytes()
    # text only: a different document (no title sentences), so the bytes must differ
    assert _tokenize(megatron, tmp_path / "mtext", "--json-keys", "text")[0] == 0
    assert Path(f"{tmp_path}/mtext.bin").read_bytes() != Path(f"{tmp_path}/ours.bin").read_bytes()


def test_json_keys_missing_everywhere_names_the_key(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"text": "Aspirin inhibits platelets."}\n{"body": "x"}\n')
    rc, msg = _tokenize(inp, tmp_path / "p", "--json-keys", "title", "text")
    assert rc == 2
    assert f"{inp}:1: missing string field(s) 'title' asked by --json-keys (keys: 'text')" in msg
    assert f"{inp}:2: missing string field(s) 'title', 'text'" in msg
    _assert_nothing_finished(tmp_path / "p")


def test_output_prefix_under_a_regular_file(tmp_path, pubmed_jsonl):
    afile = tmp_path / "somefile.txt"
    afile.write_text("not a folder\n")
    msg = _refused(tmp_path, _tokenize_args(pubmed_jsonl, afile / "x"))
    assert f"{afile}/x.lock: cannot create the lock file for output prefix {afile}/x" in msg
    assert f"{afile} is a file, not a folder" in msg


def test_output_prefix_in_a_read_only_folder(tmp_path, pubmed_jsonl):
    with read_only_dir(tmp_path / "ro") as ro:
        rc, msg = _tokenize(pubmed_jsonl, ro / "x")
        assert list(ro.iterdir()) == []
    assert rc == 2 and any(r in msg for r in REFUSED) and f"{ro}/x.lock" in msg, msg


def test_pmc_without_a_usable_article_fails(tmp_path):
    nxml = tmp_path / "a.nxml"
    nxml.write_text('<article><front><article-meta><article-id pub-id-type="pmc">123</article-id>'
                    "<title-group><article-title>Only a title.</article-title></title-group>"
                    "</article-meta></front></article>\n")
    broken = tmp_path / "b.nxml"
    broken.write_text("<article><body><p>cut off")
    out = tmp_path / "pmc.jsonl"
    # no output JSONL, no temporary file, no lock file
    msg = _refused(tmp_path, ["data", "pmc", "--input", str(nxml), str(broken), "--output", str(out), "--workers", "1"])
    assert "no usable PMC article among 2: 1 malformed, 1 without body text" in msg
    assert f"{broken}:1: XML parse error" in msg and "expected JATS articles with <body> paragraphs" in msg


def test_pubmed_without_a_usable_record_fails(tmp_path):
    xml = tmp_path / "pubmed.xml"
    xml.write_text('<PubmedArticleSet><PubmedArticle><MedlineCitation><PMID Version="1">7</PMID><Article>'
                   "<ArticleTitle>A title, no abstract.</ArticleTitle></Article></MedlineCitation>"
                   "</PubmedArticle></PubmedArticleSet>\n")
    out = tmp_path / "out.jsonl"
    out.write_text("an earlier output\n")
    msg = _refused(tmp_path, ["data", "pubmed", "--input", str(xml), "--output", str(out), "--workers", "1"])
    assert f"{xml}: no usable PubMed record: 1 <PubmedArticle> record(s), 1 with an empty abstract" in msg
