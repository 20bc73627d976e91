"""``import nemo`` / ``export nemo``: NeMo ``.nemo`` archives <-> BioMegatron checkpoints.

Import reads NeMo 1.x-2.4 ``MegatronBertModel`` archives and the task models whose encoder is Megatron BERT
(``TokenClassificationModel`` -> ner, ``BERTQAModel``/``QAModel`` -> qa, ``TextClassificationModel`` -> re):
``model_config.yaml`` (OmegaConf), the weights in every layout of :mod:`~bio_megatron.formats.nemo.archive`,
the WordPiece vocabulary artifact, and for task models the ``classifier`` head and the label map
(``label_ids`` in the config, else the ``label_ids.csv`` artifact). The result is a model-only checkpoint of
ours (TP1; loadable at any layout), which ``finetune``/``predict`` use like any other.

Export writes what NeMo 2.4's ``MegatronBertModel.restore_from`` (``NLPSaveRestoreConnector``) reads: a tar
with ``model_config.yaml``, ``model_weights.ckpt`` (TP1 x PP1), ``mp_rank_TT/`` (``--tp``) or
``tp_rank_TT_pp_rank_PPP/`` (``--pp``) under the legacy module's names, or with ``--mcore`` a
``model_weights/`` dist checkpoint under megatron-core's names (``mcore_bert: true``), plus the vocabulary
artifact. NeMo ties the token-type embeddings to the binary head (``num_tokentypes = 2 if bert_binary_head
else 0``): a pretraining model without it has its type-0 row folded into the position embeddings (exact for
single-segment input; the unfolded tables ride along in ``bio_megatron_embeddings.pt``, which NeMo ignores
and our import uses, so round trips are bit-exact).
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
import yaml

from bio_megatron.config.sizes import padded_vocab_size
from bio_megatron.formats.nemo import archive as arc
from bio_megatron.formats.nemo.state import (PRETRAIN_PREFIX, TASK_PREFIX, dist_to_ours, ours_to_dist,
                                                 ours_to_shards, shards_to_ours)
from bio_megatron.formats.safe_load import safe_torch_load
from bio_megatron.formats.state import ModelState
from bio_megatron.utils.errors import CheckpointError, OutputError
from bio_megatron.utils.io import atomic_path, check_output_dir, check_output_file
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
EXPORT_COMMAND, IMPORT_COMMAND = "export nemo", "import nemo"
SIDE_FILE = "bio_megatron_embeddings.pt"
_TASK_OF_CLASS = {"TokenClassificationModel": "ner", "QAModel": "qa", "BERTQAModel": "qa",
                  "TextClassificationModel": "re", "MegatronBertModel": None}
_SHAPE_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "max_position_embeddings",
               "layernorm_epsilon", "make_vocab_size_divisible_by")


# --- import -------------------------------------------------------------------------------------------
def _read_config(root: Path, where: str) -> dict:
    from omegaconf import OmegaConf

    if not (root / arc.CONFIG).is_file():
        raise CheckpointError(f"{where}: no {arc.CONFIG} inside (not a .nemo archive?)")
    cfg = OmegaConf.load(root / arc.CONFIG)
    try:
        out = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # interpolations into the training script's config: keep them unresolved
        out = OmegaConf.to_container(cfg, resolve=False)
    return out if isinstance(out, dict) else {}


def _encoder_cfgs(cfg: dict) -> list[dict]:
    """Where NeMo keeps the encoder's settings: the model config, or a task model's ``language_model``."""
    lm = cfg.get("language_model") if isinstance(cfg.get("language_model"), dict) else {}
    return [c for c in (cfg, lm, lm.get("config") if isinstance(lm.get("config"), dict) else {}) if c]


def _setting(cfg: dict, key: str, default=None):
    return next((c[key] for c in _encoder_cfgs(cfg) if c.get(key) is not None), default)


def _shape_bytes(cfg: dict) -> int | None:
    """What an archive of this config's encoder can hold (fp32 weights; the vocabulary, which the config does not
    give, at its largest), for :func:`~bio_megatron.formats.nemo.archive.extracted`; None if it names no shape."""
    from bio_megatron.formats.archives import shape_bound

    values = {k: _setting(cfg, k) for k in ("hidden_size", "num_layers", "ffn_hidden_size", "max_position_embeddings")}
    if not all(isinstance(values[k], int) and values[k] > 0 for k in ("hidden_size", "num_layers")):
        return None
    ffn, pos = values["ffn_hidden_size"], values["max_position_embeddings"]
    return shape_bound(values["hidden_size"], values["num_layers"], ffn if isinstance(ffn, int) else None,
                       positions=pos if isinstance(pos, int) else 4096)


def _problems(cfg: dict) -> list[str]:
    """NeMo settings our BERT cannot reproduce exactly."""
    bad = []
    checks = {"transformer_block_type": ("pre_ln", "NeMo's post_ln differs from ours"),
              "normalization": ("layernorm", "only LayerNorm"), "position_embedding_type": ("learned_absolute", ""),
              "activation": ("gelu", "exact GELU only")}
    for key, (ok, why) in checks.items():
        value = _setting(cfg, key)
        if value is not None and str(value).lower() != ok:
            bad.append(f"{key} {value!r} (expected {ok!r}{'; ' + why if why else ''})")
    for key in ("openai_gelu", "onnx_safe", "apply_residual_connection_post_layernorm",
                "layernorm_zero_centered_gamma"):
        if _setting(cfg, key):
            bad.append(f"{key} true (tanh/erf-approximated GELU or another BERT variant)")
    if _setting(cfg, "bias", True) is False:
        bad.append("bias false (the engine's linear layers have biases)")
    if _setting(cfg, "virtual_pipeline_model_parallel_size"):
        bad.append("virtual_pipeline_model_parallel_size set (not supported)")
    return bad


def _task_of(cfg: dict, head: dict, where: str) -> str | None:
    target = str(cfg.get("target") or cfg.get("_target_") or "")
    cls = target.rsplit(".", 1)[-1]
    if cls in _TASK_OF_CLASS:
        return _TASK_OF_CLASS[cls]
    if head:
        raise CheckpointError(f"{where}: a task model ({target or 'no target'}) that is not token classification, "
                              "QA or text classification")
    return None


def _vocab(root: Path, cfg: dict, where: str) -> tuple[Path, bool | None]:
    tok = cfg.get("tokenizer") if isinstance(cfg.get("tokenizer"), dict) else {}
    vocab = arc.artifact(root, tok.get("vocab_file"), where) or arc.find_artifact(root, "vocab.txt")
    if vocab is None:
        raise CheckpointError(f"{where}: no WordPiece vocabulary inside (tokenizer.vocab_file "
                              f"{tok.get('vocab_file')!r}); only BERT WordPiece tokenizers are read")
    kind = " ".join(str(tok.get(k) or "") for k in ("type", "tokenizer_name")).lower()
    if "lowercase" in kind or "uncased" in kind:
        lower = True
    elif "case" in kind:  # BertWordPieceCase, megatron-bert-cased
        lower = False
    else:
        lower = tok.get("do_lower_case", _setting(cfg, "do_lower_case"))
    return vocab, lower


def _labels(root: Path, cfg: dict, task: str, classes: int, where: str) -> list[str] | None:
    if task == "qa":
        return None
    ids = cfg.get("label_ids")
    if isinstance(ids, dict) and ids:
        by_id = {int(v): str(k) for k, v in ids.items()}
        if sorted(by_id) != list(range(len(by_id))):
            raise CheckpointError(f"{where}: label_ids {ids} do not number the labels 0..{len(by_id) - 1}")
        labels = [by_id[i] for i in range(len(by_id))]
    else:
        file = arc.artifact(root, (cfg.get("class_labels") or {}).get("class_labels_file"), where) \
            or arc.find_artifact(root, "label_ids.csv")
        labels = [ln.strip() for ln in file.read_text(encoding="utf-8").splitlines() if ln.strip()] if file \
            else [str(i) for i in range(classes)]
    if len(labels) != classes:
        raise CheckpointError(f"{where}: {len(labels)} labels but the classifier has {classes} outputs")
    return labels


def _head_settings(task: str, cfg: dict, head: dict, hidden: int) -> dict:
    """Our head config from the weights (layer count, width) and NeMo's settings (activation, dropout)."""
    linears = sorted(int(k.split(".")[2][len("layer"):]) for k in head if k.endswith(".weight"))
    width = head[f"head.mlp.layer{linears[0]}.weight"].shape[0]
    fc_hidden = width if len(linears) > 1 and width != hidden else None
    if task == "re":
        h = cfg.get("classifier_head") or {}
        return {"classifier_head": {"num_output_layers": len(linears), "fc_dropout": h.get("fc_dropout", 0.1),
                                    "activation": h.get("activation", "relu"),
                                    "use_transformer_init": h.get("use_transformer_init", True)},
                "fc_hidden_size": fc_hidden}
    h = cfg.get("head") or cfg.get("token_classifier") or {}
    return {"head": {"num_fc_layers": len(linears), "fc_dropout": h.get("fc_dropout", h.get("dropout", 0.1)),
                     "activation": h.get("activation", "relu"),
                     "use_transformer_init": h.get("use_transformer_init", True)}, "fc_hidden_size": fc_hidden}


