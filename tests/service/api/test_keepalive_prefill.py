"""SSE keepalive comments arrive while a long prompt is still being prefilled."""

from __future__ import annotations

import random
from pathlib import Path

import httpx

from tests.server_process import running_server


def test_keepalive_comments_arrive_during_a_long_prefill(tiny_model_dir: Path) -> None:
    # NOTE: 2 tokens a step: a 2,000-token prompt takes 1,000 engine steps before its first token,
    # each a step through the busy loop (a Zen 5 ran 16-token steps of the tiny model in 0.65 ms, so
    # 125 of them fit within one 50 ms keepalive); a ping every 10 ms must come many times meanwhile.
    args = ["--max-num-batched-tokens", "2", "--sse-keepalive", "0.01", "--no-enable-prefix-caching"]
    prompt = [random.Random(7).randrange(100, 40_000) for _ in range(2000)]
    body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True, "stream": True}
    with running_server(tiny_model_dir, *args) as server, httpx.Client(base_url=server.base_url, timeout=120) as client:
        lines_before_data: list[str] = []
        with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    break
                if line:
                    lines_before_data.append(line)
    assert lines_before_data.count(": ping") >= 2, lines_before_data
