"""POST /tokenize and /detokenize, in process with the default model's tokenizer (errors:
test_errors_inproc.py)."""

from __future__ import annotations

import httpx
import pytest

from service.model_files.tokenizer import Tokenizer, _bos_eos_processor
from tests.service.api.fake_engine import MAX_MODEL_LEN


async def test_tokenize_then_detokenize_round_trips(api: httpx.AsyncClient, tokenizer: Tokenizer) -> None:
    tokens = (await api.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True})).json()
    assert set(tokens) == {"count", "max_model_len", "tokens", "token_strs"}
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == MAX_MODEL_LEN
    assert tokens["tokens"] == tokenizer.encode("Hello world", add_special_tokens=True)
    # NOTE: vocabulary tokens, as vLLM returns them: "Ġworld", not " world".
    assert tokens["token_strs"] == [tokenizer.backend.id_to_token(t) for t in tokens["tokens"]]
    assert tokens["token_strs"][-2:] == ["Hello", "Ġworld"]
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
    assert chat["token_strs"] == [tokenizer.backend.id_to_token(t) for t in chat["tokens"]]
    bare = (await api.post("/tokenize", json={"messages": messages, "add_generation_prompt": False})).json()
    assert bare["count"] < chat["count"]


async def test_tokenize_without_special_tokens(
    api: httpx.AsyncClient, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE: the default model's tokenizer adds no BOS; one that does shows the flag.
    backend = tokenizer.backend
    monkeypatch.setattr(backend, "post_processor", _bos_eos_processor(backend, tokenizer.special_tokens, True, False))
    bos = backend.token_to_id(tokenizer.special_tokens["bos_token"])
    with_bos = (await api.post("/tokenize", json={"prompt": "Hello world"})).json()["tokens"]
    without = (await api.post("/tokenize", json={"prompt": "Hello world", "add_special_tokens": False})).json()["tokens"]
    assert with_bos == [bos, *without] and without == tokenizer.encode("Hello world")


async def test_return_token_strs_are_vocabulary_tokens(api: httpx.AsyncClient, tokenizer: Tokenizer) -> None:
    for body in ({"prompt": "Hello world"}, {"messages": [{"role": "user", "content": "Hello world"}]}):
        tokens = (await api.post("/tokenize", json={**body, "return_token_strs": True})).json()
        assert tokens["token_strs"] == [tokenizer.backend.id_to_token(t) for t in tokens["tokens"]]
        assert "Ġworld" in tokens["token_strs"] and " world" not in tokens["token_strs"]


async def test_tokenize_chat_follows_the_template_flags(
    api: httpx.AsyncClient, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}]

    async def tokenized(**flags: object) -> list[int]:
        response = await api.post("/tokenize", json={"messages": messages, **flags})
        assert response.status_code == 200, response.text
        tokens: list[int] = response.json()["tokens"]
        return tokens

    closed = tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    assert await tokenized(add_generation_prompt=False) == tokenizer.encode(closed)
    continued = await tokenized(add_generation_prompt=False, continue_final_message=True)
    assert tokenizer.decode(continued, skip_special_tokens=False).endswith("Once upon")
    both = await api.post("/tokenize", json={"messages": messages, "continue_final_message": True})
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
    backend = tokenizer.backend
    monkeypatch.setattr(backend, "post_processor", _bos_eos_processor(backend, tokenizer.special_tokens, True, False))
    bos = backend.token_to_id(tokenizer.special_tokens["bos_token"])
    # NOTE: vLLM's default for messages: no BOS on top of the template's own.
    plain = await tokenized()
    assert plain == tokenizer.encode(tokenizer.apply_chat_template(messages))
    assert await tokenized(add_special_tokens=True) == [bos, *plain]
    monkeypatch.setattr(tokenizer, "chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}{{ colour }}")
    monkeypatch.setattr(tokenizer, "_compiled_template", None)
    assert tokenizer.decode(await tokenized(chat_template_kwargs={"colour": "!blue"})) == "hiOnce upon!blue"


async def test_tokenize_chat_renders_the_tools(
    api: httpx.AsyncClient, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokenizer, "chat_template", "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}")
    monkeypatch.setattr(tokenizer, "_compiled_template", None)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    tokens = (await api.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}], "tools": tools})).json()
    assert tokenizer.decode(tokens["tokens"]) == "[get_weather]"
