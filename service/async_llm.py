"""AsyncLLM: the gateway's asyncio engine client, one collector per request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator

from proto.engine_input import EngineCoreRequest
from proto.handshake import EngineReady
from service.core_client import AsyncMPClient, EngineDeadError
from service.engine_launcher import EngineArgs
from service.input_processor import InputProcessor
from service.output_processor import OutputProcessor, RequestOutputCollector
from service.outputs import RequestOutput
from service.stop_checker import StopChecker
from service.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class AsyncLLM:
    """Sends requests to the engine and streams their outputs back through collectors."""

    def __init__(self, engine_client: AsyncMPClient, tokenizer: Tokenizer, ready: EngineReady) -> None:
        self.engine_client = engine_client
        self.tokenizer = tokenizer
        self.ready = ready
        self.model_name = ready.model_name
        self.input_processor = InputProcessor(tokenizer, ready.max_model_len, ready.vocab_size)
        self.output_processor = OutputProcessor(tokenizer)
        self._output_handler = asyncio.create_task(self._run_output_handler(), name="output-handler")

    @classmethod
    async def start(cls, engine_args: EngineArgs, tokenizer: Tokenizer) -> AsyncLLM:
        """Starts the engine process and waits until it is ready."""
        client = AsyncMPClient(engine_args)
        try:
            ready = await client.wait_ready()
        except BaseException:
            client.shutdown()
            raise
        return cls(client, tokenizer, ready)

    @property
    def is_dead(self) -> bool:
        return self.engine_client.is_dead

    async def add_request(
        self, request: EngineCoreRequest, prompt: str | None = None, stop_checker: StopChecker | None = None
    ) -> RequestOutputCollector:
        """Registers the request's collector, then sends it to the engine."""
        if self.is_dead:
            raise EngineDeadError("engine is dead")
        collector = RequestOutputCollector()
        self.output_processor.add_request(
            request.request_id, prompt, request.prompt_token_ids, collector, stop_checker,
            request.sampling_params.min_tokens,
        )
        try:
            await self.engine_client.add_request_async(request)
        except BaseException:
            self.output_processor.abort_requests([request.request_id])
            raise
        return collector

    async def generate(
        self, request: EngineCoreRequest, prompt: str | None = None, stop_checker: StopChecker | None = None
    ) -> AsyncGenerator[RequestOutput, None]:
        """Yields the request's output deltas; cancelling it aborts the request in the engine."""
        collector = await self.add_request(request, prompt, stop_checker)
        try:
            finished = False
            while not finished:
                output = collector.get_nowait() or await collector.get()
                finished = output.finished
                yield output
        except (asyncio.CancelledError, GeneratorExit):
            await self.abort(request.request_id)
            raise

    async def abort(self, request_id: str) -> None:
        if request_id not in self.output_processor.request_states:
            return
        self.output_processor.abort_requests([request_id])
        await self.engine_client.abort_requests_async([request_id])

    async def _run_output_handler(self) -> None:
        """The one task that moves engine outputs to the requests' collectors."""
        try:
            while True:
                outputs = await self.engine_client.get_output_async()
                request_ids_to_abort = self.output_processor.process_outputs(outputs.outputs)
                if request_ids_to_abort:
                    await self.engine_client.abort_requests_async(request_ids_to_abort)
        except EngineDeadError as error:
            self.output_processor.propagate_error(error)
        except Exception as error:  # noqa: BLE001 - a bug here must not hang every stream
            logger.exception("output handler failed")
            self.output_processor.propagate_error(EngineDeadError(f"output handler failed: {error}"))

    def shutdown(self) -> None:
        self._output_handler.cancel()
        self.engine_client.shutdown()
