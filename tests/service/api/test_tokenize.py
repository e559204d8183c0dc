"""POST /tokenize and /detokenize."""

from __future__ import annotations

import httpx

from tests.server_process import ServerProcess


def test_tokenize_then_detokenize_round_trips(tiny_server: ServerProcess) -> None:
    with httpx.Client(base_url=tiny_server.base_url) as client:
        tokens = client.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
        assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == 2048
        assert "".join(tokens["token_strs"]).endswith("Hello world")
        assert client.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"].endswith("Hello world")
        chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
        assert chat["count"] > 2
