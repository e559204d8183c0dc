"""Imports flow one way: proto ← engine_proc, proto ← service (service only launches the engine,
and InprocClient runs it in-process)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"proto", "engine_proc", "service"}
ALLOWED = {"proto": set(), "engine_proc": {"proto"}, "service": {"proto"}}
# NOTE: the one gateway module that may hold an EngineCore (DESIGN.md: "engine_proc only to start it").
EXCEPTIONS = {ROOT / "service" / "inproc_client.py": {"engine_proc"}}


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & OURS


@pytest.mark.parametrize("package", sorted(OURS))
def test_package_imports_only_what_it_may(package: str) -> None:
    for path in (ROOT / package).rglob("*.py"):
        others = imported_packages(path) - {package}
        allowed = ALLOWED[package] | EXCEPTIONS.get(path, set())
        assert others <= allowed, f"{path.relative_to(ROOT)} imports {sorted(others)}"


def test_proto_never_imports_torch() -> None:
    for path in (ROOT / "proto").rglob("*.py"):
        assert "torch" not in {n.split(".")[0] for n in _all_imports(path)}, path


def _all_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names
