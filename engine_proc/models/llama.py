"""Llama-family decoder (Llama, Mistral, SmolLM2, Qwen2, Qwen3, Phi-3) over a flat batch of tokens."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine_proc.cpu.form_registry import KERNEL_FORMS, is_plan_row_invariant
from engine_proc.cpu.greedy_head import GreedyHead
from engine_proc.cpu.kernels import load_cpu_kernels
from engine_proc.cpu.matmul_forms import MatmulForms
from engine_proc.cpu.matmul_plan import TimingBudget, plan_head, plan_linears
from engine_proc.cpu.policy import UNMEASURED, MatmulPolicy
from engine_proc.cpu.quantized_linear import Linear, fused_projection, kernel_form
from engine_proc.cpu.torch_forms import Int8Rows
from engine_proc.cpu.weight_blocks import Blocks, BlocksReader
from engine_proc.models.attention_api import AttentionBackend, HeadNorms
from engine_proc.models.config import ModelConfig
from engine_proc.models.family import Family
from engine_proc.models.moe import Router, SparseMoeBlock
from engine_proc.models.rope import attention_factor, inverse_frequencies

logger = logging.getLogger(__name__)

class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 like Hugging Face's."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.kernels: Any | None = None  # the CPU kernels, for bfloat16 rows (see `LlamaForCausalLM.prepack`)

    def forward(self, x: Tensor) -> Tensor:
        if self.kernels is not None and x.dim() >= 2 and x.dtype == torch.bfloat16:
            # NOTE: per-head norms too ([tokens, heads, head_dim], a projection's slice: copied to rows):
            # torch's sum of squares follows the CPU's vector width, the kernel's is the same on any x86.
            rows = x.reshape(-1, x.shape[-1]).contiguous()
            return self.kernels.rms_norm(rows, self.weight, self.eps).view(x.shape)
        # NOTE: a decode step runs 61 norms, so skip even the no-op conversions of float32,
        # and compute in place in the float32 copy of a 16-bit input (same values, fewer tensors).
        if x.dtype == torch.float32:
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        x_float = x.float()
        x_float.mul_(x_float.pow(2).mean(-1, keepdim=True).add_(self.eps).rsqrt_())
        normed = x_float.to(x.dtype)
        return normed.mul_(self.weight) if self.weight.dtype == x.dtype else self.weight * normed

    def add_forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """(norm(residual + x), residual + x): a block's residual add and the next norm, one kernel
        where it runs (the residual is then updated in place)."""
        if self.kernels is not None and x.dim() == 2 and x.dtype == torch.bfloat16 and x.is_contiguous():
            return self.kernels.add_rms_norm(x, residual, self.weight, self.eps), residual
        residual = residual + x
        return self(residual), residual


class RotaryEmbedding(nn.Module):
    """A (cos, sin) table for every position, looked up once per forward and laid out there as
    (cos, cos, -sin, sin) ("rotate_half" layout) for the step's tokens alone: the whole table in that
    layout would be twice the size (gemma-3-270m's two tables of 32,768 positions: 64 MiB of a 241 MiB file)."""

    cos_sin_cache: Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        cache = torch.empty(config.max_position_embeddings, config.head_dim)
        self.register_buffer("cos_sin_cache", cache, persistent=False)
        self.reset_cache()

    @torch.no_grad()
    def reset_cache(self) -> None:
        """Fill the table (in float32, then cast to the buffer's dtype)."""
        if self.cos_sin_cache.is_meta:
            return
        inv_freq = inverse_frequencies(self.config).to(self.cos_sin_cache.device)
        positions = torch.arange(self.config.max_position_embeddings, device=inv_freq.device).float()
        freqs = torch.outer(positions, inv_freq)
        # NOTE: YaRN's attention factor scales queries and keys, as transformers scales its cos and sin.
        scale = attention_factor(self.config)
        cos, sin = (freqs.cos(), freqs.sin()) if scale == 1.0 else (freqs.cos() * scale, freqs.sin() * scale)
        self.cos_sin_cache.copy_(torch.cat((cos, sin), dim=-1))

    def forward(self, positions: Tensor) -> RotaryRows:
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        return RotaryRows(torch.cat((cos, cos, -sin, sin), dim=-1))


class RotaryRows:
    """The rotary table's rows for one forward's tokens, as the fused kernel and the torch ops take them."""

    def __init__(self, table: Tensor) -> None:
        self.table = table  # [num_tokens, 2 * head_dim]: (cos, cos, -sin, sin)
        # (cos, cos) and (-sin, sin), each [num_tokens, 1, head_dim] to broadcast over heads.
        self.cos, self.sin = table.unsqueeze(1).chunk(2, dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [num_tokens, num_heads, head_dim]: the first and second halves form the pairs.

    With cos = (cos, cos) and sin = (-sin, sin) this is Hugging Face's
    `x * cos + rotate_half(x) * sin` bit for bit, where rotate_half(x) = (-x2, x1): swapping
    the halves is a roll by half the head.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class LlamaAttention(nn.Module):
    """Fused QKV projection, optional per-head q/k norm, rotary, backend attention, output projection."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        qkv_size = config.q_size + 2 * config.kv_size
        self.qkv_proj = Linear(config.hidden_size, qkv_size, bias=config.attention_bias)
        self.o_proj = Linear(config.q_size, config.hidden_size, bias=False)
        # NOTE: per head (Qwen3), or over the whole projection (OLMoE)
        q_width, k_width = (config.head_dim,) * 2 if config.is_qk_norm_per_head else (config.q_size, config.kv_size)
        self.q_norm = RMSNorm(q_width, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(k_width, config.rms_norm_eps) if config.qk_norm else None
        self.has_rope = not (config.no_rope_layers and config.no_rope_layers[layer_idx])
        # NOTE: a folder's Mistral (v0.1) attends to the last `sliding_window` tokens in every layer.
        is_sliding = bool(config.sliding_layers) and config.sliding_layers[layer_idx]
        self.window = config.sliding_window if is_sliding else None
        self.sinks: Tensor | None = None  # a logit per query head that joins its softmax (gpt-oss's, see attention_api)

    def forward(self, hidden: Tensor, rotary: RotaryRows, attn: AttentionBackend) -> Tensor:
        config = self.config
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        value = qkv[:, config.q_size + config.kv_size :].view(num_tokens, -1, config.head_dim)
        # NOTE: without q/k norms, or with per-head ones, the backend may norm, rotate and store K/V in one pass.
        head_norms = None
        if self.q_norm is not None and self.k_norm is not None and config.is_qk_norm_per_head:
            head_norms = HeadNorms(self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        is_fusable = self.has_rope and (self.q_norm is None or head_norms is not None)
        stored = attn.rotate_and_store(self.layer_idx, qkv, rotary.table, head_norms) if is_fusable else None
        query, key = stored if stored is not None else self._rotate(qkv, rotary)
        out = attn.forward(
            self.layer_idx, query, key, value, is_stored=stored is not None, window=self.window, sinks=self.sinks
        )
        return self.o_proj(out.view(num_tokens, config.q_size))

    def _rotate(self, qkv: Tensor, rotary: RotaryRows) -> tuple[Tensor, Tensor]:
        """Queries and keys [num_tokens, heads, head_dim] of the fused projection, normed if configured,
        then rotated (unless the layer attends without rotary embeddings)."""
        config = self.config
        num_heads, num_tokens = config.num_attention_heads, qkv.shape[0]
        # NOTE: queries and keys side by side, so one rotary call covers both.
        query_key = qkv[:, : config.q_size + config.kv_size].view(num_tokens, -1, config.head_dim)
        if self.q_norm is not None and self.k_norm is not None and config.is_qk_norm_per_head:
            query_key = torch.cat(
                (self.q_norm(query_key[:, :num_heads]), self.k_norm(query_key[:, num_heads:])), dim=1
            )
        elif self.q_norm is not None and self.k_norm is not None:
            normed = (self.q_norm(qkv[:, : config.q_size]), self.k_norm(qkv[:, config.q_size : config.q_size + config.kv_size]))
            query_key = torch.cat(normed, dim=1).view(num_tokens, -1, config.head_dim)
        if self.has_rope:
            query_key = apply_rotary(query_key, rotary.cos, rotary.sin)
        return query_key[:, :num_heads], query_key[:, num_heads:]


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward with the gate and up projections fused."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)
        self.kernels: Any | None = None  # the CPU kernels, for bfloat16 activations

    def forward(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up_proj(x)
        if self.kernels is not None and gate_up.dtype == torch.bfloat16:
            return self.down_proj(self.kernels.silu_and_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention block then pre-norm MLP block, each with a residual."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: nn.Module = (
            SparseMoeBlock(config, lambda size: LlamaMLP(config.hidden_size, size))
            if config.has_experts else LlamaMLP(config.hidden_size, config.intermediate_size)
        )

    def forward(
        self, hidden: Tensor, residual: Tensor | None, rotary: RotaryRows, attn: AttentionBackend
    ) -> tuple[Tensor, Tensor]:
        """The block's output and the residual stream, not yet added (the next norm adds them)."""
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm.add_forward(hidden, residual)
        hidden = self.self_attn(hidden, rotary, attn)
        hidden, residual = self.post_attention_layernorm.add_forward(hidden, residual)
        return self.mlp(hidden), residual


class RowEmbedding(nn.Module):
    """An embedding table read from elsewhere a row at a time (a GGUF's token embedding, through a
    mapping of the file): only the rows tokens ask for are ever dequantized or resident."""

    def __init__(self, rows: Callable[[np.ndarray], Tensor], dtype: torch.dtype) -> None:
        super().__init__()
        self.rows = rows
        self.dtype = dtype

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.rows(input_ids.cpu().numpy()).to(device=input_ids.device, dtype=self.dtype)


class LlamaModel(nn.Module):
    """Embedding, decoder layers and final norm (Hugging Face's `model.` prefix); a family's subclass may
    bring its own layers (`layer_class`)."""

    layer_class: Callable[[ModelConfig, int], nn.Module] = LlamaDecoderLayer

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        # NOTE: given its (empty) weight, so it is not randomly initialised: on the meta device
        # torch's `normal_` imports torch._dynamo, 1.5 s of every engine's start.
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, _weight=torch.empty(config.vocab_size, config.hidden_size)
        )
        self.rotary_emb = RotaryEmbedding(config)
        self.layers = nn.ModuleList(type(self).layer_class(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # NOTE: set where the table is read from the file a row at a time; `embed_tokens.weight` then
        # holds no values (only its shape and dtype, for a tied head's).
        self.embed_rows: RowEmbedding | None = None


class LlamaForCausalLM(nn.Module):
    """A Llama-family causal LM: hidden states for a flat batch, then logits for chosen rows.

    Another family (gemma3.py) brings its own decoder (`model_class`) and `forward`, and keeps
    the rest: the output head, its plan and the matmul forms."""

    int8_lm_head_weight: Tensor | None
    int8_lm_head_scales: Tensor | None
    model_class: Callable[[ModelConfig], nn.Module] = LlamaModel

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = type(self).model_class(config)
        # NOTE: no module at all when tied, so moving the model (e.g. `to_empty`) cannot untie it.
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        # NOTE: buffers, so that freeing the weights (`to_empty(device="meta")`) frees these too.
        self.register_buffer("int8_lm_head_weight", None, persistent=False)
        self.register_buffer("int8_lm_head_scales", None, persistent=False)
        # NOTE: the output head's weight as blocks a kernel form multiplies (the file's own, or rounded to
        # Q8_0 ones: see loader/model_weights.py), kept until `prepack` packs them.
        self.head_blocks: Blocks | BlocksReader | None = None
        # NOTE: False where the head's weight was not loaded as values (a kernel form of its blocks serves
        # it, see loader/model_weights.py): no form is made from `lm_head_weight` then.
        self.has_dense_head = True
        # NOTE: the output head's weight in the forms chosen for this machine (see `prepack`).
        self.head: MatmulForms | None = None
        self.greedy_head: GreedyHead | None = None
        self.choices: dict[str, str] = {}  # what runs each piece of a step here, for the log and /version
        # NOTE: whether each row's logits depend on its own tokens alone, whatever shares its step
        # (every matmul one row-invariant form, the norms the C++ kernels' rows); set by `prepack`.
        self.is_batch_invariant = False
        self.num_saved_plans = 0  # matmul plans an earlier load here measured (see saved_plans)
        # NOTE: every layer in one C++ call for steps of one-token decodes up to `max_fused_tokens` (see `_fuse_layers`).
        self.fused_layers: Any | None = None
        self.max_fused_tokens = 0

    def forward(self, input_ids: Tensor, positions: Tensor, attn: AttentionBackend) -> Tensor:
        """Final-normed hidden states [num_tokens, hidden_size] for the tokens of several sequences."""
        embed = self.model.embed_rows or self.model.embed_tokens
        hidden = embed(input_ids)
        rotary = self.model.rotary_emb(positions)
        if self.fused_layers is not None and hidden.shape[0] <= self.max_fused_tokens and rotary.table.dtype == hidden.dtype:
            config = self.config
            step = attn.decode_step(config.num_attention_heads // config.num_key_value_heads)
            if step is not None:
                hidden, residual = self.fused_layers(hidden, rotary.table, *step)
                return self.model.norm.add_forward(hidden, residual)[0]
        residual: Tensor | None = None
        for layer in self.model.layers:
            hidden, residual = layer(hidden, residual, rotary, attn)
        if residual is None:
            return self.model.norm(hidden)
        return self.model.norm.add_forward(hidden, residual)[0]

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """Float32 logits [n, vocab_size] for hidden states [n, hidden_size]."""
        return self.compute_raw_logits(hidden).float()

    def compute_raw_logits(self, hidden: Tensor) -> Tensor:
        """Logits in the output head's dtype: greedy picks need no float32 copy of [n, vocab_size]."""
        if self.head is not None:
            return self.head(hidden)
        return F.linear(hidden, self.lm_head_weight)

    def compute_greedy_ids(self, hidden: Tensor) -> Tensor | None:
        """Each row's greedy pick (the argmax of `compute_raw_logits`, first maximum) without writing
        the logits out, where the fused head kernel runs and pays at this many rows; else None."""
        if self.greedy_head is None or hidden.shape[0] < self.greedy_head.min_rows:
            return None
        return self.greedy_head.greedy_ids(hidden)

    @torch.no_grad()
    def prepack(self, policy: MatmulPolicy = UNMEASURED) -> None:
        """Keeps every matmul's weight in the forms this machine runs (oneDNN's bfloat16 layout, int8
        rows, float32 copies, the kernels' packings: see matmul_forms), planned as the `policy` says (timed
        at load to pick one per batch size, or batch-invariant: one row-invariant form for all sizes
        wherever a weight has one), and hands the norms and MLPs the fused CPU kernels where those run."""
        weight = self.lm_head_weight
        is_cpu = weight.device.type == "cpu"
        kernels = load_cpu_kernels() if weight.dtype == torch.bfloat16 and is_cpu else None
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.kernels = kernels if module.weight.numel() % 16 == 0 else None
            elif isinstance(module, LlamaMLP):
                module.kernels = kernels if module.down_proj.in_features % 16 == 0 else None
            elif isinstance(module, Router):
                module.kernels = kernels
            elif isinstance(module, Linear):
                module.kernels = kernels
        kernel_forms = tuple(spec.name for spec in KERNEL_FORMS) if kernels is not None else ()
        forms = ("packed", "int8", "float32", *kernel_forms) if is_cpu else ()
        linears = [(name, module) for name, module in self.named_modules() if isinstance(module, Linear)]
        self.choices = {}
        budget = TimingBudget()
        self.choices["linears"], num_saved = plan_linears(linears, forms, policy, budget)
        self.choices["head"], is_head_saved = self._plan_head(forms, kernels, policy, budget)
        self.num_saved_plans = num_saved + is_head_saved
        self.greedy_head = None
        if kernels is not None and not policy.is_batch_invariant and self.has_dense_head:
            # NOTE: its sums run in AMX tiles, in another order than the head's form: a greedy row's
            # pick would depend on whether the other rows let the step take it.
            self.greedy_head = GreedyHead.if_faster(kernels, weight, self.compute_raw_logits)
        moe_blocks = [module for module in self.modules() if isinstance(module, SparseMoeBlock)]
        for block in moe_blocks:
            block.fuse(kernels)
        if moe_blocks:
            is_fused = all(block.fused is not None for block in moe_blocks)
            self.choices["experts"] = "one C++ call a layer (moe_experts)" if is_fused else "a torch loop over experts"
        self.choices["norms"] = "zeroserve C++ kernels" if kernels is not None else "torch ops"
        if self.greedy_head is not None:
            self.choices["greedy"] = "from the head (AMX kernel)"
        self._fuse_layers(kernels)
        matmuls = [linear.forms for _, linear in linears] + [self.head]
        self.is_batch_invariant = kernels is not None and all(
            matmul is not None and is_plan_row_invariant(matmul.plan) for matmul in matmuls
        )

    def _fuse_layers(self, kernels: Any | None) -> None:
        """Runs the layers in one C++ call (the kernels' `DecoderLayers`) for steps of one-token decodes where every
        layer is a plain dense Llama layer whose pieces all take the C++ kernels at one token (each projection a
        kernel form of FUSED_FORMS), up to as many tokens as every projection's plan keeps that form."""
        self.fused_layers, self.max_fused_tokens = None, 0
        if kernels is None or type(self).forward is not LlamaForCausalLM.forward:
            return
        layers, max_tokens = [], sys.maxsize
        for layer in self.model.layers:
            fused = _fused_layer(kernels, self.config, layer)
            if fused is None:
                return
            layers.append(fused[0])
            max_tokens = min(max_tokens, fused[1])
        config = self.config
        self.fused_layers = kernels.DecoderLayers(layers, config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        self.max_fused_tokens = max_tokens
        self.choices["decode"] = "one C++ call for all layers (decoder_layers)"

    def _plan_head(
        self, forms: tuple[str, ...], kernels: Any | None, policy: MatmulPolicy, budget: TimingBudget
    ) -> tuple[str, int]:
        """The output head's forms (a kernel form of `head_blocks` among them) and its plan (plan_head),
        the blocks and int8 rows freed once the head's forms hold what its plan uses."""
        int8_head = None
        if self.int8_lm_head_weight is not None:
            int8_head = Int8Rows(self.int8_lm_head_weight, self.int8_lm_head_scales)
        self.head = MatmulForms(self.lm_head_weight, has_dense=self.has_dense_head)
        if kernels is not None and self.head_blocks is not None:
            for spec in KERNEL_FORMS:
                if (run := kernel_form(kernels, spec, self.head_blocks)) is not None:
                    self.head.add(spec.name, run)
        plan = plan_head(self.head, forms, int8_head, policy, budget)
        self.int8_lm_head_weight = self.int8_lm_head_scales = None
        self.head_blocks = None
        return plan

    def unpack(self) -> None:
        """Drops the reordered copies (before the weights are freed)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.unpack()
            elif isinstance(module, SparseMoeBlock):
                module.fused = None
        self.fused_layers, self.max_fused_tokens = None, 0
        self.head = None
        self.greedy_head = None

    def weight_tensors(self) -> list[Tensor]:
        """Every tensor the weights hold, in every form kept: parameters and buffers, torch's forms' copies,
        the C++ kernels' packings (a weight loaded as blocks alone holds no values: see `valueless`)."""
        held = [*self.parameters(), *self.buffers()]
        for module in self.modules():
            if isinstance(module, Linear) and module.forms is not None:
                held += module.forms.tensors()
        if self.head is not None:
            held += self.head.tensors()
        if self.greedy_head is not None:
            held.append(self.greedy_head.weight)
        return held

    @property
    def lm_head_weight(self) -> Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def set_int8_lm_head(self, weight: Tensor) -> None:
        """Also keep the output head (float32 `weight`, as loaded) as int8 rows for few-row logits."""
        rows = Int8Rows.quantize(weight.to(self.lm_head_weight.device), self.lm_head_weight.dtype)
        self.int8_lm_head_weight, self.int8_lm_head_scales = rows.weight, rows.scales


def _fused_layer(kernels: Any, config: ModelConfig, layer: nn.Module) -> tuple[Any, int] | None:
    """A plain dense layer as the kernels' `DecoderLayer` (see `LlamaForCausalLM._fuse_layers`), and up to how many
    tokens its projections' plans keep the forms it holds; None where a piece of it would not run the C++ kernels."""
    if type(layer) is not LlamaDecoderLayer or type(layer.self_attn) is not LlamaAttention or type(layer.mlp) is not LlamaMLP:
        return None
    attn, mlp = layer.self_attn, layer.mlp
    norms = [layer.input_layernorm, layer.post_attention_layernorm]
    if attn.q_norm is not None and attn.k_norm is not None:
        if not config.is_qk_norm_per_head:
            return None
        norms += [attn.q_norm, attn.k_norm]
    if any(norm.kernels is None or norm.weight.dtype != torch.bfloat16 for norm in norms) or mlp.kernels is None:
        return None
    if not attn.has_rope or attn.window is not None or attn.sinks is not None:
        return None
    projections = []
    for linear in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
        projection = fused_projection(kernels, linear.forms) if linear.forms is not None else None
        if projection is None:
            return None
        projections.append(projection)
    (qkv, _), (o, _), (gate_up, _), (down, _) = projections
    q_norm, k_norm = (attn.q_norm, attn.k_norm) if attn.q_norm is not None and attn.k_norm is not None else (None, None)
    fused = kernels.DecoderLayer(
        layer.input_layernorm.weight, qkv, None if q_norm is None else q_norm.weight, None if k_norm is None else k_norm.weight,
        o, layer.post_attention_layernorm.weight, gate_up, down, layer.input_layernorm.eps, 0.0 if q_norm is None else q_norm.eps,
    )
    return fused, min(max_tokens for _, max_tokens in projections)


FAMILY = Family("llama", LlamaForCausalLM, hf_model_types=("llama",), gguf_architectures=("llama",), is_gguf_permuted=True)
