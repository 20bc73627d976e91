#!/usr/bin/env bash
# slurm_up.sh - bring up a throw-away, single-host, N-node SLURM cluster for CI.
# Debian 12 (slurm-wlm 22.05), run as root, no systemd needed.
#  * munged: private instance (own socket/pid/log under $ROOT), system key.
#  * slurmctld + N x "slurmd -N nodeK" all on 127.0.0.1, each slurmd on its own port.
#  * everything runs inside a private network namespace (only "lo" exists there),
#    and additionally binds to 127.0.0.1 (CommunicationParameters=NoInAddrAny,...),
#    so nothing listens on a real interface.
#  * fake node names node1..nodeN resolve to 127.0.0.1 via /etc/hosts, so
#    MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1) works.
# Afterwards:  source $ROOT/env.sh   (puts netns-wrapped sbatch/srun/... first on PATH)
# Vendored from ../shared/reference/slurm-ci/slurm_up.sh (measured on the CI machines); CI must not
# depend on that directory. tests/system_deps.sh installs the packages; the install block below is
# kept for running this script by hand.
set -euo pipefail

ROOT=${SLURM_CI_ROOT:-${TMPDIR:-/tmp}/slurm-ci}
NNODES=${SLURM_CI_NODES:-2}
CPUS=${SLURM_CI_CPUS_PER_NODE:-8}          # may exceed real cores (config_overrides)
GPUS=${SLURM_CI_FAKE_GPUS_PER_NODE:-8}     # fake gres/gpu count; 0 = no gres
NETNS=${SLURM_CI_NETNS-slurmci}           # "" = stay in host netns (bind 127.0.0.1 only)
CTLD_PORT=${SLURM_CI_CTLD_PORT:-6817}
BASE_PORT=${SLURM_CI_BASE_PORT:-17001}
READY_TIMEOUT=${SLURM_CI_READY_TIMEOUT:-60}
# SLURM's default (30 s): a cancelled job's trainers get that long to checkpoint before SIGKILL
# (the reference's 5 s was too short for a checkpoint on a loaded 2-core machine).
KILL_WAIT=${SLURM_CI_KILL_WAIT:-30}
SPANK_SO=${SLURM_CI_SPANK_SO:-}            # e.g. a fake pyxis SPANK plugin (.so) to load

ts() { date +%s.%N; }
el() { awk -v a="$1" -v b="$(ts)" 'BEGIN{printf "%.1f", b-a}'; }
log() { echo "[slurm_up] $*"; }
T0=$(ts)

[ "$(id -u)" = 0 ] || { echo "must run as root" >&2; exit 1; }
if [ -s "$ROOT/state/slurmctld.pid" ] && [ -d "/proc/$(cat "$ROOT/state/slurmctld.pid")" ] \
   && [ "$(awk '{print $3}' "/proc/$(cat "$ROOT/state/slurmctld.pid")/stat")" != Z ]; then
  log "already running (run slurm_down.sh first)"; exit 0
fi

# ---------------------------------------------------------------- install
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
   || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  T=$(ts)
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
  log "apt install took $(el "$T")s"
fi

# ---------------------------------------------------------------- layout
mkdir -p "$ROOT"/{bin,log,state/ctld,munge}
for i in $(seq 1 "$NNODES"); do mkdir -p "$ROOT/state/d/node$i"; done
chown munge:munge "$ROOT/munge"; chmod 755 "$ROOT/munge"   # munged: socket dir must be a+x
touch "$ROOT/log/munged.log"; chown munge:munge "$ROOT/log/munged.log"

# ---------------------------------------------------------------- netns
NSX=()
if [ -n "$NETNS" ]; then
  if ! ip netns list 2>/dev/null | grep -qw "$NETNS"; then
    ip netns add "$NETNS"
  fi
  ip -n "$NETNS" link set lo up
  # nsenter (not "ip netns exec"): ip netns exec remounts /sys, which hides
  # /sys/fs/cgroup and makes slurmd fail with "No filesystem mounted on /sys/fs/cgroup"
  NSX=(nsenter "--net=/run/netns/$NETNS" --)
fi

# ---------------------------------------------------------------- names
# One line per cluster, marked with its ROOT, so clusters of concurrent test sessions (e.g. two
# engineers' `make test` on one host) add and remove only their own line; flock serialises the
# read-modify-write of /etc/hosts with slurm_down.sh.
MARK="# slurm-ci $ROOT"
(
  flock 9
  if ! awk -v m="$MARK" 'substr($0, length($0) - length(m) + 1) == m {found = 1} END {exit !found}' /etc/hosts; then
    echo "127.0.0.1 $(seq -f 'node%g' -s ' ' 1 "$NNODES") $MARK" >> /etc/hosts
  fi
) 9>/run/slurm-ci-hosts.lock
HOST=$(hostname -s)
case "$(getent ahostsv4 "$HOST" | awk 'NR==1{print $1}')" in
  127.*) : ;;
  *) [ -n "$NETNS" ] || { echo "hostname $HOST does not resolve to 127.x and no netns; refusing" >&2; exit 1; } ;;
