"""OpenAI's request and response shapes below any transport: bodies, errors, sampling, logprobs, usage.

The HTTP routes (`api/`) and batch files (`frontend/batch_generate.py`) both build on it."""