def read_archive(path: str | Path, num_attention_heads: int | None = None) -> dict:
    """A ``.nemo`` as our full TP1 state (NeMo's padded vocabulary rows), task head, shape, vocabulary text, label
    map and settings; :func:`read_nemo` makes it a ``ModelState``."""
    from bio_megatron.formats.megatron_lm.state import shape_of_state

    where = str(path)
    with arc.extracted(path, _shape_bytes) as root:
        cfg = _read_config(root, where)
        problems = _problems(cfg)
        if problems:
            raise CheckpointError(f"{where}: cannot be reproduced exactly: " + "; ".join(problems))
        heads = _setting(cfg, "num_attention_heads") or num_attention_heads
        kind, files = arc.weight_files(root, where)
        if kind == "dist":
            state, head = dist_to_ours(arc.load_dist(files, where), where), {}
            tp = pp = 1
        else:
            shards = {k: arc.load_state(f, where) for k, f in files.items()}
            tp, pp = max(k[0] for k in shards) + 1, max(k[1] for k in shards) + 1
            if heads is None:  # Megatron BERT's published shapes use 64-wide heads
                emb = next(v for k, v in shards[(0, 0)].items() if k.endswith("word_embeddings.weight"))
                heads = emb.shape[1] // 64
                log.warning("%s names no num_attention_heads: assuming %d (64 per head); pass "
                            "--num-attention-heads if that is wrong", where, heads)
            # megatron_legacy archives keep Megatron-LM 2020's QKV rows, [3, np, hn] (checkpoint_version 0)
            version = 0.0 if _setting(cfg, "megatron_legacy") else float(_setting(cfg, "checkpoint_version", 3.0))
            state, head = shards_to_ours(shards, version, heads, where)
        side = root / SIDE_FILE
        if side.is_file():
            _unfold(state, safe_torch_load(side), where)
        vocab_file, lower = _vocab(root, cfg, where)
        vocab_text = vocab_file.read_text(encoding="utf-8")
        task = _task_of(cfg, head, where)
        nemo_shape = {k: _setting(cfg, k) for k in _SHAPE_KEYS}
        heads = heads or state["embedding.word_embeddings.weight"].shape[1] // 64
        shape = shape_of_state(state, nemo_shape, heads, where)
        labels = settings = None
        if task is not None:
            if not head:
                raise CheckpointError(f"{where}: a {task} model without classifier weights")
            last = max(head, key=lambda k: int(k.split(".")[2][len("layer"):]))
            labels = _labels(root, cfg, task, head[last].shape[0], where)
            settings = _head_settings(task, cfg, head, shape["hidden_size"])
    return {"state": state, "head": head, "cfg": cfg, "task": task, "labels": labels, "settings": settings,
            "shape": shape, "vocab_text": vocab_text, "lower": lower, "tp": tp, "pp": pp, "layout": kind,
            "divisible": int(_setting(cfg, "make_vocab_size_divisible_by", 128)), "where": where}


