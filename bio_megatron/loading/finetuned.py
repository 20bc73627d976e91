"""The fine-tuned model loader as ``predict`` and ``cli/predict.py`` import it: :mod:`bio_megatron.formats.finetuned`
(the loader, below ``loading/`` since the converters load through it too) and
:func:`bio_megatron.parallel.distributed.single_process`, under their old names."""

from __future__ import annotations

from bio_megatron.formats.finetuned import Loaded, finetuned_source, load_finetuned, task_config_of
from bio_megatron.parallel.distributed import single_process

__all__ = ["Loaded", "finetuned_source", "load_finetuned", "single_process", "task_config_of"]
