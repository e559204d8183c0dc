// The kernels that fused layers call from C++ (moe_experts.cpp, decoder_layers.cpp), and one call for any
// kernel form by its number (form_registry.FUSED_FORMS numbers them).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

at::Tensor paged_decode_attention(
    const at::Tensor& query, const at::Tensor& cache, const at::Tensor& block_table,
    const at::Tensor& row_limits, double scale, const std::optional<at::Tensor>& row_starts,
    const std::optional<at::Tensor>& row_sinks);
at::Tensor paged_decode_attention_items(
    const at::Tensor& query, const at::Tensor& cache, const at::Tensor& block_table,
    const at::Tensor& row_limits, double scale, const std::optional<at::Tensor>& row_starts,
    const std::optional<at::Tensor>& row_sinks, const at::Tensor* given_out, int64_t item_begin, int64_t item_end);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm(const at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& gate_up);
std::vector<at::Tensor> rotary_store_kv(
    const at::Tensor& qkv, const at::Tensor& cos_sin, const at::Tensor& slots, at::Tensor& cache, int64_t num_heads,
    const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm, double eps);
at::Tensor int4_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins);
at::Tensor int4k_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                    const at::Tensor& d, const at::Tensor& dmin);
at::Tensor int5_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& high, const at::Tensor& scales,
                   const at::Tensor& mins);
at::Tensor int5k_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& high, const at::Tensor& scales,
                    const at::Tensor& mins, const at::Tensor& d, const at::Tensor& dmin);
at::Tensor int6k_q8(const at::Tensor& x, const at::Tensor& low, const at::Tensor& high, const at::Tensor& scales,
                    const at::Tensor& d);
at::Tensor int8_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales);
at::Tensor iq4xs_q8(const at::Tensor& x, const at::Tensor& indices, const at::Tensor& scales, const at::Tensor& d);
at::Tensor mxfp4_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& exponents);

// `x` @ a weight packed `p` for the form numbered `form`, its first `width` outputs (contiguous).
inline at::Tensor run_form(int64_t form, const at::Tensor& x, const std::vector<at::Tensor>& p, int64_t width) {
  at::Tensor out;
  switch (form) {
    case 0: out = int4_q8(x, p[0], p[1], p[2]); break;
    case 1: out = int4k_q8(x, p[0], p[1], p[2], p[3], p[4]); break;
    case 2: out = int5_q8(x, p[0], p[1], p[2], p[3]); break;
    case 3: out = int5k_q8(x, p[0], p[1], p[2], p[3], p[4], p[5]); break;
    case 4: out = int6k_q8(x, p[0], p[1], p[2], p[3]); break;
    case 5: out = int8_q8(x, p[0], p[1]); break;
    case 6: out = iq4xs_q8(x, p[0], p[1], p[2]); break;
    case 7: out = mxfp4_q8(x, p[0], p[1]); break;
    default: TORCH_CHECK(false, "run_form: unknown form ", form);
  }
  return out.size(1) == width ? out : out.narrow(1, 0, width).contiguous();
}
