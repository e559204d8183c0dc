// bfloat16 rows rounded to 8 bits per group of 32 inputs, as llama.cpp rounds activations for its
// integer dot products (Q8): a scale a = max|x| / 127 per row and group, x̂ = round(x / a) (ties to
// even) in -127..127. Both integer matmul forms (int4_q8.cpp, int8_q8.cpp) round through here, so a
// row's x̂ depends on that row alone.
#pragma once

#include <ATen/Parallel.h>

#include "vec16.h"

#include <cstdint>
#include <cstring>

namespace zeroserve {

constexpr int64_t kQ8Group = 32;

#if defined(__AVX512F__) && defined(__AVX512VNNI__)

// 16 floats rounded to the nearest whole number (ties to even), saturated to signed bytes.
inline void store_int8(int8_t* dst, V16 x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(x.v)));
}

#else  // AVX2

inline void store_int8(int8_t* dst, V16 x) {
  // packs work within 128-bit lanes: [lo 0-3, hi 0-3 | lo 4-7, hi 4-7] back into order, then to bytes
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_cvtps_epi32(x.lo), _mm256_cvtps_epi32(x.hi)), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
}

#endif

// One group of 32 bfloat16 inputs -> 32 signed bytes, their scale and their exact sum.
inline void quantize_group(const uint16_t* x, int8_t* q, float* scale, float* sum) {
  const V16 low = load_bf16(x), high = load_bf16(x + 16);
  const V16 zero = zero16();
  const float max_abs = reduce_max(max16(max16(low, zero - low), max16(high, zero - high)));
  *sum = reduce_add(low + high);
  *scale = max_abs / 127.0f;
  const V16 inverse = set16(max_abs > 0.0f ? 127.0f / max_abs : 0.0f);
  store_int8(q, low * inverse);
  store_int8(q + 16, high * inverse);
}

// Rows x [m, num_groups * 32] (bf16) -> q [m, K] int8, scales and sums [m, num_groups].
inline void quantize_rows(const uint16_t* x, int64_t m, int64_t num_groups, int8_t* q, float* scales, float* sums) {
  at::parallel_for(0, m * num_groups, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) quantize_group(x + i * kQ8Group, q + i * kQ8Group, &scales[i], &sums[i]);
  });
}

inline int32_t load_int32(const int8_t* src) {
  int32_t value;
  std::memcpy(&value, src, sizeof(value));
  return value;
}

}  // namespace zeroserve
