"""The package layering of docs/ARCHITECTURE.md, enforced: every ``bio_megatron`` import (module level, inside
functions, under ``TYPE_CHECKING``), parsed with ``ast``, goes to its own unit or to a lower layer, and the units
import each other without cycles; nor do the files (modules), and no module imports another's private names
(``from x import _y``). Failures name the importing file and line.

Cheap (parses ~150 files, imports nothing of the project), so it runs in the default suite.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "bio_megatron"

# Bottom to top. A unit (package, or a module where a package straddles two layers) may import itself and any
# unit of a lower layer; nothing else. "bio_megatron" is the package's own __init__ (the version).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("version", ("bio_megatron",)),
    ("utils", ("utils",)),
    ("foundations", ("config", "parallel", "evaluation", "vocab",    # vocab: the tokenizers
                     "formats.saved",                                # our checkpoints' config.yaml, read
                     "formats.detect",                               # which format a path holds (paths only)
                     "formats.archives",                             # zip/tar read with limits (no model)
                     "formats.foreign")),                            # .nemo / Megatron-LM imported by a child
    ("corpus", ("corpus",)),                                         # reads corpora, encodes with a vocab
    ("engine parts", ("models", "data", "vocab.train", "vocab.stats")),  # vocab building reads corpora
    ("families", ("families",)),                                     # encoder families: HF names, models built
    ("training", ("training",)),
    ("formats", ("formats",)),                                       # sources, models filled at TP1, every format
    ("loading", ("loading",)),                                       # a distillation teacher
    ("tasks", ("tasks",)),
    ("predict", ("predict",)),
    ("tools", ("bench", "benchmark", "demo", "report")),
    ("cli", ("cli",)),
    ("entry point", ("__main__",)),
]

# Known upward imports outside this layering's owners, each with why; excluded from both checks. Every entry must
# still exist (a fixed one fails here until removed), so the list only shrinks.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}  # none left


@dataclass(frozen=True)
class Edge:
    src: str     # importing unit
    dst: str     # imported unit
    file: str    # importing file, relative to the repository
    line: int
    module: str  # the imported module as written (resolved if relative)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.src} imports {self.module} ({self.dst})"


def _rank(layers: list[tuple[str, tuple[str, ...]]]) -> dict[str, int]:
    return {unit: i for i, (_, units) in enumerate(layers) for unit in units}


def unit_of(module: str, ranks: dict[str, int]) -> str | None:
    """The most specific unit of a dotted module name (``bio_megatron.vocab.train.x`` -> ``vocab.train``)."""
    if module == "bio_megatron":
        return "bio_megatron"
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in ranks:
            return ".".join(parts[:n])
    return None


def _module_name(file: Path, root: Path) -> str:
    parts = list(file.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(file: Path, root: Path) -> list[tuple[int, str]]:
    """(line, imported bio_megatron module) of every import statement in ``file``, nested ones included; for
    ``from X import name`` the module ``X.name`` when that is a module of the package, else ``X``."""
    package = _module_name(file, root)
    if file.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this file's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                is_module = (root.parent / Path(*sub.split("."))).with_suffix(".py").is_file() or \
                    (root.parent / Path(*sub.split("."))).is_dir()
                out.append((node.lineno, sub if is_module else base))
    ours = [(line, m) for line, m in out if m == "bio_megatron" or m.startswith("bio_megatron.")]
    return list(dict.fromkeys(ours))  # ``from X import a, b`` once


def collect(root: Path, layers=LAYERS) -> tuple[list[Edge], list[str]]:
    """Every import between two different units, and problems (a module in no unit)."""
    ranks = _rank(layers)
    edges, problems = [], []
    for file in sorted(root.rglob("*.py")):
        rel = str(file.relative_to(root.parent))
        src = unit_of(_module_name(file, root), ranks)
        if src is None:
            problems.append(f"{rel}: module in no layer; add its package to LAYERS (tests/test_layering.py) and "
                            "docs/ARCHITECTURE.md")
            continue
        for line, module in imports_of(file, root):
            dst = unit_of(module, ranks)
            if dst is None:
                problems.append(f"{rel}:{line}: imports {module}, which is in no layer")
            elif dst != src:
                edges.append(Edge(src, dst, rel, line, module))
    return edges, problems


def _known(e: Edge, known: dict) -> bool:
    return any(e.file == f and (e.module == m or e.module.startswith(m + ".")) for f, m in known)


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The cycles of a directed graph: its strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def violations(root: Path, layers=LAYERS, known: dict = KNOWN_UPWARD) -> list[str]:
    """Upward imports and cycles between units, one line each naming file and line."""
    ranks = _rank(layers)
    edges, problems = collect(root, layers)
    edges = [e for e in edges if not _known(e, known)]
    names = [name for name, _ in layers]
    problems += [f"{e}: upward import, layer {names[ranks[e.src]]!r} below {names[ranks[e.dst]]!r}"
                 for e in edges if ranks[e.dst] > ranks[e.src]]
    problems += [f"{e}: sibling import within layer {names[ranks[e.src]]!r}"
                 for e in edges if ranks[e.dst] == ranks[e.src]]
    # Cycles between units, whatever the layer table says.
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.src, set()).add(e.dst)
    comps = strongly_connected(graph)
    for comp in comps:
        inside = [str(e) for e in edges if e.src in comp and e.dst in comp]
        problems.append(f"import cycle between {sorted(comp)}: " + "; ".join(inside))
    return problems


def test_no_upward_imports_and_no_cycles():
    problems = violations(ROOT)
    assert not problems, "layering (docs/ARCHITECTURE.md) broken:\n" + "\n".join(problems)


def test_known_upward_imports_still_exist():
    edges, _ = collect(ROOT)
    stale = [k for k in KNOWN_UPWARD if not any(_known(e, {k: ""}) for e in edges)]
    assert not stale, f"fixed, remove from KNOWN_UPWARD: {stale}"


def test_every_layer_unit_exists():
    def exists(unit: str) -> bool:
        path = ROOT / Path(*unit.split("."))
        return unit == "bio_megatron" or path.is_dir() or path.with_suffix(".py").is_file()

    missing = [u for _, units in LAYERS for u in units if not exists(u)]
    assert not missing, f"LAYERS names units that do not exist: {missing}"


TOY_LAYERS = [("version", ("bio_megatron",)), ("utils", ("utils",)), ("low", ("low", "mid")), ("high", ("high",))]


@pytest.mark.parametrize("files, expected", [
    # a function-level upward import is caught, with its file and line
    ({"low/a.py": "def f():\n    from bio_megatron.high.b import g\n", "high/b.py": "from bio_megatron.low import a\n"},
     ["bio_megatron/low/a.py:2: low imports bio_megatron.high.b (high): upward import",
      "import cycle between ['high', 'low']"]),
    # a relative upward import too
    ({"low/a.py": "from ..high import b\n", "high/b.py": ""},
     ["bio_megatron/low/a.py:1: low imports bio_megatron.high.b (high): upward import"]),
    # two packages of one layer importing each other: siblings, and a cycle
    ({"low/a.py": "import bio_megatron.mid.c\n", "mid/c.py": "from bio_megatron.low.a import x\n"},
     ["bio_megatron/low/a.py:1: low imports bio_megatron.mid.c (mid): sibling import",
      "bio_megatron/mid/c.py:1: mid imports bio_megatron.low.a (low): sibling import",
      "import cycle between ['low', 'mid']: bio_megatron/"]),
    # a module outside every layer
    ({"new/x.py": ""}, ["bio_megatron/new/x.py: module in no layer"]),
    # downward imports only: clean
    ({"low/a.py": "from bio_megatron.utils import x\n", "high/b.py": "from bio_megatron.low.a import f\n"}, []),
])
def test_checker_fails_on_bad_trees(tmp_path, files, expected):
    root = tmp_path / "bio_megatron"
    for name in ("__init__.py", "utils/__init__.py", "low/__init__.py", "mid/__init__.py", "high/__init__.py",
                 *files):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(files.get(name, ""))
    problems = violations(root, TOY_LAYERS, known={})
    assert len(problems) == len(expected), problems
    for want in expected:
        assert any(want in p for p in problems), (want, problems)


# --- file-level cycles and private names ------------------------------------------------------------------
# Import cycles between two files (modules) of the package that remain, each with why. Every entry must still
# be a cycle (a broken one fails test_known_file_cycles_still_exist until removed), so the list only shrinks.
KNOWN_FILE_CYCLES: dict[frozenset[str], str] = {}  # none left

# ``from <another module> import _private`` that remain, (importing file, module._name) -> why; shrinks only.
KNOWN_PRIVATE: dict[tuple[str, str], str] = {}  # none left


def _dotted(module: str) -> str:
    return module.split(".", 1)[1] if "." in module else module


@lru_cache(maxsize=4)  # parsed once for the two tests that read the package's graph
def module_graph(root: Path) -> dict[str, dict[str, int]]:
    """Importing module -> {imported module of the package: first line}, over every import (lazy ones too);
    modules by their dotted name under the package (``export.hf``; a package's ``__init__`` by the package's)."""
    files = {_module_name(f, root): f for f in sorted(root.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for name, file in files.items():
        for line, module in imports_of(file, root):
            if module in files and module != name:
                graph.setdefault(_dotted(name), {}).setdefault(_dotted(module), line)
    return graph


def file_cycles(root: Path, known: dict = KNOWN_FILE_CYCLES) -> list[str]:
    """Every import cycle between modules not in ``known``, naming each import of it with file and line."""
    graph = module_graph(root)
    problems: list[str] = []
    for comp in strongly_connected({k: set(v) for k, v in graph.items()}):
        if frozenset(comp) in known:
            continue
        inside = [f"{root.name}/{a.replace('.', '/')}.py:{line}: imports {b}"
                  for a in sorted(comp) for b, line in sorted(graph.get(a, {}).items()) if b in comp]
        problems.append(f"module import cycle between {sorted(comp)}: " + "; ".join(inside))
    return problems


@lru_cache(maxsize=4)
def private_imports(root: Path) -> list[tuple[str, int, str]]:
    """(file, line, ``module._name``) of each ``from <another module of the package> import _name``."""
    out = []
    for file in sorted(root.rglob("*.py")):
        name = _module_name(file, root)
        package = name if file.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base != root.name and not base.startswith(root.name + ".") or base == name:
                continue
            out += [(str(file.relative_to(root.parent)), node.lineno, f"{base}.{a.name}") for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def private_problems(root: Path, known: dict = KNOWN_PRIVATE) -> list[str]:
    return [f"{file}:{line}: imports {what}, another module's private name (make it public there, or move it)"
            for file, line, what in private_imports(root) if (file, what) not in known]


def test_no_import_cycles_between_files():
    problems = file_cycles(ROOT)
    assert not problems, "import cycles (docs/ARCHITECTURE.md, Layers):\n" + "\n".join(problems)


def test_known_file_cycles_still_exist():
    graph = module_graph(ROOT)
    cycles = {frozenset(c) for c in strongly_connected({k: set(v) for k, v in graph.items()})}
    stale = [sorted(k) for k in KNOWN_FILE_CYCLES if k not in cycles]
    assert not stale, f"no longer cycles, remove from KNOWN_FILE_CYCLES: {stale}"


def test_no_module_imports_another_modules_private_names():
    problems = private_problems(ROOT)
    assert not problems, "private names imported across modules:\n" + "\n".join(problems)


def test_known_private_imports_still_exist():
    found = {(file, what) for file, _, what in private_imports(ROOT)}
    stale = [k for k in KNOWN_PRIVATE if k not in found]
    assert not stale, f"fixed, remove from KNOWN_PRIVATE: {stale}"


@pytest.mark.parametrize("files, cycles, private", [
    # two files of one package importing each other, one lazily: a cycle naming both imports
    ({"low/a.py": "from bio_megatron.low.b import f\n", "low/b.py": "def g():\n    from bio_megatron.low import a\n"},
     ["module import cycle between ['low.a', 'low.b']: bio_megatron/low/a.py:1: imports low.b; "
      "bio_megatron/low/b.py:2: imports low.a"], []),
    # a three-file ring, relative imports
    ({"low/a.py": "from . import b\n", "low/b.py": "from .c import x\n", "low/c.py": "from .a import y\n"},
     ["module import cycle between ['low.a', 'low.b', 'low.c']"], []),
    # a private name across modules (relative and absolute); one's own private names and dunders are fine
    ({"low/a.py": "from .b import _hidden, public\n", "low/b.py": "from bio_megatron.utils import _x, __all__\n",
      "low/c.py": "from bio_megatron.low.c import _self\n"},
     [], ["bio_megatron/low/a.py:1: imports bio_megatron.low.b._hidden",
          "bio_megatron/low/b.py:1: imports bio_megatron.utils._x"]),
    # one-way imports of public names: clean
    ({"low/a.py": "from bio_megatron.low.b import f\n", "low/b.py": "import os\n"}, [], []),
])
def test_file_level_checks_fail_on_bad_trees(tmp_path, files, cycles, private):
    root = tmp_path / "bio_megatron"
    for name in ("__init__.py", "utils/__init__.py", "low/__init__.py", *files):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(files.get(name, ""))
    found = file_cycles(root, known={})
    assert len(found) == len(cycles), found
    for want in cycles:
        assert any(want in p for p in found), (want, found)
    found = private_problems(root, known={})
    assert len(found) == len(private), found
    for want in private:
        assert any(want in p for p in found), (want, found)


def shadowing(root: Path) -> list[str]:
    """Modules named like a standard-library module in a folder that holds a script run by path (``if __name__ ==
    "__main__"``, the package's own ``__main__.py`` aside): the script's folder comes first on ``sys.path``, so the
    standard library's module is never found. A ``bench/profile.py`` broke ``bench/hf_baseline.py`` that way
    (``cProfile`` imports ``profile``), found only by the test that runs the script."""
    import sys

    scripts = {p.parent for p in root.rglob("*.py")
               if p.name != "__main__.py" and '__name__ == "__main__"' in p.read_text(encoding="utf-8")}
    return [f"{p.relative_to(root.parent)}: shadows the standard library's {p.stem!r} for the script(s) beside it"
            for folder in sorted(scripts) for p in sorted(folder.glob("*.py")) if p.stem in sys.stdlib_module_names]


def test_no_module_beside_a_script_shadows_the_standard_library(tmp_path):
    assert not shadowing(ROOT), shadowing(ROOT)
    (tmp_path / "bio_megatron" / "tools").mkdir(parents=True)
    (tmp_path / "bio_megatron" / "tools" / "run.py").write_text('if __name__ == "__main__":\n    pass\n')
    (tmp_path / "bio_megatron" / "tools" / "profile.py").write_text("")
    (tmp_path / "bio_megatron" / "re.py").write_text("")  # no script beside it: imported as bio_megatron.re only
    assert shadowing(tmp_path / "bio_megatron") == [
        "bio_megatron/tools/profile.py: shadows the standard library's 'profile' for the script(s) beside it"]
