"""What every ``export hf`` / ``import hf`` folder shares, whichever family writes it: the command names in its
output marker, the dtypes it can be written in, and the tokenizer files beside the weights. Both writers
(:mod:`.hf` and ELECTRA's two folders, :mod:`.hf_electra`) take them from here."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from bio_megatron.vocab.bpe import bpe_files

EXPORT_COMMAND, IMPORT_COMMAND = "export hf", "import hf"  # the names in each output folder's marker

EXPORT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def save_tokenizer(out: Path, vocab_file: Path, lowercase: bool) -> None:
    """The tokenizer files transformers loads for ``vocab_file``: RoBERTa's vocab.json + merges.txt, ALBERT's
    spiece.model (+ AlbertTokenizer files), a one-file BPE tokenizer.json (ModernBERT's) unchanged, else a
    BertTokenizer's files and the plain vocab.txt."""
    if Path(vocab_file).name == "tokenizer.json":
        from bio_megatron.vocab.tokenizer_json import save_tokenizer_json

        save_tokenizer_json(out, vocab_file)
        return
    bpe = bpe_files(vocab_file)
    if bpe is not None:  # RoBERTa: vocab.json + merges.txt are what RobertaTokenizer (and import hf) read
        for f in (*bpe, bpe[0].parent / "tokenizer.json"):
            if f.is_file():
                shutil.copyfile(f, out / f.name)
        return
    from bio_megatron.vocab.sentencepiece import save_sentencepiece, spiece_file

    if spiece_file(vocab_file) is not None:  # ALBERT: spiece.model + transformers' AlbertTokenizer files
        save_sentencepiece(out, spiece_file(vocab_file), lowercase)
        return
    from transformers import BertTokenizer

    tokens = Path(vocab_file).read_text(encoding="utf-8").split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    # transformers 5.x ignores BertTokenizer(vocab_file=...): pass the vocabulary itself.
    tok = BertTokenizer(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=lowercase)
    tok.save_pretrained(str(out))
    # transformers 5 writes only tokenizer.json; keep the plain WordPiece vocab.txt too (what import reads).
    (out / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
