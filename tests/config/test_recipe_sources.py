"""Every recipe value says where it comes from (issue 23, item 4; docs/RECIPES.md).

The marks, read line by line from every YAML file under ``nemo_configs/`` (``key: value  # comment``):

- cited: the comment names a paper of ``../shared/papers`` and a place in it, ``paper NNN §x.y`` /
  ``Table n`` / ``App. X``; assumed: the comment says ``assumed``. No value line is both, in any file.
- In the paper recipes (``nemo_configs/pretrain/*.yaml`` but ``_base`` and the ``tiny*`` development
  recipes) every value line carries one of the two, a bare ``# paper`` without number and place is refused,
  and the values that define the training are written in the recipe's own files, not inherited from
  ``_base.yaml``. Exempt: the run's names (``name``, ``exp_manager.*``), ``defaults``, the restore keys and
  ``null`` (a key unset so that another one applies).
- A citation points at a paper that exists and a place in it that exists (a heading, a table caption, an
  appendix); a cited number appears in the cited papers' text in one of its usual spellings (690000 as 690K,
  8192 as 8,192, 1e-6 as "1e - 6", 0.05 as 5%), unless the comment shows it computed (an ``=``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NEMO = ROOT / "nemo_configs"
PAPERS = ROOT.parent / "shared" / "papers"
ALL = sorted(NEMO.rglob("*.yaml"))
PAPER_RECIPES = sorted(p for p in (NEMO / "pretrain").glob("*.yaml")
                       if p.stem != "_base" and not p.stem.startswith("tiny"))
# "paper 000 §3.3", "paper 002 Table 5", "paper 002 App. A", "paper 001 §3, Table 9" (a place list after one paper)
CITE = re.compile(r"\bpaper (\d{3})((?:,? (?:§\s?[\dA-Z][\d.]*\d|§\s?\d|Table \d+|App\. [A-Z](?:\.\d+)?))+)")
PLACE = re.compile(r"§\s?([\dA-Z][\d.]*\d|\d)|Table (\d+)|App\. ([A-Z](?:\.\d+)?)")
BARE_PAPER = re.compile(r"^paper\b(?! \d{3}\b)|\(paper\)", re.I)  # the old unnumbered mark
ASSUMED = re.compile(r"\bassumed\b", re.I)
EXEMPT = re.compile(r"^(name|defaults|exp_manager\..*|model\.restore_from_path|model\.require_restore_from_path)$")
# Values that define the training: written in a paper recipe's own files (not inherited from _base.yaml).
DEFINING = {"trainer.max_steps", "model.size", "model.encoder_seq_length", "model.global_batch_size",
            "model.bert_binary_head", "model.hidden_dropout", "model.tokenizer.vocab_file",
            "model.data.data_prefix", "model.data.masked_lm_prob", "model.optim.name", "model.optim.lr",
            "model.optim.weight_decay", "model.optim.betas", "model.optim.eps", "model.optim.sched.name",
            "model.optim.sched.min_lr"}
_NUMBER = re.compile(r"^[-+]?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?$")


@dataclass(frozen=True)
class ValueLine:
    path: Path
    lineno: int
    key: str
    """Dotted key, from the indentation of the lines above."""
    value: str
    comment: str

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.lineno}: {self.key}: {self.value}  # {self.comment}"


def value_lines(path: Path) -> list[ValueLine]:
    """Every ``key: value`` line of a recipe (mapping headers, comment lines and blank lines skipped)."""
    out, stack = [], []  # (indent, key) of the enclosing mappings
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        code, comment = _split_comment(raw)
        m = re.match(r"^(\s*)([\w.]+):\s*(.*?)\s*$", code)
        if not m:
            continue
        indent, key, value = len(m.group(1)), m.group(2), m.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not value:
            stack.append((indent, key))
            continue
        out.append(ValueLine(path, lineno, ".".join([k for _, k in stack] + [key]), value, comment))
    return out


def _split_comment(line: str) -> tuple[str, str]:
    """Code and comment of a YAML line; a ``#`` inside quotes is not a comment."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1:].strip()
    return line, ""


def _paper_texts() -> dict[str, str]:
    return {p.name[:3]: p.read_text() for p in PAPERS.glob("[0-9][0-9][0-9]_*.txt")}


