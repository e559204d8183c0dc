// Fused element-wise layers for bfloat16 activations (x86 CPUs, AVX-512 BF16 or AVX2): one pass
// over the rows instead of one torch op per step of the formula, with the same roundings to
// bfloat16 as those ops (SiLU·up, the residual add and rotary bit for bit; RMSNorm sums its
// squares in another order, so now and then a value lands one bfloat16 step away).
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include "vec16.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

using namespace zeroserve;

namespace {

// One row's weight * bf16(x / rms(x)) into `out` (x: `hidden` bf16 values).
inline void rms_norm_row(const uint16_t* row, const uint16_t* w, uint16_t* out, int64_t hidden, float eps) {
  V16 sum = zero16();
  for (int64_t i = 0; i < hidden; i += 16) { const V16 v = load_bf16(row + i); sum = fmadd(v, v, sum); }
  const float inv = 1.0f / std::sqrt(reduce_add(sum) / static_cast<float>(hidden) + eps);
  const V16 scale = set16(inv);
  for (int64_t i = 0; i < hidden; i += 16) store_bf16(out + i, round_bf16(load_bf16(row + i) * scale) * load_bf16(w + i));
}

void check_rows(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16 && x.is_contiguous() && weight.is_contiguous());
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 16 == 0 && weight.numel() == x.size(1));
}

}  // namespace

// x [M, H] bf16 contiguous, weight [H] bf16: weight * bf16(x / rms(x)), computed as Hugging Face does.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, weight);
  const int64_t rows = x.size(0), hidden = x.size(1);
  auto out = at::empty_like(x);
  const auto* in = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* w = reinterpret_cast<const uint16_t*>(weight.data_ptr());
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) rms_norm_row(in + r * hidden, w, o + r * hidden, hidden, static_cast<float>(eps));
  });
  return out;
}

// residual += x (rounded to bf16, in place), then the RMSNorm of the sum: a layer's residual
// add and the next norm in one pass. x, residual [M, H] bf16 contiguous.
at::Tensor add_rms_norm(const at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  check_rows(residual, weight);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.is_contiguous() && x.sizes() == residual.sizes());
  const int64_t rows = x.size(0), hidden = x.size(1);
  auto out = at::empty_like(x);
  const auto* in = reinterpret_cast<const uint16_t*>(x.data_ptr());
  auto* res = reinterpret_cast<uint16_t*>(residual.data_ptr());
  const auto* w = reinterpret_cast<const uint16_t*>(weight.data_ptr());
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      uint16_t* row = res + r * hidden;
      for (int64_t i = 0; i < hidden; i += 16) store_bf16(row + i, load_bf16(row + i) + load_bf16(in + r * hidden + i));
      rms_norm_row(row, w, o + r * hidden, hidden, static_cast<float>(eps));
    }
  });
  return out;
}

