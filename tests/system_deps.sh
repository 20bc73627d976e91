#!/usr/bin/env bash
# tests/system_deps.sh - Debian packages the launch tests need (tests/launch/), installed only when
# missing, non-interactively. `make test` runs this in CI (CI=true, root) before pytest; on a
# developer machine the SLURM tests skip with a clear reason instead.
#   slurmctld slurmd slurm-client munge  a real 2-node SLURM cluster on this host (slurm_ci/slurm_up.sh)
#   libslurm-dev gcc libc6-dev           build the no-op pyxis SPANK plugin (slurm_ci/fake_pyxis.c)
#   g++                                  torch.compile on the CPU (inductor's C++ kernels): the compiled
#                                        bias-dropout-add of tests/engine/test_bda_fusion.py
#   iproute2                             the cluster's private network namespace (ip netns)
#   podman runc netavark debootstrap     build and run the image (tests/launch/test_image.py): podman with
#   binutils                             runc and netavark (without recommends apt picks CNI plugins, which
#                                        podman 4.3 does not use), a Debian base, readelf for its CUDA libs
set -euo pipefail

[ "$(id -u)" = 0 ] || { echo "tests/system_deps.sh: must run as root (apt-get)" >&2; exit 1; }

# package -> a file it provides; a package is installed only if its file is missing, so a second
# run costs nothing and never touches the network.
declare -A PROVIDES=(
  [slurmctld]=/usr/sbin/slurmctld
  [slurmd]=/usr/sbin/slurmd
  [slurm-client]=/usr/bin/sbatch
  [munge]=/usr/sbin/munged
  [libslurm-dev]=/usr/include/slurm/spank.h
  [gcc]=/usr/bin/gcc
  [g++]=/usr/bin/g++
  [libc6-dev]=/usr/include/stdio.h
  [iproute2]=/usr/bin/ip
  [podman]=/usr/bin/podman
  [runc]=/usr/sbin/runc
  [netavark]=/usr/lib/podman/netavark
  [debootstrap]=/usr/sbin/debootstrap
  [binutils]=/usr/bin/readelf
)
missing=()
for pkg in "${!PROVIDES[@]}"; do
  [ -e "${PROVIDES[$pkg]}" ] || [ -e "/bin/${PROVIDES[$pkg]##*/}" ] || missing+=("$pkg")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "tests/system_deps.sh: all present"
  exit 0
fi

echo "tests/system_deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
start=$(date +%s)
apt-get update -qq
# --no-install-recommends: recommends pull in mail servers and docs; policy-rc.d is not needed
# because without systemd the package scripts cannot start the daemons anyway.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "tests/system_deps.sh: done in $(( $(date +%s) - start ))s"
