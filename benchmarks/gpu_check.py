"""One prepared run on a CUDA machine: torch's CUDA build, the GPU tests (fidelity against
transformers on the same GPU), a served stream, the benchmark, and the SDK tests, each phase
bounded in time, everything written to OUT_DIR. Nothing here has run on a GPU yet.

    python -m benchmarks.gpu_check OUT_DIR [--budget-s 540] [--skip-install] [--torch-cuda cu130]
    python -m benchmarks.gpu_check --dry-run     # anywhere: every file, module and flag it uses exists

Run it with the venv that `make install-test TORCH=cu130` makes (zeroserve, its test extras and
torch's CUDA build; without TORCH=cu130, phase 0 puts the CUDA build in place of the CPU one). The
default model comes from PyPI on first use: a machine that reaches no index needs ZEROSERVE_CACHE
to name a cache that holds it. Phases, in order (a phase that fails is logged and the next one
runs; summary.json says how each ended):
  0. install.log: where torch sees no GPU, `pip install torch==<pyproject's pin>+cu130` from
     PyTorch's index (--skip-install on a machine that reaches no index; the run then stops
     unless torch already sees a GPU).
  1. machine.txt: nvidia-smi, the GPU, torch and CUDA versions.
  2. test_cuda.log: pytest tests/engine_proc/test_cuda.py (float32 greedy tokens equal to
     transformers' on the GPU, bfloat16 within the bounds of the int4 CPU forms, the KV budget
     from free GPU memory, batched requests equal to each alone).
  3. serve.json / serve.log: `zeroserve serve` with default flags (device auto: the GPU), a
     streamed chat through the OpenAI SDK, a JSON-schema answer, sampled tokens with logprobs;
     /version's device and kernel choices.
  4. bench.log / reference_compare_cuda.json: benchmarks.reference_compare --device cuda, one round.
  5. sdk.log: the real-model OpenAI SDK tests (tests/service/api/test_openai_sdk.py) with what time
     is left.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# NOTE: PyPI's own torch 2.14.1 wheel is a CUDA 13.0 build, and the GPU machines this was prepared
# for run driver 580 (CUDA 13.0); an older driver needs an older tag of PyTorch's index (cu128).
DEFAULT_TORCH_CUDA = "cu130"
# NOTE: only the plugin the tests need: a GPU image's own pytest plugins may not load beside ours.
PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
PYTEST_ARGS = ("-p", "no:cacheprovider", "-p", "pytest_asyncio.plugin", "-rA", "-q")
# What local_server adds to `zeroserve serve`'s (here empty) arguments.
SERVE_FLAGS = ("--port",)
# The modules the serve phase imports in this process.
SERVE_MODULES = ("httpx", "openai", "service.bench.local_server")


@dataclass(frozen=True)
class Step:
    """A phase's command, `python -m MODULE ARGS`, with its log file and its most seconds."""

    module: str
    args: tuple[str, ...]
    log: str
    max_s: float
    env: dict[str, str] = field(default_factory=dict)
    # NOTE: the words before the flags (`pip install`), whose --help lists them.
    subcommand: tuple[str, ...] = ()

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", self.module, *self.subcommand, *self.args]

    @property
    def is_pytest(self) -> bool:
        return self.module == "pytest"


