"""``--dry-run``'s pre-flight: every path a run will read, checked for existence and kind before anything starts.

A dry run before ``sbatch`` is what a cluster user relies on, so a missing corpus prefix, a vocabulary that is a
folder, a restore path that is none of the sources we read or a fine-tuning split that is not there must be found
then, all of them at once, not one per queued job. Each problem is one line naming the config key, the path and
what was expected; :func:`raise_problems` raises them together as one :class:`ConfigError` (exit 2).

Only the file system is looked at here (``os.stat``: a FIFO is named, never opened); what is *inside* a
checkpoint (its shape, its vocabulary) is read by the command with the run's own readers.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from bio_megatron.utils.errors import ConfigError, DataError
from bio_megatron.utils.input_files import check_input_file

RESTORE_KINDS = ("a BioMegatron checkpoint folder (bio_megatron.json), a run or its checkpoints folder (latest), a "
                 "Hugging Face folder (config.json), a .nemo file or a Megatron-LM checkpoint "
                 "(latest_checkpointed_iteration.txt, or a .pt / .zip file)")
PRETRAIN_RESTORE_KINDS = ("a BioMegatron checkpoint folder (bio_megatron.json) or a run or its checkpoints folder "
                          "(latest)")


def _stat(path: Path) -> tuple[os.stat_result | None, str | None]:
    """(stat, None) or (None, what the path is instead: missing, a broken link, a loop, unreadable)."""
    try:
        return os.stat(path), None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "is a symbolic link loop"
        if exc.errno == errno.ENOENT and os.path.islink(path):
            return None, f"is a broken symbolic link (to {os.readlink(path)})"
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None, "not found"
        return None, f"cannot be read ({exc.strerror or exc})"


def file_problem(key: str, path: str | Path, expected: str) -> str | None:
    """One line when ``path`` is not a readable regular file (empty files are the readers' concern)."""
    try:
        check_input_file(path, "it", empty=None)
    except DataError as exc:
        what = str(exc).split(": ", 1)[-1].removeprefix("it ")
        return f"{key}: {path}: {what}; expected {expected}"
    return None


def dir_problem(key: str, path: str | Path, expected: str) -> str | None:
    """One line when ``path`` is not a folder we can list."""
    st, why = _stat(Path(path))
    if st is None:
        return f"{key}: {path}: {why}; expected {expected}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{key}: {path}: is a file, not a folder; expected {expected}"
    if not os.access(path, os.R_OK | os.X_OK):
        return f"{key}: {path}: permission denied (cannot list the folder); expected {expected}"
    return None


def prefix_problems(key: str, prefix: str) -> list[str]:
    """megatron-core's indexed data: ``<prefix>.bin`` and ``<prefix>.idx`` beside each other (one line)."""
    what = "indexed data <prefix>.bin and <prefix>.idx, as bio-megatron data tokenize writes them"
    found = {ext: _stat(Path(f"{prefix}{ext}"))[1] for ext in (".bin", ".idx")}
    if all(found.values()) and Path(prefix).is_dir():
        return [f"{key}: {prefix}: is a folder; expected the prefix of {what} (e.g. {Path(prefix) / 'pubmed'})"]
    if found[".bin"] == found[".idx"] == "not found":
        return [f"{key}: {prefix}: no {prefix}.bin or {prefix}.idx; expected {what}"]
    return [p for p in (file_problem(key, f"{prefix}{ext}", what) for ext in (".bin", ".idx")) if p]


def data_prefix_problems(data_prefix: list | str) -> list[str]:
    """Every prefix of ``model.data.data_prefix`` (a single path or ``[weight, path, ...]``)."""
    dp = [data_prefix] if isinstance(data_prefix, str) else list(data_prefix or [])
    if not dp or dp == [""]:
        return ["model.data.data_prefix: empty; expected the prefix of the tokenized corpus (or [weight, prefix, "
                "...]), e.g. model.data.data_prefix=[1.0,data/pubmed]"]
    pairs = [("model.data.data_prefix", dp[0])] if len(dp) == 1 else \
        [(f"model.data.data_prefix[{i}]", dp[i]) for i in range(1, len(dp), 2)]
    return [p for key, prefix in pairs for p in prefix_problems(key, str(prefix))]


def vocab_problem(key: str, path: str | Path) -> str | None:
    """A WordPiece ``vocab.txt`` file, or a byte-level BPE folder holding ``vocab.json`` and ``merges.txt``."""
    expected = "a WordPiece vocab.txt, a byte-level BPE folder (vocab.json + merges.txt) or a built-in name " \
               "(bert_base_cased, bert_base_uncased)"
    path = Path(path)
    st, why = _stat(path)
    if st is None:
        return f"{key}: {path}: {why}; expected {expected}"
    if stat.S_ISDIR(st.st_mode):
        missing = [n for n in ("vocab.json", "merges.txt") if not (path / n).is_file()]
        return f"{key}: {path}: a folder without {' and '.join(missing)}; expected {expected}" if missing else None
    return file_problem(key, path, expected)


def restore_problem(key: str, path: str | Path, pretraining: bool = False) -> str | None:
    """Is ``path`` one of the sources the run can start from (judged by the files that name each kind)?"""
    path = Path(path)
    expected = PRETRAIN_RESTORE_KINDS if pretraining else RESTORE_KINDS
    st, why = _stat(path)
    if st is None:
        return f"{key}: {path}: {why}; expected {expected}"
    if not stat.S_ISDIR(st.st_mode):
        if not pretraining and path.suffix in (".nemo", ".pt", ".zip"):
            return file_problem(key, path, expected)
        return f"{key}: {path}: a file{f' ({path.suffix})' if path.suffix else ''}; expected {expected}"
    markers = ["bio_megatron.json", "latest", "checkpoints/latest"]
    if not pretraining:
        markers += ["config.json", "latest_checkpointed_iteration.txt"]
    if not any((path / m).exists() for m in markers):
        return f"{key}: {path}: a folder with none of {', '.join(markers)}; expected {expected}"
    return None


def pretrain_path_problems(cfg, vocab_path: Path) -> list[str]:
    """What ``pretrain`` reads: the corpus prefixes, the vocabulary, the restore and resume checkpoints."""
    m = cfg.model
    problems = data_prefix_problems(m.data.data_prefix)
    problems.append(vocab_problem("model.tokenizer.vocab_file", vocab_path))
    if m.restore_from_path:
        problems.append(restore_problem("model.restore_from_path", m.restore_from_path, pretraining=True))
    if cfg.exp_manager.resume_from_checkpoint:
        problems.append(restore_problem("exp_manager.resume_from_checkpoint", cfg.exp_manager.resume_from_checkpoint,
                                        pretraining=True))
    return [p for p in problems if p]


def finetune_path_problems(cfg) -> list[str]:
    """What ``finetune <task>`` reads from its data: the folder and each split's file (or folder), NeMo NER's
    ``labels_*.txt`` beside each ``text_*.txt``, a BioASQ golden file; and the restore source's kind."""
    m, d = cfg.model, cfg.model.dataset
    problems = []
    if m.restore_from_path:
        problems.append(restore_problem("model.restore_from_path", m.restore_from_path))
    problems.append(dir_problem("model.dataset.data_dir", d.data_dir, "the folder of the task's data files"))
    # i2b2 / ShARe releases: a split names a folder of the release or one of bio-lm's patient-level splits (a keyword):
    # their readers say which; the data folder is checked above.
    i2b2 = cfg.task == "ner" and (str(getattr(d, "format", "")).startswith("i2b2") or d.format == "share_clefe")
    if problems[-1] is None and not i2b2:
        split_dirs = cfg.task == "re" and d.format == "chemprot_original"  # a split is a folder of TSVs there
        for split in ("train", "dev", "test"):
            name = getattr(d, f"{split}_file", None)
            if not name:
                continue
            key, path = f"model.dataset.{split}_file", Path(d.data_dir) / name
            if split_dirs:
                problems.append(dir_problem(key, path, "the ChemProt split folder (chemprot_original format)"))
                continue
            problems.append(file_problem(key, path, f"the {split} split's file inside model.dataset.data_dir"))
            if cfg.task == "ner" and d.format == "nemo" and problems[-1] is None and path.name.startswith("text_"):
                labels = path.with_name(path.name.replace("text_", "labels_", 1))
                problems.append(file_problem(key, labels, "NeMo's labels_<split>.txt beside text_<split>.txt"))
    golden = getattr(d, "bioasq_golden", None)
    if golden:
        problems.append(file_problem("model.dataset.bioasq_golden", golden, "the official BioASQ golden JSON"))
    return [p for p in problems if p]


def raise_problems(problems: list[str], source: str | None = None) -> None:
    """All pre-flight problems in one error (exit 2 from the CLI), or nothing."""
    if problems:
        raise ConfigError(problems, source or "pre-flight: what the run reads")
