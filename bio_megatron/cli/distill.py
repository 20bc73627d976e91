"""``bio-megatron distill``: task-agnostic knowledge distillation of a student from a teacher (bio-lm §7)."""

from __future__ import annotations

import argparse
import json

from bio_megatron.cli.pretrain import EXIT_CODES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distill", help="distil a student encoder from a teacher on the masked-LM data (single "
                       "process, torchrun or srun)",
                       description="Knowledge distillation as bio-lm (Lewis et al. 2020, section 7): the student "
                       "pretrains on masked LM while the teacher (model.teacher.restore_from_path: a checkpoint, HF "
                       "folder, .nemo or Megatron-LM checkpoint) runs forward in the same step; loss = alpha_mlm x "
                       "MLM + alpha_kl x KL(teacher || student, temperature T) + alpha_cos x cosine of the last "
                       "hidden states (model.distill.*). Teacher and student share the TP layout; PP is refused.",
                       epilog=EXIT_CODES)
    p.add_argument("--config", required=True, help="recipe YAML, e.g. nemo_configs/distill/tiny_distill.yaml")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. model.teacher.restore_from_path=runs/x "
                   "model.distill.alpha_cos=0")
    p.add_argument("--dry-run", action="store_true", help="check the config and the teacher against the student "
                   "(source, family, vocabulary, shape; no weights read), print both and exit")
    p.set_defaults(func=run_distill)


def run_distill(args: argparse.Namespace) -> int:
    from bio_megatron.config.distill import load_distill_config
    from bio_megatron.config.loader import to_dict
    from bio_megatron.config.recipes import find_recipe
    from bio_megatron.parallel.distributed import resolve_world
    from bio_megatron.parallel.seam import import_megatron_core

    import_megatron_core()  # before anything imports megatron-core: 1-2 s less start-up (parallel/lean_import.py)
    world = resolve_world()
    cfg = load_distill_config(find_recipe("distill", args.config), args.overrides,
                              None if args.dry_run else world.world_size)
    if args.dry_run:
        print(json.dumps({"config": to_dict(cfg), "teacher": _teacher_report(cfg)}, indent=2))
        return 0
    from bio_megatron.loading.teacher import load_teacher
    from bio_megatron.parallel.distributed import teardown
    from bio_megatron.training.distill import run_distillation

    try:
        run_distillation(cfg, load_teacher)
    finally:
        teardown()
    return 0


def _teacher_report(cfg) -> dict:
    """What the teacher is, as the run will build it (checked against the student)."""
    from bio_megatron.data.pretrain import load_tokenizer
    from bio_megatron.loading.teacher import inspect_teacher

    src, family, m = inspect_teacher(cfg, load_tokenizer(cfg).vocab_file)
    s = m.shape()
    return {"path": str(src.origin or src.path), "kind": src.kind, "family": family.name,
            "num_layers": s.num_layers, "hidden_size": s.hidden_size, "num_attention_heads": s.num_attention_heads,
            "ffn_hidden_size": s.ffn_hidden_size, "precision": cfg.model.teacher.precision or cfg.trainer.precision,
            "projection": bool(cfg.model.distill.alpha_cos) and s.hidden_size != cfg.model.shape().hidden_size}
