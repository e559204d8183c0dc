"""`zeroserve bench throughput`: offline throughput through `LLM.generate`, as `vllm bench throughput`."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from service.bench.datasets import SampleRequest, jsonl_dataset, random_dataset
from service.flags.engine_flags import engine_config_from


def load_samples(args: argparse.Namespace, tokenizer: Any) -> list[SampleRequest]:
    if args.dataset_path is not None:
        return jsonl_dataset(tokenizer, "completions", args.dataset_path, args.num_prompts)
    return random_dataset(
        tokenizer, "completions", args.num_prompts, args.random_input_len, args.random_output_len,
        args.random_range_ratio, args.seed,
    )


def run_throughput_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Loads the model, runs every prompt through one `LLM.generate`, returns vLLM's result keys."""
    from service.frontend.llm import LLM, TokensPrompt
    from service.frontend.sampling_params import SamplingParams

    engine = engine_config_from(args)
    llm = LLM.from_engine_config(args.model, engine, multiprocess_mode=args.multiprocessing)
    try:
        tokenizer = llm.get_tokenizer()
        defaults = llm.get_default_sampling_params()
        samples = load_samples(args, tokenizer)
        prompts: list[TokensPrompt] = []
        params: list[SamplingParams] = []
        for sample in samples:
            text = sample.body.get("prompt")
            if not isinstance(text, str):
                raise ValueError("bench throughput takes completions bodies with a text `prompt`")
            prompts.append(TokensPrompt(prompt=text, prompt_token_ids=tokenizer.encode(text, add_special_tokens=True)))
            # NOTE: as `bench serve` against a server: the model's sampling defaults unless
            # --temperature says otherwise, and every request runs to its max_tokens.
            params.append(replace(
                defaults, max_tokens=sample.expected_output_len or 16, ignore_eos=True,
                temperature=defaults.temperature if args.temperature is None else args.temperature,
            ))
        if args.num_warmups:
            llm.generate(prompts[: args.num_warmups], params[: args.num_warmups], use_tqdm=False)
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=not args.disable_tqdm)
        elapsed = time.perf_counter() - started
    finally:
        llm.shutdown()
    num_prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    num_output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "model_id": args.model,
        "elapsed_time": elapsed,
        "num_requests": len(outputs),
        "total_num_tokens": num_prompt_tokens + num_output_tokens,
        "total_input_tokens": num_prompt_tokens,
        "total_output_tokens": num_output_tokens,
        "requests_per_second": len(outputs) / elapsed,
        "tokens_per_second": (num_prompt_tokens + num_output_tokens) / elapsed,
        "output_throughput": num_output_tokens / elapsed,
        "max_num_seqs": engine.max_num_seqs,
    }


def print_and_save(result: dict[str, Any], output_json: Path | None) -> None:
    print(
        f"Throughput: {result['requests_per_second']:.2f} requests/s, "
        f"{result['tokens_per_second']:.2f} total tokens/s, {result['output_throughput']:.2f} output tokens/s"
    )
    print(f"Total num prompt tokens:  {result['total_input_tokens']}")
    print(f"Total num output tokens:  {result['total_output_tokens']}")
    if output_json is not None:
        output_json.write_text(json.dumps(result, indent=2))
