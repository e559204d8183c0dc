// A dense decoder's layers for a step of one-token decodes in one call (decoder_layers.cpp), held by the C++ side.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

// One projection on kernel forms: its parts side by side (each one form's run, numbered as
// form_registry.FUSED_FORMS numbers them, with its packing and its number of outputs), then its bias.
struct Projection {
  std::vector<int64_t> forms;
  std::vector<std::vector<at::Tensor>> packed;
  std::vector<int64_t> widths;
  std::optional<at::Tensor> bias;

  at::Tensor operator()(const at::Tensor& x) const;
};

// A pre-norm attention block then a pre-norm SwiGLU block, each with a residual (models/llama.py's
// LlamaDecoderLayer); q_norm and k_norm: per-head norms (Qwen3's), or none.
struct DecoderLayer {
  at::Tensor input_norm;
  Projection qkv;
  std::optional<at::Tensor> q_norm;
  std::optional<at::Tensor> k_norm;
  Projection o;
  at::Tensor post_norm;
  Projection gate_up;
  Projection down;
  double eps;
  double head_eps;
};

// Every layer of the model, run over a step whose tokens are each a decode's one new token: a Python
// call a layer's every kernel cost a third of a small model's one-stream step.
struct DecoderLayers {
  std::vector<DecoderLayer> layers;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;

  std::vector<at::Tensor> run(const at::Tensor& hidden, const at::Tensor& cos_sin, const at::Tensor& slots,
                              const std::vector<at::Tensor>& caches, const at::Tensor& block_table,
                              const at::Tensor& row_limits, double scale) const;
};
