"""Whole benchmark suites in one command: ``bio-megatron benchmark blurb|paper --model M``.

A suite is an ordered list of cells (dataset x seed, x head-grid point where the protocol has one); each cell
is one ``bio-megatron finetune`` run followed by scoring with the official-equivalent evaluator, written into
``<suite dir>/cells/<dataset>/[<grid point>/]seed<k>/`` and finished when its ``cell.json`` exists.

suites.py   the two protocols: datasets, task types, metrics as the publications name them, default seeds
plan.py     options -> cells: recipes, overrides, availability ("missing: why"), prerequisites, commands
folder.py   the suite folder: manifest (refuses other options), locks, the model imported once
launch.py   how a cell's fine-tuning starts: a forked CLI (local), torchrun, srun; signals passed on
run.py      running cells resumably, scoring them, progress and ETA
stats.py    mean / median / spread, head-grid selection on dev, task-type averages, the BLURB score
report.py   results.json and results.md in BLURB's and the paper's table layouts
"""
