"""Shared fixtures: the real default model, fetched once into the cache."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """Path of the default model's GGUF file (fetched on first use)."""
    from service.model_registry import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL).path
