"""Sends N concurrent completions to a server and prints their results and the served-by-engine
counts as JSON (run inside a network namespace by the scale-out tests)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families


def prompts(num: int, tag: str) -> list[str]:
    return [f"{tag} request {i}: the quick brown fox" for i in range(num)]


async def complete(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    response = await client.post("/v1/completions", json=body)
    if response.status_code != 200:
        return {"prompt": prompt, "status": response.status_code, "error": response.text}
    choice = response.json()["choices"][0]
    return {"prompt": prompt, "status": 200, "text": choice["text"], "finish_reason": choice["finish_reason"]}


def served_by_engine(metrics_text: str) -> dict[str, float]:
    served: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "zeroserve:request_success_total":
                engine = sample.labels["engine"]
                served[engine] = served.get(engine, 0.0) + sample.value
    return served


async def main(base_url: str, num: int, max_tokens: int, tag: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        results = await asyncio.gather(*(complete(client, p, max_tokens) for p in prompts(num, tag)))
        metrics = (await client.get("/metrics")).text
    print(json.dumps({"results": results, "served": served_by_engine(metrics)}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
