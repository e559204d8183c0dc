"""POST /tokenize and /detokenize, in process with the default model's tokenizer (errors:
test_errors_inproc.py)."""

from __future__ import annotations

import httpx

from service.model_files.tokenizer import Tokenizer
from tests.service.api.fake_engine import MAX_MODEL_LEN


async def test_tokenize_then_detokenize_round_trips(api: httpx.AsyncClient, tokenizer: Tokenizer) -> None:
    tokens = (await api.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True})).json()
    assert set(tokens) == {"count", "max_model_len", "tokens", "token_strs"}
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == MAX_MODEL_LEN
    assert tokens["tokens"] == tokenizer.encode("Hello world", add_special_tokens=True)
    assert "".join(tokens["token_strs"]).endswith("Hello world")
    detokenized = (await api.post("/detokenize", json={"model": "fake-alias", "tokens": tokens["tokens"]})).json()
    assert detokenized == {"prompt": tokenizer.decode(tokens["tokens"])}
    assert detokenized["prompt"].endswith("Hello world")
    plain = (await api.post("/tokenize", json={"prompt": "Hello world"})).json()
    assert plain["token_strs"] is None and plain["tokens"] == tokens["tokens"]


async def test_tokenize_renders_chat_messages_with_the_template(api: httpx.AsyncClient, tokenizer: Tokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    chat = (await api.post("/tokenize", json={"messages": messages, "return_token_strs": True})).json()
    assert chat["count"] > 2
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert chat["tokens"] == tokenizer.encode(rendered)
    assert "".join(chat["token_strs"]) == rendered
    bare = (await api.post("/tokenize", json={"messages": messages, "add_generation_prompt": False})).json()
    assert bare["count"] < chat["count"]
