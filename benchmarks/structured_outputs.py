"""What structured outputs cost: 16 concurrent JSON-schema streams against 16 free ones, and a
schema's compile time.

    .venv/bin/python -m benchmarks.structured_outputs
    .venv/bin/python -m benchmarks.structured_outputs --rounds 3 --result-json so.json

(a) In process, the engine's grammar compiler for the default model (xgrammar over the GGUF's
vocabulary): an extraction schema compiled once and then again (a cache hit), and the first
compile of each of a few more schemas. (b) `zeroserve serve` with default flags, driven by
`zeroserve bench serve` with streamed chat requests of natural text (service/bench/chat_prompts.py),
`--num-prompts` at `--concurrency` at a time, greedy: once free (EOS ignored, `--max-tokens`
each), once each asking for the same text summarised under a JSON schema (response_format
json_schema: a constrained answer ends when its JSON closes, usually before `--max-tokens`).
Reports each run's output tokens per second and decode pace (1 / TPOT), and the constrained
runs' share of the free ones' (the goal: at least 0.7). (c) The free run again while other
clients keep the grammar compiler busy with large schemas never seen before (50 fields with
patterns, one request after another, 1 token each): the free streams' ITL p99 against the
plain free run's (the goal: within 1.5x). Rounds alternate the runs, each figure a median over
rounds; each ratio is taken within a round (its runs minutes apart) and reported as the median of
the rounds' ratios with their range. The result names the CPU and the engine's choices.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from engine_proc.structured_output import StructuredOutputManager
from proto.engine_input import StructuredOutput
from proto.gguf_header import read_gguf_metadata
from service.bench.chat_prompts import chat_prompts
from service.bench.local_server import local_server
from service.model_files.model_registry import DEFAULT_MODEL, resolve_model
from service.model_files.tokenizer import Tokenizer

SUMMARY_SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 80},
        "asker": {"type": "string", "maxLength": 40},
        "questions": {"type": "array", "items": {"type": "string", "maxLength": 100}, "maxItems": 3},
        "tone": {"enum": ["friendly", "neutral", "worried", "urgent"]},
        "needs_reply_within_days": {"type": "integer", "minimum": 0, "maximum": 30},
    },
    "required": ["topic", "asker", "questions", "tone", "needs_reply_within_days"],
    "additionalProperties": False,
}
# More shapes of schema, each compiled once (their first compile is what a new client pays).
OTHER_SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "quantity": {"type": "integer", "minimum": 1},
        "price": {"type": "number"}}, "required": ["sku", "quantity", "price"]}}, "currency": {"enum": ["EUR", "USD"]}},
     "required": ["items", "currency"]},
    {"type": "object", "properties": {"date": {"type": "string", "format": "date"}, "tags": {
        "type": "array", "items": {"type": "string"}, "uniqueItems": True}, "notes": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
     "required": ["date", "tags"]},
]


def large_schema(seed: int, num_fields: int = 50) -> dict[str, Any]:
    """A schema of `num_fields` fields (strings with patterns, bounded integers, enums), unique by `seed`."""
    properties: dict[str, Any] = {}
    for i in range(num_fields):
        if i % 3 == 0:
            properties[f"field_{seed}_{i}"] = {"type": "string", "pattern": f"^[a-z]{{{i % 5 + 1},{i % 7 + 8}}}$"}
        elif i % 3 == 1:
            properties[f"field_{seed}_{i}"] = {"type": "integer", "minimum": i}
        else:
            properties[f"field_{seed}_{i}"] = {"enum": [f"v{seed}_{i}_{k}" for k in range(5)]}
    return {"type": "object", "properties": properties, "required": list(properties)}


class SchemaCompiles:
    """Keeps the server's grammar compiler busy: one request after another, each under a new large schema."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.num_sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SchemaCompiles:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=120) as client:
            while not self._stop.is_set():
                body = {"messages": [{"role": "user", "content": "Fill in the form."}], "max_tokens": 1,
                        "response_format": {"type": "json_schema", "json_schema": {
                            "name": "form", "schema": large_schema(1000 + self.num_sent)}}}
                client.post("/v1/chat/completions", json=body).raise_for_status()
                self.num_sent += 1


