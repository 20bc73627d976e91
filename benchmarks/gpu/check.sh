#!/usr/bin/env bash
# The GPU check in one call, for a bare GPU machine (Python 3.12 with PyTorch, transformers, tokenizers and
# safetensors; no network): installs the pack `make gpu-pack` wrote (benchmarks/gpu/wheels/) into a temporary
# folder and runs, each step under its own time limit and all within 7.5 minutes (TOTAL_S; a loan is 15 minutes in
# all, machine start included, so a second call can rerun a step):
#   gpu_tests      the tests marked gpu (tests/gpu: bf16/fp16 steps with SDPA, recompute, gradient-accumulation
#                  fusion, a TP1 tiny run equal to the CPU run)
#   bench_345m     bio-megatron bench pretrain 345m seq 512 bf16 micro-batch 32 vs transformers, MFU against a
#                  matmul peak measured in the same run, each side's busiest kernels over 3 more steps (--profile),
#                  and our side again with torch's foreach Adam (--also-our-adam default: the optimizer's A/B).
#                  Micro-batch 32, not 8: at 8 both sides wait on the host (kernels fill ~50 % of a step on an
#                  H100) and a step varied by 1.5x between runs on one machine; at 32 the GPU is busy.
#   memory_1p2b    the 1.2b model with the distributed optimizer and full recompute: peak memory per micro-batch
#   bench_finetune bio-megatron bench finetune, where this tree has it
#   smoke          a user's path through the CLI: finetune ner (tiny, bf16), predict ner with 2 workers, export hf
# and writes check.log, each step's JSON and summary.json into OUT (the argument, else $OUT).
#
#   benchmarks/gpu/check.sh [--dry-run] [--steps NAME,...] [OUT]
#
# --steps: only these of the five steps above (cuda and install always run), e.g. to rerun the one that failed.
# --dry-run (CPU): builds a virtualenv that sees only torch, transformers, tokenizers and safetensors (and their
# dependencies) from this machine's .venv, installs the pack into it and, in one process, imports every module the
# check needs, runs the gpu tests (they skip) and the other steps at tiny sizes (benchmarks/gpu/dry_run.py).
# Exit status: 0 all steps passed, 1 a step failed or timed out (summary.json says which), 2 bad usage or no pack.
set -euo pipefail

# --- configuration (environment) -------------------------------------------------------------------------------
PYTHON="${PYTHON:-python3}"             # the machine's interpreter with torch & co. (not used by --dry-run)
TOTAL_S="${TOTAL_S:-450}"               # the whole check, install included: 7.5 minutes
LIMIT_INSTALL=60 LIMIT_TESTS=200 LIMIT_BENCH=150 LIMIT_MEMORY=120 LIMIT_FINETUNE=180 LIMIT_SMOKE=120 LIMIT_DRY=240
# bench finetune: real BC5CDR-chem sentences of the tree (NER) and GAD (classification), bf16, the seeded tiny BERT
BENCH_FINETUNE_ARGS="${BENCH_FINETUNE_ARGS:---ner-train tests/fixtures/finetune/bc5cdr_chem_train_head.tsv \
--ner-dev tests/fixtures/finetune/bc5cdr_chem_devel_head.tsv --classify-train tests/fixtures/blurb/GAD/test.tsv \
--classify-task gad --precision bf16 --threads 4}"
# -----------------------------------------------------------------------------------------------------------------

GPU_STEPS=(gpu_tests bench_345m memory_1p2b bench_finetune smoke)  # the steps --steps chooses among, in order

die() { echo "error: $*" >&2; exit 2; }
USAGE="usage: check.sh [--dry-run] [--steps NAME,...] [OUT]"
DRY=0 ONLY=""
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --steps) [[ $# -ge 2 ]] || die "$USAGE"; ONLY="$2"; shift 2 ;;
    --steps=*) ONLY="${1#--steps=}"; shift ;;
    *) die "$USAGE" ;;
  esac
