"""The models of a multi-model gateway: each loaded (its own engine processes) when a request names it,
the least recently used idle one unloaded to keep within --max-loaded-models and --memory-budget."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from proto.handshake import EngineReady
from proto.kv_cache_budget import CPU_MAX_DEFAULT_BYTES, available_ram_bytes, default_kv_cache_bytes
from service.client.async_mp_client import AsyncMPClient
from service.client.core_client import EngineCoreClient
from service.config import GatewayConfig
from service.model_files.tokenizer import Tokenizer
from service.models.catalog import ModelEntry
from service.openai.errors import APIError

if TYPE_CHECKING:
    from service.frontend.async_llm import AsyncLLM

logger = logging.getLogger(__name__)

# NOTE: how often loaded engines' memory reports, idle times and deaths are looked at.
WATCH_INTERVAL_S = 1.0
# NOTE: what a Python process with torch holds before any model (the engine's own report replaces it).
_RUNTIME_BYTES_BEFORE_ANY_REPORT = 512 * 2**20



class ModelState(Protocol):
    """What the pool needs of a loaded model's state (the HTTP routes' S is one): its engines' client."""

    llm: AsyncLLM


S = TypeVar("S", bound=ModelState)
# Makes a loaded model's state from its entry, engine client, tokenizer and the engine's handshake.
BuildState = Callable[[ModelEntry, EngineCoreClient, Tokenizer, EngineReady], S]


class ModelStatus(str, enum.Enum):
    """What /v1/models says of a model, as llama.cpp's router names it."""

    LOADED = "loaded"
    LOADING = "loading"
    UNLOADED = "unloaded"
    FAILED = "failed"


class ModelLoadError(Exception):
    """A model could not be loaded: its file, its engine's start, or the memory budget."""


class ModelSlot(Generic[S]):
    """One model of the pool: its entry, its engine and routes' state while loaded, and who uses it."""

    def __init__(self, entry: ModelEntry) -> None:
        self.entry = entry
        self.status = ModelStatus.FAILED if entry.error else ModelStatus.UNLOADED
        self.error = entry.error
        self.state: S | None = None
        self.num_leases = 0
        self.last_used = 0.0
        self.has_room = False  # NOTE: counted against the budget: loaded, or loading with room made.
        self.reserved_bytes = 0  # NOTE: while loading, what it is expected to take.
        self.reported_bytes = 0  # NOTE: the most its engines reported holding, kept across unloads.
        self.load_task: asyncio.Task[None] | None = None
        self.is_unloading = False

    @property
    def id(self) -> str:
        return self.entry.id

    @property
    def is_holding_memory(self) -> bool:
        return self.has_room or self.is_unloading

    @property
    def num_in_flight(self) -> int:
        """Requests using it: leased by a route, or still in its engines (a kept stream, a background response)."""
        in_engines = 0 if self.state is None else len(self.state.llm.output_processor.request_states)
        return self.num_leases + in_engines

    @property
    def is_idle(self) -> bool:
        return self.status is ModelStatus.LOADED and not self.is_unloading and self.num_in_flight == 0

    @property
    def memory_bytes(self) -> int:
        """What it counts against the budget: its engines' own report once loaded, its reservation until then."""
        if self.state is not None:
            return max(self.state.llm.engine_client.memory_bytes, self.reported_bytes)
        return self.reserved_bytes

    def describe(self) -> dict[str, object]:
        """Its `status` in /v1/models: the state's name, a failed one as llama.cpp's router says it
        ("unloaded", "failed": true) with why, a loaded one with its engines' memory (what counts against
        the budget, and of it their weights and KV caches)."""
        status: dict[str, object] = {"value": self.status.value}
        if self.status is ModelStatus.FAILED:
            status = {"value": ModelStatus.UNLOADED.value, "failed": True, "reason": self.error}
        if self.state is not None:
            readies = _engine_readies(self.state.llm.engine_client)
            status |= {
                "memory_bytes": self.memory_bytes, "num_engines": len(readies),
                "weight_bytes": sum(ready.weight_bytes for ready in readies),
                "kv_cache_bytes": sum(ready.kv_cache_bytes for ready in readies),
            }
        return status


