"""What loads above the formats: a distillation teacher (:mod:`.teacher`) and, under their old names for ``predict``,
the fine-tuned model loader (:mod:`.finetuned`, re-exported from :mod:`bio_megatron.formats.finetuned`). Below
``tasks``; see docs/ARCHITECTURE.md."""
