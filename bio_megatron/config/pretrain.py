"""The pretraining config: NeMo's ``model`` block as typed dataclasses, beside the run's ``trainer`` and
``exp_manager`` blocks (``config/run.py``), and the checks of the encoder, batch and layout it shares with
fine-tuning.

Field names follow NeMo's ``megatron_bert_config.yaml`` so that a NeMo user's overrides carry over.
Problems are collected and raised together (see ``validate``), quoting the offending values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bio_megatron.config.family_keys import albert_problems, electra_problems, modernbert_problems
from bio_megatron.config.loader import build_config, load_document
from bio_megatron.config.packing import packing_problems
from bio_megatron.config.run import RunConfig, TrainerConfig, run_dir_problems
from bio_megatron.config.scale import recompute_problems, sequence_parallel_problems
from bio_megatron.config.sizes import SIZES, ModelShape, size_row
from bio_megatron.config.values import value_problems
from bio_megatron.utils.errors import ConfigError


@dataclass
class TokenizerConfig:
    vocab_file: str = "bert_base_uncased"
    """A WordPiece vocab.txt path, a byte-level BPE folder / vocab.json, an ALBERT SentencePiece .model (NeMo's
    ``library: sentencepiece`` + ``tokenizer_model: X.model`` set this key), or a built-in name: bert_base_cased,
    bert_base_uncased."""
    do_lower_case: bool | None = None
    """None: guessed from the vocabulary."""


@dataclass
class DataConfig:
    data_prefix: list | str = field(default_factory=list)
    """Megatron blending list ``[weight, prefix, weight, prefix, ...]`` (or a single prefix)."""
    splits_string: str = "900,50,50"
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    masking: Literal["token", "whole_word"] | None = None
    """BERT's masking unit. whole_word (PubMedBERT, BioM-BERT, Megatron-LM): a word's ``##`` continuations are
    masked, kept or replaced together with its first piece; token: each WordPiece on its own (original BERT).
    None: from ``whole_word_masking``, else whole_word."""
    whole_word_masking: bool | None = None
    """Older spelling of ``masking`` (true = whole_word), still read; set only one of the two, or equal values."""
    max_ngram: int = 1
    index_mapping_dir: str | None = None
    """Where megatron-core caches its sample indices (default: beside the run)."""
    seed: int | None = None
    """Masking/shuffling seed (defaults to trainer.seed)."""
    packing: Literal["documents"] | None = None
    """null: the objective's own rows (bert: one sample per row; mlm: FULL-SENTENCES across documents, attending to
    each other as fairseq's). documents (model.objective mlm): whole documents packed per row, each attending only
    to itself, position ids restarting per document (``bio_megatron/data/packing.py``; docs/SCALE.md)."""
    skip_vocab_check: bool = False
    """true: use data whose record (``<prefix>.bio_megatron.json``, written by ``data tokenize``) names another
    vocabulary or casing than model.tokenizer (only when the ids are known to agree)."""

    def whole_word(self) -> bool:
        """The resolved masking unit (``masking`` wins; conflicts are reported by ``problems``)."""
        if self.masking is not None:
            return self.masking == "whole_word"
        return self.whole_word_masking is not False

    def problems(self) -> list[str]:
        """The masking probability and unit, and the data prefix or blend."""
        problems = [] if 0.0 < self.masked_lm_prob < 1.0 else [
            f"model.data.masked_lm_prob ({self.masked_lm_prob}) must be in (0, 1)"]
        if None not in (self.masking, self.whole_word_masking) and self.whole_word_masking != (
                self.masking == "whole_word"):
            problems.append(f"model.data.masking ({self.masking}) contradicts model.data.whole_word_masking "
                            f"({self.whole_word_masking}); set only model.data.masking")
        dp = [self.data_prefix] if isinstance(self.data_prefix, str) else self.data_prefix
        if len(dp) > 1 and len(dp) % 2:
            problems.append(f"model.data.data_prefix ({dp}) must be [weight, path, weight, path, ...] "
                            "or a single path")
        return problems + _blend_weight_problems(dp)


@dataclass
class SchedConfig:
    name: Literal["CosineAnnealing", "WarmupAnnealing", "SquareRootAnnealing", "cosine", "linear",
                  "constant"] = "CosineAnnealing"
    """NeMo's names: CosineAnnealing (= cosine), WarmupAnnealing (= linear decay to min_lr at max_steps),
    SquareRootAnnealing (after warmup lr * sqrt((max_steps - step) / max_steps), at least min_lr)."""
    warmup_steps: int | None = None
    warmup_ratio: float | None = None
    min_lr: float = 0.0
    decay_steps: int | None = None
    """The step at which the decay reaches min_lr, counted from step 0 like Megatron's lr_decay_steps
    (default: max_steps)."""
    constant_steps: int | None = None
    """NeMo's CosineAnnealing: hold min_lr for the last N steps (the decay ends at max_steps - N)."""
    override_opt_param_scheduler: bool = False
    """Megatron-LM's --override-opt_param-scheduler: on resume, take the LR schedule (lr, min_lr, warm-up, decay
    length and style, weight decay) from this config instead of the checkpoint; only the step count is restored."""

    def problems(self) -> list[str]:
        """Keys that exclude each other, or that the schedule does not have."""
        problems = []
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            problems.append("set only one of model.optim.sched.warmup_steps "
                            f"({self.warmup_steps}) and warmup_ratio ({self.warmup_ratio})")
        if self.constant_steps is not None:
            if self.name not in ("CosineAnnealing", "cosine"):
                problems.append(f"model.optim.sched.constant_steps ({self.constant_steps}) applies to "
                                f"CosineAnnealing only, not {self.name}")
            if self.decay_steps is not None:
                problems.append(f"set only one of model.optim.sched.constant_steps ({self.constant_steps}) and "
                                f"decay_steps ({self.decay_steps})")
        return problems