def _place_exists(text: str, place: re.Match) -> bool:
    section, table, appendix = place.groups()
    if section:  # a heading line: "3.3 BioM-BERT", "#### 5.1 Pretraining", or the number alone on its line
        return re.search(rf"(?m)^[#\s]*{re.escape(section)}(?:\s|$)", text) is not None
    if table:
        return re.search(rf"Table {table}\s*:", text) is not None
    return re.search(rf"(?m)Appendix {re.escape(appendix)}\b|^{re.escape(appendix)}\s", text) is not None


def spellings(number: str) -> list[str]:
    """How a paper may write a recipe's number: 690000 -> 690K, 690k, 690,000; 8192 -> 8,192; 2.0e-4 -> 2e-4,
    2e - 4; 0.05 -> 5%, 0.05; 500000 -> 500K, 5 \\cdot 10^5; 1000000 -> 1M."""
    x = float(number)
    forms = {f"{x:g}"}
    if x == int(x) and abs(x) >= 1:
        n = int(x)
        forms |= {str(n), f"{n:,}"}
        for div, suffixes in ((1_000_000, "M"), (1000, "Kk")):
            if n % (div // 10) == 0 and n >= div:
                forms |= {f"{n / div:g}{s}" for s in suffixes}
        exp = len(str(n)) - len(str(n).rstrip("0"))
        if exp >= 3:
            mant = n // 10**exp
            forms |= {f"{mant} \\cdot 10^{exp}", f"{mant} x 10^{exp}"} | ({f"10^{exp}"} if mant == 1 else set())
    else:
        mant, exp = f"{x:e}".split("e")
        mant, exp = f"{float(mant):g}", int(exp)
        forms |= {f"{mant}e{exp}", f"{mant}e - {-exp}" if exp < 0 else f"{mant}e{exp}", f"{mant}e-0{-exp}"}
        if 0.01 <= x < 1:
            forms |= {f"{x * 100:g}%", f"{x * 100:g} %", f"{x * 100:g}"}
    return sorted(forms)


def _appears(number: str, texts: list[str]) -> bool:
    for form in spellings(number):
        pattern = rf"(?<![\d.,]){re.escape(form)}(?![\d]|\.\d)"
        if any(re.search(pattern, t) for t in texts):
            return True
    return False


def _numbers(value: str) -> list[str]:
    items = [i.strip() for i in value.strip("[]").split(",")] if value.startswith("[") else [value]
    return [i for i in items if _NUMBER.match(i)]


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(NEMO)))
def test_no_value_is_both_cited_and_assumed(path):
    both = [v.where() for v in value_lines(path) if CITE.search(v.comment) and ASSUMED.search(v.comment)]
    assert not both, "cited and `# assumed` on one line (split the value or pick one):\n" + "\n".join(both)


@pytest.mark.parametrize("path", PAPER_RECIPES, ids=lambda p: p.stem)
def test_every_paper_recipe_value_is_cited_or_assumed(path):
    bad = []
    for v in value_lines(path):
        if EXEMPT.match(v.key) or v.value == "null":
            continue
        cited, assumed = CITE.search(v.comment) is not None, ASSUMED.search(v.comment) is not None
        if not (cited or assumed):
            bad.append(f"{v.where()}  <- neither `# paper NNN <where>` nor `# assumed`")
        elif BARE_PAPER.search(v.comment):
            bad.append(f"{v.where()}  <- `paper` without its number and place: cite as `paper NNN §x`")
    assert not bad, "\n".join(bad)


def _chain(path: Path) -> list[Path]:
    """The recipe and the files its ``defaults`` name, recursively, without the generic _base.yaml."""
    out = [path]
    for base in yaml.safe_load(path.read_text()).get("defaults") or []:
        if base != "_base":
            out += _chain(path.parent / f"{base}.yaml")
    return out


@pytest.mark.parametrize("path", [p for p in PAPER_RECIPES if not p.stem.startswith("_")], ids=lambda p: p.stem)
def test_defining_values_are_written_by_the_recipe(path):
    written = {v.key for f in _chain(path) for v in value_lines(f)}
    missing = DEFINING - written
    assert not missing, f"inherited from _base.yaml, not stated by {path.name} or its bases: {sorted(missing)}"
    assert written & {"model.optim.sched.warmup_steps", "model.optim.sched.warmup_ratio"}, path.name