def _unfold(state: dict, side: dict, where: str) -> None:
    """Put back the tables that export folded, when the archive's weights are still the ones it wrote."""
    pos, types = side.get("position_embeddings"), side.get("tokentype_embeddings")
    if not (torch.is_tensor(pos) and torch.is_tensor(types)) or "embedding.tokentype_embeddings.weight" in state:
        return
    if torch.equal(pos + types[0], state["embedding.position_embeddings.weight"]):
        state["embedding.position_embeddings.weight"], state["embedding.tokentype_embeddings.weight"] = pos, types
    else:
        log.warning("%s: %s does not match the weights (edited in NeMo?): ignored", where, SIDE_FILE)


def read_nemo(path: str | Path, scratch: Path, num_attention_heads: int | None = None) -> ModelState:
    """A ``.nemo`` archive as a :class:`ModelState` (pretraining, or a task model with its head and labels); its
    vocabulary is written to ``scratch``, a folder the caller keeps while it uses the state."""
    from bio_megatron.formats.nemo.build import state_of_archive

    return state_of_archive(read_archive(path, num_attention_heads), Path(scratch))


def import_nemo(model: str | Path, out: str | Path, num_attention_heads: int | None = None,
                overwrite: bool = False, verify: bool = False, tolerance: float | None = None) -> dict:
    """Write a BioMegatron checkpoint (TP1, model only; loadable at any layout) from a ``.nemo`` archive:
    :func:`read_nemo`, then :func:`~bio_megatron.formats.ours.write_ours`. ``verify``: the archive's weights in
    transformers vs the written checkpoint (:mod:`~bio_megatron.formats.nemo.verify`); the result's ``verify``
    holds the max logit difference."""
    from bio_megatron.formats.nemo.verify import verify_nemo_import
    from bio_megatron.formats.ours import write_ours

    check_output_dir(out, IMPORT_COMMAND, overwrite)  # refuse before unpacking gigabytes
    with tempfile.TemporaryDirectory(prefix="bio_megatron_nemo_vocab_") as scratch:
        state = read_nemo(model, Path(scratch), num_attention_heads)
        check = (lambda tmp, _tensors: verify_nemo_import(state, tmp, tolerance)) if verify else None
        report = write_ours(state, out, IMPORT_COMMAND, overwrite, check)
    info, shape = state.origin["nemo"], state.shape
    result = {"out": str(out), "task": state.task, "labels": state.labels, "tp": info["tp"], "pp": info["pp"],
              "layout": info["layout"], "binary_head": state.binary_head, "num_layers": shape.num_layers,
              "hidden_size": shape.hidden_size, "num_attention_heads": shape.num_attention_heads}
    if report is not None:
        result["verify"] = report
        if not report["verified"]:
            result["out"] = None
            return result
    log.info("imported %s (NeMo, %s, TP %d x PP %d) -> %s", state.source, state.task or "MegatronBertModel",
             info["tp"], info["pp"], out)
    return result


