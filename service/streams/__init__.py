"""Resumable streams: each streamed answer's events kept for a client that comes back."""
