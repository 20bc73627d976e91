"""``bio-megatron demo``: the main job end to end on bundled real data, sized for a laptop CPU.

Bundled PubMed + PMC sample -> JSONL -> WordPiece-tokenized indexed data -> the ``tiny`` Megatron BERT
pretrained with tensor parallelism (TP=2 in two processes under torchrun) -> checkpoint.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence, TypeVar

import numpy as np

from bio_megatron.config.recipes import RECIPES
from bio_megatron.utils.errors import BioMegatronError, OutputError
from bio_megatron.utils.io import atomic_open
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
VOCAB = "bert_base_uncased"
T = TypeVar("T")
SPLITS = (950, 50, 0)  # tiny.yaml's model.data.splits_string: the first 95% of the documents train


def build_demo_corpus(out: Path, interleave: bool = False) -> Path:
    """Extract and tokenize the bundled sample; returns the indexed-data prefix (reused when present).

    The documents are PubMed's then PMC's, so megatron-core's validation split (the last 5% of the documents)
    holds all three PMC articles and no training document is PMC: a held-out set drawn from another
    distribution. ``interleave`` (the demo) spreads each source's documents evenly over the order first
    (:func:`interleave_sources`), so the held-out tail is drawn like the training documents; the default keeps
    the order the tests' fixture and its golden values were measured on."""
    from bio_megatron.corpus.pmc import extract_pmc
    from bio_megatron.corpus.pubmed import extract_pubmed
    from bio_megatron.corpus.samples import sample_files
    from bio_megatron.corpus.tokenize import tokenize_corpus
    from bio_megatron.vocab.builtin import resolve_vocab

    data = out / "data"
    prefix = data / ("pubmed_pmc_interleaved_text_sentence" if interleave else "pubmed_pmc_text_sentence")
    if Path(f"{prefix}.bin").exists() and Path(f"{prefix}.idx").exists():
        log.info("corpus: reusing %s.{bin,idx}", prefix)
        return prefix
    files = sample_files()
    data.mkdir(parents=True, exist_ok=True)
    pubmed_stats = extract_pubmed(files["pubmed"], data / "pubmed.jsonl")
    pmc_stats = extract_pmc(files["pmc"], data / "pmc.jsonl")
    inputs = [data / "pubmed.jsonl", data / "pmc.jsonl"]
    if interleave:
        docs = [p.read_text(encoding="utf-8").splitlines(keepends=True) for p in inputs]
        with atomic_open(data / "pubmed_pmc_interleaved.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(interleave_sources(docs))
        inputs = [data / "pubmed_pmc_interleaved.jsonl"]
    tok_stats = tokenize_corpus(inputs, resolve_vocab(VOCAB), prefix, workers=1)
    log.info("corpus: pubmed %s | pmc %s | tokenized %s", _brief(pubmed_stats), _brief(pmc_stats), _brief(tok_stats))
    return prefix


def interleave_sources(sources: Sequence[Sequence[T]]) -> list[T]:
    """Every source's items spread evenly over one order, each source keeping its own order: item ``i`` of a
    source of ``n`` sits at fraction ``(i + 0.5) / n`` of the way through (ties: the earlier source first). Any
    contiguous stretch, such as megatron-core's validation tail, then holds each source in proportion to its
    share of the items, up to rounding."""
    keyed = [((i + 0.5) / len(src), s, item) for s, src in enumerate(sources) for i, item in enumerate(src)]
    return [item for *_, item in sorted(keyed, key=lambda k: k[:2])]


def unigram_entropy(tokens: np.ndarray | list[int]) -> float:
    """-sum p log p over the token frequencies (nats, like the MLM loss): the loss of a model that predicts every
    masked token from its frequency alone, knowing nothing of its context."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64).ravel())
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def training_unigram_entropy(prefix: Path, splits: tuple[int, int, int] = SPLITS) -> float:
    """``unigram_entropy`` of the tokens of the training documents of ``<prefix>.bin`` (the first
    ``splits[0] / sum(splits)`` of the documents, rounded as megatron-core splits them)."""
    from bio_megatron.corpus.indexed import read_index

    lengths, docs, dtype = read_index(f"{prefix}.idx")
    n_train = int(round(len(docs[1:]) * splits[0] / sum(splits)))
    end = int(lengths[:docs[n_train]].sum())
    return unigram_entropy(np.fromfile(f"{prefix}.bin", dtype=dtype, count=end))


def validation_unigram_cross_entropy(prefix: Path, vocab_size: int, splits: tuple[int, int, int] = SPLITS) -> float:
    """The loss on the validation documents of ``<prefix>.bin`` of a model that predicts every token from the
    TRAINING documents' token frequencies, add-one smoothed over ``vocab_size`` (a token the training documents
    lack costs log(N + V), not infinity): what the validation loss must beat. The validation documents are the
    corpus's last ones (``splits``): even when drawn like the training documents (the demo's interleaved corpus)
    they are other text, scored by frequencies they did not contribute to, so the training entropy would flatter
    the baseline."""
    from bio_megatron.corpus.indexed import read_index

    lengths, docs, dtype = read_index(f"{prefix}.idx")
    n_docs = len(docs[1:])
    n_train = int(round(n_docs * splits[0] / sum(splits)))
    n_val = int(round(n_docs * splits[1] / sum(splits)))
    tokens = np.fromfile(f"{prefix}.bin", dtype=dtype).astype(np.int64)
    ends = np.cumsum(lengths)
    train_end = int(ends[docs[n_train] - 1]) if n_train else 0
    val_end = int(ends[docs[min(n_train + n_val, n_docs)] - 1])
    counts = np.bincount(tokens[:train_end], minlength=vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    return float(-log_p[tokens[train_end:val_end]].mean())


def _brief(stats: dict) -> str:
    keys = ("documents", "sentences", "tokens", "superseded_or_deleted", "unknown_rate")
    return ", ".join(f"{k} {stats[k]:.4g}" if isinstance(stats[k], float) else f"{k} {stats[k]}"
                     for k in keys if k in stats)


# What a pretraining run writes at the top of its folder: an earlier demo run holding anything else has had files
# added by the user, which replacing the run would delete.
# (`report` is what `bio-megatron report RUN_DIR` writes there by default.)
_RUN_ENTRIES = frozenset({"checkpoints", "index_cache", "metrics.jsonl", "status.json", "tensorboard", "run.lock",
                          "report", ".bio_megatron_output.json"})


def _remove_earlier_demo_run(run_dir: Path) -> None:
    """Delete an earlier demo run, or refuse (exit 2) when ``run_dir`` is not one or holds files a run never writes."""
    if run_dir.is_symlink() or not run_dir.is_dir():
        raise OutputError(f"{run_dir}: exists and is not a folder; move it or choose another --out")
    names = set(os.listdir(run_dir))
    if not names & {"metrics.jsonl", "status.json", "checkpoints"}:
        raise OutputError(f"{run_dir}: exists and is not an earlier demo run (no metrics.jsonl, status.json "
                          "or checkpoints); move it or choose another --out")
    foreign = sorted(names - _RUN_ENTRIES)
    if foreign:
        raise OutputError(f"{run_dir}: the earlier demo run holds files a run does not write ({', '.join(foreign[:3])}"
                          f"{' ...' if len(foreign) > 3 else ''}); move them or choose another --out")
    shutil.rmtree(run_dir)


def demo(out: Path, steps: int, nproc: int) -> int:
    t0 = time.perf_counter()
    out = out.resolve()
    prefix = build_demo_corpus(out, interleave=True)
    recipe = RECIPES / "pretrain" / "tiny.yaml"
    overrides = [f"model.data.data_prefix=[1.0,{prefix}]", f"exp_manager.exp_dir={out}", "exp_manager.name=tiny_tp2",
                 f"model.tensor_model_parallel_size={nproc}", f"trainer.max_steps={steps}",
                 f"model.tokenizer.vocab_file={VOCAB}"]
    from bio_megatron.vocab.builtin import resolve_vocab

    train_baseline = training_unigram_entropy(prefix)
    with open(resolve_vocab(VOCAB), "rb") as fh:
        vocab_size = sum(1 for _ in fh)
    val_baseline = validation_unigram_cross_entropy(prefix, vocab_size)
    log.info("unigram baselines: %.3f nats on the training documents (the entropy of their token frequencies), "
             "%.3f on the validation documents (their tokens scored by the training frequencies); a model that "
             "learned from context ends below them", train_baseline, val_baseline)
    run_dir = out / "tiny_tp2"
    if run_dir.exists() or run_dir.is_symlink():  # a demo always trains from scratch (the corpus above is reused)
        _remove_earlier_demo_run(run_dir)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "bio_megatron", "pretrain", "--config", str(recipe), *overrides]
    log.info("launching: %s", shlex.join(cmd))  # quoted: the line pastes into a shell
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        raise BioMegatronError(f"pretraining exited with status {rc}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    val = [r for r in records if "val_loss" in r]
    first, last = train[0], train[-1]
    final = val[-1]["val_loss"] if val else last["loss"]
    baseline = val_baseline if val else train_baseline
    below = final < baseline
    lines = [
        "",
        "BioMegatron demo finished in %.0f s" % (time.perf_counter() - t0),
        f"  MLM loss      {first['loss']:.3f} (step {first['step']}) -> {last['loss']:.3f} (step {last['step']})",
        *(f"  val_loss      {v['val_loss']:.3f} at step {v['step']}" for v in val),
        "  loss curve    " + _sparkline([r["loss"] for r in train]),
        f"  learned       final {'val loss' if val else 'loss'} {final:.3f} {'<' if below else '>='} unigram "
        f"baseline {baseline:.3f}" + (" (below it: the model predicts from context, not only frequency)" if below else " (not below: at this size the model has learned little "
                                      "beyond token frequencies; train longer to see it use context)"),
        f"  corpus        {prefix}.bin / .idx (+ JSONL beside it)",
        f"  run           {run_dir}",
        f"  checkpoint    {(run_dir / 'checkpoints' / 'latest').read_text().strip()} -> {run_dir / 'checkpoints'}",
        f"  metrics       {run_dir / 'metrics.jsonl'}   tensorboard: {run_dir / 'tensorboard'}",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    if last["loss"] >= first["loss"]:
        raise BioMegatronError(f"the loss did not fall ({first['loss']:.3f} -> {last['loss']:.3f})")
    return 0


def _sparkline(values: list[float]) -> str:
    bars = "▁▂▃▄▅▆▇█"
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return "".join(bars[int((v - lo) / span * (len(bars) - 1))] for v in values)
