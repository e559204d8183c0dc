"""How much of an engine step is bookkeeping rather than the model, at a given decode batch.

    .venv/bin/python -m benchmarks.step_overhead --batch 32
    .venv/bin/python -m benchmarks.step_overhead --batch 1 --dtype float32 --quantization none

Runs EngineCore in process on the default model with `--batch` greedy requests, lets them
reach steady decoding, then times each phase of the following steps: scheduling
(`Scheduler.schedule`), building the index tensors (`ModelRunner._prepare_inputs`), the
forward and sampling (the rest of `execute_model`), and turning sampled ids into outputs
(`Scheduler.update_from_output`). Prints the median milliseconds per phase and the
bookkeeping share (schedule + prepare + update) of the whole step. Then profiles a few more
steps and splits their time by kind of torch op (linears, attention, sampling, other ops);
what the ops leave of the step's wall time is host work (Python, dispatch).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import profile

from engine_proc.core import EngineCore
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from service.model_files.model_registry import DEFAULT_MODEL, resolve_model

# Kinds of torch ops, by the name of the (innermost) aten op that spends the time.
OP_KINDS = {
    "linears": (
        "aten::mm", "aten::addmm", "aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int8pack_mm",
        "mkldnn::_linear_pointwise",
    ),
    "attention": (
        "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::bmm", "aten::index_select",
        "aten::index_copy_", "aten::_softmax",
    ),
    "sampling": ("aten::argmax", "aten::max", "aten::topk", "aten::sort", "aten::exponential_", "aten::log_softmax"),
}


def op_time_by_kind(core: EngineCore, num_steps: int) -> tuple[dict[str, float], float]:
    """Milliseconds per step of each kind of op (self time), and the steps' median wall time."""
    walls = []
    with profile() as prof:
        for _ in range(num_steps):
            started = time.perf_counter()
            core.step()
            walls.append(time.perf_counter() - started)
    by_kind: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        kind = next((kind for kind, names in OP_KINDS.items() if event.key in names), "other ops")
        by_kind[kind] += event.self_cpu_time_total / 1000 / num_steps
    return dict(by_kind), 1000 * statistics.median(walls)


def timed(timings: dict[str, list[float]], name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            timings[name].append(time.perf_counter() - started)

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=230)
    parser.add_argument("--num-steps", type=int, default=30)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto", choices=["auto", "gguf", "none"])
    parser.add_argument("--num-threads", type=int, default=2)
    args = parser.parse_args()
    config = EngineConfig(
        model_path=str(resolve_model(args.model).path), dtype=args.dtype, num_threads=args.num_threads,
        quantization=args.quantization,
        kv_cache_memory_gib=2.0, max_model_len=2048, max_num_seqs=max(64, args.batch),
    )
    core = EngineCore(config)
    for i in range(args.batch):
        prompt = [(17 * i + j) % 5000 + 100 for j in range(args.prompt_tokens)]
        params = SamplingParams(temperature=0.0, max_tokens=args.num_steps + 50, ignore_eos=True)
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    while any(r.num_output_tokens == 0 for r in core.scheduler.running) or core.scheduler.waiting:
        core.step()  # prefill
    for _ in range(3):
        core.step()  # warm decode

    timings: dict[str, list[float]] = defaultdict(list)
    scheduler, runner = core.scheduler, core.model_runner
    scheduler.schedule = timed(timings, "schedule", scheduler.schedule)  # type: ignore[method-assign]
    scheduler.update_from_output = timed(timings, "update", scheduler.update_from_output)  # type: ignore[method-assign]
    runner._prepare_inputs = timed(timings, "prepare_inputs", runner._prepare_inputs)  # type: ignore[method-assign]
    runner.execute_model = timed(timings, "execute_model", runner.execute_model)  # type: ignore[method-assign]
    core.step = timed(timings, "step", core.step)  # type: ignore[method-assign]
    for _ in range(args.num_steps):
        core.step()

    median_ms = {name: 1000 * statistics.median(values) for name, values in timings.items()}
    forward_ms = median_ms["execute_model"] - median_ms["prepare_inputs"]
    bookkeeping_ms = median_ms["schedule"] + median_ms["prepare_inputs"] + median_ms["update"]
    print(f"decode batch {args.batch}, {args.dtype}, {args.num_threads} threads, median of {args.num_steps} steps")
    ready = core.ready_message()
    print(f"  on {ready.cpu}: " + "; ".join(f"{piece}: {choice}" for piece, choice in ready.kernel_choices.items()))
    print(f"  schedule            {median_ms['schedule']:8.2f} ms")
    print(f"  prepare inputs      {median_ms['prepare_inputs']:8.2f} ms")
    print(f"  forward + sample    {forward_ms:8.2f} ms")
    print(f"  update from output  {median_ms['update']:8.2f} ms")
    print(f"  whole step          {median_ms['step']:8.2f} ms")
    print(f"bookkeeping share: {100 * bookkeeping_ms / median_ms['step']:.1f}% "
          f"({bookkeeping_ms:.2f} ms of {median_ms['step']:.2f} ms)")
    by_kind, wall_ms = op_time_by_kind(core, min(args.num_steps, 10))
    print(f"profiled steps ({torch.get_num_threads()} threads, the profiler adds some overhead): {wall_ms:.2f} ms")
    for kind in ("linears", "attention", "sampling", "other ops"):
        print(f"  {kind:<18}{by_kind.get(kind, 0.0):8.2f} ms")
    print(f"  {'host work':<18}{wall_ms - sum(by_kind.values()):8.2f} ms")


if __name__ == "__main__":
    main()
