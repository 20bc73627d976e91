"""What the Hugging Face parity tests share: the padded batch, a random tiny HF model whose LayerNorms and biases
are moved off 1 and 0, ``bio-megatron import hf --verify`` of it through the CLI as a module fixture (so that
verification of every family is exercised as users run it), our logits of the imported checkpoint at a TP x PP
layout (megatron-core's pipeline schedule, gathered over TP), the fine-tuning encoder's hidden states, and the
``export hf`` round trips compared with our own logits. The functions that build models run inside
``run_world`` children (torch.distributed never starts in the pytest process)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from finetune.ft_runs import finetune_rank
from harness import run_world

ROOT = Path(__file__).resolve().parents[2]
VOCAB_FILE = ROOT / "bio_megatron" / "resources" / "vocab" / "bert_base_cased_vocab.txt"  # 28,996 -> 29,056


def vocab_lines(path: Path = VOCAB_FILE) -> int:
    return sum(1 for _ in open(path, encoding="utf-8"))


def padded_batch(vocab: int, seq: int, lens: tuple[int, ...], low: int = 5):
    """(ids, attention mask, token types): random ids from a fixed generator, rows right-padded to ``lens``,
    the second half of each row's real tokens of type 1."""
    import torch

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(low, vocab, (len(lens), seq), generator=g)
    amask = (torch.arange(seq)[None] < torch.tensor(lens)[:, None]).long()
    types = (torch.arange(seq)[None] >= (torch.tensor(lens)[:, None] // 2)).long() * amask
    return ids, amask, types


def perturb_norms_and_biases(model) -> None:
    """LayerNorm gains and all biases moved off 1 and 0, so that no mapping hides behind them."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias"):
                p.add_(torch.randn(p.shape) * 0.1)


def masked_max_diff(got, ref, valid) -> float:
    """max |got - ref| over the positions ``valid`` marks (padded query rows differ by design: megatron masks
    them, transformers computes them)."""
    return float(abs(got - ref)[valid].max())


def import_hf_folder(hf_dir: str, out: str, *extra: str) -> dict:
    """``bio-megatron import hf --model hf_dir --out out --verify`` through the CLI, as a user runs it (in a
    ``run_world`` child): transformers' own class for the folder's family against the written checkpoint. The
    printed JSON summary, with the exit code under ``rc``."""
    import contextlib
    import io
    import json

    from bio_megatron.cli import main

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["import", "hf", "--model", hf_dir, "--out", out, "--verify", *extra])
    text = stdout.getvalue()
    return {"rc": rc, **(json.loads(text[text.index("{"):]) if "{" in text else {"stdout": text})}


def imported(tmp_path_factory, name: str, make_hf: Callable[[str], dict]) -> tuple[Path, dict]:
    """(root, reference outputs): ``make_hf`` writes ``root/hf`` and returns transformers' outputs, which
    ``import hf`` turns into the pretraining checkpoint ``root/ckpt``."""
    root = tmp_path_factory.mktemp(name)
    (ref,) = run_world(1, make_hf, str(root / "hf"))
    (info,) = run_world(1, import_hf_folder, str(root / "hf"), str(root / "ckpt"))
    # the import was verified against transformers (exit 0, within fp32 tolerance) before any layout is compared
    assert info["rc"] == 0 and info["task"] is None, info
    assert info["verify"]["verified"] and info["verify"]["max_abs_diff"] < 1e-4, info["verify"]
    ref["import"] = info
    return root, ref


def pipeline_logits(ckpt: str, tp: int, pp: int, make_batch: Callable[[int], tuple], *, binary_head: bool,
                    attention: str = "unfused") -> dict | None:
    """The imported pretraining checkpoint at this layout on ``make_batch(vocab)`` (ids, mask[, types]): MLM
    logits gathered over TP and NSP logits (or None), on the last stage's first TP rank (None elsewhere)."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.models.bert import build_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.formats.source import resolve_source
    from bio_megatron.training.checkpoint import load_checkpoint
    from bio_megatron.vocab.bpe import load_tokenizer

    init_distributed()
    init_model_parallel(tp, pp, seed=1)
    src = resolve_source(ckpt)
    m = ModelConfig(**src.shape, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                    bert_binary_head=binary_head, hidden_dropout=0.0, attention_dropout=0.0, transformer_impl="local",
                    attention_backend=attention)
    m.make_vocab_size_divisible_by = src.padded_vocab // tp  # the saved padding, sharded over TP
    vocab = load_tokenizer(src.vocab_file).vocab_size
    model = build_model(m, vocab).eval()
    load_checkpoint(src.path, model, model_only=True)
    batch = make_batch(vocab)
    ids, amask = batch[0], batch[1]
    types = batch[2] if len(batch) > 2 else torch.zeros_like(ids)

    def step(_, mdl):
        out = mdl(ids, amask, tokentype_ids=types)
        if not ps.is_pipeline_last_stage():
            return out, None  # hidden states for the next stage
        logits, nsp = out if isinstance(out, tuple) else (out, None)
        return logits, lambda t, non_loss_data=True: (gather_from_tensor_model_parallel_region(t), nsp)

    with torch.no_grad():
        data = get_forward_backward_func()(forward_step_func=step, data_iterator=iter([None]), model=[model],
                                           num_microbatches=1, seq_length=ids.shape[1], micro_batch_size=ids.shape[0],
                                           forward_only=True, collect_non_loss_data=True)
    if not (ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0):
        return None
    logits, nsp = data[0]
    # numpy: tensors would cross the result queue through shared memory that dies with the child
    return {"mlm": logits[..., :vocab].numpy(), "nsp": None if nsp is None else nsp.numpy(),
            "padded_max": logits[..., vocab:].max().item(), "shape": src.shape, "vocab_file": Path(src.vocab_file).name,
            "block_type": m.transformer_block_type}


def encoder_hidden_diff(path: str, ids, amask, types, theirs) -> float:
    """The fine-tuning encoder (identity head = the last hidden states) filled from ``path`` (a checkpoint or an
    HF folder): max |ours - ``theirs``| over the real positions. Needs model parallel set up (TP1)."""
    import torch
    from torch import nn

    from bio_megatron.config.finetune import NerModelConfig
    from bio_megatron.families.task import build_task_model
    from bio_megatron.formats.fill import load_into
    from bio_megatron.formats.source import apply_source_shape, resolve_source

    src = resolve_source(path)
    m = NerModelConfig(hidden_dropout=0.0, attention_dropout=0.0, transformer_impl="local")
    apply_source_shape(m, src)
    model = build_task_model(m, src.padded_vocab or 29056, nn.Identity(), torch.float32, seed=0,
                             pre_process=True, post_process=True).eval()
    load_into(model, src, encoder_only=True)
    with torch.no_grad():
        return masked_max_diff(model(ids, amask, types), theirs, amask.bool())


def export_finetuned(ckpt: str, out: str) -> dict:
    """``export hf`` of a fine-tuned NER checkpoint: BertForTokenClassification's logits vs ours."""
    import torch
    from transformers import AutoTokenizer, BertForTokenClassification

    from bio_megatron.formats.hf.convert import export_hf
    from bio_megatron.formats.finetuned import load_finetuned

    info = export_hf(ckpt, out)
    tok = AutoTokenizer.from_pretrained(out)
    enc = tok(["Naloxone reverses the effect of clonidine.", "Cocaine"], padding=True, return_tensors="pt")
    loaded = load_finetuned(ckpt)
    hf = BertForTokenClassification.from_pretrained(out).eval()
    with torch.no_grad():
        ours = loaded.model(enc["input_ids"], enc["attention_mask"], torch.zeros_like(enc["input_ids"]))
        theirs = hf(**enc).logits
    valid = enc["attention_mask"].bool()
    return {"class": info["class"], "diff": masked_max_diff(ours, theirs, valid),
            "scale": float(ours[valid].abs().max())}


def export_mlm(ckpt: str, out: str, pad_from: int | None = None) -> dict:
    """``export hf`` of an engine-trained pretraining checkpoint, loaded as the class the export names
    (MegatronBertForMaskedLM for pre-LN, BertForMaskedLM for post-LN): its MLM logits vs ours on a random
    batch, the second row padded from ``pad_from`` on (None: no padding); padded positions are not compared."""
    import torch
    import transformers

    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.formats.hf.convert import export_hf
    from bio_megatron.models.bert import build_model
    from bio_megatron.formats.source import resolve_source
    from bio_megatron.training.checkpoint import load_checkpoint

    info = export_hf(ckpt, out)
    src = resolve_source(ckpt)
    m = ModelConfig(**src.shape, hidden_dropout=0.0, attention_dropout=0.0)
    m.make_vocab_size_divisible_by = src.padded_vocab
    vocab = vocab_lines(src.vocab_file)
    model = build_model(m, vocab, pre_process=True, post_process=True).eval()
    load_checkpoint(src.path, model, model_only=True)
    ids = torch.randint(5, vocab, (2, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if pad_from is not None:
        mask[1, pad_from:] = 0
    hf = getattr(transformers, info["class"]).from_pretrained(out).eval()
    with torch.no_grad():
        ours, _ = model(ids, mask, tokentype_ids=torch.zeros_like(ids))
        theirs = hf(input_ids=ids, attention_mask=mask).logits
    return {"class": info["class"], "diff": masked_max_diff(ours[..., :vocab], theirs, mask.bool()),
            "scale": float(theirs.abs().max())}


def finetune_ner_and_export(ckpt: Path, tmp_path: Path, *extra: str) -> dict:
    """``finetune ner`` (3 steps) from an imported post-LN pretraining checkpoint: finite, plausible losses and a
    post-LN saved config; its ``export hf`` is the plain BertForTokenClassification with our logits."""
    over = ["trainer.max_steps=3", "trainer.val_check_interval=3", "model.dataset.max_eval_examples=8",
            "model.dataset.test_file=null", *extra, "model.dataset.max_seq_length=64",
            f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=ner", f"model.restore_from_path={ckpt}"]
    (run,) = run_world(1, finetune_rank, "ner", over)
    assert len(run["losses"]) == 3 and all(0.0 < v < 10.0 for v in run["losses"]), run["losses"]
    saved = (tmp_path / "ner" / "checkpoints").rglob("config.yaml")
    assert any("transformer_block_type: post_ln" in p.read_text() for p in saved)
    (exp,) = run_world(1, export_finetuned, str(tmp_path / "ner" / "checkpoints"), str(tmp_path / "hf_ner"))
    assert exp["class"] == "BertForTokenClassification" and exp["scale"] > 0.01 and exp["diff"] < 1e-4, exp
    return exp
