"""What an encoder family is: the one owner of everything that differs between Megatron BERT (pre-LN), original
BERT (post-LN), RoBERTa, ELECTRA and ALBERT. Export, loading, conversion and training ask the family through
:mod:`bio_megatron.families` (the registry) instead of re-deriving it from a tokenizer, an objective or a
``model_type`` string.

A family is a module-level object implementing :class:`Family` (structurally: no base class needed). Tensors
cross the family boundary as *full (TP1) megatron-core state dicts* on our side and as *Hugging Face state dicts*
on theirs; the model layout (TP/PP) is dist-checkpointing's business, never the family's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch import nn

    from bio_megatron.config.pretrain import ModelConfig

TokenizerKind = Literal["wordpiece", "bpe", "sentencepiece"]
# The ``ModelConfig`` fields of every family's shape: what a checkpoint's config.yaml records and a source carries
# over to the model loading it (``formats/source.py``).
COMMON_SHAPE_KEYS = ("size", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                     "max_position_embeddings", "num_tokentypes", "layernorm_epsilon", "make_vocab_size_divisible_by",
                     "transformer_block_type")
# What loading read before families declared ``shape_keys``: a family that declares none (ModernBERT's module, so
# far) keeps its rotary and attention-pattern keys this way. Keys absent from a checkpoint are never taken.
UNDECLARED_SHAPE_KEYS = COMMON_SHAPE_KEYS + ("global_rope_theta", "local_rope_theta", "local_attention",
                                             "global_attn_every_n_layers")
# ``None`` is the pretraining model (MLM head, + NSP/SOP head when trained with one).
HFTask = Literal["ner", "qa", "re", "classify"] | None


@runtime_checkable
class Family(Protocol):
    name: str
    """Recorded as ``model.family`` in every checkpoint's config.yaml and in bio_megatron.json."""
    hf_model_types: tuple[str, ...]
    """``config.json`` ``model_type`` values read as this family; the first is the one written."""
    tokenizer_kind: TokenizerKind
    block_type: str
    """``model.transformer_block_type`` of this family's layers (``pre_ln`` / ``post_ln``): a config recording the
    family with the other order is refused (:func:`bio_megatron.families.family_of_model`)."""

    def hf_class(self, task: HFTask, *, binary_head: bool = False) -> str:
        """The plain transformers class that holds this family's model for ``task`` (None: pretraining)."""

    def shape_from_hf(self, cfg: dict, where: str) -> dict:
        """``ModelConfig`` fields for an HF ``config.json``; CheckpointError (one line, quoting the values) for
        anything the engine cannot compute exactly."""

    def hf_config(self, m: ModelConfig, vocab_size: int, **extra):
        """The transformers ``PretrainedConfig`` for our model config (``extra``: labels, problem_type, ...)."""

    def to_hf(self, sd: dict[str, torch.Tensor], m: ModelConfig, vocab_size: int, *,
              binary_head: bool) -> dict[str, torch.Tensor]:
        """Full TP1 megatron-core encoder(+LM head) state -> HF state for ``hf_class(None)`` (padded vocabulary
        rows dropped)."""

    def from_hf(self, hsd: dict[str, torch.Tensor], m: ModelConfig, padded_vocab: int, *,
                binary_head: bool) -> dict[str, torch.Tensor]:
        """The inverse of :meth:`to_hf` (vocabulary zero-padded to ``padded_vocab``)."""

    def build_pretraining_model(self, m: ModelConfig, vocab_size: int, dtype: torch.dtype) -> MegatronModule:
        """This rank's pretraining model (encoder + the family's pretraining heads) for ``vocab_size`` real
        tokens, weights NOT initialised (``training.pretrain.build_stage`` calls ``init_weights``)."""

    def task_encoder(self, m: ModelConfig, padded_vocab: int, config: TransformerConfig, pre_process: bool,
                     post_process: bool) -> tuple[nn.Module | None, nn.Module]:
        """(embedding, encoder block) of this pipeline stage of a fine-tuning model (``families.task.TaskModel``):
        the embedding (None unless ``pre_process``) is called as ``embedding(input_ids=, position_ids=,
        tokentype_ids=)`` and returns ``[s, b, h]``; the block as ``block(hidden_states=, attention_mask=)``, with
        ``set_input_tensor`` for pipeline stages. Parameter names must be the pretraining model's, so that its
        checkpoint's shards load into the task model directly."""

    def head_to_hf(self, task: str, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A fine-tuned model's ``head.*`` weights under the names of the plain class ``hf_class(task)`` (only for
        heads that class computes; other heads travel under our names in the remote-code classes)."""

    def head_from_hf(self, task: str, hsd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The inverse of :meth:`head_to_hf` (KeyError names a missing weight)."""

    def hf_tokens(self, tokenizer) -> dict[str, int]:
        """The special-token ids this family's HF config records and its tensor map depends on (RoBERTa's
        ``pad_token_id`` fixes its position offset), passed to :meth:`hf_config` and :meth:`to_hf` as keywords;
        empty when nothing depends on them."""

    def export_problems(self, m: ModelConfig, task: HFTask, *, binary_head: bool = False) -> list[str]:
        """What ``m`` has that this family's HF classes cannot compute (each naming the key and value); the
        exporter refuses in one line when there is any."""

    shape_keys: tuple[str, ...]
    """The ``ModelConfig`` fields of this family's shape (:data:`COMMON_SHAPE_KEYS` and its own, e.g. ALBERT's
    ``embedding_size``): what a checkpoint records, :meth:`shape_from_hf` fills and a source carries over."""

    def save_tokenizer(self, out: Path, vocab_file: Path, lowercase: bool | None) -> None:
        """Write the tokenizer files an ``export hf`` folder carries for ``vocab_file`` into ``out`` (what
        transformers' tokenizer class of this family and ``import hf`` read back)."""

    def parameter_count(self, m: ModelConfig, padded_vocab: int) -> int:
        """The exact number of parameters of :meth:`build_pretraining_model` for ``m`` with ``padded_vocab``
        embedding rows (tied weights once): ``pretrain --dry-run``, the memory check and the benchmark report."""

    def encoder_parameter_count(self, m: ModelConfig, padded_vocab: int) -> int:
        """The exact number of parameters of :meth:`task_encoder` (the encoder a fine-tuning model puts its head on:
        no pretraining head): ``finetune --dry-run``."""

    task_head_from_pretraining: tuple[tuple[str, str], ...]
    """(task model tensor, pretraining model tensor) pairs, full (TP1) names: what a fine-tuning model's head starts
    from when ``finetune`` restores a pretraining model (our checkpoint at any layout, or an HF pretraining folder)
    rather than a checkpoint of its own task, as transformers' ``<Family>For<Task>.from_pretrained`` of a masked-LM
    folder takes the tensors both classes name alike (``formats.fill.load_into``). Empty: the whole head starts
    fresh, as every family's HF task classes but ModernBERT's do."""


