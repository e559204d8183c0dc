"""Starts engine processes (`python -m engine_proc ...`) and watches them die."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable

from proto.engine_config import EngineConfig


def engine_argv(
    config: EngineConfig, engine_index: int, input_address: str, output_address: str, log_format: str = "text"
) -> list[str]:
    """`python -m engine_proc`'s arguments: the settings whole, then what only this process has."""
    return [
        "--config", config.to_json(),
        "--engine-index", str(engine_index),
        "--input-address", input_address,
        "--output-address", output_address,
        "--log-format", log_format,
    ]


class EngineProcess:
    """One engine process; `on_exit(process, returncode)` runs (in a watcher thread) as soon as it
    ends, unless it was shut down."""

    def __init__(
        self,
        config: EngineConfig,
        engine_index: int,
        input_address: str,
        output_address: str,
        on_exit: Callable[[EngineProcess, int], None],
        env: dict[str, str] | None = None,
        log_format: str = "text",
    ) -> None:
        self.engine_index = engine_index
        argv = engine_argv(config, engine_index, input_address, output_address, log_format)
        # NOTE: a session of its own, so a terminal's Ctrl-C (sent to the whole foreground process
        # group) reaches only the gateway, which drains and then stops its engines.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine_proc", *argv], env={**os.environ, **env} if env else None,
            start_new_session=True,
        )
        self._is_shutting_down = False
        self._watcher = threading.Thread(
            target=self._watch, args=(on_exit,), name=f"engine-{engine_index}-watch", daemon=True
        )
        self._watcher.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def _watch(self, on_exit: Callable[[EngineProcess, int], None]) -> None:
        returncode = self.proc.wait()
        if not self._is_shutting_down:
            on_exit(self, returncode)

    def kill(self) -> None:
        """Ends a hung or failing engine at once (its watcher then reports the exit)."""
        if self.proc.poll() is None:
            self.proc.kill()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._is_shutting_down = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
