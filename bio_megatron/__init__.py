"""BioMegatron: model-parallel pretraining and fine-tuning of biomedical Megatron BERT on megatron-core."""

__version__ = "0.1.0"
