"""Anthropic's Messages API, answered as the chat request each body converts to."""
