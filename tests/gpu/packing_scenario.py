"""The packed-sequence check on a CUDA GPU, in a fresh process (``python packing_scenario.py OUT.json``): the packed
batch of ``tests/engine/packing_check.py`` against its unpacked twin through SDPA with the block mask (the local spec,
as GPU runs without Transformer Engine build it), in fp32 and bf16."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: engine.packing_check


def main(out: str) -> int:
    import torch

    from bio_megatron.parallel.distributed import init_distributed
    from engine.packing_check import packed_vs_unpacked

    results: dict = {"cuda": torch.cuda.is_available()}
    init_distributed()
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        try:
            r = packed_vs_unpacked("sdpa", dtype)
            results[name] = {k: r[k] for k in ("per_token", "per_doc", "grad_rel", "grads", "positions", "seg")}
        except Exception as exc:  # recorded, so that the other precision still runs
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    Path(out).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
