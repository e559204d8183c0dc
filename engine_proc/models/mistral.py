"""Mistral (a folder's; llama.cpp converts it to the llama architecture): the Llama decoder, every layer
attending to the last `sliding_window` tokens where the config sets one (v0.1)."""

from engine_proc.models.family import Family
from engine_proc.models.llama import LlamaForCausalLM

FAMILY = Family("mistral", LlamaForCausalLM, hf_model_types=("mistral",))
