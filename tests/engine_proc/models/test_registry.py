"""The registry of families is the one list of architectures: the gateway's lists (proto/model_support.py)
name what it names, and the loaders name none."""

from __future__ import annotations

import re
from pathlib import Path

from engine_proc.models.registry import FAMILIES, gguf_family, hf_family
from proto import model_support

_LOADERS = Path(__file__).parents[3] / "engine_proc" / "loader"


def test_the_gateways_lists_are_the_registrys() -> None:
    families = FAMILIES.values()
    assert set(model_support.ARCHITECTURES) == set(FAMILIES)
    assert set(model_support.GGUF_ARCHITECTURES) == {name for f in families for name in f.gguf_architectures}
    assert set(model_support.HF_MODEL_TYPES) == {name for f in families for name in f.hf_model_types}
    experts = {name for f in families if f.has_experts for name in (*f.gguf_architectures, *f.hf_model_types)}
    assert model_support.MIXTURE_OF_EXPERTS_ARCHITECTURES == experts


def test_each_name_finds_its_family() -> None:
    for family in FAMILIES.values():
        for model_type in family.hf_model_types:
            assert hf_family(model_type) is family
        for name in family.gguf_architectures:
            assert gguf_family(name, family.has_experts) is family
    assert hf_family("bloom") is None and gguf_family("bloom", has_experts=False) is None


def test_no_loader_names_an_architecture() -> None:
    """A new family is its module and a registry line: the loaders read every fact of it from the registry."""
    names = {name for family in FAMILIES.values() for name in (
        family.architecture, *family.hf_model_types, *family.gguf_architectures)}
    for path in _LOADERS.glob("*.py"):
        strings = set(re.findall(r"[\"']([\w.-]+)[\"']", path.read_text()))
        assert not strings & names, f"{path.name} names {sorted(strings & names)}"
