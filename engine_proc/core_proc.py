"""EngineCoreProc: socket threads ↔ queues ↔ the busy loop that steps an EngineCore."""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import replace
from typing import Any, Protocol

import zmq

from engine_proc.input_thread import InputItem, InputThread
from engine_proc.output_thread import OutputItem, OutputThread, Shutdown
from proto.engine_input import EngineCoreRequest, RequestType, UtilityCall
from proto.engine_output import EngineCoreOutput, EngineCoreOutputs
from proto.handshake import EngineAccept, EngineReady

logger = logging.getLogger(__name__)

# NOTE: how often an idle loop wakes to check that it should keep running.
_IDLE_WAKE_S = 1.0
# NOTE: after saying it drains, how long an engine still takes requests the gateway sent
# before it heard.
_DRAIN_GRACE_S = 1.0
_OUTPUT_FLUSH_TIMEOUT_S = 5.0


class CoreLike(Protocol):
    """What the busy loop needs of an engine core (EngineCore, or a fake in tests)."""

    @property
    def has_work(self) -> bool: ...

    def ready_message(self) -> EngineReady: ...

    def set_engine_index(self, engine_index: int) -> None: ...

    def add_request(self, request: EngineCoreRequest) -> None: ...

    def abort_requests(self, request_ids: list[str]) -> None: ...

    def step(self) -> EngineCoreOutputs: ...

    def idle_outputs(self) -> EngineCoreOutputs: ...

    def call_utility(self, call: UtilityCall) -> Any: ...


class EngineRefusedError(RuntimeError):
    """The gateway would not take this engine (another model, protocol or capacity)."""


