"""``bio-megatron bench pretrain``: training throughput of our megatron-core model against Hugging Face.

Measured on one device, on the same shape and the same synthetic MLM batch (on CPU the HF side runs in a
process of its own, stepped from ours: ``bench/hf_process.py`` says why):

* **ours**: ``BioBertModel`` (TP1) in megatron-core DDP with ``get_megatron_optimizer``, one full train
  step per iteration through ``get_forward_backward_func()`` (forward, backward, grad clipping, Adam) —
  the code path ``bio-megatron pretrain`` runs;
* **hf**: ``MegatronBertForMaskedLM`` (``ForPreTraining`` with ``--binary-head``) with fp32 weights under
  ``torch.autocast`` (what the HF Trainer does for bf16/fp16), ``torch.optim.AdamW`` as the HF Trainer builds
  it by default (``adamw_torch_fused``: ``fused=True``, on CPU as on GPU; ``--hf-optimizer unfused`` gives
  torch's default implementation) and the same grad
  clipping. transformers 5.x ships MegatronBert with eager attention only and refuses
  ``attn_implementation="sdpa"``; ``--hf-attention sdpa`` (the default) therefore swaps each layer's
  self-attention for ``F.scaled_dot_product_attention`` so the baseline gets PyTorch's fused kernels too;
* on GPU, the achievable matmul rate (a large square matmul loop in the compute dtype), so that MFU is
  reported against both the data-sheet peak and the measured one.

TFLOP/s use ``flops_per_sequence`` (model FLOPs, x3 for training). Warmup steps are excluded from the
timing, and the device is synchronised around every timed step and between its parts (forward+backward,
optimizer step, the rest), which the result breaks the step time into. On CPU both models stay resident and
their timed steps alternate (``--schedule``), so that other processes' load, which moves a CPU step time
several-fold within minutes on a shared machine, weighs on both sides alike.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bio_megatron.bench.pretrain_common import SEED, optimizer_impl, synthetic_batch
from bio_megatron.bench.pretrain_runs import Measurement, interleaved, sequential
from bio_megatron.bench.timing import Laps, Step, free_memory
from bio_megatron.utils.log import get_logger

if TYPE_CHECKING:
    import torch

log = get_logger(__name__)

# BERT uncased WordPiece (the vocabulary of BioMegatron's uncased checkpoints); padded to 30,592.
DEFAULT_VOCAB = 30522


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bio_megatron.config.sizes import SIZES

    parser.add_argument("--size", required=True, choices=list(SIZES), help="row of the size table")
    parser.add_argument("--seq", type=int, default=512, help="sequence length (default 512)")
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="sequences per step (default 8 on GPU, 2 on CPU)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per model (default 20 GPU, 3 CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 5 GPU, 3 CPU)")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "16", "fp16", "32"],
                        help="compute precision (honoured on CPU as on GPU)")
    parser.add_argument("--attention", default="auto", choices=["auto", "sdpa", "unfused"],
                        help="our local spec's core attention (auto: SDPA on GPU, unfused on CPU; TE when present)")
    parser.add_argument("--hf-attention", default="sdpa", choices=["sdpa", "eager"],
                        help="HF baseline attention: PyTorch SDPA (patched in) or HF's own eager path")
    parser.add_argument("--hf-optimizer", default="fused", choices=["fused", "unfused"],
                        help="HF baseline's torch AdamW: fused (the HF Trainer's default optim adamw_torch_fused, on "
                             "CPU as on GPU) or torch's default implementation for the device (single-tensor on CPU, "
                             "foreach on GPU)")
    parser.add_argument("--our-adam", default="auto", choices=["auto", "fused", "default"],
                        help="our side's torch Adam kernel where megatron-core runs torch's Adam (model.optim.fused: "
                             "auto = null, fused; fused = true; default = false, torch's default kernel)")
    parser.add_argument("--grad-fusion", default="auto", choices=["auto", "on", "off"],
                        help="our side's gradient-accumulation fusion (model.gradient_accumulation_fusion: auto = "
                             "null, on on CPU, off on GPU; on = true (GPU: needs apex); off = false, megatron's unfused "
                             "hook path with the whole gradient buffer zeroed every step)")
    parser.add_argument("--bda-fusion", default="auto", choices=["auto", "on", "off"],
                        help="our side's bias-dropout-add fusion (model.bias_dropout_add_fusion: auto = null, off; "
                             "on = true, compiled by torch.compile; off = false)")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB, help="true vocabulary size")
    parser.add_argument("--binary-head", action="store_true", help="add the NSP head (HF: ForPreTraining)")
    parser.add_argument("--skip-hf", action="store_true", help="measure only our model")
    parser.add_argument("--schedule", default="auto", choices=["auto", "interleaved", "sequential"],
                        help="time the two sides' steps alternately with both models resident, or one side after "
                             "the other (auto: interleaved on CPU, sequential on GPU)")
    parser.add_argument("--hf-process", default="own", choices=["own", "shared"],
                        help="interleaved schedule: run HF in a process of its own (default; on CPU the two sides "
                             "otherwise share glibc's heap and each other's page faults) or in ours, as before the "
                             "third pass of 2026-11-23 (docs/BENCHMARKS.md)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads for both sides (default: torch's, one per core); on a CPU "
                             "shared with other jobs, 1 thread keeps a step from stalling on a busy core")
    parser.add_argument("--also-our-adam", default=None, choices=["fused", "default"],
                        help="sequential schedule (GPU default): time our side once more with this Adam kernel, "
                             "after ours and before HF, as ours_adam_<kernel> in --json: the optimizer's A/B in "
                             "one run")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="after the timed steps, profile this many more steps of each side run in this process "
                             "and record its busiest kernels (GPU) or operators (CPU) in --json (default 0: off)")
    parser.add_argument("--json", default=None, help="write the results here (atomically)")


def ours_step(args: argparse.Namespace, dtype: "torch.dtype") -> tuple[Step, dict[str, str], dict]:
    """A full train step of our stack, what it runs (core attention class, optimizer), and its initial weights
    in Hugging Face's layout (on the CPU) for the baseline to start from."""
    import torch
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from bio_megatron.config.pretrain import ModelConfig, PretrainConfig
    from bio_megatron.config.sizes import SIZES
    from bio_megatron.models.hf_convert import mcore_to_hf
    from bio_megatron.parallel import grad_fusion
    from bio_megatron.training.optimizer import build_optimizer
    from bio_megatron.training.pretrain import to_device, build_stage, forward_step

    cfg = PretrainConfig()
    cfg.trainer.seed = SEED
    cfg.model = ModelConfig(size=args.size, encoder_seq_length=args.seq, max_position_embeddings=max(512, args.seq),
                            micro_batch_size=args.micro_batch, global_batch_size=args.micro_batch,
                            attention_backend=args.attention, bert_binary_head=args.binary_head)
    cfg.model.optim.fused = {"auto": None, "fused": True, "default": False}[args.our_adam]
    cfg.model.gradient_accumulation_fusion = {"auto": None, "on": True, "off": False}[args.grad_fusion]
    cfg.model.bias_dropout_add_fusion = {"auto": None, "on": True, "off": False}[args.bda_fusion]
    model, ddp = build_stage(cfg, args.vocab_size, dtype)
    optimizer = build_optimizer(cfg.model.optim, [ddp], dtype, clip_grad=1.0, use_distributed_optimizer=False)
    batch = to_device({k: v for k, v in synthetic_batch(args.vocab_size, args.micro_batch, args.seq,
                                                         args.binary_head).items() if v is not None})
    attention = type(model.encoder.layers[0].self_attention.core_attention).__name__
    initial = mcore_to_hf({k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()
                           if torch.is_tensor(v)}, SIZES[args.size], args.vocab_size, binary_head=args.binary_head)
    fwd_bwd = get_forward_backward_func()
    fstep = partial(forward_step, binary_head=args.binary_head)

    def step() -> dict[str, float]:
        lap = Laps()
        ddp.train()
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        lap("other")
        # includes finalize_model_grads: the data-parallel all-reduce of the grad buffer (a group of one here)
        fwd_bwd(forward_step_func=fstep, data_iterator=iter([batch]), model=[ddp], num_microbatches=1,
                seq_length=args.seq, micro_batch_size=args.micro_batch, forward_only=False)
        lap("forward_backward")
        optimizer.step()  # grad-norm clipping, Adam, and for bf16/fp16 the copies to/from fp32 main params
        lap("optimizer")
        return lap.parts

    fusion = "on" if grad_fusion.resolve(cfg.model.gradient_accumulation_fusion) else "off"
    bda = "on" if model.config.bias_dropout_fusion else "off"
    return step, {"attention": attention, "optimizer": optimizer_impl(optimizer), "grad_fusion": fusion,
                  "bda_fusion": bda}, initial


