"""The shape of a decoder-only transformer, as the engine's model code needs it."""

from __future__ import annotations

from dataclasses import dataclass

from proto.model_support import ARCHITECTURES as SUPPORTED_ARCHITECTURES

LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyperparameters of a Llama-family model, validated on construction."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    qk_norm: bool = False
    rope_scaling: tuple[tuple[str, float | str], ...] | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    hidden_act: str = "silu"  # the MLP's gate activation: "silu" or "gelu_tanh"
    # NOTE: Gemma 3's local layers attend to the last `sliding_window` tokens only, with their own
    # rotary base; `sliding_layers` says which layers (all global where empty).
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()
    local_rope_theta: float | None = None
    query_pre_attn_scalar: float | None = None  # softmax scale is its inverse square root (else head_dim's)
    is_qk_norm_per_head: bool = True  # q/k norms over each head (Qwen3), else over the whole projection (OLMoE)
    no_rope_layers: tuple[bool, ...] = ()  # layers that attend without rotary embeddings (SmolLM3's every fourth)
    # NOTE: mixture-of-experts layers where `num_experts` > 0: each token's `num_experts_per_tok` experts of
    # the router's softmax (their weights renormalised to sum 1 where `norm_topk_prob`), each a gated MLP of
    # `expert_intermediate_size`.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's shared expert, gated by its own sigmoid (0: none)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            supported = ", ".join(SUPPORTED_ARCHITECTURES)
            raise ValueError(f"unsupported architecture {self.architecture!r}; supported: {supported}")
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError("rms_norm_eps and rope_theta must be positive")
        if any(token_id < 0 for token_id in self.eos_token_ids):
            raise ValueError(f"negative eos token id in {self.eos_token_ids}")
        if self.rope_scaling is not None:
            self._validate_rope_scaling(dict(self.rope_scaling))
        self._validate_layers()

    def _validate_layers(self) -> None:
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"unsupported hidden_act {self.hidden_act!r}; supported: silu, gelu_tanh")
        if self.sliding_layers and len(self.sliding_layers) != self.num_hidden_layers:
            raise ValueError(f"sliding_layers names {len(self.sliding_layers)} layers of {self.num_hidden_layers}")
        if any(self.sliding_layers) and not (self.sliding_window and self.sliding_window > 0):
            raise ValueError(f"sliding layers need a positive sliding_window, got {self.sliding_window}")
        if self.no_rope_layers and len(self.no_rope_layers) != self.num_hidden_layers:
            raise ValueError(f"no_rope_layers names {len(self.no_rope_layers)} layers of {self.num_hidden_layers}")
        if self.num_experts and not (0 < self.num_experts_per_tok <= self.num_experts and self.expert_intermediate_size > 0):
            raise ValueError(
                f"{self.num_experts} experts need 0 < num_experts_per_tok ({self.num_experts_per_tok}) <= num_experts "
                f"and a positive expert_intermediate_size ({self.expert_intermediate_size})"
            )

    @staticmethod
    def _validate_rope_scaling(params: dict[str, float | str]) -> None:
        rope_type = params.get("rope_type")
        if rope_type == "linear":
            if not isinstance(params.get("factor"), (int, float)) or float(params["factor"]) <= 0:
                raise ValueError("linear rope scaling needs a positive numeric factor")
            return
        if rope_type == "yarn":
            if not isinstance(params.get("original_max_position_embeddings"), (int, float)):
                raise ValueError("yarn rope scaling needs a numeric original_max_position_embeddings")
            if "factor" in params and not (isinstance(params["factor"], (int, float)) and float(params["factor"]) > 0):
                raise ValueError("yarn rope scaling needs a positive numeric factor")
            return
        if rope_type != "llama3":
            raise ValueError(f"unsupported rope scaling type {rope_type!r}; supported: llama3, linear, yarn")
        missing = [key for key in LLAMA3_ROPE_KEYS if not isinstance(params.get(key), (int, float))]
        if missing:
            raise ValueError(f"llama3 rope scaling is missing numeric {', '.join(missing)}")
        if float(params["high_freq_factor"]) <= float(params["low_freq_factor"]):
            raise ValueError("llama3 rope scaling needs high_freq_factor > low_freq_factor")

    @property
    def has_experts(self) -> bool:
        return self.num_experts > 0

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def q_size(self) -> int:
        """Width of the query projection's output."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (and of the value) projection's output."""
        return self.num_key_value_heads * self.head_dim

    @property
    def rope_scaling_params(self) -> dict[str, float | str]:
        """The rope scaling parameters as a dict, empty when there is no scaling."""
        return dict(self.rope_scaling) if self.rope_scaling is not None else {}
