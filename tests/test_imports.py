"""Imports flow one way: proto ← engine_proc, proto ← service (service only launches the engine,
and InprocClient runs it in-process); no module imports itself through others; scheduling has
no torch in it; offline code never reaches the HTTP layer (`service/api/`); benchmarks never
lean on the tests."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"proto", "engine_proc", "service"}
ALLOWED = {"proto": set(), "engine_proc": {"proto"}, "service": {"proto"}}
# NOTE: the one gateway module that may hold an EngineCore (the engine in the caller's process); every other
# gateway module reaches engine_proc only by starting its process.
EXCEPTIONS = {ROOT / "service" / "client" / "inproc_client.py": {"engine_proc"}}


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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for package in OURS for path in (ROOT / package).rglob("*.py")}


def _runtime_imports(path: Path) -> Iterator[str]:
    """Every module name an import statement names, at any depth, except under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(node) for block in ast.walk(tree)
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for node in ast.walk(block)
    }
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _our_module(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports_of(module: str) -> set[str]:
    found = {_our_module(name) for name in _runtime_imports(MODULES[module])}
    return {name for name in found if name is not None and name != module and not module.startswith(f"{name}.")}


def _reachable(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for other in _imports_of(todo.pop()) - seen:
            seen.add(other)
            todo.append(other)
    return seen


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_itself_through_others(module: str) -> None:
    assert module not in _reachable(module)


@pytest.mark.parametrize("module", ["engine_proc.scheduler", "engine_proc.kv_cache_manager"])
def test_scheduling_runs_without_torch(module: str) -> None:
    for name in {module} | _reachable(module):
        third_party = {imported.split(".")[0] for imported in _runtime_imports(MODULES[name])}
        assert "torch" not in third_party, f"{name} (reached from {module}) imports torch"


def test_benchmarks_never_import_the_tests() -> None:
    for path in (ROOT / "benchmarks").rglob("*.py"):
        assert "tests" not in {name.split(".")[0] for name in _all_imports(path)}, path


def test_test_modules_share_helpers_not_each_other() -> None:
    for path in (ROOT / "tests").rglob("test_*.py"):
        imported = {name.rpartition(".")[2] for name in _all_imports(path) if name.startswith("tests.")}
        assert not {name for name in imported if name.startswith("test_")}, path


# NOTE: the rooms below the HTTP layer: what `LLM`, `zeroserve generate` and batch files run on.
OFFLINE_ROOMS = ("service.frontend", "service.client", "service.openai", "service.model_files", "service.observability")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(OFFLINE_ROOMS)))
def test_offline_code_never_reaches_the_http_layer(module: str) -> None:
    assert not {name for name in _reachable(module) if name.startswith("service.api")}, module


# NOTE: service/'s rooms, lowest first: a module imports only from its own room and rooms before it
# (the package's __init__ and __main__ stand above them all).
SERVICE_ROOMS = (
    "client", "observability", "config", "model_files", "flags", "frontend", "openai", "anthropic", "models", "streams",
    "api", "serving", "bench", "cli",
)


def _service_room(path: Path) -> str:
    parts = path.relative_to(ROOT / "service").parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def test_service_rooms_import_one_way() -> None:
    assert {_service_room(path) for path in (ROOT / "service").rglob("*.py")} <= {*SERVICE_ROOMS, "__init__", "__main__"}
    back_arrows = []
    for path in (ROOT / "service").rglob("*.py"):
        room = _service_room(path)
        if room in ("__init__", "__main__"):
            continue
        for name in _all_imports(path):
            parts = name.split(".")
            if parts[0] == "service" and len(parts) > 1 and parts[1] != room:
                if SERVICE_ROOMS.index(parts[1]) > SERVICE_ROOMS.index(room):
                    back_arrows.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not back_arrows, back_arrows


# NOTE: engine_proc/'s rooms, lowest first: the CPU's matmul machinery, the model families, the loader;
# the engine's own modules (the loop, scheduler, runner, attention, sampler) stand above them all.
ENGINE_ROOMS = ("cpu", "models", "loader")


def _engine_room(path: Path) -> str:
    parts = path.relative_to(ROOT / "engine_proc").parts
    return parts[0] if len(parts) > 1 else "engine"


def test_engine_rooms_import_one_way() -> None:
    assert {_engine_room(path) for path in (ROOT / "engine_proc").rglob("*.py")} == {*ENGINE_ROOMS, "engine"}
    back_arrows = []
    for path in (ROOT / "engine_proc").rglob("*.py"):
        room = _engine_room(path)
        if room == "engine":
            continue
        for name in _all_imports(path):
            parts = name.split(".")
            if parts[0] != "engine_proc" or len(parts) < 2 or parts[1] == room:
                continue
            if parts[1] not in ENGINE_ROOMS or ENGINE_ROOMS.index(parts[1]) > ENGINE_ROOMS.index(room):
                back_arrows.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not back_arrows, back_arrows


# NOTE: service/api/ is the HTTP layer and nothing else: each module speaks HTTP (Starlette, SSE, hypercorn) or
# works on the route table; what runs without HTTP (the model pool, batch worker, kept streams, process life)
# stands in the rooms around it.
HTTP_IMPORTS = ("starlette", "sse_starlette", "hypercorn", "service.api.routes")


@pytest.mark.parametrize("path", sorted((ROOT / "service" / "api").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_api_room_holds_http_only(path: Path) -> None:
    if path.name == "__init__.py":
        return
    assert any(name.startswith(HTTP_IMPORTS) for name in _all_imports(path)), f"{path.relative_to(ROOT)} has no HTTP code"
