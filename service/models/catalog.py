"""The models a multi-model gateway serves, each with its own settings: those named on the command
line, the files and folders of --models-dir, and those --models-config adds.

A model named on the command line or in --models-config that cannot be served stops the start, as
one model would. A file in --models-dir that cannot be served is listed with the reason instead: one
broken file in a shared folder must not keep the others from serving.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

from service.config import GatewayConfig
from service.model_files.model_registry import ResolvedModel, resolve_model
from service.models.models_config import ModelSettings, read_models_config

logger = logging.getLogger(__name__)

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")


@dataclass(frozen=True)
class ModelEntry:
    """One model a multi-model gateway serves: its name, aliases, its own settings, or why it cannot be served."""

    id: str  # the name /v1/models lists and requests use
    aliases: tuple[str, ...]  # other names a request may use for it
    config: GatewayConfig  # a single-model GatewayConfig for it
    generation_defaults: dict[str, float]  # its file's sampling defaults (ResolvedModel.generation_defaults)
    path: Path | None  # the file or folder, None when it could not be resolved
    error: str | None = None  # why it cannot be served, found while listing (a broken or unsupported file)
    num_file_bytes: int = 0  # size of the .gguf file, or of the folder's *.safetensors/*.bin/*.gguf files

    @property
    def names(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)


@dataclass(frozen=True)
class _Found:
    """A model found while listing, before its settings: where it came from, and its file or its error."""

    id: str
    origin: str  # where it was named, for an error about two models of one name
    path: Path | None
    resolved: ResolvedModel | None = None
    error: str | None = None


def find_models(config: GatewayConfig) -> list[ModelEntry]:
    """Every model the gateway serves: those named (config.models), each .gguf and HF folder in config.models_dir,
    and those only --models-config names; each with its settings from --models-config. Blocking (reads files; a
    known model name may be fetched by pip), so the gateway calls it in a thread."""
    settings = read_models_config(config.models_config) if config.models_config else {}
    found = [_named(name) for name in config.models]
    if config.models_dir:
        found += _listed(config.models_dir)
    found_ids = {model.id for model in found}
    for model_id, model_settings in settings.items():
        if model_settings.model or model_id not in found_ids:
            found.append(_configured(model_id, model_settings))
    found = _one_of_each(found)
    if not found:
        raise ValueError("no models to serve: name them, or give a --models-dir or --models-config that holds some")
    entries = [_entry(config, model, settings.get(model.id)) for model in found]
    _check_names_are_unique(entries, {model.id: model.origin for model in found}, settings)
    return _with_own_kv_events_ports(config, entries)


def _named(name: str) -> _Found:
    resolved = resolve_model(name)
    return _Found(resolved.name, f"{name} (on the command line)", resolved.path, resolved)


def _listed(models_dir: str) -> list[_Found]:
    """Each .gguf file and Hugging Face folder (with a config.json) in the folder, by id."""
    folder = Path(models_dir).expanduser()
    try:
        paths = list(folder.iterdir())
    except OSError as exc:
        raise ValueError(f"--models-dir {models_dir}: cannot be listed: {exc.strerror or exc}") from None
    found = []
    # NOTE: hidden names are left out: macOS writes a `._NAME.gguf` beside each file copied to some disks.
    for path in paths:
        if path.name.startswith("."):
            continue
        if path.suffix == ".gguf" and not path.is_dir():
            model_id = path.stem
        elif (path / "config.json").is_file():
            model_id = path.name
        else:
            continue
        origin = f"{path} (in --models-dir)"
        try:
            resolved = resolve_model(str(path))
        except ValueError as exc:
            found.append(_Found(model_id, origin, path, error=str(exc)))
            continue
        # NOTE: under its file's name, as --models-dir's help says, even where resolve_model knows the
        # file as a known model's: the name a user sees in the folder is the one to ask for.
        found.append(_Found(model_id, origin, path, resolved))
    return sorted(found, key=lambda model: model.id)


def _configured(model_id: str, settings: ModelSettings) -> _Found:
    if not settings.model:
        raise ValueError(
            f"{settings.origin}: is named nowhere (not on the command line nor in --models-dir); "
            "give its path or known name as `model`"
        )
    try:
        resolved = resolve_model(settings.model)
    except ValueError as exc:
        raise ValueError(f"{settings.origin}: model: {exc}") from None
    return _Found(model_id, f"{settings.origin} (model = {settings.model!r})", resolved.path, resolved)


def _one_of_each(found: list[_Found]) -> list[_Found]:
    """`found` without repeats of one model (the same file under the same id, named two ways); a ValueError
    naming both where two models have one id."""
    kept: dict[str, _Found] = {}
    for model in found:
        other = kept.setdefault(model.id, model)
        if other is not model and not (model.path is not None and _same_file(model.path, other.path)):
            raise ValueError(f"{model.origin}: another model has the id {model.id!r}: {other.origin}")
    return list(kept.values())


def _same_file(path: Path, other: Path | None) -> bool:
    try:
        return other is not None and os.path.samefile(path, other)
    except OSError:
        return False


def _entry(base: GatewayConfig, model: _Found, settings: ModelSettings | None) -> ModelEntry:
    """The model's entry, its config the command line's with its own settings over it."""
    aliases = settings.aliases if settings is not None else ()
    num_file_bytes = _num_file_bytes(model.path) if model.path is not None else 0
    if model.resolved is None:
        config = replace(base, models_dir="", models_config="", models=(), served_model_names=())
        return ModelEntry(model.id, aliases, config, {}, model.path, model.error, num_file_bytes)
    path = str(model.resolved.path)
    gateway_settings = dict(settings.gateway_settings) if settings is not None else {}
    engine_settings = dict(settings.engine_settings) if settings is not None else {}
    try:
        engine = replace(base.engine, **engine_settings, model_path=path, model_name=model.id)
        config = replace(
            base, model=path, models=(path,), models_dir="", models_config="", served_model_names=(),
            engine=engine, **gateway_settings,
        )
    except ValueError as exc:
        raise ValueError(f"{settings.origin if settings else model.origin}: {exc}") from None
    return ModelEntry(
        model.id, aliases, config, dict(model.resolved.generation_defaults), model.resolved.path,
        num_file_bytes=num_file_bytes,
    )


def _with_own_kv_events_ports(base: GatewayConfig, entries: list[ModelEntry]) -> list[ModelEntry]:
    """The entries, each model that shares the command line's --kv-events-config on ports of its own: its
    engines' after those of the models listed before it (one engine each: the configured ports plus its index)."""
    shared = base.engine.kv_events
    if not shared.is_publishing:
        return entries
    placed, num_engines_before = [], 0
    for entry in entries:
        engine = entry.config.engine
        if engine.kv_events_config == base.engine.kv_events_config:
            kv_events = shared.offset(num_engines_before)
            engine = replace(engine, kv_events_config=kv_events.to_json())
            entry = replace(entry, config=replace(entry.config, engine=engine))
            if entry.error is None:
                logger.info("model %s: KV cache events at %s (the configured ports + %d)", entry.id,
                            kv_events.endpoint, num_engines_before)
        num_engines_before += max(entry.config.data_parallel_size, 1)
        placed.append(entry)
    return placed


def _num_file_bytes(path: Path) -> int:
    """Bytes of a .gguf file, or of a folder's weight files."""
    try:
        if not path.is_dir():
            return path.stat().st_size
        return sum(file.stat().st_size for file in path.iterdir() if file.suffix in _WEIGHT_SUFFIXES and file.is_file())
    except OSError:
        return 0


def _check_names_are_unique(
    entries: list[ModelEntry], origins: dict[str, str], settings: dict[str, ModelSettings]
) -> None:
    """A ValueError naming the --models-config entry and both models where an alias is another model's id or alias."""
    owners: dict[str, str] = {}
    for entry in entries:
        for name in entry.names:
            owner = owners.setdefault(name, entry.id)
            if owner == entry.id:
                continue
            # NOTE: ids are unique by now, so one of the two holds `name` as an alias from the file.
            aliased, other = (entry.id, owner) if name != entry.id else (owner, entry.id)
            what = "an alias of" if name != other else "the id of"
            raise ValueError(
                f"{settings[aliased].origin}: aliases: {name!r} is already {what} model {other!r} ({origins[other]})"
            )