def torch_pin() -> str:
    """The torch version pyproject.toml pins (torch==X)."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(str(dep).split("==", 1)[1] for dep in dependencies if str(dep).startswith("torch=="))


def steps(out: Path, torch_cuda: str) -> dict[str, Step]:
    """Every command the run starts, by phase."""
    return {
        "install": Step("pip", (
            "--quiet", f"torch=={torch_pin()}+{torch_cuda}", "--index-url", f"https://download.pytorch.org/whl/{torch_cuda}",
        ), "install.log", 300, subcommand=("install",)),
        "test_cuda": Step(
            "pytest", (*PYTEST_ARGS, "-s", "tests/engine_proc/test_cuda.py"), "test_cuda.log", 200, PYTEST_ENV,
        ),
        "bench": Step("benchmarks.reference_compare", (
            "--device", "cuda", "--rounds", "1", "--concurrency", "1", "16", "64",
            "--result-json", str(out / "reference_compare_cuda.json"),
        ), "bench.log", 240),
        "sdk": Step("pytest", (*PYTEST_ARGS, "tests/service/api/test_openai_sdk.py"), "sdk.log", 600, PYTEST_ENV),
    }


def run_logged(step: Step, out: Path, timeout_s: float) -> int:
    """Runs `step` with its output in its log; its exit status (124 when it ran out of time)."""
    with (out / step.log).open("w") as file:
        try:
            return subprocess.run(
                step.command, stdout=file, stderr=subprocess.STDOUT, timeout=timeout_s,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **step.env},
            ).returncode
        except subprocess.TimeoutExpired:
            file.write(f"\n[gpu_check: stopped after {timeout_s:.0f} s]\n")
            return 124


def torch_sees_a_gpu() -> bool:
    """Whether this interpreter's torch sees a CUDA GPU (asked in a child: the install may replace torch)."""
    probe = "import torch; raise SystemExit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def machine(out: Path) -> int:
    import torch

    lines = [subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout if shutil.which("nvidia-smi")
             else "nvidia-smi: not found"]
    lines.append(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                 f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}")
    (out / "machine.txt").write_text("\n".join(lines) + "\n")
    return 0


def serve_and_stream(out: Path) -> int:
    import httpx
    from openai import OpenAI

    from service.bench.local_server import local_server

    record: dict[str, object] = {}
    started = time.perf_counter()
    with local_server([], log_file=out / "serve.log", timeout_s=240) as server:
        record["ready_s"] = time.perf_counter() - started
        record["version"] = httpx.get(f"{server.base_url}/version").json()
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none", timeout=60, max_retries=0)
        model = client.models.list().data[0].id
        started = time.perf_counter()
        first_s, text, num_chunks = None, "", 0
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "What is the capital of Japan?"}],
            max_tokens=64, temperature=0, stream=True,
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first_s = first_s or time.perf_counter() - started
                text += chunk.choices[0].delta.content
                num_chunks += 1
        record["stream"] = {"text": text, "num_chunks": num_chunks, "ttft_s": first_s,
                            "total_s": time.perf_counter() - started}
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                  "required": ["city"], "additionalProperties": False}
        answer = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Name the capital of France as JSON with key city."}],
            max_tokens=40, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
        )
        record["json_schema"] = answer.choices[0].message.content
        sampled = client.completions.create(
            model=model, prompt="The sea is", max_tokens=8, temperature=0.8, seed=3, logprobs=2,
        )
        logprobs = sampled.choices[0].logprobs
        record["sampled"] = {"text": sampled.choices[0].text, "top_logprobs": logprobs and logprobs.top_logprobs}
        metrics = httpx.get(f"{server.base_url}/metrics").text
        record["metrics"] = [line for line in metrics.splitlines() if "cache" in line and not line.startswith("#")][:10]
    (out / "serve.json").write_text(json.dumps(record, indent=2, default=str))
    return 0


def missing_flags(module: str, subcommand: tuple[str, ...], flags: list[str]) -> list[str]:
    """Those of `flags` that `python -m MODULE SUBCOMMAND --help` does not list."""
    help_text = subprocess.run(
        [sys.executable, "-m", module, *subcommand, "--help"], capture_output=True, text=True, cwd=ROOT,
    ).stdout
    return [flag for flag in flags if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text)]


