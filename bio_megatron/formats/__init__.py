"""Checkpoint formats, one place each, around one in-memory value (``state.ModelState``).

``saved.py`` is the one reader of our checkpoints' ``config.yaml``; ``detect.py`` decides which format a path holds;
``ours.py`` reads our own checkpoints (any layout) at TP1 into a ``ModelState`` and writes one back as our checkpoint
(``write_ours``: every importer reads its format into a ``ModelState`` and saves through it); ``megatron_lm/`` and
``nemo/`` read and write Megatron-LM (legacy and ``torch_dist``) and NeMo ``.nemo``; ``safe_load.py`` unpickles
their files without running code and ``verify.py`` compares an import with an independent reference; ``hf/``
reads and writes Hugging Face folders (``convert.py`` import and export through ``ModelState``, ``electra.py``
ELECTRA's two folders, ``read.py`` a folder's heads and weights). Below ``loading/`` (which fills models from
them): ``archives.py`` (zip/tar with limits), ``foreign.py`` (a ``.nemo`` / Megatron-LM source imported once by a
child process), ``hf/read.py`` and ``source.py`` (what a path holds). docs/ARCHITECTURE.md, Formats.
"""
