"""``--launcher slurm``: one SLURM array task per cell (``slurm/benchmark.sbatch``), then the report.

Cells that continue from another cell (BioASQ from SQuAD) form a second array that starts after the first
has ended (``afterany``: a cell whose prerequisite failed says so and fails alone); the report job runs after
both, whatever their outcome. Only cells that are neither done nor missing are submitted.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from bio_megatron.benchmark.plan import Plan
from bio_megatron.benchmark.run import done
from bio_megatron.utils.errors import ConfigError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
SCRIPT = "slurm/benchmark.sbatch"


def ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"`` (sbatch --array syntax)."""
    out, start = [], None
    for i, k in enumerate(indices):
        if start is None:
            start = k
        if i + 1 == len(indices) or indices[i + 1] != k + 1:
            out.append(f"{start}-{k}" if k != start else f"{k}")
            start = None
    return ",".join(out)


def stages(plan: Plan) -> list[list[int]]:
    """Indices of the cells to submit, per stage (stage 1 continues from stage 0)."""
    todo = [c for c in plan.cells if not c.missing and not done(c)]
    return [idx for idx in ([c.index for c in todo if c.stage == s] for s in (0, 1)) if idx]


def commands(plan: Plan, suite_args: list[str], sbatch_args: list[str]) -> list[list[str]]:
    """The sbatch command lines, in order; ``$JOB0``/``$JOB1`` stand for the job ids of the arrays."""
    cmds = []
    deps: list[str] = []
    for n, idx in enumerate(stages(plan)):
        dep = [f"--dependency=afterany:{':'.join(deps)}"] if deps else []
        cmds.append(["sbatch", "--parsable", f"--array={ranges(idx)}", *dep, *sbatch_args, SCRIPT, *suite_args])
        deps.append(f"$JOB{n}")
    dep = [f"--dependency=afterany:{':'.join(deps)}"] if deps else []
    # the report needs no GPU: a plain one-task job running this very interpreter (no #SBATCH GPU lines)
    cmds.append(["sbatch", "--parsable", "--ntasks=1", "--job-name=bio-megatron-benchmark-report",
                 f"--output={plan.out}/report-%j.out", *dep, *sbatch_args,
                 f"--wrap={shlex.join([sys.executable, '-m', 'bio_megatron', 'benchmark', 'report', str(plan.out)])}"])
    return cmds


def describe(plan: Plan, suite_args: list[str], sbatch_args: list[str]) -> list[str]:
    """What ``--dry-run`` tells a SLURM user: the array sizes and the commands."""
    st = stages(plan)
    sizes = " + ".join(str(len(s)) for s in st) or "0"
    head = (f"SLURM: {sizes} array task(s), one per cell to run ({'; '.join(ranges(s) for s in st) or 'none'}); "
            "submit them with --launcher slurm, or by hand (bash; $JOB0, $JOB1: the job ids the arrays get):")
    return [head] + ["  " + line for line in shell_lines(commands(plan, suite_args, sbatch_args))]


def shell_lines(cmds: list[list[str]]) -> list[str]:
    """The commands as bash lines to copy-paste: each array's id kept in ``JOB<n>`` (``--parsable`` prints
    ``id[;cluster]``) and ``$JOB<n>`` left to the shell to expand (shlex.join alone would single-quote it)."""
    out = []
    for n, cmd in enumerate(cmds):
        line = " ".join(_shell_word(w) for w in cmd)
        out.append(f"JOB{n}=$({line} | cut -d';' -f1)" if n < len(cmds) - 1 else line)
    return out


def _shell_word(word: str) -> str:
    parts = re.split(r"(\$JOB\d+)", word)
    if len(parts) == 1:
        return shlex.quote(word)
    return "".join(f'"{p}"' if p.startswith("$JOB") else shlex.quote(p) if p else "" for p in parts)


def submit(plan: Plan, suite_args: list[str], sbatch_args: list[str]) -> list[str]:
    """Submit the arrays and the report job; returns the job ids."""
    ids: list[str] = []
    for cmd in commands(plan, suite_args, sbatch_args):
        for k, j in enumerate(ids):
            cmd = [w.replace(f"$JOB{k}", j) for w in cmd]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except FileNotFoundError:
            raise ConfigError("--launcher slurm: sbatch not found; run this on a SLURM login node") from None
        if res.returncode != 0:
            raise ConfigError(f"--launcher slurm: {shlex.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
        ids.append(res.stdout.strip().split(";")[0])
        log.info("submitted job %s: %s", ids[-1], shlex.join(cmd))
    return ids
