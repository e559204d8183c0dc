"""EngineCoreClient: how the gateway talks to its engine, wherever the engine runs.

Three clients answer it: `InprocClient` (the EngineCore in this process, stepped directly),
`SyncMPClient` (engine processes, ZeroMQ, a thread feeding a queue) and `AsyncMPClient`
(engine processes, ZeroMQ on asyncio); `make_client` (service/client/make_client.py) picks one.
Callers never know which they hold.
"""

from __future__ import annotations

from typing import Any

from proto.codec import MsgpackDecoder
from proto.engine_input import EngineCoreRequest
from proto.engine_output import EngineCoreOutputs, SchedulerStats
from proto.handshake import EngineReady
from service.client.engine_state import EngineLost

# NOTE: a utility's result travels untyped (`UtilityResult.result`); the caller that knows its type rebuilds it.
_STATS_DECODER: MsgpackDecoder[SchedulerStats] = MsgpackDecoder(SchedulerStats)


class EngineDeadError(RuntimeError):
    """The engine process is gone; requests in flight cannot finish."""


class EngineCoreClient:
    """The calls every client answers: synchronous ones, or the `*_async` ones on asyncio."""

    ready: EngineReady

    @property
    def is_dead(self) -> bool:
        return False

    @property
    def is_recovering(self) -> bool:
        """True while no engine serves and a lost one is coming back."""
        return False

    @property
    def live_engine_indices(self) -> list[int]:
        """The engines that serve now (none while the gateway waits for a remote one to join)."""
        return [0]

    def is_serving_rank(self, rank: int) -> bool:
        """Whether engine `rank` takes requests now (for a request's data_parallel_rank)."""
        return rank == 0

    @property
    def memory_bytes(self) -> int:
        """The most memory the engines have held, as they last reported it (see EngineReady)."""
        return self.ready.memory_bytes

    def shutdown(self) -> None:
        raise NotImplementedError

    # Synchronous clients.
    def get_output(self) -> EngineCoreOutputs:
        raise NotImplementedError

    def add_request(self, request: EngineCoreRequest) -> None:
        raise NotImplementedError

    def abort_requests(self, request_ids: list[str]) -> None:
        raise NotImplementedError

    def call_utility(self, method: str, *args: Any) -> Any:
        raise NotImplementedError

    def reset_prefix_cache(self) -> bool:
        return bool(self.call_utility("reset_prefix_cache"))

    def sleep(self, level: int = 1) -> None:
        self.call_utility("sleep", level)

    def wake_up(self) -> None:
        self.call_utility("wake_up")

    def is_sleeping(self) -> bool:
        return bool(self.call_utility("is_sleeping"))

    def get_stats(self) -> SchedulerStats:
        return _STATS_DECODER.convert(self.call_utility("get_stats"))

    # Asyncio clients.
    async def wait_ready(self, timeout: float = 300.0) -> EngineReady:
        raise NotImplementedError

    async def get_output_async(self) -> EngineCoreOutputs | EngineLost:
        """The next batch of outputs, or news that an engine went away (with data parallel)."""
        raise NotImplementedError

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        raise NotImplementedError

    async def resume_requests_async(self, requests: list[EngineCoreRequest]) -> None:
        """Sends requests a lost engine had, with their output so far, to an engine that serves."""
        raise NotImplementedError

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        raise NotImplementedError

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        raise NotImplementedError

    async def reset_prefix_cache_async(self) -> bool:
        return bool(await self.call_utility_async("reset_prefix_cache"))

    async def sleep_async(self, level: int = 1) -> None:
        await self.call_utility_async("sleep", level)

    async def wake_up_async(self) -> None:
        await self.call_utility_async("wake_up")

    async def get_stats_async(self) -> SchedulerStats:
        return _STATS_DECODER.convert(await self.call_utility_async("get_stats"))
