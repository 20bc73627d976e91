"""A suite's options -> its ordered cells, each with the exact ``bio-megatron finetune`` arguments it runs and,
when it cannot run, why ("missing: ..."): no recipe, a recipe the loader refuses (e.g. ``???`` values for data
that needs registration), a data file that is not there, or a prerequisite that is missing.

Everything here is cheap (no torch): ``--dry-run`` and ``report`` build the plan too.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from bio_megatron.benchmark.suites import SUITES, Dataset, Suite
from bio_megatron.utils.errors import ConfigError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
# Keys the suite sets for every cell (where its run lives, its seed, what it starts from).
CONTROLLED = ("exp_manager.exp_dir", "exp_manager.name", "trainer.seed", "model.restore_from_path",
              "exp_manager.resume_if_exists")
# --max-examples draws its sample with this seed unless --sample-seed says otherwise (the same cells for every
# training seed: the seeds vary the training, not the data).
DEFAULT_SAMPLE_SEED = 1234
_TASK_CLASS = {"ner": ("bio_megatron.tasks.ner", "NerTask"), "re": ("bio_megatron.tasks.re", "ReTask"),
               "qa": ("bio_megatron.tasks.qa", "QaTask"), "classify": ("bio_megatron.tasks.classify", "ClassifyTask")}


@dataclass(frozen=True)
class Options:
    """What defines a suite's results (recorded in its manifest); launch settings are not part of it."""

    suite: str
    model: str
    """Absolute path of ``--model`` as given."""
    datasets: tuple[str, ...]
    seeds: tuple[int, ...]
    grid: bool
    max_examples: int | None = None
    epochs: int | None = None
    overrides: tuple[str, ...] = ()
    """key=value for every cell, after the recipe's and the recipe map's."""
    recipe_map: dict = field(default_factory=dict)
    """dataset -> {"recipe": ..., "overrides": [...]} (``--recipe-map``), replacing the suite's recipe."""
    runs: dict = field(default_factory=dict)
    """dataset -> how many of the first ``seeds`` it runs (the publications' runs, without ``--seeds``); a
    dataset not listed runs every seed."""
    sample_seed: int = DEFAULT_SAMPLE_SEED
    """With ``max_examples``: the seed of the random (stratified for classification) sample of each split."""

    def seeds_of(self, key: str) -> tuple[int, ...]:
        return self.seeds[:self.runs[key]] if key in self.runs else self.seeds

    def identity(self) -> dict:
        out = json.loads(json.dumps(asdict(self)))  # as the manifest reads back (lists, not tuples)
        if not out["runs"]:  # --seeds given: the manifest stays as before per-dataset runs, earlier folders match
            del out["runs"]
        if out["max_examples"] is None:  # no sample drawn: the seed means nothing (and earlier folders match)
            del out["sample_seed"]
        return out


@dataclass
class Cell:
    index: int
    dataset: Dataset
    seed: int
    point: tuple[int, int] | None
    """(num_fc_layers, fc_hidden_size) of the head grid; None without a grid."""
    dir: Path
    task: str
    recipe: str
    overrides: list[str]
    missing: str | None = None
    after: Cell | None = None
    stage: int = 0
    """0: no prerequisite; 1: continues from a stage-0 cell (a later SLURM array)."""

    @property
    def grid_tag(self) -> str:
        return f"layers{self.point[0]}_width{self.point[1]}" if self.point else ""

    @property
    def label(self) -> str:
        return f"{self.dataset.key} seed {self.seed}" + (f" {self.grid_tag}" if self.point else "")

    @property
    def run_dir(self) -> Path:
        if self.dataset.folds:  # cross_validate's summary of every fold (benchmark/kfold.py) under exp_dir/name
            return self.dir / "run"
        return self.dir / "run" / f"seed{self.seed}"  # run_sweep's layout under exp_dir/name

    @property
    def result_file(self) -> Path:
        return self.dir / "cell.json"

    @property
    def checkpoint(self) -> Path:
        return self.run_dir / "checkpoints"

    def finetune_args(self) -> list[str]:
        folds = ["--folds", self.dataset.folds] if self.dataset.folds else []
        return ["finetune", self.task, "--config", self.recipe, *folds, *self.overrides]


@dataclass
class Plan:
    suite: Suite
    options: Options
    out: Path
    cells: list[Cell]
    model_path: str
    """What ``model.restore_from_path`` receives: ``--model`` itself, or its import in the suite folder."""


