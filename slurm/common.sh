# shellcheck shell=bash
# slurm/common.sh - shared launch logic for slurm/pretrain.sbatch and slurm/finetune.sbatch.
#
# Sourced by the batch shell (never executed on its own). The sbatch scripts set the configuration
# variables (RECIPE, LAUNCHER, CONTAINER_IMAGE, ...) and then call `bm_launch <command>`.
#
# What happens, and why:
#  * MASTER_ADDR/MASTER_PORT come from the job, never from a fixed value, so two jobs sharing a node
#    do not collide: first host of the allocation, port 61000 + job id % 4536 (the same formula
#    enroot's hook and the trainer's own SLURM fallback use).
#  * The training step runs in the background and the batch shell `wait`s for it: bash defers traps
#    while a foreground child runs, so a foreground srun would swallow the preemption warning.
#  * On USR1 (the time-limit warning, or a preempting scheduler) the batch shell forwards USR1 to
#    srun, which signals every process of the step; the trainer saves a checkpoint, writes
#    status.json {"state": "interrupted"} and exits 0. The batch shell then requeues the job; the
#    requeued job resumes from checkpoints/latest. TERM (scancel, a hard kill) is forwarded the
#    same way, but the job is not requeued: a cancelled job must stay cancelled.

# Print a line prefixed so it stands out in the job log.
bm_log() { echo "[bio-megatron $(date +%H:%M:%S)] $*"; }
bm_die() { echo "[bio-megatron] error: $*" >&2; exit 2; }