@pytest.mark.skipif(not PAPERS.is_dir(), reason=f"the papers are not at {PAPERS}")
@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(NEMO)))
def test_citations_point_at_the_papers_text(path):
    texts, bad = _paper_texts(), []
    for v in value_lines(path):
        cites = list(CITE.finditer(v.comment))
        for c in cites:
            if c.group(1) not in texts:
                bad.append(f"{v.where()}  <- no paper {c.group(1)} in {PAPERS}")
                continue
            for place in PLACE.finditer(c.group(2)):
                if not _place_exists(texts[c.group(1)], place):
                    bad.append(f"{v.where()}  <- paper {c.group(1)} has no {place.group(0)}")
        if cites and "=" not in v.comment:
            cited = [texts[c.group(1)] for c in cites if c.group(1) in texts]
            bad += [f"{v.where()}  <- {n} is not in the cited text (as {', '.join(spellings(n))})"
                    for n in _numbers(v.value) if cited and not _appears(n, cited)]
    assert not bad, "\n".join(bad)


# --- the checks themselves: each rule refuses what it should ------------------------------------------------

def test_the_rules_refuse_a_mixed_a_bare_and_an_unmarked_line(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("name: r\nmodel:\n  optim:\n    lr: 2.0e-4  # paper 000 §3.3 (schedule assumed)\n"
                 "    eps: 1.0e-6  # paper: Table 5\n  size: base\n  data:\n    masking: token  # assumed\n"
                 "trainer:\n  max_steps: 690000  # paper 000 §3.3, Table 1\n")
    lines = {v.key: v for v in value_lines(f)}
    assert set(lines) == {"name", "model.optim.lr", "model.optim.eps", "model.size", "model.data.masking",
                          "trainer.max_steps"}
    lr, eps, size = lines["model.optim.lr"], lines["model.optim.eps"], lines["model.size"]
    assert CITE.search(lr.comment) and ASSUMED.search(lr.comment)  # both: refused in every file
    assert not CITE.search(eps.comment) and BARE_PAPER.search(eps.comment)  # a bare mark is no citation
    assert size.comment == "" and lines["model.data.masking"].comment == "assumed"
    assert [m.group(0) for m in PLACE.finditer(CITE.search(lines["trainer.max_steps"].comment).group(2))] == \
        ["§3.3", "Table 1"]


def test_number_spellings():
    assert {"690K", "690k", "690,000"} <= set(spellings("690000"))
    assert {"8,192"} <= set(spellings("8192")) and "1M" in spellings("1000000")
    assert {"2e-4", "2e - 4"} <= set(spellings("2.0e-4")) and "5%" in spellings("0.05")
    assert "5 \\cdot 10^5" in spellings("500000")
    assert not _appears("4069", ["a batch size of 4096"]) and _appears("4096", ["batch size of 4096,"])
    assert not _appears("690000", ["6900K steps"])


@pytest.mark.skipif(not PAPERS.is_dir(), reason=f"the papers are not at {PAPERS}")
def test_a_wrong_citation_is_caught(tmp_path):
    """A typo in a cited number, a table the paper does not have and an unknown paper are each reported."""
    texts = _paper_texts()
    assert _appears("690000", [texts["000"]]) and not _appears("680000", [texts["000"]])
    assert _place_exists(texts["000"], PLACE.search("§3.3")) and not _place_exists(texts["000"], PLACE.search("§9.9"))
    assert _place_exists(texts["002"], PLACE.search("Table 5")) and not _place_exists(texts["002"], PLACE.search("Table 12"))
    assert _place_exists(texts["002"], PLACE.search("App. A"))
    assert "999" not in texts


@pytest.mark.skipif(not PAPERS.is_dir(), reason=f"the papers are not at {PAPERS}")
def test_suite_seeds_are_the_papers():
    """The suites' first five default seeds are paper 000's footnote 2 (read from its text); the ten-run
    datasets (BLURB's BIOSSES, PubMedQA, BioASQ) get five more, all different."""
    from bio_megatron.benchmark.suites import BLURB, DEFAULT_SEEDS, PAPER

    m = re.search(r"seeds: ([\d, ]+)\)", _paper_texts()["000"])
    assert m, "paper 000 footnote 2 lists no seeds"
    stated = tuple(int(s) for s in m.group(1).split(","))
    assert stated == (10, 42, 1234, 12345, 666) and DEFAULT_SEEDS[:5] == stated
    most = max(d.runs or s.runs for s in (BLURB, PAPER) for d in s.datasets)
    assert len(set(DEFAULT_SEEDS)) == len(DEFAULT_SEEDS) >= most == 10
