"""OpenAI's request and response shapes below any transport: bodies, errors, sampling, logprobs, usage.

The HTTP routes (`api/`) and batch files (`batch_generate.py`, here) both build on it."""
