"""Starts engine processes (`python -m engine_proc ...`) and watches them die."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping

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


# NOTE: glibc's malloc asks for transparent huge pages (madvise) on the memory it maps, where the kernel's THP
# mode is `madvise` (most distributions'): a decode step streams every weight once, and through 4 KiB pages
# that took a fifth to a quarter more time than through 2 MiB ones (a gpt-oss-shaped step in process, 2-core
# Zen 5: 26.9-29.8 against 20.6-21.2 ms; one thread's MXFP4 rows 24 -> 33 GB/s), at the same RSS. A
# GLIBC_TUNABLES already naming `glibc.malloc.hugetlb` is kept as given (0 turns it off).
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb"


def engine_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment an engine process starts with: `environ`, its malloc asking for huge pages."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    if any(item.split("=", 1)[0] == HUGE_PAGES_TUNABLE for item in tunables.split(":")):
        return dict(environ)
    return {**environ, "GLIBC_TUNABLES": ":".join(filter(None, (tunables, f"{HUGE_PAGES_TUNABLE}=1")))}


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
            [sys.executable, "-m", "engine_proc", *argv], env=engine_environ({**os.environ, **(env or {})}),
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


# NOTE: an engine that dies this often within the window is not started again; the n-th restart
# in a window waits 0, 0.5, 1, 2... s (at most the cap).
MAX_RESTARTS = 5
RESTART_WINDOW_S = 300.0
_MAX_RESTART_DELAY_S = 8.0


class RestartBudget:
    """How soon each dead engine is started again (backing off), and when not at all."""

    def __init__(self) -> None:
        self._restarts: dict[int, list[float]] = {}

    def delay(self, engine_index: int) -> float | None:
        """Seconds to wait before starting engine `engine_index` again, or None: give up on it."""
        now = time.monotonic()
        recent = [t for t in self._restarts.get(engine_index, []) if now - t < RESTART_WINDOW_S]
        self._restarts[engine_index] = recent
        if len(recent) >= MAX_RESTARTS:
            return None
        return 0.0 if not recent else min(_MAX_RESTART_DELAY_S, 0.5 * 2 ** (len(recent) - 1))

    def record(self, engine_index: int) -> int:
        """Notes a restart; returns how many there were in the window."""
        self._restarts.setdefault(engine_index, []).append(time.monotonic())
        return len(self._restarts[engine_index])

    def gave_up_line(self, engine_index: int) -> str:
        return (f"engine {engine_index}: not restarted again: it died after each of {MAX_RESTARTS} restarts "
                f"within {RESTART_WINDOW_S:g} s")
