"""Model files: the model registry (fetching), GGUF metadata and the tokenizer."""
