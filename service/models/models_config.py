"""The --models-config file: each model's path, aliases and own settings, read from TOML or YAML.

```toml
[models."qwen2.5-0.5b-instruct"]
model = "/models/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf"   # needed only for a model not found otherwise
aliases = ["gpt-4o-mini", "qwen"]
max_model_len = 4096                                   # any engine setting, by field or flag name
speculative_config = {method = "ngram", num_speculative_tokens = 3}
reasoning_parser = "qwen3"                             # and the per-model gateway settings
```

YAML holds the same under a top-level `models:` mapping. A key is a setting's field name or its
flag's (without `--`), with dashes or underscores; each value is checked by its setting's own check
here, so an error names the file, the model and the key as written.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from proto.engine_config import EngineConfig
from proto.settings import check_value, flag_of
from service.config import GatewayConfig

# NOTE: the gateway settings one model may have its own of; the others (host, port, the queue,
# the models' memory budget...) belong to the whole gateway.
MODEL_GATEWAY_SETTINGS = ("data_parallel_size", "tool_call_parser", "reasoning_parser", "generation_config", "max_n")
_OWN_KEYS = ("model", "aliases")


@dataclass(frozen=True)
class ModelSettings:
    """One model's entry in --models-config: where it is (if given), its aliases and the settings it overrides."""

    origin: str  # "--models-config FILE: model 'ID'", the start of every error about it
    model: str = ""  # a path or known name; empty: the model is named on the command line or in --models-dir
    aliases: tuple[str, ...] = ()
    gateway_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # GatewayConfig field: value
    engine_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # EngineConfig field: value


def _settings_by_key() -> dict[str, tuple[str, dataclasses.Field[Any]]]:
    """Each key a model's entry may set ("gateway" or "engine", and its field), by field and flag name."""
    gateway = [f for f in dataclasses.fields(GatewayConfig) if f.name in MODEL_GATEWAY_SETTINGS]
    engine = [f for f in dataclasses.fields(EngineConfig) if "flag" in f.metadata]
    return {
        name.replace("-", "_"): (kind, config_field)
        for kind, fields in (("gateway", gateway), ("engine", engine))
        for config_field in fields
        for name in (config_field.name, flag_of(config_field).removeprefix("--"))
    }


SETTINGS_BY_KEY = _settings_by_key()


def read_models_config(path: str) -> dict[str, ModelSettings]:
    """Each model's settings in a --models-config file, by model id, in the file's order; a ValueError
    naming the file (and the model and the key) when it cannot be read or holds a value a setting refuses."""
    label = f"--models-config {path}"
    document = _load(Path(path), label)
    if not isinstance(document, dict) or set(document) - {"models"}:
        raise ValueError(f"{label}: must hold only a `models` table of models by id")
    models = document.get("models") or {}
    if not isinstance(models, dict):
        raise ValueError(f"{label}: `models` must map each model's id to its settings, got {type(models).__name__}")
    return {model_id: _model_settings(f"{label}: model {model_id!r}", model_id, values)
            for model_id, values in models.items()}


def _load(path: Path, label: str) -> Any:
    """The file's document, TOML or YAML by its suffix."""
    if path.suffix not in (".toml", ".yaml", ".yml"):
        raise ValueError(f"{label}: must be a .toml, .yaml or .yml file")
    try:
        text = path.read_text(encoding="utf-8")
        return tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{label}: cannot be read: {reason}") from None


def _model_settings(origin: str, model_id: Any, values: Any) -> ModelSettings:
    if not isinstance(model_id, str) or not model_id:
        raise ValueError(f"{origin}: a model's id must be a non-empty string")
    if not isinstance(values, dict):
        raise ValueError(f"{origin}: must be a table of settings, got {values!r}")
    model = values.get("model", "")
    if not isinstance(model, str):
        raise ValueError(f"{origin}: model must be a path or a known model's name, got {model!r}")
    aliases = _aliases(origin, model_id, values.get("aliases", []))
    settings: dict[str, dict[str, Any]] = {"gateway": {}, "engine": {}}
    for key, value in values.items():
        if key in _OWN_KEYS:
            continue
        normalized = key.replace("-", "_") if isinstance(key, str) else key
        if normalized not in SETTINGS_BY_KEY:
            known = ", ".join((*_OWN_KEYS, *sorted({f.name for _, f in SETTINGS_BY_KEY.values()})))
            raise ValueError(f"{origin}: unknown key {key!r}; known: {known}")
        kind, config_field = SETTINGS_BY_KEY[normalized]
        if config_field.name in settings[kind]:
            raise ValueError(f"{origin}: {key} sets {config_field.name} a second time")
        settings[kind][config_field.name] = _setting_value(origin, key, config_field, value)
    return ModelSettings(origin, model, aliases, settings["gateway"], settings["engine"])


def _aliases(origin: str, model_id: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(alias, str) and alias for alias in value):
        raise ValueError(f"{origin}: aliases must be a list of names, got {value!r}")
    if model_id in value or len(set(value)) != len(value):
        raise ValueError(f"{origin}: aliases repeat a name: {value!r}")
    return tuple(value)


def _setting_value(origin: str, key: str, config_field: dataclasses.Field[Any], value: Any) -> Any:
    """`value` as the setting holds it (a table for a JSON setting as its JSON, a list as a tuple), checked."""
    if config_field.metadata.get("is_json") and isinstance(value, dict):
        value = json.dumps(value)
    elif isinstance(value, dict):
        value = tuple(value.items())  # NOTE: --override-generation-config's pairs
    elif isinstance(value, list):
        value = tuple(value)
    elif isinstance(value, str) and (parse := config_field.metadata.get("parse")) is not None:
        try:
            value = parse(value)
        except ValueError as exc:
            raise ValueError(f"{origin}: {key}: {exc}") from None
    try:
        check_value(config_field, value, label=key)
    except ValueError as exc:
        raise ValueError(f"{origin}: {exc}") from None
    return value
