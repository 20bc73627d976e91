"""Where a process sits in the world: torchrun's variables win; under a direct ``srun`` the ranks come
from SLURM_* and the rendezvous from the job (first host of the node list, port derived from the job id)."""

from __future__ import annotations

from bio_megatron.parallel.distributed import resolve_world


def test_torchrun_variables_win_over_slurm():
    w = resolve_world({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "2345",
                       "SLURM_PROCID": "0", "SLURM_NTASKS": "2"})
    assert (w.rank, w.world_size, w.local_rank, w.master_addr, w.master_port, w.launcher) == (3, 8, 1, "n1", 2345,
                                                                                              "torchrun")


def test_direct_srun_derives_everything_from_the_job():
    w = resolve_world({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
                       "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "123456"})
    assert (w.rank, w.world_size, w.local_rank, w.launcher) == (5, 16, 1, "srun")
    assert w.master_addr == "gpu07"
    assert w.master_port == 61000 + 123456 % 4536


def test_srun_respects_exported_master():
    w = resolve_world({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "a,b",
                       "MASTER_ADDR": "b", "MASTER_PORT": "40000"})
    assert (w.master_addr, w.master_port) == ("b", 40000)


def test_single_process_without_launcher():
    w = resolve_world({})
    assert (w.rank, w.world_size, w.launcher) == (0, 1, "single")
