"""SyncMPClient: engine processes over ZeroMQ for synchronous callers; a thread feeds a queue."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

import zmq

from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, RequestType
from proto.engine_output import EngineCoreOutputs
from service.client.core_client import EngineDeadError
from service.client.engine_state import DeathNotice
from service.client.mp_client import MPClient, utility_outcome

_POLL_MS = 100


class SyncMPClient(MPClient):
    """Sends from the caller's thread; one thread polls the output socket into `outputs_queue`.

    NOTE: one engine: the offline engine has no use for data parallelism's routing here.
    """

    def __init__(self, engine_config: EngineConfig, ready_timeout: float = 300.0) -> None:
        self.outputs_queue: queue.Queue[EngineCoreOutputs | BaseException] = queue.Queue()
        self._utility_calls: dict[int, Future[Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        super().__init__(engine_config, zmq.Context())
        try:
            self._wait_ready(ready_timeout)
        except BaseException:
            self._close()
            raise
        self.engine = self.engines[0]
        self._output_thread = threading.Thread(
            target=self._process_outputs_socket, name="engine-outputs", daemon=True
        )
        self._output_thread.start()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.engines:
            if self.input_socket.poll(_POLL_MS):
                self._process_input_socket()
            elif self.is_dead or time.monotonic() > deadline:
                raise EngineDeadError(self.start_error() or "the engine process did not start; see its log above")

    def _process_input_socket(self) -> None:
        """Answers the engine's handshake messages (its heartbeats need no answer)."""
        while self.input_socket.poll(0):
            reply = self._handle_engine_message(self.input_socket.recv_multipart())
            if reply is not None:
                self.input_socket.send_multipart(reply)

    @property
    def engine_pid(self) -> int:
        return self.processes[0].pid

    def _process_outputs_socket(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._process_input_socket()
            if not self.output_socket.poll(_POLL_MS):
                continue
            outputs = self._decode_outputs(self.output_socket.recv_multipart(copy=False))
            if outputs is None:
                continue
            if isinstance(outputs, DeathNotice):
                self._engine_died(outputs.engine_index, "the engine core reported a fatal error")
                return
            if outputs.utility_output is None:
                with self._lock:
                    self._track(outputs)
                self.outputs_queue.put_nowait(outputs)
                continue
            future = self._utility_calls.pop(outputs.utility_output.call_id, None)
            if future is not None:
                value, error = utility_outcome(outputs.utility_output)
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(value)

    def _engine_died(self, engine_index: int, reason: str) -> None:
        if self._is_dead:
            return
        self._is_dead = True
        error = EngineDeadError(f"engine is dead: {reason}")
        self.outputs_queue.put_nowait(error)
        for future in list(self._utility_calls.values()):
            if not future.done():
                future.set_exception(error)
        self._utility_calls.clear()

    def get_output(self) -> EngineCoreOutputs:
        item = self.outputs_queue.get()
        if isinstance(item, BaseException):
            self.outputs_queue.put_nowait(item)  # NOTE: every later caller sees it too.
            raise item
        return item

    def _send(self, frames: list[Any]) -> None:
        with self._lock:
            self.input_socket.send_multipart(frames, copy=False)

    def add_request(self, request: EngineCoreRequest) -> None:
        with self._lock:
            engine = self._route(request)
        self._send(self._frames(engine.identity, RequestType.ADD, request))

    def abort_requests(self, request_ids: list[str]) -> None:
        if not request_ids or self.is_dead:
            return
        with self._lock:
            by_engine = self._owners(request_ids)
        for index, ids in by_engine.items():
            self._send(self._frames(self.engines[index].identity, RequestType.ABORT, ids))

    def call_utility(self, method: str, *args: Any) -> Any:
        call_id, frames = self._utility_frames(self.engine, method, args)
        future: Future[Any] = Future()
        self._utility_calls[call_id] = future
        self._send(frames)
        return future.result()

    def shutdown(self) -> None:
        self._stop.set()
        if hasattr(self, "_output_thread") and self._output_thread.is_alive():
            self._output_thread.join()
        self._close()
