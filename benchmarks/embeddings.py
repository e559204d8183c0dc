"""Embeddings a second: zeroserve serving all-MiniLM-L6-v2, sentence-transformers in process, and llama.cpp's
`llama-server --embedding` on the same model as GGUF, in one run.

    .venv/bin/python -m benchmarks.embeddings
    .venv/bin/python -m benchmarks.embeddings --num-sentences 1000 --rounds 3 --result-json out.json

The sentences are natural text of mixed length (1 to 4 sentences of the chat benchmark's requests, askers
and background passages: 12 to 126 tokens, 51 on average), each distinct. Over HTTP, `--concurrency` clients (1 and 16)
each send one sentence a request to `/v1/embeddings` until all are embedded; zeroserve runs with its default
flags, llama-server with `--embedding --pooling mean`, 16 slots and the machine's threads, on the folder
converted to a GGUF by llama.cpp's own converter (`--gguf-type`: F16 by default, as llama.cpp's users run it;
F32, BF16, Q8_0). In process, sentence-transformers' `encode` takes all
the sentences at its default batch of 32, in float32 and in bfloat16 (its fastest CPU setting of the two;
its ONNX and OpenVINO backends are not measured). The rounds take the contenders in turn; medians reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.llama_cpp_tree import llama_cpp_tree
from benchmarks.llama_server_compare import LLAMA_SERVER, running_llama_server
from benchmarks.reference_models import convert_to_gguf
from engine_proc.cpu.features import cpu_model_name
from service.bench.chat_prompts import chat_sentences
from service.bench.local_server import local_server
from service.model_files.model_registry import resolve_model

MODEL = "all-minilm-l6-v2"


def mixed_sentences(num_sentences: int, seed: int = 0) -> list[str]:
    """Distinct texts of 1 to 4 natural sentences each."""
    pieces = chat_sentences()
    rng = np.random.default_rng(seed)
    texts: dict[str, None] = {}
    while len(texts) < num_sentences:
        count = int(rng.choice([1, 1, 2, 2, 3, 4]))
        texts[" ".join(pieces[i] for i in rng.choice(len(pieces), size=count, replace=False))] = None
    return list(texts)


async def _embed_all(base_url: str, sentences: list[str], concurrency: int) -> float:
    """Seconds for `concurrency` clients to embed every sentence, one a request."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for sentence in sentences:
        queue.put_nowait(sentence)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            sentence = queue.get_nowait()
            response = await http.post(f"{base_url}/v1/embeddings", json={"model": MODEL, "input": sentence})
            response.raise_for_status()
            assert len(response.json()["data"][0]["embedding"]) == 384

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        return time.perf_counter() - started


def over_http(base_url: str, sentences: list[str], concurrencies: list[int]) -> dict[str, float]:
    asyncio.run(_embed_all(base_url, sentences[:16], 4))  # NOTE: warm-up
    return {f"{c} clients": len(sentences) / asyncio.run(_embed_all(base_url, sentences, c)) for c in concurrencies}


def in_process(folder: Path, sentences: list[str]) -> dict[str, float]:
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    figures = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        model.to(dtype)
        model.encode(sentences[:64], batch_size=32)
        started = time.perf_counter()
        model.encode(sentences, batch_size=32)
        figures[f"in process, {name}"] = len(sentences) / (time.perf_counter() - started)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-sentences", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--gguf-type", default="f16", choices=["f32", "f16", "bf16", "q8_0"],
                        help="the GGUF llama-server runs (llama.cpp's converter's --outtype)")
    parser.add_argument("--result-json", type=Path, default=Path("embeddings.json"))
    args = parser.parse_args()
    folder = resolve_model(MODEL).path
    sentences = mixed_sentences(args.num_sentences)
    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        gguf = convert_to_gguf(folder, Path(tmp) / f"all-minilm-l6-v2-{args.gguf_type}.gguf", llama_cpp_tree(),
                               args.gguf_type)
        llama_args = ["-m", str(gguf), "--embedding", "--pooling", "mean", "--threads", str(args.threads),
                      "--threads-batch", str(args.threads), "--parallel", "16", "--ctx-size", "8192"]
        contenders: dict[str, Callable[[], dict[str, float]]] = {
            "zeroserve": lambda: _served_zeroserve(sentences, args.concurrency),
            "llama-server": lambda: _served_llama(args.llama_server, llama_args, Path(tmp), sentences, args.concurrency),
            "sentence-transformers": lambda: in_process(folder, sentences),
        }
        for index in range(args.rounds):
            figures = {name: run() for name, run in contenders.items()}
            rounds.append(figures)
            print(f"round {index + 1}: " + "; ".join(f"{name} " + ", ".join(f"{k} {v:.0f}/s" for k, v in f.items())
                                                     for name, f in figures.items()), flush=True)
    medians = {name: {key: statistics.median(r[name][key] for r in rounds) for key in rounds[0][name]}
               for name in rounds[0]}
    print(f"embeddings a second, medians of {args.rounds} rounds, {args.num_sentences} sentences, on {cpu_model_name()}:")
    for name, figures in medians.items():
        print(f"  {name:<22} " + ", ".join(f"{key} {value:.0f}" for key, value in figures.items()))
    top = f"{max(args.concurrency)} clients"
    fastest_in_process = max(medians["sentence-transformers"].values())
    print(f"zeroserve at {top}: {medians['zeroserve'][top] / fastest_in_process:.2f}x sentence-transformers' fastest in "
          f"process, {medians['zeroserve'][top] / medians['llama-server'][top]:.2f}x llama-server")
    args.result_json.write_text(json.dumps({"cpu": cpu_model_name(), "rounds": rounds, "medians": medians,
                                            "settings": {k: str(v) for k, v in vars(args).items()}}, indent=2))


def _served_zeroserve(sentences: list[str], concurrencies: list[int]) -> dict[str, float]:
    with local_server([MODEL], log_file=Path(os.devnull)) as server:
        return over_http(server.base_url, sentences, concurrencies)


def _served_llama(binary: Path, llama_args: list[str], tmp: Path, sentences: list[str],
                  concurrencies: list[int]) -> dict[str, Any]:
    with running_llama_server(binary, llama_args, tmp / "llama-server.log") as (base_url, _):
        return over_http(base_url, sentences, concurrencies)


if __name__ == "__main__":
    main()
