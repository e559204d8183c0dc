"""The tokenizer: ids, text and chat prompts identical to transformers' for the same model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import models, pre_tokenizers

from service.model_files.tokenizer import Tokenizer

TEXTS = [
    "Hello, world!",
    "  leading and trailing spaces   ",
    "line one\nline two\n\n\tindented\r\n",
    "Numbers: 3.14159, 1234567890, -42, 1e-9",
    "naïve café résumé Straße ñandú",
    "日本語のテキスト 中文 한국어 العربية",
    "emoji 😀👍🏽 👩‍👩‍👧 🇫🇷",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # recursion\n",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "it's we'll they'd HELLO'S",
    "",
]

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3? 😀"},
]


@pytest.fixture(scope="module")
def ours(default_model_path: Path) -> Tokenizer:
    return Tokenizer.from_model(default_model_path)


@pytest.fixture(scope="module")
def theirs(default_model_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_path.parent), gguf_file=default_model_path.name)


@pytest.mark.real_model
@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_transformers(ours: Tokenizer, theirs: Any, text: str) -> None:
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
    assert ours.encode(text, add_special_tokens=True) == theirs.encode(text)


@pytest.mark.real_model
@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_matches_transformers(ours: Tokenizer, theirs: Any, text: str, skip_special_tokens: bool) -> None:
    ids = ours.encode(text)
    assert ours.decode(ids, skip_special_tokens) == theirs.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.real_model
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("num_messages", [1, 3, 4])
def test_chat_template_matches_transformers(
    ours: Tokenizer, theirs: Any, add_generation_prompt: bool, num_messages: int
) -> None:
    messages = CONVERSATION[-num_messages:]
    expected = theirs.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    assert ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected


@pytest.mark.real_model
def test_special_tokens_match_transformers(ours: Tokenizer, theirs: Any) -> None:
    assert (ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)
    assert ours.vocab_size == len(theirs) == 49152
    assert set(theirs.all_special_ids) <= set(ours.all_special_ids)
    assert ours.decode(ours.all_special_ids) == ""


def _write_hf_folder(folder: Path, config: dict[str, Any], jinja: str | None = None) -> None:
    """A tiny word-level tokenizer.json plus tokenizer_config.json."""
    words = ["<unk>", "<s>", "</s>", "hello", "world", "user", "assistant", ":", "!"]
    backend = Backend(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(["<s>", "</s>"])
    folder.mkdir()
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja is not None:
        (folder / "chat_template.jinja").write_text(jinja)


SIMPLE_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)


def test_hf_folder_tokenizer(tmp_path: Path) -> None:
    config = {
        "bos_token": "<s>",
        "eos_token": {"content": "</s>"},
        "add_bos_token": True,
        "chat_template": SIMPLE_TEMPLATE,
    }
    _write_hf_folder(tmp_path / "model", config)
    tokenizer = Tokenizer.from_model(tmp_path / "model")

    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert tokenizer.encode("hello world !") == [3, 4, 8]
    assert tokenizer.encode("hello world", add_special_tokens=True) == [1, 3, 4]
    assert tokenizer.all_special_ids == [1, 2]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}])
    assert prompt == "<s>user : hello assistant :"
    assert tokenizer.decode(tokenizer.encode(prompt)) == "user : hello assistant :"


def test_a_folder_that_pads_and_truncates_every_text_gives_its_tokens_alone(tmp_path: Path) -> None:
    _write_hf_folder(tmp_path / "model", {})
    saved = Backend.from_file(str(tmp_path / "model" / "tokenizer.json"))
    # NOTE: as BERT folders ship: every text padded and cut to 128 tokens (here, 2).
    saved.enable_padding(length=6, pad_id=0, pad_token="<unk>")
    saved.enable_truncation(max_length=2)
    saved.save(str(tmp_path / "model" / "tokenizer.json"))

    assert Tokenizer.from_model(tmp_path / "model").encode("hello world !") == [3, 4, 8]


def test_hf_folder_picks_default_of_named_templates(tmp_path: Path) -> None:
    named = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": SIMPLE_TEMPLATE}]
    _write_hf_folder(tmp_path / "model", {"bos_token": "<s>", "chat_template": named})
    prompt = Tokenizer.from_model(tmp_path / "model").apply_chat_template([], add_generation_prompt=True)
    assert prompt == "<s>assistant :"


def test_hf_folder_chat_template_file_wins(tmp_path: Path) -> None:
    jinja = "{% for m in messages %}{{ m['content'] | tojson }}{% endfor %}"
    _write_hf_folder(tmp_path / "model", {"chat_template": "IGNORED"}, jinja=jinja)
    prompt = Tokenizer.from_model(tmp_path / "model").apply_chat_template([{"role": "user", "content": "<é>"}])
    assert prompt == '"<é>"'


def test_template_can_raise_a_clear_error(tmp_path: Path) -> None:
    jinja = "{{ raise_exception('roles must alternate') }}"
    _write_hf_folder(tmp_path / "model", {}, jinja=jinja)
    tokenizer = Tokenizer.from_model(tmp_path / "model")
    with pytest.raises(jinja2.TemplateError, match="roles must alternate"):
        tokenizer.apply_chat_template([])


def test_missing_chat_template_is_a_clear_error(tmp_path: Path) -> None:
    _write_hf_folder(tmp_path / "model", {})
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer.from_model(tmp_path / "model").apply_chat_template([])


def test_not_a_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="No tokenizer"):
        Tokenizer.from_model(tmp_path)


@pytest.mark.parametrize(
    ("name", "bos_id"),
    [
        ("ggml-vocab-llama-spm.gguf", 1),  # SentencePiece: BOS by llama.cpp's default
        ("ggml-vocab-phi-3.gguf", 1),
        ("ggml-vocab-gemma-4.gguf", 2),
        ("ggml-vocab-llama-bpe.gguf", 128000),  # Llama 3's BPE: BOS by llama.cpp's default
        ("ggml-vocab-qwen2.gguf", None),
    ],
)
def test_gguf_vocabularies_decode_what_they_encode(llama_cpp_tree: Path, name: str, bos_id: int | None) -> None:
    tokenizer = Tokenizer.from_model(llama_cpp_tree / "models" / name)
    texts = (llama_cpp_tree / "models" / f"{name}.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    for text in [*texts[:-1], *TEXTS]:
        assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=False) == text
    with_special = tokenizer.encode("Hi there", add_special_tokens=True)
    assert with_special[: 1 if bos_id is not None else 0] == ([bos_id] if bos_id is not None else [])
    assert with_special[-2:] == tokenizer.encode("Hi there")


# NOTE: tool-use templates written for their own tool formats, not OpenAI's `tools`.
_OWN_TOOL_FORMATS = {
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": "Cohere's tool definitions (name, description, parameter_definitions)",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "`functions` as one JSON string",
}
_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}}]


def test_every_real_chat_template_renders_a_chat(llama_cpp_tree: Path) -> None:
    """The chat templates of 70 real models (llama.cpp's models/templates): each renders a conversation,
    with OpenAI-style tools where it takes them, as transformers would."""
    templates = sorted((llama_cpp_tree / "models" / "templates").glob("*.jinja"))
    assert len(templates) >= 60
    failures = {}
    for path in templates:
        tokenizer = Tokenizer(Backend(models.BPE()), path.read_text(encoding="utf-8"), {"bos_token": "<s>", "eos_token": "</s>"})
        try:
            with_tools = tokenizer.apply_chat_template(CONVERSATION[-1:], tools=_TOOLS)
            # NOTE: a tool-use template (Hermes' `tool_use`) renders only with tools.
            chat = _render_without_tools(tokenizer) or tokenizer.apply_chat_template(CONVERSATION[1:], tools=_TOOLS)
        except (jinja2.TemplateError, TypeError) as exc:
            failures[path.name] = str(exc)
            continue
        assert "And 3+3? 😀" in chat and "And 3+3? 😀" in with_tools, path.name
    assert failures.keys() <= _OWN_TOOL_FORMATS.keys(), failures


def _render_without_tools(tokenizer: Tokenizer) -> str | None:
    try:
        return tokenizer.apply_chat_template(CONVERSATION[1:])
    except (jinja2.TemplateError, TypeError):
        return None
