// A mixture-of-experts layer's experts on their kernel forms (moe_experts.cpp), held by the C++ side.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

// One layer's expert packings, converted from Python once: passing a layer's thousand-odd tensors to
// `moe_experts` on every call took a seventh of a one-stream decode step. Each expert is SiLU·up gated,
// or (is_clamped_swiglu) gpt-oss's clamped SwiGLU; the biases, where given, one per expert.
struct MoeExperts {
  int64_t gate_up_form;
  std::vector<std::vector<at::Tensor>> gate_up;
  int64_t down_form;
  std::vector<std::vector<at::Tensor>> down;
  int64_t width;
  std::vector<at::Tensor> gate_up_bias;
  std::vector<at::Tensor> down_bias;
  bool is_clamped_swiglu;

  at::Tensor run(const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights) const;
};

at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights, const MoeExperts& experts);
