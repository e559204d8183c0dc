// Fused element-wise layers for bfloat16 activations (AVX-512 BF16, x86 CPUs): one pass over
// the rows instead of one torch op per step of the formula, with the same roundings to
// bfloat16 as those ops (SiLU·up bit for bit; RMSNorm sums its squares in another order, so
// now and then a value lands one bfloat16 step away).
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <cmath>
#include <cstdint>

namespace {

inline __m512 load_bf16(const uint16_t* src) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline __m512 round_bf16(__m512 values) {  // the value bfloat16 rounding (nearest even) gives, as float
  const __m256bh packed = _mm512_cvtneps_pbh(values);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(packed)), 16));
}

inline void store_bf16(uint16_t* dst, __m512 values) {
  const __m256bh packed = _mm512_cvtneps_pbh(values);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), reinterpret_cast<const __m256i&>(packed));
}

inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace

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
      __m512 sum = _mm512_setzero_ps();
      for (int64_t i = 0; i < hidden; i += 16) { const __m512 v = load_bf16(row + i); sum = _mm512_fmadd_ps(v, v, sum); }
      const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(sum) / static_cast<float>(hidden) + static_cast<float>(eps));
      const __m512 scale = _mm512_set1_ps(inv);
      for (int64_t i = 0; i < hidden; i += 16)
        store_bf16(o + r * hidden + i, _mm512_mul_ps(round_bf16(_mm512_mul_ps(load_bf16(row + i), scale)), load_bf16(w + i)));
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
        const __m512 g = load_bf16(gate + i);
        const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        store_bf16(o + r * width + i, _mm512_mul_ps(round_bf16(silu), load_bf16(up + i)));
      }
    }
  });
  return out;
}