// Rotary on the queries and keys of a fused projection's output, and the keys and values
// stored in a layer's paged cache, in one pass. qkv [T, (H + 2 KVH) * D] bf16 contiguous;
// cos_sin [T, 2D] bf16, each token's (cos, cos, -sin, sin) row; slots [T] int64; cache
// [2, KVH, S, D] bf16 contiguous. Returns the rotated queries [T, H, D] and keys [T, KVH, D].
// Each value as torch's `x * cos + x.roll(D / 2) * sin` in bf16 rounds it: both products
// rounded, then their sum.
// With q_norm and k_norm ([D] bf16: Qwen3's per-head norms), each query and key head is first normed
// as rms_norm normalises a row, then rotated: the bits of rms_norm on the heads, then the rotary.
std::vector<at::Tensor> rotary_store_kv(
    const at::Tensor& qkv, const at::Tensor& cos_sin, const at::Tensor& slots, at::Tensor& cache, int64_t num_heads,
    const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm, double eps) {
  TORCH_CHECK(qkv.scalar_type() == at::kBFloat16 && cos_sin.scalar_type() == at::kBFloat16 && cache.scalar_type() == at::kBFloat16);
  TORCH_CHECK(qkv.is_contiguous() && cos_sin.is_contiguous() && cache.is_contiguous() && slots.scalar_type() == at::kLong);
  TORCH_CHECK(cache.dim() == 4 && cache.size(0) == 2);
  const int64_t num_tokens = qkv.size(0), num_kv_heads = cache.size(1), num_slots = cache.size(2), dim = cache.size(3);
  const int64_t half = dim / 2;
  TORCH_CHECK(q_norm.has_value() == k_norm.has_value());
  const uint16_t* q_weight = nullptr;
  const uint16_t* k_weight = nullptr;
  if (q_norm.has_value()) {
    TORCH_CHECK(q_norm->scalar_type() == at::kBFloat16 && q_norm->is_contiguous() && q_norm->numel() == dim);
    TORCH_CHECK(k_norm->scalar_type() == at::kBFloat16 && k_norm->is_contiguous() && k_norm->numel() == dim);
    q_weight = reinterpret_cast<const uint16_t*>(q_norm->data_ptr());
    k_weight = reinterpret_cast<const uint16_t*>(k_norm->data_ptr());
  }
  TORCH_CHECK(dim % 32 == 0 && qkv.size(1) == (num_heads + 2 * num_kv_heads) * dim && cos_sin.size(1) == 2 * dim);
  TORCH_CHECK(cos_sin.size(0) == num_tokens && slots.numel() == num_tokens);
  auto query = at::empty({num_tokens, num_heads, dim}, qkv.options());
  auto key = at::empty({num_tokens, num_kv_heads, dim}, qkv.options());
  const auto* in = reinterpret_cast<const uint16_t*>(qkv.data_ptr());
  const auto* table = reinterpret_cast<const uint16_t*>(cos_sin.data_ptr());
  const int64_t* slot = slots.data_ptr<int64_t>();
  auto* q_out = reinterpret_cast<uint16_t*>(query.data_ptr());
  auto* k_out = reinterpret_cast<uint16_t*>(key.data_ptr());
  auto* kv = reinterpret_cast<uint16_t*>(cache.data_ptr());
  const int64_t width = qkv.size(1), plane = num_kv_heads * num_slots * dim;
  for (int64_t t = 0; t < num_tokens; ++t) TORCH_CHECK(slot[t] >= 0 && slot[t] < num_slots, "slot out of range");
  at::parallel_for(0, num_tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<uint16_t> normed(q_weight != nullptr ? dim : 0);
    for (int64_t t = begin; t < end; ++t) {
      const uint16_t* cos = table + t * 2 * dim;
      const uint16_t* sin = cos + dim;
      for (int64_t h = 0; h < num_heads + num_kv_heads; ++h) {
        const uint16_t* head = in + t * width + h * dim;
        const uint16_t* x = head;
        if (q_weight != nullptr) {
          rms_norm_row(head, h < num_heads ? q_weight : k_weight, normed.data(), dim, static_cast<float>(eps));
          x = normed.data();
        }
        uint16_t* out = h < num_heads ? q_out + (t * num_heads + h) * dim : k_out + (t * num_kv_heads + h - num_heads) * dim;
        for (int64_t i = 0; i < dim; i += 16) {
          const int64_t rolled = i < half ? i + half : i - half;
          store_bf16(out + i, round_bf16(load_bf16(x + i) * load_bf16(cos + i)) + round_bf16(load_bf16(x + rolled) * load_bf16(sin + i)));
        }
        if (h >= num_heads) {
          const int64_t kv_head = h - num_heads;
          std::memcpy(kv + (kv_head * num_slots + slot[t]) * dim, out, dim * sizeof(uint16_t));
          std::memcpy(kv + plane + (kv_head * num_slots + slot[t]) * dim, head + num_kv_heads * dim, dim * sizeof(uint16_t));
        }
      }
    }
  });
  return {query, key};
}

