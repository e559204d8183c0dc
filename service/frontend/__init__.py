"""Requests in, results out, online and offline: AsyncLLM, LLMEngine/LLM, input and output processing."""