def compile_times(model: str, backend: str) -> dict[str, Any]:
    """Milliseconds to compile the summary schema (first, then cached) and each other schema once."""
    path = resolve_model(model).path
    metadata = read_gguf_metadata(path)
    vocab_size = len(metadata["tokenizer.ggml.tokens"])
    eos = int(metadata.get("tokenizer.ggml.eos_token_id", 0))
    manager = StructuredOutputManager(str(path), vocab_size, (eos,), backend=backend)
    _compiled(manager, StructuredOutput("json_object"))  # NOTE: reads the vocabulary, not timed

    def timed(schema: dict[str, Any]) -> float | None:
        """Milliseconds to compile `schema`; None where the backend refuses it (llguidance: `uniqueItems`)."""
        started = time.perf_counter()
        try:
            _compiled(manager, StructuredOutput("json", json.dumps(schema)))
        except ValueError as exc:
            print(f"not compiled: {exc}")
            return None
        return 1000 * (time.perf_counter() - started)

    first, second = timed(SUMMARY_SCHEMA), timed(SUMMARY_SCHEMA)
    others = [timed(schema) for schema in OTHER_SCHEMAS]
    large = timed(large_schema(0))
    manager.shutdown()
    return {"summary_schema_first_ms": first, "summary_schema_cached_ms": second, "other_schemas_first_ms": others,
            "large_schema_first_ms": large}


def _compiled(manager: StructuredOutputManager, spec: StructuredOutput) -> None:
    """Waits for `spec`'s grammar (its matcher is made from the compiled grammar)."""
    assert manager.grammar_for(spec).matcher is not None


def request_bodies(args: argparse.Namespace, is_constrained: bool, seed: int) -> list[dict[str, Any]]:
    tokenizer = Tokenizer.from_model(resolve_model(args.model).path)
    bodies = []
    for text in chat_prompts(tokenizer, args.num_prompts, args.input_len, seed):
        body: dict[str, Any] = {"messages": [{"role": "user", "content": text}], "max_tokens": args.max_tokens}
        if is_constrained:
            body["messages"].append({"role": "user", "content": "Summarise my message as JSON."})
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "summary", "schema": SUMMARY_SCHEMA}}
        else:
            body["ignore_eos"] = True
        bodies.append(body)
    return bodies


def run_load(args: argparse.Namespace, base_url: str, tmp: Path, bodies: list[dict[str, Any]], name: str) -> dict[str, Any]:
    dataset, result = tmp / f"{name}.jsonl", tmp / f"{name}.json"
    dataset.write_text("".join(json.dumps(body) + "\n" for body in bodies))
    subprocess.run([
        sys.executable, "-m", "service", "bench", "serve", "--base-url", base_url, "--endpoint", "chat",
        "--dataset-path", str(dataset), "--num-prompts", str(len(bodies)), "--max-concurrency", str(args.concurrency),
        "--result-json", str(result), "--disable-tqdm",
    ], check=True, stdout=subprocess.DEVNULL)
    figures: dict[str, Any] = json.loads(result.read_text())
    if figures["completed"] != len(bodies):
        raise RuntimeError(f"{name}: {figures['completed']} of {len(bodies)} requests completed: {figures.get('errors')}")
    return figures