# --- export -------------------------------------------------------------------------------------------
def export_nemo(checkpoint: str | Path, out: str | Path, tp: int = 1, pp: int = 1, mcore: bool = False,
                overwrite: bool = False) -> dict:
    """Write ``out`` (a ``.nemo`` file) from our checkpoint (pretraining or fine-tuned, any saved layout)."""
    from bio_megatron.formats.nemo.build import head_caveats, load_for_export, nemo_config

    out = Path(out)
    check_output_file(out)
    if out.exists() and not overwrite:
        raise OutputError(f"{out}: exists; pass --overwrite to replace it")
    if mcore and (tp, pp) != (1, 1):
        raise CheckpointError("--mcore writes one dist checkpoint (NeMo reshards it on load): leave --tp/--pp at 1")
    ours = load_for_export(checkpoint)
    shape, vocab = ours.shape, ours.vocab_size
    if tp < 1 or pp < 1 or shape.num_attention_heads % tp or shape.ffn_hidden_size % tp or shape.num_layers % pp:
        raise CheckpointError(f"--tp {tp} / --pp {pp}: TP must divide num_attention_heads "
                              f"({shape.num_attention_heads}) and ffn_hidden_size ({shape.ffn_hidden_size}); PP "
                              f"must divide num_layers ({shape.num_layers})")
    full, side = dict(ours.tensors), None
    padded = padded_vocab_size(vocab, ours.model.make_vocab_size_divisible_by, tp)
    for key in ("embedding.word_embeddings.weight", "output_layer.bias"):
        if key in full:  # NeMo expects its own padding for this TP size; the extra rows are unused
            grown = full[key].new_zeros((padded,) + tuple(full[key].shape[1:]))
            grown[:vocab] = full[key][:vocab]
            full[key] = grown
    if ours.task is None and not ours.binary_head:
        side = _fold(full)
    caveats = head_caveats(ours)
    for caveat in caveats:
        log.warning("NeMo cannot rebuild this head exactly: %s", caveat)
    with atomic_path(out) as tmp_file, arc_dir(out) as tmp:
        vocab_name = arc.unique_name("vocab.txt")
        (tmp / vocab_name).write_text(ours.vocab_text, encoding="utf-8")
        labels_name = arc.unique_name("label_ids.csv") if ours.labels else None
        if labels_name:
            (tmp / labels_name).write_text("\n".join(ours.labels) + "\n", encoding="utf-8")
        cfg = nemo_config(ours, tp, pp, mcore, "nemo:" + vocab_name, labels_name and "nemo:" + labels_name)
        (tmp / arc.CONFIG).write_text(yaml.safe_dump(cfg, sort_keys=False))
        if mcore:
            arc.save_dist(ours_to_dist(full), tmp / "model_weights")
        else:
            prefix = PRETRAIN_PREFIX if ours.task is None else TASK_PREFIX
            for (t, p), shard in ours_to_shards(full, ours.head, tp, pp, prefix).items():
                sub = "" if (tp, pp) == (1, 1) else (f"mp_rank_{t:02d}/" if pp == 1 else
                                                     f"tp_rank_{t:02d}_pp_rank_{p:03d}/")
                (tmp / sub).mkdir(parents=True, exist_ok=True)
                torch.save(shard, tmp / sub / arc.WEIGHTS)
        if side is not None:
            torch.save(side, tmp / SIDE_FILE)
        arc.write_tar(tmp, tmp_file)
    log.info("exported %s -> %s (NeMo %s, TP %d x PP %d%s)", ours.source, out, cfg["target"].rsplit(".", 1)[-1],
             tp, pp, ", mcore dist checkpoint" if mcore else "")
    return {"out": str(out), "task": ours.task, "target": cfg["target"], "tp": tp, "pp": pp, "mcore": mcore,
            "binary_head": ours.binary_head, "labels": ours.labels, "tokentypes_folded": side is not None,
            "nemo_caveats": caveats}


def _fold(full: dict) -> dict | None:
    """No binary head, so NeMo has no token-type table: add its type-0 row to every position (what NeMo then
    computes is ours for single-segment input). Returns the unfolded tables for the side file."""
    types = full.pop("embedding.tokentype_embeddings.weight", None)
    if types is None:
        return None
    pos = full["embedding.position_embeddings.weight"]
    if types.shape[0] > 1 and not torch.equal(types[1], types[0]):
        log.warning("the token-type embeddings are trained: NeMo's BERT without binary head has none, so type 0 "
                    "is folded into the position embeddings and segment-B input is no longer distinguished there")
    full["embedding.position_embeddings.weight"] = pos + types[0]
    return {"position_embeddings": pos.clone(), "tokentype_embeddings": types.clone()}


@contextmanager
def arc_dir(out: Path) -> Iterator[Path]:
    """A scratch folder beside ``out`` (same file system, no /tmp filling up) for the archive's contents."""
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as d:
        yield Path(d)
