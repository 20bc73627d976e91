"""The README's command table names every command and sub-command the CLI has (issue 27, item 5)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from bio_megatron.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [prefix]
    return [c for name, sp in subs[0].choices.items() for c in _commands(sp, (*prefix, name))]


def _named(cell: str) -> set[tuple[str, ...]]:
    """The (command, sub-command) pairs a table cell names: `bio-megatron x {a,b}` / `x a` / `x {a,b}` spans."""
    found = set()
    for span in re.findall(r"`([^`]+)`", cell):
        words = span.removeprefix("bio-megatron ").split()
        if not words:
            continue
        head = words[0]
        found.add((head,))
        for w in words[1:2]:
            for sub in w.strip("{}").split(","):
                found.add((head, sub))
    return found


def test_the_readme_table_names_every_command():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Commands"):readme.index("## Pretraining")]
    named = set().union(*(_named(line.split("|")[1]) for line in table.splitlines() if line.startswith("| `")))
    missing = [" ".join(c) for c in _commands(build_parser()) if c not in named and c[:1] not in
               {("pretrain",), ("demo",), ("distill",), ("report",)} | ({c[:1]} if len(c) == 1 else set())]
    assert not missing, f"README.md's command table lacks: {missing}"