@dataclass
class OptimConfig:
    name: Literal["adam", "adamw", "fused_adam", "lamb"] = "adamw"
    """NeMo's names. adam: L2 weight decay added to the gradient; adamw, fused_adam: decoupled weight decay;
    lamb: LAMB (You et al. 2020; ALBERT, BioM-ALBERT), layer-wise trust ratio over decoupled weight decay
    (``bio_megatron/training/lamb.py``)."""
    lr: float = 2e-4
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    fused: bool | None = None
    """torch.optim's ``fused`` (as NeMo passes it to a torch optimizer), where megatron-core runs torch's Adam
    (no Transformer Engine/apex): null or true = the fused kernel, on CPU and GPU; false = torch's default
    (single-tensor on CPU, foreach on GPU: the numerics of runs before 2026-11-23 on CPU, before 2026-11-27 on
    GPU). See docs/BENCHMARKS.md."""
    bias_correction: bool = True
    """name lamb only (apex FusedLAMB's / NeMo's key): divide the moments by 1 - beta^t, as apex does; false gives
    the update of the TF LAMB that ALBERT and BioM-ALBERT were trained with (no bias correction)."""
    sched: SchedConfig = field(default_factory=SchedConfig)

    def problems(self) -> list[str]:
        """The schedule's problems, then the betas and the settings the chosen optimizer does not have."""
        problems = self.sched.problems()
        if len(self.betas) != 2:
            problems.append(f"model.optim.betas ({self.betas}) must be two numbers")
        if self.name != "lamb":
            return problems + ([] if self.bias_correction else [
                f"model.optim.bias_correction (false) applies to model.optim.name lamb only (got {self.name}): "
                "Adam always corrects its moments' bias"])
        if self.fused is not None:
            problems.append(f"model.optim.fused ({str(self.fused).lower()}) chooses torch's Adam kernel; "
                            "model.optim.name lamb has no such option: leave it null")
        return problems


