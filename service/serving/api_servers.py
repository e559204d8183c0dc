"""`zeroserve serve --api-server-count K`: K gateway processes on one listening socket, each
connected to every engine, so HTTP parsing and detokenizing are no longer one core's job.

This process starts the engines (each with one socket pair per gateway) and the K gateways
(each `zeroserve serve` again, told the socket to accept on and the addresses to bind), passes
SIGTERM/SIGINT on to the gateways (which drain), and stops the engines when they are done.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from types import FrameType

from proto.engine_config import EngineConfig
from proto.engine_link import die_with_parent
from proto.sockets import new_ipc_address
from service.client.engine_launcher import EngineProcess, RestartBudget
from service.config import GatewayConfig
from service.model_files.model_registry import resolve_model

logger = logging.getLogger("zeroserve")

_POLL_S = 0.2


def run_api_servers(config: GatewayConfig, argv: Sequence[str]) -> int:
    """Runs until the gateways exit; their exit status (1 if one failed on its own)."""
    resolved = resolve_model(config.model)
    socket_dir = tempfile.mkdtemp(prefix="zeroserve-")
    os.chmod(socket_dir, 0o700)
    # NOTE: the gateways share their metrics' values through files here (prometheus_client's
    # multiprocess mode), so a scrape that lands on any of them sees all of them.
    metrics_dir = os.path.join(socket_dir, "metrics")
    os.mkdir(metrics_dir)
    num_servers = config.api_server_count
    inputs = [new_ipc_address(socket_dir) for _ in range(num_servers)]
    outputs = [new_ipc_address(socket_dir) for _ in range(num_servers)]
    # NOTE: one listening socket, inherited by every gateway: the kernel hands each connection
    # to whichever of them accepts first.
    listener = socket.create_server((config.host, config.port), backlog=4096)
    listener.set_inheritable(True)
    engine_config = replace(config.engine, model_path=str(resolved.path), model_name=resolved.name)
    engines = _Engines(config, engine_config, ",".join(inputs), ",".join(outputs))
    servers = [
        subprocess.Popen(
            [
                sys.executable, "-m", "service", *argv, "--api-server-count", "1", "--api-server-index", str(k),
                "--listen-fd", str(listener.fileno()), "--engine-addresses", inputs[k], outputs[k],
            ],
            pass_fds=[listener.fileno()],
            # NOTE: out of the terminal's process group: this process passes a Ctrl-C on once as
            # SIGTERM (a gateway's second signal would abort its requests).
            preexec_fn=die_with_parent,
            start_new_session=True,
            env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir},
        )
        for k in range(num_servers)
    ]
    num_engines = config.data_parallel_size
    logger.info("%d gateway processes on http://%s:%d, %d engine%s", num_servers, config.host, config.port,
                num_engines, "" if num_engines == 1 else "s")
    is_stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal is_stopping
        if not is_stopping and frame is not None:
            logger.info("%s: shutting down", signal.Signals(signum).name)
        is_stopping = True
        for server in servers:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while all(server.poll() is None for server in servers):
            time.sleep(_POLL_S)
        if not is_stopping:
            logger.error("a gateway process exited on its own; stopping the others")
            on_signal(signal.SIGTERM, None)
        codes = [server.wait() for server in servers]
        return 0 if is_stopping and not any(codes) else 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for server in servers:
            if server.poll() is None:
                server.kill()
                server.wait()
        engines.shutdown()
        listener.close()
        shutil.rmtree(socket_dir, ignore_errors=True)
        logger.info("stopped")


class _Engines:
    """The engine processes the gateways share; with --engine-restart each is started again when
    it dies (as one gateway restarts its own), and it joins every gateway again."""

    def __init__(self, config: GatewayConfig, engine_config: EngineConfig, inputs: str, outputs: str) -> None:
        self.config = config
        self.engine_config = engine_config
        self.inputs, self.outputs = inputs, outputs
        self.is_stopping = False
        self._budget = RestartBudget()
        self.processes = [self._start(index) for index in range(config.data_parallel_size)]

    def _start(self, index: int) -> EngineProcess:
        return EngineProcess(
            self.engine_config, index, self.inputs, self.outputs, self._on_exit, log_format=self.config.log_format
        )

    def _on_exit(self, process: EngineProcess, returncode: int) -> None:
        # NOTE: in the process's watcher thread; the gateways resume its requests once it is back.
        index = process.engine_index
        logger.error("engine %d exited with code %d", index, returncode)
        if not self.config.link.is_engine_restart:
            return
        delay = self._budget.delay(index)
        if delay is None:
            logger.error("%s", self._budget.gave_up_line(index))
            return
        time.sleep(delay)
        if not self.is_stopping:
            logger.warning("engine %d: starting a new engine process (restart %d)", index, self._budget.record(index))
            self.processes[index] = self._start(index)

    def shutdown(self) -> None:
        self.is_stopping = True
        for process in self.processes:
            process.shutdown()
