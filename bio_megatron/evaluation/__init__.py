"""Metrics that equal the official scorers: conlleval (NER), ChemProt micro-F1, SQuAD v1.1/v2.0, BioASQ factoid."""
