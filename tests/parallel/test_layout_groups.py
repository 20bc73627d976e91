"""A process that sets up megatron-core's layout again and again (every run of an in-process seed or grid sweep
calls ``init_model_parallel``) keeps a constant number of process groups and open files: megatron's own
``destroy_model_parallel`` forgets its groups without destroying them, which cost ~20 groups and ~90 sockets per rank
per run at 2 ranks. The groups of each new layout still reduce as their definition says, and ``teardown`` leaves
none."""

from __future__ import annotations

import os

from harness import run_world


def _reinitialise(layouts: list[tuple[int, int]]) -> dict:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel, resolve_world, teardown

    def _live_groups():  # torch's registry of the process groups alive
        return dist.distributed_c10d._world.pg_map

    init_distributed(resolve_world(dict(os.environ)))
    counts, sums = [], []
    for k, (tp, pp) in enumerate(layouts):
        init_model_parallel(tp, pp, seed=k)
        counts.append((len(_live_groups()), len(os.listdir("/proc/self/fd"))))
        x = torch.tensor([float(dist.get_rank() + 1)])
        tp_sum, dp_sum = x.clone(), x.clone()
        dist.all_reduce(tp_sum, group=ps.get_tensor_model_parallel_group())
        dist.all_reduce(dp_sum, group=ps.get_data_parallel_group())
        sums.append((tp_sum.item(), dp_sum.item()))
    rank = dist.get_rank()
    teardown()
    return {"rank": rank, "counts": counts, "sums": sums,
            "after_teardown": len(_live_groups())}


def test_repeated_layouts_keep_process_groups_and_files_constant():
    layouts = [(2, 1), (1, 1), (2, 1), (1, 1), (2, 1)]
    for got in run_world(2, _reinitialise, layouts):
        groups, files = zip(*got["counts"])
        assert len(set(groups)) == 1, got["counts"]  # (megatron alone: +20 groups per layout)
        assert max(files) - min(files) <= 2, got["counts"]  # (megatron alone: +90 sockets per layout)
        # each rank adds rank + 1: over the world (1 + 2) in the TP group at TP2 and the DP group at TP1, else its own
        own = float(got["rank"] + 1)
        assert got["sums"] == [(3.0, own) if tp == 2 else (own, 3.0) for tp, _ in layouts]
        assert got["after_teardown"] == 0
