"""Model loading: find what a path holds (:mod:`.source`: our checkpoints, Hugging Face folders, ``.nemo`` and
Megatron-LM sources via :mod:`.foreign`) and build / fill encoder + head from it (:mod:`.model`, :mod:`.hf`,
:mod:`.finetuned`). Below ``tasks``, ``predict`` and the converters; see docs/ARCHITECTURE.md."""
