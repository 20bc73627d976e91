"""Megatron-LM distributed (torch_dist) checkpoints in, resharded to TP1, checked against the model they came from.

The input is made the way Megatron-LM's ``pretrain_bert.py --ckpt-format torch_dist`` makes it, without
Megatron-LM installed: megatron-core's own ``BertModel`` (what ``--use-mcore-models`` builds; our
``build_model`` builds that class with the local layer spec) at TP2 x PP2 in a gloo world, with an optimizer,
saved by ``megatron.core.dist_checkpointing.save`` with the state-dict layout of Megatron-LM's
``megatron/training/checkpointing.py::generate_state_dict`` / ``save_checkpoint`` (NVIDIA/Megatron-LM at
commit 0032978f335e0b72490147137948f9a45269f9d7): ``args`` (a Namespace holding a megatron enum, as real
runs do), ``checkpoint_version`` 3.0, ``iteration``, ``model``, ``optimizer``, ``opt_param_scheduler``,
``rng_state`` (a ShardedObject over (PP, TP)), ``num_floating_point_operations_so_far``, the content metadata,
``iter_NNNNNNN/`` and ``latest_checkpointed_iteration.txt``. The same weights are also saved in our own format:
that is the reference the import is compared with (our loader reshards it through megatron-core, not through
the import's code). Older megatron-core kept the common state in ``common.pt``: that variant is made by writing
one beside the shards.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import zlib
from pathlib import Path

import pytest
import torch
from harness import cli_forked, run_world

from engine.pretrain_runs import TINY, overrides

ITERATION = 7


@pytest.fixture(scope="module", autouse=True)
def _parent_world_torn_down():
    """The imports below run in this (parent) process, which then holds a one-process gloo group; a test
    module that forks a world after this one must not inherit it."""
    yield
    from bio_megatron.parallel.distributed import teardown

    teardown()


def _write_rank(over: list[str], mlm_root: str, ours_root: str) -> None:
    """One rank of a TP2xPP2 world: a perturbed tiny BERT with NSP head, saved both ways."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.transformer.enums import AttnBackend

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.data.pretrain import load_tokenizer
    from bio_megatron.formats.megatron_lm.convert import _megatron_args
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training import checkpoint as ckpt
    from bio_megatron.training.optimizer import build_optimizer, build_scheduler
    from bio_megatron.training.pretrain import build_stage

    cfg = load_pretrain_config(TINY, over, world_size=4)
    m = cfg.model
    init_distributed()
    init_model_parallel(2, 2, cfg.trainer.seed)
    tok = load_tokenizer(cfg)
    model, ddp = build_stage(cfg, tok.vocab_size, torch.float32)
    tp_rank, pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    with torch.no_grad():  # init leaves biases 0 and LayerNorms 1: perturb them so a misplaced one shows
        for name, p in model.named_parameters():
            if p.dim() == 1:
                split = getattr(p, "tensor_model_parallel", False)
                g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{pp_rank}/{tp_rank if split else 0}".encode()))
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    optimizer = build_optimizer(m.optim, [ddp], torch.float32, 1.0, False)
    scheduler = build_scheduler(optimizer, m.optim, 10)
    ckpt.save_checkpoint(Path(ours_root), ITERATION, model, optimizer, scheduler, cfg, tok.vocab_file,
                         ckpt.Layout.current(False))

    padded = padded_vocab_size(tok.vocab_size, m.make_vocab_size_divisible_by, 2)
    args = _megatron_args(m, tok, 2, padded, ITERATION)
    args.pipeline_model_parallel_size, args.ckpt_format, args.use_dist_ckpt = 2, "torch_dist", True
    args.norm_epsilon, args.transformer_impl, args.attention_backend = m.layernorm_epsilon, "local", AttnBackend.auto
    sd_meta = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    model_sd = model.sharded_state_dict(metadata=dict(sd_meta))
    rng = {"random_rng_state": __import__("random").getstate(), "np_rng_state": __import__("numpy").random.get_state(),
           "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": None, "rng_tracker_states": {}}
    state = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": model_sd,
             "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=False, metadata=dict(sd_meta)),
             "opt_param_scheduler": scheduler.state_dict(),
             "rng_state": ShardedObject("rng_state", [rng], (2, 2), (pp_rank, tp_rank),
                                        replica_id=ps.get_data_parallel_rank()),
             "num_floating_point_operations_so_far": 0}
    it = Path(mlm_root) / f"iter_{ITERATION:07d}"
    if dist.get_rank() == 0:
        it.mkdir(parents=True)
    dist.barrier()
    ckpt._in_process_write_queue()  # no spawn Manager per save (see checkpoint.py)
    strategy = dist_checkpointing.serialization.get_default_save_sharded_strategy("torch_dist")
    dist_checkpointing.save(state, str(it), strategy, content_metadata=sd_meta)
    if dist.get_rank() == 0:
        (Path(mlm_root) / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))
        shutil.copyfile(tok.vocab_file, Path(mlm_root) / "vocab_used.txt")  # not beside: --vocab is tested
    dist.barrier()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("mcore_dist")
    over = overrides(root / "no-data", root, "run", tp=2, pp=2, steps=1, extra=("model.bert_binary_head=true",))
    run_world(4, _write_rank, over, str(root / "megatron_lm"), str(root / "ours"))
    return {"mlm": root / "megatron_lm", "ours": root / "ours", "vocab": root / "megatron_lm" / "vocab_used.txt",
            "root": root}


