// A mixture-of-experts layer's experts on their kernel forms (moe_experts.cpp), held by the C++ side.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights,
                       int64_t gate_up_form, const std::vector<std::vector<at::Tensor>>& gate_up,
                       int64_t down_form, const std::vector<std::vector<at::Tensor>>& down, int64_t width);

// One layer's expert packings, converted from Python once: passing a layer's thousand-odd tensors to
// `moe_experts` on every call took a seventh of a one-stream decode step.
struct MoeExperts {
  int64_t gate_up_form;
  std::vector<std::vector<at::Tensor>> gate_up;
  int64_t down_form;
  std::vector<std::vector<at::Tensor>> down;
  int64_t width;

  at::Tensor run(const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights) const;
};