def load_recipe_map(path: str | None) -> dict:
    """``--recipe-map FILE``: ``{dataset: {recipe: NAME_OR_PATH, overrides: [key=value, ...]}}`` (both optional)."""
    if not path:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--recipe-map {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--recipe-map {path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--recipe-map {path}: expected a mapping dataset -> {{recipe, overrides}}")
    problems, out = [], {}
    for key, entry in data.items():
        if not isinstance(entry, dict) or set(entry) - {"recipe", "overrides"}:
            problems.append(f"{key}: expected a mapping with 'recipe' and/or 'overrides', got {entry!r}")
            continue
        over = entry.get("overrides") or []
        if not isinstance(over, list) or not all(isinstance(o, str) and "=" in o for o in over):
            problems.append(f"{key}.overrides: expected a list of key=value strings, got {over!r}")
            continue
        out[str(key)] = {"recipe": entry.get("recipe"), "overrides": list(over)}
    if problems:
        raise ConfigError(problems, f"--recipe-map {path}")
    return out


def select_datasets(suite: Suite, names: list[str] | None) -> tuple[str, ...]:
    """``--datasets`` in suite order, with any prerequisite (SQuAD for BioASQ) added."""
    keys = [d.key for d in suite.datasets]
    if not names:
        return tuple(keys)
    unknown = [n for n in names if n not in keys]
    if unknown:
        raise ConfigError(f"--datasets: {', '.join(unknown)} not in suite {suite.name}; expected some of "
                          f"{', '.join(keys)}")
    chosen = set(names)
    for d in reversed(suite.datasets):
        if d.key in chosen and d.after and d.after not in chosen:
            log.info("%s continues from %s: adding it to --datasets", d.key, d.after)
            chosen.add(d.after)
    return tuple(k for k in keys if k in chosen)


def _recipe(d: Dataset, mapped: dict | None) -> tuple[str | None, list[str], str | None]:
    """(recipe path, its overrides, why missing) for a dataset: the recipe map's, the suite's, its fallback."""
    from bio_megatron.config.recipes import find_recipe

    if mapped and mapped.get("recipe"):
        path = find_recipe(d.task, mapped["recipe"])
        return (str(path), [], None) if path.is_file() else (None, [], f"recipe {mapped['recipe']} not found")
    path = find_recipe(d.task, d.recipe)
    if path.is_file():
        return str(path), [], None
    if d.fallback:
        base = find_recipe(d.task, d.fallback[0])
        if base.is_file():
            return str(base), list(d.fallback[1]), None
    return None, [], f"no recipe nemo_configs/{d.task}/{d.recipe}.yaml"


def _size_overrides(opts: Options) -> list[str]:
    out = []
    if opts.max_examples is not None:
        out += [f"model.dataset.max_train_examples={opts.max_examples}",
                f"model.dataset.max_eval_examples={opts.max_examples}",
                f"model.dataset.max_examples_seed={opts.sample_seed}"]  # not the first N rows: often one class
    if opts.epochs is not None:
        out += [f"trainer.max_epochs={opts.epochs}", "trainer.max_steps=-1"]
    return out


def _grid_overrides(task: str, point: tuple[int, int]) -> list[str]:
    layers = "model.classifier_head.num_output_layers" if task in ("re", "classify") else "model.head.num_fc_layers"
    return [f"{layers}={point[0]}", f"model.fc_hidden_size={point[1]}"]


def _split_paths(task: str, ds, name: str) -> list[Path]:
    """What one split is read from: its file under ``data_dir``, or for a clinical release read as it ships (i2b2,
    ShARe/CLEFE) the release's folders, ``train`` and ``dev`` being bio-lm's patient-level split of its training
    folders (not files of those names)."""
    from bio_megatron.tasks.clinical_convert import READERS, split_sources

    if task == "ner" and ds.format in READERS:
        return split_sources(ds.format, ds.data_dir, name)
    return [Path(ds.data_dir) / name]


def _availability(d: Dataset, recipe: str, overrides: list[str]) -> tuple[object | None, str | None]:
    """(loaded config or None, why the cells cannot run or None). A config that loads is returned even when its
    data is absent: its head grid fixes the cells, so indices stay the same when the data arrives."""
    from bio_megatron.config.finetune import load_finetune_config

    try:
        cfg = load_finetune_config(d.task, recipe, overrides)
    except ConfigError as exc:
        more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
        return None, f"the recipe does not load: {exc.problems[0]}{more}"
    ds = cfg.model.dataset
    files = list(dict.fromkeys(p for f in (ds.train_file, ds.dev_file, ds.test_file) if f
                               for p in _split_paths(d.task, ds, f)))
    files += [Path(ds.bioasq_golden)] if getattr(ds, "bioasq_golden", None) else []
    absent = [str(p) for p in files if not p.exists()]
    if absent:
        return cfg, f"{', '.join(absent)} not found"
    if d.needs_predictions:
        module, name = _TASK_CLASS[d.task]
        if not hasattr(getattr(importlib.import_module(module), name), "write_predictions"):
            return cfg, (f"`finetune {d.task}` writes no test predictions, and {d.metric_name} exists only "
                          f"through `bio-megatron evaluate {d.evaluator}` on them")
    return cfg, None


def build_plan(opts: Options, out: Path, model_path: str) -> Plan:
    """Every cell of the suite, in run order (prerequisites first), with its overrides and availability."""
    suite = SUITES[opts.suite]
    unknown = sorted(set(opts.recipe_map) - {d.key for d in suite.datasets})
    if unknown:
        raise ConfigError(f"--recipe-map: {', '.join(unknown)} not in suite {suite.name}; expected some of "
                          f"{', '.join(d.key for d in suite.datasets)}")
    cells: list[Cell] = []
    by_key: dict[str, list[Cell]] = {}
    for key in opts.datasets:
        d = suite.dataset(key)
        mapped = opts.recipe_map.get(key)
        recipe, base, why = _recipe(d, mapped)
        base = base + (mapped or {}).get("overrides", []) + _size_overrides(opts) + list(opts.overrides)
        clash = sorted({o.split("=", 1)[0].lstrip("+~") for o in base} & set(CONTROLLED))
        if clash:
            raise ConfigError(f"{', '.join(clash)}: set by the suite for every cell (its folder, seed and "
                              "model); remove it from the overrides / --recipe-map")
        parents = by_key.get(d.after, []) if d.after else []
        points: list = [None]
        cfg = None
        if recipe is not None:
            probe = base + _controlled(out, d, opts.seeds[0], None, model_path)
            cfg, why = _availability(d, recipe, probe)
        if why and d.needs:
            why += f" [{d.needs}]"
        if d.after:
            points = sorted({c.point for c in parents}, key=lambda p: p or (0, 0))
        elif opts.grid and cfg is not None:
            points = [(n, w) for n in cfg.grid.num_fc_layers for w in cfg.grid.fc_hidden_size]
        for point in points:
            for seed in opts.seeds_of(key):
                parent = next((c for c in parents if c.seed == seed and c.point == point), None)
                over = base + (_grid_overrides(d.task, point) if point and not d.after else [])
                over += _controlled(out, d, seed, point, parent.checkpoint if parent else model_path)
                needs = f"needs {parent.label}, which is missing" if parent and parent.missing else None
                missing = "; ".join(w for w in (why, needs) if w) or None
                cell = Cell(-1, d, seed, point, _cell_dir(out, d, seed, point), d.task, recipe or "", over,
                            missing, parent, parent.stage + 1 if parent else 0)
                cells.append(cell)
                by_key.setdefault(key, []).append(cell)
    order = {k: i for i, k in enumerate(opts.datasets)}
    cells.sort(key=lambda c: (c.stage, order[c.dataset.key], c.point or (0, 0), opts.seeds.index(c.seed)))
    for i, c in enumerate(cells):
        c.index = i
    return Plan(suite, opts, out, cells, model_path)


def _cell_dir(out: Path, d: Dataset, seed: int, point: tuple[int, int] | None) -> Path:
    grid = [f"layers{point[0]}_width{point[1]}"] if point else []
    return out.joinpath("cells", d.key, *grid, f"seed{seed}")


def _controlled(out: Path, d: Dataset, seed: int, point, restore) -> list[str]:
    return [f"model.restore_from_path={restore}", f"trainer.seed={seed}",
            f"exp_manager.exp_dir={_cell_dir(out, d, seed, point)}", "exp_manager.name=run",
            "exp_manager.resume_if_exists=true"]
