"""Inference with fine-tuned checkpoints: NER entities with character offsets, QA answers."""