# Fail fast, before any srun, on settings that would otherwise fail late on every rank.
bm_check_config() {
  : "${SLURM_JOB_ID:?not inside a SLURM job: submit with sbatch (see docs/LAUNCH.md)}"
  : "${SLURM_JOB_NODELIST:?SLURM_JOB_NODELIST is not set}"
  : "${SLURM_NNODES:?SLURM_NNODES is not set}"
  : "${RECIPE:?set RECIPE to a YAML recipe, e.g. nemo_configs/pretrain/tiny.yaml}"
  : "${EXP_DIR:?set EXP_DIR to the directory that holds the run directories}"
  : "${RUN_NAME:?set RUN_NAME (the run directory under EXP_DIR; keep it stable so requeues resume)}"
  : "${GPUS_PER_NODE:?set GPUS_PER_NODE (processes per node)}"
  case "$LAUNCHER" in srun | torchrun) ;; *) bm_die "LAUNCHER must be srun or torchrun, got '$LAUNCHER'" ;; esac
  [[ "$GPUS_PER_NODE" =~ ^[1-9][0-9]*$ ]] || bm_die "GPUS_PER_NODE must be a positive integer, got '$GPUS_PER_NODE'"
  [[ "$MAX_REQUEUES" =~ ^[0-9]+$ ]] || bm_die "MAX_REQUEUES must be a non-negative integer, got '$MAX_REQUEUES'"
  if [ "$LAUNCHER" = srun ] && [ -n "${SLURM_NTASKS_PER_NODE:-}" ] \
     && [ "${SLURM_NTASKS_PER_NODE%%(*}" != "$GPUS_PER_NODE" ]; then
    # One task per GPU: an allocation with a different task count would silently change world size.
    bm_die "LAUNCHER=srun needs --ntasks-per-node=$GPUS_PER_NODE (GPUS_PER_NODE), the job has ${SLURM_NTASKS_PER_NODE}"
  fi
  if [ -z "$CONTAINER_IMAGE" ]; then
    # Bare metal: the recipe is read on the host, so a typo is caught here instead of on every rank.
    # A bare name (e.g. bc5cdr_chem) is looked up by the CLI in nemo_configs/ and checked there.
    if [[ "$RECIPE" == */* || "$RECIPE" == *.yaml ]] && [ ! -f "$RECIPE" ]; then
      bm_die "RECIPE '$RECIPE' not found (relative to $(pwd))"
    fi
    if [ -n "$VENV" ] && [ ! -f "$VENV/bin/activate" ]; then
      bm_die "VENV '$VENV' is not a virtual environment (no bin/activate); set VENV= to use the current PATH"
    fi
  fi
}

# Bare-metal environment: environment modules first (they may provide Python/CUDA), then a venv.
bm_setup_env() {
  if [ -n "$CONTAINER_IMAGE" ]; then return 0; fi
  if [ -n "$MODULES" ]; then
    command -v module >/dev/null 2>&1 || bm_die "MODULES='$MODULES' set but the 'module' command is not available"
    # shellcheck disable=SC2086  # MODULES is a space-separated list on purpose
    module load $MODULES
  fi
  if [ -n "$VENV" ]; then
    # shellcheck disable=SC1091
    source "$VENV/bin/activate"
  fi
  command -v bio-megatron >/dev/null 2>&1 \
    || bm_die "bio-megatron is not on PATH; set VENV=/path/to/venv or MODULES=..., or use CONTAINER_IMAGE"
}

# Variables every rank needs; exported so srun (and pyxis) pass them into the tasks.
bm_export_env() {
  MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
  MASTER_PORT=$((61000 + SLURM_JOB_ID % 4536))
  export MASTER_ADDR MASTER_PORT
  export PYTHONUNBUFFERED=1
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  # megatron-core asserts this for TP communication overlap on Ampere/Hopper.
  export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
  export TORCH_NCCL_AVOID_RECORD_STREAMS=${TORCH_NCCL_AVOID_RECORD_STREAMS:-1}
  # NCCL/IB settings are site-specific: they live in a file the site edits, not in this script.
  if [ -n "$SITE_ENV" ] && [ -f "$SITE_ENV" ]; then
    bm_log "sourcing site settings from $SITE_ENV"
    set -a
    # shellcheck disable=SC1090
    source "$SITE_ENV"
    set +a
  fi
}

# Build the srun command line for the chosen launcher and environment into the array SRUN_CMD.
bm_build_command() {
  local -a words
  read -r -a words <<< "$1"  # the CLI sub-command, e.g. "pretrain" or "finetune ner"
  shift
  local -a args=(--config "$RECIPE")
  # shellcheck disable=SC2206  # OVERRIDES is a space-separated list of key=value on purpose
  args+=($OVERRIDES "$@" "exp_manager.exp_dir=$EXP_DIR" "exp_manager.name=$RUN_NAME")

  SRUN_CMD=(srun --kill-on-bad-exit=1 --wait=60 --nodes="$SLURM_NNODES")
  if [ -n "$CONTAINER_IMAGE" ]; then
    SRUN_CMD+=(--container-image="$CONTAINER_IMAGE" --container-workdir="$CONTAINER_WORKDIR"
               --no-container-mount-home)
    if [ -n "$CONTAINER_MOUNTS" ]; then SRUN_CMD+=(--container-mounts="$CONTAINER_MOUNTS"); fi
  fi
  if [ "$LAUNCHER" = srun ]; then
    # One task per GPU. RANK/WORLD_SIZE/LOCAL_RANK are set per task from SLURM_* (the single quotes
    # are intentional: they expand inside each task, not here). USR1 starts out ignored (SIG_IGN
    # survives exec) so a warning that arrives while Python is still importing does not kill the
    # rank; the trainer installs its own handler and bm_on_signal repeats the signal until it exits.
    # shellcheck disable=SC2016
    SRUN_CMD+=(--ntasks-per-node="$GPUS_PER_NODE" --ntasks=$((SLURM_NNODES * GPUS_PER_NODE))
               bash -c 'trap "" USR1; export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS
                        LOCAL_RANK=$SLURM_LOCALID LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE; exec "$@"'
               bio-megatron bio-megatron "${words[@]}" "${args[@]}")
  else
    # One torchrun per node, c10d rendezvous on the first host. srun's USR1 reaches every process of
    # the step; the torchrun agent ignores it (its default action would kill the agent, and its TERM
    # handling kills workers after 30 s) while the trainers, which install their own handler,
    # checkpoint and exit 0, and torchrun then exits 0. The rendezvous store is hosted by node 0
    # only (is_host per task): torchrun's own guess compares hostnames and can elect two hosts when
    # node names resolve to one machine, or none when MASTER_ADDR is another interface's name.
    # shellcheck disable=SC2016
    SRUN_CMD+=(--ntasks-per-node=1 --ntasks="$SLURM_NNODES"
               bash -c 'trap "" USR1; exec torchrun --rdzv-conf="is_host=$((SLURM_NODEID == 0))" "$@"' torchrun
               --nnodes="$SLURM_NNODES" --nproc-per-node="$GPUS_PER_NODE"
               --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID"
               --max-restarts=0 -m bio_megatron "${words[@]}" "${args[@]}")
  fi
}

BM_SIGNALLED=0
BM_TERMINATED=0
BM_SRUN_PID=
BM_RESIGNAL_PID=
BM_RESIGNAL_EVERY=${BM_RESIGNAL_EVERY:-10}

# Forward USR1 to the step (srun passes it to every process of the step) now and then every
# BM_RESIGNAL_EVERY seconds until the step ends: a rank that was still starting up (USR1 ignored)
# gets it once its handler is installed; the trainer's handler is idempotent.
bm_forward_signal() {
  kill -USR1 "$BM_SRUN_PID" 2>/dev/null || return 0
  (
    while sleep "$BM_RESIGNAL_EVERY" && kill -0 "$BM_SRUN_PID" 2>/dev/null; do
      kill -USR1 "$BM_SRUN_PID" 2>/dev/null || true
    done
  ) &
  BM_RESIGNAL_PID=$!
}

# Preemption/time-limit warning: remember it and pass it on to the training step.
bm_on_signal() {
  local sig=$1
  bm_log "received SIG$sig: asking the trainers to checkpoint and exit"
  if [ "$sig" = TERM ]; then BM_TERMINATED=1; fi
  if [ "$BM_SIGNALLED" = 1 ]; then return 0; fi
  BM_SIGNALLED=1
  if [ -n "$BM_SRUN_PID" ]; then bm_forward_signal; fi
}

# Read a field ("state" or "step") of status.json without needing Python on the host.
bm_status_field() {
  local status=$1 key=$2
  [ -f "$status" ] || return 0
  sed -n 's/.*"'"$key"'"[[:space:]]*:[[:space:]]*"\{0,1\}\([a-z_0-9]*\)"\{0,1\}.*/\1/p' "$status" | head -n 1
}

# Launch the training step, wait for it, requeue if the trainer reports it was interrupted.
# usage: bm_launch "<sub-command words>" [extra CLI arguments / key=value overrides...]
bm_launch() {
  local cmd=$1
  shift
  # Trap first: USR1's default action would kill the batch shell if the warning came during setup.
  trap 'bm_on_signal USR1' USR1
  trap 'bm_on_signal TERM' TERM
  bm_check_config
  bm_setup_env
  bm_export_env
  bm_build_command "$cmd" "$@"

  local run_dir="$EXP_DIR/$RUN_NAME" restarts=${SLURM_RESTART_COUNT:-0}
  mkdir -p "$run_dir"
  # status.json written before this marker is from an earlier attempt and must not trigger a requeue.
  local marker="$run_dir/.launch-$SLURM_JOB_ID-$restarts"
  touch "$marker"

  bm_log "job $SLURM_JOB_ID restart $restarts: $SLURM_NNODES node(s) x $GPUS_PER_NODE, launcher=$LAUNCHER," \
         "container=${CONTAINER_IMAGE:-none}, MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"
  bm_log "run directory: $run_dir"
  # Shell-quoted (printf %q), so the line in the job log copy-pastes: ${SRUN_CMD[*]} lost the quoting of the per-rank
  # bash -c script, of arguments with spaces and of [..] overrides, which the shell would glob.
  local shown
  printf -v shown '%q ' "${SRUN_CMD[@]}"
  bm_log "launching: ${shown% }"

  "${SRUN_CMD[@]}" &
  BM_SRUN_PID=$!
  if [ "$BM_SIGNALLED" = 1 ]; then bm_forward_signal; fi

  local rc
  set +e
  while :; do
    wait "$BM_SRUN_PID"
    rc=$?
    # wait returns >128 when a trap fired; the step is still running, so keep waiting for it.
    if [ "$rc" -gt 128 ] && kill -0 "$BM_SRUN_PID" 2>/dev/null; then continue; fi
    break
  done
  set -e
  if [ -n "$BM_RESIGNAL_PID" ]; then kill "$BM_RESIGNAL_PID" 2>/dev/null || true; fi
  BM_SRUN_PID=

  local state="" step=""
  if [ "$run_dir/status.json" -nt "$marker" ] || [ "$BM_SIGNALLED" = 1 ]; then
    state=$(bm_status_field "$run_dir/status.json" state)
    step=$(bm_status_field "$run_dir/status.json" step)
  fi
  rm -f "$marker"
  bm_log "training step exited with $rc, trainer state '${state:-unknown}' at step ${step:-unknown}"
  if [ -z "$state" ] && [ "$BM_SIGNALLED" = 1 ] && [ "$rc" = 0 ]; then
    # A trainer without a run-level status.json (fine-tuning keeps its state per seed) that exits 0
    # after the warning has saved what it needs to resume; a spurious requeue of a run that had just
    # finished only re-reads its final state.
    state=interrupted
    bm_log "no status.json; the trainers exited 0 after the warning, so the run counts as interrupted"
  fi

  if [ "$rc" = 0 ] && [ "$state" = interrupted ] && [ "$BM_TERMINATED" = 1 ]; then
    # TERM means the job is ending for good: scancel, or a scheduler that cancels (or requeues by
    # itself). Requeueing here would undo a scancel; the checkpoint is kept either way.
    bm_log "job $SLURM_JOB_ID is being terminated: checkpoint kept, not requeueing" \
           "(resubmit with RUN_NAME=$RUN_NAME to resume)"
    exit 0
  fi
  if [ "$rc" = 0 ] && [ "$state" = interrupted ]; then
    if [ "$restarts" -ge "$MAX_REQUEUES" ]; then
      bm_die "interrupted, but the job was already requeued $restarts time(s) (MAX_REQUEUES=$MAX_REQUEUES)"
    fi
    bm_log "requeueing job $SLURM_JOB_ID; it will resume from the checkpoints in $run_dir"
    # Refused when the job was cancelled (scancel also sends TERM) or is not requeueable.
    scontrol requeue "$SLURM_JOB_ID" \
      || bm_die "scontrol requeue $SLURM_JOB_ID refused; resubmit with the same RUN_NAME to resume"
    exit 0
  fi
  return "$rc"
}
