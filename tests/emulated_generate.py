"""Greedy tokens of the default model under default flags, as JSON on stdout: run by
test_emulated_cpus natively and with torch's and oneDNN's CPU overrides, the references an engine
under QEMU's emulated Haswell must match."""

from __future__ import annotations

import json
import logging
import sys
import time

# NOTE: a short completion whose greedy continuation (" 4,") wins by at least 3.4 nats at each
# of its three tokens in transformers fp32: other CPUs run other matmul forms, whose drift must
# not decide a near-tie. Eight prompt tokens, not a chat's 37, and three generated: QEMU runs a
# float32 projection at about 7 million multiply-adds a second, so each token, of the prompt or
# generated, costs the emulated run about 13 s (six generated took 175 s on a Xeon).
PROMPT = "1, 2, 3,"
NUM_TOKENS = 3


def main() -> None:
    from service import SamplingParams
    from service.frontend.llm import LLM

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(relativeCreated)8.0f ms %(name)s: %(message)s")
    # NOTE: a small KV cache (and context) only because zeroing the default 4 GiB takes minutes under emulation.
    llm = LLM(multiprocess_mode=False, kv_cache_memory_gib=0.25, max_model_len=2048)
    ready = llm.llm_engine.engine_core.ready
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    started = time.perf_counter()
    (output,) = llm.generate(PROMPT, params, use_tqdm=False)
    print(f"generated in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    json.dump({"token_ids": output.outputs[0].token_ids, "text": output.outputs[0].text,
               "cpu": ready.cpu, "kernels": ready.kernel_choices}, sys.stdout)


if __name__ == "__main__":
    main()
