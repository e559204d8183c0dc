"""Mixture-of-experts layers: a router picks each token's experts, each expert a gated MLP on the file's own
blocks (its projections are Linear layers like any other, so they run the same row-invariant kernel forms).

A token's output never depends on which other tokens share the step: its router logits are summed in one
fixed order (the C++ kernel's `router_logits`), its experts' rows run on row-invariant forms, and its
experts' outputs are added in the order the router ranked them, in float32 (as llama.cpp adds them).
Where every expert's projections run one kernel form each, the C++ kernels' `moe_experts` does all of a
step's experts in one call, with the same bits as the loop here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine_proc.cpu.form_registry import FORMS, FUSED_FORMS
from engine_proc.cpu.quantized_linear import KernelRun
from engine_proc.models.config import ModelConfig
from engine_proc.models.family import Fields, MetadataReader


class Router(nn.Module):
    """A token's logit for each expert from its hidden state, in float32: its weight stays float32 whatever
    dtype the model takes (llama.cpp's files hold it so), its sums in one fixed order where the kernels run;
    a bias (gpt-oss's) added after them, in float32 too."""

    def __init__(self, hidden_size: int, num_experts: int, has_bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.bias = nn.Parameter(torch.empty(num_experts)) if has_bias else None
        self.kernels: Any | None = None  # the CPU kernels (see `LlamaForCausalLM.prepack`)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Router:
        super()._apply(fn, recurse)
        for param in (self.weight, self.bias):
            if param is not None and param.dtype != torch.float32:
                param.data = param.data.float()
        return self

    def forward(self, x: Tensor) -> Tensor:
        rows = x.float().contiguous()
        if self.kernels is not None and rows.shape[1] % 16 == 0:
            logits = self.kernels.router_logits(rows, self.weight)
            return logits if self.bias is None else logits + self.bias
        return F.linear(rows, self.weight, self.bias)


def route(
    logits: Tensor, num_chosen: int, is_renormalised: bool, is_softmax_of_chosen: bool = False
) -> tuple[Tensor, Tensor]:
    """(weights, expert ids) [tokens, num_chosen] of each token's highest softmax probabilities, highest
    first; renormalised to sum 1 where `is_renormalised`. With `is_softmax_of_chosen` (gpt-oss's order): the
    highest logits, their weights the softmax over those alone."""
    if is_softmax_of_chosen:
        chosen, expert_ids = logits.topk(num_chosen, dim=-1)
        return chosen.softmax(dim=-1), expert_ids
    probabilities = logits.softmax(dim=-1)
    weights, expert_ids = probabilities.topk(num_chosen, dim=-1)
    if is_renormalised:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, expert_ids


class SparseMoeBlock(nn.Module):
    """A layer's feed-forward as a mixture of experts (Hugging Face's `mlp.gate` and `mlp.experts.N`)."""

    # NOTE: a family's subclass (gpt_oss.py) may give the router a bias and choose experts as gpt-oss does.
    has_router_bias = False
    is_softmax_of_chosen = False
    is_clamped_swiglu = False  # gpt-oss's expert activation (gpt_oss.py), where `fuse` runs the experts

    def __init__(self, config: ModelConfig, expert: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.num_chosen = config.num_experts_per_tok
        self.is_renormalised = config.norm_topk_prob
        self.gate = Router(config.hidden_size, config.num_experts, has_bias=self.has_router_bias)
        self.experts = nn.ModuleList(expert(config.expert_intermediate_size) for _ in range(config.num_experts))
        self.width = config.expert_intermediate_size
        self.fused: Any | None = None  # the kernels' MoeExperts holding every expert's packings (see `fuse`)
        # NOTE: Qwen2-MoE's shared expert runs for every token, weighted by sigmoid(its gate's logit)
        shared = config.shared_expert_intermediate_size
        self.shared_expert = expert(shared) if shared else None
        self.shared_expert_gate = Router(config.hidden_size, 1) if shared else None

    def fuse(self, kernels: Any | None) -> None:
        """Runs the experts through the kernels' `MoeExperts` where every expert's gate/up and down projections
        each run one kernel form of FUSED_FORMS at every size (a batch-invariant plan), the same for all
        experts, with biases on all experts' projections or on none."""
        self.fused = None
        if kernels is None or self.width % 16:
            return
        fused = []
        for name in ("gate_up_proj", "down_proj"):
            runs = [_planned_run(getattr(expert, name)) for expert in self.experts]
            forms = {run.form for run in runs if run is not None}
            biases = [run.bias for run in runs if run is not None and run.bias is not None]
            if None in runs or len(forms) != 1 or len(biases) not in (0, len(runs)):
                return
            fused.append((FUSED_FORMS.index(forms.pop()), [run.packed for run in runs if run is not None], biases))
        (gate_up_form, gate_up, gate_up_bias), (down_form, down, down_bias) = fused
        self.fused = kernels.MoeExperts(
            gate_up_form, gate_up, down_form, down, self.width, gate_up_bias, down_bias, self.is_clamped_swiglu
        )

    def forward(self, x: Tensor) -> Tensor:
        out = self._experts(x)
        if self.shared_expert is None or self.shared_expert_gate is None:
            return out
        weight = torch.sigmoid(self.shared_expert_gate(x)).to(x.dtype)
        return out + weight * self.shared_expert(x)

    def _experts(self, x: Tensor) -> Tensor:
        """The chosen experts' outputs, each times its router weight, added."""
        weights, expert_ids = route(self.gate(x), self.num_chosen, self.is_renormalised, self.is_softmax_of_chosen)
        if self.fused is not None and x.dtype == torch.bfloat16:
            return self.fused(x.contiguous(), expert_ids, weights.float())
        num_tokens, hidden_size = x.shape
        # NOTE: the step's (token, rank) pairs grouped by expert: each expert runs once, on its tokens' rows.
        flat_ids = expert_ids.flatten()
        pairs_by_expert = flat_ids.argsort(stable=True)
        counts = torch.bincount(flat_ids, minlength=len(self.experts)).tolist()
        outputs = torch.empty(num_tokens * self.num_chosen, hidden_size, dtype=torch.float32, device=x.device)
        flat_weights = weights.flatten().unsqueeze(1)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            pairs = pairs_by_expert[start : start + count]
            start += count
            outputs[pairs] = self.experts[expert](x[pairs // self.num_chosen]).float() * flat_weights[pairs]
        by_rank = outputs.view(num_tokens, self.num_chosen, hidden_size)
        summed = by_rank[:, 0].clone()
        for rank in range(1, self.num_chosen):
            summed += by_rank[:, rank]
        return summed.to(x.dtype)


def _planned_run(linear: nn.Module) -> KernelRun | None:
    """The kernel run a projection's plan takes at every size, where that is one of FUSED_FORMS."""
    forms = getattr(linear, "forms", None)
    if forms is None or len(forms.plan) != 1 or forms.plan[0][1] not in FUSED_FORMS:
        return None
    run = forms.runs[forms.plan[0][1]]
    return run if isinstance(run, KernelRun) and FORMS[run.form].is_row_invariant else None


def hf_expert_fields(raw: Mapping[str, Any], fields: Fields, *, is_renormalised: bool | None = None) -> Fields:
    """The expert fields of a Hugging Face config (`num_experts` or `num_local_experts`, ...); `is_renormalised`
    where the family fixes it, else the config's `norm_topk_prob`."""
    if raw.get("mlp_only_layers") or raw.get("decoder_sparse_step", 1) != 1:
        raise ValueError("dense layers among the expert layers (mlp_only_layers, decoder_sparse_step) are not supported")
    num_experts = raw.get("num_experts") or raw.get("num_local_experts") or 0
    return {
        **fields,
        "num_experts": num_experts,
        "num_experts_per_tok": raw.get("num_experts_per_tok", 0),
        "expert_intermediate_size": raw.get("moe_intermediate_size") or raw["intermediate_size"],
        "norm_topk_prob": bool(raw.get("norm_topk_prob", False)) if is_renormalised is None else is_renormalised,
        "shared_expert_intermediate_size": raw.get("shared_expert_intermediate_size") or 0,
    }


def gguf_expert_fields(read: MetadataReader, fields: Fields, *, is_renormalised: bool) -> Fields:
    """The expert fields of a GGUF's metadata (llama.cpp fixes per architecture whether weights are renormalised)."""
    return {
        **fields,
        "num_experts": int(read("expert_count", 0)),
        "num_experts_per_tok": int(read("expert_used_count", 0)),
        "expert_intermediate_size": int(read("expert_feed_forward_length", fields["intermediate_size"])),
        "norm_topk_prob": is_renormalised,
        "shared_expert_intermediate_size": int(read("expert_shared_feed_forward_length", 0)),
    }
