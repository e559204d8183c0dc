"""A long soak of one `zeroserve serve`: mixed load, clients that drop and come back, engine kills.

    .venv/bin/python -m benchmarks.soak --duration-s 1800 --out soak.json

Starts the server (the default model unless `--model`, `--stream-retention 60` unless
`--stream-retention-s`) and runs
`--concurrency` clients for `--duration-s` seconds. Each sends chat requests of natural text,
streamed or whole, greedy or seeded, 16 to 256 tokens; a streamed one drops its connection now and
then mid-stream and comes back half of those times (GET /v1/streams/{id} with Last-Event-ID), and
a whole one gives up now and then before its answer (its request is aborted). Every `--kill-every-s`
seconds an engine is SIGKILLed (the gateway restarts it and resumes its requests).

Every 10 s it samples the resident memory of the gateway and of each engine process. At the end,
with the load stopped, it reads /metrics and writes: the memory series (the first sample after
warm-up against the last, per process), the KV cache use and requests still running (both should
be 0), and the gateway's count of finished requests by finish reason against the clients' count of
accepted requests (accepted = completed + aborted, none failed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from service.bench.local_server import ServerProcess, local_server

QUESTIONS = [
    "What is a good way to start learning to play the guitar?",
    "Explain why the sky is blue in simple words.",
    "Write a short poem about a rainy afternoon in the city.",
    "How do I make a simple tomato sauce for pasta?",
    "What are the main differences between a cat and a dog as pets?",
    "Give me some tips for sleeping better at night.",
    "Summarise the plot of a classic adventure story in a few sentences.",
    "Why is regular exercise good for the heart?",
    "How does a train know when to stop at a station?",
    "What should I think about before adopting a puppy?",
]
_SAMPLE_EVERY_S = 10.0
_WARMUP_S = 120.0


class Tally:
    """What the clients saw."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def _client(base_url: str, deadline: float, rng: random.Random, tally: Tally) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(120.0)) as client:
        while time.monotonic() < deadline:
            body: dict[str, Any] = {
                "messages": [{"role": "user", "content": rng.choice(QUESTIONS)}],
                "max_tokens": rng.randint(16, 256),
            }
            if rng.random() < 0.5:
                body |= {"temperature": 0.8, "seed": rng.randint(0, 10**6)}
            else:
                body["temperature"] = 0.0
            try:
                if rng.random() < 0.7:
                    await _streamed(client, body, rng, tally)
                else:
                    await _whole(client, body, rng, tally)
            except httpx.HTTPError as error:
                tally.counts[f"client error {type(error).__name__}"] += 1
                await asyncio.sleep(0.5)


async def _streamed(client: httpx.AsyncClient, body: dict[str, Any], rng: random.Random, tally: Tally) -> None:
    drop_after = rng.randint(1, 40) if rng.random() < 0.2 else None
    stream_id, last_id, num_events = None, None, 0
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        if response.status_code != 200:
            tally.counts[f"refused {response.status_code}"] += 1
            return
        tally.counts["accepted"] += 1
        stream_id = response.headers.get("x-request-id")
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                last_id = line[4:]
            elif line.startswith("data: "):
                num_events += 1
                if '"error"' in line:
                    tally.counts["stream error event"] += 1
                if drop_after is not None and num_events >= drop_after:
                    break
        else:
            tally.counts["streamed to the end"] += 1
            return
    tally.counts["dropped mid-stream"] += 1
    if rng.random() < 0.5:
        return
    headers = {} if last_id is None else {"Last-Event-ID": last_id}
    async with client.stream("GET", f"/v1/streams/{stream_id}", headers=headers) as resumed:
        if resumed.status_code != 200:
            tally.counts[f"resume refused {resumed.status_code}"] += 1
            return
        async for _ in resumed.aiter_lines():
            pass
    tally.counts["resumed to the end"] += 1


