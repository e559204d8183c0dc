"""InprocClient: the EngineCore in this process, stepped by `get_output()`; no sockets, no threads."""

from __future__ import annotations

from typing import Any

from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, UtilityCall
from proto.engine_output import EngineCoreOutputs, SchedulerStats
from service.client.core_client import EngineCoreClient


class InprocClient(EngineCoreClient):
    """Owns an EngineCore; each `get_output()` is one engine step."""

    def __init__(self, engine_config: EngineConfig) -> None:
        # NOTE: the one place the gateway side imports the engine (DESIGN.md: InprocClient).
        from engine_proc.core import make_core

        self.engine_core = make_core(engine_config)
        self.ready = self.engine_core.ready_message()

    def get_output(self) -> EngineCoreOutputs:
        if not self.engine_core.has_work:
            return EngineCoreOutputs(engine_index=self.ready.engine_index)
        outputs: EngineCoreOutputs = self.engine_core.step()
        return outputs

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self.engine_core.abort_requests(request_ids)

    def call_utility(self, method: str, *args: Any) -> Any:
        result = self.engine_core.call_utility(UtilityCall(0, method, list(args)))
        if result.error is not None:
            raise RuntimeError(result.error)
        return result.result

    def get_stats(self) -> SchedulerStats:
        # NOTE: the engine's own object; nothing crossed a wire to be rebuilt.
        stats: SchedulerStats = self.engine_core.get_stats()
        return stats

    def shutdown(self) -> None:
        self.engine_core.shutdown()