def measured_matmul_tflops(dtype: "torch.dtype", n: int = 8192, iters: int = 50) -> float | None:
    """Achievable dense matmul TFLOP/s on this GPU in ``dtype`` (None on CPU, where MFU is not reported)."""
    import torch

    if not torch.cuda.is_available():
        return None
    a, b = (torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2))
    c = torch.empty_like(a)
    for _ in range(10):  # clocks up, cuBLAS heuristics settled
        torch.matmul(a, b, out=c)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        torch.matmul(a, b, out=c)
    end.record()
    torch.cuda.synchronize()
    return 2.0 * n**3 * iters / (start.elapsed_time(end) / 1e3) / 1e12


def _schedule(args: argparse.Namespace) -> str:
    """``interleaved`` (both models resident, timed steps alternating) or ``sequential``. ``auto``: interleaved on
    CPU, where other processes' load moves a side's step time several-fold between minutes; sequential on GPU,
    where timings are steady and each side's peak memory is wanted on its own."""
    import torch

    if args.skip_hf:
        return "sequential"
    if args.schedule != "auto":
        return args.schedule
    return "sequential" if torch.cuda.is_available() else "interleaved"


def _resolve_defaults(args: argparse.Namespace) -> None:
    import torch

    gpu = torch.cuda.is_available()
    args.micro_batch = args.micro_batch or (8 if gpu else 2)
    args.steps = args.steps if args.steps is not None else (20 if gpu else 3)
    # CPU: glibc's malloc adapts its mmap threshold over the first steps (HF alone at 345m: 4.1, 3.3, 3.3 s)
    args.warmup = args.warmup if args.warmup is not None else (5 if gpu else 3)
    problems = [f"--{k.replace('_', '-')} ({v}) must be >= {lo}" for k, v, lo in
                (("seq", args.seq, 8), ("micro_batch", args.micro_batch, 1), ("steps", args.steps, 1),
                 ("warmup", args.warmup, 0), ("profile", args.profile, 0),
                 ("threads", 1 if args.threads is None else args.threads, 1)) if v < lo]
    if args.also_our_adam and _schedule(args) != "sequential":
        problems.append("--also-our-adam times a second model of ours after the first: it needs --schedule "
                        "sequential (the GPU default)")
    if args.seq > 512:
        problems.append(f"--seq ({args.seq}) must be <= 512 (max_position_embeddings of Megatron BERT)")
    if problems:
        from bio_megatron.utils.errors import ConfigError

        raise ConfigError(problems)


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Run the whole benchmark in this process and return the results (see module docstring)."""
    import megatron.core
    import torch
    import transformers

    from bio_megatron.config.sizes import SIZES, padded_vocab_size, parameter_count
    from bio_megatron.models.bert import precision_dtype
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel, teardown
    from bio_megatron.training.metrics import device_peak_tflops, flops_per_sequence

    _resolve_defaults(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    precision = {"fp16": "16"}.get(args.precision, args.precision)
    dtype = precision_dtype(precision)
    shape = SIZES[args.size]
    padded = padded_vocab_size(args.vocab_size)
    gpu = torch.cuda.is_available()
    res: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name() if gpu else f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)",
        "versions": {"torch": torch.__version__, "megatron_core": megatron.core.__version__,
                     "transformers": transformers.__version__},
        "command": "bio-megatron bench pretrain " + " ".join(sys.argv[3:]) if sys.argv[1:3] == ["bench", "pretrain"] else None,
        "size": args.size, "seq": args.seq, "micro_batch": args.micro_batch, "steps": args.steps,
        "warmup": args.warmup, "dtype": str(dtype).removeprefix("torch."), "vocab_size": args.vocab_size,
        "padded_vocab_size": padded, "parameters": parameter_count(shape, padded, max(512, args.seq),
                                                                  binary_head=args.binary_head),
        "peak_tflops_datasheet": device_peak_tflops(dtype),
    }
    log.info("bench pretrain %s: seq %d, micro-batch %d, %s, %d timed + %d warmup steps on %s", args.size, args.seq,
             args.micro_batch, res["dtype"], args.steps, args.warmup, res["device"])
    init_distributed()
    try:
        init_model_parallel(1, 1, SEED)
        if gpu:  # measured first, while nothing else holds memory; the models need it less than a cold GPU
            res["peak_tflops_measured_matmul"] = measured_matmul_tflops(dtype if dtype != torch.float32 else torch.bfloat16)
            log.info("measured matmul peak: %.1f TFLOP/s", res["peak_tflops_measured_matmul"])
        else:
            res["peak_tflops_measured_matmul"] = None
        free_memory()
        res["schedule"] = _schedule(args)
        # Both sides start from the same weights (ours, in HF's layout): the same function from the same point,
        # not two different random initialisations.
        m = Measurement(args, res, flops_ours=flops_per_sequence(shape, args.seq, padded),
                        flops_hf=flops_per_sequence(shape, args.seq, args.vocab_size),
                        hf_info={"attention": args.hf_attention})
        schedule = sequential if res["schedule"] == "sequential" else interleaved
        schedule(m, lambda adam: ours_step(argparse.Namespace(**{**vars(args), "our_adam": adam}), dtype), dtype)
        res.update(m.figures())
        free_memory()
    finally:
        teardown()
    return res


def _pct(x: float | None) -> str:
    return f"{100 * x:.1f}%" if x is not None else "n/a"


def _tf(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"  # CPU rates are in the GFLOP/s range


def _parts(side: dict[str, Any]) -> str:
    b = side["breakdown_s"]
    return f"fwd+bwd {b['forward_backward']:.3g} s, optimizer {b['optimizer']:.3g} s, other {b['other']:.2g} s"


def summary_line(res: dict[str, Any]) -> str:
    """The one-line result: ours, HF and the ratio, MFU against both peaks, and each side's step broken down into
    forward+backward, optimizer step and the rest (mean seconds), which says where the ratio comes from."""
    o = res["ours"]
    line = (f"bench pretrain {res['size']} seq {res['seq']} mb {res['micro_batch']} {res['dtype']} on {res['device']}: "
            f"ours {o['tokens_per_s']:,.0f} tok/s {_tf(o['tflops'])} TFLOP/s MFU {_pct(o['mfu_datasheet'])} "
            f"(data sheet) {_pct(o['mfu_measured_peak'])} (measured matmul peak) [{_parts(o)}]")
    if "hf" in res:
        h = res["hf"]
        line += (f" | HF {h['tokens_per_s']:,.0f} tok/s {_tf(h['tflops'])} TFLOP/s [{_parts(h)}] | "
                 f"ours/HF {res['ratio_tokens_per_s']:.2f}x (median step {res['ratio_median_step']:.2f}x; "
                 f"{res['schedule']}{', HF in its own process' if h.get('process') == 'own' else ''}; "
                 f"ours {o['optimizer']}, gradient fusion {o.get('grad_fusion', 'n/a')}, bias-dropout-add fusion "
                 f"{o.get('bda_fusion', 'n/a')}; HF {h['optimizer']})")
    for key in (k for k in res if k.startswith("ours_adam_")):
        a = res[key]
        line += f" | ours with {a['optimizer']}: {a['tokens_per_s']:,.0f} tok/s [{_parts(a)}]"
    return line


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Temp file in the target directory, then rename: a reader never sees a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run(args: argparse.Namespace) -> int:
    """CLI entry: benchmark, optionally write ``--json``, print the summary line (the command's result)."""
    from bio_megatron.parallel.seam import import_megatron_core

    import_megatron_core()  # as `pretrain`'s own start-up could: without Inductor's and wandb's imports
    res = benchmark(args)
    if args.json:
        write_json_atomic(args.json, res)
        log.info("results written to %s", args.json)
    sys.stdout.write(summary_line(res) + "\n")
    return 0