// gate_up [M, 2I] bf16 contiguous -> bf16(silu(gate)) * up, rounded like torch's two bf16 ops.
at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.scalar_type() == at::kBFloat16 && gate_up.is_contiguous());
  const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
  TORCH_CHECK(width % 16 == 0);
  auto out = at::empty({rows, width}, gate_up.options());
  const auto* in = reinterpret_cast<const uint16_t*>(gate_up.data_ptr());
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* gate = in + r * 2 * width;
      const uint16_t* up = gate + width;
      for (int64_t i = 0; i < width; i += 16) {
        const V16 g = load_bf16(gate + i);
        const V16 silu = g / (set16(1.0f) + exp16(zero16() - g));
        store_bf16(o + r * width + i, round_bf16(silu) * load_bf16(up + i));
      }
    }
  });
  return out;
}

// A mixture-of-experts router's logits: x [M, K] float32 @ w [E, K] float32's transpose -> [M, E] float32.
// Each logit is summed in one fixed order (16 running sums over K, then a fixed tree), whatever the rows,
// their number or the instruction set: a row's experts never depend on what shares its step.
at::Tensor router_logits(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && x.is_contiguous() && w.is_contiguous());
  const int64_t rows = x.size(0), width = x.size(1), num_experts = w.size(0);
  TORCH_CHECK(w.size(1) == width && width % 16 == 0);
  auto out = at::empty({rows, num_experts}, x.options());
  const float* in = x.data_ptr<float>();
  const float* weight = w.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows * num_experts, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* row = in + (i / num_experts) * width;
      const float* expert = weight + (i % num_experts) * width;
      V16 sum = zero16();
      for (int64_t k = 0; k < width; k += 16) sum = sum + load16(row + k) * load16(expert + k);
      o[i] = reduce_add(sum);
    }
  });
  return out;
}

namespace {

// The first maximum of n bfloat16 values, one at a time: NaN counts as the largest (torch's max counts it so).
int64_t first_max_scalar(const uint16_t* x, int64_t n) {
  const auto value = [&](int64_t i) { return static_cast<float>(c10::BFloat16(x[i], c10::BFloat16::from_bits())); };
  int64_t best = 0;
  float top = value(0);
  if (std::isnan(top)) return 0;
  for (int64_t i = 1; i < n; ++i) {
    const float v = value(i);
    if (std::isnan(v)) return i;
    if (v > top) {
      top = v;
      best = i;
    }
  }
  return best;
}

// The first maximum of a row of n bfloat16 values: its largest value by vectors, then the first 16 that hold it.
// A row with a NaN or an infinity (where x - x is not 0) goes one value at a time.
int64_t first_max(const uint16_t* x, int64_t n) {
  const int64_t whole = n / 16 * 16;
  if (whole == 0) return first_max_scalar(x, n);
  V16 best = load_bf16(x), check = zero16();
  for (int64_t i = 0; i < whole; i += 16) {
    const V16 v = load_bf16(x + i);
    best = max16(best, v);
    check = check + (v - v);
  }
  float top = reduce_max(best);
  for (int64_t i = whole; i < n; ++i) {
    const float v = static_cast<float>(c10::BFloat16(x[i], c10::BFloat16::from_bits()));
    if (!std::isfinite(v)) return first_max_scalar(x, n);
    top = std::max(top, v);
  }
  if (reduce_add(check) != 0.0f) return first_max_scalar(x, n);
  for (int64_t i = 0; i < whole; i += 16) {
    if (reduce_max(load_bf16(x + i)) == top) {
      for (int64_t j = i;; ++j) {
        if (static_cast<float>(c10::BFloat16(x[j], c10::BFloat16::from_bits())) == top) return j;
      }
    }
  }
  for (int64_t i = whole;; ++i) {
    if (static_cast<float>(c10::BFloat16(x[i], c10::BFloat16::from_bits())) == top) return i;
  }
}

}  // namespace

// logits [M, N] bf16 contiguous -> each row's first maximum [M] int64, as torch's max(dim=-1).indices.
at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.scalar_type() == at::kBFloat16 && logits.is_contiguous() && logits.dim() == 2 && logits.size(1) > 0);
  const int64_t rows = logits.size(0), n = logits.size(1);
  auto out = at::empty({rows}, logits.options().dtype(at::kLong));
  const auto* in = reinterpret_cast<const uint16_t*>(logits.data_ptr());
  int64_t* ids = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) ids[r] = first_max(in + r * n, n);
  });
  return out;
}
