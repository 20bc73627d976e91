#!/usr/bin/env bash
# tests/launch/container_base.sh - a local stand-in for the NGC PyTorch base image, so that the real
# Dockerfile can be built (`podman build --network=none`) and run on a machine that cannot pull
# nvcr.io. NGC gives the Dockerfile Python 3.12 + torch (+ CUDA, NCCL, TE); this image gives
#   - Debian bookworm minbase (debootstrap from the Debian mirror, the one registry CI reaches),
#   - the interpreter the project's venv was made from, copied to the same prefix (pyenv builds link
#     libpython by absolute rpath, so they are not relocatable),
#   - from the venv's site-packages only what the Dockerfile's build and run use: the distributions the
#     project's dependencies need (pyproject.toml, not the test extras) and pip, without the project itself
#     (the Dockerfile installs it), and with only the CUDA libraries that torch's shared objects link
#     against (1.9 of 3 GB; cuDNN's engines and the like are loaded lazily, on a GPU, which this image
#     never sees); the size is most of the time podman takes to import it,
#   - `torchrun` on PATH, as in NGC images.
# The image is labelled with a hash of its inputs and rebuilt only when they change.
#
# usage: tests/launch/container_base.sh VENV_PYTHON IMAGE   (root; needs podman and debootstrap)
set -euo pipefail

[ $# -eq 2 ] || { echo "usage: $0 VENV_PYTHON IMAGE" >&2; exit 2; }
venv_python=$1 image=$2
for tool in podman debootstrap tar readelf; do
  command -v "$tool" >/dev/null || { echo "$0: '$tool' not found (tests/system_deps.sh installs it)" >&2; exit 2; }
done

prefix=$("$venv_python" -c 'import sys; print(sys.base_prefix)')
site=$("$venv_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pyver=$("$venv_python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
suite=bookworm
# What the image is made of: the suite, the interpreter, the exact installed distributions and this script.
stamp=$( { echo "$suite $prefix"; "$venv_python" --version; ls "$site"; cat "$0" "$(dirname "$0")/../../pyproject.toml"; } \
  | sha256sum | cut -c1-16)
if [ "$(podman image inspect --format '{{ index .Labels "bio-megatron.test-base" }}' "$image" 2>/dev/null)" = "$stamp" ]; then
  echo "container_base: $image is up to date ($stamp)"
  exit 0
fi

start=$(date +%s)
work=$(mktemp -d /var/tmp/bm-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
# The shared libraries CPython's extension modules link against (ssl, ffi, sqlite, ...), libgomp for torch.
debootstrap --variant=minbase \
  --include=libssl3,libffi8,libsqlite3-0,libbz2-1.0,liblzma5,zlib1g,libreadline8,libncursesw6,libgomp1,ca-certificates \
  "$suite" "$root" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; echo "$0: debootstrap failed" >&2; exit 1; }
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*

# Hard links where possible: nothing here is modified, and it saves copying ~3 GB twice.
copy() { cp -al "$1" "$2" 2>/dev/null || cp -a "$1" "$2"; }
mkdir -p "$root$(dirname "$prefix")"
copy "$prefix" "$root$prefix"
target=$root$prefix/lib/python$pyver/site-packages
rm -rf "$root$prefix/lib/python$pyver/test" "$target"
mkdir -p "$target"
# The site-packages entries (packages, modules, .dist-info, .pth) of the runtime dependency closure of
# pyproject.toml's [project] dependencies and its [hf] extra, plus pip (the Dockerfile runs it); from each
# distribution's RECORD.
"$venv_python" - "$(dirname "$0")/../../pyproject.toml" >"$work/entries" <<'PY'
import importlib.metadata as md, re, sys, tomllib
from packaging.requirements import Requirement
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
deps = project["dependencies"] + project["optional-dependencies"]["hf"] + ["pip"]  # the Dockerfile installs .[hf]
todo = [r for r in map(Requirement, deps) if not r.marker or r.marker.evaluate({"extra": ""})]
seen, entries = set(), set()
while todo:
    req = todo.pop()
    name = re.sub(r"[-_.]+", "-", req.name).lower()
    for extra in ["", *sorted(req.extras)]:  # e.g. torch needs cuda-toolkit[cublas,...]
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            sys.exit(f"container_base: {req.name} (needed by the project's dependencies) is not in the venv")
        if dist.files is None:
            sys.exit(f"container_base: {req.name} has no RECORD: cannot tell which files are its own")
        todo += [r for r in map(Requirement, dist.requires or []) if not r.marker or r.marker.evaluate({"extra": extra})]
        # (triton stays, though it is 1 GB and CPU runs never use it: `import megatron.core` imports it)
        entries |= {f.parts[0] for f in dist.files if f.parts[0] != ".."}
print("\n".join(sorted(entries - {"nvidia", "__pycache__"})))
PY
while read -r entry; do
  if [ -e "$site/$entry" ]; then copy "$site/$entry" "$target/"; fi
done <"$work/entries"
# The NEEDED closure of torch's libraries within site-packages/nvidia (libcaffe2_nvrtc is dlopen'ed).
"$venv_python" - "$site" >"$work/cuda_libs" <<'PY'
import pathlib, re, subprocess, sys
site = pathlib.Path(sys.argv[1])
available = {p.name: p for p in site.glob("nvidia/*/lib/*.so*")}
todo = [p for p in site.glob("torch/lib/*.so") if p.name != "libcaffe2_nvrtc.so"]
keep = set()
while todo:
    elf = subprocess.run(["readelf", "-d", str(todo.pop())], capture_output=True, text=True, check=True).stdout
    for name in re.findall(r"\(NEEDED\).*\[(.+?)\]", elf):
        if name in available and name not in keep:
            keep.add(name)
            todo.append(available[name])
print("\n".join(str(available[n].relative_to(site)) for n in sorted(keep)))
PY
while read -r lib; do
  mkdir -p "$target/$(dirname "$lib")"
  copy "$site/$lib" "$target/$lib"
done <"$work/cuda_libs"
cat >"$root/usr/local/bin/torchrun" <<EOF
#!$prefix/bin/python$pyver
import sys
from torch.distributed.run import main
sys.exit(main())
EOF
chmod 755 "$root/usr/local/bin/torchrun"

tar --numeric-owner -C "$root" -cf - . | podman import --quiet \
  --change "ENV PATH=$prefix/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --change "ENV LANG=C.UTF-8" \
  --change "LABEL bio-megatron.test-base=$stamp" \
  --change 'CMD ["/bin/bash"]' \
  - "$image" >/dev/null
echo "container_base: built $image ($stamp) in $(( $(date +%s) - start ))s"
