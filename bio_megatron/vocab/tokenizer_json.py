"""A BPE tokenizer shipped as one ``tokenizers`` ``tokenizer.json`` (ModernBERT's: OLMo's byte-level BPE, with BERT's
``[CLS]``/``[SEP]``/``[PAD]``/``[MASK]``/``[UNK]`` as added tokens; no ``vocab.txt`` and no ``merges.txt``).

The file is run by the ``tokenizers`` library itself, so raw text is split exactly as transformers'
``PreTrainedTokenizerFast`` on that folder splits it. The roles BERT's special tokens play are found by name
(``[CLS]``/``<s>``, ``[SEP]``/``</s>``, ...); a file without one of them is refused, naming it. Fine-tuning formats
inputs as BERT does (``[CLS] a [SEP]``, pairs ``[CLS] a [SEP] b [SEP]`` with token types 0/1: ModernBERT's
template), and encodes pre-split NER words each in its leading-space form, as a byte-level fast tokenizer does with
``is_split_into_words`` (``add_prefix_space=True``). ``export hf`` copies the file back unchanged.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path

from bio_megatron.utils.errors import DataError
from bio_megatron.vocab.wordpiece import RustBackedTokenizer

TOKENIZER_JSON = "tokenizer.json"
# each role: the names it goes by (ModernBERT's BERT-style tokens first, then RoBERTa-style ones)
ROLES = {"cls": ("[CLS]", "<s>"), "sep": ("[SEP]", "</s>"), "pad": ("[PAD]", "<pad>", "<|padding|>"),
         "mask": ("[MASK]", "<mask>"), "unk": ("[UNK]", "<unk>")}
REQUIRED = tuple(ROLES)  # the unknown token too: the pretraining datasets exclude it from random replacements


def _model_type(file: Path) -> str | None:
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    model = doc.get("model") if isinstance(doc, dict) else None
    return model.get("type") if isinstance(model, dict) else None


def is_bpe_tokenizer_json(path: str | Path | None) -> bool:
    """Whether ``path`` is a ``tokenizer.json`` (or a folder holding one, without ``vocab.txt``) whose model is
    BPE: what this module loads (a WordPiece ``tokenizer.json`` is read as a ``vocab.txt``, formats/source.py)."""
    if path is None:
        return False
    path = Path(path)
    if path.is_dir():
        if (path / "vocab.txt").is_file() or (path / "vocab.json").is_file():
            return False
        path = path / TOKENIZER_JSON
    return path.name == TOKENIZER_JSON and path.is_file() and _model_type(path) == "BPE"


class TokenizerJsonBPE(RustBackedTokenizer):
    """A ``tokenizer.json`` BPE model with megatron-core's tokenizer attributes (``vocab_size``, ``cls``, ``sep``,
    ``pad``, ``mask``, ``unk``, ``unique_identifiers``) and the fine-tuning encoders of
    :class:`~bio_megatron.vocab.wordpiece.RustBackedTokenizer`."""

    def __init__(self, path: str | Path, lowercase: bool | None = None):
        path = Path(path)
        self.vocab_file = str(path / TOKENIZER_JSON if path.is_dir() else path)
        try:
            self.doc = json.loads(Path(self.vocab_file).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"unreadable tokenizer.json ({exc})", self.vocab_file) from None
        model = self.doc.get("model") if isinstance(self.doc, dict) else None
        if not isinstance(model, dict) or model.get("type") != "BPE":
            kind = model.get("type") if isinstance(model, dict) else None
            raise DataError(f"tokenizer model {kind!r}: only a BPE tokenizer.json is read here", self.vocab_file)
        self.vocab: dict[str, int] = self.backend.get_vocab(with_added_tokens=True)
        ids = self.vocab.values()
        if sorted(ids) != list(range(len(self.vocab))):
            raise DataError(f"token ids are not 0..N-1 without gaps ({len(self.vocab)} tokens, largest id "
                            f"{max(ids)})", self.vocab_file)
        self.roles = {role: next((self.vocab[n] for n in names if n in self.vocab), None)
                      for role, names in ROLES.items()}
        missing = [f"{role} ({' or '.join(ROLES[role])})" for role in REQUIRED if self.roles[role] is None]
        if missing:
            raise DataError(f"tokenizer.json lacks the special token(s) {', '.join(missing)}", self.vocab_file)
        self.lowercase = "Lowercase" in json.dumps(self.doc.get("normalizer"))

    cls = property(lambda self: self.roles["cls"])
    sep = property(lambda self: self.roles["sep"])
    pad = property(lambda self: self.roles["pad"])
    mask = property(lambda self: self.roles["mask"])
    unk = property(lambda self: self.roles["unk"])
    bos, eos = cls, sep

    @property
    def special_tokens_dict(self) -> dict[str, int]:
        return {f"{role}_token": i for role, i in self.roles.items() if i is not None}

    @cached_property
    def unique_identifiers(self) -> dict[str, str | bool]:
        """Keys megatron-core hashes into its dataset cache names: a changed file must not reuse them."""
        digest = hashlib.sha256(Path(self.vocab_file).read_bytes()).hexdigest()[:16]
        return {"class": type(self).__name__, "vocab_sha256": digest, "lowercase": self.lowercase}

    @cached_property
    def backend(self):
        """The file's own Rust tokenizer (normalizer, pre-tokenizer, BPE, decoder), built lazily."""
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_file(self.vocab_file)
        except Exception as exc:  # the tokenizers library's own parse errors
            raise DataError(f"tokenizer model 'BPE' that the tokenizers library cannot read "
                            f"({str(exc).splitlines()[0]})", self.vocab_file) from None

    @cached_property
    def word_backend(self):
        """Pre-split words as a byte-level fast tokenizer encodes them with ``is_split_into_words``: each word,
        the first too, in its leading-space form (the file's own tokenizer when it is not byte-level)."""
        from tokenizers import Tokenizer

        doc = json.loads(json.dumps(self.doc))
        pre = doc.get("pre_tokenizer") or {}
        levels = [pre] + list(pre.get("pretokenizers") or [])
        for p in levels:
            if isinstance(p, dict) and p.get("type") == "ByteLevel":
                p["add_prefix_space"] = True
        return Tokenizer.from_str(json.dumps(doc))

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.inv_vocab[int(i)] for i in ids]


def save_tokenizer_json(out: Path, tokenizer_file: str | Path) -> None:
    """``tokenizer.json`` copied unchanged beside an exported model, with the ``tokenizer_config.json`` that lets
    ``AutoTokenizer`` load it (transformers' ``PreTrainedTokenizerFast`` with BERT's special-token roles)."""
    import shutil

    tok = TokenizerJsonBPE(tokenizer_file)
    shutil.copyfile(tokenizer_file, Path(out) / TOKENIZER_JSON)
    names = {role: tok.inv_vocab[i] for role, i in tok.roles.items() if i is not None}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_input_names": ["input_ids", "attention_mask"],
              "clean_up_tokenization_spaces": False, **{f"{role}_token": t for role, t in names.items()}}
    (Path(out) / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
