"""A stand-in for the bare GPU machine on CPU: a virtualenv that sees only torch, transformers, tokenizers and
safetensors (and what they depend on), for ``check.sh --dry-run``.

Installing torch again would download gigabytes, so the venv reuses this interpreter's installed copies: a folder
of symbolic links to exactly the files and top-level packages of those distributions (found through their
``RECORD``), put on the venv's path by a ``.pth`` file. Nothing else of this environment is visible (the venv is
created without ``--system-site-packages``), so a module the pack fails to bring is an ImportError in the dry run,
as it would be on the machine.

Usage: ``python clean_env.py DEST`` with the interpreter whose site-packages holds the four; prints DEST/bin/python.
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
from pathlib import Path, PurePosixPath

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pack import BASE, closure, norm  # noqa: E402  (same folder; this is a script, not a package)


def _top_levels(dist: md.Distribution) -> set[str]:
    """The site-packages entries a distribution installed (packages, modules, its .dist-info), not its scripts."""
    tops = set()
    for f in dist.files or []:
        parts = PurePosixPath(str(f)).parts
        if parts and parts[0] != ".." and not parts[0].endswith(".pth"):
            tops.add(parts[0])
    return tops


def link_base(site: Path, names: dict[str, str]) -> list[str]:
    """Link each base distribution's entries into ``site``. An entry two distributions share (a namespace folder
    such as ``nvidia/``) becomes a real folder linking only the base distributions' own subentries, so that no
    other distribution's files leak in through it."""
    owners: dict[str, list[md.Distribution]] = {}
    everyone: dict[str, set[str]] = {}
    for dist in md.distributions():
        name = norm(dist.metadata["Name"])
        for top in _top_levels(dist):
            everyone.setdefault(top, set()).add(name)
            if name in names:
                owners.setdefault(top, []).append(dist)
    linked = []
    for top, dists in sorted(owners.items()):
        src = Path(dists[0].locate_file(top))
        if not src.exists():
            continue
        if len(everyone[top] - set(names)) == 0:
            (site / top).symlink_to(src)
        else:  # shared with a distribution outside the base: link the base's own files one level down
            (site / top).mkdir()
            for dist in dists:
                for f in dist.files or []:
                    parts = PurePosixPath(str(f)).parts
                    if len(parts) > 1 and parts[0] == top and not (site / top / parts[1]).exists():
                        (site / top / parts[1]).symlink_to(Path(dist.locate_file(f"{top}/{parts[1]}")))
        linked.append(top)
    return linked


def make(dest: Path) -> Path:
    base = closure(list(BASE))
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    py = dest / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    linked = dest / "base-site"
    linked.mkdir()
    link_base(linked, set(base))
    (site / "bare_gpu_machine_base.pth").write_text(f"{linked}\n")
    return py


if __name__ == "__main__":
    if len(sys.argv) != 2 or Path(sys.argv[1]).exists():
        sys.stderr.write("usage: clean_env.py DEST (a path that does not exist yet)\n")
        sys.exit(2)
    sys.stdout.write(f"{make(Path(sys.argv[1]))}\n")
