// A dense decoder's layers for a step of one-token decodes in one call (decoder_layers.cpp), held by the C++ side.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

// One thread's share of a projection: a run of blocks of 16 outputs of each part (its packings' slices), and the
// output columns they fill.
struct ProjectionShare {
  std::vector<int64_t> parts;
  std::vector<std::vector<at::Tensor>> packed;
  std::vector<int64_t> widths;  // the slice's outputs, padding included
  std::vector<int64_t> columns;  // the first output column it fills
  std::vector<int64_t> num_columns;  // how many it fills
};

// One projection on kernel forms: its parts side by side (each one form's run, numbered as
// form_registry.FUSED_FORMS numbers them, with its packing and its number of outputs), then its bias.
struct Projection {
  std::vector<int64_t> forms;
  std::vector<std::vector<at::Tensor>> packed;
  std::vector<int64_t> widths;
  std::optional<at::Tensor> bias;
  std::vector<ProjectionShare> shares;  // by thread (see `share`)

  at::Tensor operator()(const at::Tensor& x) const;
  int64_t width() const;
  // Splits the outputs among `num_threads` threads, each part's blocks in even runs.
  void share(int64_t num_threads);
  // Thread `thread`'s share of x @ the weight (and its bias), written into its columns of `out` [M, width()].
  void run_share(const at::Tensor& x, at::Tensor& out, int64_t thread) const;
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
  int64_t num_threads = 1;  // the threads the projections are shared among (`share`)

  // Shares every projection among `threads` threads where every layer has the same widths (else runs `serial`).
  void share(int64_t threads);
  std::vector<at::Tensor> run(const at::Tensor& hidden, const at::Tensor& cos_sin, const at::Tensor& slots,
                              const std::vector<at::Tensor>& caches, const at::Tensor& block_table,
                              const at::Tensor& row_limits, double scale) const;
  std::vector<at::Tensor> serial(const at::Tensor& hidden, const at::Tensor& cos_sin, const at::Tensor& slots,
                                 const std::vector<at::Tensor>& caches, const at::Tensor& block_table,
                                 const at::Tensor& row_limits, double scale) const;
};
