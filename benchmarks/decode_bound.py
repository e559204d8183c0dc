"""One stream's decode step against the memory-bandwidth bound of the same machine, in one run.

    .venv/bin/python -m benchmarks.decode_bound
    .venv/bin/python -m benchmarks.decode_bound --model FILE.gguf --rounds 5

A decode step of one stream reads every weight once (the projections, the experts it routes to, the
output head), so it cannot take less than those bytes over the machine's memory bandwidth. Loads
`EngineCore` in process (default flags, `--threads` threads), decodes one greedy request, and, in
turns so that a slow spell of a shared machine weighs on both, times `--steps` steps (median) and
the bandwidth: torch's sum over a 1 GiB tensor, the threads reading it as a step reads its weights.
The weights' bytes are what the engine reports holding (`weight_bytes`: the kernels' packings and
any other form kept; a token embedding read from the file a row at a time is not among them). A
mixture of experts reads only its routed experts: its bound here is a lower one than the step's.
Prints each round and the medians: step ms, GB/s, bound ms, and step over bound. Runs in the environment
`zeroserve serve` gives its engine (malloc on huge pages: see service/client/engine_launcher.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from engine_proc.core import EngineCore
from engine_proc.cpu.features import cpu_model_name
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from service.client.engine_launcher import engine_environ
from service.model_files.model_registry import DEFAULT_MODEL, resolve_model

_BANDWIDTH_BYTES = 2**30


def bandwidth_gb_s(data: torch.Tensor, repeats: int = 5) -> float:
    """The median rate at which torch sums `data` (GB/s)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - started)
    return data.nbytes / statistics.median(times) / 1e9


def step_ms(core: EngineCore, num_steps: int) -> float:
    times = []
    for _ in range(num_steps):
        started = time.perf_counter()
        core.step()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a GGUF file or folder (default: the default model's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    environ = engine_environ(os.environ)
    if environ != dict(os.environ):
        # NOTE: started again in the environment an engine process gets (its malloc's huge pages), set before start.
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.decode_bound", *sys.argv[1:]], environ)
    model = args.model or str(resolve_model(DEFAULT_MODEL).path)
    torch.set_num_threads(args.threads)
    core = EngineCore(EngineConfig(model_path=model, num_threads=args.threads, kv_cache_memory_gib=0.5, max_model_len=4096))
    weight_bytes = core.ready_message().weight_bytes
    num_tokens = args.rounds * (args.steps + 2) + 64
    core.add_request(EngineCoreRequest(
        "decode", list(range(100, 330)), SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    ))
    for _ in range(5):  # NOTE: the prompt's prefill, then a few decodes to settle
        core.step()
    data = torch.ones(_BANDWIDTH_BYTES // 4)
    rounds = []
    for index in range(args.rounds):
        step = step_ms(core, args.steps)
        rate = bandwidth_gb_s(data)
        bound = weight_bytes / rate / 1e6
        rounds.append((step, rate, bound, step / bound))
        print(f"round {index + 1}: step {step:.2f} ms, {rate:.1f} GB/s, bound {bound:.2f} ms, {step / bound:.2f}x", flush=True)
    step, rate, bound, ratio = (statistics.median(values) for values in zip(*rounds, strict=True))
    print(
        f"\n{cpu_model_name()}, {args.threads} threads; {model}: weights {weight_bytes / 2**20:.0f} MiB\n"
        f"medians: step {step:.2f} ms ({1000 / step:.1f} tok/s), bandwidth {rate:.1f} GB/s, bound {bound:.2f} ms; "
        f"step / bound {ratio:.2f}x"
    )


if __name__ == "__main__":
    main()
