"""Logits of a GGUF's model for fixed tokens, loaded as an engine loads it (default flags: the file's
blocks on zeroserve's kernel forms where they run): run by test_emulated_cpus natively and under
QEMU's emulated Haswell, whose AVX2 bodies of the forms must give the native logits.

    python -m tests.emulated_logits FILE.gguf OUT.pt   (prints the CPU and each projection's forms as JSON)
"""

from __future__ import annotations

import json
import sys

import torch


def main() -> None:
    from engine_proc.cpu.features import cpu_features
    from engine_proc.cpu.quantized_linear import Linear
    from engine_proc.loader import load_model
    from tests.engine_proc.models.tiny_llama import run

    path, out = sys.argv[1], sys.argv[2]
    model = load_model(path, dtype=None, quantization="auto")
    forms = sorted({form for module in model.modules() if isinstance(module, Linear) and module.forms is not None
                    for form in module.forms.runs} | set(model.head.runs if model.head is not None else ()))
    ids = torch.arange(0, 49152, 4099)[:12]
    torch.save(run(model, [ids]), out)
    json.dump({"cpu": cpu_features().describe(), "forms": forms}, sys.stdout)


if __name__ == "__main__":
    main()
