"""Each architecture's GGUFs as llama.cpp's own tools make them (convert_hf_to_gguf.py to F16 and Q8_0,
llama-quantize to Q4_K_M), served by zeroserve with default flags against llama-server on the same file.

    .venv/bin/python -m benchmarks.architecture_quants [--architectures gemma3 phi3 ...] [--types Q4_K_M Q8_0 F16]

Random models of each architecture (benchmarks/reference_models.py) at a width k-quants take (hidden 256,
FFN 768: rows of 256 values); `llama-quantize` and `llama-server` from ../shared/tools/build-llama-cpp.
For each file: zeroserve's greedy tokens (prompts from benchmarks/llama_server_greedy.py, zeroserve's
tokenization, checked against llama-server's) against llama-server's, equal but where llama-server's
top two were within `--margin` nats. Exits 1 if any file fails to load or differs elsewhere.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from benchmarks.llama_cpp_tree import llama_cpp_tree
from benchmarks.llama_server_compare import LLAMA_SERVER, llama_server
from benchmarks.llama_server_greedy import PROMPTS, llama_server_greedy, zeroserve_greedy
from benchmarks.reference_models import ARCHITECTURES, SENTENCEPIECE_ARCHITECTURES, convert_to_gguf, write_hf_folder
from service.model_files.model_registry import DEFAULT_MODEL, resolve_model
from service.model_files.tokenizer import Tokenizer

LLAMA_QUANTIZE = LLAMA_SERVER.parent / "llama-quantize"
_SHAPE = {"hidden_size": 256, "intermediate_size": 768, "initializer_range": 0.05}


def make_file(folder: Path, kind: str, tree: Path, root: Path) -> Path:
    """The folder as a GGUF of `kind`: the converter's own types, else llama-quantize from its F16 file."""
    if kind in ("F16", "Q8_0"):
        return convert_to_gguf(folder, root / f"{folder.name}-{kind}.gguf", tree, kind.lower())
    f16 = root / f"{folder.name}-F16.gguf"
    if not f16.is_file():
        convert_to_gguf(folder, f16, tree, "f16")
    target = root / f"{folder.name}-{kind}.gguf"
    subprocess.run([str(LLAMA_QUANTIZE), str(f16), str(target), kind], check=True, capture_output=True)
    return target


def check(path: Path, margin: float, threads: int, max_tokens: int) -> bool:
    tokenizer = Tokenizer.from_model(path)
    prompts = [tokenizer.encode(text, add_special_tokens=True) for text in PROMPTS]
    ours = zeroserve_greedy(path, prompts, max_tokens)
    steps, is_ok = [], True
    with tempfile.TemporaryDirectory() as tmp, llama_server(LLAMA_SERVER, path, threads, Path(tmp) / "log") as (url, _):
        for text, prompt, answer in zip(PROMPTS, prompts, ours, strict=True):
            theirs = httpx.post(f"{url}/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
            expected, margins = llama_server_greedy(url, prompt, max_tokens)
            step = next((i for i, (a, b) in enumerate(zip(answer, expected, strict=True)) if a != b), None)
            is_ok &= theirs == prompt and (step is None or margins[step] < margin)
            steps.append("=" if step is None else f"{step}@{margins[step]:.2f}")
    print(f"{path.name}: {'ok' if is_ok else 'FAILS'}; first differences (step@margin): {' '.join(steps)}", flush=True)
    return is_ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architectures", nargs="+", default=sorted(ARCHITECTURES))
    parser.add_argument("--types", nargs="+", default=["F16", "Q8_0", "Q4_K_M"])
    parser.add_argument("--margin", type=float, default=0.5)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    tree = llama_cpp_tree()
    smollm = Tokenizer.from_model(resolve_model(DEFAULT_MODEL).path)
    is_ok = True
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for architecture in args.architectures:
            tokenizer = None if architecture in SENTENCEPIECE_ARCHITECTURES else smollm
            folder = write_hf_folder(root / architecture, architecture, tokenizer, **_SHAPE)
            for kind in args.types:
                try:
                    is_ok &= check(make_file(folder, kind, tree, root), args.margin, args.threads, args.max_tokens)
                except Exception as exc:  # noqa: BLE001 - a file that fails is a result to report, not a crash
                    print(f"{architecture} {kind}: FAILS to run: {exc}", flush=True)
                    is_ok = False
    return 0 if is_ok else 1


if __name__ == "__main__":
    sys.exit(main())