class ModelPool(Generic[S]):
    """Loads a model when a request names it, within the budget, and unloads idle ones."""

    def __init__(self, entries: Sequence[ModelEntry], config: GatewayConfig, build_state: BuildState[S]) -> None:
        self.slots: dict[str, ModelSlot[S]] = {entry.id: ModelSlot(entry) for entry in entries}
        self._by_name = {name: slot for slot in self.slots.values() for name in slot.entry.names}
        self.config = config
        self._build_state = build_state
        self._room_lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._watch_task = asyncio.create_task(self._watch(), name="model-pool-watch")

    @property
    def default_slot(self) -> ModelSlot[S]:
        """The model a request that names none gets: the first listed."""
        return next(iter(self.slots.values()))

    def slot_of(self, name: str | None) -> ModelSlot[S]:
        """The model a request names (by id or alias), or a 404 naming those served."""
        if not name:
            return self.default_slot
        slot = self._by_name.get(name)
        if slot is None:
            raise APIError(
                f"The model '{name}' does not exist. Served: {', '.join(self._by_name)}.", 404, param="model",
                code="model_not_found",
            )
        return slot

    @property
    def loaded_states(self) -> list[S]:
        return [slot.state for slot in self.slots.values() if slot.state is not None]

    async def acquire(self, name: str | None) -> tuple[ModelSlot[S], S]:
        """The named model and its state, loading it first if needed; it is not unloaded until `release`."""
        slot = self.slot_of(name)
        slot.num_leases += 1
        slot.last_used = time.monotonic()
        try:
            return slot, await self._ready_state(slot)
        except BaseException:
            self.release(slot)
            raise

    def release(self, slot: ModelSlot[S]) -> None:
        slot.num_leases -= 1
        slot.last_used = time.monotonic()
        asyncio.get_running_loop().create_task(self._notify())

    @contextlib.asynccontextmanager
    async def lease(self, name: str | None) -> AsyncIterator[S]:
        """`acquire` and `release` around a block (a batch line)."""
        slot, state = await self.acquire(name)
        try:
            yield state
        finally:
            self.release(slot)

    async def _ready_state(self, slot: ModelSlot[S]) -> S:
        while True:
            if slot.state is not None and slot.state.llm.is_dead:
                logger.warning("model %s: its engines are dead; loading it again", slot.id)
                await self._unload(slot)
            if slot.status is ModelStatus.LOADED and slot.state is not None and not slot.is_unloading:
                return slot.state
            if slot.status is ModelStatus.FAILED and slot.load_task is None:
                raise APIError(
                    f"The model '{slot.id}' failed to load: {slot.error}", 503, error_type="server_error",
                    code="model_load_failed",
                )
            if slot.is_unloading:
                await self._wait_change()
                continue
            load = self.start_loading(slot)
            if load is None:
                await self._wait_change()
            else:
                await asyncio.shield(load)

    def start_loading(self, slot: ModelSlot[S], *, is_retry: bool = False) -> asyncio.Task[None] | None:
        """Its load under way (started now unless one is; a failed model again only when `is_retry`),
        or None when it is loaded."""
        if slot.load_task is None and (slot.status is ModelStatus.UNLOADED or is_retry) and slot.state is None:
            slot.load_task = asyncio.create_task(self._load(slot), name=f"load-{slot.id}")
        return slot.load_task

    async def unload(self, name: str) -> ModelSlot[S]:
        """Unloads the model now (POST /v1/models/{id}/unload), aborting what it still runs."""
        slot = self.slot_of(name)
        if slot.load_task is not None:
            slot.load_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await slot.load_task
        await self._unload(slot)
        return slot

    async def _load(self, slot: ModelSlot[S]) -> None:
        entry, config = slot.entry, slot.entry.config
        slot.status, slot.error = ModelStatus.LOADING, None
        client: AsyncMPClient | None = None
        try:
            async with self._room_lock:
                await self._make_room(slot)
            assert entry.path is not None
            logger.info("loading model %s from %s", slot.id, entry.path)
            client = AsyncMPClient(config.engine, config.data_parallel_size, config.link, None, config.log_format)
            # NOTE: the tokenizer loads here while the engine loads its weights.
            tokenizer = await asyncio.to_thread(Tokenizer.from_model, entry.path)
            ready = await client.wait_ready()
            slot.state = self._build_state(entry, client, tokenizer, ready)
            slot.reported_bytes = max(slot.reported_bytes, client.memory_bytes)
            slot.status, slot.last_used = ModelStatus.LOADED, time.monotonic()
            logger.info("model %s loaded: its engines hold %.2f GiB", slot.id, slot.memory_bytes / 2**30)
        except asyncio.CancelledError:
            if client is not None and slot.state is None:
                await asyncio.to_thread(_stop_processes, client)
                client.shutdown()
            slot.status, slot.has_room = ModelStatus.UNLOADED, slot.state is not None
            raise
        except Exception as exc:  # noqa: BLE001 - whatever stopped it is the model's reason, others serve on
            if client is not None and slot.state is None:
                await asyncio.to_thread(_stop_processes, client)
                client.shutdown()
            slot.status, slot.error, slot.has_room = ModelStatus.FAILED, str(exc) or type(exc).__name__, False
            logger.error("model %s failed to load: %s", slot.id, slot.error)
        finally:
            slot.reserved_bytes = 0
            slot.load_task = None
            await self._notify()
        await self._trim(keep=slot)

    async def _make_room(self, slot: ModelSlot[S]) -> None:
        """Unloads least recently used idle models until `slot` fits, waiting for busy ones to go idle."""
        need = self._expected_bytes(slot)
        budget, max_loaded = self.config.memory_budget, self.config.max_loaded_models
        if budget is not None and need > budget:
            raise ModelLoadError(
                f"it needs about {need / 2**30:.2f} GiB, more than --memory-budget {budget / 2**30:.2f} GiB"
            )
        while True:
            others = [other for other in self.slots.values() if other is not slot and other.is_holding_memory]
            is_count_ok = max_loaded is None or len(others) < max_loaded
            is_memory_ok = budget is None or sum(other.memory_bytes for other in others) + need <= budget
            if is_count_ok and is_memory_ok:
                slot.reserved_bytes, slot.has_room = need, True
                return
            idle = sorted((other for other in others if other.is_idle), key=lambda other: other.last_used)
            if idle:
                logger.info("unloading model %s (least recently used) to make room for %s", idle[0].id, slot.id)
                await self._unload(idle[0])
            else:
                await self._wait_change()

    def _expected_bytes(self, slot: ModelSlot[S]) -> int:
        """What loading `slot` will take: what its engines last reported, or before any report, its
        file, its KV cache and the runtime (interpreter, torch) other engines report, per engine."""
        if slot.reported_bytes:
            return slot.reported_bytes
        engine = slot.entry.config.engine
        if engine.kv_cache_memory_gib is not None:
            kv_bytes = int(engine.kv_cache_memory_gib * 2**30)
        elif engine.device.startswith("cuda"):
            # NOTE: most of a GPU's free memory (unknown here): the model fits the budget only if the GPU does.
            kv_bytes = 0
        else:
            try:
                kv_bytes = default_kv_cache_bytes(available_ram_bytes(), is_gpu=False)
            except (OSError, RuntimeError):  # NOTE: no /proc/meminfo (not Linux): the most it may take.
                kv_bytes = CPU_MAX_DEFAULT_BYTES
        runtimes = [
            ready.runtime_bytes for other in self.slots.values() if other.state is not None
            for ready in _engine_readies(other.state.llm.engine_client)
        ]
        runtime = max(runtimes, default=_RUNTIME_BYTES_BEFORE_ANY_REPORT)
        return (slot.entry.num_file_bytes + kv_bytes + runtime) * max(slot.entry.config.data_parallel_size, 1)

    async def _unload(self, slot: ModelSlot[S]) -> None:
        """Stops its engines (their memory is free once this returns) and forgets its state."""
        state = slot.state
        if state is None:
            if slot.status is not ModelStatus.FAILED:
                slot.status = ModelStatus.UNLOADED
            return
        slot.is_unloading = True
        try:
            slot.reported_bytes = max(slot.reported_bytes, state.llm.engine_client.memory_bytes)
            request_ids = list(state.llm.output_processor.request_states)
            if request_ids:
                await state.llm.abort(request_ids)
            client = state.llm.engine_client
            if isinstance(client, AsyncMPClient):
                await asyncio.to_thread(_stop_processes, client)
            state.llm.shutdown()
            logger.info("model %s unloaded", slot.id)
        finally:
            slot.state, slot.status, slot.is_unloading, slot.has_room = None, ModelStatus.UNLOADED, False, False
            await self._notify()

    async def _trim(self, keep: ModelSlot[S] | None = None) -> None:
        """Unloads idle models while the loaded ones' reports exceed the budget (a first load's guess was low)."""
        budget = self.config.memory_budget
        while budget is not None:
            loaded = [slot for slot in self.slots.values() if slot.is_holding_memory]
            if sum(slot.memory_bytes for slot in loaded) <= budget:
                return
            idle = sorted((s for s in loaded if s.is_idle and s is not keep), key=lambda s: s.last_used)
            if not idle:
                return
            logger.warning("loaded models hold more than --memory-budget: unloading %s", idle[0].id)
            await self._unload(idle[0])

    async def _watch(self) -> None:
        """Keeps memory reports, unloads models idle past --idle-unload-s, and trims to the budget."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                now = time.monotonic()
                for slot in list(self.slots.values()):
                    if slot.state is not None:
                        slot.reported_bytes = max(slot.reported_bytes, slot.state.llm.engine_client.memory_bytes)
                    idle_s = self.config.idle_unload_s
                    if idle_s is not None and slot.is_idle and now - slot.last_used > idle_s:
                        logger.info("unloading model %s: idle for %.0f s", slot.id, now - slot.last_used)
                        await self._unload(slot)
                await self._trim()
            except Exception:
                logger.exception("model pool watch failed; trying again")

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _wait_change(self) -> None:
        """Until a lease ends, a load ends or a model unloads (or a second passes: in-engine requests end unseen)."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), WATCH_INTERVAL_S)

    async def close(self) -> None:
        """Unloads every model (the gateway is stopping)."""
        self._watch_task.cancel()
        for slot in self.slots.values():
            if slot.load_task is not None:
                slot.load_task.cancel()
        for slot in self.slots.values():
            if slot.load_task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await slot.load_task
            await self._unload(slot)


def _engine_readies(client: EngineCoreClient) -> list[EngineReady]:
    engines = getattr(client, "engines", {})
    return [engine.ready for engine in engines.values() if engine.is_alive]


def _stop_processes(client: AsyncMPClient) -> None:
    """Stops the client's engine processes and waits for them to exit (blocking: in a thread)."""
    for process in client.processes:
        process.shutdown()

