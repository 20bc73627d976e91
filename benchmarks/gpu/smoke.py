"""The user's path on the machine the check runs on: ``finetune ner``, then ``predict ner`` and ``export hf``.

Each is the real CLI in a process of its own, as a user runs it: the tiny NER recipe on the tree's real BC5CDR-chem
sentences for six epochs (``trainer.precision`` as given: bf16 on a GPU), then ``predict ner`` with two workers on
those sentences from the best checkpoint, then ``export hf`` of it. ``OUT`` gets one JSON object, rewritten after
each command (a check stopped from outside keeps what ran): each command's exit status, seconds and the tail of its
log when it failed, the run's test F1, how many documents came back with how many entities, the exported class.

Usage: ``smoke.py OUT.json WORK_DIR [--precision P] [--epochs N]``. Exit 0 when all three passed, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bio_megatron.corpus.iob import read_iob

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "nemo_configs" / "ner" / "tiny_ner.yaml"
SENTENCES = REPO / "tests" / "fixtures" / "finetune" / "bc5cdr_chem_devel_head.tsv"  # token<TAB>tag, CC BY 4.0


def cli(argv: list[str]) -> dict[str, Any]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bio_megatron", *argv], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    done = {"command": "bio-megatron " + " ".join(argv), "rc": proc.returncode,
            "seconds": round(time.perf_counter() - start, 1)}
    if proc.returncode:
        done["log_tail"] = proc.stderr[-2000:]
    return done | {"stdout": proc.stdout}


def write(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("work", type=Path)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--epochs", type=int, default=6, help="6: the tiny encoder learns the sentences (test F1 31 on a "
                                                       "CPU in bf16, 22 s)")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    docs = args.work / "docs.txt"
    texts = [" ".join(sent.words) for sent in read_iob(SENTENCES)]  # plain text, what a user gives predict ner
    docs.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    res: dict[str, Any] = {"precision": args.precision, "steps": {}}

    def step(name: str, command: list[str]) -> dict[str, Any]:
        done = cli(command)
        res["steps"][name] = {k: v for k, v in done.items() if k != "stdout"}
        write(args.out, res)
        return done

    ft = step("finetune", ["finetune", "ner", "--config", str(RECIPE), f"trainer.precision={args.precision}",
                           f"trainer.max_epochs={args.epochs}", f"exp_manager.exp_dir={args.work}", "exp_manager.name=smoke"])
    if ft["rc"] == 0:
        run = args.work / "smoke"
        res["test_f1"] = json.loads((run / "results.json").read_text())["test"]["f1"]["mean"]
        (ckpt,) = run.glob("seed*/checkpoints")  # the recipe's one seed
        ents = args.work / "entities.jsonl"
        pred = step("predict", ["predict", "ner", "--checkpoint", str(ckpt), "--input", str(docs), "--out",
                                str(ents), "--workers", "2"])
        if pred["rc"] == 0:
            found = [json.loads(line) for line in ents.read_text().splitlines()]
            res["predicted"] = {"documents": len(found), "given": len(texts),
                                "entities": sum(len(d["entities"]) for d in found)}
        exp = step("export", ["export", "hf", "--checkpoint", str(ckpt), "--out", str(args.work / "hf")])
        if exp["rc"] == 0:
            res["exported_class"] = json.loads(exp["stdout"])["class"]
    res["ok"] = len(res["steps"]) == 3 and all(s["rc"] == 0 for s in res["steps"].values())
    write(args.out, res)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
