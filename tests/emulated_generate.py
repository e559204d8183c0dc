"""Greedy tokens of the default model under default flags, as JSON on stdout: run natively and under
QEMU's emulated CPUs by test_emulated_cpus (in-process: qemu-user does not follow a child process)."""

from __future__ import annotations

import json
import sys

# NOTE: a question whose greedy answer wins by at least 2.5 nats at each of these tokens in
# transformers fp32 ("The capital of Japan is Tokyo"): other CPUs run other matmul forms, whose
# drift must not decide a near-tie ("The capital of France is" has a 0.22-nat one at token 6).
QUESTION = [{"role": "user", "content": "What is the capital of Japan?"}]
NUM_TOKENS = 6


def main() -> None:
    from service import SamplingParams
    from service.frontend.llm import LLM

    # NOTE: a small KV cache (and context) only because zeroing the default 4 GiB takes minutes under emulation.
    llm = LLM(multiprocess_mode=False, kv_cache_memory_gib=0.25, max_model_len=2048)
    ready = llm.llm_engine.engine_core.ready
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    (output,) = llm.chat(QUESTION, params, use_tqdm=False)
    json.dump({"token_ids": output.outputs[0].token_ids, "text": output.outputs[0].text,
               "cpu": ready.cpu, "kernels": ready.kernel_choices}, sys.stdout)


if __name__ == "__main__":
    main()
