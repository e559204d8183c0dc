// A dense decoder's layers for a step of one-token decodes in one call (engine_proc/models/llama.py's
// `LlamaForCausalLM.fuse_layers`): the kernels the layers' modules call one by one from Python (norms,
// each projection's kernel forms, rotary with the K/V write, paged attention, SiLU·up), on the same
// inputs in the same order, so the same bits, without the interpreter between them.
#include "decoder_layers.h"

#include "kernel_forms.h"

at::Tensor Projection::operator()(const at::Tensor& x) const {
  const int64_t num_parts = static_cast<int64_t>(forms.size());
  at::Tensor out;
  if (num_parts == 1) {
    out = run_form(forms[0], x, packed[0], widths[0]);
  } else {
    std::vector<at::Tensor> outs;
    outs.reserve(num_parts);
    for (int64_t i = 0; i < num_parts; ++i) outs.push_back(run_form(forms[i], x, packed[i], widths[i]));
    out = at::cat(outs, -1);
  }
  return bias ? out + *bias : out;
}

// hidden [T, H] bf16 (the token embeddings), cos_sin [T, 2D] (rotary_store_kv's table), slots [T] (each
// token's cache slot), caches: each layer's [2, KVH, num_slots, D], block_table [T, max_blocks] and row_limits
// [T, group] (paged_decode_attention's, one sequence a token) -> {the last layer's output, the residual
// stream}, not yet added (the final norm adds them, as after LlamaDecoderLayer).
std::vector<at::Tensor> DecoderLayers::run(const at::Tensor& hidden, const at::Tensor& cos_sin, const at::Tensor& slots,
                                           const std::vector<at::Tensor>& caches, const at::Tensor& block_table,
                                           const at::Tensor& row_limits, double scale) const {
  TORCH_CHECK(caches.size() == layers.size(), "decoder_layers: a cache a layer");
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous());
  const int64_t num_tokens = hidden.size(0);
  const int64_t group = num_heads / num_kv_heads;
  at::Tensor h = hidden;
  at::Tensor residual;
  for (size_t i = 0; i < layers.size(); ++i) {
    const DecoderLayer& layer = layers[i];
    at::Tensor cache = caches[i];
    at::Tensor x;
    if (i == 0) {
      x = rms_norm(h, layer.input_norm, layer.eps);
      residual = h;
    } else {
      x = add_rms_norm(h, residual, layer.input_norm, layer.eps);
    }
    const auto query_key = rotary_store_kv(layer.qkv(x), cos_sin, slots, cache, num_heads, layer.q_norm, layer.k_norm, layer.head_eps);
    const auto rows = query_key[0].reshape({num_tokens, num_kv_heads, group, head_dim}).contiguous();
    const auto attended = paged_decode_attention(rows, cache, block_table, row_limits, scale, std::nullopt, std::nullopt);
    x = add_rms_norm(layer.o(attended.reshape({num_tokens, num_heads * head_dim})), residual, layer.post_norm, layer.eps);
    h = layer.down(silu_and_mul(layer.gate_up(x)));
  }
  return {h, residual};
}
