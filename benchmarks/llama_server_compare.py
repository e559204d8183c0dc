"""zeroserve against llama.cpp's `llama-server` on the same GGUF, on the same machine, in one run.

    .venv/bin/python -m benchmarks.llama_server_compare
    .venv/bin/python -m benchmarks.llama_server_compare --model FILE.gguf --rounds 1 --result-json out.json

Starts `llama-server` (../shared/tools/build-llama-cpp builds it; `--llama-server PATH`) with 16
slots and 8k of context, `zeroserve serve` with its default flags and, beside it, each of
`--zeroserve-args` (by default `--no-batch-invariant`, so one run shows what batch invariance
costs), all with `--threads` threads. Each is driven by `zeroserve bench serve` with streamed chat
requests (natural chat text, about 230 tokens once templated, each distinct; 128 tokens out,
greedy, EOS ignored) at 1 and 16 concurrent streams; the rounds take the servers in turn, so a slow
spell of a shared machine weighs on all. Reports, as medians over rounds: output tokens/s, one
stream's decode speed (1000 / TPOT p50), TTFT p50, each server's time to ready (start to a healthy
/health, the servers started one after another) and resident memory (its processes together, after
its last turn), and each zeroserve configuration against llama-server. `--concurrency 1` leaves out the 16
streams (an 8B model on 2 cores takes most of an hour for them). `--one-at-a-time` starts each server
for its turn alone and stops it after (a file whose two servers' memory would not fit the machine at
once, as a 30B model's 18 GB beside llama-server's mapped copy); its time to ready is then a median
over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import psutil

from engine_proc.cpu.features import cpu_model_name
from service.bench.local_server import free_port, local_server
from service.model_files.model_registry import DEFAULT_MODEL, resolve_model

LLAMA_SERVER = Path.home() / ".cache/zeroserve-peer/llama.cpp-native/bin/llama-server"


def llama_server(binary: Path, model: Path, threads: int, log: Path) -> AbstractContextManager[tuple[str, int]]:
    """(base URL, pid) of a running llama-server with 16 slots, ready to serve."""
    return running_llama_server(binary, [
        "-m", str(model), "--threads", str(threads), "--threads-batch", str(threads), "--parallel", "16", "--ctx-size", "8192",
    ], log)


@contextmanager
def running_llama_server(binary: Path, server_args: Sequence[str], log: Path) -> Iterator[tuple[str, int]]:
    """(base URL, pid) of `llama-server SERVER_ARGS` on a free loopback port, once /health answers 200."""
    port = free_port()
    command = [str(binary), *server_args, "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{base_url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not start: see {log}")
            time.sleep(0.5)
        yield base_url, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def rss_mib(pid: int) -> float:
    """The resident memory of a process and its children together (a child that exits meanwhile counts nothing)."""
    process = psutil.Process(pid)
    num_bytes = 0
    for member in [process, *process.children(recursive=True)]:
        with suppress(psutil.NoSuchProcess):
            num_bytes += member.memory_info().rss
    return num_bytes / 2**20


def bench(base_url: str, concurrency: int, seed: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    result_path = tmp / f"bench-{seed}.json"
    # NOTE: prompts never sent before (a seed per round, server and concurrency): no prefix-cache hits.
    subprocess.run([
        sys.executable, "-m", "service", "bench", "serve", "--base-url", base_url,
        "--num-prompts", str(4 if concurrency == 1 else 2 * concurrency), "--max-concurrency", str(concurrency),
        "--dataset", "chat", "--endpoint", "chat", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--ignore-eos", "--num-warmups", "2", "--seed", str(seed),
        "--tokenizer", str(args.model), "--result-json", str(result_path), "--disable-tqdm",
    ], check=True, stdout=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads(result_path.read_text())
    if result["completed"] != result["num_prompts"]:
        raise RuntimeError(f"{base_url}: {result['num_prompts'] - result['completed']} requests failed: {result.get('errors')}")
    return result


def figures(result: dict[str, Any]) -> dict[str, float]:
    return {"output_tok_s": result["output_throughput"], "decode_tok_s": 1000 / result["median_tpot_ms"],
            "ttft_p50_s": result["median_ttft_ms"] / 1000}


class Contenders:
    """The run's servers by name (llama-server, then each zeroserve configuration): how each starts, the
    time each took to ready, zeroserve's /version, and each one's resident memory."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.configs = {"zeroserve default flags": [], **(
            {f"zeroserve {' '.join(args.zeroserve_args)}": args.zeroserve_args} if args.zeroserve_args else {}
        )}
        self.names = ["llama-server", *self.configs]
        self.ready_s: dict[str, list[float]] = {}
        self.version: dict[str, Any] = {}
        self.memory: dict[str, float] = {}

    def start(self, name: str, stack: ExitStack) -> tuple[str, int]:
        """(base URL, pid) of server `name`, started inside `stack` and timed to ready."""
        args, started = self.args, time.monotonic()
        log = self.tmp / ("llama.log" if name == "llama-server" else f"{name.replace(' ', '_')}.log")
        try:
            if name == "llama-server":
                url, pid = stack.enter_context(llama_server(args.llama_server, args.model, args.threads, log))
            else:
                serve = [str(args.model), "--num-threads", str(args.threads), *self.configs[name]]
                server = stack.enter_context(local_server(serve, log_file=log))
                url, pid = server.base_url, server.proc.pid
        except RuntimeError:
            # NOTE: the log lives in a temporary folder that goes with the run: its end is printed first.
            print(f"{name} did not start; the end of its log:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]), file=sys.stderr)
            raise
        self.ready_s.setdefault(name, []).append(time.monotonic() - started)
        if not self.version and name == "zeroserve default flags":
            self.version.update(httpx.get(f"{url}/version", timeout=10).json())
            print(f"{cpu_model_name()}; zeroserve: {self.version.get('kernels')}", flush=True)
        return url, pid


def run_rounds(args: argparse.Namespace, contenders: Contenders) -> list[dict[str, dict[str, dict[str, float]]]]:
    """Each round's figures by server and concurrency; the servers all up at once, or with
    `--one-at-a-time` each alone on the machine for its turn and stopped after it."""
    rounds: list[dict[str, dict[str, dict[str, float]]]] = []
    with ExitStack() as stack:
        servers = {} if args.one_at_a_time else {name: contenders.start(name, stack) for name in contenders.names}
        for index in range(args.rounds):
            rounds.append({})
            for position, name in enumerate(contenders.names):
                with ExitStack() as turn:
                    base_url, pid = contenders.start(name, turn) if args.one_at_a_time else servers[name]
                    rounds[-1][name] = {
                        str(c): figures(bench(base_url, c, 1000 * index + 10 * position + c, args, contenders.tmp))
                        for c in args.concurrency
                    }
                    contenders.memory[name] = rss_mib(pid)
            print(f"round {index + 1}: " + "; ".join(
                f"{name} " + " / ".join(f"{r[str(c)]['output_tok_s' if c > 1 else 'decode_tok_s']:.1f}" for c in args.concurrency)
                + " tok/s" for name, r in rounds[-1].items()
            ), flush=True)
    return rounds


def report(args: argparse.Namespace, rounds: list[dict[str, dict[str, dict[str, float]]]], contenders: Contenders) -> None:
    """Prints the medians over rounds and each zeroserve configuration against llama-server, and writes them."""
    medians = {
        name: {c: {key: statistics.median(r[name][c][key] for r in rounds) for key in rounds[0][name][c]} for c in rounds[0][name]}
        for name in rounds[0]
    }
    ready_s = {name: statistics.median(times) for name, times in contenders.ready_s.items()}
    peer = medians["llama-server"]
    missing = {"decode_tok_s": float("nan"), "output_tok_s": float("nan"), "ttft_p50_s": float("nan")}
    print(f"\n{'server':<36} {'1 stream tok/s':>14} {'16 streams tok/s':>16} {'TTFT p50 @16':>12} {'ready s':>8} {'RSS MiB':>8}")
    for name, by_concurrency in medians.items():
        one, sixteen = by_concurrency.get("1", missing), by_concurrency.get("16", missing)
        print(f"{name:<36} {one['decode_tok_s']:>14.1f} {sixteen['output_tok_s']:>16.1f} "
              f"{sixteen['ttft_p50_s']:>11.2f}s {ready_s[name]:>8.1f} {contenders.memory[name]:>8.0f}")
    for name, by_concurrency in medians.items():
        if name != "llama-server":
            ratios = [f"{'one stream' if c == '1' else '16 streams'} "
                      f"{by_concurrency[c]['decode_tok_s' if c == '1' else 'output_tok_s'] / peer[c]['decode_tok_s' if c == '1' else 'output_tok_s']:.2f}x"
                      for c in by_concurrency]
            if "16" in by_concurrency:
                ratios.append(f"TTFT p50 at 16 {by_concurrency['16']['ttft_p50_s'] / peer['16']['ttft_p50_s']:.2f}x")
            print(f"{name} / llama-server: " + ", ".join(ratios))
    args.result_json.write_text(json.dumps({
        "cpu": cpu_model_name(), "zeroserve_version": contenders.version, "medians": medians, "rss_mib": contenders.memory,
        "ready_s": ready_s, "rounds": rounds, "settings": {key: str(value) for key, value in vars(args).items()},
    }, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default: the default model's)")
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--zeroserve-args", nargs="*", default=["--no-batch-invariant"],
                        help="one more zeroserve configuration (beside default flags); none: only the default")
    parser.add_argument("--input-len", type=int, default=230)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16], choices=[1, 16])
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="each server started for its turn and stopped after it (a file too big for two servers' memory)")
    parser.add_argument("--result-json", type=Path, default=Path("llama_server_compare.json"))
    args = parser.parse_args()
    args.model = args.model or resolve_model(DEFAULT_MODEL).path
    if not args.llama_server.exists():
        parser.error(f"no llama-server at {args.llama_server}: build it with ../shared/tools/build-llama-cpp")
    with tempfile.TemporaryDirectory() as tmp_name:
        contenders = Contenders(args, Path(tmp_name))
        rounds = run_rounds(args, contenders)
    report(args, rounds, contenders)


if __name__ == "__main__":
    main()
