// Fused element-wise layers for bfloat16 activations (x86 CPUs, AVX-512 BF16 or AVX2): one pass
// over the rows instead of one torch op per step of the formula, with the same roundings to
// bfloat16 as those ops (SiLU·up bit for bit; RMSNorm sums its squares in another order, so
// now and then a value lands one bfloat16 step away).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "vec16.h"

#include <cmath>
#include <cstdint>

using namespace zeroserve;

// x [M, H] bf16 contiguous, weight [H] bf16: weight * bf16(x / rms(x)), computed as Hugging Face does.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16 && x.is_contiguous() && weight.is_contiguous());
  const int64_t rows = x.size(0), hidden = x.size(1);
  TORCH_CHECK(hidden % 16 == 0 && weight.numel() == hidden);
  auto out = torch::empty_like(x);
  const auto* in = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* w = reinterpret_cast<const uint16_t*>(weight.data_ptr());
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* row = in + r * hidden;
      V16 sum = zero16();
      for (int64_t i = 0; i < hidden; i += 16) { const V16 v = load_bf16(row + i); sum = fmadd(v, v, sum); }
      const float inv = 1.0f / std::sqrt(reduce_add(sum) / static_cast<float>(hidden) + static_cast<float>(eps));
      const V16 scale = set16(inv);
      for (int64_t i = 0; i < hidden; i += 16)
        store_bf16(o + r * hidden + i, round_bf16(load_bf16(row + i) * scale) * load_bf16(w + i));
    }
  });
  return out;
}

// gate_up [M, 2I] bf16 contiguous -> bf16(silu(gate)) * up, rounded like torch's two bf16 ops.
torch::Tensor silu_and_mul(const torch::Tensor& gate_up) {
  TORCH_CHECK(gate_up.scalar_type() == at::kBFloat16 && gate_up.is_contiguous());
  const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
  TORCH_CHECK(width % 16 == 0);
  auto out = torch::empty({rows, width}, gate_up.options());
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
