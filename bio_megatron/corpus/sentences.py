"""Sentence splitting for biomedical text.

We use NLTK's Punkt (maintained, pure Python, no model download) with a biomedical abbreviation list,
because the usual regex "split after . ! ? before a capital" breaks on exactly the constructs that
fill PubMed: "e.g.", "et al.", "Fig. 2", "i.v.", "vs.", species names ("E. coli"), and it cannot be
taught new abbreviations. Punkt's abbreviation and orthographic heuristics handle those, and it
never splits inside decimals ("2.5 mg") or gene names ("IL-1.2") because it only breaks at whitespace.
``docs/CORPUS.md`` shows the two splitters compared on the bundled real abstracts.
"""

from __future__ import annotations

import re
from functools import lru_cache

# Lower-case, without the final period (Punkt's convention). Multi-period forms ("e.g") are matched
# by Punkt on the whole token. Sources: common MEDLINE abstract abbreviations and Latin forms.
BIOMEDICAL_ABBREVIATIONS = frozenset("""
e.g i.e et al etc cf vs viz approx ca ibid resp
fig figs tab tabs eq eqs ref refs no nos vol suppl ed eds chap sect sec app
dr mr mrs ms prof st jr sr inc ltd co corp dept univ
i.v i.m i.p i.c.v s.c p.o b.i.d t.i.d q.i.d q.d p.r.n o.d h.s
sp spp subsp var cv aff gen nov sp.nov
min max mol wt conc temp approx. av
jan feb mar apr jun jul aug sep sept oct nov dec
u.s u.k e.u s.d s.e s.e.m
""".split())

# Initials of genus names ("E. coli", "S. aureus", "C. elegans"): one capital letter followed by a
# period and a lower-case species epithet is an abbreviation, not a sentence end.
_GENUS_RE = re.compile(r"\b([A-Z])\.\s+(?=[a-z])")

NAIVE_PATTERN = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[])")


def naive_split(text: str) -> list[str]:
    """The straightforward baseline: split after . ! ? followed by whitespace and a capital/digit."""
    return [s.strip() for s in NAIVE_PATTERN.split(text) if s.strip()]


@lru_cache(maxsize=1)
def _punkt():
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    params = PunktParameters()
    params.abbrev_types = set(BIOMEDICAL_ABBREVIATIONS)
    return PunktSentenceTokenizer(params)


def warm_up() -> None:
    """Load the splitter now (importing NLTK takes ~2 s), e.g. before forking worker processes."""
    _punkt()


# Punkt runs on windows of at most this many characters. Its period-context regex, run over a whole
# multi-megabyte paragraph, trips NLTK's ReDoS guard (a 5 s limit per ``finditer``: a TimeoutError) and is
# superlinear; windows bound the work per call, so the whole split is linear (~100 us per period on one core).
# A "sentence" longer than _MAX_CARRY characters (~600 words, far beyond a real one and beyond what a
# 512-token BERT sample holds) is cut there.
_WINDOW = 8_000
_MAX_CARRY = 4_000


def split_sentences(text: str) -> list[str]:
    """Split one paragraph (or a structured-abstract section) into sentences, in time linear in its length."""
    text = " ".join(text.split())
    if not text:
        return []
    out: list[str] = []
    for sent in _windowed(text):
        # Punkt sees "E." as a possible initial only when it has learned it; genus initials followed by
        # a lower-case word never end a sentence, so glue such a split back together.
        if out and _GENUS_RE.search(out[-1][-3:] + " " + sent[:1]):
            out[-1] = f"{out[-1]} {sent}"
        else:
            out.append(sent)
    return out


def _windowed(text: str) -> list[str]:
    """Punkt's sentences of ``text`` (single-spaced), computed window by window.

    Each window is the unfinished last sentence of the previous one (``carry``) plus fresh text cut at a
    space, so Punkt always sees the token after every break it decides, and the result equals one call on
    the whole text. A carry longer than ``_MAX_CARRY`` (thousands of characters without a break:
    no real sentence) is emitted as it is, which keeps every window advancing by most of its size.
    """
    tok = _punkt()
    if len(text) <= _WINDOW:
        return tok.tokenize(text)
    out: list[str] = []
    carry, glue, pos = "", "", 0
    while pos < len(text):
        end = min(len(text), pos + _WINDOW - len(carry))
        nxt, next_glue = end, ""
        if end < len(text):
            cut = text.rfind(" ", pos + 1, end + 1)
            if cut > pos:  # cut at a space, which the two windows then share as their separator
                end, nxt, next_glue = cut, cut + 1, " "
        window = carry + glue + text[pos:end] if carry else text[pos:end]
        sents = tok.tokenize(window)
        pos, glue = nxt, next_glue
        if pos >= len(text) or not sents:
            out.extend(sents)
            carry = ""
            continue
        out.extend(sents[:-1])
        carry = sents[-1]
        if len(carry) > _MAX_CARRY:
            out.append(carry)
            carry = ""
    if carry:
        out.append(carry)
    return out


def boundary_errors(predicted: list[str], gold: list[str]) -> tuple[int, int]:
    """(false splits, missed splits) of ``predicted`` against ``gold``, by character boundary offsets."""

    def cuts(sents: list[str]) -> set[int]:
        pos, out = 0, set()
        for s in sents[:-1]:
            pos += len(re.sub(r"\s", "", s))
            out.add(pos)
        return out

    p, g = cuts(predicted), cuts(gold)
    return len(p - g), len(g - p)


def compare_with_naive(texts: list[str]) -> dict[str, object]:
    """Where Punkt and the naive regex disagree on real text, and which word precedes each extra
    naive cut (``vs.``, ``Fig.``, ``et al.`` ...): the evidence for the choice of splitter."""
    from collections import Counter

    extra: Counter[str] = Counter()
    only_punkt = 0
    n_ours = n_naive = 0
    for text in texts:
        text = " ".join(text.split())
        ours, naive = split_sentences(text), naive_split(text)
        n_ours += len(ours)
        n_naive += len(naive)
        ours_cuts = _cut_words(ours)
        naive_cuts = _cut_words(naive)
        for pos, word in naive_cuts.items():
            if pos not in ours_cuts:
                extra[word] += 1
        only_punkt += len(set(ours_cuts) - set(naive_cuts))
    return {"passages": len(texts), "sentences_punkt": n_ours, "sentences_naive": n_naive,
            "naive_only_cuts": sum(extra.values()), "punkt_only_cuts": only_punkt,
            "naive_only_cuts_after": dict(extra.most_common(12))}


def _cut_words(sents: list[str]) -> dict[int, str]:
    """Boundary offset (non-space characters before it) -> the last word before the boundary."""
    pos, out = 0, {}
    for s in sents[:-1]:
        pos += len(re.sub(r"\s", "", s))
        out[pos] = s.split()[-1] if s.split() else ""
    return out
