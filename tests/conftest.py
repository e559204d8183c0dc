"""Shared fixtures: the real default model, and a tiny random model of the same architecture."""

from __future__ import annotations

import ast
import functools
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# NOTE: torch's OpenMP threads sleep when idle instead of spinning: the suite's processes (its
# workers, servers and engines) share a few cores, where spinning threads took the CPU time the
# others waited for (18 minutes on two workers against 8.6 with this). Set before torch loads,
# and inherited by every process a test starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# NOTE: the matmul plans engines measure at load are kept for this run's later loads (every
# process a test starts inherits the folder, made once by the run's first process), not in the
# user's cache: plans timed while the suite loads the machine would serve their `make serve`.
if "ZEROSERVE_PLAN_CACHE" not in os.environ:
    os.environ["ZEROSERVE_PLAN_CACHE"] = _OWN_PLAN_CACHE = tempfile.mkdtemp(prefix="zeroserve-test-plans-")
# NOTE: the Responses the suite's servers keep (store: true is the default) go to this run's file
# (every server a test starts reads ZEROSERVE_RESPONSES_STORE), not to the user's cache.
if "ZEROSERVE_RESPONSES_STORE" not in os.environ:
    _OWN_RESPONSES_STORE = tempfile.mkdtemp(prefix="zeroserve-test-responses-")
    os.environ["ZEROSERVE_RESPONSES_STORE"] = os.path.join(_OWN_RESPONSES_STORE, "responses.sqlite")


def pytest_unconfigure(config: pytest.Config) -> None:
    if "_OWN_PLAN_CACHE" in globals():
        shutil.rmtree(_OWN_PLAN_CACHE, ignore_errors=True)
    if "_OWN_RESPONSES_STORE" in globals():
        shutil.rmtree(_OWN_RESPONSES_STORE, ignore_errors=True)


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """Path of the default model's GGUF file (fetched on first use)."""
    from service.model_files.model_registry import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL).path


@pytest.fixture(scope="session")
def tiny_model_dir(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face folder: random 2-layer Llama weights with the default model's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from service.model_files.tokenizer import Tokenizer

    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = Tokenizer.from_model(default_model_path)
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({**tokenizer.special_tokens, "chat_template": tokenizer.chat_template})
    )
    return path


