"""The model folders ``bench finetune`` and ``bench predict`` give both sides: one Hugging Face folder, which our
side reads as ``finetune ... model.restore_from_path=FOLDER`` / ``predict ner --checkpoint FOLDER`` and the
baseline as ``AutoModelFor*.from_pretrained(FOLDER)``, so that both start from the same weights.

Without ``--model``: a seeded ``BertFor*`` of our ``tiny`` shape (post-LN BERT: 4 layers, hidden 64) over the
bundled BERT-cased vocabulary, for CI. With ``--model DIR`` (e.g. all-MiniLM-L6-v2): that encoder with a task head
for the benchmark's labels, seeded; a folder that already is a task model with those labels is used as it is.
"""

from __future__ import annotations

from pathlib import Path

from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

_CLASS = {"token": "BertForTokenClassification", "sequence": "BertForSequenceClassification"}
_SEED = 1234


def _tiny_config(vocab_size: int):
    from transformers import BertConfig

    from bio_megatron.config.sizes import SIZES

    s = SIZES["tiny"]
    return BertConfig(vocab_size=vocab_size, hidden_size=s.hidden_size, num_hidden_layers=s.num_layers,
                      num_attention_heads=s.num_attention_heads, intermediate_size=s.ffn_hidden_size,
                      max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12)


def task_folder(model: str | None, kind: str, labels: list[str], dst: Path) -> tuple[Path, str]:
    """A ``BertFor{Token,Sequence}Classification`` folder for ``labels`` (``kind``: token / sequence) and a
    description of it; written under ``dst`` unless ``model`` already is one."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    id2label = dict(enumerate(labels))
    label2id = {t: i for i, t in enumerate(labels)}
    if model is None:
        from bio_megatron.vocab.builtin import resolve_vocab

        vocab = resolve_vocab("bert_base_cased")
        tok = transformers.BertTokenizerFast(str(vocab), do_lower_case=False)
        cfg = _tiny_config(tok.vocab_size)
        cfg.num_labels, cfg.id2label, cfg.label2id = len(labels), id2label, label2id
        torch.manual_seed(_SEED)
        net = getattr(transformers, _CLASS[kind])(cfg)
        what = f"tiny BERT (seeded, {sum(p.numel() for p in net.parameters()) / 1e6:.1f} M parameters)"
    else:
        path = Path(model)
        if not (path / "config.json").is_file():
            raise CheckpointError(f"--model {model}: not a Hugging Face model folder (no config.json)")
        cfg = AutoConfig.from_pretrained(path)
        archs = getattr(cfg, "architectures", None) or []
        if any(a.endswith(_CLASS[kind].removeprefix("Bert")) for a in archs) and \
                [cfg.id2label[i] for i in range(len(cfg.id2label))] == list(labels):
            return path, f"{path} (as it is)"
        auto = (transformers.AutoModelForTokenClassification if kind == "token"
                else transformers.AutoModelForSequenceClassification)
        torch.manual_seed(_SEED)  # the new head's initialisation
        net = auto.from_pretrained(path, num_labels=len(labels), id2label=id2label, label2id=label2id)
        tok = AutoTokenizer.from_pretrained(path)
        what = f"{path} + a seeded {kind}-classification head ({sum(p.numel() for p in net.parameters()) / 1e6:.1f} M " \
               "parameters)"
    out = dst / f"hf_{kind}"
    net.save_pretrained(out)
    tok.save_pretrained(out)
    log.info("model for both sides: %s -> %s", what, out)
    return out, what
