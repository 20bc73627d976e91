"""What ``predict ner --workers N``'s fork server imports once, before it forks the workers (:mod:`.stream`).

Each worker used to be a fresh ``spawn`` interpreter importing torch, megatron-core and our loader by itself: on
two cores, N imports of ~4-8 s each competing for them. The fork server is one fresh interpreter that imports them
here, runs no torch operation (so no thread pool exists yet: importing leaves the process with its one thread,
checked by ``tests/finetune/test_predict_stream.py``), and forks each worker from that state, which then sets its
own thread count and loads the model.
"""

from __future__ import annotations

import logging
import sys
import warnings

from bio_megatron.parallel.seam import import_megatron_core

# A fresh interpreter has none of the CLI's filters (cli/__init__.py::_quiet_dependencies, one level up): the same
# ones, so that megatron-core's fallback warnings (apex, TE) are not printed again by the pool; the workers inherit them.
if not sys.warnoptions:
    for _module in (r"megatron(\..*)?", r"torch(\..*)?", r"transformers(\..*)?"):
        warnings.filterwarnings("ignore", module=_module)
logging.getLogger("megatron").setLevel(logging.ERROR)
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

import_megatron_core()  # before the loader below imports megatron-core the long way

import bio_megatron.formats.finetuned  # noqa: E402,F401  the worker's loader, model and tokenizers
import bio_megatron.parallel.distributed  # noqa: E402,F401  its one-process world
import bio_megatron.predict.ner  # noqa: E402,F401  what it runs on each window
