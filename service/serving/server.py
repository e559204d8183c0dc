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

    from service.api.admission import Admission
    from service.api.gateway_state import ServerPool
    from service.frontend.async_llm import AsyncLLM
    from service.serving.gateway import Gateway

logger = logging.getLogger("zeroserve")

# NOTE: how long aborted streams get to send their last chunks once a drain gives up waiting.
ABORT_GRACE_S = 5.0


async def serve(config: GatewayConfig) -> None:
    """Listens at once (503 "loading" until the engine is ready). On SIGTERM or SIGINT drains:
    refuses new requests, lets those in flight finish for up to --shutdown-timeout, aborts the
    rest (a second signal aborts them at once), then shuts the engine down."""
    import hypercorn.asyncio

    from service.api.admission import Phase
    from service.serving.gateway import Gateway

    listener = None if config.listen_fd is not None else _listen(config.host, config.port)
    gateway = Gateway(config)
    app, admission, streams = gateway.app, gateway.admission, gateway.streams
    stop = asyncio.Event()

    def on_signal(name: str) -> None:
        if stop.is_set():
            logger.warning("%s again: aborting the requests in flight", name)
            admission.abort_all()
        else:
            logger.info("%s: shutting down", name)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)
    load: asyncio.Task[AsyncLLM | ServerPool] = asyncio.create_task(
        _load_models(config, gateway) if config.is_multi_model else _load(config, gateway), name="load-engine"
    )

    def on_loaded(task: asyncio.Task[AsyncLLM | ServerPool]) -> None:
        if _failed(task):
            stop.set()

    load.add_done_callback(on_loaded)

    async def shutdown_trigger() -> None:
        await stop.wait()
        if load.done() and not _failed(load):
            await _drain(admission, config.shutdown_timeout_s)
        admission.phase = Phase.DRAINING

    loading = "the models are listed" if config.is_multi_model else f"{config.model} loads"
    logger.info("listening on http://%s:%d while %s", config.host, config.port, loading)
    # NOTE: hypercorn takes the socket over (and closes it) by its descriptor.
    fd = config.listen_fd if listener is None else listener.detach()
    try:
        await hypercorn.asyncio.serve(app, _hypercorn_config(config, fd), shutdown_trigger=shutdown_trigger)  # type: ignore[arg-type]
    finally:
        await streams.close()
        if gateway.batches is not None:
            await gateway.batches.close()
        await _stop_engine(load)
        logger.info("stopped")
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


async def _stop_engine(load: asyncio.Task[AsyncLLM | ServerPool]) -> None:
    """Stops a load still under way, or shuts down the engines it started."""
    from service.models.model_pool import ModelPool

    if not load.done():
        load.cancel()
    await asyncio.gather(load, return_exceptions=True)
    if not _failed(load):
        served = load.result()
        if isinstance(served, ModelPool):
            await served.close()
        else:
            served.shutdown()


def _failed(task: asyncio.Task[AsyncLLM | ServerPool]) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)


async def _load(config: GatewayConfig, gateway: Gateway) -> AsyncLLM:
    """Starts the engine, waits until it is ready, then serves with it."""
    from service.client.async_mp_client import AsyncMPClient
    from service.model_files.model_registry import resolve_model
    from service.model_files.tokenizer import Tokenizer

    resolved = await asyncio.to_thread(resolve_model, config.model)
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
    llm = gateway.serve_with(client, tokenizer, ready, resolved.name, resolved.generation_defaults)
    logger.info("serving %s on http://%s:%d", (config.served_model_names or (resolved.name,))[0], config.host, config.port)
    return llm


async def _load_models(config: GatewayConfig, gateway: Gateway) -> ServerPool:
    """Lists the models (a broken one is listed as failed, not fatal) and serves them, none loaded yet."""
    from service.models.catalog import find_models
    from service.models.model_pool import ModelPool

    entries = await asyncio.to_thread(find_models, config)
    if not entries:
        raise ValueError(f"no models to serve: {config.models_dir or 'the models folder'} has no .gguf file or model folder")
    pool = ModelPool(entries, config, gateway.model_state)
    gateway.serve_models(pool)
    for entry in entries:
        if entry.error:
            logger.error("model %s cannot be served: %s", entry.id, entry.error)
    logger.info("serving %d models on http://%s:%d: %s", len(entries), config.host, config.port,
                ", ".join(entry.id for entry in entries))
    return pool


async def _drain(admission: Admission, timeout_s: float) -> None:
    """Refuses new requests, waits up to `timeout_s` for those in flight, then aborts the rest."""
    from service.api.admission import Phase

    admission.phase = Phase.DRAINING
    logger.info("draining: %d requests in flight, waiting up to %g s", admission.num_in_flight, timeout_s)
    if not await admission.wait_idle(timeout_s):
        logger.warning("aborting %d requests still in flight", admission.num_in_flight)
        admission.abort_all()
        await admission.wait_idle(ABORT_GRACE_S)