def round_ratios(ratios: list[float]) -> dict[str, Any]:
    """One ratio of each round, and their median and range (a ratio of medians would pair figures
    from different rounds)."""
    return {"rounds": ratios, "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def said(ratios: dict[str, Any]) -> str:
    """`0.86 (rounds 0.78-1.00)`, or the one round's ratio."""
    if len(ratios["rounds"]) == 1:
        return f"{ratios['median']:.2f}"
    return f"{ratios['median']:.2f} (rounds {ratios['min']:.2f}-{ratios['max']:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=230)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--backend", default="auto", choices=["auto", "xgrammar", "guidance"],
                        help="the server's structured-output backend (default: %(default)s, xgrammar)")
    parser.add_argument("--result-json", type=Path, default=Path("structured_outputs.json"))
    args = parser.parse_args()

    compiled = compile_times(args.model, args.backend)
    print(f"compile: summary schema {compiled['summary_schema_first_ms']:.1f} ms first, "
          f"{compiled['summary_schema_cached_ms']:.2f} ms cached; others first: "
          + ", ".join("refused" if ms is None else f"{ms:.1f} ms" for ms in compiled["other_schemas_first_ms"])
          + f"; a 50-field schema with patterns {compiled['large_schema_first_ms']:.0f} ms")
    rounds: list[dict[str, dict[str, Any]]] = []
    serve_args = [args.model, "--structured-outputs-config", json.dumps({"backend": args.backend})]
    with tempfile.TemporaryDirectory() as tmp_name, local_server(serve_args) as server:
        version = httpx.get(f"{server.base_url}/version", timeout=10).json()
        print(f"CPU: {version['cpu']}; engine: {version['kernels']}")
        for round_index in range(args.rounds):
            # NOTE: new prompts each round and run: nothing is served from the prefix cache.
            free = run_load(args, server.base_url, Path(tmp_name), request_bodies(args, False, 2 * round_index), "free")
            constrained = run_load(
                args, server.base_url, Path(tmp_name), request_bodies(args, True, 2 * round_index + 1), "json_schema"
            )
            with SchemaCompiles(server.base_url) as compiles:
                compiling = run_load(
                    args, server.base_url, Path(tmp_name), request_bodies(args, False, 2 * round_index + 100), "compiling"
                )
            compiling["num_schemas_compiled"] = compiles.num_sent
            rounds.append({"free": free, "json_schema": constrained, "free_while_compiling": compiling})
            print(f"round {round_index + 1}: free {free['output_throughput']:.1f} tok/s, "
                  f"json_schema {constrained['output_throughput']:.1f} tok/s; free ITL p99 {free['p99_itl_ms']:.0f} ms, "
                  f"{compiling['p99_itl_ms']:.0f} ms while {compiles.num_sent} large schemas compiled")
    summary = {
        name: {key: statistics.median(r[name][key] for r in rounds)
               for key in ("output_throughput", "median_tpot_ms", "median_ttft_ms", "total_output_tokens", "p99_itl_ms")}
        for name in ("free", "json_schema", "free_while_compiling")
    }
    throughput_share = round_ratios([r["json_schema"]["output_throughput"] / r["free"]["output_throughput"] for r in rounds])
    pace_share = round_ratios([r["free"]["median_tpot_ms"] / r["json_schema"]["median_tpot_ms"] for r in rounds])
    itl_ratio = round_ratios([r["free_while_compiling"]["p99_itl_ms"] / r["free"]["p99_itl_ms"] for r in rounds])
    print(f"{args.concurrency} streams: free {summary['free']['output_throughput']:.1f} tok/s "
          f"(TPOT {summary['free']['median_tpot_ms']:.1f} ms), json_schema "
          f"{summary['json_schema']['output_throughput']:.1f} tok/s (TPOT {summary['json_schema']['median_tpot_ms']:.1f} ms)")
    print(f"json_schema / free, per round: output tok/s {said(throughput_share)}, decode pace {said(pace_share)} "
          "(goal >= 0.7)")
    print(f"free streams' ITL p99 while large schemas compile / without, per round: {said(itl_ratio)} (goal <= 1.5)")
    args.result_json.write_text(json.dumps({
        "machine": {"cpu": version["cpu"], "kernels": version["kernels"]}, "backend": args.backend, "compile": compiled, "rounds": rounds,
        "summary": summary, "throughput_share": throughput_share, "pace_share": pace_share, "itl_p99_ratio": itl_ratio,
    }, indent=2))


if __name__ == "__main__":
    main()
