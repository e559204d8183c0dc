"""zeroserve's greedy text against llama.cpp's `llama-server` on the same GGUF: the same tokens, but where
llama-server's own top two were within a stated margin (then the two go on from different text).

    .venv/bin/python -m benchmarks.llama_server_greedy --model FILE.gguf [--margin 0.5] [--max-tokens 48]
    .venv/bin/python -m benchmarks.llama_server_greedy --model gemma-3-270m \
        --write-reference tests/engine_proc/data/gemma-3-270m.llama-server.json

Both get the same prompt ids (zeroserve's tokenization, checked against llama-server's /tokenize);
llama-server answers /completion with temperature 0 and its top two log-probabilities a step;
zeroserve's engine runs with its default flags (bfloat16, the file's own blocks on the kernel forms).
Prints, per prompt, whether the tokenizations agree, the first step where the answers differ (if any)
and llama-server's margin there; exits 1 if any difference is not a near tie. `--write-reference` also
keeps llama-server's answers, margins and its tokenization of the tests' corpus for the tests to hold
zeroserve to without llama-server (tests/engine_proc/test_fidelity_gemma3.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import httpx

from benchmarks.llama_server_compare import LLAMA_SERVER, llama_server
from benchmarks.tokenizer_corpus import tokenizer_corpus
from engine_proc.core import EngineCore
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from service.model_files.model_registry import resolve_model
from service.model_files.tokenizer import Tokenizer

PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little girl named",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In 1492, Christopher Columbus",
    "The quick brown fox",
    "To make a cup of tea, first",
]


def llama_server_greedy(base_url: str, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """llama-server's greedy continuation and, each step, how far its pick led the runner-up (nats)."""
    body = {
        "prompt": prompt_ids, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "n_probs": 2,
        "cache_prompt": False, "ignore_eos": True, "post_sampling_probs": False,
    }
    response = httpx.post(f"{base_url}/completion", json=body, timeout=600).json()
    token_ids, margins = [], []
    for step in response["completion_probabilities"]:
        token_ids.append(step["id"])
        top = sorted((entry["logprob"] for entry in step["top_logprobs"]), reverse=True)
        margins.append(top[0] - top[1] if len(top) > 1 else float("inf"))
    return token_ids, margins


def zeroserve_greedy(model: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The engine's greedy continuations, default flags, all prompts in one batch."""
    core = EngineCore(EngineConfig(model_path=str(model), kv_cache_memory_gib=0.5, max_model_len=2048))
    for i, prompt in enumerate(prompts):
        core.add_request(EngineCoreRequest(str(i), prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                         ignore_eos=True)))
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while core.has_work:
        for output in core.step().outputs:
            outputs[output.request_id] += output.new_token_ids
    return [outputs[str(i)] for i in range(len(prompts))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a GGUF file or a known model name")
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--margin", type=float, default=0.5, help="near tie: top two within this many nats")
    parser.add_argument("--write-reference", type=Path, help="keep llama-server's answers here (JSON)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = resolve_model(args.model).path
    tokenizer = Tokenizer.from_model(model)
    prompts = [tokenizer.encode(text, add_special_tokens=True) for text in PROMPTS]
    ours = zeroserve_greedy(model, prompts, args.max_tokens)
    is_ok = True
    reference: dict[str, list[object]] = {"answers": [], "margins": [], "corpus_ids": []}
    with tempfile.TemporaryDirectory() as tmp, llama_server(args.llama_server, model, args.threads,
                                                             Path(tmp) / "llama-server.log") as (base_url, _):
        for text, prompt, answer in zip(PROMPTS, prompts, ours, strict=True):
            theirs = httpx.post(f"{base_url}/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
            expected, margins = llama_server_greedy(base_url, prompt, args.max_tokens)
            reference["answers"].append(expected)
            reference["margins"].append(margins)
            step = next((i for i, (a, b) in enumerate(zip(answer, expected, strict=True)) if a != b), None)
            verdict = "equal" if step is None else f"differ at step {step}, llama-server's margin {margins[step]:.3f}"
            is_ok &= step is None or margins[step] < args.margin
            print(f"{text!r}: tokenization {'equal' if theirs == prompt else 'DIFFERS'}; answers {verdict}")
            print(f"    zeroserve:    {tokenizer.decode(answer)!r}")
            if step is not None:
                print(f"    llama-server: {tokenizer.decode(expected)!r}")
            is_ok &= theirs == prompt
        for text in tokenizer_corpus():
            reference["corpus_ids"].append(httpx.post(f"{base_url}/tokenize", json={"content": text}).json()["tokens"])
    wrong = [text for text, ids in zip(tokenizer_corpus(), reference["corpus_ids"], strict=True)
             if tokenizer.encode(text) != ids]
    print(f"corpus tokenization: {len(tokenizer_corpus()) - len(wrong)} of {len(tokenizer_corpus())} strings equal")
    is_ok &= not wrong
    print("all differences are near ties" if is_ok else f"a difference is not a near tie (margin {args.margin})")
    if args.write_reference is not None:
        with model.open("rb") as file:
            sha256 = hashlib.file_digest(file, "sha256").hexdigest()
        document = {"model_sha256": sha256, "prompts": PROMPTS, "prompt_ids": prompts, "max_tokens": args.max_tokens,
                    "corpus": tokenizer_corpus(), **reference}
        args.write_reference.write_text(json.dumps(document, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0 if is_ok else 1


if __name__ == "__main__":
    sys.exit(main())
