"""Phi-3: the Llama decoder; its checkpoints (folder and GGUF) hold Q/K/V and gate/up fused, as the model runs them."""

from engine_proc.models.family import Family
from engine_proc.models.llama import LlamaForCausalLM

FAMILY = Family(
    "phi3", LlamaForCausalLM, hf_model_types=("phi3",), gguf_architectures=("phi3",), is_fused_checkpoint=True,
    gguf_layer_names={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
)
