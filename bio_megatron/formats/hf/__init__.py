"""Hugging Face folders in and out, through ``formats/state.ModelState``: ``convert.py`` (``export hf`` /
``import hf``, ``state_to_hf``), ``electra.py`` (ELECTRA's discriminator + generator folders), ``heads.py`` (which
class a head exports as, remote code), ``classify.py`` (BLURB classification's problem types), ``modeling.py`` (the
remote-code classes a folder carries), ``model_card.py``, ``files.py``, ``folder_modes.py``; and ``read.py``, a
folder's heads and weights read back, which sits below ``loading/`` (it fills models from it). docs/ARCHITECTURE.md,
Formats."""
