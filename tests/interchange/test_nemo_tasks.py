"""``.nemo`` task models beyond NER: QA (NeMo's ``BERTQAModel``) and relation extraction (NeMo's
``TextClassificationModel``), fine-tuned here on the real fixture slices, exported, imported back.

- a TP2 fine-tuned QA model -> ``.nemo`` (TP2 x PP2) -> ours, and a TP2xPP2 fine-tuned RE model -> ``.nemo``
  (TP2) -> ours: every weight bit-equal; QA gives the same answers and n-best lists from ``predict qa``'s code
  on real SQuAD v2 questions (its windowing and n-best settings travel in ``model.dataset``), RE the same
  logits and labels;
- ``model_config.yaml`` names NeMo's class and carries the keys that class's ``__init__`` reads; the head's
  state-dict names and shapes are the ones NeMo 2.4's ``TokenClassifier``/``SequenceClassifier`` have,
  listed here from NeMo's source (not from our mapping);
- a head NeMo cannot rebuild (hidden layers wider than the encoder, tanh in text classification) exports with
  the reasons, and still round-trips bit-exact through ours.
"""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import torch
from finetune.ft_runs import ROOT, finetune_rank
from harness import run_world

QUICK = ["trainer.max_steps=3", "trainer.val_check_interval=3", "model.dataset.max_eval_examples=8"]
_NEMO = "nemo.collections.nlp.models."


def _archive(path: Path) -> tuple[dict, dict[str, dict], dict[str, str]]:
    """(model_config.yaml, every weight file's {name: shape}, artifact texts by original name)."""
    from omegaconf import OmegaConf

    cfg, weights, texts = {}, {}, {}
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            if not m.isfile():
                continue
            data = tf.extractfile(m).read()
            if m.name.endswith("model_config.yaml"):
                cfg = OmegaConf.to_container(OmegaConf.create(data.decode()))
            elif m.name.endswith("model_weights.ckpt"):
                sd = torch.load(io.BytesIO(data), weights_only=True)
                weights[m.name] = {k: tuple(v.shape) for k, v in sd.items() if torch.is_tensor(v)}
            else:
                name = Path(m.name).name  # artifacts are <uuid4 hex>_<original name>
                texts[name[33:] if re.match(r"^[0-9a-f]{32}_", name) else name] = data.decode()
    return cfg, weights, texts


def _without_dataset(path: Path, out: Path) -> Path:
    import yaml

    from bio_megatron.formats.nemo import archive as arc

    with arc.extracted(path) as root:
        cfg = yaml.safe_load((root / arc.CONFIG).read_text())
        del cfg["dataset"]
        (root / arc.CONFIG).write_text(yaml.safe_dump(cfg))
        arc.write_tar(root, out)
    return out


def _weights_equal(a, b) -> list[str]:
    """Names whose tensors differ (word-embedding rows past the vocabulary are padding and may differ)."""
    sa, sb = a.model.state_dict(), b.model.state_dict()
    vocab = a.tokenizer.vocab_size
    bad = sorted(set(sa) ^ set(sb))
    for k in set(sa) & set(sb):
        x, y = sa[k], sb[k]
        if torch.is_tensor(x) and x.dim() > 0 and x.shape[0] > vocab and "word_embeddings" in k:
            x, y = x[:vocab], y[:vocab]
        if torch.is_tensor(x) and not (torch.is_tensor(y) and x.shape == y.shape and torch.equal(x, y)):
            bad.append(k)
    return bad