@pytest.fixture(scope="session")
def hf_reference_model(default_model_path: Path) -> object:
    """transformers' own model from the default GGUF: the reference our outputs are checked against."""
    import functools
    from unittest import mock

    import gguf
    import torch
    import transformers

    # NOTE: transformers reads the file's metadata twice (once for the config) and rebuilds gguf's
    # tensor-name table for every module it walks: the same reader and table each time load it in
    # 6.7 s instead of 14, the same weights.
    with (
        mock.patch("gguf.GGUFReader", functools.cache(gguf.GGUFReader)),
        mock.patch("gguf.get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)),
    ):
        return transformers.AutoModelForCausalLM.from_pretrained(
            default_model_path.parent, gguf_file=default_model_path.name, dtype=torch.float32
        ).eval()


# NOTE: `make test-fast` leaves out what is marked slow here: tests of the real model, and tests that
# start a process, where the test, a fixture it needs, or a top-level function, class or constant of
# their module that they use calls one of these by name: the project's functions that start a server,
# an engine process or a command, and the standard library's. No test module is listed, so a moved
# or new one is marked as its code reads.
_PROCESS_STARTERS = frozenset({
    "local_server", "running_server",  # `zeroserve serve` (service/bench/local_server.py, tests/server_process.py)
    "run_api_servers",  # the gateway processes of --api-server-count (service/serving/api_servers.py)
    "EngineProcess", "SyncMPClient", "AsyncMPClient", "make_client",  # an engine process (service/client/)
    "LLM", "LLMEngine", "AsyncLLM",  # their engine's process (ZEROSERVE_ENABLE_MULTIPROCESSING is on by default)
    "convert_to_gguf",  # llama.cpp's converter (benchmarks/reference_models.py)
    "subprocess", "multiprocessing", "create_subprocess_exec", "create_subprocess_shell",
})
_TESTS = Path(__file__).resolve().parent
_ROOT = Path(__file__).resolve().parent.parent


# NOTE: `make test` hands whole modules to its two pytest-xdist workers in collection order
# (`--dist loadscope --no-loadscope-reorder`), so the longest go first, longest first (seconds on
# a 2-core Zen 4, both workers busy), and the two workers end together.
_LONGEST_FIRST = (
    "tests/engine_proc/models/test_architectures.py",  # six architectures' references and conversions
    "tests/service/api/test_openai_sdk.py",  # 79
    "tests/service/api/test_batches_sdk.py",  # a 200-line batch across a restart, then two servers
    "tests/service/api/test_openapi_fuzz_inproc.py",  # 59
    "tests/test_emulated_cpus.py",  # 55
    "tests/test_readme.py",  # 52
    "tests/test_batch_invariance.py",  # 70 alone on a 2-core Zen 2
    "tests/engine_proc/test_fidelity_int4.py",  # 48 with the two below: one worker's transformers reference
    "tests/service/api/test_operations.py",  # 46
    "tests/service/api/web/test_pages_browser.py",  # 39
    "tests/service/client/test_chaos.py",  # 36
    "tests/service/client/test_engine_membership.py",  # 29
    "tests/service/models/test_model_pool.py",  # 28 on a 2-core Zen 2
    "tests/service/api/test_models_sdk.py",  # 22
    "tests/service/api/web/test_pages_many_models.py",  # 21
    "tests/service/client/test_remote_engines.py",  # 16
    "tests/service/openai/test_batch_generate.py",  # 13
    "tests/service/client/test_data_parallel.py",  # 13
    "tests/engine_proc/test_fidelity_k_quants.py",  # its own transformers reference
)
# The modules that use transformers' reference model (14 s to load) run on one worker, as one unit.
_REFERENCE_MODULES = (
    "tests/engine_proc/test_fidelity_int4.py", "tests/engine_proc/test_fidelity.py",
    "tests/engine_proc/loader/test_gguf_loader.py", "tests/engine_proc/test_cuda.py",
)


def _module_rank(module: str) -> int:
    unit = _REFERENCE_MODULES[0] if module in _REFERENCE_MODULES else module
    return _LONGEST_FIRST.index(unit) if unit in _LONGEST_FIRST else len(_LONGEST_FIRST)


def _called_names(func: ast.expr) -> set[str]:
    """The names of a call's `a.b.c`: what it calls and what it calls it on."""
    names: set[str] = set()
    while isinstance(func, ast.Attribute):
        names.add(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        names.add(func.id)
    return names


@functools.cache
def _definitions(filename: str) -> dict[str, tuple[bool, frozenset[str]]]:
    """A module's top-level definitions by name: whether each calls a process starter, and the names it uses."""
    definitions: dict[str, tuple[bool, frozenset[str]]] = {}
    for node in ast.parse(Path(filename).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [target.id for target in node.targets if isinstance(target, ast.Name)]
        else:
            continue
        inner = list(ast.walk(node))
        is_starter = any(isinstance(n, ast.Call) and _called_names(n.func) & _PROCESS_STARTERS for n in inner)
        used = frozenset(n.id for n in inner if isinstance(n, ast.Name))
        definitions.update(dict.fromkeys(names, (is_starter, used)))
    return definitions


@functools.cache
def _starts_process(filename: str, name: str) -> bool:
    """Whether a suite module's top-level `name`, or one of its top-level names it uses, calls a process starter."""
    # NOTE: pytest's and its plugins' own fixtures start nothing.
    if not Path(filename).is_relative_to(_TESTS):
        return False
    definitions = _definitions(filename)
    pending, seen = {name}, set[str]()
    while pending:
        name = pending.pop()
        seen.add(name)
        is_starter, used = definitions.get(name, (False, frozenset()))
        if is_starter:
            return True
        pending |= used - seen
    return False


def _is_process_test(item: pytest.Item) -> bool:
    """Whether the test, or a fixture it needs (its module's or a conftest's), starts a process."""
    fixture_info = getattr(item, "_fixtureinfo", None)
    fixturedefs = fixture_info.name2fixturedefs.values() if fixture_info else ()
    functions = [getattr(item, "obj", None), *(fixturedef.func for defs in fixturedefs for fixturedef in defs)]
    codes = [getattr(inspect.unwrap(function), "__code__", None) for function in functions if callable(function)]
    return any(_starts_process(code.co_filename, code.co_qualname.split(".")[0]) for code in codes if code)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.relative_to(_ROOT).as_posix()
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("real_model") or _is_process_test(item):
            item.add_marker(pytest.mark.slow)
        if "hf_reference_model" in fixtures and module not in _REFERENCE_MODULES:
            raise pytest.UsageError(f"{module} uses hf_reference_model: add it to _REFERENCE_MODULES in {__file__}")
    items.sort(key=lambda item: _module_rank(item.path.relative_to(_ROOT).as_posix()))


@pytest.hookimpl(optionalhook=True)  # NOTE: a hook of pytest-xdist's, which a run may leave out
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's loadscope (a module to a worker), with the reference model's modules one unit."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return _REFERENCE_MODULES[0] if module in _REFERENCE_MODULES else module

    return Scheduling(config, log)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def llama_cpp_tree() -> Path:
    """llama.cpp's vendored source tree (reference vocabularies, templates, converter), fetched once."""
    from benchmarks.llama_cpp_tree import llama_cpp_tree as fetch

    return fetch()
