"""One request path: `zeroserve generate`, `LLM.chat` and POST /v1/chat/completions give the
same tokens for the same request (a tiny random model, greedy, float32 everywhere)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from service import LLM, SamplingParams
from tests.server_process import running_server

MESSAGES = [
    {"role": "system", "content": "You answer in one line."},
    {"role": "user", "content": "Name three colours of the sea at dusk."},
]
ENGINE_FLAGS = ["--dtype", "float32", "--num-threads", "1", "--kv-cache-memory", "0.05", "--max-model-len", "1024"]
MAX_TOKENS = 12


def test_generate_llm_chat_and_the_route_give_the_same_tokens(tiny_model_dir: Path, tmp_path: Path) -> None:
    stop = "\u00a7never\u00a7"
    body = {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "n": 2,
            "stop": [stop], "logprobs": True}
    with LLM(str(tiny_model_dir), dtype="float32", num_threads=1, kv_cache_memory_gib=0.05,
             max_model_len=1024, multiprocess_mode=False) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, n=2, stop=[stop])
        [offline] = llm.chat(MESSAGES, params, use_tqdm=False)
        tokenizer = llm.get_tokenizer()
    token_ids = offline.outputs[0].token_ids
    assert len(token_ids) == MAX_TOKENS and [o.token_ids for o in offline.outputs] == [token_ids, token_ids]
    tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in token_ids]

    input_path, output_path = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    input_path.write_text(json.dumps(body) + "\n")
    command = [sys.executable, "-m", "service", "generate", str(tiny_model_dir), "--input", str(input_path),
               "--output", str(output_path), "--disable-tqdm", *ENGINE_FLAGS]
    assert subprocess.run(command, timeout=300).returncode == 0
    [line] = [json.loads(text) for text in output_path.read_text().splitlines()]
    batch = line["response"]["body"]

    with running_server(tiny_model_dir, *ENGINE_FLAGS) as server:
        online = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60).json()

    for result in (batch, online):
        assert result["usage"]["completion_tokens"] == 2 * MAX_TOKENS
        for choice in result["choices"]:
            assert choice["message"]["content"] == offline.outputs[0].text
            assert [entry["token"] for entry in choice["logprobs"]["content"]] == tokens
            assert choice["finish_reason"] == "length"