def _roundtrip(task: str, ckpt: str, root: str, tp: int, pp: int) -> dict:
    from bio_megatron.formats.nemo.convert import export_nemo, import_nemo
    from bio_megatron.formats.finetuned import load_finetuned

    root_p = Path(root)
    summary = export_nemo(ckpt, root_p / f"{task}.nemo", tp=tp, pp=pp)
    back = import_nemo(root_p / f"{task}.nemo", root_p / f"{task}_ours")
    a, b = load_finetuned(ckpt), load_finetuned(root_p / f"{task}_ours")
    cfg, weights, texts = _archive(root_p / f"{task}.nemo")
    keys = [k for k in ("version_2_with_negative", "doc_stride", "max_query_length", "max_seq_length",
                        "max_answer_length", "n_best_size", "null_score_diff_threshold")
            if hasattr(a.cfg.model.dataset, k)]
    res = {"summary": summary, "back": back, "cfg": cfg, "texts": texts, "labels": (a.labels, b.labels),
           "not_bit_equal": _weights_equal(a, b),
           "dataset": ({k: getattr(a.cfg.model.dataset, k) for k in keys},
                       {k: getattr(b.cfg.model.dataset, k) for k in keys}),
           "head": {f: {k: s for k, s in w.items() if k.startswith("classifier.")} for f, w in weights.items()}}
    if task == "qa":
        from bio_megatron.predict.qa import answer
        from bio_megatron.tasks.qa_data import read_squad

        questions = read_squad(ROOT / "tests" / "fixtures" / "qa" / "squad_v2_dev_slice.json")[:6]
        res["answers"] = (answer(a, questions), answer(b, questions))
        bare = _without_dataset(root_p / "qa.nemo", root_p / "qa_bare.nemo")
        import_nemo(bare, root_p / "qa_bare_ours")
        c = load_finetuned(root_p / "qa_bare_ours")  # an archive NeMo's older QAModel wrote: no dataset block
        res["bare"] = (c.cfg.model.dataset.max_seq_length, len(answer(c, questions)[0]))
    else:
        g = torch.Generator().manual_seed(5)
        ids = torch.randint(5, a.tokenizer.vocab_size, (4, 24), generator=g)
        mask, types = torch.ones_like(ids), torch.zeros_like(ids)
        with torch.no_grad():
            la, lb = a.model(ids, mask, types), b.model(ids, mask, types)
        res.update(diff=(la - lb).abs().max().item(), scale=la.abs().max().item(),
                   predicted=([a.labels[i] for i in la.argmax(-1)], [b.labels[i] for i in lb.argmax(-1)]))
    return res


def _check_common(res: dict, task: str) -> None:
    assert res["not_bit_equal"] == [], res["not_bit_equal"]
    assert res["labels"][0] == res["labels"][1]
    assert res["summary"]["nemo_caveats"] == [] and res["back"]["task"] == task
    assert res["dataset"][0] == res["dataset"][1]
    cfg = res["cfg"]
    assert cfg["tokenizer"]["vocab_file"].startswith("nemo:") and "vocab.txt" in res["texts"]
    assert cfg["language_model"]["config"]["hidden_size"] == 64


# NeMo 2.4, read from nemo_toolkit-2.4.0's source:
# - models/question_answering/qa_bert_model.py:40-53  BERTQAModel: self.classifier = TokenClassifier(hidden_size,
#   num_classes=cfg.token_classifier.num_classes, num_layers=cfg.token_classifier.num_layers, activation, log_softmax,
#   dropout, use_transformer_init); inference reads cfg.dataset.{n_best_size, max_answer_length,
#   version_2_with_negative, null_score_diff_threshold, do_lower_case} (:149-153), doc_stride etc. (:519-526)
# - models/text_classification/text_classification_model.py:42-57  TextClassificationModel: SequenceClassifier(
#   hidden_size, num_classes=cfg.dataset.num_classes, num_layers=cfg.classifier_head.num_output_layers,
#   activation='relu', dropout=cfg.classifier_head.fc_dropout); class_labels.class_labels_file is an artifact
# - common/parts/multi_layer_perceptron.py:31-49  MultiLayerPerceptron: layer{0,2,...} = Linear(hidden, hidden),
#   layer{1,3,...} = getattr(torch, activation) (no weights), last = Linear(hidden, num_classes)
def _nemo_head(hidden: int, classes: int, layers: int) -> dict[str, tuple]:
    out = {}
    for i in range(layers - 1):
        out.update({f"classifier.mlp.layer{2 * i}.weight": (hidden, hidden),
                    f"classifier.mlp.layer{2 * i}.bias": (hidden,)})
    last = 2 * (layers - 1)
    return {**out, f"classifier.mlp.layer{last}.weight": (classes, hidden),
            f"classifier.mlp.layer{last}.bias": (classes,)}


