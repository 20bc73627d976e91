"""Where a recipe named on the command line is found: the path as given, else in the recipes' folder
(``--config bc5cdr_chem`` for ``finetune ner``, ``biomegatron_345m`` for ``pretrain``).

The recipes live in the checkout's ``nemo_configs/``; the package reaches them as ``bio_megatron/nemo_configs`` (a link
in the checkout, a copy in an installed wheel), so the same path works after ``pip install .``."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RECIPES = (Path(__file__).resolve().parents[1] / "nemo_configs").resolve()  # in the checkout: nemo_configs/ itself


def yaml_name(p: Path) -> str:
    """``x`` -> ``x.yaml``; a name already ending in .yaml/.yml is kept (``biomegatron_1.2b`` is not ``.2b``)."""
    return p.name if p.suffix in (".yaml", ".yml") else f"{p}.yaml"


def find_recipe(folder: str, path: str) -> Path:
    """``path`` if it exists (or is absolute), else relative to the checkout, else ``<recipes>/<folder>/<name>.yaml``;
    a name found nowhere comes back unchanged so that the loader's error names it as the user wrote it."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    for candidate in (REPO_ROOT / p, RECIPES / folder / yaml_name(p)):
        if candidate.exists():
            return candidate
    return p
