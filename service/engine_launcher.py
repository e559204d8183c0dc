"""Starts engine processes (`python -m engine_proc ...`) and watches them die."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineArgs:
    """How the gateway asks for each engine process."""

    model_path: str
    model_name: str
    dtype: str = "float32"
    device: str = "auto"  # "auto": CUDA when torch sees a GPU, else the CPU
    kv_cache_memory_gib: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    num_threads: int | None = None
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    quantization: str = "auto"
    load_format: str = "auto"
    hf_overrides: str = ""
    speculative_config: str = ""
    log_format: str = "text"

    def to_argv(self, engine_index: int, input_address: str, output_address: str) -> list[str]:
        argv = [
            "--model", self.model_path,
            "--model-name", self.model_name,
            "--engine-index", str(engine_index),
            "--input-address", input_address,
            "--output-address", output_address,
            "--dtype", self.dtype,
            "--device", self.device,
            "--max-num-seqs", str(self.max_num_seqs),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--scheduling-policy", self.scheduling_policy,
            "--quantization", self.quantization,
            "--load-format", self.load_format,
            "--log-format", self.log_format,
        ]
        if self.hf_overrides:
            argv += ["--hf-overrides", self.hf_overrides]
        if self.speculative_config:
            argv += ["--speculative-config", self.speculative_config]
        if self.kv_cache_memory_gib is not None:
            argv += ["--kv-cache-memory", str(self.kv_cache_memory_gib)]
        if not self.enable_prefix_caching:
            argv.append("--no-enable-prefix-caching")
        if self.max_model_len is not None:
            argv += ["--max-model-len", str(self.max_model_len)]
        if self.num_threads is not None:
            argv += ["--num-threads", str(self.num_threads)]
        return argv


def die_with_parent() -> None:
    """Linux (in a child, before exec): the kernel kills this process when its parent dies."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class EngineProcess:
    """One engine process; `on_exit` runs (in a watcher thread) as soon as it ends."""

    def __init__(
        self,
        args: EngineArgs,
        engine_index: int,
        input_address: str,
        output_address: str,
        on_exit: Callable[[int], None],
        env: dict[str, str] | None = None,
    ) -> None:
        self.engine_index = engine_index
        argv = args.to_argv(engine_index, input_address, output_address)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine_proc", *argv], env={**os.environ, **env} if env else None
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

    def _watch(self, on_exit: Callable[[int], None]) -> None:
        returncode = self.proc.wait()
        if not self._is_shutting_down:
            on_exit(returncode)

    def shutdown(self, timeout: float = 5.0) -> None:
        self._is_shutting_down = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