class FamilyDefaults:
    """Defaults of the members added to :class:`Family` after its first families: a family class may inherit them,
    and the registry (:mod:`bio_megatron.families`) gives them to a registered family that defines none."""

    shape_keys: tuple[str, ...] = UNDECLARED_SHAPE_KEYS
    task_head_from_pretraining: tuple[tuple[str, str], ...] = ()  # nothing: the task head starts fresh

    def save_tokenizer(self, out: Path, vocab_file: Path, lowercase: bool | None) -> None:
        """The files of whichever tokenizer ``vocab_file`` is (:func:`save_tokenizer_files`)."""
        save_tokenizer_files(out, vocab_file, lowercase)

    def parameter_count(self, m: ModelConfig, padded_vocab: int) -> int:
        """megatron-core's ``BertModel`` (embeddings, layers, final LayerNorm, MLM head, + NSP head): exact for the
        BERT-shaped families; a family whose model differs defines its own."""
        from bio_megatron.config.sizes import parameter_count

        return parameter_count(m.shape(), padded_vocab, m.max_position_embeddings, m.num_tokentypes,
                               m.bert_binary_head)

    def encoder_parameter_count(self, m: ModelConfig, padded_vocab: int) -> int:
        """megatron-core's BertModel without its MLM head (dense + LayerNorm + output bias) or binary head: the
        encoder of every BERT-shaped family (ELECTRA's discriminator included)."""
        from bio_megatron.config.sizes import parameter_count

        h = m.shape().hidden_size
        mlm_head = h * h + h + 2 * h + padded_vocab
        return parameter_count(m.shape(), padded_vocab, m.max_position_embeddings, m.num_tokentypes) - mlm_head


def save_tokenizer_files(out: Path, vocab_file: Path, lowercase: bool | None) -> None:
    """The tokenizer files transformers loads for ``vocab_file``, by what it is: a one-file BPE ``tokenizer.json``
    (ModernBERT's) unchanged, a byte-level BPE (vocab.json + merges.txt), a SentencePiece model (spiece.model +
    AlbertTokenizer files), else WordPiece."""
    from bio_megatron.vocab.bpe import bpe_files
    from bio_megatron.vocab.sentencepiece import spiece_file

    if Path(vocab_file).name == "tokenizer.json":
        from bio_megatron.vocab.tokenizer_json import save_tokenizer_json

        save_tokenizer_json(out, vocab_file)
    elif bpe_files(vocab_file) is not None:
        save_bpe_files(out, vocab_file)
    elif spiece_file(vocab_file) is not None:
        save_spiece_files(out, vocab_file, lowercase)
    else:
        save_wordpiece_files(out, vocab_file, lowercase)


def save_bpe_files(out: Path, vocab_file: Path) -> None:
    """RoBERTa's vocab.json + merges.txt (+ tokenizer.json): what RobertaTokenizer and ``import hf`` read."""
    import shutil

    from bio_megatron.vocab.bpe import bpe_files

    bpe = bpe_files(vocab_file)
    for f in (*bpe, bpe[0].parent / "tokenizer.json"):
        if f.is_file():
            shutil.copyfile(f, out / f.name)


def save_spiece_files(out: Path, vocab_file: Path, lowercase: bool | None) -> None:
    """ALBERT's spiece.model and transformers' AlbertTokenizer files."""
    from bio_megatron.vocab.sentencepiece import save_sentencepiece, spiece_file

    save_sentencepiece(out, spiece_file(vocab_file), lowercase)


def save_wordpiece_files(out: Path, vocab_file: Path, lowercase: bool | None) -> None:
    """A BertTokenizer's files and the plain WordPiece vocab.txt."""
    from transformers import BertTokenizer

    tokens = Path(vocab_file).read_text(encoding="utf-8").split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    # transformers 5.x ignores BertTokenizer(vocab_file=...): pass the vocabulary itself.
    tok = BertTokenizer(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=lowercase)
    tok.save_pretrained(str(out))
    # transformers 5 writes only tokenizer.json; keep the plain WordPiece vocab.txt too (what import reads).
    (out / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