class EngineCoreProc:
    """Runs an engine core in a busy loop; sockets live only in the two IO threads."""

    def __init__(
        self,
        engine_core: CoreLike,
        input_address: str | list[str],
        output_address: str | list[str],
        socket_options: dict[int, Any] | None = None,
        accept_timeout_s: float | None = None,
    ) -> None:
        self.engine_core = engine_core
        self.input_queue: queue.Queue[InputItem] = queue.Queue()
        self.output_queue: queue.Queue[OutputItem] = queue.Queue()
        self.ctx: zmq.Context[Any] = zmq.Context()
        ready = engine_core.ready_message()
        # NOTE: one address pair per gateway (several with --api-server-count).
        input_addresses = [input_address] if isinstance(input_address, str) else input_address
        output_addresses = [output_address] if isinstance(output_address, str) else output_address
        if len(input_addresses) != len(output_addresses):
            raise ValueError("one output address per input address, please")
        self.input_thread = InputThread(self.ctx, input_addresses, ready, self.input_queue, socket_options)
        self.output_thread = OutputThread(
            self.ctx, output_addresses, self.output_queue, max(ready.engine_index, 0), socket_options
        )
        self.num_clients = len(input_addresses)
        # request id → the client (gateway) it came from, when there are several
        self.client_of: dict[str, int] = {}
        self.accepted_by: set[int] = set()
        self.is_running = True
        self.is_accepted = False
        self.accept_deadline = None if accept_timeout_s is None else time.monotonic() + accept_timeout_s
        self.drain_deadline: float | None = None

    def run(self) -> int:
        """Runs until stopped; returns the process exit code (non-zero after a fatal error)."""
        self.output_thread.start()
        self.input_thread.start()
        is_dead, exit_code, suspect_request_ids = False, 0, []
        try:
            self.run_busy_loop()
        except EngineRefusedError as exc:
            logger.error("%s", exc)
            exit_code = 1
        except Exception:
            logger.exception("engine core failed; telling the gateway it is dead")
            is_dead, exit_code, suspect_request_ids = True, 1, self.engine_core.suspect_request_ids
        finally:
            self.output_queue.put(Shutdown(is_dead, suspect_request_ids))
            self.output_thread.join(_OUTPUT_FLUSH_TIMEOUT_S)
            # NOTE: goodbye after the last outputs are handed to the socket.
            if self.drain_deadline is not None and exit_code == 0:
                self.input_thread.goodbye_event.set()
            else:
                self.input_thread.stop_event.set()
            self.input_thread.join(_OUTPUT_FLUSH_TIMEOUT_S)
            self.ctx.term()
        return exit_code

    def begin_drain(self) -> None:
        """Leaves gracefully: tells the gateway, finishes what it has, says goodbye, exits 0
        (safe to call from a signal handler)."""
        if self.drain_deadline is None:
            self.drain_deadline = time.monotonic() + _DRAIN_GRACE_S
            self.input_thread.drain_event.set()

    def run_busy_loop(self) -> None:
        while self.is_running:
            # 1) Poll the input queue until there is work to do.
            self._process_input_queue()
            # 2) Step the engine core and hand its outputs to the output thread.
            self._process_engine_step()

    def _process_input_queue(self) -> None:
        while not self.engine_core.has_work and self.is_running:
            self._check_leaving()
            try:
                item = self.input_queue.get(timeout=_IDLE_WAKE_S if self.drain_deadline is None else 0.05)
            except queue.Empty:
                continue
            self._handle_input(*item)
        while not self.input_queue.empty():
            self._handle_input(*self.input_queue.get_nowait())

    def _check_leaving(self) -> None:
        """Stops the loop once a drain is over; refuses to wait for an acceptance forever."""
        now = time.monotonic()
        if self.drain_deadline is not None and now >= self.drain_deadline:
            self.is_running = False
        if not self.is_accepted and self.accept_deadline is not None and now >= self.accept_deadline:
            raise EngineRefusedError(
                f"the gateway at {', '.join(self.input_thread.addresses)} did not accept this engine in time "
                "(unreachable, or it does not authorise this engine's CURVE key)"
            )

    def _process_engine_step(self) -> None:
        if not self.engine_core.has_work:
            return
        outputs = self.engine_core.step()
        if not outputs.outputs:
            return
        if self.num_clients == 1:
            self.output_queue.put_nowait((0, outputs))
            return
        by_client: dict[int, list[EngineCoreOutput]] = {}
        for output in outputs.outputs:
            client_index = self.client_of.get(output.request_id, 0)
            if output.is_finished:
                self.client_of.pop(output.request_id, None)
            by_client.setdefault(client_index, []).append(output)
        # NOTE: every gateway gets the step's scheduler stats, its outputs or none: a gauge such
        # as requests running must not stay at a step another gateway's requests ended in.
        for client_index in sorted(by_client.keys() | self.accepted_by):
            self.output_queue.put_nowait((client_index, replace(outputs, outputs=by_client.get(client_index, []))))

    def _publish_stats(self) -> None:
        """Scheduler stats with no outputs, to every gateway: the aborts that left this engine idle
        take no step that would report them (a gauge such as requests running would stay up)."""
        outputs = self.engine_core.idle_outputs()
        for client_index in sorted(self.accepted_by) if self.num_clients > 1 else [0]:
            self.output_queue.put_nowait((client_index, outputs))

    def _handle_input(self, request_type: RequestType, message: Any) -> None:
        if request_type is RequestType.ADD:
            if self.num_clients > 1:
                self.client_of[message.request_id] = message.client_index
            self.engine_core.add_request(message)
        elif request_type is RequestType.ABORT:
            for request_id in message:
                self.client_of.pop(request_id, None)
            self.engine_core.abort_requests(message)
            if not self.engine_core.has_work:
                self._publish_stats()
        elif request_type is RequestType.UTILITY:
            result = self.engine_core.call_utility(message)
            self.output_queue.put_nowait((message.client_index, EngineCoreOutputs(utility_output=result)))
        elif request_type is RequestType.HANDSHAKE:
            self._accept(*message)

    def _accept(self, client_index: int, accept: EngineAccept) -> None:
        if accept.error is not None:
            raise EngineRefusedError(f"the gateway refused this engine: {accept.error}")
        if client_index not in self.accepted_by:
            logger.info("accepted by gateway %d as engine %d", client_index, accept.engine_index)
            self.accepted_by.add(client_index)
        self.is_accepted = len(self.accepted_by) == self.num_clients
        self.engine_core.set_engine_index(accept.engine_index)
        self.output_thread.engine_index = accept.engine_index