@dataclass
class ModelConfig:
    size: str = "345m"
    """A row of the size table (tiny, 345m, 800m, 1.2b); num_layers etc. below override single fields."""
    num_layers: int | None = None
    hidden_size: int | None = None
    ffn_hidden_size: int | None = None
    num_attention_heads: int | None = None
    encoder_seq_length: int = 512
    max_position_embeddings: int = 512
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    micro_batch_size: int = 8
    global_batch_size: int = 256
    bert_binary_head: bool = False
    objective: Literal["bert", "mlm", "electra"] = "bert"
    """Pretraining objective. bert: megatron-core's BERT dataset (masked LM, plus NSP when bert_binary_head).
    mlm: RoBERTa / bio-lm (``bio_megatron/data/roberta.py``): masked LM only with dynamic masking, sequences
    packed from consecutive full sentences across documents; any vocabulary, byte-level BPE included.
    electra: ELECTRA's replaced-token detection (``bio_megatron/models/electra.py``) on the bert dataset
    without NSP: a small generator fills the masked positions, the post-LN discriminator spots them."""
    generator_hidden_fraction: float = 1 / 3
    """objective electra: generator hidden size / hidden_size (ELECTRA-base 1/3, ELECTRA-large 1/4); the
    generator has the discriminator's depth, FFN 4x its width and heads of width min(64, the discriminator's)."""
    discriminator_loss_weight: float = 50.0
    """objective electra: loss = generator MLM loss + this x discriminator loss (ELECTRA's lambda)."""
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layernorm_epsilon: float = 1e-12
    init_method_std: float = 0.02
    make_vocab_size_divisible_by: int = 128
    num_tokentypes: int = 2
    family: str | None = None
    """The encoder family (``bio_megatron/families/``: megatron_bert, bert, roberta, electra, ...), checked against
    that registry when a model is built. Every checkpoint we write records it; null (NeMo's configs, older
    checkpoints) means it is inferred once from objective, tokenizer and block type (``families.family_of_model``)."""
    embedding_size: int | None = None
    """family albert: the factorised embedding's width E (word, position and token-type tables E wide, then a
    linear E -> hidden_size; ALBERT's 128). null: hidden_size. Other families: must stay null."""
    hidden_act: Literal["gelu", "gelu_new"] | None = None
    """family albert: the MLP and MLM-head activation, HF's name (gelu_new: the tanh approximation ALBERT uses,
    the default; gelu: exact). Other families compute exact GELU: must stay null or gelu."""
    global_rope_theta: float | None = None
    """family modernbert: the rotary base of the global-attention layers (null: ModernBERT's 160,000; a
    context-extension step sets a new one). Other families: must stay null."""
    local_rope_theta: float | None = None
    """family modernbert: the rotary base of the local (sliding-window) layers (null: ModernBERT's 10,000)."""
    local_attention: int | None = None
    """family modernbert: the local layers' window, in tokens (a token sees keys up to local_attention // 2
    positions away; null: ModernBERT's 128)."""
    global_attn_every_n_layers: int | None = None
    """family modernbert: layers 0, N, 2N, ... (0-based) attend globally, the others locally (null: ModernBERT's 3)."""
    transformer_block_type: Literal["pre_ln", "post_ln"] = "pre_ln"
    """NeMo's key. pre_ln: Megatron BERT (LayerNorm before each sub-layer, final LayerNorm); post_ln: the
    original BERT order (BioBERT, PubMedBERT: LayerNorm after each residual add, embedding LayerNorm, no
    final LayerNorm). post_ln runs on megatron-core's local spec (Transformer Engine fuses pre-LN only)."""
    transformer_impl: Literal["auto", "local", "transformer_engine"] = "auto"
    """auto: Transformer Engine when importable on GPU, else megatron-core's local spec."""
    attention_backend: Literal["auto", "sdpa", "unfused"] = "auto"
    """Local spec only: auto = PyTorch SDPA (flash/efficient kernels) on GPU, unfused on CPU."""
    use_distributed_optimizer: bool = False
    gradient_accumulation_fusion: bool | None = None
    """Megatron-LM's key: linears (and on the CPU the word embedding) add their weight gradients straight into
    DDP's gradient buffer. null: on on the CPU, off on a GPU (NeMo's default); true: on (on a GPU it needs apex);
    false: off (a fresh gradient per weight, added in by DDP's hook)."""
    bias_dropout_add_fusion: bool | None = None
    """NeMo's key: each sub-layer's bias add, dropout and residual add as one compiled function (megatron-core's
    bias_dropout_fusion, built with torch.compile) instead of three kernels. null: off, as before 2026-11-27
    (docs/BENCHMARKS.md: `bench pretrain --bda-fusion` measures it); true: on, where torch.compile works (a GPU
    with Triton, a CPU with a C++ compiler). Same function; with dropout on, other random masks."""
    activations_checkpoint_granularity: Literal["selective", "full"] | None = None
    """NeMo's key (Megatron-LM's --recompute-granularity): recompute activations in the backward pass instead of
    keeping them, with megatron-core's recompute (same gradients, less memory, more compute). selective: every
    layer's core attention (scores, softmax, attention dropout, context: the [b, heads, s, s] tensors); full:
    whole layers, chosen by ``activations_checkpoint_method``; null: keep every activation."""
    activations_checkpoint_method: Literal["uniform", "block"] | None = None
    """granularity full (Megatron-LM's --recompute-method): uniform: each pipeline stage's layers in groups of
    ``activations_checkpoint_num_layers``, only each group's input kept; block: the first
    ``activations_checkpoint_num_layers`` layers of each stage recomputed, the rest kept."""
    activations_checkpoint_num_layers: int | None = None
    """granularity full (Megatron-LM's --recompute-num-layers): 1 to the layers per pipeline stage."""
    sequence_parallel: bool = False
    """NeMo's / Megatron-LM's key, pretraining with tensor_model_parallel_size >= 2: megatron-core's sequence
    parallelism; LayerNorms, dropout and residuals run on seq/TP positions per rank (activation memory / TP there),
    the tensor-parallel all-reduces become reduce-scatters and all-gathers. Same results."""
    native_amp_init_scale: float = 2.0**32
    """fp16 only (NeMo's key): the dynamic loss scaler's initial scale."""
    native_amp_growth_interval: int = 1000
    """fp16 only (NeMo's key): double the loss scale after this many steps without an overflow."""
    hysteresis: int = 2
    """fp16 only (NeMo's key): overflowing steps tolerated before the loss scale is halved."""
    min_loss_scale: float = 1.0
    """fp16 only: the loss scale is never halved below this (megatron-core's ``min_loss_scale``)."""
    restore_from_path: str | None = None
    """Start a new run from this checkpoint's model weights only (continued pretraining)."""
    require_restore_from_path: str | None = None
    """A recipe that only makes sense from existing weights names the reason here; ``restore_from_path``
    is then required, and its absence is a configuration error quoting the reason."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def shape(self) -> ModelShape:
        base = SIZES[self.size]
        dims = (self.num_layers or base.num_layers, self.hidden_size or base.hidden_size,
                self.num_attention_heads or base.num_attention_heads,
                self.ffn_hidden_size or (4 * self.hidden_size if self.hidden_size else base.ffn_hidden_size))
        same = dims == (base.num_layers, base.hidden_size, base.num_attention_heads, base.ffn_hidden_size)
        return ModelShape(*dims, status=base.status if same else "custom")  # the size's own dims, spelled out: that size

    def size_name(self) -> str:
        """``model.size``; where keys override its shape (NeMo's configs give every dimension), the size-table row the
        shape equals (a 12 x 768 encoder is ``base``), else ``custom``: never a size the encoder is not."""
        shape = self.shape()
        return self.size if shape.status != "custom" else size_row(shape)


@dataclass
class PretrainConfig(RunConfig):
    model: ModelConfig = field(default_factory=ModelConfig)


def validate(cfg: PretrainConfig, world_size: int | None = None) -> None:
    """Every problem with the config at once, each quoting its values. ``world_size`` adds layout checks."""
    t, every = cfg.trainer, cfg.exp_manager.checkpoint_callback_params.every_n_train_steps
    problems = [f"{k} ({v}) must be >= {lo}" for k, v, lo in (
        ("trainer.max_steps", t.max_steps, 1), ("trainer.val_check_interval", t.val_check_interval, 1),
        ("exp_manager.checkpoint_callback_params.every_n_train_steps", every, 0)) if v < lo]
    problems += encoder_problems(cfg.model, cfg.trainer, world_size, pretraining=True)
    problems += objective_problems(cfg.model)
    problems += packing_problems(cfg.model)
    problems += run_dir_problems(cfg.exp_manager)
    if cfg.model.require_restore_from_path and not cfg.model.restore_from_path:
        problems.append(f"model.restore_from_path is required by this recipe: {cfg.model.require_restore_from_path}")
    if problems:
        raise ConfigError(problems)


def objective_problems(m: ModelConfig) -> list[str]:
    """What ``model.objective: mlm`` (RoBERTa's dataset) and ``electra`` cannot do."""
    if m.objective == "electra":
        return electra_problems(m)
    if m.objective != "mlm":
        return []
    problems = []
    if m.bert_binary_head:
        problems.append("model.objective (mlm) has no next-sentence task: set model.bert_binary_head=false")
    if m.data.masking == "whole_word" or (m.data.masking is None and m.data.whole_word_masking):
        problems.append("model.objective (mlm) masks single tokens as RoBERTa; whole-word masking is BERT's "
                        "option: set model.data.masking=token")
    prefixes, _ = data_blend(m.data)
    if len(prefixes) > 1:
        problems.append(f"model.objective (mlm) reads one data prefix, not a blend of {len(prefixes)} "
                        f"({', '.join(prefixes)}): concatenate the corpora when tokenizing")
    return problems


def encoder_problems(m: ModelConfig, t: TrainerConfig, world_size: int | None = None,
                     pretraining: bool = False) -> list[str]:
    """Problems with the encoder, batch and parallel layout (shared by pretraining and fine-tuning)."""
    if m.size not in SIZES:
        return [f"model.size ({m.size!r}) must be one of {', '.join(SIZES)}"]
    s = m.shape()
    tp, pp = m.tensor_model_parallel_size, m.pipeline_model_parallel_size
    problems = [f"{name} ({v}) must be >= 1" for name, v in (
        ("model.tensor_model_parallel_size", tp), ("model.pipeline_model_parallel_size", pp),
        ("model.micro_batch_size", m.micro_batch_size), ("model.global_batch_size", m.global_batch_size),
        ("trainer.log_every_n_steps", t.log_every_n_steps), ("model.encoder_seq_length", m.encoder_seq_length))
        if v < 1]
    problems += value_problems(m, t)
    if problems:  # the divisibility checks below would divide by zero or mislead
        return problems
    if s.num_layers % pp:
        problems.append(f"num_layers ({s.num_layers}) must be divisible by pipeline_model_parallel_size ({pp})")
    if s.num_attention_heads % tp:
        problems.append(f"num_attention_heads ({s.num_attention_heads}) must be divisible by "
                        f"tensor_model_parallel_size ({tp})")
    if s.hidden_size % s.num_attention_heads:
        problems.append(f"hidden_size ({s.hidden_size}) must be divisible by num_attention_heads "
                        f"({s.num_attention_heads})")
    if s.ffn_hidden_size % tp:
        problems.append(f"ffn_hidden_size ({s.ffn_hidden_size}) must be divisible by tensor_model_parallel_size ({tp})")
    if m.encoder_seq_length > m.max_position_embeddings:
        problems.append(f"model.encoder_seq_length ({m.encoder_seq_length}) exceeds max_position_embeddings "
                        f"({m.max_position_embeddings})")
    if not s.num_layers % pp:  # recompute's layer counts are per pipeline stage
        problems += recompute_problems(m)
    problems += albert_problems(m)
    problems += modernbert_problems(m)
    problems += sequence_parallel_problems(m, pretraining)
    if m.global_batch_size % m.micro_batch_size:
        problems.append(f"global_batch_size ({m.global_batch_size}) must be a multiple of micro_batch_size "
                        f"({m.micro_batch_size})")
    problems += m.data.problems()
    problems += m.optim.problems()
    if m.transformer_block_type == "post_ln" and m.transformer_impl == "transformer_engine":
        problems.append("model.transformer_block_type (post_ln) needs model.transformer_impl local or auto, not "
                        "transformer_engine (its BERT spec fuses each LayerNorm into the next linear: pre-LN only)")
    return problems + _world_problems(m, t, world_size)


def _world_problems(m: ModelConfig, t: TrainerConfig, world_size: int | None) -> list[str]:
    """The layout against the launched world (when known): TP x PP divides it, the global batch divides by the
    micro-batch times the data-parallel size, and an explicit ``trainer.devices`` x ``num_nodes`` matches it."""
    tp, pp, problems = m.tensor_model_parallel_size, m.pipeline_model_parallel_size, []
    if world_size is not None:
        if world_size % (tp * pp):
            problems.append(f"tensor_model_parallel_size * pipeline_model_parallel_size ({tp} * {pp} = {tp * pp}) "
                            f"must divide the world size ({world_size})")
        else:
            dp = world_size // (tp * pp)
            if m.global_batch_size % (m.micro_batch_size * dp):
                problems.append(f"global_batch_size ({m.global_batch_size}) must be divisible by micro_batch_size "
                                f"* data-parallel size ({m.micro_batch_size} * {dp})")
        if isinstance(t.devices, int) and t.devices * t.num_nodes != world_size:
            problems.append(f"trainer.devices * trainer.num_nodes ({t.devices} * {t.num_nodes}) does not match "
                            f"the launched world size ({world_size}); set trainer.devices=auto or fix the launch")
    return problems


def load_pretrain_config(path: str | Path | None, overrides: list[str] = (), world_size: int | None = None
                         ) -> PretrainConfig:
    """Recipe + overrides -> validated ``PretrainConfig`` (raises ConfigError listing every problem)."""
    raw = load_document(path, list(overrides), "pretrain", world_size)
    return build_config(PretrainConfig, raw, lambda cfg: validate(cfg, world_size), str(path) if path else None)


def _blend_weight_problems(dp: list) -> list[str]:
    """Blend weights must be finite numbers >= 0 with a positive sum: megatron-core would normalise a negative
    or zero-sum blend into nonsense sampling ratios (or divide by zero) instead of refusing it."""
    if len(dp) < 2 or len(dp) % 2:
        return []
    out, weights = [], []
    for i, w in enumerate(dp[0::2]):
        try:
            value = float(w) if not isinstance(w, bool) else float("nan")
        except (TypeError, ValueError):
            value = float("nan")
        if not math.isfinite(value) or value < 0:
            out.append(f"model.data.data_prefix[{2 * i}] ({w!r}, the weight of {dp[2 * i + 1]!r}) must be a finite "
                       "number >= 0: the list is [weight, path, weight, path, ...]")
        weights.append(value)
    if not out and sum(weights) <= 0:
        out.append(f"model.data.data_prefix weights ({dp[0::2]}) sum to 0: at least one must be positive")
    return out


def data_blend(cfg: DataConfig) -> tuple[list[str], list[float] | None]:
    """``data_prefix`` as megatron-core's blend: (prefixes, weights or None)."""
    dp = [cfg.data_prefix] if isinstance(cfg.data_prefix, str) else cfg.data_prefix
    if len(dp) == 1:
        return [str(dp[0])], None
    weights = [float(w) for w in dp[0::2]]
    return [str(p) for p in dp[1::2]], weights
