"""Fine-tuning tasks: data readers/converters (NER, RE, QA) and, beside them, the task models."""
