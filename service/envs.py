"""proto/envs.py under its former name, for the modules that still import it from here."""

from __future__ import annotations

from proto.envs import enable_multiprocessing, stats_log_interval

__all__ = ["enable_multiprocessing", "stats_log_interval"]
