"""Switching between models: zeroserve's multi-model server against llama.cpp's router mode, on the same GGUFs.

    .venv/bin/python -m benchmarks.many_models
    .venv/bin/python -m benchmarks.many_models --num-requests 12 --num-warm 6 --result-json many_models.json

Three models in a temporary folder: A the default model's file (SmolLM2-135M-Instruct, Q4_1), B gemma-3-270m
(Q4_K_M) and C the default model's file again, copied under another name (`--third-model FILE` for another).
Each server runs with its default flags but for room for two models (`zeroserve serve --models-dir DIR
--max-loaded-models 2`, `llama-server --models-dir DIR --models-max 2`), one server after the other.
Switching phase: requests naming A, B, C, A, B, C ... in turn, so each after the first two unloads one model and
loads another; warm phase: requests alternating between the two models left loaded. Each request is a
non-streamed /v1/completions of 32 tokens (greedy, EOS ignored) with its own natural-text prompt (the chat
prompt set, sent as plain text: gemma-3-270m is a base model with no chat template). Each request is labelled
by the models' statuses just before it: `warm` (its model loaded), `load` (room left) or `switch` (room made
by unloading another). Reports per server: median and max latency of a switch, median latency of a warm-phase
request, the switching phase's total time, and the peak resident memory of the server and all its children
(sampled every 100 ms).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import psutil

from benchmarks.llama_server_compare import LLAMA_SERVER, rss_mib, running_llama_server
from engine_proc.cpu.features import cpu_model_name
from service.bench.chat_prompts import chat_prompts
from service.bench.local_server import local_server
from service.model_files.model_registry import DEFAULT_MODEL, resolve_model
from service.model_files.tokenizer import Tokenizer

MAX_LOADED_MODELS = 2
SAMPLE_INTERVAL_S = 0.1


class TimedRequest(NamedTuple):
    """One completion: the model it named, what it found (warm, load or switch) and how long it took."""

    phase: str
    model: str
    kind: str
    latency_s: float


class PeakRss(threading.Thread):
    """Samples the resident memory of a server and all its children every 100 ms and keeps the peak."""

    def __init__(self, pid: int) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.pid = pid
        self.peak_mib = 0.0
        self._is_done = threading.Event()

    def run(self) -> None:
        while True:
            with suppress(psutil.NoSuchProcess):  # NOTE: the server itself gone: its run fails and says why.
                self.peak_mib = max(self.peak_mib, rss_mib(self.pid))
            if self._is_done.wait(SAMPLE_INTERVAL_S):
                return

    def finish(self) -> float:
        self._is_done.set()
        self.join()
        return self.peak_mib


def models_folder(folder: Path, third_model: Path | None) -> list[str]:
    """Fills `folder` with the three models and gives their names (A, B, C), as both servers list them."""
    default = resolve_model(DEFAULT_MODEL).path
    (folder / "smollm2-135m-instruct.gguf").symlink_to(default)
    (folder / "gemma-3-270m.gguf").symlink_to(resolve_model("gemma-3-270m").path)
    if third_model is None:
        # NOTE: a copy, not a link: its pages are its own, as a third model's would be.
        shutil.copyfile(default, folder / "smollm2-135m-instruct-copy.gguf")
        return ["smollm2-135m-instruct", "gemma-3-270m", "smollm2-135m-instruct-copy"]
    (folder / f"{third_model.stem}.gguf").symlink_to(third_model.resolve())
    return ["smollm2-135m-instruct", "gemma-3-270m", third_model.stem]


def loaded_models(client: httpx.Client, base_url: str) -> set[str]:
    """The models /v1/models calls loaded (both servers give llama.cpp's router's `status.value`)."""
    listing = client.get(f"{base_url}/v1/models").raise_for_status().json()
    return {model["id"] for model in listing["data"] if model.get("status", {}).get("value") == "loaded"}


def timed_request(client: httpx.Client, base_url: str, phase: str, model: str, prompt: str, max_tokens: int) -> TimedRequest:
    """Sends one greedy completion naming `model` and times it, after noting whether its model was loaded."""
    loaded = loaded_models(client, base_url)
    kind = "warm" if model in loaded else "load" if len(loaded) < MAX_LOADED_MODELS else "switch"
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": False}
    start = time.perf_counter()
    response = client.post(f"{base_url}/v1/completions", json=body)
    latency_s = time.perf_counter() - start
    if response.status_code != 200:
        raise RuntimeError(f"{base_url}: {model}: HTTP {response.status_code}: {response.text[:500]}")
    num_tokens = response.json()["usage"]["completion_tokens"]
    if num_tokens != max_tokens:
        raise RuntimeError(f"{base_url}: {model}: {num_tokens} tokens, not {max_tokens}")
    return TimedRequest(phase, model, kind, latency_s)


def run_workload(base_url: str, pid: int, names: Sequence[str], prompts: Sequence[str], args: argparse.Namespace
                 ) -> dict[str, Any]:
    """The switching phase then the warm phase against one server, with its peak memory over both."""
    sampler = PeakRss(pid)
    sampler.start()
    requests = []
    # NOTE: a connection per request: on one kept-alive connection, llama-server's router (0c1e570) closes it
    # unanswered on a GET /v1/models soon after a switch now and then (3 runs of 3, never with `Connection: close`).
    with httpx.Client(timeout=args.request_timeout_s, headers={"Connection": "close"}) as client:
        start = time.perf_counter()
        for index in range(args.num_requests):
            model = names[index % len(names)]
            requests.append(timed_request(client, base_url, "switching", model, prompts[index], args.max_tokens))
            print(f"  {requests[-1].kind:<6} {model:<28} {requests[-1].latency_s:6.2f} s", flush=True)
        switching_s = time.perf_counter() - start
        # NOTE: the two models the switching phase left loaded, so no warm request loads one.
        pair = [requests[-2].model, requests[-1].model]
        for index in range(args.num_warm):
            prompt = prompts[args.num_requests + index]
            requests.append(timed_request(client, base_url, "warm", pair[index % 2], prompt, args.max_tokens))
    peak_mib = sampler.finish()
    return {"summary": summary(requests, switching_s, peak_mib), "requests": [r._asdict() for r in requests]}


def summary(requests: Sequence[TimedRequest], switching_s: float, peak_mib: float) -> dict[str, float]:
    """The figures the table shows."""
    switches = [r.latency_s for r in requests if r.phase == "switching" and r.kind == "switch"]
    warm = [r.latency_s for r in requests if r.phase == "warm"]
    nan = float("nan")
    return {
        "num_switches": len(switches),
        "num_warm_that_loaded": sum(r.kind != "warm" for r in requests if r.phase == "warm"),
        "switch_p50_s": statistics.median(switches) if switches else nan, "switch_max_s": max(switches, default=nan),
        "warm_p50_s": statistics.median(warm) if warm else nan, "switching_phase_s": switching_s, "peak_rss_mib": peak_mib,
    }


@contextmanager
def zeroserve(folder: Path, log: Path) -> Iterator[tuple[str, int]]:
    """(base URL, pid) of `zeroserve serve` over the folder with room for two models."""
    with local_server(["--models-dir", str(folder), "--max-loaded-models", str(MAX_LOADED_MODELS)], log_file=log) as server:
        yield server.base_url, server.proc.pid


def llama_router(binary: Path, folder: Path, log: Path) -> AbstractContextManager[tuple[str, int]]:
    """(base URL, pid) of `llama-server` in router mode over the folder with room for two models."""
    return running_llama_server(binary, ["--models-dir", str(folder), "--models-max", str(MAX_LOADED_MODELS)], log)


def git_commit() -> str:
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    return run.stdout.strip() or "unknown"


def llama_server_version(binary: Path) -> str:
    run = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    return next((line for line in (run.stdout + run.stderr).splitlines() if line.startswith("version")), "unknown")


def print_table(results: dict[str, dict[str, Any]]) -> None:
    print(f"\n{'server':<14} {'switches':>8} {'switch p50':>11} {'switch max':>11} {'warm p50':>9} "
          f"{'switching phase':>16} {'peak RSS':>9}")
    for name, result in results.items():
        s = result["summary"]
        print(f"{name:<14} {s['num_switches']:>8} {s['switch_p50_s']:>10.2f}s {s['switch_max_s']:>10.2f}s "
              f"{s['warm_p50_s']:>8.2f}s {s['switching_phase_s']:>15.1f}s {s['peak_rss_mib']:>5.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--third-model", type=Path, default=None,
                        help="a GGUF file as model C (default: the default model's file under another name)")
    parser.add_argument("--num-requests", type=int, default=12, help="requests of the switching phase")
    parser.add_argument("--num-warm", type=int, default=6, help="requests of the warm phase")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128, help="prompt length in tokens, about")
    parser.add_argument("--request-timeout-s", type=float, default=600.0)
    parser.add_argument("--servers", nargs="+", default=["zeroserve", "llama-server"], choices=["zeroserve", "llama-server"])
    parser.add_argument("--result-json", type=Path, default=None)
    args = parser.parse_args()
    if args.num_requests < MAX_LOADED_MODELS:
        parser.error(f"--num-requests must be at least {MAX_LOADED_MODELS}")
    if "llama-server" in args.servers and not args.llama_server.exists():
        parser.error(f"no llama-server at {args.llama_server}: build it with ../shared/tools/build-llama-cpp")
    tokenizer = Tokenizer.from_model(resolve_model(DEFAULT_MODEL).path)
    prompts = chat_prompts(tokenizer, args.num_requests + args.num_warm, args.input_len)
    header = {
        "cpu": cpu_model_name(), "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "zeroserve_commit": git_commit(), "llama_server": llama_server_version(args.llama_server),
    }
    print("; ".join(f"{key}: {value}" for key, value in header.items()), flush=True)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        folder = tmp / "models"
        folder.mkdir()
        names = models_folder(folder, args.third_model)
        for name in args.servers:
            print(f"{name}: {', '.join(names)} in turn, then {names[-2]} and {names[-1]} warm", flush=True)
            log = tmp / f"{name}.log"
            server = zeroserve(folder, log) if name == "zeroserve" else llama_router(args.llama_server, folder, log)
            try:
                with server as (base_url, pid):
                    results[name] = run_workload(base_url, pid, names, prompts, args)
            except Exception:
                print(f"{name} failed; the end of its log:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
                raise
    print_table(results)
    if args.result_json is not None:
        settings = {key: str(value) for key, value in vars(args).items()}
        args.result_json.write_text(json.dumps({**header, "models": names, "settings": settings, "servers": results}, indent=2))


if __name__ == "__main__":
    main()
