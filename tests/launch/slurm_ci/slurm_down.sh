#!/usr/bin/env bash
# slurm_down.sh - tear down the cluster made by slurm_up.sh. Idempotent.
# Stops only the processes whose PIDs are in $ROOT's pid files (plus their
# slurmstepd/job children, which die with slurmd/scancel).
# Vendored from ../shared/reference/slurm-ci/slurm_down.sh.
set -uo pipefail
ROOT=${SLURM_CI_ROOT:-${TMPDIR:-/tmp}/slurm-ci}
NETNS=${SLURM_CI_NETNS-slurmci}
KEEP=${SLURM_CI_KEEP:-0}              # 1 = keep $ROOT (logs) for debugging
export SLURM_CONF=$ROOT/slurm.conf
NSX=(); [ -n "$NETNS" ] && [ -e "/run/netns/$NETNS" ] && NSX=(nsenter "--net=/run/netns/$NETNS" --)

# alive = exists and is not a zombie (orphans may never be reaped when PID 1 is not an init)
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
pids() { cat "$ROOT"/state/slurmctld.pid "$ROOT"/state/slurmd-*.pid 2>/dev/null; }
wait_gone() { local t=$(( $(date +%s) + $1 )); shift
  for p in "$@"; do while alive "$p" && [ "$(date +%s)" -lt "$t" ]; do sleep 0.2; done; done; }

if [ -f "$SLURM_CONF" ]; then
  timeout 10 "${NSX[@]}" scancel --full --user=root 2>/dev/null || true
  timeout 10 "${NSX[@]}" scontrol shutdown 2>/dev/null || true   # stops slurmctld + all slurmd
fi
P=$(pids | tr '\n' ' ')
wait_gone 10 $P                                # graceful: scontrol shutdown
P="$P $(cat "$ROOT/munge/munged.pid" 2>/dev/null)"   # munged only gets SIGTERM
for p in $P; do alive "$p" && kill -TERM "$p" 2>/dev/null; done
wait_gone 5 $P
for p in $P; do alive "$p" && { echo "[slurm_down] SIGKILL $p"; kill -KILL "$p" 2>/dev/null; }; done
# left-over job processes still in the netns (e.g. a stuck slurmstepd)
if [ -n "$NETNS" ] && [ -e "/run/netns/$NETNS" ]; then
  for p in $(ip netns pids "$NETNS" 2>/dev/null); do alive "$p" && kill -KILL "$p" 2>/dev/null; done
  ip netns del "$NETNS" 2>/dev/null || true
fi
# Only this cluster's line (see slurm_up.sh); no sed -i: /etc/hosts may be a bind mount.
MARK="# slurm-ci $ROOT"
(
  flock 9
  h=$(awk -v m="$MARK" 'substr($0, length($0) - length(m) + 1) != m' /etc/hosts)
  printf '%s\n' "$h" > /etc/hosts
) 9>/run/slurm-ci-hosts.lock
if [ "$KEEP" != 1 ]; then rm -rf "$ROOT"; fi
echo "[slurm_down] done"