def _logits(ckpt: Path) -> tuple[dict, dict]:
    from bio_megatron.formats.verify import checkpoint_forward, fixed_batch
    from bio_megatron.formats.verify import load_pretraining

    forward, vocab, positions = checkpoint_forward(ckpt)
    ids, mask, types = fixed_batch(vocab, positions)
    with torch.no_grad():
        out = forward(ids, mask, types)
    model = load_pretraining(ckpt)[0]
    state = {k: (t[:vocab] if k in ("embedding.word_embeddings.weight", "output_layer.bias") else t)
             for k, t in model.state_dict().items() if torch.is_tensor(t)}
    return {"mlm": out["mlm"][mask.bool()][..., :vocab], "nsp": out["nsp"]}, state


def test_layout_is_megatron_lms(saved):
    it = saved["mlm"] / f"iter_{ITERATION:07d}"
    assert json.loads((it / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    assert (it / ".metadata").is_file() and list(it.glob("*.distcp"))


def _import_and_compare(mlm: str, out: str, vocab: str, ours: str) -> tuple[dict, bool, dict]:
    """In a forked 1-rank world: loading in the pytest parent would leave gloo/torch state that later forks inherit."""
    from bio_megatron.formats.megatron_lm.convert import import_megatron_lm

    summary = import_megatron_lm(Path(mlm), Path(out), vocab=Path(vocab))
    ref, ref_state = _logits(Path(ours))
    got, got_state = _logits(Path(out))
    same = ref_state.keys() == got_state.keys() and all(torch.equal(ref_state[k], got_state[k]) for k in ref_state)
    return summary, same, {key: (ref[key] - got[key]).abs().max().item() for key in ("mlm", "nsp")}


def test_tp2pp2_import_equals_source(saved, tmp_path):
    (res,) = run_world(1, _import_and_compare, str(saved["mlm"]), str(tmp_path / "imported"), str(saved["vocab"]),
                       str(saved["ours"]))
    summary, same, diffs = res
    assert (summary["format"], summary["tp"], summary["pp"], summary["iteration"]) == ("torch_dist", 2, 2, ITERATION)
    assert summary["binary_head"] is True
    assert same  # resharded bit-exactly
    for key, diff in diffs.items():
        print(f"torch_dist TP2xPP2 import, {key}: max |logit diff| {diff:.3g}")
        assert diff < 1e-5


def test_cli_verify_and_refusals(saved, tmp_path):
    """--verify through the CLI prints the max difference (transformers vs ours); a wrong vocabulary is refused."""
    cli = ["import", "megatron-lm", "--checkpoint", str(saved["mlm"])]
    ok = cli_forked(cli + ["--vocab", str(saved["vocab"]), "--out", str(tmp_path / "v"), "--verify"])
    assert ok.returncode == 0, ok.stderr[-2000:]
    report = json.loads(ok.stdout)["verify"]
    print(f"import megatron-lm --verify: max |logit diff| {report['max_abs_diff']:.3g} {report['outputs']}")
    assert report["verified"] and report["max_abs_diff"] < 1e-4 and set(report["outputs"]) == {"mlm", "nsp"}
    small = tmp_path / "small_vocab.txt"
    small.write_text("\n".join(saved["vocab"].read_text().splitlines()[:200]) + "\n")
    bad = cli_forked(cli + ["--vocab", str(small), "--out", str(tmp_path / "w")])
    assert bad.returncode == 2 and "wrong vocabulary file?" in bad.stderr and "Traceback" not in bad.stderr


def _copy(saved, tmp_path) -> tuple[Path, Path]:
    dst = tmp_path / "copy"
    shutil.copytree(saved["mlm"], dst)
    return dst, dst / f"iter_{ITERATION:07d}"


def _try_import(root: str, out: str, vocab: str) -> str:
    """Import in a forked 1-rank world; returns the format, or the CheckpointError's message."""
    from bio_megatron.formats.megatron_lm.convert import import_megatron_lm
    from bio_megatron.utils.errors import CheckpointError

    try:
        return import_megatron_lm(Path(root), Path(out), vocab=Path(vocab))["format"]
    except CheckpointError as exc:
        return f"CheckpointError: {exc}"


def test_common_pt_of_older_megatron_core_is_read(saved, tmp_path):
    """megatron-core <= 0.13 wrote the common state to common.pt; it wins over the shards, as in megatron-core."""
    from bio_megatron.formats.megatron_lm.dist import _common_state, _metadata

    root, it = _copy(saved, tmp_path)
    common = _common_state(it, _metadata(it))
    assert isinstance(common["args"], argparse.Namespace) and common["checkpoint_version"] == 3.0
    common["args"].openai_gelu = True
    torch.save(common, it / "common.pt")
    (msg,) = run_world(1, _try_import, str(root), str(tmp_path / "x"), str(saved["vocab"]))
    assert msg.startswith("CheckpointError") and "openai_gelu" in msg, msg
    common["args"].openai_gelu = False
    torch.save(common, it / "common.pt")
    assert run_world(1, _try_import, str(root), str(tmp_path / "y"), str(saved["vocab"])) == ["torch_dist"]


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_crafted_pickles_are_refused(saved, tmp_path):
    root, it = _copy(saved, tmp_path)
    good = (it / ".metadata").read_bytes()
    (it / ".metadata").write_bytes(pickle.dumps(_Evil()))
    (msg,) = run_world(1, _try_import, str(root), str(tmp_path / "x"), str(saved["vocab"]))
    assert msg.startswith("CheckpointError") and "refusing to load" in msg, msg
    (it / ".metadata").write_bytes(good)
    torch.save({"args": _Evil()}, it / "common.pt")
    (msg,) = run_world(1, _try_import, str(root), str(tmp_path / "y"), str(saved["vocab"]))
    assert msg.startswith("CheckpointError") and "refusing to load" in msg, msg