def check_step(step: Step) -> list[str]:
    """What `step` names that is not there: its module, its files, its flags; a test file that does
    not collect."""
    if importlib.util.find_spec(step.module) is None:
        return [f"module {step.module} not found"]
    if step.is_pytest:
        problems = [f"{arg} not found" for arg in step.args if arg.endswith(".py") and not (ROOT / arg).is_file()]
        collected = subprocess.run(
            [*step.command, "--collect-only"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
            env={**os.environ, **step.env},
        )
        if collected.returncode != 0:
            problems.append(f"{step.args[-1]} does not collect: {collected.stdout[-400:]}")
        return problems
    flags = [arg for arg in step.args if arg.startswith("--")]
    program = " ".join((step.module, *step.subcommand))
    return [f"python -m {program} has no flag {flag}" for flag in missing_flags(step.module, step.subcommand, flags)]


def dry_run() -> int:
    """Checks every module, file and flag the run would use; 1 if any is missing."""
    checks: dict[str, list[str]] = {
        name: check_step(step) for name, step in steps(Path("OUT_DIR"), DEFAULT_TORCH_CUDA).items()
    }
    checks["serve"] = [f"module {module} not found" for module in SERVE_MODULES
                       if importlib.util.find_spec(module) is None]
    checks["serve"] += [f"python -m service serve has no flag {flag}" for flag in missing_flags("service", ("serve",), list(SERVE_FLAGS))]
    for name, problems in checks.items():
        print(f"{name}: {'; '.join(problems) if problems else 'ok'}", flush=True)
    return 1 if any(checks.values()) else 0


def install(step: Step, out: Path, timeout_s: float, skip_install: bool) -> int:
    """Phase 0: torch's CUDA build where torch sees no GPU; 0 once it sees one."""
    if torch_sees_a_gpu():
        (out / step.log).write_text("torch already sees a GPU: nothing installed\n")
        return 0
    if skip_install:
        (out / step.log).write_text("torch sees no GPU, and --skip-install\n")
        return 1
    rc = run_logged(step, out, timeout_s)
    return rc or (0 if torch_sees_a_gpu() else 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, nargs="?", help="where the logs and results go")
    parser.add_argument("--budget-s", type=float, default=540.0, help="the whole run's time (default: %(default)s)")
    parser.add_argument("--skip-install", action="store_true", help="never install torch (a machine that reaches no index)")
    parser.add_argument("--torch-cuda", default=DEFAULT_TORCH_CUDA,
                        help="the CUDA build of torch phase 0 installs: PyTorch's index tag (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="check every module, file and flag the run uses, run nothing")
    args = parser.parse_args()
    if args.dry_run:
        return dry_run()
    if args.out is None:
        parser.error("OUT_DIR is needed (or --dry-run)")
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # NOTE: the test files and `python -m` modules are named from the repository's root.
    os.chdir(ROOT)
    deadline = time.monotonic() + float(args.budget_s)

    def left(most: float) -> float:
        return max(10.0, min(most, deadline - time.monotonic()))

    commands = steps(out, args.torch_cuda)
    phases: list[tuple[str, Callable[[], int]]] = [
        ("install", lambda: install(commands["install"], out, left(commands["install"].max_s), args.skip_install)),
        ("machine", lambda: machine(out)),
        ("test_cuda", lambda: run_logged(commands["test_cuda"], out, left(commands["test_cuda"].max_s))),
        ("serve", lambda: serve_and_stream(out)),
        ("bench", lambda: run_logged(commands["bench"], out, left(commands["bench"].max_s))),
        ("sdk", lambda: run_logged(commands["sdk"], out, left(commands["sdk"].max_s))),
    ]
    summary: dict[str, dict[str, object]] = {}
    for name, phase in phases:
        if deadline - time.monotonic() < 20:
            summary[name] = {"status": "skipped: out of time"}
        else:
            started = time.monotonic()
            print(f"{name}: started", flush=True)
            try:
                rc = phase()
                status = "ok" if rc == 0 else f"failed (exit status {rc})"
            except Exception as error:  # noqa: BLE001 (a failed phase is logged; the next one still runs)
                traceback.print_exc()
                status = f"failed: {error!r}"
            summary[name] = {"status": status, "seconds": round(time.monotonic() - started, 1)}
        print(f"{name}: {summary[name]}", flush=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        if name == "install" and summary[name]["status"] != "ok":
            print("torch sees no GPU: the GPU phases are not run (install.log says why)", flush=True)
            return 1
    return 0 if all(phase["status"] == "ok" for phase in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
