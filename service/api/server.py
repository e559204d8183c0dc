"""The server's life: listen at once, load the engine beside it, serve, and drain on a signal."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from dataclasses import replace
from typing import TYPE_CHECKING

from service.config import GatewayConfig

if TYPE_CHECKING:
    import hypercorn.config
    from starlette.applications import Starlette

    from service.api.admission import Admission
    from service.frontend.async_llm import AsyncLLM

logger = logging.getLogger("zeroserve")

# NOTE: how long aborted streams get to send their last chunks once a drain gives up waiting.
ABORT_GRACE_S = 5.0


async def serve(config: GatewayConfig) -> None:
    """Listens at once (503 "loading" until the engine is ready). On SIGTERM or SIGINT drains:
    refuses new requests, lets those in flight finish for up to --shutdown-timeout, aborts the
    rest (a second signal aborts them at once), then shuts the engine down."""
    import hypercorn.asyncio

    from service.api.admission import Admission, Phase
    from service.api.app import create_app
    from service.api.stream_store import StreamStore

    listener = None if config.listen_fd is not None else _listen(config.host, config.port)
    admission = Admission(config.max_num_in_flight, config.request_timeout_s, config.max_header_bytes)
    streams = StreamStore(config.stream_retention_s, config.stream_retention_mib * 2**20)
    app = create_app(None, config.api_keys, config.is_metrics_auth, config.sse_keepalive_s, admission, streams)
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            admission.abort_all()
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    load = asyncio.create_task(_load(config, app), name="load-engine")

    def on_loaded(task: asyncio.Task[AsyncLLM]) -> None:
        if _failed(task):
            stop.set()

    load.add_done_callback(on_loaded)

    async def shutdown_trigger() -> None:
        await stop.wait()
        if load.done() and not _failed(load):
            await _drain(admission, config.shutdown_timeout_s)
        admission.phase = Phase.DRAINING

    logger.info("listening on http://%s:%d while %s loads", config.host, config.port, config.model)
    # NOTE: hypercorn takes the socket over (and closes it) by its descriptor.
    fd = config.listen_fd if listener is None else listener.detach()
    try:
        await hypercorn.asyncio.serve(app, _hypercorn_config(config, fd), shutdown_trigger=shutdown_trigger)  # type: ignore[arg-type]
    finally:
        await streams.close()
        await _stop_engine(load)
    if not load.cancelled():
        load.result()  # NOTE: raises why the engine did not load, if it did not.


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything starts: a port in use is one line (ValueError), not
    a failure of the server half started."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=1024)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ValueError(f"cannot listen on {host}:{port}: {reason}; choose another --port") from None


def _hypercorn_config(config: GatewayConfig, fd: int) -> hypercorn.config.Config:
    import hypercorn.config

    hypercorn_config = hypercorn.config.Config()
    hypercorn_config.bind = [f"fd://{fd}"]
    hypercorn_config.graceful_timeout = ABORT_GRACE_S
    hypercorn_config.h11_max_incomplete_size = config.max_header_bytes
    hypercorn_config.h2_max_header_list_size = config.max_header_bytes
    # NOTE: hypercorn's own lines go through our handler, so they follow --log-format.
    hypercorn_config.errorlog = logging.getLogger("hypercorn.error")
    return hypercorn_config


async def _stop_engine(load: asyncio.Task[AsyncLLM]) -> None:
    """Stops a load still under way, or shuts down the engine it started."""
    if not load.done():
        load.cancel()
    await asyncio.gather(load, return_exceptions=True)
    if not _failed(load):
        load.result().shutdown()


def _failed(task: asyncio.Task[AsyncLLM]) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)


async def _load(config: GatewayConfig, app: Starlette) -> AsyncLLM:
    """Starts the engine, waits until it is ready, then hands the app its state."""
    from service.api.app import attach
    from service.api.server_state import ServerState
    from service.client.async_mp_client import AsyncMPClient
    from service.frontend.async_llm import AsyncLLM
    from service.model_files.model_registry import resolve_model
    from service.model_files.tokenizer import Tokenizer
    from service.observability.dashboard import RecentRequests
    from service.observability.metrics import PrometheusStatLogger, cache_info
    from service.observability.request_log import RequestLogger

    resolved = await asyncio.to_thread(resolve_model, config.model)
    names = list(config.served_model_names or (resolved.name,))
    # NOTE: engines are named by the model's own name, which engines on other hosts also know.
    engine_config = replace(config.engine, model_path=str(resolved.path), model_name=resolved.name)
    client = AsyncMPClient(
        engine_config, config.data_parallel_size, config.link, config.engine_addresses, config.log_format
    )
    try:
        # NOTE: the tokenizer loads here while the engine loads its weights.
        tokenizer = await asyncio.to_thread(Tokenizer.from_model, resolved.path)
        ready = await client.wait_ready()
    except BaseException:
        client.shutdown()
        raise
    metrics = PrometheusStatLogger(
        names[0], range(max(config.data_parallel_size, 1)), config.api_server_index, ready.max_model_len,
        cache_info(ready, engine_config.enable_prefix_caching),
    )
    app.state.admission.on_rejection = metrics.record_admission_rejection
    recent_requests = RecentRequests()
    llm = AsyncLLM(client, tokenizer, ready, stat_loggers=[metrics, RequestLogger(), recent_requests])
    generation_defaults = {**resolved.generation_defaults, **dict(config.generation_config)}
    attach(app, ServerState(
        llm, names, generation_defaults, config.max_n, config.max_request_body_bytes,
        metrics_registry=metrics.registry, admission=app.state.admission, tool_call_parser=config.tool_call_parser,
        reasoning_parser=config.reasoning_parser, recent_requests=recent_requests,
    ))
    logger.info("serving %s on http://%s:%d", names[0], config.host, config.port)
    return llm


async def _drain(admission: Admission, timeout_s: float) -> None:
    """Refuses new requests, waits up to `timeout_s` for those in flight, then aborts the rest."""
    from service.api.admission import Phase

    admission.phase = Phase.DRAINING
    logger.info("draining: %d requests in flight, waiting up to %g s", admission.num_in_flight, timeout_s)
    if not await admission.wait_idle(timeout_s):
        logger.warning("aborting %d requests still in flight", admission.num_in_flight)
        admission.abort_all()
        await admission.wait_idle(ABORT_GRACE_S)
