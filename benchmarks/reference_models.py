"""Tiny random models of each architecture, built from transformers' own config classes (no download),
saved as a Hugging Face folder and converted to an F32 GGUF by llama.cpp's own convert_hf_to_gguf.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from benchmarks.tokenizer_corpus import tokenizer_corpus
from engine_proc.core import EngineCore
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from service.model_files.tokenizer import Tokenizer

# NOTE: wider than transformers' 0.02, so each step's logits have a clear maximum and a greedy
# token does not hang on a rounding difference between two implementations.
INITIALIZER_RANGE = 0.2
_SHAPE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=2048, initializer_range=INITIALIZER_RANGE,
)


def _llama(config: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**config, tie_word_embeddings=True)


def _mistral(config: Any) -> Any:
    from transformers import MistralConfig

    return MistralConfig(**{"sliding_window": None, **config}, tie_word_embeddings=False)


def _qwen2(config: Any) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(**config, tie_word_embeddings=True)


def _qwen3(config: Any) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**config, head_dim=32, tie_word_embeddings=True)


def _phi3(config: Any) -> Any:
    from transformers import Phi3Config

    return Phi3Config(**config, tie_word_embeddings=False, pad_token_id=None, sliding_window=None)


def _gemma3(config: Any) -> Any:
    from transformers import Gemma3TextConfig

    # NOTE: six layers: five local ones and a global one, as Gemma 3 repeats them; a window shorter than
    # the test's prompts and answers, so the local layers' window is what they attend over.
    return Gemma3TextConfig(
        **{**config, "num_hidden_layers": 6}, head_dim=32, query_pre_attn_scalar=32, sliding_window=SLIDING_WINDOW,
        tie_word_embeddings=True,
    )


def _qwen3_moe(config: Any) -> Any:
    from transformers import Qwen3MoeConfig

    # NOTE: renormalised weights, as Qwen3-30B-A3B's config and llama.cpp's reading of every qwen3moe file.
    return Qwen3MoeConfig(
        **config, head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True,
        tie_word_embeddings=True,
    )


def _qwen2_moe(config: Any) -> Any:
    from transformers import Qwen2MoeConfig

    # NOTE: an untied head, as Qwen1.5-MoE-A2.7B's (llama.cpp's loader wants a qwen2moe file's output.weight).
    return Qwen2MoeConfig(
        **config, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=96,
        norm_topk_prob=False, tie_word_embeddings=False,
    )


def _mixtral(config: Any) -> Any:
    from transformers import MixtralConfig

    return MixtralConfig(
        **{**config, "intermediate_size": 64}, num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
        tie_word_embeddings=False,
    )


def _olmoe(config: Any) -> Any:
    from transformers import OlmoeConfig

    # NOTE: as many KV heads as query heads, as OLMoE has (llama.cpp's loader takes its k norm as that wide).
    return OlmoeConfig(
        **{**config, "intermediate_size": 64, "num_key_value_heads": config["num_attention_heads"]},
        num_experts=8, num_experts_per_tok=2, tie_word_embeddings=False,
        pad_token_id=None,
    )


def _gpt_oss(config: Any) -> Any:
    from transformers import GptOssConfig

    # NOTE: gpt-oss's layers as the real ones alternate: the first slides (over a window shorter than the test's
    # prompts), the second attends to all; experts narrower than the model (shapes a transposition would not fit);
    # its YaRN rope as the real config's (factor 32, not truncated) but from
    # an original context of 64, so the test's positions reach its interpolated dims.
    rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": 64}
    return GptOssConfig(
        **{**config, "intermediate_size": 96}, head_dim=32, num_local_experts=8, num_experts_per_tok=2,
        sliding_window=SLIDING_WINDOW, rope_parameters=rope, tie_word_embeddings=False, pad_token_id=None,
    )


def _smollm3(config: Any) -> Any:
    from transformers import SmolLM3Config

    # NOTE: four layers, so that one (the fourth) attends without rotary embeddings.
    return SmolLM3Config(**{**config, "num_hidden_layers": 4}, tie_word_embeddings=True, pad_token_id=None)


SLIDING_WINDOW = 8
# NOTE: transformers starts these biases at zero; random ones, so the test sees each of them added.
_RANDOM_BIASES = frozenset({"gpt_oss"})
# NOTE: llama.cpp's converter reads these architectures' vocabulary from a SentencePiece tokenizer.model;
# Gemma's, like the real one, puts no space before the text.
SENTENCEPIECE_ARCHITECTURES = frozenset({"phi3", "gemma3"})
_NO_DUMMY_PREFIX = frozenset({"gemma3"})
ARCHITECTURES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "gemma3": _gemma3,
    "gpt_oss": _gpt_oss,
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "olmoe": _olmoe,
    "phi3": _phi3,
    "qwen2": _qwen2,
    "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "smollm3": _smollm3,
}


def write_hf_folder(path: Path, architecture: str, tokenizer: Tokenizer | None = None, **shape: float) -> Path:
    """A random model of `architecture` with `tokenizer` (None: a small SentencePiece one trained here,
    as tokenizer.model and the tokenizer.json transformers makes of it), saved as transformers saves it;
    `shape` replaces sizes of the default tiny shape (hidden_size=64, ...)."""
    from transformers import AutoModelForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    if tokenizer is None:
        tokenizer = _write_sentencepiece_tokenizer(path, add_dummy_prefix=architecture not in _NO_DUMMY_PREFIX)
    else:
        tokenizer.backend.save(str(path / "tokenizer.json"))
        (path / "tokenizer_config.json").write_text(
            # NOTE: the generic fast tokenizer, whatever the architecture.
            json.dumps({
                **tokenizer.special_tokens, "chat_template": tokenizer.chat_template,
                "tokenizer_class": "PreTrainedTokenizerFast",
            })
        )
    config = ARCHITECTURES[architecture](
        {**_SHAPE, **shape, "vocab_size": tokenizer.vocab_size, "bos_token_id": tokenizer.bos_token_id,
         "eos_token_id": tokenizer.eos_token_id}
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if architecture in _RANDOM_BIASES:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("bias"):
                    param.normal_(0.0, INITIALIZER_RANGE)
    model.save_pretrained(path)
    return path


def _write_sentencepiece_tokenizer(path: Path, add_dummy_prefix: bool) -> Tokenizer:
    """A SentencePiece BPE tokenizer (byte fallback, as Llama 2's, Phi-3's and Gemma's) trained on the corpus."""
    import sentencepiece
    from transformers import LlamaTokenizer

    corpus = path / "corpus.txt"
    corpus.write_text("\n".join(tokenizer_corpus()), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(path / "tokenizer"), vocab_size=800, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        hard_vocab_limit=False, minloglevel=2,
        # NOTE: as Llama 2's: text kept as written (no NFKC, runs of spaces kept), digits split.
        normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        allow_whitespace_only_pieces=True, add_dummy_prefix=add_dummy_prefix,
        # NOTE: as Phi-3's vocabulary has them (llama.cpp looks <|endoftext|> up in a Phi-3 file's).
        control_symbols=["<|endoftext|>", "<|end|>", "<|user|>", "<|assistant|>"],
    )
    corpus.unlink()
    (path / "tokenizer.vocab").unlink()
    LlamaTokenizer.from_pretrained(path).save_pretrained(path)
    return Tokenizer.from_model(path)


# NOTE: the converter names a BPE vocabulary's pre-tokenizer by hashing how transformers' tokenizer
# class for the architecture splits a test text; transformers 5 picks that class by model_type
# (Qwen2Tokenizer for a qwen2 folder), which re-splits SmolLM2's vocabulary into a hash it does not
# know. The vocabulary is SmolLM2's whatever the architecture, so it is named as such.
_CONVERT = """
import runpy, sys
tree = sys.argv.pop(1)
sys.path[:0] = [tree, tree + "/gguf-py"]
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
sys.argv[0] = tree + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert_to_gguf(folder: Path, target: Path, llama_cpp_tree: Path, outtype: str = "f32") -> Path:
    """The folder as a GGUF, written by llama.cpp's own converter."""
    command = [sys.executable, "-c", _CONVERT, str(llama_cpp_tree), str(folder), "--outtype", outtype]
    result = subprocess.run([*command, "--outfile", str(target)], capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{result.stderr[-3000:]}")
    return target


# What the architecture tests continue greedily, and for how many tokens.
TEXTS = ["The capital of France is", "def fib(n):\n    return", "Once upon a time, in a land far away,"]
MAX_NEW_TOKENS = 12
# NOTE: where the reference's top two tokens are closer than this, bfloat16 activations and 8-bit or
# 16-bit weights may pick the other one; from there on the two continue from different text.
NEAR_TIE = 0.5


class Greedy(NamedTuple):
    """Greedy continuations of some prompts, the log-probability each chosen token had, and (the
    reference's) how far ahead of the runner-up it was; for a mixture-of-experts model, how close each
    step came to choosing other experts (the smallest gap, over every layer and every token read so far,
    between the router logits of the last expert chosen and the first one not)."""

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    margins: list[list[float]] = []
    router_margins: list[list[float]] = []


def first_difference_is_a_near_tie(ours: Greedy, reference: Greedy, margin: float, router_margin: float = 0.0) -> bool:
    """Whether every continuation equals the reference's up to a step where the reference's top two
    were within `margin` (nats) of each other (after which the two continue from different text), or
    (mixture-of-experts) where a router's choice of experts up to that step was within `router_margin`
    (logits) of another."""
    router_margins = reference.router_margins or [[] for _ in reference.token_ids]
    for token_ids, expected, margins, routers in zip(
        ours.token_ids, reference.token_ids, reference.margins, router_margins, strict=True
    ):
        step = next((i for i, (a, b) in enumerate(zip(token_ids, expected, strict=True)) if a != b), None)
        if step is not None and margins[step] >= margin and not (routers and routers[step] < router_margin):
            return False
    return True


def transformers_greedy(folder: Path, prompts: list[list[int]], max_new_tokens: int, **from_pretrained: Any) -> Greedy:
    """transformers' greedy continuation of each prompt, in float32 (`from_pretrained`: more of its arguments)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **from_pretrained).eval()
    token_ids, logprobs, margins, router_margins = [], [], [], []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            generated = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
            )
        new_ids = generated.sequences[0, len(prompt) :]
        steps = torch.stack(generated.logits)[:, 0].log_softmax(dim=-1)
        token_ids.append(new_ids.tolist())
        logprobs.append(steps.gather(1, new_ids.unsqueeze(1)).flatten().tolist())
        top_two = steps.topk(2, dim=-1).values
        margins.append((top_two[:, 0] - top_two[:, 1]).tolist())
        if getattr(model.config, "num_experts_per_tok", None):
            router_margins.append(_router_margins(model, generated.sequences[0], len(prompt)))
    return Greedy(token_ids, logprobs, margins, router_margins)


def _router_margins(model: Any, sequence: torch.Tensor, prompt_len: int) -> list[float]:
    """For each generated step, the smallest gap over layers, for the tokens that step reads (the prompt at
    the first step, the token before after it), between the logits of the k-th and (k+1)-th expert (k chosen
    a token)."""
    with torch.no_grad():
        routers = model(sequence[:-1].unsqueeze(0), output_router_logits=True).router_logits
    k = model.config.num_experts_per_tok
    ranked = torch.stack([logits.float() for logits in routers]).sort(dim=-1, descending=True).values
    gaps = (ranked[..., k - 1] - ranked[..., k]).amin(dim=0)  # [positions]
    return [float(gaps[:prompt_len].min())] + gaps[prompt_len:].tolist()


def engine_greedy(model_path: Path, prompts: list[list[int]], max_new_tokens: int, **settings: Any) -> Greedy:
    """zeroserve's engine: greedy continuations of all prompts in one batch, EOS ignored."""
    core = EngineCore(
        EngineConfig(model_path=str(model_path), kv_cache_memory_gib=0.05, max_model_len=512, **settings)
    )
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True, num_logprobs=0)
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    token_ids: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    logprobs: dict[str, list[float]] = {str(i): [] for i in range(len(prompts))}
    while core.has_work:
        for output in core.step().outputs:
            token_ids[output.request_id] += output.new_token_ids
            assert output.new_logprobs is not None
            logprobs[output.request_id] += [position[0] for position in output.new_logprobs.logprobs]
    keys = [str(i) for i in range(len(prompts))]
    return Greedy([token_ids[key] for key in keys], [logprobs[key] for key in keys])