done
[[ $# -le 1 && "${1:-}" != -* ]] || die "$USAGE"
if [[ -n "$ONLY" ]]; then
  (( ! DRY )) || die "--steps chooses among the GPU check's steps; --dry-run always runs its own three"
  rest="$ONLY,"
  while [[ -n "$rest" ]]; do  # every comma-separated name, empty ones included
    name="${rest%%,*}" rest="${rest#*,}"
    [[ " ${GPU_STEPS[*]} " == *" $name "* ]] || die "--steps: unknown step '$name' (one of ${GPU_STEPS[*]})"
  done
fi
# chosen NAME: whether step NAME runs (every step unless --steps names others)
chosen() { [[ -z "$ONLY" || ",$ONLY," == *",$1,"* ]]; }
DEST="${1:-${OUT:-}}"
[[ -n "$DEST" ]] || die "no output folder: give it as the argument or set OUT"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PACK="${PACK:-$REPO/benchmarks/gpu/wheels}"
[[ -f "$PACK/pack.json" ]] || die "no GPU pack at $PACK (pack.json missing): run 'make gpu-pack' where pip can reach PyPI"
PACK="$(cd "$PACK" && pwd)"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
LOG="$DEST/check.log"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/bio-megatron-gpu-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
SITE="$WORK/site"
STEPS="$WORK/steps.jsonl"
: >"$STEPS"
: >"$LOG"
DEADLINE=$(( $(date +%s) + TOTAL_S ))

# step NAME LIMIT_S CMD...: run CMD with its output in check.log, under min(LIMIT_S, time left), and record it.
step() {
  local name="$1" limit="$2"; shift 2
  local start left rc
  if [[ " ${GPU_STEPS[*]} " == *" $name "* ]] && ! chosen "$name"; then
    echo "=== $name: not chosen (--steps $ONLY)" >>"$LOG"
    return 0
  fi
  start=$(date +%s); left=$(( DEADLINE - start ))
  (( limit < left )) || limit=$left
  if (( limit < 5 )); then
    echo "=== $name: skipped, the check's $TOTAL_S s are spent" >>"$LOG"
    printf '{"step": "%s", "rc": 125, "seconds": 0, "limit_s": 0, "timed_out": true}\n' "$name" >>"$STEPS"
    return 0
  fi
  echo "=== $name (limit ${limit} s): $*" >>"$LOG"
  set +e
  timeout --kill-after=15 "$limit" "$@" >>"$LOG" 2>&1
  rc=$?
  set -e
  local took=$(( $(date +%s) - start )) timed_out=false
  (( rc == 124 || rc == 137 )) && timed_out=true
  echo "=== $name: exit $rc after ${took} s" >>"$LOG"
  printf '{"step": "%s", "rc": %d, "seconds": %d, "limit_s": %d, "timed_out": %s}\n' \
    "$name" "$rc" "$took" "$limit" "$timed_out" >>"$STEPS"
  summarise >/dev/null 2>&1 || true  # after every step: a check killed from outside still leaves summary.json
  return 0
}
summarise() { "$SUMMARY_PY" "$REPO/benchmarks/gpu/summary.py" "$STEPS" "$DEST"; }

# The pack as make gpu-pack wrote it: every wheel of pack.json present with its sha256.
verify_pack() {
  "$1" - "$PACK" <<'EOF'
import hashlib, json, sys
from pathlib import Path
pack = Path(sys.argv[1])
bad = [w["file"] for w in json.loads((pack / "pack.json").read_text())["wheels"]
       if not (pack / w["file"]).is_file() or hashlib.sha256((pack / w["file"]).read_bytes()).hexdigest() != w["sha256"]]
sys.exit(f"pack {pack}: missing or changed since make gpu-pack: {', '.join(bad)}" if bad else 0)
EOF
}

install() {  # install PIP_PYTHON: the pack's wheels into $SITE, from the folder only
  verify_pack "$1"
  "$1" -m pip install --quiet --no-index --no-deps --no-compile --disable-pip-version-check \
      --target "$SITE" "$PACK"/*.whl
}
export PACK SITE
export -f install verify_pack  # run by `timeout` through bash -c

if (( DRY )); then
  # the stand-in for the bare machine: this tree's .venv supplies torch & co. through links, nothing else
  BASE_PY="${BASE_PYTHON:-$REPO/.venv/bin/python}"
  [[ -x "$BASE_PY" ]] || BASE_PY=python3
  SUMMARY_PY="$BASE_PY"
  step clean_env "$LIMIT_INSTALL" "$BASE_PY" "$REPO/benchmarks/gpu/clean_env.py" "$WORK/env"
  PY="$WORK/env/bin/python"
  # which distribution provides each module, in the project's own environment: a lazy import of a distribution
  # that is no run-time dependency (wandb, mlflow) is an optional integration, not something the pack must carry
  "$BASE_PY" -c 'import importlib.metadata as m, json, sys; json.dump(m.packages_distributions(), sys.stdout)' \
      >"$WORK/dev_modules.json"
  step install "$LIMIT_INSTALL" bash -c 'install "$1"' install "$BASE_PY"
  # the real check's path: the tree, then the pack (no .venv)
  ( cd "$WORK" && export PYTHONPATH="$REPO:$SITE" PATH="$SITE/bin:$PATH" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" &&
    step dry_run "$LIMIT_DRY" "$PY" -W ignore "$REPO/benchmarks/gpu/dry_run.py" "$DEST" "$SITE" "$PACK/pack.json" \
      "$WORK/dev_modules.json" )
else
  command -v nvidia-smi >/dev/null && nvidia-smi >>"$LOG" 2>&1 || true
  PY="$PYTHON" SUMMARY_PY="$PYTHON"
  # without a GPU visible to torch every gpu test would skip and the benchmarks crawl on the CPU: stop here
  # what the machine brought, read before the pack shadows any of it (check.log keeps it)
  step cuda 30 "$PY" -c '
import importlib.metadata as md, os, sys, torch
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "absent"
print(torch.__version__, torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else "NO CUDA DEVICE")
print("cpus:", os.cpu_count(), "usable:", len(os.sched_getaffinity(0)), "torch threads:", torch.get_num_threads())
print("machine:", *(f"{d}=={version(d)}" for d in ("transformers", "tokenizers", "safetensors", "huggingface-hub",
                                                    "regex", "numpy")))
sys.exit(not torch.cuda.is_available())'
  if ! tail -n 1 "$STEPS" | grep -q '"rc": 0,'; then
    summarise
    exit 1
  fi
  step install "$LIMIT_INSTALL" bash -c 'install "$1"' install "$PY"
  # the tree first: the checked code is this checkout's, the pack supplies the dependencies
  export PYTHONPATH="$REPO:$SITE" PATH="$SITE/bin:$PATH" BIO_MEGATRON_GPU_CHECK_OUT="$DEST"
  cd "$REPO"
  # only our test plugins: a machine's own pytest plugins (xdist, benchmark, cov, ...) are not this pytest's
  # --timeout: a hung test fails alone and pytest still writes its XML within the step's limit
  step gpu_tests "$LIMIT_TESTS" env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$PY" -m pytest -q -m gpu -p pytest_timeout \
      --timeout=150 -p no:cacheprovider tests/gpu --junitxml="$DEST/gpu_tests.xml"
  step bench_345m "$LIMIT_BENCH" "$PY" -m bio_megatron bench pretrain --size 345m --seq 512 --precision bf16 \
      --micro-batch 32 --profile 3 --also-our-adam default --json "$DEST/bench_345m.json"
  step memory_1p2b "$LIMIT_MEMORY" "$PY" benchmarks/gpu/memory.py --size 1.2b --seq 512 --precision bf16 \
      --recompute full --json "$DEST/memory_1p2b.json"
  if ! chosen bench_finetune; then
    step bench_finetune 0 true  # logged as not chosen
  elif "$PY" -m bio_megatron bench finetune --help >/dev/null 2>&1; then
    # shellcheck disable=SC2086  # word splitting of the extra arguments is wanted
    step bench_finetune "$LIMIT_FINETUNE" "$PY" -m bio_megatron bench finetune $BENCH_FINETUNE_ARGS \
        --json "$DEST/bench_finetune.json"
  else
    echo "=== bench_finetune: not in this tree (bio-megatron bench finetune --help failed); not run" >>"$LOG"
  fi
  step smoke "$LIMIT_SMOKE" "$PY" benchmarks/gpu/smoke.py "$DEST/smoke.json" "$WORK/smoke" --precision bf16
fi

summarise || exit 1