async def _whole(client: httpx.AsyncClient, body: dict[str, Any], rng: random.Random, tally: Tally) -> None:
    give_up_s = rng.uniform(0.2, 2.0) if rng.random() < 0.2 else None
    try:
        async with asyncio.timeout(give_up_s):
            response = await client.post("/v1/chat/completions", json=body)
    except TimeoutError:
        tally.counts["gave up on a whole answer"] += 1
        return
    tally.counts["accepted" if response.status_code == 200 else f"refused {response.status_code}"] += 1


async def _killer(server: ServerProcess, deadline: float, every_s: float, rng: random.Random, tally: Tally) -> None:
    while True:
        next_kill = time.monotonic() + every_s * rng.uniform(0.7, 1.3)
        if next_kill >= deadline:
            return
        await asyncio.sleep(next_kill - time.monotonic())
        pids = server.engine_pids()
        if pids:
            os.kill(rng.choice(pids), signal.SIGKILL)
            tally.counts["engine kills"] += 1


async def _sampler(server: ServerProcess, deadline: float, samples: list[dict[str, Any]], start: float) -> None:
    while time.monotonic() < deadline:
        samples.append({
            "t_s": round(time.monotonic() - start, 1),
            "gateway_mib": _rss_mib(server.proc.pid),
            "engines_mib": {str(pid): _rss_mib(pid) for pid in server.engine_pids()},
        })
        await asyncio.sleep(_SAMPLE_EVERY_S)


def _metrics(text: str) -> dict[str, Any]:
    finished: Counter[str] = Counter()
    gauges: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "zeroserve:request_success_total":
                finished[sample.labels["finished_reason"]] += int(sample.value)
            elif sample.name in ("zeroserve:kv_cache_usage_perc", "zeroserve:num_requests_running",
                                 "zeroserve:num_requests_waiting"):
                gauges[sample.name] = gauges.get(sample.name, 0.0) + sample.value
    return {"finished_by_reason": dict(finished), **gauges}


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    serve_args = [args.model, "--stream-retention", str(args.stream_retention_s)]
    with local_server(serve_args, log_file=args.log) as server:
        start = time.monotonic()
        deadline = start + args.duration_s
        rng = random.Random(args.seed)
        tally = Tally()
        samples: list[dict[str, Any]] = []
        tasks = [asyncio.create_task(_client(server.base_url, deadline, random.Random(rng.random()), tally))
                 for _ in range(args.concurrency)]
        tasks.append(asyncio.create_task(_killer(server, deadline, args.kill_every_s, random.Random(rng.random()), tally)))
        tasks.append(asyncio.create_task(_sampler(server, deadline, samples, start)))
        await asyncio.gather(*tasks)
        # NOTE: kept streams nobody came back for end within their window; then all is quiet.
        await asyncio.sleep(args.stream_retention_s + 10)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            metrics = _metrics((await client.get("/metrics")).text)
            health = (await client.get("/health")).json()
        samples.append({"t_s": round(time.monotonic() - start, 1), "gateway_mib": _rss_mib(server.proc.pid),
                        "engines_mib": {str(pid): _rss_mib(pid) for pid in server.engine_pids()}})
    warm = [s for s in samples if s["t_s"] >= _WARMUP_S]
    finished = metrics["finished_by_reason"]
    return {
        "duration_s": args.duration_s, "concurrency": args.concurrency, "model": args.model,
        "client_counts": dict(tally.counts), "metrics_after": metrics, "health_after": health,
        # NOTE: a whole answer given up on was accepted too (the client could not see it).
        "accepted": tally.counts["accepted"] + tally.counts["gave up on a whole answer"],
        "completed": finished.get("stop", 0) + finished.get("length", 0),
        "aborted": finished.get("abort", 0), "failed": finished.get("error", 0),
        "gateway_mib_after_warmup": warm[0]["gateway_mib"] if warm else None,
        "gateway_mib_at_end": samples[-1]["gateway_mib"],
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--duration-s", type=float, default=1800.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--kill-every-s", type=float, default=180.0)
    parser.add_argument("--stream-retention-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", type=Path, default=Path("soak-server.log"))
    parser.add_argument("--out", type=Path, default=Path("soak.json"))
    args = parser.parse_args()
    result = asyncio.run(soak(args))
    args.out.write_text(json.dumps(result, indent=1))
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
