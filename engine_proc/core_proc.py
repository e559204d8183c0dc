"""EngineCoreProc: socket threads ↔ queues ↔ the busy loop that steps an EngineCore."""

from __future__ import annotations

import logging
import queue
from typing import Any, Protocol

import zmq

from engine_proc.input_thread import InputItem, InputThread
from engine_proc.output_thread import OutputItem, OutputThread, Shutdown
from proto.engine_input import EngineCoreRequest, RequestType, UtilityCall
from proto.engine_output import EngineCoreOutputs
from proto.handshake import EngineReady

logger = logging.getLogger(__name__)

# NOTE: how often an idle loop wakes to check that it should keep running.
_IDLE_WAKE_S = 1.0
_OUTPUT_FLUSH_TIMEOUT_S = 5.0


class CoreLike(Protocol):
    """What the busy loop needs of an engine core (EngineCore, or a fake in tests)."""

    @property
    def has_work(self) -> bool: ...

    def ready_message(self) -> EngineReady: ...

    def add_request(self, request: EngineCoreRequest) -> None: ...

    def abort_requests(self, request_ids: list[str]) -> None: ...

    def step(self) -> EngineCoreOutputs: ...

    def call_utility(self, call: UtilityCall) -> Any: ...


class EngineCoreProc:
    """Runs an engine core in a busy loop; sockets live only in the two IO threads."""

    def __init__(self, engine_core: CoreLike, input_address: str, output_address: str) -> None:
        self.engine_core = engine_core
        self.input_queue: queue.Queue[InputItem] = queue.Queue()
        self.output_queue: queue.Queue[OutputItem] = queue.Queue()
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.input_thread = InputThread(
            self.ctx, input_address, engine_core.ready_message(), self.input_queue
        )
        self.output_thread = OutputThread(
            self.ctx, output_address, self.output_queue, engine_core.ready_message().engine_index
        )
        self.is_running = True

    def run(self) -> int:
        """Runs until stopped; returns the process exit code (non-zero after a fatal error)."""
        self.output_thread.start()
        self.input_thread.start()
        is_dead = False
        try:
            self.run_busy_loop()
        except Exception:
            logger.exception("engine core failed; telling the gateway it is dead")
            is_dead = True
        finally:
            self.input_thread.stop_event.set()
            self.output_queue.put(Shutdown(is_dead=is_dead))
            self.output_thread.join(_OUTPUT_FLUSH_TIMEOUT_S)
            self.input_thread.join(_OUTPUT_FLUSH_TIMEOUT_S)
            self.ctx.term()
        return 1 if is_dead else 0

    def run_busy_loop(self) -> None:
        while self.is_running:
            # 1) Poll the input queue until there is work to do.
            self._process_input_queue()
            # 2) Step the engine core and hand its outputs to the output thread.
            self._process_engine_step()

    def _process_input_queue(self) -> None:
        while not self.engine_core.has_work and self.is_running:
            try:
                item = self.input_queue.get(timeout=_IDLE_WAKE_S)
            except queue.Empty:
                continue
            self._handle_input(*item)
        while not self.input_queue.empty():
            self._handle_input(*self.input_queue.get_nowait())

    def _process_engine_step(self) -> None:
        if not self.engine_core.has_work:
            return
        outputs = self.engine_core.step()
        if outputs.outputs:
            self.output_queue.put_nowait(outputs)

    def _handle_input(self, request_type: RequestType, message: Any) -> None:
        if request_type is RequestType.ADD:
            self.engine_core.add_request(message)
        elif request_type is RequestType.ABORT:
            self.engine_core.abort_requests(message)
        elif request_type is RequestType.UTILITY:
            result = self.engine_core.call_utility(message)
            self.output_queue.put_nowait(EngineCoreOutputs(utility_output=result))