def test_qa_roundtrips_with_the_same_answers(tmp_path):
    run_world(2, finetune_rank, "qa", QUICK + ["model.head.num_fc_layers=2", f"exp_manager.exp_dir={tmp_path}",
                                               "exp_manager.name=tp2", "model.tensor_model_parallel_size=2"])
    (res,) = run_world(1, _roundtrip, "qa", str(tmp_path / "tp2" / "checkpoints"), str(tmp_path), 2, 2)
    _check_common(res, "qa")
    cfg = res["cfg"]
    assert cfg["target"] == _NEMO + "question_answering.qa_bert_model.BERTQAModel"
    head = cfg["token_classifier"]  # every key BERTQAModel.__init__ reads
    assert sorted(head) == ["activation", "dropout", "log_softmax", "num_classes", "num_layers", "use_transformer_init"]
    assert (head["num_layers"], head["num_classes"], head["activation"], head["log_softmax"]) == (2, 2, "relu", False)
    assert {k: cfg["dataset"][k] for k in res["dataset"][0]} == res["dataset"][0]
    assert res["dataset"][0]["max_seq_length"] == 128 and res["dataset"][0]["doc_stride"] == 64  # not our defaults
    # the head rides on the last pipeline stage of every tensor-parallel rank, nowhere else
    assert {f: h for f, h in res["head"].items() if h} == {
        f"./tp_rank_{t:02d}_pp_rank_001/model_weights.ckpt": _nemo_head(64, 2, 2) for t in range(2)}
    (preds_a, nbest_a), (preds_b, nbest_b) = res["answers"]
    assert len(preds_a) == 6 and preds_a == preds_b and nbest_a == nbest_b
    assert res["bare"] == (128, 6)  # our 384-token default cut to the encoder's 128 positions: predict still runs


def test_re_roundtrips_with_the_same_logits_and_labels(tmp_path):
    run_world(4, finetune_rank, "re", QUICK + ["model.classifier_head.activation=relu", "exp_manager.name=tp2pp2",
                                               f"exp_manager.exp_dir={tmp_path}", "model.tensor_model_parallel_size=2",
                                               "model.pipeline_model_parallel_size=2"])
    (res,) = run_world(1, _roundtrip, "re", str(tmp_path / "tp2pp2" / "checkpoints"), str(tmp_path), 2, 1)
    _check_common(res, "re")
    cfg, labels = res["cfg"], res["labels"][0]
    assert len(labels) > 2 and res["scale"] > 1e-3 and res["diff"] == 0.0, res
    assert res["predicted"][0] == res["predicted"][1]
    assert cfg["target"] == _NEMO + "text_classification.text_classification_model.TextClassificationModel"
    assert cfg["classifier_head"]["num_output_layers"] == 2 and cfg["classifier_head"]["activation"] == "relu"
    assert cfg["dataset"]["num_classes"] == len(labels) and cfg["label_ids"] == {k: i for i, k in enumerate(labels)}
    ref = cfg["class_labels"]["class_labels_file"]
    assert ref.startswith("nemo:") and res["texts"]["label_ids.csv"].splitlines() == labels
    assert {f: h for f, h in res["head"].items() if h} == {
        f"./mp_rank_{t:02d}/model_weights.ckpt": _nemo_head(64, len(labels), 2) for t in range(2)}


def test_heads_nemo_cannot_rebuild_are_named_and_still_roundtrip(tmp_path):
    run_world(1, finetune_rank, "re", ["trainer.max_steps=1", "trainer.val_check_interval=1",
                                       "model.dataset.max_eval_examples=4", "model.fc_hidden_size=96",
                                       f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=wide"])
    (res,) = run_world(1, _roundtrip, "re", str(tmp_path / "wide" / "checkpoints"), str(tmp_path), 1, 1)
    caveats = res["summary"]["nemo_caveats"]
    assert len(caveats) == 2 and "fc_hidden_size 96" in caveats[0] and "'tanh'" in caveats[1], caveats
    assert res["not_bit_equal"] == [] and res["diff"] == 0.0 and res["predicted"][0] == res["predicted"][1]
    assert res["head"]["./model_weights.ckpt"]["classifier.mlp.layer0.weight"] == (96, 64)