esac

# ---------------------------------------------------------------- munge
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key; chmod 600 /etc/munge/munge.key
fi
runuser -u munge -- /usr/sbin/munged \
  --socket="$ROOT/munge/munge.socket" --pid-file="$ROOT/munge/munged.pid" \
  --log-file="$ROOT/log/munged.log" --seed-file="$ROOT/munge/munged.seed" \
  --key-file=/etc/munge/munge.key
munge -S "$ROOT/munge/munge.socket" -n | unmunge -S "$ROOT/munge/munge.socket" >/dev/null

# ---------------------------------------------------------------- config
GRES_NODE=""
if [ "$GPUS" -gt 0 ]; then
  # gres/gpu drops "file-less" GPUs and rejects regular files ("not a valid character
  # or block device"); symlinks to /dev/null are accepted -> CUDA_VISIBLE_DEVICES is set
  mkdir -p "$ROOT/dev"
  for g in $(seq 0 $((GPUS - 1))); do ln -sfn /dev/null "$ROOT/dev/fakegpu$g"; done
  GRES_NODE="Gres=gpu:$GPUS"
  echo "NodeName=node[1-$NNODES] Name=gpu File=$ROOT/dev/fakegpu[0-$((GPUS - 1))]" > "$ROOT/gres.conf"
else
  : > "$ROOT/gres.conf"
fi
# own plugstack (don't pick up /etc/slurm/plugstack.conf.d/* from the host)
if [ -n "$SPANK_SO" ]; then echo "required $SPANK_SO" > "$ROOT/plugstack.conf"; else : > "$ROOT/plugstack.conf"; fi
{
cat <<EOF
ClusterName=ci
PlugStackConfig=$ROOT/plugstack.conf
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
CommunicationParameters=EnableIPv6,NoInAddrAny,NoCtldInAddrAny
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$ROOT/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$ROOT/state/ctld
SlurmdSpoolDir=$ROOT/state/d/%n
SlurmctldPidFile=$ROOT/state/slurmctld.pid
SlurmdPidFile=$ROOT/state/slurmd-%n.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0   # default batch_sched_delay=3 adds ~3s per sbatch
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=$KILL_WAIT
MinJobAge=300
GresTypes=gpu
EOF
for i in $(seq 1 "$NNODES"); do
  echo "NodeName=node$i NodeHostname=node$i NodeAddr=127.0.0.1 Port=$((BASE_PORT + i - 1)) CPUs=$CPUS RealMemory=4000 $GRES_NODE State=UNKNOWN"
done
echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE OverSubscribe=NO State=UP"
} > "$ROOT/slurm.conf"
export SLURM_CONF=$ROOT/slurm.conf

# ---------------------------------------------------------------- wrappers + env
for c in sbatch srun salloc squeue scontrol sinfo scancel sacct sstat sattach sprio sshare sdiag; do
  [ -x "/usr/bin/$c" ] || continue
  printf '#!/bin/sh\nexport SLURM_CONF=%s\nexec %s /usr/bin/%s "$@"\n' \
    "$SLURM_CONF" "${NSX[*]:-}" "$c" > "$ROOT/bin/$c"
  chmod +x "$ROOT/bin/$c"
done
# run any command (e.g. pytest) inside the cluster's netns
printf '#!/bin/sh\nexport SLURM_CONF=%s\nexec %s "$@"\n' "$SLURM_CONF" "${NSX[*]:-}" > "$ROOT/bin/slurm-ns"
chmod +x "$ROOT/bin/slurm-ns"
cat > "$ROOT/env.sh" <<EOF
export SLURM_CONF=$SLURM_CONF
export PATH=$ROOT/bin:\$PATH
EOF

# ---------------------------------------------------------------- daemons
T=$(ts)
"${NSX[@]}" slurmctld -i
for i in $(seq 1 "$NNODES"); do "${NSX[@]}" slurmd -N "node$i"; done

deadline=$(( $(date +%s) + READY_TIMEOUT ))
while :; do
  n_idle=$("${NSX[@]}" sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2=="idle"' | wc -l || true)
  [ "$n_idle" -ge "$NNODES" ] && break
  if "${NSX[@]}" sinfo -h -N -o '%t' 2>/dev/null | grep -qE 'inval|drain|drng'; then
    echo "node(s) invalid/drained:" >&2; "${NSX[@]}" sinfo -N -R >&2; exit 1
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "cluster not ready after ${READY_TIMEOUT}s" >&2
    "${NSX[@]}" sinfo -N -l >&2 || true
    tail -n 20 "$ROOT"/log/*.log >&2 || true
    exit 1
  fi
  sleep 0.2
done
log "daemons ready in $(el "$T")s; total $(el "$T0")s"
"${NSX[@]}" sinfo -N
log "use: source $ROOT/env.sh"
