"""The last step of ``check.sh``: one ``summary.json`` from each step's record and the JSON it wrote.

Usage: ``summary.py STEPS.jsonl OUT`` (stdlib only: it must run even when the pack failed to install). Prints one
line per step and exits 0 when every step passed, else 1.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

# The JSON each step writes into OUT, read into the summary (the files stay beside it).
RESULTS = {"gpu_tests": "gpu_tests.xml", "bench_345m": "bench_345m.json", "memory_1p2b": "memory_1p2b.json",
           "bench_finetune": "bench_finetune.json", "smoke": "smoke.json", "dry_run": "dry_run.json",
           "scenarios": "gpu_scenarios.json"}


def junit(path: Path) -> dict[str, Any]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    cases = []
    for case in (c for s in suites for c in s.iter("testcase")):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                              "message": (el.get("message") or "")[:300], "seconds": float(case.get("time", 0))})
                break
        else:
            cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                          "seconds": float(case.get("time", 0))})
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
    return {"counts": counts, "tests": cases}


def _read(path: Path) -> Any:
    if not path.exists():
        return None
    try:
        return junit(path) if path.suffix == ".xml" else json.loads(path.read_text())
    except (ValueError, ET.ParseError) as e:
        return {"unreadable": f"{type(e).__name__}: {e}"}


def main(steps_file: str, out: str) -> int:
    dest = Path(out)
    steps = [json.loads(line) for line in Path(steps_file).read_text().splitlines() if line.strip()]
    for step in steps:
        name = RESULTS.get(step["step"])
        step["ok"] = step["rc"] == 0
        if name:
            step["result"] = _read(dest / name)
    scenarios = _read(dest / RESULTS["scenarios"])
    summary = {"ok": all(s["ok"] for s in steps), "steps": steps, "gpu_scenarios": scenarios,
               "total_seconds": sum(s["seconds"] for s in steps)}
    tmp = dest / f".summary.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, dest / "summary.json")
    for s in steps:
        state = "ok" if s["ok"] else ("TIMED OUT" if s.get("timed_out") else f"FAILED (exit {s['rc']})")
        sys.stdout.write(f"{s['step']:<16} {state:<18} {s['seconds']:>6.1f} s (limit {s['limit_s']} s)\n")
    sys.stdout.write(f"summary: {dest / 'summary.json'}\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
